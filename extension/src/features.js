// Which optional sidecar routes exist. Some parts of the extension (tools, the job worker) must
// not be offered when the sidecar they talk to lacks the route, so we ask once per sidecar with a
// request that cannot change anything, and remember the answer.

import { isMissingRoute } from './client.js';

// An id no real chat has: probes against it can only answer "no such chat" or "bad request".
export const PROBE_CHAT = '__chronicler_probe__';

/**
 * One harmless request per feature. A route that exists answers 2xx, 400 (our body is invalid on
 * purpose: every request schema forbids unknown fields) or a domain 404 (`chat_not_found`); a
 * missing route answers Flask's generic 404 `not_found`.
 */
export const PROBES = Object.freeze({
    search: { method: 'POST', path: '/v1/search', body: { __probe__: true } },
    sessions: { method: 'GET', path: `/v1/chats/${PROBE_CHAT}/sessions` },
    jobs: { method: 'POST', path: '/v1/jobs/claim', body: { __probe__: true } },
    messageIds: { method: 'GET', path: `/v1/chats/${PROBE_CHAT}/messages?ids_only=true` },
    context: { method: 'POST', path: '/v1/context', body: { __probe__: true } },
});

/** The capability in GET /v1/health's `capabilities` that says a feature is there. */
export const CAPABILITY_OF = Object.freeze({
    search: 'search', sessions: 'sessions', jobs: 'client_jobs', messageIds: 'message_ids', context: 'context',
    prefetch: 'context_prefetch', earlyContext: 'context_dry_run',
});

/**
 * Features from the sidecar's list of capabilities, or null when it sends none (an older sidecar:
 * then each feature is probed).
 * @param {any} health GET /v1/health's answer
 * @returns {Record<string, boolean>|null}
 */
export function fromCapabilities(health) {
    const list = health?.capabilities;
    if (!Array.isArray(list)) return null;
    return Object.fromEntries(Object.entries(CAPABILITY_OF).map(([name, capability]) => [name, list.includes(capability)]));
}

/**
 * What one probe's outcome says: true (the route exists), false (it does not), undefined (no
 * answer: the sidecar is down or the token is wrong — ask again later).
 * @param {{ok?: boolean, error?: any}} outcome
 * @returns {boolean|undefined}
 */
export function classifyProbe({ ok, error }) {
    if (ok) return true;
    if (isMissingRoute(error)) return false;
    if (!error || error.isOutage || error.status === 401 || error.status === 403) return undefined;
    return true;
}

export class Features {
    /**
     * @param {{getClient: () => import('./client.js').SidecarClient, maxAgeMs?: number, now?: () => number}} deps
     */
    constructor({ getClient, maxAgeMs = 5 * 60 * 1000, now = () => Date.now() }) {
        this.getClient = getClient;
        this.maxAgeMs = maxAgeMs;
        this.now = now;
        /** @type {Record<string, boolean|undefined>} */
        this.known = {};
        this.checkedAt = 0;
        this.checkedUrl = '';
        this.running = null;
    }

    /** Whether a feature is known to exist (false while unknown). */
    has(name) {
        return this.known[name] === true;
    }

    /** Forget what we know (the URL or token changed). */
    reset() {
        this.known = {};
        this.checkedAt = 0;
        this.checkedUrl = '';
    }

    /** Note a route found missing (or present) by an ordinary call. */
    note(name, exists) {
        this.known[name] = exists;
    }

    /**
     * Probe every feature unless we did recently for this sidecar (or `force`). Never throws.
     * @returns {Promise<Record<string, boolean|undefined>>}
     */
    refresh({ force = false } = {}) {
        const client = this.getClient();
        const fresh = this.checkedUrl === client.baseUrl && this.now() - this.checkedAt < this.maxAgeMs
            && Object.values(this.known).every(v => v !== undefined);
        if (!force && fresh) return Promise.resolve(this.known);
        if (this.running) return this.running;
        this.running = this.probeAll(client).finally(() => { this.running = null; });
        return this.running;
    }

    async probeAll(client) {
        // One request that cannot fail for a missing route: the list of capabilities in health.
        let health = null;
        try {
            health = await client.request('GET', '/v1/health');
        } catch {
            health = null;
        }
        const listed = fromCapabilities(health);
        if (listed) {
            this.known = listed;
            this.checkedAt = this.now();
            this.checkedUrl = client.baseUrl;
            return this.known;
        }
        const entries = await Promise.all(Object.entries(PROBES).map(async ([name, probe]) => {
            try {
                await client.request(probe.method, probe.path, { body: probe.body });
                return [name, true];
            } catch (error) {
                return [name, classifyProbe({ error })];
            }
        }));
        this.known = Object.fromEntries(entries);
        this.checkedAt = this.now();
        this.checkedUrl = client.baseUrl;
        return this.known;
    }
}
