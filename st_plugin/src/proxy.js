'use strict';
// /api/plugins/chronicler/v1/* → the sidecar's /v1/*, for the SillyTavern user of the session.
// SillyTavern has already checked the session (and, for writes, its CSRF token) and parsed a JSON
// body; here the body is re-serialised, held to the sidecar's own limits before it is sent, and
// forwarded with the plugin's token and the user's handle. Nothing from the browser but the method,
// the path with its query and the JSON body reaches the sidecar (no cookie, no Origin, no header).

const http = require('node:http');

/** The sidecar's limits until its /v1/health said them (its settings' defaults). */
const DEFAULT_LIMITS = Object.freeze({
    max_body_bytes: 1048576, max_import_bytes: 67108864, max_store_import_bytes: 536870912,
    max_messages_body_bytes: 33554432, max_json_depth: 32,
});
const STORE_IMPORT_PATH = '/v1/import';
const BODY_METHODS = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
const MESSAGES_PATH = /^\/v1\/chats\/[^/]+\/messages\/?$/;
// What SillyTavern's JSON parser turned into an object must still be what the sidecar accepts.
const HANDLE = /^[a-z0-9][a-z0-9_-]{0,63}$/;
// One kept-alive connection pool to the sidecar: no TCP handshake per request.
const AGENT = new http.Agent({ keepAlive: true, maxSockets: 16 });

/** The one error envelope, as the sidecar writes it. */
function sendError(res, status, code, message, details = []) {
    const body = JSON.stringify({ ok: false, error: { code, message, details } });
    res.writeHead(status, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store',
        'X-Content-Type-Options': 'nosniff', 'Content-Length': Buffer.byteLength(body) });
    res.end(body);
}

/** Deepest nesting of arrays/objects (iterative: a deep body cannot overflow the stack). */
function depthOf(value, stopAt) {
    let deepest = 0;
    const stack = [[value, 1]];
    while (stack.length) {
        const [item, depth] = stack.pop();
        if (item === null || typeof item !== 'object') continue;
        deepest = Math.max(deepest, depth);
        if (deepest > stopAt) return deepest;
        for (const child of Array.isArray(item) ? item : Object.values(item)) stack.push([child, depth + 1]);
    }
    return deepest;
}

/** The sidecar's body limit for this request (the same rule as its api/security.body_limit). */
function limitFor(method, path, limits) {
    const bare = path.replace(/\/+$/, '');
    // A whole store (POST /v1/import) has its own limit; an older sidecar's health lacks it.
    if (method === 'POST' && bare === STORE_IMPORT_PATH) return limits.max_store_import_bytes ?? limits.max_import_bytes;
    if (bare.endsWith('/import')) return limits.max_import_bytes;  // a card, a World Info file
    if (method === 'POST' && MESSAGES_PATH.test(path)) return limits.max_messages_body_bytes;
    return limits.max_body_bytes;
}

/** Whether the browser sent a body at all (SillyTavern's parser leaves `{}` when there was none). */
function hasBody(req) {
    const length = Number(req.headers['content-length'] ?? 0);
    return length > 0 || req.headers['transfer-encoding'] !== undefined;
}

/**
 * The body to forward (a Buffer, or null), or an error [status, code, message, details] to answer.
 * @returns {{body: Buffer|null} | {refuse: [number, string, string, object[]]}}
 */
function bodyOf(req, path, limits) {
    if (!BODY_METHODS.has(req.method) || !hasBody(req)) return { body: null };
    const type = String(req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
    if (type !== 'application/json') {
        return { refuse: [415, 'unsupported_media_type', `Bodies must be sent as 'Content-Type: application/json' (got '${type || 'none'}').`, []] };
    }
    const limit = limitFor(req.method, path, limits);
    const declared = Number(req.headers['content-length'] ?? 0);
    if (declared > limit) {
        return { refuse: [413, 'payload_too_large', `The body has ${declared} bytes; at most ${limit} are accepted here.`, [{ max_bytes: limit }]] };
    }
    if (depthOf(req.body, limits.max_json_depth) > limits.max_json_depth) {
        return { refuse: [400, 'too_deep', `The JSON body nests deeper than ${limits.max_json_depth} levels.`, [{ max_depth: limits.max_json_depth }]] };
    }
    const body = Buffer.from(JSON.stringify(req.body === undefined ? null : req.body), 'utf8');
    if (body.length > limit) {
        return { refuse: [413, 'payload_too_large', `The body is larger than ${limit} bytes.`, [{ max_bytes: limit }]] };
    }
    return { body };
}

/** The SillyTavern user handle of the request's session ('default-user' without accounts). */
function handleOf(req) {
    const handle = req.user?.profile?.handle;
    return typeof handle === 'string' && HANDLE.test(handle) ? handle : null;
}

/**
 * The proxy as a request handler; `target()` gives {url, token, limits} of a running sidecar, or
 * null with `why()` saying what is wrong.
 * @param {{target: () => ({port: number, token: string, limits: object} | null), why: () => string}} sidecar
 */
function makeProxy(sidecar) {
    return function proxy(req, res) {
        const path = req.url;  // '/v1/…?query', the plugin's mount point already taken off
        const handle = handleOf(req);
        if (!handle) return sendError(res, 401, 'no_session', 'No SillyTavern user session: log in to SillyTavern first.');
        const to = sidecar.target();
        if (!to) return sendError(res, 503, 'sidecar_unavailable', `Chronicler's sidecar is not running: ${sidecar.why()}`);
        const checked = bodyOf(req, path.split('?')[0], to.limits ?? DEFAULT_LIMITS);
        if (checked.refuse) return sendError(res, ...checked.refuse);
        const headers = { 'Authorization': `Bearer ${to.token}`, 'X-Chronicler-User': handle, 'Accept': 'application/json' };
        if (checked.body) {
            headers['Content-Type'] = 'application/json';
            headers['Content-Length'] = checked.body.length;
        }
        const upstream = http.request({ host: '127.0.0.1', port: to.port, method: req.method, path, headers, agent: AGENT }, answer => {
            const out = { 'Content-Type': answer.headers['content-type'] ?? 'application/json', 'Cache-Control': 'no-store',
                'X-Content-Type-Options': 'nosniff' };
            if (answer.headers['content-length']) out['Content-Length'] = answer.headers['content-length'];
            if (answer.headers['content-disposition']) out['Content-Disposition'] = answer.headers['content-disposition'];
            // The sidecar's own time (the page tells it from the path's: bench/extension_overhead.py).
            if (answer.headers['server-timing']) out['Server-Timing'] = answer.headers['server-timing'];
            res.writeHead(answer.statusCode ?? 502, out);
            answer.pipe(res);
        });
        upstream.on('error', error => {
            if (!res.headersSent) sendError(res, 503, 'sidecar_unavailable', `Chronicler's sidecar did not answer: ${error.message}`);
            else res.destroy();
        });
        res.on('close', () => { if (!res.writableFinished) upstream.destroy(); });
        upstream.end(checked.body ?? undefined);
    };
}

module.exports = { makeProxy, sendError, depthOf, limitFor, bodyOf, handleOf, DEFAULT_LIMITS };
