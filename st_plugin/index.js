'use strict';
// Chronicler's SillyTavern server plugin (CommonJS, Node built-ins only). SillyTavern loads it from
// <server folder>/plugins/chronicler/ when config.yaml has `enableServerPlugins: true`, and mounts
// its routes at /api/plugins/chronicler/ behind its login and CSRF checks:
//   GET  /status   the sidecar's state, its version and ours, the last error
//   ANY  /v1/*     proxied to the sidecar's /v1/*, for the session's user (their own store)
// init() starts the sidecar (the command `chronicler install-extension` recorded), exit() stops it.

const http = require('node:http');
const path = require('node:path');

const { readConfig, writeConnection, removeConnection } = require('./src/config.js');
const { Supervisor } = require('./src/supervisor.js');
const { makeProxy, sendError, handleOf } = require('./src/proxy.js');

const VERSION = require('./package.json').version;

const info = {
    id: 'chronicler',
    name: 'Chronicler',
    description: 'Long-campaign memory: starts the Chronicler sidecar with SillyTavern and connects the extension to it.',
};

/** What the plugin knows; one per process (SillyTavern loads a plugin once). */
const plugin = { supervisor: null, config: null, error: null, sidecar: null };

/** GET the sidecar's /v1/health with the token (its version and limits). */
function fetchHealth(port, token) {
    return new Promise((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port, path: '/v1/health', timeout: 5000,
            headers: { Authorization: `Bearer ${token}` } }, res => {
            let raw = '';
            res.setEncoding('utf8');
            res.on('data', chunk => { raw += chunk; });
            res.on('end', () => { try { resolve(JSON.parse(raw)); } catch (error) { reject(error); } });
        });
        req.on('timeout', () => req.destroy(new Error('timeout')));
        req.on('error', reject);
    });
}

function onListening(where) {
    plugin.sidecar = { port: where.port, token: where.token, limits: null, version: null };
    try {
        writeConnection(plugin.config.dataDir, where);
    } catch (error) {
        console.warn(`[chronicler] cannot write the connection file: ${error.message}`);
    }
    fetchHealth(where.port, where.token).then(health => {
        if (plugin.sidecar?.port !== where.port) return;
        plugin.sidecar.limits = health.limits ?? null;
        plugin.sidecar.version = health.version ?? null;
    }).catch(() => {});
}

const sidecar = {
    target: () => (plugin.supervisor?.state === 'running' && plugin.sidecar ? plugin.sidecar : null),
    why: () => plugin.error ?? plugin.supervisor?.lastError ?? `it is ${plugin.supervisor?.state ?? 'not configured'}`,
};

function status(req, res) {
    if (!handleOf(req)) return sendError(res, 401, 'no_session', 'No SillyTavern user session: log in to SillyTavern first.');
    const body = JSON.stringify({
        ok: true,
        plugin_version: VERSION,
        sidecar_version: plugin.sidecar?.version ?? null,
        user: handleOf(req),
        ...(plugin.supervisor ? plugin.supervisor.status() : { state: 'failed', pid: null, restarts: 0, last_error: plugin.error, log_file: null }),
    });
    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' });
    res.end(body);
}

/**
 * Register the routes and start the sidecar.
 * @param {import('express').Router} router
 * @param {{folder?: string, env?: NodeJS.ProcessEnv, backoffMs?: number[]}} [options] for tests
 */
async function init(router, options = {}) {
    const proxy = makeProxy(sidecar);
    router.get('/status', status);
    // Any method under /v1/: matched by prefix (works with Express 4 and 5 path syntax alike).
    router.use((req, res, next) => (req.url.startsWith('/v1/') ? proxy(req, res) : next()));
    const config = readConfig(options.folder ?? __dirname, options.env ?? process.env);
    if (config instanceof Error) {
        plugin.error = config.message;
        console.error(`[chronicler] ${config.message}`);
        return;
    }
    plugin.config = config;
    plugin.error = null;
    plugin.supervisor = new Supervisor(config, { onListening, onDown: () => { plugin.sidecar = null; },
        env: options.env, backoffMs: options.backoffMs });
    plugin.supervisor.start();
    console.log(`[chronicler] starting the sidecar (log: ${config.logFile})`);
}

/** Stop the sidecar (SillyTavern calls this on a normal shutdown). */
async function exit() {
    const running = plugin.supervisor;
    plugin.supervisor = null;
    plugin.sidecar = null;
    if (running) {
        await running.stop();
        removeConnection(running.config.dataDir);
    }
}

module.exports = { info, init, exit, VERSION, plugin, folder: path.resolve(__dirname) };
