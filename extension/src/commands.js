// Slash commands for the person at the keyboard:
//   /remember [scope=global|character] [pin=true] [for=Name] text   save a memory (RV9b)
//   /recall query                                                   search the memory
//   /session-end                                                    close the session (SW2)
//   /chronicler-continue                                            continue the campaign in a new chat (CP1f)
//
// The callbacks' logic is here as plain functions of their arguments and `deps`; `registerCommands`
// only wraps them in SillyTavern's SlashCommand objects.

/**
 * @typedef {object} CommandDeps
 * @property {() => import('./client.js').SidecarClient} getClient
 * @property {() => {chatId?: string, isGroup: boolean, memberIds: string[], characterId?: string, lastSpeakerId?: string,
 *   characters: Array<{avatar: string, name: string}>}} where the open chat and its people
 * @property {() => {recallResults: number}} getSettings
 * @property {import('./campaign.js').ContinueDeps['st']} [st] SillyTavern's side of /chronicler-continue
 */

import { continueCampaign } from './campaign.js';
import { escapeHtml } from './html.js';

const TRUE = new Set(['true', 'yes', 'on', '1']);
const FALSE = new Set(['false', 'no', 'off', '0', '']);

/** An error whose message is meant for the user as is. */
export class CommandError extends Error {
    constructor(message) {
        super(message);
        this.name = 'CommandError';
    }
}

function flag(value, name) {
    const v = String(value ?? '').trim().toLowerCase();
    if (TRUE.has(v)) return true;
    if (FALSE.has(v)) return false;
    throw new CommandError(`${name}= takes true or false, not "${value}".`);
}

/**
 * The character a character-scoped /remember is for: `for=` (a card's name or avatar file) if
 * given; else the chat's character, or in a group the member who spoke last.
 * @param {ReturnType<CommandDeps['where']>} here
 * @param {string|undefined} forWhom
 * @returns {string} a character id (avatar file name)
 */
export function resolveCharacter(here, forWhom) {
    const wanted = String(forWhom ?? '').trim();
    if (wanted) {
        const lower = wanted.toLowerCase();
        const pool = here.isGroup ? here.characters.filter(c => here.memberIds.includes(c.avatar)) : here.characters;
        const found = pool.find(c => c.avatar === wanted) ?? pool.find(c => String(c.name).toLowerCase() === lower)
            ?? here.characters.find(c => c.avatar === wanted) ?? here.characters.find(c => String(c.name).toLowerCase() === lower);
        if (!found) throw new CommandError(`No character named "${wanted}".`);
        return found.avatar;
    }
    const id = here.isGroup ? here.lastSpeakerId : here.characterId;
    if (!id) {
        throw new CommandError(here.isGroup
            ? 'In a group chat, say whose memory it is: /remember for=Name …, or scope=global.'
            : 'Open a character chat first, or use scope=global.');
    }
    return id;
}

/**
 * The POST /v1/memories body of `/remember`. A person writes it (actor "user"), so it may be
 * pinned (RV11) and is visible to everyone who reads its scope (no known_by). It carries the chat
 * (RV16 applies) but no turn: a person's memory is not undone by a swipe.
 * @param {ReturnType<CommandDeps['where']>} here
 * @param {{scope?: string, pin?: string, for?: string}} named
 * @param {string} text
 */
export function rememberRequest(here, named, text) {
    const body = String(text ?? '').trim();
    if (!body) throw new CommandError('Usage: /remember [scope=global|character] [pin=true] [for=Name] text');
    const scope = String(named.scope ?? 'character').trim().toLowerCase() || 'character';
    if (!['global', 'character'].includes(scope)) throw new CommandError(`scope= is global or character, not "${named.scope}".`);
    const request = {
        text: body,
        scope,
        character_id: scope === 'character' ? resolveCharacter(here, named.for) : null,
        pinned: named.pin === undefined ? false : flag(named.pin, 'pin'),
        actor: 'user',
    };
    if (here.chatId) request.chat_id = here.chatId;
    return request;
}

/** `/remember`: returns the saved memory's id (for pipes) and a sentence for a toast. */
export async function rememberCommand(deps, named, text) {
    const here = deps.where();
    const answer = await deps.getClient().createMemory(rememberRequest(here, named ?? {}, text));
    const memory = answer?.memory ?? answer;
    const whose = memory.scope === 'global' ? 'global memory'
        : `memory of ${here.characters.find(c => c.avatar === memory.character_id)?.name ?? memory.character_id}`;
    return { value: memory.id, message: `Saved a ${memory.pinned ? 'pinned ' : ''}${whose}.` };
}

/** `/recall query`: the person sees everything (no viewer), ranked for the open chat. */
export async function recallCommand(deps, query) {
    const text = String(query ?? '').trim();
    if (!text) throw new CommandError('Usage: /recall what to look for');
    const here = deps.where();
    const body = { query: text.slice(0, 1000), k: deps.getSettings().recallResults };
    if (here.chatId) body.chat_id = here.chatId;
    const answer = await deps.getClient().search(body);
    const results = Array.isArray(answer?.results) ? answer.results : [];
    const lines = results.map(r => `[${r.kind}] ${String(r.text ?? '').trim()}`);
    return { value: lines.join('\n'), message: results.length ? `${results.length} found.` : 'Nothing found.', results };
}

/** `/session-end`: close the open chat's current session (its summary is written in the background). */
export async function sessionEndCommand(deps) {
    const here = deps.where();
    if (!here.chatId) throw new CommandError('Open a chat first.');
    const answer = await deps.getClient().endSession(here.chatId);
    const session = answer && 'session' in answer ? answer.session : answer;
    if (!session) return { value: '', message: 'No session is open in this chat (it starts with the next message).' };
    const n = session.n;
    return { value: n === undefined ? '' : String(n), message: n === undefined ? 'Session ended.' : `Session ${n} ended; its summary is being written.` };
}

/**
 * Register the three commands with SillyTavern's parser.
 * @param {any} ctx SillyTavern.getContext()
 * @param {CommandDeps} deps
 * @param {{ok: (text: string) => void, fail: (error: Error) => void, show: (title: string, lines: string[]) => void}} ui
 */
export function registerCommands(ctx, deps, ui) {
    const { SlashCommandParser, SlashCommand, SlashCommandArgument, SlashCommandNamedArgument, ARGUMENT_TYPE } = ctx;
    if (!SlashCommandParser?.addCommandObject || !SlashCommand?.fromProps) return [];
    const run = (fn, after) => async (...args) => {
        try {
            const out = await fn(...args);
            after?.(out);
            ui.ok(out.message);
            return out.value;
        } catch (error) {
            ui.fail(error);
            return '';
        }
    };
    const text = (unnamed) => (Array.isArray(unnamed) ? unnamed.join(' ') : String(unnamed ?? ''));

    SlashCommandParser.addCommandObject(SlashCommand.fromProps({
        name: 'remember',
        callback: run((named, unnamed) => rememberCommand(deps, named, text(unnamed))),
        returns: 'the id of the saved memory',
        namedArgumentList: [
            SlashCommandNamedArgument.fromProps({
                name: 'scope', description: 'character (default): one character\'s memory; global: every character\'s',
                typeList: [ARGUMENT_TYPE.STRING], enumList: ['character', 'global'], defaultValue: 'character', forceEnum: true,
            }),
            SlashCommandNamedArgument.fromProps({
                name: 'pin', description: 'pin it: sent in full every turn, never pushed out or changed by the model',
                typeList: [ARGUMENT_TYPE.BOOLEAN], defaultValue: 'false',
            }),
            SlashCommandNamedArgument.fromProps({
                name: 'for', description: 'whose memory (a character\'s name); default: this chat\'s character, in a group the last speaker',
                typeList: [ARGUMENT_TYPE.STRING],
            }),
        ],
        unnamedArgumentList: [
            SlashCommandArgument.fromProps({ description: 'the fact to remember', typeList: [ARGUMENT_TYPE.STRING], isRequired: true }),
        ],
        helpString: '<div>Save a memory in Chronicler.</div><div>Examples: <code>/remember Mara is allergic to bees</code>, '
            + '<code>/remember scope=global pin=true The war ended in 1312</code>.</div>',
    }));

    SlashCommandParser.addCommandObject(SlashCommand.fromProps({
        name: 'recall',
        callback: run((_named, unnamed) => recallCommand(deps, text(unnamed)), (out) => ui.show('Chronicler: recall', out.value ? out.value.split('\n') : [])),
        returns: 'the matching items, one per line',
        unnamedArgumentList: [
            SlashCommandArgument.fromProps({ description: 'what to look for', typeList: [ARGUMENT_TYPE.STRING], isRequired: true }),
        ],
        helpString: '<div>Search Chronicler\'s memory (memories, messages, summaries, lore) by meaning.</div>'
            + '<div>Example: <code>/recall Yuki crying in the hallway</code></div>',
    }));

    SlashCommandParser.addCommandObject(SlashCommand.fromProps({
        name: 'session-end',
        callback: run(() => sessionEndCommand(deps)),
        returns: 'the number of the session that was closed',
        helpString: '<div>End the current session of this chat in Chronicler: it writes the session summary, scene '
            + 'summaries and character memories in the background. The next message starts a new session.</div>',
    }));
    if (!deps.st) return ['remember', 'recall', 'session-end'];
    SlashCommandParser.addCommandObject(SlashCommand.fromProps({
        name: 'chronicler-continue',
        callback: run(() => continueCampaign(deps)),
        returns: 'the id of the new chat',
        helpString: '<div>Continue this chat\'s campaign in a new chat with the same character or group: '
            + 'Chronicler keeps its memory, and the new chat opens with a short "previously" recap.</div>',
    }));
    return ['remember', 'recall', 'session-end', 'chronicler-continue'];
}

/**
 * The popup /recall shows: a title and the lines found, escaped (they are memory text).
 * @param {string} title
 * @param {string[]} lines
 */
export function resultsHtml(title, lines) {
    return `<h3>${escapeHtml(title)}</h3><pre class="chronicler-recall">${escapeHtml(lines.join('\n') || 'Nothing found.')}</pre>`;
}

/**
 * How the commands speak to the person: toasts, and SillyTavern's popup for results.
 * @param {any} ctx SillyTavern.getContext()
 * @param {(kind: string, text: string) => void} toast
 */
export function commandUi(ctx, toast) {
    return {
        ok: (text) => toast('success', text),
        fail: (error) => toast('error', error?.message ?? String(error)),
        show: (title, lines) => ctx.callGenericPopup?.(resultsHtml(title, lines), ctx.POPUP_TYPE?.TEXT ?? 1),
    };
}
