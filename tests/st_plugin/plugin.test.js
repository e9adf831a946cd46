// The server plugin with a real sidecar it starts itself: status, the proxy (per-user stores, the
// sidecar's envelope, limits before forwarding), the connection file, restart after a crash, exit().

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';

import { REPO, eventually, fakeRouter, pluginConfig, python, serveRouter } from './harness.js';

const require = createRequire(import.meta.url);
const PY = python();
const skip = PY ? false : 'no Python with the sidecar installed (make setup)';

let plugin, st, cfg;

const call = (method, path, { user = 'alice', body, headers = {} } = {}) => fetch(`${st.url}${path}`, {
    method,
    headers: { ...(user ? { 'x-test-session': user } : {}), ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}), ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
});

before(async () => {
    if (skip) return;
    plugin = require(`${REPO}/st_plugin/index.js`);
    cfg = pluginConfig(PY);
    const router = fakeRouter();
    await plugin.init(router, { env: cfg.env, backoffMs: [200, 400] });
    st = await serveRouter(router);
    await eventually(async () => (await (await call('GET', '/status')).json()).state === 'running', 90000);
});

after(async () => {
    if (skip) return;
    await plugin.exit();
    await st.close();
});

test('status names the state, both versions, the user and the log', { skip }, async () => {
    const status = await eventually(async () => {
        const s = await (await call('GET', '/status')).json();
        return s.sidecar_version ? s : null;
    });
    assert.equal(status.state, 'running');
    assert.equal(status.plugin_version, plugin.VERSION);
    assert.equal(status.sidecar_version, '0.1.0');
    assert.equal(status.user, 'alice');
    assert.equal(status.log_file, JSON.parse(fs.readFileSync(cfg.file, 'utf8')).logFile);
    assert.ok(!JSON.stringify(status).includes(plugin.plugin.supervisor.token), 'the token never leaves the server');
});

test('each SillyTavern user reaches their own store, through the sidecar', { skip }, async () => {
    const made = await call('POST', '/v1/memories', { body: { text: 'Alice keeps the lantern.', scope: 'global', pinned: true, actor: 'user' } });
    assert.equal(made.status, 201, await made.clone().text());
    const alice = await (await call('GET', '/v1/memories')).json();
    assert.deepEqual(alice.memories.map(m => m.text), ['Alice keeps the lantern.']);
    const bob = await (await call('GET', '/v1/memories', { user: 'bob' })).json();
    assert.deepEqual(bob.memories, []);
    // Bob cannot name Alice's store: the browser's header never reaches the sidecar.
    const sneaky = await (await call('GET', '/v1/memories', { user: 'bob', headers: { 'X-Chronicler-User': 'alice' } })).json();
    assert.deepEqual(sneaky.memories, []);
    const health = await (await call('GET', '/v1/health', { user: 'bob' })).json();
    assert.equal(health.store.user, 'bob');
    assert.ok(health.capabilities.includes('per_user_stores'));
});

test("the sidecar's error envelope and status come through", { skip }, async () => {
    const missing = await call('GET', '/v1/memories/no-such-memory');
    assert.equal(missing.status, 404);
    const body = await missing.json();
    assert.equal(body.ok, false);
    assert.equal(body.error.code, 'memory_not_found');
    const refused = await call('PATCH', '/v1/settings', { body: { port: 1 } });
    assert.equal(refused.status, 400);
    assert.equal((await refused.json()).error.details[0].field, 'port');
});

test('limits are applied before forwarding, in the same envelope', { skip }, async () => {
    let deep = 'null';
    for (let i = 0; i < 40; i++) deep = `[${deep}]`;
    const tooDeep = await call('POST', '/v1/search', { body: `{"query": ${deep}}` });
    assert.equal(tooDeep.status, 400);
    assert.equal((await tooDeep.json()).error.code, 'too_deep');
    const big = await call('POST', '/v1/memories', { body: { text: 'x'.repeat(1100000), scope: 'global', actor: 'user' } });
    assert.equal(big.status, 413);
    assert.equal((await big.json()).error.code, 'payload_too_large');
    const empty = await call('POST', '/v1/memories', { headers: { 'Content-Type': 'text/plain' } });
    assert.equal(empty.status, 400);  // no body at all: forwarded without one, and the sidecar's schema refuses it
    assert.equal((await empty.json()).error.code, 'invalid_request');
    const plain = await fetch(`${st.url}/v1/memories`, { method: 'POST', headers: { 'x-test-session': 'alice', 'Content-Type': 'text/plain' }, body: 'hello' });
    assert.equal(plain.status, 415);
    assert.equal((await plain.json()).error.code, 'unsupported_media_type');
});

test("the sidecar's own time (Server-Timing) comes through the proxy", { skip }, async () => {
    const answer = await call('GET', '/v1/health');
    assert.equal(answer.status, 200);
    assert.match(answer.headers.get('server-timing') ?? '', /^app;dur=[0-9.]+$/);
});

test("a store moves without its vectors through the proxy, under the sidecar's store import limit", { skip }, async () => {
    const limits = await eventually(async () => plugin.plugin.sidecar?.limits ?? null);
    assert.equal(limits.max_store_import_bytes, 512 * 1024 * 1024);  // read from the sidecar's health
    const made = await call('POST', '/v1/memories', { user: 'dora', body: { text: 'Dora keeps the map.', scope: 'global', pinned: true, actor: 'user' } });
    assert.equal(made.status, 201);
    const exported = await call('GET', '/v1/export?vectors=false', { user: 'dora' });
    assert.equal(exported.status, 200);
    assert.match(exported.headers.get('content-disposition'), /no-vectors/);
    const document = await exported.json();
    assert.equal(document.vectors, false);
    assert.deepEqual(document.tables.docs_vec.rows, []);
    const imported = await call('POST', '/v1/import', { user: 'erin', body: { document } });
    assert.equal(imported.status, 200, await imported.clone().text());
    assert.equal((await imported.json()).vectors_pending, 1);
    const memories = await (await call('GET', '/v1/memories', { user: 'erin' })).json();
    assert.deepEqual(memories.memories.map(m => m.text), ['Dora keeps the map.']);
});

test('a request without a session is refused', { skip }, async () => {
    const response = await call('GET', '/v1/memories', { user: null });
    assert.equal(response.status, 401);
    assert.equal((await response.json()).error.code, 'no_session');
});

test('the connection file is for this user only and holds a working port and token', { skip }, async () => {
    const file = `${cfg.dataDir}/sidecar.json`;
    assert.equal(fs.statSync(file).mode & 0o777, 0o600);
    const where = JSON.parse(fs.readFileSync(file, 'utf8'));
    const answer = await fetch(`http://127.0.0.1:${where.port}/v1/memories`, {
        headers: { Authorization: `Bearer ${where.token}`, 'X-Chronicler-User': 'alice' } });
    assert.equal(answer.status, 200);
});

test('a killed sidecar is restarted and its store is back', { skip }, async () => {
    const before = plugin.plugin.supervisor.child.pid;
    process.kill(before, 'SIGKILL');
    const down = await call('GET', '/v1/memories');
    assert.ok([200, 503].includes(down.status));
    if (down.status === 503) assert.equal((await down.json()).error.code, 'sidecar_unavailable');
    await eventually(async () => {
        const s = await (await call('GET', '/status')).json();
        return s.state === 'running' && s.pid !== before;
    }, 60000);
    const status = await (await call('GET', '/status')).json();
    assert.ok(status.restarts >= 1 && /exited/.test(status.last_error));
    const alice = await (await call('GET', '/v1/memories')).json();
    assert.deepEqual(alice.memories.map(m => m.text), ['Alice keeps the lantern.']);
});

test('exit() stops the sidecar and removes the connection file', { skip }, async () => {
    const pid = plugin.plugin.supervisor.child.pid;
    await plugin.exit();
    assert.throws(() => process.kill(pid, 0));
    assert.ok(!fs.existsSync(`${cfg.dataDir}/sidecar.json`));
    const after = await call('GET', '/v1/memories');
    assert.equal(after.status, 503);
    assert.equal((await after.json()).error.code, 'sidecar_unavailable');
});
