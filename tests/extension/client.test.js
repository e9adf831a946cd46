// The sidecar client's errors: the envelope, timeouts, unreachable hosts (extension/src/client.js).
// Timeouts and refusals use real sockets: a server that never answers, a port nobody listens on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

import { CLIENT_CODES, SidecarClient, SidecarError, allowNotFound, clientFor, errorFromResponse, madeAhead, pathId, serverMs } from '../../extension/src/client.js';

test('dc2: the error envelope becomes a typed error with code, message and details', () => {
    const err = errorFromResponse(403, JSON.stringify({ ok: false, error: { code: 'pinned_memory', message: 'Only a person may edit a pinned memory.', details: [{ id: 'm1' }] } }));
    assert.ok(err instanceof SidecarError);
    assert.equal(err.status, 403);
    assert.equal(err.code, 'pinned_memory');
    assert.equal(err.message, 'Only a person may edit a pinned memory.');
    assert.deepEqual(err.details, [{ id: 'm1' }]);
    assert.equal(err.isOutage, false);
});

test('dc2: an answer without an envelope still gives a usable error; 5xx counts as an outage', () => {
    const err = errorFromResponse(502, '<html>Bad gateway</html>');
    assert.equal(err.code, 'http_502');
    assert.equal(err.isOutage, true);
});

test('dc2: ids are percent-encoded for paths (SillyTavern chat ids hold spaces and @)', () => {
    assert.equal(pathId('Seraphina - 2026-11-29@16h52m03s'), 'Seraphina%20-%202026-11-29%4016h52m03s');
    assert.equal(pathId('a/b?c'), 'a%2Fb%3Fc');
});

async function listen(server) {
    await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
    return server.address().port;
}

test("serverMs reads the sidecar's own time from Server-Timing; a call given `timing` records it", async () => {
    assert.equal(serverMs('app;dur=12.5'), 12.5);
    assert.equal(serverMs('db;dur=3, app;desc="sidecar";dur=7'), 7);
    assert.equal(serverMs('cache;dur=2'), undefined);
    assert.equal(serverMs(null), undefined);
    const answer = (headers) => async () => new Response('{"ok":true}', { status: 200, headers });
    const timing = {};
    const client = new SidecarClient({ baseUrl: 'http://sidecar', fetchImpl: answer({ 'Server-Timing': 'app;dur=4.2' }) });
    assert.deepEqual(await client.context({}, { timing }), { ok: true });
    assert.equal(timing.serverMs, 4.2);
    const without = {};
    await new SidecarClient({ baseUrl: 'http://sidecar', fetchImpl: answer({}) }).context({}, { timing: without });
    assert.equal(without.serverMs, undefined);
    assert.equal(without.ahead, false);
});

test('madeAhead tells a context assembled ahead by its Server-Timing mark', async () => {
    assert.equal(madeAhead('app;dur=1.4, ahead'), true);
    assert.equal(madeAhead('ahead;desc="x", app;dur=2'), true);
    assert.equal(madeAhead('app;dur=12.5'), false);
    assert.equal(madeAhead('app;dur=3, aheadish'), false);
    assert.equal(madeAhead(null), false);
    const timing = {};
    const fetchImpl = async () => new Response('{}', { status: 200, headers: { 'Server-Timing': 'app;dur=1.1, ahead' } });
    await new SidecarClient({ baseUrl: 'http://sidecar', fetchImpl }).context({}, { timing });
    assert.equal(timing.serverMs, 1.1);
    assert.equal(timing.ahead, true);
    assert.ok(timing.parseMs >= 0); // the main thread's time reading the answer
});

test('dc2: a sidecar that does not answer in time fails with code timeout', async () => {
    const sockets = [];
    const server = net.createServer(socket => sockets.push(socket)); // accepts, never answers
    const port = await listen(server);
    try {
        const client = new SidecarClient({ baseUrl: `http://127.0.0.1:${port}`, token: 't', timeoutMs: 150 });
        const started = Date.now();
        await assert.rejects(client.health(), (err) => err instanceof SidecarError && err.code === CLIENT_CODES.timeout && err.isOutage);
        assert.ok(Date.now() - started < 2000);
    } finally {
        sockets.forEach(s => s.destroy());
        server.close();
    }
});

test('dc2: a sidecar that is not running fails with code unreachable', async () => {
    const server = net.createServer();
    const port = await listen(server);
    await new Promise(resolve => server.close(resolve)); // the port is free again: nobody listens
    const client = new SidecarClient({ baseUrl: `http://127.0.0.1:${port}`, timeoutMs: 2000 });
    await assert.rejects(client.context({}), (err) => err.code === CLIENT_CODES.unreachable && err.status === 0);
});

test('dc2: allowNotFound takes a 404 as done and lets every other failure through', async () => {
    const notFound = new SidecarError({ status: 404, code: 'message_not_found', message: 'no' });
    assert.equal(await allowNotFound(Promise.reject(notFound)), undefined);
    assert.deepEqual(await allowNotFound(Promise.resolve({ ok: 1 })), { ok: 1 });
    await assert.rejects(allowNotFound(Promise.reject(new SidecarError({ status: 500, code: 'internal', message: 'boom' }))), /boom/);
});

test('dc2: clientFor builds the client the settings name, with the time limit asked for', () => {
    const settings = { sidecarUrl: 'http://127.0.0.1:7711/', token: 'tok', requestTimeoutMs: 10000, contextTimeoutMs: 1500 };
    const plain = clientFor(settings);
    assert.deepEqual([plain.baseUrl, plain.token, plain.timeoutMs], ['http://127.0.0.1:7711', 'tok', 10000]);
    assert.equal(clientFor(settings, 'contextTimeoutMs').timeoutMs, 1500);
});
