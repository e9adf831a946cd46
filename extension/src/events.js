// What Chronicler does when SillyTavern tells it something happened. The handlers get everything
// they touch passed in (SillyTavern's context getter, the settings, the sync, the worker, shared
// state), so node tests run them against fakes; index.js only builds them and calls `listen`.
//
// SillyTavern awaits its event handlers: every handler here does its synchronous part (ids,
// turn stamps, the comparison with what was sent) and queues the rest, and returns nothing.

import { clearPrompts } from './inject.js';
import { stampTurn, swipePending } from './sync/index.js';
import { workerWanted } from './worker.js';

/** How long after a generation ends the sidecar's copy is checked against the saved chat. */
export const FOLLOW_SAVED_MS = 2000;

/** Generation types that do not send the input box's text as the player's message (script.js Generate). */
export const KEEPS_INPUT = new Set(['regenerate', 'swipe', 'quiet', 'impersonate']);

/** Generation types whose MESSAGE_RECEIVED carries no reply of an intercepted generation (no turn). */
export const NOT_A_TURN = new Set(['first_message', 'command', 'extension', 'quiet', 'impersonate']);

/**
 * Each SillyTavern event (a key of `eventTypes`) and the handler it goes to; `syncNow` events only
 * sync the open chat again (the event's name is what a failure then reports).
 */
export const EVENT_HANDLERS = Object.freeze([
    ['CHAT_CHANGED', 'chatChanged'],
    ['MESSAGE_SENT', 'messageSent'],
    ['MESSAGE_RECEIVED', 'messageReceived'],
    ['MESSAGE_EDITED', 'syncNow'],
    ['MESSAGE_UPDATED', 'syncNow'],
    ['MESSAGE_SWIPED', 'messageSwiped'],
    ['MESSAGE_SWIPE_DELETED', 'syncNow'],
    ['MESSAGE_DELETED', 'syncNow'],
    ['GROUP_UPDATED', 'syncNow'],
    ['CHARACTER_DELETED', 'characterDeleted'],
    ['CHARACTER_RENAMED', 'characterRenamed'],
    ['CHAT_RENAMED', 'chatRenamed'],
    ['CHAT_DELETED', 'chatDeleted'],
    ['GROUP_CHAT_DELETED', 'chatDeleted'],
    ['GENERATION_STARTED', 'generationStarted'],
    ['GENERATION_ENDED', 'generationEnded'],
    ['GENERATION_STOPPED', 'generationEnded'],
]);

/**
 * CHAT_RENAMED gives file names with `.jsonl`; chat ids are the names without it.
 * @param {string|undefined} fileName
 * @returns {string}
 */
export function chatIdOf(fileName) {
    return String(fileName ?? '').replace(/\.jsonl$/i, '');
}

/**
 * @typedef {object} EventDeps
 * @property {() => any} getContext SillyTavern.getContext
 * @property {() => import('./settings.js').DEFAULTS} getSettings the settings, with defaults
 * @property {import('./sync/index.js').ChatSync} sync
 * @property {import('./worker.js').JobWorker} worker
 * @property {import('./features.js').Features} features
 * @property {{turns: {current: any}, injected: {keys: Set<string>}, stats: {handlers: {push: (ms: number) => void}}}} state
 *   shared with the interceptor (window.chronicler)
 * @property {(error: any) => void} tellMissingRoute say once that the sidecar lacks a route
 * @property {() => void} [refreshDrawer] the settings drawer, when the sidecar's features changed
 * @property {() => number} [clock] ms, for the handlers' own timing
 * @property {{now: (text: string) => void, sending: (text: string) => void}} [prefetch] the next turn's
 *   query embedding (prefetch.js)
 * @property {() => string} [readInput] the text in SillyTavern's input box
 * @property {{start: (text: string) => Promise<void>}} [early] the turn's context asked for as its
 *   generation starts (early.js)
 */

export class EventHandlers {
    /** @param {EventDeps} deps */
    constructor(deps) {
        this.deps = deps;
        this.clock = deps.clock ?? (() => performance.now());
    }

    enabled() {
        return this.deps.getSettings().enabled;
    }

    /**
     * Sync the open chat (any event that may have changed it).
     * @param {string} what the event, for error messages
     */
    syncNow(what) {
        if (!this.enabled()) return;
        const started = this.clock();
        const { assigned } = this.deps.sync.syncCurrentChat(what);
        // The synchronous part holds up SillyTavern's event flow (handlers are awaited): measure it.
        this.deps.state.stats.handlers.push(this.clock() - started);
        // New ids must reach the chat file. SillyTavern saves a user's message *before* MESSAGE_SENT
        // (and an existing chat may never be saved again), so ask for a save whenever ids were given;
        // the debounced save is skipped if the chat changes meanwhile.
        if (assigned.length) this.deps.getContext().saveMetadataDebounced();
    }

    /** Run the job worker exactly when the settings and the sidecar call for it. */
    startWorker() {
        if (workerWanted(this.deps.getSettings(), this.deps.features)) this.deps.worker.start();
        else this.deps.worker.stop();
    }

    /**
     * Ask the sidecar which optional routes it has (unless known recently, or `force`), then
     * update what depends on them. Never rejects.
     * @param {boolean} [force]
     * @returns {Promise<void>}
     */
    refreshFeatures(force = false) {
        if (!this.enabled()) return Promise.resolve();
        return this.deps.features.refresh({ force }).then(known => this.featuresKnown(known));
    }

    featuresKnown(known) {
        this.deps.refreshDrawer?.();
        this.startWorker();
        if (known.context === false) {
            this.deps.tellMissingRoute({ status: 404, code: 'not_found', message: 'It has no POST /v1/context.' });
        }
    }

    /** CHAT_CHANGED: nothing of the previous chat may reach the next one. */
    chatChanged() {
        const { state } = this.deps;
        // SillyTavern empties all extension prompts when it clears a chat; clear ours explicitly
        // anyway, so no block of the previous chat can reach the next one.
        clearPrompts(this.deps.getContext().setExtensionPrompt, state.injected.keys);
        state.injected.keys = new Set();
        state.turns.current = null;
        this.syncNow('CHAT_CHANGED');
        this.refreshFeatures();
    }

    /**
     * MESSAGE_RECEIVED(index, type): a reply of this chat's current turn carries the turn's id.
     * @param {number} index
     * @param {string} type the generation type
     */
    messageReceived(index, type) {
        const c = this.deps.getContext();
        const message = c.chat[index];
        const turn = this.deps.state.turns.current;
        if (message && turn && turn.chatId === c.getCurrentChatId() && !NOT_A_TURN.has(type)) {
            stampTurn(message, turn.id);
        }
        this.syncNow('MESSAGE_RECEIVED');
    }

    /**
     * MESSAGE_SENT(index): the player's message is known before the prompt is built: its query
     * embedding starts now (not awaited; usually already started at a pause in typing).
     * @param {number} index
     */
    messageSent(index) {
        const message = this.deps.getContext().chat?.[index];
        if (this.enabled() && message?.is_user) this.deps.prefetch?.now(String(message.mes ?? ''));
        this.syncNow('MESSAGE_SENT');
    }

    /** MESSAGE_SWIPED(index): a swipe that is about to generate still shows the old text: the reply will sync it. */
    messageSwiped(index) {
        if (!swipePending(this.deps.getContext().chat[index])) this.syncNow('MESSAGE_SWIPED');
    }

    /**
     * GENERATION_STARTED(type, options, dryRun): the worker steps aside, and the user's new
     * message's upsert waits until the context call is done (ChatSync.hold); the interceptor
     * releases it, the limit covers generations that never reach the interceptor. A generation
     * that sends the input box's text starts that text's query embedding.
     */
    generationStarted(type, options, dryRun) {
        this.deps.worker.generationStarted(type, options, dryRun);
        const s = this.deps.getSettings();
        if (!dryRun && type !== 'quiet' && s.enabled) {
            this.deps.sync.hold(s.contextTimeoutMs + 500);
            this.deps.sync.postponeFollowSaved?.(); // GENERATION_ENDED asks for it again
        }
        // The box's text becomes the player's message only after SillyTavern saved the chat (long
        // for a long chat): its query embedding starts now, MESSAGE_SENT corrects it if it differs.
        if (!dryRun && !options?.automatic_trigger && !KEEPS_INPUT.has(type) && s.enabled) {
            const text = this.deps.readInput?.() ?? '';
            this.deps.prefetch?.sending(text);
            // A message sent now: its context is asked for at once, as a dry run (early.js).
            if (type === undefined || type === 'normal') this.deps.early?.start(text);
        }
    }

    /** GENERATION_ENDED / GENERATION_STOPPED. */
    generationEnded() {
        this.deps.sync.release();
        this.deps.worker.generationEnded();
        // SillyTavern saves the chat as the generation ends; once that save is in, the sidecar
        // follows the file (another tab may have saved this chat too: the last save wins).
        if (this.enabled()) this.deps.sync.followSavedSoon?.(FOLLOW_SAVED_MS);
    }

    /** CHARACTER_DELETED({id, character}). */
    characterDeleted(payload) {
        if (this.enabled()) this.deps.sync.deleteCharacter(payload?.character?.avatar);
    }

    /** CHARACTER_RENAMED(oldAvatar, newAvatar): the new name is read when the move runs. */
    characterRenamed(oldAvatar, newAvatar) {
        if (!this.enabled()) return;
        const newName = () => this.deps.getContext().characters?.find(c => c.avatar === newAvatar)?.name;
        this.deps.sync.renameCharacter(oldAvatar, newAvatar, newName);
    }

    /** CHAT_RENAMED({oldFileName, newFileName}): move the sidecar's chat, then sync it. */
    chatRenamed(payload) {
        if (!this.enabled()) return;
        this.deps.sync.renameChat(chatIdOf(payload?.oldFileName), chatIdOf(payload?.newFileName))
            .then(() => this.syncNow('CHAT_RENAMED'));
    }

    /** CHAT_DELETED(chatId) / GROUP_CHAT_DELETED(chatId). */
    chatDeleted(chatId) {
        if (this.enabled()) this.deps.sync.deleteChat(chatIdOf(chatId));
    }

    /**
     * The user changed a setting: another sidecar (URL or token) is probed afresh; the worker
     * follows the mode and the enable switch.
     * @param {object} before the settings before the change
     * @param {object} after
     */
    settingsChanged(before, after) {
        if (before.sidecarUrl !== after.sidecarUrl || before.token !== after.token) {
            this.deps.features.reset();
            this.refreshFeatures();
        }
        if (before.llmMode !== after.llmMode || before.enabled !== after.enabled) this.startWorker();
    }
}

/**
 * Connect every event of `EVENT_HANDLERS` to its handler. The listeners return nothing, so
 * SillyTavern, which awaits them, never waits for the sidecar.
 * @param {{on: (type: string, fn: Function) => void}} eventSource SillyTavern's
 * @param {Record<string, string>} eventTypes SillyTavern's event names
 * @param {EventHandlers} handlers
 */
export function listen(eventSource, eventTypes, handlers) {
    for (const [event, method] of EVENT_HANDLERS) {
        const listener = method === 'syncNow'
            ? () => { handlers.syncNow(event); }
            : (...args) => { handlers[method](...args); };
        eventSource.on(eventTypes[event], listener);
    }
}
