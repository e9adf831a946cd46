// The one queue every call of the sync goes through, so events never overtake each other and
// SillyTavern's own event flow is never held up (handlers enqueue and return). Two refinements:
// - a gate (`hold`) that keeps ordinary upserts back while a generation waits for its context;
// - per-chat "critical" tasks (rollbacks, deletes, a first registration), which the context call
//   waits for (ChatSync.settled) and which never wait behind the gate.

/** `promise`, or nothing after `ms` — whichever comes first (never rejects). */
function raceTimeout(promise, ms) {
    let timer;
    const limit = new Promise(resolve => { timer = setTimeout(resolve, Math.max(0, ms)); });
    return Promise.race([promise.catch(() => {}), limit]).finally(() => clearTimeout(timer));
}

export class SyncQueue {
    /**
     * @param {{onSuccess: () => void, onError: (error: Error, what: string) => void}} report
     *   told of every task's outcome (the outage notice)
     */
    constructor(report) {
        this.report = report;
        this.tail = Promise.resolve();
        /** @type {Map<string, Promise<void>>} chat id -> last queued critical task */
        this.critical = new Map();
        this.gate = null;
        this.openGate = null;
    }

    /**
     * Hold the tasks queued as `held` until `release()` or `ms`, whichever comes first.
     * @param {number} ms the longest hold
     */
    hold(ms) {
        this.release();
        let open;
        const gate = new Promise(resolve => { open = resolve; });
        const timer = setTimeout(() => this.release(), Math.max(0, ms));
        this.gate = gate;
        this.openGate = () => {
            clearTimeout(timer);
            open();
        };
    }

    /** Let held tasks go (idempotent). */
    release() {
        const open = this.openGate;
        this.gate = null;
        this.openGate = null;
        open?.();
    }

    /**
     * Run `task` after everything queued before it; errors are reported, never thrown here.
     * @param {string} what the event that asked, for error messages
     * @param {() => Promise<any>} task
     * @param {{held?: boolean, critical?: string}} [how] `held`: wait for the gate open now, if
     *   any; `critical`: the chat whose context must wait for this task
     * @returns {Promise<void>}
     */
    enqueue(what, task, { held = false, critical } = {}) {
        const gate = held ? this.gate : null;
        const run = this.tail.then(gate ? () => gate.then(task) : task).then(
            () => this.report.onSuccess(),
            (error) => this.report.onError(error, what),
        );
        this.tail = run;
        if (critical !== undefined) this.markCritical(critical, run);
        return run;
    }

    /** Remember the last critical task of a chat until it is done. */
    markCritical(chatId, run) {
        this.critical.set(chatId, run);
        run.finally(() => {
            if (this.critical.get(chatId) === run) this.critical.delete(chatId);
        });
    }

    /**
     * Resolves when the queue is empty, or after `ms` (whichever comes first).
     * @param {number} ms
     */
    idle(ms) {
        return raceTimeout(this.tail, ms);
    }

    /**
     * Resolves when the chat's last critical task is done (at once when there is none), or after `ms`.
     * @param {string} chatId
     * @param {number} ms
     */
    criticalDone(chatId, ms) {
        const run = this.critical.get(chatId);
        return run ? raceTimeout(run, ms) : Promise.resolve();
    }
}
