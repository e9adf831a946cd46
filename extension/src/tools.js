// Function tools the model may call during its reply (RV9a): save, edit and forget its own
// memories, search what the speaking character knows, and read a past session's full summary (SW2).
//
// Registered with SillyTavern's registerFunctionTool only where tool calling is supported (RV15:
// elsewhere nothing is registered and saved memories are still used). Each action is a plain async
// function of its arguments and `deps`, so node tests run them against a fake sidecar client.
//
// Who is "the model" here: the character SillyTavern is generating for (in a group, the drafted
// member), in the current chat, during the current turn. Memories it saves carry that turn's id so
// a swipe or regenerate rolls them back (RV10).

/** Tool names, as the model sees them. */
export const TOOL_NAMES = Object.freeze({
    remember: 'remember',
    update: 'update_memory',
    forget: 'forget_memory',
    recall: 'recall',
    session: 'read_session_summary',
});

const MODEL = 'model';

/** The largest memory the sidecar takes by default (RV8 `memory_max_chars`); the sidecar enforces its own. */
export const MEMORY_MAX_CHARS = 500;

/**
 * An error the model sees as the tool's result (SillyTavern shows it to the model, not as a crash).
 */
export class ToolRefusal extends Error {
    constructor(message) {
        super(message);
        this.name = 'ToolRefusal';
    }
}

/**
 * @typedef {object} Speaker
 * @property {string} chatId
 * @property {string} speakerId the generating character's avatar file name
 * @property {string[]} memberIds the chat's members (the scene's witnesses)
 * @property {string|undefined} turnId the current generation's turn
 */

/**
 * @typedef {object} ToolDeps
 * @property {() => import('./client.js').SidecarClient} getClient
 * @property {() => Speaker|null} speaker who is speaking now (null outside a chat)
 * @property {() => {enabled: boolean, tools: boolean, recallResults: number}} getSettings
 * @property {{has: (name: string) => boolean}} features which optional sidecar routes exist
 */

function need(deps) {
    const who = deps.speaker();
    if (!who?.chatId || !who.speakerId) throw new ToolRefusal('No character is speaking in a chat right now.');
    return who;
}

function cleanText(value) {
    const text = String(value ?? '').trim();
    if (!text) throw new ToolRefusal('The memory text is empty.');
    if (text.length > MEMORY_MAX_CHARS) {
        throw new ToolRefusal(`A memory holds at most ${MEMORY_MAX_CHARS} characters; this one has ${text.length}. Shorten it.`);
    }
    return text;
}

/**
 * The POST /v1/memories body for a memory the model saves.
 *
 * A memory the model writes comes from the scene it is in, so it is known by that scene's
 * witnesses — the chat's members — not by every character who later reads the scope (SW9b).
 * `global` is the model saying "common knowledge every character may know": no restriction.
 * @param {Speaker} who
 * @param {{text: string, scope?: string}} args
 */
export function rememberBody(who, { text, scope }) {
    const global = scope === 'global';
    return {
        text: cleanText(text),
        scope: global ? 'global' : 'character',
        character_id: global ? null : who.speakerId,
        pinned: false,
        actor: MODEL,
        chat_id: who.chatId,
        turn_id: who.turnId ?? null,
        known_by: global ? null : [...new Set([who.speakerId, ...(who.memberIds ?? [])])],
    };
}

/**
 * Why the speaker may not change a memory, or null when it may: only unpinned items in its own
 * scope or the global one, and only ones it knows (RV9a, RV11, SW9b). An item it may not see gets
 * the same answer as one that does not exist, so the refusal reveals nothing.
 * @param {{pinned: boolean, scope: string, character_id: string|null, known_by: string[]|null}|null} memory
 * @param {string} speakerId
 * @returns {string|null}
 */
export function refusalFor(memory, speakerId) {
    const unknown = 'There is no memory with that id among yours.';
    if (!memory) return unknown;
    if (Array.isArray(memory.known_by) && !memory.known_by.includes(speakerId)) return unknown;
    if (memory.scope === 'character' && memory.character_id !== speakerId) return unknown;
    if (memory.scope !== 'character' && memory.scope !== 'global') return unknown;
    if (memory.pinned) return 'That memory is pinned: only the user can change or delete it.';
    return null;
}

async function ownMemory(deps, who, id) {
    const key = String(id ?? '').trim();
    if (!key) throw new ToolRefusal('Give the id of the memory (from recall or remember).');
    let memory = null;
    try {
        const answer = await deps.getClient().getMemory(key);
        memory = answer?.memory ?? answer;
    } catch (error) {
        if (error?.status !== 404) throw error;
    }
    const refusal = refusalFor(memory, who.speakerId);
    if (refusal) throw new ToolRefusal(refusal);
    return memory;
}

function quote(text, limit = 80) {
    const t = String(text ?? '').replace(/\s+/g, ' ').trim();
    return t.length > limit ? `${t.slice(0, limit - 1)}…` : t;
}

/** remember({text, scope}) */
export async function remember(deps, args) {
    const who = need(deps);
    const answer = await deps.getClient().createMemory(rememberBody(who, args ?? {}));
    const memory = answer?.memory ?? answer;
    return `Saved memory ${memory.id}${memory.scope === 'global' ? ' (global)' : ''}: ${quote(memory.text, 200)}`;
}

/** update_memory({id, text}) */
export async function updateMemory(deps, args) {
    const who = need(deps);
    const text = cleanText(args?.text);
    const memory = await ownMemory(deps, who, args?.id);
    await deps.getClient().patchMemory(memory.id, { text, actor: MODEL });
    return `Updated memory ${memory.id}: ${quote(text, 200)}`;
}

/** forget_memory({id}) */
export async function forgetMemory(deps, args) {
    const who = need(deps);
    const memory = await ownMemory(deps, who, args?.id);
    await deps.getClient().deleteMemory(memory.id, MODEL);
    return `Forgot memory ${memory.id}.`;
}

/**
 * The POST /v1/search body for recall: only what the speaker knows (viewer_id, SW9b).
 * @param {Speaker} who
 * @param {{query: string, k?: number}} args
 * @param {number} maxResults
 */
export function recallBody(who, { query, k }, maxResults) {
    const text = String(query ?? '').trim();
    if (!text) throw new ToolRefusal('Say what to look for.');
    const asked = Number(k);
    const wanted = Number.isInteger(asked) && asked > 0 ? asked : maxResults;
    return { query: text.slice(0, 1000), chat_id: who.chatId, viewer_id: who.speakerId, k: Math.min(wanted, maxResults) };
}

/** Search results as lines the model can read and cite by id. */
export function formatResults(results) {
    if (!Array.isArray(results) || !results.length) return 'Nothing found.';
    return results.map(r => `[${r.kind} ${r.id}] ${String(r.text ?? '').trim()}`).join('\n');
}

/** recall({query, k}) */
export async function recall(deps, args) {
    const who = need(deps);
    const answer = await deps.getClient().search(recallBody(who, args ?? {}, deps.getSettings().recallResults));
    return formatResults(answer?.results);
}

/** read_session_summary({n}) */
export async function readSessionSummary(deps, args) {
    const who = need(deps);
    const n = Number(args?.n);
    if (!Number.isInteger(n) || n < 1) throw new ToolRefusal('Sessions are numbered 1, 2, 3…; give one of those numbers.');
    let answer;
    try {
        answer = await deps.getClient().getSession(who.chatId, n);
    } catch (error) {
        if (error?.status === 404) throw new ToolRefusal(`There is no session ${n} in this chat.`);
        throw error;
    }
    const session = answer?.session ?? answer;
    const text = String(session?.full || session?.short || '').trim();
    return text ? `Session ${n}:\n${text}` : `Session ${n} has no summary yet.`;
}

/**
 * The tool definitions for SillyTavern's registerFunctionTool.
 * @param {ToolDeps} deps
 */
export function toolDefinitions(deps) {
    const on = () => {
        const s = deps.getSettings();
        return Boolean(s.enabled && s.tools && deps.speaker());
    };
    const wrap = (fn) => async (args) => {
        try {
            return await fn(deps, args);
        } catch (error) {
            // SillyTavern hands an Error's text to the model as the tool result; say it plainly.
            if (error instanceof ToolRefusal) throw error;
            throw new Error(`Chronicler could not do that (${error?.message ?? error}).`);
        }
    };
    return [
        {
            name: TOOL_NAMES.remember,
            displayName: 'Remember',
            description: 'Save a durable fact to your long-term memory so you still know it in later scenes and sessions: '
                + 'a name, a birthday, an allergy, a promise, a secret you were told. Not for mood or plot progress. '
                + 'One short, self-contained sentence that names who it is about.',
            parameters: {
                type: 'object',
                properties: {
                    text: { type: 'string', description: `The fact, at most ${MEMORY_MAX_CHARS} characters.` },
                    scope: {
                        type: 'string',
                        enum: ['character', 'global'],
                        description: '"character" (default): your own memory, known to those present now. '
                            + '"global": common knowledge every character may know.',
                    },
                },
                required: ['text'],
            },
            action: wrap(remember),
            formatMessage: (args) => `Chronicler: remembering “${quote(args?.text, 60)}”`,
            shouldRegister: on,
        },
        {
            name: TOOL_NAMES.update,
            displayName: 'Update memory',
            description: 'Rewrite one of your own saved memories (give its id from recall or remember) when the fact changed. '
                + 'Pinned memories cannot be changed.',
            parameters: {
                type: 'object',
                properties: {
                    id: { type: 'string', description: 'The memory id, e.g. m_1a2b….' },
                    text: { type: 'string', description: `The corrected fact, at most ${MEMORY_MAX_CHARS} characters.` },
                },
                required: ['id', 'text'],
            },
            action: wrap(updateMemory),
            formatMessage: (args) => `Chronicler: updating memory ${quote(args?.id, 20)}`,
            shouldRegister: on,
        },
        {
            name: TOOL_NAMES.forget,
            displayName: 'Forget memory',
            description: 'Delete one of your own saved memories that is wrong or no longer true (give its id). '
                + 'Pinned memories cannot be deleted.',
            parameters: {
                type: 'object',
                properties: { id: { type: 'string', description: 'The memory id, e.g. m_1a2b….' } },
                required: ['id'],
            },
            action: wrap(forgetMemory),
            formatMessage: (args) => `Chronicler: forgetting memory ${quote(args?.id, 20)}`,
            shouldRegister: on,
        },
        {
            name: TOOL_NAMES.recall,
            displayName: 'Recall',
            description: 'Search everything you know from earlier (saved memories, past messages, summaries, lore) '
                + 'by meaning, e.g. "Yuki crying in the hallway". Returns matching items with their ids.',
            parameters: {
                type: 'object',
                properties: {
                    query: { type: 'string', description: 'What to look for, in a few words.' },
                    k: { type: 'integer', minimum: 1, maximum: 20, description: 'How many results (default 5).' },
                },
                required: ['query'],
            },
            action: wrap(recall),
            formatMessage: (args) => `Chronicler: recalling “${quote(args?.query, 60)}”`,
            shouldRegister: () => on() && deps.features.has('search'),
        },
        {
            name: TOOL_NAMES.session,
            displayName: 'Read session summary',
            description: 'Read the full summary of an earlier session of this story (sessions are numbered 1, 2, 3…; '
                + 'the context shows recent ones in short form). Use it before referring to details of that session.',
            parameters: {
                type: 'object',
                properties: { n: { type: 'integer', minimum: 1, description: 'The session number.' } },
                required: ['n'],
            },
            action: wrap(readSessionSummary),
            formatMessage: (args) => `Chronicler: reading session ${quote(args?.n, 10)}`,
            shouldRegister: () => on() && deps.features.has('sessions'),
        },
    ];
}

/**
 * Register every tool (safe to call again: SillyTavern replaces a tool of the same name). Returns
 * the names registered. SillyTavern sends registered tools to the model only when
 * `isToolCallingSupported()` holds for the current connection and generation type (RV15: Text
 * Completion, or function calling switched off, gets none), so registering is always harmless.
 * @param {{registerFunctionTool?: Function}} ctx
 * @param {ToolDeps} deps
 */
export function registerTools(ctx, deps) {
    if (typeof ctx.registerFunctionTool !== 'function') return [];
    const defs = toolDefinitions(deps);
    for (const def of defs) ctx.registerFunctionTool(def);
    return defs.map(d => d.name);
}
