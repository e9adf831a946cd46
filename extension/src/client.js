// The only module that talks HTTP to the sidecar (API.md): base URL + bearer token, JSON in and
// out, a timeout per call, and one error type for everything that can go wrong.

/** Error codes of our own, for failures that never got a sidecar answer. */
export const CLIENT_CODES = Object.freeze({
    timeout: 'timeout',          // no answer within the call's time limit
    unreachable: 'unreachable',  // connection refused, DNS, CORS rejection: fetch itself failed
    badResponse: 'bad_response', // an answer that is not the JSON we expect
    aborted: 'aborted',          // the caller's own signal was aborted
});

/** A failed sidecar call: an HTTP error envelope, or one of CLIENT_CODES with status 0. */
export class SidecarError extends Error {
    /**
     * @param {{status?: number, code: string, message: string, details?: any[]}} fields
     */
    constructor({ status = 0, code, message, details = [] }) {
        super(message);
        this.name = 'SidecarError';
        this.status = status;
        this.code = code;
        this.details = details;
    }

    /** True when the sidecar could not be reached or failed on its side (not a client mistake). */
    get isOutage() {
        return this.status === 0 || this.status >= 500;
    }
}

/**
 * Turn a non-2xx answer into a SidecarError, reading the `{ok:false, error:{code,message,details}}`
 * envelope when there is one.
 * @param {number} status HTTP status
 * @param {string} text response body
 * @returns {SidecarError}
 */
export function errorFromResponse(status, text) {
    let body = null;
    try {
        body = text ? JSON.parse(text) : null;
    } catch {
        body = null;
    }
    const err = body && typeof body === 'object' ? body.error : null;
    if (err && typeof err === 'object' && typeof err.code === 'string') {
        return new SidecarError({
            status,
            code: err.code,
            message: typeof err.message === 'string' ? err.message : err.code,
            details: Array.isArray(err.details) ? err.details : [],
        });
    }
    return new SidecarError({ status, code: `http_${status}`, message: `The sidecar answered HTTP ${status}.` });
}

/**
 * True when the error says the route itself does not exist on this sidecar (an older version, or
 * a feature not built yet): Flask's generic 404 `not_found` or 405 — unlike a domain 404 such as
 * `chat_not_found`, which means the route exists and the item does not.
 * @param {any} error
 */
export function isMissingRoute(error) {
    return error instanceof SidecarError && ((error.status === 404 && error.code === 'not_found') || error.status === 405);
}

/**
 * `call`'s value, or undefined when the sidecar answered 404: for deleting what was never sent or
 * is already gone, and for looking up what may not exist yet. Other errors still reject.
 * @template T
 * @param {Promise<T>} call
 * @returns {Promise<T|undefined>}
 */
export function allowNotFound(call) {
    return call.catch((error) => {
        if (error?.status !== 404) throw error;
    });
}

/** A query string from the defined values of `params` ('' when none). */
export function queryString(params = {}) {
    const parts = Object.entries(params)
        .filter(([, v]) => v !== undefined && v !== null)
        .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
    return parts.length ? `?${parts.join('&')}` : '';
}

/**
 * The sidecar's own time for a call, in ms, from its `Server-Timing: app;dur=12.3` header (the
 * plugin's proxy passes it on); undefined without one.
 * @param {string|null|undefined} header
 * @returns {number|undefined}
 */
export function serverMs(header) {
    const match = /(?:^|,)\s*app\s*;(?:[^,]*;)?\s*dur=([0-9.]+)/.exec(String(header ?? ''));
    return match ? Number(match[1]) : undefined;
}

/**
 * Whether the sidecar's `Server-Timing` says its answer was assembled ahead (`app;dur=1.4, ahead`:
 * a context prepared at a prefetch, docs/api.md).
 * @param {string|null|undefined} header
 */
export function madeAhead(header) {
    return /(?:^|,)\s*ahead\s*(?:[;,]|$)/.test(String(header ?? ''));
}

/** Percent-encode one id for a path segment (SillyTavern chat ids hold spaces and `@`). */
export function pathId(id) {
    return encodeURIComponent(String(id));
}

export class SidecarClient {
    /**
     * `headers` (a function) adds headers to every call and `credentials` says whether cookies go
     * along: through SillyTavern's server plugin, the session cookie and its CSRF token are what let
     * a call in; directly, the bearer token is, and cookies never go.
     * @param {{baseUrl: string, token?: string, timeoutMs?: number, fetchImpl?: typeof fetch,
     *          headers?: () => Record<string, string>, credentials?: RequestCredentials}} options
     */
    constructor({ baseUrl, token = '', timeoutMs = 10000, fetchImpl = globalThis.fetch.bind(globalThis), headers = null, credentials = 'omit' }) {
        this.baseUrl = String(baseUrl).replace(/\/+$/, '');
        this.token = token;
        this.extraHeaders = headers;
        this.credentials = credentials;
        this.timeoutMs = timeoutMs;
        this.fetchImpl = fetchImpl;
    }

    /**
     * One call. Resolves to the parsed JSON body (or null for an empty one); rejects with SidecarError.
     * `timing`, when given, gets `serverMs`: the sidecar's own part of the call (Server-Timing),
     * `ahead`: whether the sidecar's answer was assembled ahead (`madeAhead`), and `parseMs`: the
     * main thread's time reading the answer's JSON.
     * @param {string} method
     * @param {string} path starting with /v1
     * @param {{body?: any, timeoutMs?: number, signal?: AbortSignal, timing?: {serverMs?: number, ahead?: boolean, parseMs?: number}}} [options]
     */
    async request(method, path, { body, timeoutMs, signal, timing } = {}) {
        const limit = timeoutMs ?? this.timeoutMs;
        const controller = new AbortController();
        let timedOut = false;
        const timer = setTimeout(() => { timedOut = true; controller.abort(); }, limit);
        const onAbort = () => controller.abort();
        signal?.addEventListener('abort', onAbort, { once: true });
        const headers = { ...(this.extraHeaders ? this.extraHeaders() : {}), Accept: 'application/json' };
        if (this.token) headers.Authorization = `Bearer ${this.token}`;
        if (body !== undefined) headers['Content-Type'] = 'application/json';
        let response;
        let text;
        try {
            response = await this.fetchImpl(this.baseUrl + path, {
                method,
                headers,
                body: body === undefined ? undefined : JSON.stringify(body),
                signal: controller.signal,
                credentials: this.credentials,
                cache: 'no-store',
            });
            text = await response.text();
        } catch (cause) {
            if (timedOut) {
                throw new SidecarError({ code: CLIENT_CODES.timeout, message: `The sidecar did not answer within ${limit} ms.` });
            }
            if (signal?.aborted) {
                throw new SidecarError({ code: CLIENT_CODES.aborted, message: 'The call was cancelled.' });
            }
            throw new SidecarError({ code: CLIENT_CODES.unreachable, message: `The sidecar at ${this.baseUrl} cannot be reached (${cause?.message ?? cause}).` });
        } finally {
            clearTimeout(timer);
            signal?.removeEventListener('abort', onAbort);
        }
        if (timing) {
            const header = response.headers?.get?.('Server-Timing');
            timing.serverMs = serverMs(header);
            timing.ahead = madeAhead(header);
        }
        if (!response.ok) throw errorFromResponse(response.status, text);
        if (!text) return null;
        try {
            const reading = timing ? performance.now() : 0;
            const parsed = JSON.parse(text);
            if (timing) timing.parseMs = performance.now() - reading;
            return parsed;
        } catch {
            throw new SidecarError({ status: response.status, code: CLIENT_CODES.badResponse, message: 'The sidecar answered something that is not JSON.' });
        }
    }

    health(options) { return this.request('GET', '/v1/health', options); }

    getCharacter(id, options) { return this.request('GET', `/v1/characters/${pathId(id)}`, options); }
    putCharacter(id, body, options) { return this.request('PUT', `/v1/characters/${pathId(id)}`, { ...options, body }); }
    deleteCharacter(id, options) { return this.request('DELETE', `/v1/characters/${pathId(id)}`, options); }

    putChat(chatId, body, options) { return this.request('PUT', `/v1/chats/${pathId(chatId)}`, { ...options, body }); }
    upsertMessages(chatId, messages, options) {
        return this.request('POST', `/v1/chats/${pathId(chatId)}/messages`, { ...options, body: { messages } });
    }
    deleteMessage(chatId, messageId, options) {
        return this.request('DELETE', `/v1/chats/${pathId(chatId)}/messages/${pathId(messageId)}`, options);
    }
    rollbackTurn(chatId, turnId, options) {
        return this.request('POST', `/v1/chats/${pathId(chatId)}/turns/${pathId(turnId)}/rollback`, { ...options, body: {} });
    }

    /** One page of the ids the sidecar holds for a chat: `{ids, total, offset, limit}` (orphan reconciliation). */
    listMessageIds(chatId, offset = 0, options) {
        return this.request('GET', `/v1/chats/${pathId(chatId)}/messages${queryString({ ids_only: true, offset: offset || undefined })}`, options);
    }
    renameChat(chatId, newId, options) {
        return this.request('POST', `/v1/chats/${pathId(chatId)}/rename`, { ...options, body: { new_id: newId } });
    }
    deleteChat(chatId, options) { return this.request('DELETE', `/v1/chats/${pathId(chatId)}`, options); }

    createMemory(body, options) { return this.request('POST', '/v1/memories', { ...options, body }); }
    getMemory(id, options) { return this.request('GET', `/v1/memories/${pathId(id)}`, options); }
    listMemories(filters = {}, options) { return this.request('GET', `/v1/memories${queryString(filters)}`, options); }
    patchMemory(id, body, options) { return this.request('PATCH', `/v1/memories/${pathId(id)}`, { ...options, body }); }
    deleteMemory(id, actor, options) {
        return this.request('DELETE', `/v1/memories/${pathId(id)}${queryString({ actor })}`, options);
    }

    prefetchContext(body, options) { return this.request('POST', '/v1/context/prefetch', { ...options, body }); }
    search(body, options) { return this.request('POST', '/v1/search', { ...options, body }); }
    listSessions(chatId, options) { return this.request('GET', `/v1/chats/${pathId(chatId)}/sessions`, options); }
    getSession(chatId, n, options) { return this.request('GET', `/v1/chats/${pathId(chatId)}/sessions/${pathId(n)}`, options); }
    endSession(chatId, options) { return this.request('POST', `/v1/chats/${pathId(chatId)}/sessions/end`, { ...options, body: {} }); }

    claimJob(body = {}, options) { return this.request('POST', '/v1/jobs/claim', { ...options, body }); }
    completeJob(id, text, attempt, options) {
        const body = { text };
        if (Number.isInteger(attempt)) body.attempt = attempt;
        return this.request('POST', `/v1/jobs/${pathId(id)}/complete`, { ...options, body });
    }
    failJob(id, error, { retryable = true, attempt } = {}, options) {
        const body = { error: String(error).slice(0, 2000) || 'failed', retryable };
        if (Number.isInteger(attempt)) body.attempt = attempt;
        return this.request('POST', `/v1/jobs/${pathId(id)}/fail`, { ...options, body });
    }

    context(body, options) { return this.request('POST', '/v1/context', { ...options, body }); }

    // --- the memory panel (src/panel/) ---
    listCharacters(options) { return this.request('GET', '/v1/characters', options); }
    listCampaigns(options) { return this.request('GET', '/v1/campaigns', options); }
    campaignRecap(campaignId, options) { return this.request('GET', `/v1/campaigns/${pathId(campaignId)}/recap`, options); }
    getChat(chatId, options) { return this.request('GET', `/v1/chats/${pathId(chatId)}`, options); }
    deleteAllMemories(body, options) { return this.request('POST', '/v1/memories/delete-all', { ...options, body }); }
    memoryDrafts(body, options) { return this.request('POST', '/v1/memories/drafts', { ...options, body }); }
    getSummaries(chatId, options) { return this.request('GET', `/v1/chats/${pathId(chatId)}/summaries`, options); }
    patchSummary(id, body, options) { return this.request('PATCH', `/v1/summaries/${pathId(id)}`, { ...options, body }); }
    rebuildSummaries(chatId, options) { return this.request('POST', `/v1/chats/${pathId(chatId)}/summaries/rebuild`, { ...options, body: {} }); }
    listJobs(params = {}, options) { return this.request('GET', `/v1/jobs${queryString(params)}`, options); }
    jobStats(params = {}, options) { return this.request('GET', `/v1/jobs/stats${queryString(params)}`, options); }
    retryJob(id, options) { return this.request('POST', `/v1/jobs/${pathId(id)}/retry`, { ...options, body: {} }); }
    listLore(options) { return this.request('GET', '/v1/lore', options); }
    createLore(body, options) { return this.request('POST', '/v1/lore', { ...options, body }); }
    patchLore(id, body, options) { return this.request('PATCH', `/v1/lore/${pathId(id)}`, { ...options, body }); }
    deleteLore(id, options) { return this.request('DELETE', `/v1/lore/${pathId(id)}`, options); }
    importLore(body, options) { return this.request('POST', '/v1/lore/import', { ...options, body }); }
    listLoreProposals(params = {}, options) { return this.request('GET', `/v1/lore/proposals${queryString(params)}`, options); }
    patchLoreProposal(id, body, options) { return this.request('PATCH', `/v1/lore/proposals/${pathId(id)}`, { ...options, body }); }
    acceptLoreProposal(id, body = {}, options) { return this.request('POST', `/v1/lore/proposals/${pathId(id)}/accept`, { ...options, body }); }
    rejectLoreProposal(id, options) { return this.request('POST', `/v1/lore/proposals/${pathId(id)}/reject`, { ...options, body: {} }); }
    /** The store's run-time settings (GET /v1/settings): `{store, settings, secrets}`. */
    getStoreSettings(options) { return this.request('GET', '/v1/settings', options); }
    /** Change some of them (PATCH /v1/settings): checked whole, 400 naming the field, nothing changed. */
    patchStoreSettings(patch, options) { return this.request('PATCH', '/v1/settings', { ...options, body: patch }); }
}


/**
 * A client for the sidecar the settings name.
 * @param {{sidecarUrl: string, token: string}} settings the settings, with defaults
 * @param {string} [timeoutKey] which setting is the time limit of its calls
 * @returns {SidecarClient}
 */
export function clientFor(settings, timeoutKey = 'requestTimeoutMs') {
    return new SidecarClient({ baseUrl: settings.sidecarUrl, token: settings.token, timeoutMs: settings[timeoutKey] });
}
