// Which optional sidecar routes exist (extension/src/features.js), and macro neutralising (macros.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { SidecarError } from '../../extension/src/client.js';
import { Features, PROBES, classifyProbe } from '../../extension/src/features.js';
import { neutraliseMacros } from '../../extension/src/macros.js';
import { blocksToPrompts } from '../../extension/src/inject.js';

const err = (status, code) => new SidecarError({ status, code, message: code });

test('dc2: a probe tells a missing route (generic 404) from a present one (400, domain 404, 2xx)', () => {
    assert.equal(classifyProbe({ ok: true }), true);
    assert.equal(classifyProbe({ error: err(400, 'invalid_request') }), true);
    assert.equal(classifyProbe({ error: err(404, 'chat_not_found') }), true);
    assert.equal(classifyProbe({ error: err(404, 'not_found') }), false);
    assert.equal(classifyProbe({ error: err(405, 'method_not_allowed') }), false);
    assert.equal(classifyProbe({ error: err(0, 'unreachable') }), undefined, 'down: ask again later');
    assert.equal(classifyProbe({ error: err(401, 'unauthorized') }), undefined, 'wrong token: ask again later');
    assert.equal(classifyProbe({ error: err(503, 'embedder_not_ready') }), undefined);
});

test('dc2: probes never change anything: invalid bodies or an id no chat has', () => {
    for (const [name, probe] of Object.entries(PROBES)) {
        if (probe.method !== 'GET') assert.deepEqual(probe.body, { __probe__: true }, name);
        else assert.match(probe.path, /__chronicler_probe__/, name);
    }
});

test('dc2: Features probes once per sidecar, keeps the answers, and asks again after an outage', async () => {
    let calls = 0;
    let down = false;
    const client = {
        baseUrl: 'http://x',
        async request(_method, path) {
            calls += 1;
            if (down) throw err(0, 'unreachable');
            if (path === '/v1/search') throw err(404, 'not_found');
            throw err(400, 'invalid_request');
        },
    };
    let now = 0;
    const features = new Features({ getClient: () => client, now: () => now, maxAgeMs: 1000 });
    await features.refresh();
    assert.equal(features.has('search'), false);
    assert.equal(features.has('jobs'), true);
    const first = calls;
    await features.refresh();
    assert.equal(calls, first, 'fresh answers are reused');
    now = 2000;
    down = true;
    await features.refresh();
    assert.equal(features.has('jobs'), false, 'unknown while down');
    down = false;
    await features.refresh();
    assert.equal(features.has('jobs'), true, 'unknown answers are asked again at once');
});

test('dc2: memory text reaches the model literally — SillyTavern\'s macros are neutralised, the text looks the same', () => {
    const raw = 'Call {{user}} "Captain"; {{{triple}}}; <USER> and <bot> stay; {single} too.';
    const safe = neutraliseMacros(raw);
    assert.equal(/\{\{/.test(safe), false);
    assert.equal(/<(USER|BOT|CHAR|GROUP|CHARIFNOTGROUP)>/i.test(safe), false);
    assert.equal(safe.replace(/\u2060/g, ''), raw);
    const [call] = blocksToPrompts([{ section: 'pinned_memories', text: 'Mara says {{char}} is kind', position: 'in_prompt' }]);
    assert.equal(call.value.replace(/\u2060/g, ''), 'Mara says {{char}} is kind');
    assert.equal(call.value.includes('{{'), false);
});
