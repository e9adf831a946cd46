// The turn's context asked for early (POST /v1/context with `dry_run`).
//
// A generation that sends the input box starts (GENERATION_STARTED) well before SillyTavern calls
// the generate interceptor: it saves the chat, renders the message and copies the chat for the
// prompt first (about 140 ms at 10,000 messages). A context call made by the interceptor then
// waits for the network and for the page's main thread, which is busy rendering that message. So
// as the generation starts, the extension asks for the context the interceptor will ask for: the
// same request, with the box's text as SillyTavern will store it (prefetch.js `expectedMessage`)
// and the chat's prompt size of its last generation, as a dry run (the sidecar records nothing).
// The interceptor builds its request as always. When it is the same request, it takes the early
// answer (there already, most of the time) and sends the request once more without waiting for
// it: the sidecar records the turn and, if nothing was written since, keeps that very answer
// (server_plugin/story/ahead.py). Any difference (the stored message is not the text expected,
// another prompt size, a group chat, a sidecar without `context_dry_run`) and the interceptor
// asks and waits as before.
//
// The main thread's time of the early ask (building the request, reading the answer) is counted
// into the next generation's time (`drainSpent`): it is the extension's, wherever it falls.

import { turnRequest } from './interceptor.js';
import { expectedMessage } from './prefetch.js';
import { characterAvatar, chatMembers } from './sync/index.js';

export class EarlyContext {
    /**
     * @param {{
     *   getContext: () => any,
     *   getSettings: () => import('./settings.js').DEFAULTS,
     *   getClient: () => import('./client.js').SidecarClient,
     *   features: import('./features.js').Features,
     *   sync: {idle: (ms: number) => Promise<void>},
     *   standingTokens?: (ctx: any) => Promise<number>,
     *   names?: () => {user?: string, char?: string},
     *   now?: () => number,
     * }} deps
     */
    constructor(deps) {
        this.deps = deps;
        this.now = deps.now ?? (() => performance.now());
        /** The ask of the generation under way: {key, promise, timing} once sent. */
        this.pending = null;
        /** chat id -> the interceptor's prompt size (contextSize) of its last generation */
        this.sizes = new Map();
        /** Main-thread ms spent since the last `drainSpent`; asks sent; answers taken. */
        this.spent = 0;
        this.asked = 0;
        this.taken = 0;
    }

    /** Whether an early ask may be sent now. */
    wanted() {
        const s = this.deps.getSettings();
        return Boolean(s.enabled && s.earlyContext && this.deps.features.has('earlyContext'));
    }

    /**
     * The interceptor's prompt size for this chat (SillyTavern's context minus the response):
     * the next early ask of the chat uses it.
     * @param {string} chatId
     * @param {number} contextSize
     */
    noteSize(chatId, contextSize) {
        this.sizes.set(chatId, contextSize);
    }

    /**
     * A generation that sends the input box started: ask for its context now. Nothing waits for
     * this; a newer start or the interceptor's `take` makes an ask still being prepared give up.
     * @param {string} inputText the input box's text
     */
    async start(inputText) {
        let began = this.now();
        this.pending = null;
        if (!this.wanted()) return;
        const ctx = this.deps.getContext();
        const chatId = ctx.getCurrentChatId?.();
        const speakerId = characterAvatar(ctx);
        const contextSize = this.sizes.get(chatId);
        const text = expectedMessage(inputText, this.deps.names?.() ?? {});
        if (!chatId || !speakerId || contextSize === undefined || text === null || chatMembers(ctx).isGroup) return;
        const settings = this.deps.getSettings();
        const slot = {};
        this.pending = slot;
        this.spent += this.now() - began;
        // What the interceptor waits for first (its `sync.settled`), and the standing prompt's count.
        await this.deps.sync.idle(settings.syncWaitMs);
        const standing = (await this.deps.standingTokens?.(ctx)) ?? 0;
        if (this.pending !== slot) return;
        began = this.now();
        const { body } = turnRequest({
            chatId, speakerId, presentIds: [speakerId], contextSize, standing, settings,
            type: 'normal', chat: [{ is_user: true, mes: text }],
        });
        slot.key = JSON.stringify(body);
        slot.timing = {};
        slot.promise = this.deps.getClient().context({ ...body, dry_run: true },
            { timeoutMs: settings.contextTimeoutMs, timing: slot.timing });
        slot.promise.then(() => { this.spent += slot.timing.parseMs ?? 0; }, () => {});
        this.asked += 1;
        this.spent += this.now() - began;
    }

    /**
     * The early ask for exactly this request, if one was sent ({promise, timing}); null otherwise.
     * Either way the pending ask is given up: one generation, one early ask.
     * @param {object} body the interceptor's `POST /v1/context` body
     */
    take(body) {
        const slot = this.pending;
        this.pending = null;
        if (!slot?.promise || slot.key !== JSON.stringify(body)) return null;
        this.taken += 1;
        return slot;
    }

    /** The main-thread ms of early asks since the last call (the generation's own time). */
    drainSpent() {
        const spent = this.spent;
        this.spent = 0;
        return spent;
    }
}
