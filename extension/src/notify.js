// Fail-open notices: the user hears about a sidecar outage once, not on every turn.
// Pure module: the caller shows the toast; this only decides whether to.

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
