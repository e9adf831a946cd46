// The plugin's pure parts: body depth, the body limit per route, the config file's checks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { depthOf, limitFor, bodyOf, makeProxy, handleOf, DEFAULT_LIMITS } = require('../../st_plugin/src/proxy.js');
const { readConfig } = require('../../st_plugin/src/config.js');
const pkg = require('../../st_plugin/package.json');

test('depth counts nesting like the sidecar does', () => {
    assert.equal(depthOf('text', 32), 0);
    assert.equal(depthOf({}, 32), 1);
    assert.equal(depthOf({ a: [1, { b: [] }] }, 32), 4);
    let deep = null;
    for (let i = 0; i < 100000; i++) deep = [deep];
    assert.ok(depthOf(deep, 32) > 32);  // no stack overflow, and it stops early
});

test('the body limit follows the route, as the sidecar picks it', () => {
    assert.equal(limitFor('POST', '/v1/import', DEFAULT_LIMITS), DEFAULT_LIMITS.max_store_import_bytes);
    assert.equal(limitFor('POST', '/v1/import/', DEFAULT_LIMITS), DEFAULT_LIMITS.max_store_import_bytes);
    assert.equal(DEFAULT_LIMITS.max_store_import_bytes, 512 * 1024 * 1024);
    assert.equal(limitFor('POST', '/v1/lore/import', DEFAULT_LIMITS), DEFAULT_LIMITS.max_import_bytes);
    assert.equal(limitFor('POST', '/v1/characters/import', DEFAULT_LIMITS), DEFAULT_LIMITS.max_import_bytes);
    const older = { ...DEFAULT_LIMITS, max_store_import_bytes: undefined };  // a sidecar before the setting
    assert.equal(limitFor('POST', '/v1/import', older), DEFAULT_LIMITS.max_import_bytes);
    assert.equal(limitFor('POST', '/v1/chats/c%201/messages', DEFAULT_LIMITS), DEFAULT_LIMITS.max_messages_body_bytes);
    assert.equal(limitFor('PUT', '/v1/chats/c1/messages', DEFAULT_LIMITS), DEFAULT_LIMITS.max_body_bytes);
    assert.equal(limitFor('POST', '/v1/memories', DEFAULT_LIMITS), DEFAULT_LIMITS.max_body_bytes);
});

/** A request as SillyTavern hands it over: its JSON body parsed, its length declared. */
function jsonRequest(path, body) {
    const raw = JSON.stringify(body);
    return { method: 'POST', url: path, body, user: { profile: { handle: 'alice' } },
        headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(raw)) } };
}

test('a whole-store import is held to max_store_import_bytes, a card to max_import_bytes', () => {
    const limits = { ...DEFAULT_LIMITS, max_import_bytes: 2000, max_store_import_bytes: 5000 };
    const doc = { document: { format: 'chronicler-store', rows: 'x'.repeat(3000) } };
    assert.ok(bodyOf(jsonRequest('/v1/import', doc), '/v1/import', limits).body);  // over a card's limit, under the store's
    const card = bodyOf(jsonRequest('/v1/lore/import', doc), '/v1/lore/import', limits);
    assert.deepEqual(card.refuse.slice(0, 2), [413, 'payload_too_large']);
    const big = { document: { rows: 'x'.repeat(6000) } };
    const refused = bodyOf(jsonRequest('/v1/import', big), '/v1/import', limits);
    assert.deepEqual(refused.refuse.slice(0, 2), [413, 'payload_too_large']);
    assert.deepEqual(refused.refuse[3], [{ max_bytes: 5000 }]);
    // Declared larger than it is (the length SillyTavern's parser saw): refused on the declaration too.
    const declared = { ...jsonRequest('/v1/import', doc), headers: { 'content-type': 'application/json', 'content-length': '9000' } };
    assert.deepEqual(bodyOf(declared, '/v1/import', limits).refuse[3], [{ max_bytes: 5000 }]);
});

test('the proxy answers a too large store import with 413 in the envelope, without forwarding it', async () => {
    let asked = 0;
    const limits = { ...DEFAULT_LIMITS, max_store_import_bytes: 5000 };
    // A port nothing listens on: a forwarded request would come back as 503 sidecar_unavailable.
    const proxy = makeProxy({ target: () => { asked += 1; return { port: 9, token: 't', limits }; }, why: () => '' });
    const answer = await new Promise(resolve => {
        const res = { headersSent: false, on() {}, writeHead(status, headers) { this.status = status; this.headers = headers; },
            end(body) { resolve({ status: this.status, headers: this.headers, body: JSON.parse(body) }); } };
        proxy(jsonRequest('/v1/import', { document: { rows: 'x'.repeat(6000) } }), res);
    });
    assert.equal(asked, 1);
    assert.equal(answer.status, 413);
    assert.equal(answer.headers['Content-Type'], 'application/json');
    assert.deepEqual(answer.body, { ok: false, error: { code: 'payload_too_large',
        message: 'The body has 6024 bytes; at most 5000 are accepted here.', details: [{ max_bytes: 5000 }] } });
});

test('only a SillyTavern handle names a store', () => {
    assert.equal(handleOf({ user: { profile: { handle: 'default-user' } } }), 'default-user');
    for (const bad of ['../x', 'Alice', '', 'a/b', undefined]) assert.equal(handleOf({ user: { profile: { handle: bad } } }), null);
    assert.equal(handleOf({}), null);
});

test('a missing or broken config says what to do', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'chronicler-cfg-'));
    assert.match(readConfig(dir, {}).message, /install-extension/);
    fs.writeFileSync(path.join(dir, 'plugin.config.json'), JSON.stringify({ command: 'chronicler serve', dataDir: '/x' }));
    assert.match(readConfig(dir, {}).message, /command/);
    fs.writeFileSync(path.join(dir, 'plugin.config.json'), JSON.stringify({ command: ['chronicler', 'serve'], dataDir: '/x' }));
    assert.deepEqual(readConfig(dir, {}), { command: ['chronicler', 'serve'], dataDir: '/x', logFile: path.join('/x', 'sidecar.log'), version: '' });
});

test('the plugin is CommonJS with the info SillyTavern requires', () => {
    assert.equal(pkg.type, 'commonjs');
    const plugin = require('../../st_plugin/index.js');
    for (const field of ['id', 'name', 'description']) assert.equal(typeof plugin.info[field], 'string');
    assert.equal(plugin.info.id, 'chronicler');
    assert.equal(typeof plugin.init, 'function');
    assert.equal(typeof plugin.exit, 'function');
    assert.equal(plugin.VERSION, pkg.version);
});

test('the plugin uses Node built-ins only', () => {
    const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../st_plugin');
    const files = [path.join(root, 'index.js'), ...fs.readdirSync(path.join(root, 'src')).map(f => path.join(root, 'src', f))];
    for (const file of files) {
        for (const [, name] of fs.readFileSync(file, 'utf8').matchAll(/require\('([^']+)'\)/g)) {
            assert.ok(name.startsWith('node:') || name.startsWith('./'), `${file} requires ${name}`);
        }
    }
});
