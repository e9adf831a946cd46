// Message ids, records and reconciliation (extension/src/sync/records.js, ledger.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
    ChatLedger, ID_KEY, SyncQueue, TURN_KEY, batches, chatMembers, chatTitle, characterFromCard, ensureIds, fingerprint,
    messageId, placeNow, reconcile, speakerNow, stampTurn, swipePending, toIso, toRecord,
} from '../../extension/src/sync/index.js';

const FALLBACK = '2026-01-01T00:00:00.000Z';

function counter(prefix = 'id') {
    let n = 0;
    return () => `${prefix}${++n}`;
}

function msg(id, { user = false, system = false, turn, text = `text of ${id}` } = {}) {
    const extra = {};
    if (id) extra[ID_KEY] = id;
    if (turn) extra[TURN_KEY] = turn;
    return { name: user ? 'User' : 'Seraphina', is_user: user, is_system: system, mes: text, send_date: FALLBACK, extra };
}

/** The ledger after a sync of `chat` (observed; `accepted`: the sidecar took every message). */
function sentLedger(chat, { accepted = true } = {}) {
    const ledger = new ChatLedger();
    const records = chat.map(m => toRecord(m, FALLBACK)).filter(Boolean);
    ledger.observe(records);
    if (accepted) ledger.markSent(records);
    return ledger;
}

function ids(chat) {
    return chat.map(messageId);
}

function sendable(chat) {
    return chat.map(m => toRecord(m, FALLBACK)).filter(Boolean).map(r => r.id);
}

test('dc2: ensureIds gives each message without an id a new one and keeps existing ids', () => {
    const chat = [msg('a'), { mes: 'no extra', is_user: true }, msg(undefined)];
    const assigned = ensureIds(chat, counter('n'));
    assert.deepEqual(assigned, [1, 2]);
    assert.deepEqual(ids(chat), ['a', 'n1', 'n2']);
    assert.deepEqual(ensureIds(chat, counter('x')), [], 'a second pass assigns nothing');
});

test('dc2: toRecord follows the API message shape; hidden/system messages are not sent', () => {
    const reply = msg('r1', { turn: 't1' });
    assert.deepEqual(toRecord(reply, FALLBACK), {
        id: 'r1', role: 'assistant', name: 'Seraphina', text: 'text of r1', sent_at: FALLBACK, turn_id: 't1',
    });
    const user = msg('u1', { user: true, turn: 'ignored' });
    assert.deepEqual(toRecord(user, FALLBACK), { id: 'u1', role: 'user', name: 'User', text: 'text of u1', sent_at: FALLBACK });
    assert.equal(toRecord(msg('h1', { system: true }), FALLBACK), null);
    assert.equal(toRecord(msg(undefined), FALLBACK), null);
});

test('dc2: toIso reads the send_date formats SillyTavern chats hold', () => {
    assert.equal(toIso('2026-11-29T16:52:03.000Z', FALLBACK), '2026-11-29T16:52:03.000Z');
    assert.equal(toIso(Date.UTC(2025, 0, 2, 3, 4, 5), FALLBACK), '2025-01-02T03:04:05.000Z');
    const legacy = toIso('November 29, 2026 4:52pm', FALLBACK);
    assert.notEqual(legacy, FALLBACK);
    assert.equal(new Date(legacy).getMinutes(), 52);
    assert.equal(toIso('not a date', FALLBACK), FALLBACK);
    assert.equal(toIso(undefined, FALLBACK), FALLBACK);
});

test('dc2: the ledger re-sends only new or changed messages', () => {
    const chat = [msg('a'), msg('b')];
    const ledger = sentLedger(chat);
    chat[1].mes = 'edited';
    chat.push(msg('c'));
    const changed = ledger.changed(chat.map(m => toRecord(m, FALLBACK)));
    assert.deepEqual(changed.map(r => r.id), ['b', 'c']);
    assert.notEqual(fingerprint(toRecord(msg('a'), FALLBACK)), fingerprint({ ...toRecord(msg('a'), FALLBACK), turn_id: 't' }));
});

test('rv10: a regenerate (last reply cut from the end) deletes it and rolls back its turn', () => {
    const chat = [msg('g'), msg('u1', { user: true }), msg('r1', { turn: 't1' }), msg('u2', { user: true }), msg('r2', { turn: 't2' })];
    const ledger = sentLedger(chat);
    chat.length = 4; // SillyTavern: chat.length--, then MESSAGE_DELETED(4)
    const result = reconcile(ledger, ids(chat), sendable(chat));
    assert.deepEqual(result, { removed: ['r2'], tail: true, rollbackTurns: ['t2'] });
});

test('rv10: a group regenerate cuts several replies; every turn among them is rolled back once', () => {
    const chat = [msg('u1', { user: true }), msg('a1', { turn: 'tA' }), msg('b1', { turn: 'tB' }), msg('b2', { turn: 'tB' })];
    const ledger = sentLedger(chat);
    chat.length = 1;
    const result = reconcile(ledger, ids(chat), sendable(chat));
    assert.deepEqual(result.removed, ['a1', 'b1', 'b2']);
    assert.equal(result.tail, true);
    assert.deepEqual(result.rollbackTurns, ['tA', 'tB']);
});

test('rv10: deleting a message in the middle deletes it without rolling anything back', () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' }), msg('u2', { user: true }), msg('r2', { turn: 't2' })];
    const ledger = sentLedger(chat);
    chat.splice(1, 1); // MESSAGE_DELETED gives only the new length: 3
    const result = reconcile(ledger, ids(chat), sendable(chat));
    assert.deepEqual(result, { removed: ['r1'], tail: false, rollbackTurns: [] });
});

test('rv10: cutting a user message from the end rolls back nothing (no turn wrote it)', () => {
    const chat = [msg('r0', { turn: 't0' }), msg('u1', { user: true })];
    const ledger = sentLedger(chat);
    chat.length = 1;
    assert.deepEqual(reconcile(ledger, ids(chat), sendable(chat)), { removed: ['u1'], tail: true, rollbackTurns: [] });
});

test('rv10: hiding the last reply removes it from the sidecar but never rolls its turn back', () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const ledger = sentLedger(chat);
    chat[1].is_system = true; // /hide
    assert.deepEqual(reconcile(ledger, ids(chat), sendable(chat)), { removed: ['r1'], tail: false, rollbackTurns: [] });
});

test('dc2: nothing vanished, nothing to do', () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const ledger = sentLedger(chat);
    chat.push(msg('u2', { user: true }));
    assert.deepEqual(reconcile(ledger, ids(chat), sendable(chat)), { removed: [], tail: false, rollbackTurns: [] });
});

test('dc2: a message deleted in the sidecar is sent again if it comes back', () => {
    const chat = [msg('a'), msg('b')];
    const ledger = sentLedger(chat);
    ledger.markDeleted(['b']);
    assert.deepEqual(ledger.changed(chat.map(m => toRecord(m, FALLBACK))).map(r => r.id), ['b']);
});

test('rv10: a regenerate is recognised even when the cut reply never reached the sidecar', () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const ledger = sentLedger(chat, { accepted: false }); // the sidecar was down
    chat.length = 1;
    assert.deepEqual(reconcile(ledger, ids(chat), sendable(chat)), { removed: ['r1'], tail: true, rollbackTurns: ['t1'] });
});

test('rv10: a new swipe stamps its own turn; the user message is never stamped', () => {
    const reply = msg('r1', { turn: 't1' });
    assert.equal(stampTurn(reply, 't2'), true);
    assert.equal(reply.extra[TURN_KEY], 't2');
    assert.equal(stampTurn(reply, 't2'), false, 'same turn again: no change');
    const user = msg('u1', { user: true });
    assert.equal(stampTurn(user, 't3'), false);
    assert.equal(user.extra[TURN_KEY], undefined);
});

test('dc2: swipePending is true only while a new swipe waits for its generation', () => {
    assert.equal(swipePending({ swipes: ['a', 'b'], swipe_id: 2 }), true);
    assert.equal(swipePending({ swipes: ['a', 'b'], swipe_id: 1 }), false);
    assert.equal(swipePending({ mes: 'no swipes' }), false);
});

test('dc2: batches split by size and keep order', () => {
    assert.deepEqual(batches([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]]);
    assert.deepEqual(batches([], 3), []);
});

test('rv5: chatMembers lists a group\'s members (active ones apart) by avatar file name', () => {
    const groups = [{ id: 'g1', members: ['a.png', 'b.png', 'c.png'], disabled_members: ['c.png'] }];
    assert.deepEqual(chatMembers({ groupId: 'g1', groups }), {
        isGroup: true, memberIds: ['a.png', 'b.png', 'c.png'], activeMemberIds: ['a.png', 'b.png'],
    });
    const characters = [{ avatar: 'x.png' }, { avatar: 'Seraphina.png' }];
    assert.deepEqual(chatMembers({ characters, characterId: '1' }), {
        isGroup: false, memberIds: ['Seraphina.png'], activeMemberIds: ['Seraphina.png'],
    });
    assert.deepEqual(chatMembers({ characters, characterId: undefined }).memberIds, []);
});

test('sw1: a card seen for the first time becomes a character with its name and an empty sheet', () => {
    assert.deepEqual(characterFromCard({ name: 'Seraphina', avatar: 'Seraphina.png', description: 'long card text' }), {
        name: 'Seraphina', aliases: [], sheet: {}, is_player: false,
    });
});

const CARDS = [{ avatar: 'Seraphina.png', name: 'Seraphina' }, { avatar: 'Luke.png', name: 'Luke' }];

function here(fields) {
    return { characters: CARDS, name2: 'Seraphina', getCurrentChatId: () => 'chat 1', chat: [], ...fields };
}

test('rv5: a chat\'s title is its group\'s name, or its character\'s', () => {
    assert.equal(chatTitle(here({ characterId: 0 })), 'Seraphina');
    assert.equal(chatTitle(here({ groupId: 7, groups: [{ id: '7', name: 'Party' }] })), 'Party', 'group ids compare as text');
    assert.equal(chatTitle(here({ groupId: 'gone', groups: [] })), undefined);
});

test('rv9a: the speaker is the open chat\'s card, with the members and this chat\'s turn only', () => {
    const turn = { id: 'turn-1', chatId: 'chat 1' };
    assert.deepEqual(speakerNow(here({ characterId: 1 }), turn), {
        chatId: 'chat 1', speakerId: 'Luke.png', memberIds: ['Luke.png'], turnId: 'turn-1',
    });
    assert.equal(speakerNow(here({ characterId: 1 }), { id: 'turn-9', chatId: 'chat 2' }).turnId, undefined);
    assert.equal(speakerNow(here({ characterId: undefined }), turn), null, 'no card: nobody speaks');
    assert.equal(speakerNow(here({ characterId: 0, getCurrentChatId: () => undefined }), turn), null, 'no chat open');
});

test('rv9b: the place names the chat\'s card, or in a group the member who replied last', () => {
    const one = placeNow(here({ characterId: 0 }));
    assert.deepEqual(one, {
        chatId: 'chat 1', isGroup: false, memberIds: ['Seraphina.png'], characterId: 'Seraphina.png', lastSpeakerId: undefined,
        characters: CARDS,
    });
    const chat = [
        { is_user: false, original_avatar: 'Luke.png' }, { is_user: false, original_avatar: 'Seraphina.png' },
        { is_user: true }, { is_system: true, original_avatar: 'Luke.png' },
    ];
    const group = placeNow(here({ groupId: 'g', groups: [{ id: 'g', members: ['Seraphina.png', 'Luke.png'] }], chat }));
    assert.deepEqual([group.isGroup, group.characterId, group.lastSpeakerId], [true, undefined, 'Seraphina.png']);
});

test('dc2: the sync queue runs tasks in order; held ones wait for release, critical ones never do', async () => {
    const done = [];
    const errors = [];
    const queue = new SyncQueue({ onSuccess: () => {}, onError: (error, what) => errors.push([what, error.message]) });
    queue.hold(10000);
    const held = queue.enqueue('upsert', async () => done.push('upsert'), { held: true });
    const critical = queue.enqueue('rollback', async () => done.push('rollback'), { critical: 'c1' });
    await queue.criticalDone('c1', 20);
    assert.deepEqual(done, [], 'the critical task is queued behind the held one');
    queue.release();
    await critical;
    assert.deepEqual(done, ['upsert', 'rollback']);
    await held;
    queue.hold(10000);
    const critical2 = queue.enqueue('delete', async () => done.push('delete'), { critical: 'c1' });
    await critical2;
    assert.deepEqual(done.at(-1), 'delete', 'a critical task does not wait for the gate');
    queue.release();
    await queue.enqueue('broken', async () => { throw new Error('down'); });
    assert.deepEqual(errors, [['broken', 'down']], 'a failure is reported, never thrown');
    assert.equal(queue.critical.has('c1'), false, 'finished critical tasks are forgotten');
});
