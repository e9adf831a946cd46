'use strict';
// The sidecar as a child of SillyTavern's process: started on loopback at a free port with a token
// only this process knows, restarted with bounded backoff when it dies, stopped on exit(). Its
// stdin is a pipe held by this process: when SillyTavern dies without exit() (SIGKILL), the OS
// closes it and the sidecar (serve --exit-with-stdin) leaves by itself.

const { spawn } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

const LISTENING = /Chronicler sidecar listening on http:\/\/127\.0\.0\.1:(\d+)\/v1/;
/** Waits before restart number 1, 2, …; the last repeats (bounded: never more than it). */
const BACKOFF_MS = Object.freeze([250, 500, 1000, 2000, 4000, 8000, 15000]);
/** A sidecar that ran this long is healthy again: the next crash starts the backoff over. */
const HEALTHY_AFTER_MS = 60000;
/** How long exit() waits for the sidecar to stop before it is killed. */
const STOP_GRACE_MS = 5000;

class Supervisor {
    /**
     * @param {{command: string[], dataDir: string, logFile: string}} config
     * @param {{onListening?: (where: {url: string, port: number, token: string, pid: number}) => void,
     *          onDown?: () => void, backoffMs?: readonly number[], env?: NodeJS.ProcessEnv}} [options]
     */
    constructor(config, options = {}) {
        this.config = config;
        this.options = options;
        this.backoffMs = options.backoffMs ?? BACKOFF_MS;
        this.token = crypto.randomBytes(32).toString('base64url');
        this.state = 'stopped';
        this.port = null;
        this.child = null;
        this.lastError = null;
        this.restarts = 0;
        this.failures = 0;
        this.startedAt = 0;
        this.stopping = false;
        this.timer = null;
        this.log = null;
    }

    /** Start the sidecar (again). */
    start() {
        this.stopping = false;
        this.state = this.restarts ? 'restarting' : 'starting';
        this.port = null;
        fs.mkdirSync(path.dirname(this.config.logFile), { recursive: true });
        this.log ??= fs.createWriteStream(this.config.logFile, { flags: 'a', mode: 0o600 });
        this.log.write(`\n--- ${new Date().toISOString()} starting: ${this.config.command.join(' ')}\n`);
        const [program, ...args] = this.config.command;
        const child = spawn(program, [...args, '--host', '127.0.0.1', '--port', '0', '--data-dir', this.config.dataDir,
            '--per-user', '--exit-with-stdin'], {
            stdio: ['pipe', 'pipe', 'pipe'],
            env: { ...(this.options.env ?? process.env), CHRONICLER_TOKEN: this.token, CHRONICLER_HOST: '127.0.0.1' },
            windowsHide: true,
        });
        this.child = child;
        this.startedAt = Date.now();
        let seen = '';
        child.stdout.on('data', chunk => {
            this.log.write(chunk);
            if (this.port !== null) return;
            seen += chunk.toString('utf8');
            const match = LISTENING.exec(seen);
            if (match) this.#listening(child, Number(match[1]));
        });
        child.stderr.on('data', chunk => {
            this.log.write(chunk);
            const lines = chunk.toString('utf8').trim().split('\n');
            const last = lines[lines.length - 1];
            if (/error|chronicler:/i.test(last)) this.lastError = last.slice(0, 500);
        });
        child.stdin.on('error', () => {});  // the sidecar left first: nothing to tell it
        child.on('error', error => {
            this.lastError = `cannot start ${program}: ${error.message}`;
            this.log.write(`${this.lastError}\n`);
        });
        child.on('exit', (code, signal) => this.#exited(child, code, signal));
    }

    #listening(child, port) {
        if (child !== this.child) return;
        this.port = port;
        this.state = 'running';
        this.options.onListening?.({ url: this.url(), port, token: this.token, pid: child.pid });
    }

    #exited(child, code, signal) {
        if (child !== this.child) return;
        this.child = null;
        this.port = null;
        this.options.onDown?.();
        const how = signal ? `signal ${signal}` : `code ${code}`;
        this.log?.write(`--- ${new Date().toISOString()} the sidecar exited (${how})\n`);
        if (this.stopping) {
            this.state = 'stopped';
            return;
        }
        this.lastError = `the sidecar exited (${how})${this.lastError ? `; last: ${this.lastError}` : ''}`.slice(0, 800);
        if (Date.now() - this.startedAt > HEALTHY_AFTER_MS) this.failures = 0;
        const wait = this.backoffMs[Math.min(this.failures, this.backoffMs.length - 1)];
        this.failures += 1;
        this.restarts += 1;
        this.state = 'restarting';
        this.timer = setTimeout(() => { this.timer = null; this.start(); }, wait);
        this.timer.unref?.();
    }

    /** The sidecar's base URL while it listens, else null. */
    url() {
        return this.port === null ? null : `http://127.0.0.1:${this.port}`;
    }

    /**
     * Stop it (exit()): SIGTERM, then SIGKILL after a grace period. Resolves once it is gone.
     * @returns {Promise<void>}
     */
    stop(graceMs = STOP_GRACE_MS) {
        this.stopping = true;
        if (this.timer) clearTimeout(this.timer);
        this.timer = null;
        const child = this.child;
        if (!child) {
            this.state = 'stopped';
            return Promise.resolve();
        }
        return new Promise(resolve => {
            const kill = setTimeout(() => child.kill('SIGKILL'), graceMs);
            child.once('exit', () => {
                clearTimeout(kill);
                this.log?.end();
                this.log = null;
                resolve();
            });
            child.kill('SIGTERM');
        });
    }

    /** What GET /status tells (no token). */
    status() {
        return {
            state: this.state,
            pid: this.child?.pid ?? null,
            restarts: this.restarts,
            last_error: this.lastError,
            log_file: this.config.logFile,
        };
    }
}

module.exports = { Supervisor, BACKOFF_MS, LISTENING };
