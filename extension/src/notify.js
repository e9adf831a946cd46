// Fail-open notices: the user hears about a sidecar outage once, not on every turn.
// OutageNotifier and outageMessage are pure; `Notices` is handed the function that shows a toast.

import { isMissingRoute } from './client.js';

/**
 * Show a toast in SillyTavern's toastr (which renders `text` as HTML: escape untrusted text).
 * @param {'success'|'info'|'warning'|'error'} kind
 * @param {string} text
 * @param {object} [options] toastr's options
 */
export function toast(kind, text, options = {}) {
    globalThis.toastr?.[kind](text, 'Chronicler', { preventDuplicates: true, ...options });
}

export class OutageNotifier {
    constructor() {
        this.down = false;
        this.failures = 0;
        this.lastError = null;
    }

    /**
     * Record a failed call. True exactly once per outage: on the first failure after a success
     * (or after start), so the caller shows one toast for the whole outage.
     * @param {Error} error
     * @returns {boolean} whether to tell the user now
     */
    failed(error) {
        this.failures += 1;
        this.lastError = error;
        if (this.down) return false;
        this.down = true;
        return true;
    }

    /**
     * Record a successful call: the outage (if any) is over; the next failure is news again.
     * @returns {boolean} whether an outage just ended
     */
    succeeded() {
        const ended = this.down;
        this.down = false;
        this.failures = 0;
        this.lastError = null;
        return ended;
    }
}

/**
 * The toast text for a failed call (short; the details go to the console).
 * @param {{code?: string, message?: string}} error
 * @returns {string}
 */
export function outageMessage(error) {
    const why = error?.message || String(error);
    if (error?.status === 404 && error?.code === 'not_found') {
        return `This Chronicler sidecar lacks a route the extension needs (update it), so chats go on without its memory. ${why}`;
    }
    if (error?.status === 401) {
        return `Chronicler refused the token, so chats go on without its memory. Check the token in the extension's settings. ${why}`;
    }
    return `Chronicler is not reachable, so chats go on without its memory until it is back. ${why}`;
}

/** What the user is told when sidecar calls fail or succeed: one toast per outage, one per missing route. */
export class Notices {
    /**
     * @param {{toast: typeof toast, notifier?: OutageNotifier, log?: {warn: Function}}} deps
     */
    constructor({ toast: show, notifier = new OutageNotifier(), log = console }) {
        this.toast = show;
        this.notifier = notifier;
        this.log = log;
        this.missingRouteTold = false;
    }

    /**
     * A call failed: log it; tell the user at the start of an outage.
     * @param {any} error
     * @param {string} [what] what failed, for the log
     */
    failure(error, what = 'context') {
        this.log.warn(`[Chronicler] ${what} failed:`, error);
        if (isMissingRoute(error)) return this.missingRoute(error);
        if (this.notifier.failed(error)) this.toast('warning', outageMessage(error), { timeOut: 8000 });
    }

    /** A call succeeded: the outage, if any, is over. */
    success() {
        this.notifier.succeeded();
    }

    /**
     * A route this sidecar lacks is not an outage: say so once per page load, not on every turn.
     * @param {any} error
     */
    missingRoute(error) {
        if (this.missingRouteTold) return;
        this.missingRouteTold = true;
        this.toast('warning', outageMessage(error), { timeOut: 8000 });
    }
}
