// The next turn's query embedding, started before the turn (POST /v1/context/prefetch).
//
// The context call embeds the player's last action, about half of its time. As soon as the action
// is known, the text goes to the sidecar, which embeds it in the background; the context call then
// finds the vector ready. The text is known three times: at a pause in typing, when the player
// sends (GENERATION_STARTED: the box still holds it, and SillyTavern has yet to save the chat — at
// 10,000 messages a long save — before MESSAGE_SENT), and at MESSAGE_SENT (the message as stored).
// The first two are the box's text as SillyTavern will store it (`expectedMessage`); the last is
// exact, sent only when it differs. Nothing ever waits for this: the request is not awaited, its
// failures are ignored (the context call embeds the text itself, and a text that differs from what
// is finally sent is simply not used). A sidecar without the route is not asked again until the
// features are probed afresh.

/** Legacy name tags SillyTavern's macro engine replaces, case-insensitively. */
const USER_TAG = /<USER>/gi;
const CHAR_TAG = /<(BOT|CHAR)>/gi;
/** What is left of any other macro: SillyTavern may expand it differently, or with side effects. */
const OTHER_MACRO = /\{\{|<(GROUP|CHARIFNOTGROUP)>/i;

/**
 * The text SillyTavern will store for a message typed as `text`, as far as it can be told without
 * running SillyTavern's macros: trimmed (the sidecar reads the query trimmed), `{{user}}`,
 * `{{char}}` and their legacy tags replaced by the names; null for a slash command (no message) or
 * a text with any other macro (a dice roll, a variable: only the sent message says what it became).
 * @param {string} text the input box's text
 * @param {{user?: string, char?: string}} names the persona's and the character's names
 * @returns {string|null}
 */
export function expectedMessage(text, { user = '', char = '' } = {}) {
    const value = String(text ?? '').trim();
    if (!value || value.startsWith('/')) return null;
    const expanded = value.replace(/\{\{user\}\}/gi, () => user).replace(/\{\{char\}\}/gi, () => char)
        .replace(USER_TAG, () => user).replace(CHAR_TAG, () => char);
    return OTHER_MACRO.test(expanded) ? null : expanded.trim();
}

import { isMissingRoute } from './client.js';

export class QueryPrefetch {
    /**
     * @param {{
     *   getClient: () => import('./client.js').SidecarClient,
     *   getSettings: () => import('./settings.js').DEFAULTS,
     *   features: import('./features.js').Features,
     *   chatId: () => string|undefined,
     *   names?: () => {user?: string, char?: string},
     *   setTimer?: (fn: () => void, ms: number) => any,
     *   clearTimer?: (handle: any) => void,
     * }} deps
     */
    constructor(deps) {
        this.deps = deps;
        this.setTimer = deps.setTimer ?? ((fn, ms) => setTimeout(fn, ms));
        this.clearTimer = deps.clearTimer ?? (handle => clearTimeout(handle));
        this.timer = null;
        this.last = '';
        /** How many prefetches were sent (for the panel and the end-to-end measurements). */
        this.sent = 0;
    }

    /** Whether a prefetch may be sent now. */
    wanted() {
        const s = this.deps.getSettings();
        return Boolean(s.enabled && s.prefetchQuery && this.deps.features.has('prefetch'));
    }

    /**
     * The text in the input box changed: send it once the player has paused for `prefetchPauseMs`.
     * @param {string} text
     */
    typed(text) {
        this.cancel();
        if (!this.wanted() || !String(text ?? '').trim()) return;
        this.timer = this.setTimer(() => {
            this.timer = null;
            this.sending(text);
        }, this.deps.getSettings().prefetchPauseMs);
    }

    /** Forget a pause being waited for. */
    cancel() {
        if (this.timer !== null) this.clearTimer(this.timer);
        this.timer = null;
    }

    /**
     * The input box's text is (probably) the message: send what SillyTavern will store of it now.
     * @param {string} text the box's text
     */
    sending(text) {
        this.cancel(); // sent now: a pause timer still running would only repeat it
        const message = expectedMessage(text, this.deps.names?.() ?? {});
        if (message !== null) this.now(message);
    }

    /**
     * Send this text now (the message was sent), unless it was the last one sent for this chat.
     * @param {string} text
     */
    now(text) {
        const chatId = this.deps.chatId();
        const value = String(text ?? '').trim(); // the sidecar reads it trimmed: "hi " is "hi"
        if (!chatId || !value || !this.wanted()) return;
        const key = `${chatId}\u0000${value}`;
        if (key === this.last) return;
        this.last = key;
        this.sent += 1;
        this.deps.getClient().prefetchContext({ chat_id: chatId, text: value }).catch(error => {
            if (isMissingRoute(error)) this.deps.features.note('prefetch', false);
        });
    }
}
