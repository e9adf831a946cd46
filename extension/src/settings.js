// The extension's settings: defaults, merging what SillyTavern stored with them, storing changes.
// No SillyTavern global: its context object is passed in, so node tests can use a plain object.

/** Key under SillyTavern's `extensionSettings`. */
export const SETTINGS_KEY = 'chronicler';

/** Section names of the sidecar's context blocks (API.md, POST /v1/context). */
export const SECTIONS = Object.freeze([
    'front_memory', 'last_action', 'authors_note', 'plot_essentials', 'instructions',
    'story_summary', 'pinned_memories', 'campaign_notes', 'character_sheets',
    'story_cards', 'history', 'memory_bank',
]);

/** Every setting with its default. Limits are named here, never inlined in the code. */
export const DEFAULTS = Object.freeze({
    enabled: true,
    sidecarUrl: 'http://127.0.0.1:7711',
    token: '',
    // The per-turn context call must not hold up a generation for long: past this it fails open.
    contextTimeoutMs: 1500,
    // Left out of the sidecar's budget besides SillyTavern's own card, persona and system prompt
    // (counted every turn): message framing, names and separators SillyTavern adds.
    promptOverheadTokens: 100,
    // Below this many tokens left for memory, the user is warned (once per chat) that SillyTavern's
    // own prompt takes nearly all of the model's context.
    minMemoryBudgetTokens: 400,
    // Of that time, how long to wait first for a swipe's rollback (and deletes, a chat's registration).
    syncWaitMs: 750,
    // Every other call to the sidecar (sync, rollback, health).
    requestTimeoutMs: 10000,
    // How many messages one upsert request carries.
    syncBatchSize: 100,
    // QS4: with the Memory Bank off, History may take up to 75% of the dynamic budget.
    memoryBank: true,
    // Background LLM jobs: 'sidecar' (its own endpoint) or 'sillytavern' (this page's connection).
    llmMode: 'sidecar',
    // Per-section injection overrides: { [section]: { position, depth, role } }; absent = sidecar's choice.
    injection: {},
    // Offer the model its memory tools (remember, recall, …) where the connection supports tool calling.
    tools: true,
    // Results a recall (tool or /recall) returns.
    recallResults: 5,
    // Client LLM worker: quiet time after the user's own generation before a job runs, and how
    // often to ask for jobs when none is waiting (doubling up to the maximum).
    workerIdleMs: 5000,
    workerPollMs: 5000,
    workerMaxPollMs: 60000,
    // Pass a job's JSON schema to SillyTavern (structured output). Off: many local backends reject it,
    // and the sidecar's prompts ask for the format and parse strictly anyway.
    jobJsonSchema: false,
    // In 'sillytavern' mode: the Connection Manager profile background jobs use ('' = the chat's
    // own connection), e.g. a cheaper model than the chat's.
    jobProfileId: '',
    // The sidecar's own job mode before the drawer switched it to SillyTavern's connection ('client'),
    // put back when the drawer switches to the sidecar's own again (worker.followJobMode).
    sidecarJobMode: '',
    // Start the next turn's query embedding as soon as the action is known (a pause in typing this
    // long, or the message sent), so the context call finds it ready (POST /v1/context/prefetch).
    prefetchQuery: true,
    prefetchPauseMs: 400,
    // Ask for a sent message's context as its generation starts (a dry run), before SillyTavern
    // saves the chat and renders the message; the interceptor takes that answer when its request
    // is the same (early.js).
    earlyContext: true,
});

/** The file `chronicler install-extension` writes beside the extension folder (URL and token of the sidecar). */
export const INSTALL_CONFIG_FILE = 'chronicler.config.json';

/**
 * The stored settings completed with defaults (unknown keys kept, wrong types replaced).
 * @param {object|undefined} stored what `extensionSettings.chronicler` holds
 * @returns {typeof DEFAULTS}
 */
export function withDefaults(stored) {
    const out = { ...DEFAULTS, ...(stored && typeof stored === 'object' ? stored : {}) };
    for (const [key, value] of Object.entries(DEFAULTS)) {
        if (typeof out[key] !== typeof value || out[key] === null) out[key] = value;
    }
    if (!Number.isFinite(out.contextTimeoutMs) || out.contextTimeoutMs <= 0) out.contextTimeoutMs = DEFAULTS.contextTimeoutMs;
    if (!Number.isFinite(out.syncWaitMs) || out.syncWaitMs < 0) out.syncWaitMs = DEFAULTS.syncWaitMs;
    if (!Number.isFinite(out.requestTimeoutMs) || out.requestTimeoutMs <= 0) out.requestTimeoutMs = DEFAULTS.requestTimeoutMs;
    if (!Number.isFinite(out.promptOverheadTokens) || out.promptOverheadTokens < 0) out.promptOverheadTokens = DEFAULTS.promptOverheadTokens;
    if (!Number.isFinite(out.minMemoryBudgetTokens) || out.minMemoryBudgetTokens < 0) out.minMemoryBudgetTokens = DEFAULTS.minMemoryBudgetTokens;
    if (!Number.isInteger(out.syncBatchSize) || out.syncBatchSize <= 0) out.syncBatchSize = DEFAULTS.syncBatchSize;
    if (!['sidecar', 'sillytavern'].includes(out.llmMode)) out.llmMode = DEFAULTS.llmMode;
    if (!Number.isInteger(out.recallResults) || out.recallResults < 1 || out.recallResults > 50) out.recallResults = DEFAULTS.recallResults;
    for (const key of ['workerIdleMs', 'workerPollMs', 'workerMaxPollMs']) {
        if (!Number.isFinite(out[key]) || out[key] < 0) out[key] = DEFAULTS[key];
    }
    out.sidecarUrl = normaliseUrl(out.sidecarUrl) || DEFAULTS.sidecarUrl;
    return out;
}

/**
 * A base URL without trailing slashes or a trailing `/v1` (the client adds `/v1` itself).
 * @param {string} url
 * @returns {string}
 */
export function normaliseUrl(url) {
    return String(url ?? '').trim().replace(/\/+$/, '').replace(/\/v1$/, '');
}

/**
 * Settings to store from the install config, or null when there is nothing to take: the file
 * fills the URL and token only while the user has set neither (a new install has nothing to paste;
 * what a user typed always wins).
 * @param {object|undefined} stored what `extensionSettings.chronicler` holds
 * @param {any} file the parsed chronicler.config.json (`{sidecarUrl, token}`)
 * @returns {{sidecarUrl?: string, token?: string}|null}
 */
export function fromInstallConfig(stored, file) {
    if (!file || typeof file !== 'object') return null;
    const current = stored && typeof stored === 'object' ? stored : {};
    const hasUrl = typeof current.sidecarUrl === 'string' && current.sidecarUrl.trim() !== '';
    const hasToken = typeof current.token === 'string' && current.token.trim() !== '';
    if (hasUrl || hasToken) return null;
    const patch = {};
    const url = normaliseUrl(file.sidecarUrl);
    if (/^https?:\/\/[^\s]+$/i.test(url)) patch.sidecarUrl = url;
    if (typeof file.token === 'string' && file.token.trim()) patch.token = file.token.trim();
    return Object.keys(patch).length ? patch : null;
}

/**
 * The settings SillyTavern stores for us, completed with defaults.
 * @param {{extensionSettings: object}} ctx SillyTavern.getContext()
 */
export function readSettings(ctx) {
    return withDefaults(ctx.extensionSettings[SETTINGS_KEY]);
}

/**
 * Store a change (SillyTavern writes it to disk a moment later).
 * @param {{extensionSettings: object, saveSettingsDebounced: () => void}} ctx SillyTavern.getContext()
 * @param {object} patch
 * @returns {{before: typeof DEFAULTS, after: typeof DEFAULTS}} the settings before and after it
 */
export function storeSettings(ctx, patch) {
    const before = readSettings(ctx);
    ctx.extensionSettings[SETTINGS_KEY] = { ...(ctx.extensionSettings[SETTINGS_KEY] ?? {}), ...patch };
    ctx.saveSettingsDebounced();
    return { before, after: readSettings(ctx) };
}

/**
 * The parsed install config (INSTALL_CONFIG_FILE), or null when there is none (installed by
 * hand) or it cannot be read.
 * @param {URL|string} url where it is served
 * @param {typeof fetch} [fetchImpl]
 */
export async function fetchInstallConfig(url, fetchImpl = (...args) => globalThis.fetch(...args)) {
    try {
        const response = await fetchImpl(url, { cache: 'no-store' });
        return response.ok ? await response.json() : null;
    } catch {
        return null;
    }
}
