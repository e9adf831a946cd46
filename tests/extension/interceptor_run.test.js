// The interceptor as SillyTavern runs it (extension/src/interceptor.js createInterceptor): fail open,
// a missing context route, the bounded wait for syncs, injection and trimming.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { SidecarError } from '../../extension/src/client.js';
import { RingBuffer, createInterceptor } from '../../extension/src/interceptor.js';
import { TightBudgetNotice } from '../../extension/src/reserve.js';
import { ID_KEY } from '../../extension/src/sync/index.js';

function msg(id, user = false) {
    return { name: user ? 'User' : 'Seraphina', is_user: user, mes: `text ${id}`, extra: { [ID_KEY]: id } };
}

function setup({ answer, error, known = {}, idleMs = 0, settings = {} } = {}) {
    const prompts = [];
    const failures = [];
    const calls = [];
    const noted = {};
    const stored = [msg('a', true), msg('b'), msg('c', true)];
    const ctx = {
        chat: stored,
        characters: [{ avatar: 'Seraphina.png' }],
        characterId: 0,
        getCurrentChatId: () => 'chat',
        setExtensionPrompt: (...args) => prompts.push(args),
        uuidv4: () => 'turn-1',
    };
    const waits = [];
    const deps = {
        getContext: () => ctx,
        getSettings: () => ({ enabled: true, contextTimeoutMs: 1500, syncWaitMs: 750, injection: {}, ...settings }),
        getClient: () => ({
            context: async (body, options) => {
                calls.push([body, options]);
                if (error) throw error;
                return answer;
            },
        }),
        sync: { rollback: () => {}, settled: async (_chat, ms) => { waits.push(ms); await new Promise(r => setTimeout(r, Math.min(ms, idleMs))); } },
        turns: { current: null },
        injected: { keys: new Set() },
        notifyFailure: (e) => failures.push(e),
        notifySuccess: () => {},
        stats: { timings: new RingBuffer(10), lastReport: null, lastError: null, lastTrimmed: 0 },
        features: { known, note: (name, value) => { noted[name] = value; } },
    };
    return { run: createInterceptor(deps), ctx, prompts, failures, calls, noted, waits, deps, stored };
}

test('rv2/dc2: the blocks are injected and the request\'s copy of the chat is cut to the live window', async () => {
    const s = setup({ answer: { blocks: [{ section: 'pinned_memories', text: 'Pinned {{char}}', position: 'in_prompt', depth: 0, role: 'system' }], live_message_ids: ['b', 'c'], report: { ok: 1 } } });
    const request = s.stored.map(m => ({ ...m }));
    await s.run(request, 4000, () => {}, 'normal');
    assert.deepEqual(request.map(m => m.extra[ID_KEY]), ['b', 'c']);
    assert.equal(s.stored.length, 3, 'the stored chat keeps every message');
    assert.equal(s.prompts.length, 1);
    assert.equal(s.prompts[0][0], 'chronicler_00_pinned_memories');
    assert.equal(s.prompts[0][1].replace(/\u2060/g, ''), 'Pinned {{char}}');
    assert.equal(s.deps.turns.current.id, 'turn-1');
    assert.equal(s.deps.stats.timings.items.length, 1);
});

test('dc2: the wait for pending syncs is bounded so the context call keeps its share of the limit', async () => {
    const s = setup({ answer: { blocks: [], live_message_ids: [] }, idleMs: 50, settings: { syncWaitMs: 40 } });
    await s.run([...s.stored], 4000, () => {}, 'normal');
    assert.deepEqual(s.waits, [40]);
    assert.ok(s.calls[0][1].timeoutMs >= 1500 - 40 - 30, `context call got ${s.calls[0][1].timeoutMs} ms`);
});

test('dc2: fail open — an error leaves the chat untouched, clears our slots and reports once to the notifier', async () => {
    const s = setup({ error: new SidecarError({ code: 'timeout', message: 'slow' }) });
    s.deps.injected.keys = new Set(['chronicler_00_x']);
    const request = s.stored.map(m => ({ ...m }));
    await s.run(request, 4000, () => {}, 'normal');
    assert.equal(request.length, 3);
    assert.deepEqual(s.prompts.map(p => [p[0], p[1]]), [['chronicler_00_x', '']]);
    assert.equal(s.failures.length, 1);
    assert.deepEqual(s.noted, {});
});

test('dc2: a sidecar without the context route is noted and then not asked again', async () => {
    const s = setup({ error: new SidecarError({ status: 404, code: 'not_found', message: 'Not Found' }) });
    await s.run([...s.stored], 4000, () => {}, 'normal');
    assert.deepEqual(s.noted, { context: false });
    const t = setup({ known: { context: false } });
    await t.run([...t.stored], 4000, () => {}, 'normal');
    assert.deepEqual(t.calls, [], 'no request');
    assert.deepEqual(t.failures, [], 'no toast per turn');
    assert.equal(t.deps.turns.current.id, 'turn-1', 'the turn is still numbered (tools and rollback need it)');
    assert.equal(t.deps.stats.timings.items.length, 1);
});

test('dc2: quiet generations and a disabled extension are left alone', async () => {
    const s = setup({ answer: { blocks: [] } });
    await s.run([...s.stored], 4000, () => {}, 'quiet');
    const t = setup({ answer: { blocks: [] }, settings: { enabled: false } });
    await t.run([...t.stored], 4000, () => {}, 'normal');
    assert.deepEqual([...s.calls, ...t.calls], []);
    assert.equal(s.deps.turns.current, null);
});

test('qs1: the sidecar is asked for the context size minus SillyTavern\'s own standing prompt and the overhead', async () => {
    const s = setup({ answer: { blocks: [], live_message_ids: [] }, settings: { promptOverheadTokens: 100 } });
    s.deps.standingTokens = async ctx => (ctx === s.ctx ? 900 : 0);
    await s.run([...s.stored], 4000, () => {}, 'normal');
    assert.equal(s.calls[0][0].context_tokens, 3000);
    delete s.deps.standingTokens; // an interceptor built without a counter asks for all of it but the overhead
    await s.run([...s.stored], 4000, () => {}, 'normal');
    assert.equal(s.calls[1][0].context_tokens, 3900);
});

test('qs1: when SillyTavern\'s own prompt leaves less than the minimum, the user is warned once and the call still goes', async () => {
    const s = setup({ answer: { blocks: [], live_message_ids: [] }, settings: { promptOverheadTokens: 100, minMemoryBudgetTokens: 400 } });
    const told = [];
    s.deps.standingTokens = async () => 1000;
    s.deps.tightBudget = new TightBudgetNotice();
    s.deps.notifyTightBudget = message => told.push(message);
    await s.run([...s.stored], 1300, () => {}, 'normal');
    await s.run([...s.stored], 1300, () => {}, 'normal');
    assert.equal(told.length, 1);
    assert.match(told[0], /only 200 tokens/);
    assert.deepEqual(s.calls.map(([body]) => body.context_tokens), [200, 200]);
    await s.run([...s.stored], 8000, () => {}, 'normal');
    assert.equal(told.length, 1, 'a roomy context says nothing');
});

test("each answered generation records where its time went: sync wait, standing tokens, request, context call (the sidecar's part of it), trim and inject", async () => {
    const s = setup({ answer: { blocks: [], live_message_ids: ['b', 'c'] } });
    s.deps.stats.parts = new RingBuffer(10);
    s.deps.standingTokens = async () => 100;
    s.deps.getClient = () => ({ context: async (_body, options) => { options.timing.serverMs = 3.5; return { blocks: [], live_message_ids: ['b', 'c'] }; } });
    await s.run(s.stored.map(m => ({ ...m })), 4000, () => {}, 'normal');
    const [part] = s.deps.stats.parts.items;
    assert.deepEqual(Object.keys(part).sort(), ['apply', 'context', 'request', 'server', 'standing', 'wait']);
    assert.equal(part.server, 3.5);
    for (const key of ['apply', 'context', 'request', 'standing', 'wait']) assert.ok(part[key] >= 0, key);
    // A sidecar (or proxy) that does not say its own time: no `server` part rather than a guess.
    s.deps.getClient = () => ({ context: async () => ({ blocks: [] }) });
    await s.run(s.stored.map(m => ({ ...m })), 4000, () => {}, 'normal');
    assert.equal('server' in s.deps.stats.parts.items[1], false);
    // A failed call records no part (its time is in `timings`).
    s.deps.getClient = () => ({ context: async () => { throw new SidecarError({ code: 'timeout', message: 'slow' }); } });
    await s.run(s.stored.map(m => ({ ...m })), 4000, () => {}, 'normal');
    assert.equal(s.deps.stats.parts.items.length, 2);
});
