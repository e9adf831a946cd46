// The next turn's query embedding, started before the turn (POST /v1/context/prefetch).
//
// The context call embeds the player's last action, about half of its time. As soon as the action
// is known (the player paused typing, or sent it), the text goes to the sidecar, which embeds it in
// the background; the context call then finds the vector ready. Nothing ever waits for this: the
// request is not awaited, its failures are ignored (the context call embeds the text itself, and a
// text that differs from what is finally sent is simply not used). A sidecar without the route is
// not asked again until the features are probed afresh.

import { isMissingRoute } from './client.js';

export class QueryPrefetch {
    /**
     * @param {{
     *   getClient: () => import('./client.js').SidecarClient,
     *   getSettings: () => import('./settings.js').DEFAULTS,
     *   features: import('./features.js').Features,
     *   chatId: () => string|undefined,
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
        if (this.timer !== null) this.clearTimer(this.timer);
        this.timer = null;
        if (!this.wanted() || !String(text ?? '').trim()) return;
        this.timer = this.setTimer(() => {
            this.timer = null;
            this.now(text);
        }, this.deps.getSettings().prefetchPauseMs);
    }

    /**
     * Send this text now (the message was sent), unless it was the last one sent for this chat.
     * @param {string} text
     */
    now(text) {
        const chatId = this.deps.chatId();
        const value = String(text ?? '');
        if (!chatId || !value.trim() || !this.wanted()) return;
        const key = `${chatId}\u0000${value}`;
        if (key === this.last) return;
        this.last = key;
        this.sent += 1;
        this.deps.getClient().prefetchContext({ chat_id: chatId, text: value }).catch(error => {
            if (isMissingRoute(error)) this.deps.features.note('prefetch', false);
        });
    }
}
