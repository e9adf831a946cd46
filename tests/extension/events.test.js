// SillyTavern's events and what Chronicler does about them (extension/src/events.js): each
// handler against fakes of SillyTavern's context, the sync, the worker and the features, and a
// few turns end to end through the real ChatSync and a fake sidecar.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { EVENT_HANDLERS, EventHandlers, FOLLOW_SAVED_MS, NOT_A_TURN, chatIdOf, listen } from '../../extension/src/events.js';
import { RingBuffer } from '../../extension/src/interceptor.js';
import { DEFAULTS } from '../../extension/src/settings.js';
import { ChatSync, ID_KEY, TURN_KEY } from '../../extension/src/sync/index.js';
import { FakeSidecar } from './fake_sidecar.js';

const CHAT = 'Seraphina - 1';

function msg(id, { user = false, turn } = {}) {
    const extra = id ? { [ID_KEY]: id } : {};
    if (turn) extra[TURN_KEY] = turn;
    return { name: user ? 'User' : 'Seraphina', is_user: user, is_system: false, mes: `text of ${id}`, send_date: '2026-01-01T00:00:00.000Z', extra };
}

/** A ChatSync stand-in that records what it was asked. */
function fakeSync({ assigned = [] } = {}) {
    const calls = [];
    let renamed;
    return {
        calls,
        renameDone: new Promise(resolve => { renamed = resolve; }),
        syncCurrentChat: (what) => { calls.push(['sync', what]); return { assigned, done: Promise.resolve() }; },
        hold: (ms) => calls.push(['hold', ms]),
        release: () => calls.push(['release']),
        followSavedSoon: (ms) => calls.push(['followSavedSoon', ms]),
        postponeFollowSaved: () => calls.push(['postponeFollowSaved']),
        renameChat(oldId, newId) { calls.push(['renameChat', oldId, newId]); return this.renameDone; },
        finishRename: () => renamed(),
        deleteChat: (id) => calls.push(['deleteChat', id]),
        deleteCharacter: (avatar) => calls.push(['deleteCharacter', avatar]),
        renameCharacter: (oldAvatar, newAvatar, newName) => calls.push(['renameCharacter', oldAvatar, newAvatar, newName]),
    };
}

function fakeWorker() {
    const calls = [];
    return {
        calls,
        start: () => calls.push(['start']),
        stop: () => calls.push(['stop']),
        generationStarted: (...args) => calls.push(['generationStarted', ...args]),
        generationEnded: () => calls.push(['generationEnded']),
    };
}

function fakeFeatures(known = {}) {
    const calls = [];
    return {
        calls,
        known,
        has: (name) => known[name] === true,
        reset: () => calls.push(['reset']),
        refresh: async (options) => { calls.push(['refresh', options]); return known; },
    };
}

/** Handlers over fakes; `settings` and the context's fields can be changed by the test. */
function setup({ settings = {}, chat = [], known = {}, assigned = [] } = {}) {
    const prompts = [];
    const saves = [];
    const told = [];
    const drawer = [];
    const ctx = {
        chat,
        chatId: CHAT,
        characters: [{ avatar: 'Seraphina.png', name: 'Seraphina' }],
        characterId: 0,
        getCurrentChatId() { return this.chatId; },
        setExtensionPrompt: (...args) => prompts.push(args),
        saveMetadataDebounced: () => saves.push('metadata'),
    };
    const s = { ...DEFAULTS, ...settings };
    const state = {
        turns: { current: null },
        injected: { keys: new Set() },
        stats: { handlers: new RingBuffer(10) },
    };
    let now = 0;
    const deps = {
        getContext: () => ctx,
        getSettings: () => s,
        sync: fakeSync({ assigned }),
        worker: fakeWorker(),
        features: fakeFeatures(known),
        state,
        tellMissingRoute: (error) => told.push(error),
        refreshDrawer: () => drawer.push('refreshed'),
        clock: () => (now += 2),
    };
    return { on: new EventHandlers(deps), ctx, settings: s, state, deps, prompts, saves, told, drawer };
}

/** Let queued promise callbacks run. */
const tick = () => new Promise(resolve => setImmediate(resolve));

// --- wiring ------------------------------------------------------------------------------------
test('dc2: listen connects every event SillyTavern sends to its handler, and the listeners return nothing', () => {
    const listeners = new Map();
    const eventSource = { on: (type, fn) => listeners.set(type, fn) };
    const types = Object.fromEntries(EVENT_HANDLERS.map(([name]) => [name, `st_${name.toLowerCase()}`]));
    const seen = [];
    const handlers = new Proxy({}, { get: (_, method) => (...args) => { seen.push([method, ...args]); return Promise.resolve('held'); } });
    listen(eventSource, types, handlers);
    assert.equal(listeners.size, EVENT_HANDLERS.length, 'one listener per event');
    for (const [name] of EVENT_HANDLERS) {
        assert.equal(listeners.get(types[name])(1, 'normal', false), undefined, `${name} does not hold SillyTavern up`);
    }
    assert.deepEqual(seen, [
        ['chatChanged', 1, 'normal', false],
        ['messageSent', 1, 'normal', false],
        ['messageReceived', 1, 'normal', false],
        ['syncNow', 'MESSAGE_EDITED'],
        ['syncNow', 'MESSAGE_UPDATED'],
        ['messageSwiped', 1, 'normal', false],
        ['syncNow', 'MESSAGE_SWIPE_DELETED'],
        ['syncNow', 'MESSAGE_DELETED'],
        ['syncNow', 'GROUP_UPDATED'],
        ['characterDeleted', 1, 'normal', false],
        ['characterRenamed', 1, 'normal', false],
        ['chatRenamed', 1, 'normal', false],
        ['chatDeleted', 1, 'normal', false],
        ['chatDeleted', 1, 'normal', false],
        ['generationStarted', 1, 'normal', false],
        ['generationEnded', 1, 'normal', false],
        ['generationEnded', 1, 'normal', false],
    ]);
});

// --- syncing -----------------------------------------------------------------------------------
test('dc2: a chat event syncs the open chat, times the synchronous part and saves new ids', () => {
    const s = setup({ assigned: [0, 1] });
    s.on.syncNow('MESSAGE_SENT');
    assert.deepEqual(s.deps.sync.calls, [['sync', 'MESSAGE_SENT']]);
    assert.deepEqual(s.state.stats.handlers.items, [2], 'the handler\'s own time is recorded');
    assert.deepEqual(s.saves, ['metadata'], 'ids were given: the chat file must get them');
});

test('dc2: a sync that gives no new ids asks for no save; switched off, nothing is synced', () => {
    const s = setup();
    s.on.syncNow('MESSAGE_EDITED');
    assert.deepEqual(s.deps.sync.calls, [['sync', 'MESSAGE_EDITED']]);
    assert.deepEqual(s.saves, []);
    s.settings.enabled = false;
    s.on.syncNow('MESSAGE_DELETED');
    assert.equal(s.deps.sync.calls.length, 1, 'no sync while Chronicler is off');
});

test('rv10: a reply of the current turn carries the turn id; other generations and other chats do not', () => {
    const chat = [msg('u1', { user: true }), msg('r1')];
    const s = setup({ chat });
    s.state.turns.current = { id: 'turn-1', chatId: CHAT };
    s.on.messageReceived(1, 'normal');
    assert.equal(chat[1].extra[TURN_KEY], 'turn-1');
    assert.deepEqual(s.deps.sync.calls, [['sync', 'MESSAGE_RECEIVED']]);

    for (const type of NOT_A_TURN) {
        const reply = msg('r2');
        s.ctx.chat = [reply];
        s.on.messageReceived(0, type);
        assert.equal(reply.extra[TURN_KEY], undefined, `${type} is not a turn`);
    }
    const elsewhere = msg('r3');
    s.ctx.chat = [elsewhere];
    s.state.turns.current = { id: 'turn-1', chatId: 'another chat' };
    s.on.messageReceived(0, 'normal');
    assert.equal(elsewhere.extra[TURN_KEY], undefined, 'the turn belongs to another chat');
    assert.equal(s.deps.sync.calls.length, 2 + NOT_A_TURN.size, 'every reply is synced, turn or not');
});

test('dc2: a swipe waiting for its generation is not synced (the reply will be); a finished one is', () => {
    const pending = { ...msg('r1'), swipes: ['a', 'b'], swipe_id: 2 };
    const s = setup({ chat: [pending] });
    s.on.messageSwiped(0);
    assert.deepEqual(s.deps.sync.calls, []);
    pending.swipe_id = 1;
    s.on.messageSwiped(0);
    assert.deepEqual(s.deps.sync.calls, [['sync', 'MESSAGE_SWIPED']]);
});

test('dc2: a chat change clears our prompts and the turn, syncs the new chat and checks the sidecar', async () => {
    const s = setup();
    s.state.injected.keys = new Set(['chronicler_00_pinned_memories', 'chronicler_01_history']);
    s.state.turns.current = { id: 'turn-1', chatId: 'old chat' };
    s.on.chatChanged();
    assert.deepEqual(s.prompts.map(p => [p[0], p[1]]), [['chronicler_00_pinned_memories', ''], ['chronicler_01_history', '']]);
    assert.equal(s.state.injected.keys.size, 0);
    assert.equal(s.state.turns.current, null);
    assert.deepEqual(s.deps.sync.calls, [['sync', 'CHAT_CHANGED']]);
    assert.deepEqual(s.deps.features.calls, [['refresh', { force: false }]]);
    await tick();
    assert.deepEqual(s.drawer, ['refreshed'], 'the drawer hears what the sidecar offers');
});

// --- generations -------------------------------------------------------------------------------
test('dc2: a real generation holds the new message\'s upsert for the context call; dry runs and quiet ones do not', () => {
    const s = setup({ settings: { contextTimeoutMs: 1500 } });
    s.on.generationStarted('normal', { a: 1 }, false);
    assert.deepEqual(s.deps.sync.calls, [['hold', 2000], ['postponeFollowSaved']], 'the time limit plus half a second');
    assert.deepEqual(s.deps.worker.calls, [['generationStarted', 'normal', { a: 1 }, false]]);
    s.on.generationStarted('normal', {}, true);
    s.on.generationStarted('quiet', {}, false);
    s.settings.enabled = false;
    s.on.generationStarted('swipe', {}, false);
    assert.equal(s.deps.sync.calls.length, 2, 'no other hold');
    assert.equal(s.deps.worker.calls.length, 4, 'the worker hears of every generation');
});

test('dc2: a generation that ended or stopped lets held upserts go, tells the worker, then follows the saved chat', () => {
    const s = setup();
    s.on.generationEnded();
    assert.deepEqual(s.deps.sync.calls, [['release'], ['followSavedSoon', FOLLOW_SAVED_MS]]);
    assert.deepEqual(s.deps.worker.calls, [['generationEnded']]);
    s.settings.enabled = false;
    s.on.generationEnded();
    assert.deepEqual(s.deps.sync.calls.at(-1), ['release'], 'memory off: the sidecar is not asked');
});

// --- chats and characters ----------------------------------------------------------------------
test('dc2: a renamed chat moves in the sidecar (ids without .jsonl), then the chat is synced', async () => {
    const s = setup();
    s.on.chatRenamed({ oldFileName: 'Seraphina - 1.jsonl', newFileName: 'Journey.jsonl' });
    assert.deepEqual(s.deps.sync.calls, [['renameChat', 'Seraphina - 1', 'Journey']]);
    await tick();
    assert.equal(s.deps.sync.calls.length, 1, 'the sync waits for the move');
    s.deps.sync.finishRename();
    await tick();
    assert.deepEqual(s.deps.sync.calls.at(-1), ['sync', 'CHAT_RENAMED']);
});

test('dc2: deleted chats and cards are deleted in the sidecar; renamed cards move with their new name', () => {
    const s = setup();
    s.on.chatDeleted('Seraphina - 1.jsonl');
    s.on.chatDeleted('group chat');
    s.on.characterDeleted({ id: 0, character: { avatar: 'Luke.png' } });
    s.on.characterRenamed('Seraphina.png', 'Sera.png');
    const [, oldAvatar, newAvatar, newName] = s.deps.sync.calls.at(-1);
    assert.deepEqual(s.deps.sync.calls.slice(0, 3), [['deleteChat', 'Seraphina - 1'], ['deleteChat', 'group chat'], ['deleteCharacter', 'Luke.png']]);
    assert.deepEqual([oldAvatar, newAvatar], ['Seraphina.png', 'Sera.png']);
    assert.equal(newName(), undefined, 'SillyTavern has not reloaded its cards yet');
    s.ctx.characters = [{ avatar: 'Sera.png', name: 'Sera' }];
    assert.equal(newName(), 'Sera', 'the name is read when the move runs');
});

test('dc2: switched off, chat and card events reach nothing', () => {
    const s = setup({ settings: { enabled: false } });
    s.on.chatRenamed({ oldFileName: 'a.jsonl', newFileName: 'b.jsonl' });
    s.on.chatDeleted('a');
    s.on.characterDeleted({ character: { avatar: 'Luke.png' } });
    s.on.characterRenamed('a.png', 'b.png');
    s.on.chatChanged();
    assert.deepEqual(s.deps.sync.calls, []);
    assert.deepEqual(s.deps.features.calls, [], 'no probe while off');
});

test('dc2: chat ids are file names without .jsonl', () => {
    assert.equal(chatIdOf('Seraphina - 2026-1-1 @12h 00m.JSONL'), 'Seraphina - 2026-1-1 @12h 00m');
    assert.equal(chatIdOf('group chat'), 'group chat');
    assert.equal(chatIdOf(undefined), '');
});

// --- features, worker and settings --------------------------------------------------------------
test('dc2: a sidecar without the context route is reported (tellMissingRoute); the worker follows the features', async () => {
    const s = setup({ settings: { llmMode: 'sillytavern' }, known: { context: false, jobs: true } });
    await s.on.refreshFeatures(true);
    assert.deepEqual(s.deps.features.calls, [['refresh', { force: true }]]);
    assert.equal(s.told.length, 1);
    assert.equal(s.told[0].code, 'not_found');
    assert.deepEqual(s.deps.worker.calls, [['start']], 'jobs are offered and the mode asks for them');
    s.deps.features.known.jobs = false;
    await s.on.refreshFeatures();
    assert.deepEqual(s.deps.worker.calls.at(-1), ['stop']);
});

test('dc2: a new sidecar URL or token is probed afresh; a new mode or switch restarts the worker; other settings do nothing', async () => {
    const s = setup({ known: { jobs: true } });
    const before = { ...s.settings };
    s.on.settingsChanged(before, { ...before, contextTimeoutMs: 900 });
    assert.deepEqual([s.deps.features.calls, s.deps.worker.calls], [[], []]);
    s.on.settingsChanged(before, { ...before, token: 'new' });
    assert.deepEqual(s.deps.features.calls, [['reset'], ['refresh', { force: false }]]);
    s.settings.llmMode = 'sillytavern';
    s.on.settingsChanged(before, { ...s.settings });
    await tick();
    assert.deepEqual(s.deps.worker.calls, [['start'], ['start']], 'once after the probe, once for the mode');
});

// --- through the real ChatSync -------------------------------------------------------------------
function withSidecar(chat) {
    const s = setup({ chat });
    let n = 0;
    s.ctx.uuidv4 = () => `id${++n}`;
    const sidecar = new FakeSidecar();
    s.deps.sync = new ChatSync({
        getContext: () => s.ctx,
        getClient: () => sidecar,
        batchSize: () => 100,
        onSuccess: () => {},
        onError: (error) => { throw error; },
    });
    return { ...s, sidecar, sync: s.deps.sync };
}

test('dc2/rv10: a sent message and its reply reach the sidecar with stable ids and the turn id', async () => {
    const chat = [{ ...msg(undefined, { user: true }), mes: 'Hello' }];
    const s = withSidecar(chat);
    s.on.syncNow('MESSAGE_SENT');
    assert.equal(chat[0].extra[ID_KEY], 'id1', 'the id is given at once');
    assert.deepEqual(s.saves, ['metadata']);
    s.state.turns.current = { id: 'turn-1', chatId: CHAT };
    chat.push({ ...msg(undefined), mes: 'Greetings' });
    s.on.messageReceived(1, 'normal');
    await s.sync.idle(1000);
    const stored = s.sidecar.chats.get(CHAT).messages;
    assert.deepEqual([...stored.values()].map(m => [m.id, m.role, m.text, m.turn_id]), [
        ['id1', 'user', 'Hello', undefined], ['id2', 'assistant', 'Greetings', 'turn-1'],
    ]);
});

test('rv10: a reply cut from the end (a regenerate) rolls its turn back; a deleted message leaves the sidecar', async () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 'turn-1' })];
    const s = withSidecar(chat);
    s.on.syncNow('MESSAGE_SENT');
    await s.sync.idle(1000);
    chat.pop();
    s.on.syncNow('MESSAGE_DELETED');
    await s.sync.idle(1000);
    assert.deepEqual(s.sidecar.calls.filter(c => c[0] === 'rollbackTurn'), [['rollbackTurn', CHAT, 'turn-1']]);
    assert.deepEqual([...s.sidecar.chats.get(CHAT).messages.keys()], ['u1']);
});
