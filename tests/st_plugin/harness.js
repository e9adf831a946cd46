// A stand-in for the part of SillyTavern a server plugin meets: an HTTP server that parses JSON
// bodies (as SillyTavern's body parser does), sets req.user from the "session" (here a test header),
// and routes /api/plugins/chronicler/* to the plugin's router. The sidecar behind it is real: this
// checkout's `chronicler serve`, started by the plugin itself.

import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const MOUNT = '/api/plugins/chronicler';

/** The Python that runs the sidecar: the checkout's venv, else the shared one. */
export function python() {
    for (const candidate of [process.env.CHRONICLER_TEST_PYTHON, path.join(REPO, '.venv', 'bin', 'python'),
        '/work/main/.venv/bin/python']) {
        if (candidate && fs.existsSync(candidate)) return candidate;
    }
    return null;
}

/** A router with the two methods the plugin uses (get, use), as Express's behaves for them. */
export function fakeRouter() {
    const routes = [];
    return {
        get(route, handler) { routes.push({ method: 'GET', route, handler }); },
        use(handler) { routes.push({ method: null, route: null, handler }); },
        handle(req, res) {
            let i = 0;
            const next = () => {
                const entry = routes[i++];
                if (!entry) { res.writeHead(404); res.end('not found'); return; }
                if (entry.route === null) return entry.handler(req, res, next);
                if (entry.method === req.method && req.url.split('?')[0] === entry.route) return entry.handler(req, res, next);
                return next();
            };
            next();
        },
    };
}

/** Start the stand-in on a free loopback port; resolves to its base URL and a close(). */
export function serveRouter(router) {
    const server = http.createServer((req, res) => {
        const chunks = [];
        req.on('data', c => chunks.push(c));
        req.on('end', () => {
            const raw = Buffer.concat(chunks).toString('utf8');
            req.body = {};
            if (raw && String(req.headers['content-type'] ?? '').startsWith('application/json')) {
                try { req.body = JSON.parse(raw); } catch { res.writeHead(400); res.end('Bad Request'); return; }
            }
            const user = req.headers['x-test-session'];
            if (user) req.user = { profile: { handle: String(user) }, directories: {} };
            if (!req.url.startsWith(MOUNT)) { res.writeHead(404); res.end(); return; }
            req.url = req.url.slice(MOUNT.length) || '/';
            router.handle(req, res);
        });
    });
    return new Promise(resolve => server.listen(0, '127.0.0.1', () => resolve({
        url: `http://127.0.0.1:${server.address().port}${MOUNT}`,
        close: () => new Promise(done => { server.closeAllConnections?.(); server.close(done); }),
    })));
}

/** A fresh data folder and a plugin.config.json that starts this checkout's sidecar. */
export function pluginConfig(py) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'chronicler-plugin-'));
    const dataDir = path.join(dir, 'data');
    const file = path.join(dir, 'plugin.config.json');
    fs.writeFileSync(file, JSON.stringify({ command: [py, '-m', 'server_plugin.cli', 'serve'], dataDir,
        logFile: path.join(dir, 'sidecar.log'), version: '0.1.0' }));
    const env = { ...process.env, CHRONICLER_PLUGIN_CONFIG: file, PYTHONPATH: REPO, HF_HUB_OFFLINE: '1',
        OPENBLAS_NUM_THREADS: '1', CHRONICLER_WORKER_ENABLED: 'false' };
    return { dir, dataDir, file, env };
}

/** Poll `check` until it returns a truthy value (or throw after `ms`). */
export async function eventually(check, ms = 60000, every = 100) {
    const deadline = Date.now() + ms;
    let last;
    while (Date.now() < deadline) {
        try {
            last = await check();
            if (last) return last;
        } catch (error) {
            last = error;
        }
        await new Promise(r => setTimeout(r, every));
    }
    throw new Error(`not in time: ${last}`);
}
