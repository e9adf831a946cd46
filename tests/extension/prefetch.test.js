// The next turn's query embedding started ahead (extension/src/prefetch.js): a pause in typing or
// a sent message sends the text once, never for an empty box, never to a sidecar without the
// route, and nothing waits for it or fails because of it.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { SidecarError } from '../../extension/src/client.js';
import { EventHandlers } from '../../extension/src/events.js';
import { QueryPrefetch } from '../../extension/src/prefetch.js';
import { DEFAULTS } from '../../extension/src/settings.js';
import { FakeSidecar } from './fake_sidecar.js';

/** A prefetcher on a fake sidecar, with timers the test fires by hand. */
function setup({ known = { prefetch: true }, settings = {}, missing = [] } = {}) {
    const sidecar = new FakeSidecar({ missing });
    const timers = [];
    const features = { known: { ...known }, has(name) { return this.known[name] === true; }, note(name, v) { this.known[name] = v; } };
    const prefetch = new QueryPrefetch({
        getClient: () => sidecar, getSettings: () => ({ ...DEFAULTS, ...settings }), features,
        chatId: () => 'Seraphina - 1',
        setTimer: (fn, ms) => { const t = { fn, ms, cleared: false }; timers.push(t); return t; },
        clearTimer: t => { t.cleared = true; },
    });
    const fire = () => timers.filter(t => !t.cleared).forEach(t => { t.cleared = true; t.fn(); });
    return { sidecar, prefetch, timers, fire, features };
}

const sentTexts = sidecar => sidecar.calls.filter(c => c[0] === 'prefetchContext').map(c => c[1].text);

test('a pause in typing sends the text once, after prefetchPauseMs; each keystroke restarts the wait', () => {
    const s = setup();
    s.prefetch.typed('I open');
    s.prefetch.typed('I open the door');
    assert.deepEqual(sentTexts(s.sidecar), []);
    assert.equal(s.timers.filter(t => !t.cleared).length, 1);
    assert.equal(s.timers.at(-1).ms, DEFAULTS.prefetchPauseMs);
    s.fire();
    assert.deepEqual(sentTexts(s.sidecar), ['I open the door']);
    assert.deepEqual(s.sidecar.calls[0][1], { chat_id: 'Seraphina - 1', text: 'I open the door' });
    // Sending the same text afterwards does not embed it twice.
    s.prefetch.now('I open the door');
    assert.equal(sentTexts(s.sidecar).length, 1);
    s.prefetch.now('I open the door slowly');
    assert.deepEqual(sentTexts(s.sidecar), ['I open the door', 'I open the door slowly']);
});

test('an empty box, the setting off, or Chronicler off sends nothing', () => {
    for (const settings of [{ prefetchQuery: false }, { enabled: false }, {}]) {
        const s = setup({ settings });
        s.prefetch.typed(settings.prefetchQuery === false || settings.enabled === false ? 'words' : '   ');
        s.prefetch.now(settings.prefetchQuery === false || settings.enabled === false ? 'words' : '');
        s.fire();
        assert.deepEqual(sentTexts(s.sidecar), [], JSON.stringify(settings));
    }
});

test('a sidecar without the route is not asked, and one that answers 404 is not asked again', async () => {
    const older = setup({ known: { prefetch: false } });
    older.prefetch.now('hello');
    assert.deepEqual(sentTexts(older.sidecar), []);

    const s = setup({ missing: ['prefetchContext'] });
    s.prefetch.now('hello');
    await new Promise(resolve => setImmediate(resolve));
    assert.equal(s.features.known.prefetch, false);
    s.prefetch.now('hello again');
    assert.deepEqual(sentTexts(s.sidecar), ['hello']);
});

test('a failing prefetch rejects nothing and changes nothing', async () => {
    const s = setup();
    s.sidecar.failNext = new SidecarError({ status: 503, code: 'model_loading', message: 'loading' });
    assert.doesNotThrow(() => s.prefetch.now('first'));
    await new Promise(resolve => setImmediate(resolve));
    assert.equal(s.features.known.prefetch, true);
    s.prefetch.now('second');
    assert.deepEqual(sentTexts(s.sidecar), ['first', 'second']);
});

test("MESSAGE_SENT starts the player's message's embedding before the sync, not a character's", () => {
    const s = setup();
    const order = [];
    const chat = [{ is_user: false, mes: 'Welcome.' }, { is_user: true, mes: 'I bow.' }];
    const on = new EventHandlers({
        getContext: () => ({ chat, saveMetadataDebounced() {} }),
        getSettings: () => DEFAULTS,
        sync: { syncCurrentChat: (what) => { order.push(['sync', what]); return { assigned: [] }; } },
        worker: {}, features: {}, state: { stats: { handlers: { push() {} } } },
        tellMissingRoute() {}, clock: () => 0,
        prefetch: { now: text => { order.push(['prefetch', text]); s.prefetch.now(text); } },
    });
    on.messageSent(1);
    on.messageSent(0);
    assert.deepEqual(order, [['prefetch', 'I bow.'], ['sync', 'MESSAGE_SENT'], ['sync', 'MESSAGE_SENT']]);
    assert.deepEqual(sentTexts(s.sidecar), ['I bow.']);
});
