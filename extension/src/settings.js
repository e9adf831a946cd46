// The extension's settings: defaults, and merging what SillyTavern stored with them.
// Pure module (no SillyTavern access) so node tests can import it.

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
});

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
    if (!Number.isFinite(out.requestTimeoutMs) || out.requestTimeoutMs <= 0) out.requestTimeoutMs = DEFAULTS.requestTimeoutMs;
    if (!Number.isInteger(out.syncBatchSize) || out.syncBatchSize <= 0) out.syncBatchSize = DEFAULTS.syncBatchSize;
    if (!['sidecar', 'sillytavern'].includes(out.llmMode)) out.llmMode = DEFAULTS.llmMode;
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
