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

test('expectedMessage: the box as SillyTavern will store it: trimmed, names put in, nothing for a command or another macro', async () => {
    const { expectedMessage } = await import('../../extension/src/prefetch.js');
    const names = { user: 'Ann', char: 'Seraphina' };
    assert.equal(expectedMessage('  I bow to {{char}}.\n', names), 'I bow to Seraphina.');
    assert.equal(expectedMessage('{{USER}} waves at <BOT>, <char> waves back at <user>', names),
        'Ann waves at Seraphina, Seraphina waves back at Ann');
    assert.equal(expectedMessage('/echo hello', names), null);
    assert.equal(expectedMessage('I roll {{roll:d20}}', names), null);
    assert.equal(expectedMessage('{{setvar::door::open}} I open it', names), null);
    assert.equal(expectedMessage('<GROUP> gathers', names), null);
    assert.equal(expectedMessage('   ', names), null);
    // A name holding "$&" is put in as written (no replacement patterns).
    assert.equal(expectedMessage('hi {{user}}', { user: 'A$&B' }), 'hi A$&B');
});

test('sending: the expanded box text goes now, a pause timer still running is dropped, and the sent message is not embedded twice', () => {
    const s = setup();
    s.prefetch.deps.names = () => ({ user: 'Ann', char: 'Seraphina' });
    s.prefetch.typed('I bow to {{char}}. ');
    s.prefetch.sending('I bow to {{char}}. ');
    assert.deepEqual(sentTexts(s.sidecar), ['I bow to Seraphina.']);
    assert.ok(s.timers.every(t => t.cleared));
    // MESSAGE_SENT brings the stored text: the same, trailing whitespace aside, is not sent again.
    s.prefetch.now('I bow to Seraphina.  ');
    assert.deepEqual(sentTexts(s.sidecar), ['I bow to Seraphina.']);
    // A text SillyTavern changed on the way (a regex script) is the one the turn reads: sent.
    s.prefetch.now('I bow deeply to Seraphina.');
    assert.deepEqual(sentTexts(s.sidecar), ['I bow to Seraphina.', 'I bow deeply to Seraphina.']);
    // A slash command or a dice roll is not a message that can be told ahead: nothing goes.
    s.prefetch.sending('/continue');
    s.prefetch.sending('I roll {{roll:d20}}');
    assert.equal(sentTexts(s.sidecar).length, 2);
});

test("GENERATION_STARTED sends the box's text when the generation sends it, not for swipes, regenerates, dry runs or automatic ones", () => {
    const generations = [];
    const on = new EventHandlers({
        getContext: () => ({ chat: [] }),
        getSettings: () => DEFAULTS,
        sync: { hold() {} }, worker: { generationStarted() {} }, features: {},
        state: { stats: { handlers: { push() {} } } }, tellMissingRoute() {},
        prefetch: { sending: text => generations.push(text) },
        readInput: () => 'I open the gate.',
    });
    on.generationStarted(undefined, {}, false);
    on.generationStarted('normal', {}, false);
    on.generationStarted('continue', {}, false);
    for (const type of ['swipe', 'regenerate', 'quiet', 'impersonate']) on.generationStarted(type, {}, false);
    on.generationStarted('normal', {}, true);
    on.generationStarted('normal', { automatic_trigger: true }, false);
    assert.deepEqual(generations, ['I open the gate.', 'I open the gate.', 'I open the gate.']);

    const off = new EventHandlers({
        getContext: () => ({ chat: [] }), getSettings: () => ({ ...DEFAULTS, enabled: false }),
        sync: { hold() {} }, worker: { generationStarted() {} }, features: {},
        state: { stats: { handlers: { push() {} } } }, tellMissingRoute() {},
        prefetch: { sending: text => generations.push(text) }, readInput: () => 'x',
    });
    off.generationStarted('normal', {}, false);
    assert.equal(generations.length, 3);
});
