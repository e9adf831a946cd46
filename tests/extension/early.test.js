// The turn's context asked for as its generation starts (extension/src/early.js) and taken by the
// interceptor when its request is the same: one dry run, then the recording call not awaited.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { EarlyContext } from '../../extension/src/early.js';
import { RingBuffer, createInterceptor } from '../../extension/src/interceptor.js';
import { ID_KEY } from '../../extension/src/sync/index.js';

const TEXT = 'I walk further along the forest path.';

function msg(id, user = false, mes = `text ${id}`) {
    return { name: user ? 'User' : 'Seraphina', is_user: user, mes, extra: { [ID_KEY]: id } };
}

/** EarlyContext and the interceptor over one fake SillyTavern context and one fake sidecar. */
function setup({ settings = {}, features = ['earlyContext'], group = false, failDry = false } = {}) {
    const calls = [];
    const released = [];
    const answers = { dry: { blocks: [{ section: 'pinned_memories', text: 'early', position: 'in_prompt', depth: 0, role: 'system' }], live_message_ids: [] } };
    let resolveRecording;
    let dryKey = null;
    const ctx = {
        chat: [msg('a', true), msg('b')],
        characters: [{ avatar: 'Seraphina.png' }],
        characterId: 0,
        ...(group ? { groupId: 'g', groups: [{ id: 'g', members: ['Seraphina.png'] }] } : {}),
        getCurrentChatId: () => 'chat',
        setExtensionPrompt: () => {},
        uuidv4: () => 'turn-1',
        name1: 'User', name2: 'Seraphina',
    };
    const all = { enabled: true, earlyContext: true, contextTimeoutMs: 1500, syncWaitMs: 750, injection: {}, promptOverheadTokens: 0, ...settings };
    const client = {
        context: (body, options) => {
            calls.push({ body, options });
            if (body.dry_run) {
                const { dry_run: _dry, ...plain } = body;
                dryKey = JSON.stringify(plain);
                return failDry ? Promise.reject(new Error('down')) : Promise.resolve(answers.dry);
            }
            if (JSON.stringify(body) === dryKey && !failDry) { // the recording call: held open
                return new Promise(resolve => { resolveRecording = () => resolve({ blocks: [], live_message_ids: [] }); });
            }
            return Promise.resolve({ blocks: [], live_message_ids: [], asked: 'here' });
        },
    };
    const sync = {
        rollback: () => {}, settled: async () => {}, idle: async () => {},
        release: () => released.push(calls.length),
    };
    const early = new EarlyContext({
        getContext: () => ctx, getSettings: () => all, getClient: () => client,
        features: { has: name => features.includes(name) }, sync, standingTokens: async () => 100,
        names: () => ({ user: 'User', char: 'Seraphina' }),
    });
    const stats = { timings: new RingBuffer(10), parts: new RingBuffer(10), lastReport: null, lastError: null, lastTrimmed: 0 };
    const run = createInterceptor({
        getContext: () => ctx, getSettings: () => all, getClient: () => client, sync,
        turns: { current: null }, injected: { keys: new Set() }, notifyFailure: () => {}, notifySuccess: () => {},
        stats, standingTokens: async () => 100, early,
    });
    /** SillyTavern's flow: the generation starts, the message is stored, the interceptor runs. */
    async function generate(typed, stored = typed) {
        const started = early.start(typed);
        ctx.chat.push(msg(`u${ctx.chat.length}`, true, stored));
        await started;
        await new Promise(resolve => setTimeout(resolve, 0));
        await run(ctx.chat.map(m => ({ ...m })), 4000, () => {}, 'normal');
    }
    return { calls, released, early, stats, generate, finishRecording: () => resolveRecording?.() };
}

test('the first generation of a chat asks as before; the next is asked for early and taken', async () => {
    const s = setup();
    await s.generate('Hello there.');
    assert.equal(s.calls.length, 1, 'no prompt size known yet: no early ask');
    assert.equal(s.calls[0].body.dry_run, undefined);
    await s.generate(TEXT);
    const [dry, recording] = s.calls.slice(1);
    assert.equal(dry.body.dry_run, true);
    const { dry_run: _dry, ...plain } = dry.body;
    assert.deepEqual(recording.body, plain, 'the recording call is the same request');
    assert.equal(recording.body.last_action.text, TEXT);
    const part = s.stats.parts.items.at(-1);
    assert.equal(part.early, true);
    assert.equal(part.server, undefined, 'the sidecar time of an early answer was spent before');
    assert.equal(s.early.taken, 1);
    // The held upserts wait for the recording call, as they wait for any context call.
    assert.deepEqual(s.released, [1]);
    s.finishRecording();
    await new Promise(resolve => setTimeout(resolve, 0));
    assert.deepEqual(s.released, [1, 3]);
});

test('a message stored otherwise than typed, a group chat or a sidecar without dry runs: asked as before', async () => {
    for (const [options, typed, stored] of [
        [{}, TEXT, `${TEXT} (a regex script added this)`],
        [{ group: true }, TEXT, TEXT],
        [{ features: [] }, TEXT, TEXT],
        [{ settings: { earlyContext: false } }, TEXT, TEXT],
        [{}, 'Roll {{roll:d20}}', 'Roll 17'],
    ]) {
        const s = setup(options);
        await s.generate('Hello there.');
        await s.generate(typed, stored);
        const asked = s.calls.slice(1).filter(c => !c.body.dry_run);
        assert.equal(s.early.taken, 0, JSON.stringify(options));
        assert.equal(asked.length, 1, 'the interceptor asked and waited, once');
        assert.equal(asked[0].body.last_action.text, stored, 'for the stored message');
        assert.equal(s.stats.parts.items.at(-1).early, undefined);
    }
});

test('an early ask that failed is asked again by the interceptor, within its time', async () => {
    const s = setup({ failDry: true });
    await s.generate('Hello there.');
    await s.generate(TEXT);
    const asked = s.calls.slice(1);
    assert.deepEqual(asked.map(c => Boolean(c.body.dry_run)), [true, false]);
    assert.equal(s.stats.parts.items.at(-1).early, undefined);
    assert.equal(s.stats.lastError, null);
});

test('a newer start, or the interceptor coming first, stops an ask still being prepared', async () => {
    const s = setup();
    await s.generate('Hello there.');
    let open;
    const gate = new Promise(resolve => { open = resolve; });
    s.early.deps.sync.idle = () => gate;
    const first = s.early.start('first text');
    const second = s.early.start('second text');
    assert.equal(s.early.take({}), null, 'nothing sent yet: nothing to take');
    open();
    await Promise.all([first, second]);
    assert.equal(s.calls.filter(c => c.body.dry_run).length, 0);
    assert.equal(s.early.asked, 0);
});
