// ChatSync's network part against a fake sidecar: speaker ids and positions in the records, orphan
// reconciliation, chat rename/delete, character rename (extension/src/sync/).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
    ChatSync, ID_KEY, TURN_KEY, characterCopy, chatRecords, idsFromListing, memoryMoves, orphanIds, savedMessages, speakerOf,
    toRecord,
} from '../../extension/src/sync/index.js';
import { FakeSidecar } from './fake_sidecar.js';

const DATE = '2026-01-01T00:00:00.000Z';

function msg(id, { user = false, system = false, turn, avatar, name } = {}) {
    const extra = { [ID_KEY]: id };
    if (turn) extra[TURN_KEY] = turn;
    const m = { name: name ?? (user ? 'User' : 'Seraphina'), is_user: user, is_system: system, mes: `text of ${id}`, send_date: DATE, extra };
    if (avatar) m.original_avatar = avatar;
    return m;
}

/** A SillyTavern context with one open chat, and a ChatSync over a fake sidecar. */
function setup({ chat, chatId = 'Seraphina - 1', group = null, sidecar = new FakeSidecar(), features } = {}) {
    const ctx = {
        chat,
        chatId,
        characters: [{ avatar: 'Seraphina.png', name: 'Seraphina' }, { avatar: 'Luke.png', name: 'Luke' }],
        characterId: group ? undefined : 0,
        groupId: group ? 'g1' : undefined,
        groups: group ? [{ id: 'g1', name: 'Party', members: group }] : [],
        name2: 'Seraphina',
        getCurrentChatId() { return this.chatId; },
    };
    let n = 0;
    ctx.uuidv4 = () => `new${++n}`;
    const errors = [];
    const sync = new ChatSync({
        getContext: () => ctx,
        getClient: () => sidecar,
        batchSize: () => 100,
        onSuccess: () => {},
        onError: (error, what) => errors.push([what, error]),
        features,
        now: () => DATE,
    });
    return { ctx, sync, sidecar, errors };
}

test('dc2: records carry the speaker (the card\'s avatar) and the message\'s position in the chat', () => {
    const chat = [msg('g'), msg('u1', { user: true }), msg('h', { system: true }), msg('r1', { turn: 't1' })];
    assert.deepEqual(chatRecords(chat, DATE, 'Seraphina.png').map(r => [r.id, r.index, r.speaker_id]), [
        ['g', 0, 'Seraphina.png'], ['u1', 1, undefined], ['r1', 3, 'Seraphina.png'],
    ]);
});

test('dc2: a user message names the persona it was sent as (SillyTavern\'s persona thumbnail)', () => {
    const user = { ...msg('u', { user: true }), force_avatar: '/thumbnail?type=persona&file=user%20one.png' };
    assert.equal(speakerOf(user, 'Seraphina.png'), 'user one.png');
    assert.equal(speakerOf({ ...user, force_avatar: 'img/user.png' }, 'Seraphina.png'), undefined);
});

test('rv5: in a group each reply names its own speaker (SillyTavern\'s original_avatar)', () => {
    assert.equal(speakerOf(msg('a', { avatar: 'Luke.png', name: 'Luke' }), undefined), 'Luke.png');
    assert.equal(speakerOf(msg('u', { user: true }), 'Seraphina.png'), undefined);
    assert.equal(toRecord(msg('b', { avatar: 'Luke.png' }), DATE, { index: 4 }).speaker_id, 'Luke.png');
});

test('dc2: a message moved by a delete above it is sent again with its new position', async () => {
    const chat = [msg('u1', { user: true }), msg('r1'), msg('u2', { user: true })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('test').done;
    chat.splice(0, 1);
    await s.sync.syncCurrentChat('test').done;
    const upserts = s.sidecar.calls.filter(c => c[0] === 'upsertMessages');
    assert.deepEqual(upserts.at(-1)[2].map(r => [r.id, r.index]), [['r1', 0], ['u2', 1]]);
    assert.equal(s.sidecar.chats.get('Seraphina - 1').messages.has('u1'), false);
});

test('dc2: orphans — messages the sidecar holds that the chat no longer has — are deleted once per page load', async () => {
    const sidecar = new FakeSidecar();
    await sidecar.putChat('Seraphina - 1', { member_ids: ['Seraphina.png'] });
    await sidecar.upsertMessages('Seraphina - 1', [{ id: 'gone1' }, { id: 'u1' }, { id: 'gone2' }]);
    const chat = [msg('u1', { user: true }), msg('r1')];
    const s = setup({ chat, sidecar });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    assert.deepEqual([...sidecar.chats.get('Seraphina - 1').messages.keys()].sort(), ['r1', 'u1']);
    sidecar.calls.length = 0;
    await s.sync.syncCurrentChat('MESSAGE_SENT').done;
    assert.equal(sidecar.names().includes('listMessageIds'), false, 'asked once per chat and page load');
    assert.deepEqual(s.errors, []);
});

test('dc2: orphan reconciliation reads every page of ids', async () => {
    const sidecar = new FakeSidecar();
    sidecar.pageSize = 2;
    await sidecar.putChat('Seraphina - 1', { member_ids: ['Seraphina.png'] });
    await sidecar.upsertMessages('Seraphina - 1', ['a', 'b', 'c', 'd', 'e'].map(id => ({ id })));
    const s = setup({ chat: [msg('c', { user: true })], sidecar });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    assert.deepEqual(sidecar.calls.filter(c => c[0] === 'listMessageIds').map(c => c[2]), [0, 2, 4]);
    assert.deepEqual([...sidecar.chats.get('Seraphina - 1').messages.keys()], ['c']);
});

test('dc2: a sidecar without the ids route is not asked again, and syncing goes on', async () => {
    const sidecar = new FakeSidecar({ missing: ['listMessageIds'] });
    const noted = {};
    const features = { known: {}, note: (name, value) => { noted[name] = value; } };
    const s = setup({ chat: [msg('u1', { user: true })], sidecar, features });
    await s.sync.syncCurrentChat('test').done;
    assert.deepEqual(noted, { messageIds: false });
    assert.ok(sidecar.chats.get('Seraphina - 1').messages.has('u1'));
    assert.deepEqual(s.errors, []);
});

test('dc2: idsFromListing reads both list shapes; orphanIds keeps what the chat still has', () => {
    assert.deepEqual(idsFromListing({ ids: ['a', 'b'] }), ['a', 'b']);
    assert.deepEqual(idsFromListing({ messages: [{ id: 'a' }, 'b', { nope: 1 }] }), ['a', 'b']);
    assert.deepEqual(idsFromListing(null), []);
    assert.deepEqual(orphanIds(['a', 'b', 'c'], ['b']), ['a', 'c']);
});

test('dc2: a renamed chat keeps its sidecar history: the fresh copy under the new id is replaced by the old chat', async () => {
    const chat = [msg('u1', { user: true }), msg('r1')];
    const s = setup({ chat, chatId: 'Old name' });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    s.sidecar.chats.get('Old name').summaries = ['kept'];
    // SillyTavern renames the file, reopens the chat under its new name (CHAT_CHANGED), then CHAT_RENAMED.
    s.ctx.chatId = 'New name';
    s.sync.syncCurrentChat('CHAT_CHANGED');
    await s.sync.renameChat('Old name', 'New name');
    assert.equal(s.sidecar.chats.has('Old name'), false);
    assert.deepEqual(s.sidecar.chats.get('New name').summaries, ['kept']);
    const after = s.sidecar.names().slice(s.sidecar.names().indexOf('renameChat'));
    assert.deepEqual(after, ['renameChat', 'deleteChat', 'renameChat']);
    // Everything is sent again under the new id on the next sync.
    await s.sync.syncCurrentChat('CHAT_RENAMED').done;
    assert.deepEqual(s.sidecar.calls.at(-1)[2].map(r => r.id), ['u1', 'r1']);
    assert.deepEqual(s.errors, []);
});

test('dc2: renaming a chat the sidecar never saw, or on a sidecar without the route, is no error', async () => {
    const s = setup({ chat: [], sidecar: new FakeSidecar({ missing: ['renameChat'] }) });
    await s.sync.renameChat('a', 'b');
    const t = setup({ chat: [] });
    await t.sync.renameChat('never seen', 'b');
    assert.deepEqual([...s.errors, ...t.errors], []);
});

test('dc2: a chat deleted in SillyTavern is deleted in the sidecar (a missing one is fine)', async () => {
    const s = setup({ chat: [msg('u1', { user: true })] });
    await s.sync.syncCurrentChat('test').done;
    await s.sync.deleteChat('Seraphina - 1');
    await s.sync.deleteChat('not there');
    assert.equal(s.sidecar.chats.has('Seraphina - 1'), false);
    assert.deepEqual(s.errors, []);
});

test('rv6: a renamed card moves its character and memories to the new id before the old id is deleted', async () => {
    const sidecar = new FakeSidecar();
    await sidecar.putCharacter('Sera.png', { name: 'Sera', aliases: ['S'], sheet: { personality: 'kind' } });
    sidecar.addMemory({ id: 'm1', scope: 'character', character_id: 'Sera.png', pinned: true, text: 'pinned one' });
    sidecar.addMemory({ id: 'm2', scope: 'character', character_id: 'Sera.png', archived: true, text: 'archived' });
    sidecar.addMemory({ id: 'm3', scope: 'global', known_by: ['Sera.png', 'Luke.png'], text: 'secret' });
    sidecar.addMemory({ id: 'm4', scope: 'character', character_id: 'Luke.png', text: 'Luke\'s' });
    const s = setup({ chat: [], sidecar });
    await s.sync.renameCharacter('Sera.png', 'Seraphine.png', () => 'Seraphine');
    assert.deepEqual(s.errors, []);
    assert.equal(sidecar.characters.has('Sera.png'), false);
    assert.deepEqual(sidecar.characters.get('Seraphine.png').aliases, ['S', 'Sera']);
    assert.deepEqual(sidecar.characters.get('Seraphine.png').sheet, { personality: 'kind' });
    const m = (id) => sidecar.memories.get(id);
    assert.deepEqual([m('m1').scope, m('m1').character_id, m('m1').pinned], ['character', 'Seraphine.png', true], 'not turned global');
    assert.equal(m('m2').character_id, 'Seraphine.png');
    assert.deepEqual(m('m3').known_by, ['Seraphine.png', 'Luke.png']);
    assert.equal(m('m4').character_id, 'Luke.png');
    assert.ok(s.sync.cast.knownCharacters.has('Seraphine.png'));
});

test('rv6: the move plan only touches memories naming the old id, as a person\'s edit', () => {
    const moves = memoryMoves([
        { id: 'a', scope: 'character', character_id: 'old', known_by: null },
        { id: 'b', scope: 'global', character_id: null, known_by: ['old', 'new'] },
        { id: 'c', scope: 'global', character_id: null, known_by: null },
    ], 'old', 'new');
    assert.deepEqual(moves, [
        { id: 'a', patch: { scope: 'character', character_id: 'new', actor: 'user' } },
        { id: 'b', patch: { known_by: ['new'], actor: 'user' } },
    ]);
    assert.deepEqual(characterCopy({ name: 'A', aliases: [], sheet: {}, is_player: true }, undefined),
        { name: 'A', aliases: [], sheet: {}, is_player: true });
});

test('dc2: the context does not wait for an ordinary upsert (the new message\'s embedding)', async () => {
    const chat = [msg('u1', { user: true })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done; // registered
    s.sidecar.delayMs.upsertMessages = 300;
    chat.push(msg('u2', { user: true }));
    const { done } = s.sync.syncCurrentChat('MESSAGE_SENT');
    const t0 = performance.now();
    await s.sync.settled('Seraphina - 1', 1000);
    assert.ok(performance.now() - t0 < 100, 'not held up by the upsert');
    await done;
});

test('rv10: the context waits for a pending rollback (a swipe) before it is built, up to the limit', async () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    s.sidecar.delayMs.rollbackTurn = 150;
    s.sync.rollback('Seraphina - 1', 't1');
    const t0 = performance.now();
    await s.sync.settled('Seraphina - 1', 2000);
    assert.ok(performance.now() - t0 >= 140, 'waited for the rollback');
    assert.ok(s.sidecar.names().includes('rollbackTurn'));
    s.sidecar.delayMs.rollbackTurn = 500;
    s.sync.rollback('Seraphina - 1', 't2');
    const t1 = performance.now();
    await s.sync.settled('Seraphina - 1', 50);
    assert.ok(performance.now() - t1 < 200, 'but never longer than the limit');
});

test('rv10: a regenerate\'s cut reply (rolled back by sync) and a chat\'s first registration are waited for too', async () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const s = setup({ chat });
    s.sidecar.delayMs.upsertMessages = 120;
    s.sync.syncCurrentChat('CHAT_CHANGED'); // first sight: registration pending
    let t0 = performance.now();
    await s.sync.settled('Seraphina - 1', 2000);
    assert.ok(performance.now() - t0 >= 100, 'waited for the first registration');
    chat.length = 1; // regenerate: the reply is cut
    s.sync.syncCurrentChat('MESSAGE_DELETED');
    t0 = performance.now();
    await s.sync.settled('Seraphina - 1', 2000);
    assert.ok(s.sidecar.names().includes('rollbackTurn'), 'the rollback happened before settled resolved');
});

test('rv6: when SillyTavern has not reloaded the card yet, the renamed character gets its new name at the next sync', async () => {
    const sidecar = new FakeSidecar();
    await sidecar.putCharacter('Mira.png', { name: 'Mira', aliases: [], sheet: { backstory: 'herbs' } });
    const s = setup({ chat: [msg('u1', { user: true })], sidecar });
    await s.sync.renameCharacter('Mira.png', 'Mirabel.png', () => undefined);
    assert.equal(sidecar.characters.get('Mirabel.png').name, 'Mira');
    s.ctx.characters = [{ avatar: 'Mirabel.png', name: 'Mirabel' }];
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    const renamed = sidecar.characters.get('Mirabel.png');
    assert.equal(renamed.name, 'Mirabel');
    assert.deepEqual(renamed.aliases, ['Mira']);
    assert.deepEqual(renamed.sheet, { backstory: 'herbs' });
    assert.deepEqual(s.errors, []);
});

test('dc2: while a generation waits for its context, the new message\'s upsert waits (but a rollback does not)', async () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    s.sync.hold(5000);
    chat.push(msg('u2', { user: true }));
    const { done } = s.sync.syncCurrentChat('MESSAGE_SENT');
    await new Promise(r => setTimeout(r, 30));
    assert.equal(s.sidecar.chats.get('Seraphina - 1').messages.has('u2'), false, 'held');
    await s.sync.settled('Seraphina - 1', 1000); // nothing critical: the context call goes at once
    s.sync.release();
    await done;
    assert.ok(s.sidecar.chats.get('Seraphina - 1').messages.has('u2'), 'sent after the release');

    s.sync.hold(5000);
    chat.length = 1; // a regenerate cut (critical): not held
    const cut = s.sync.syncCurrentChat('MESSAGE_DELETED');
    await s.sync.settled('Seraphina - 1', 1000);
    assert.ok(s.sidecar.names().includes('rollbackTurn'));
    s.sync.release();
    await cut.done;
});

test('dc2: a hold never outlives its limit', async () => {
    const chat = [msg('u1', { user: true })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('CHAT_CHANGED').done;
    s.sync.hold(40);
    chat.push(msg('u2', { user: true }));
    await s.sync.syncCurrentChat('MESSAGE_SENT').done;
    assert.ok(s.sidecar.chats.get('Seraphina - 1').messages.has('u2'));
});

test('cp2: a branch SillyTavern made is registered with branch_of at its last message, once, when the sidecar does not know it', async () => {
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const s = setup({ chat, chatId: 'Seraphina - 1 Branch #1' });
    s.ctx.chatMetadata = { main_chat: 'Seraphina - 1' };
    await s.sync.syncCurrentChat('test').done;
    const puts = s.sidecar.calls.filter(c => c[0] === 'putChat');
    assert.deepEqual(puts.map(c => c[2].branch_of), [{ chat_id: 'Seraphina - 1', message_id: 'r1' }]);
    // The branch goes on: a later registration (a new member) sends no branch point again.
    chat.push(msg('u2', { user: true }));
    s.ctx.characterId = undefined;
    s.ctx.groupId = 'g1';
    s.ctx.groups = [{ id: 'g1', name: 'Party', members: ['Seraphina.png', 'Luke.png'] }];
    await s.sync.syncCurrentChat('test').done;
    assert.equal(s.sidecar.calls.filter(c => c[0] === 'putChat').at(-1)[2].branch_of, undefined);
});

test('cp2: a checkpoint opened after the sidecar already knows it, and a chat that is no branch, send no branch_of', async () => {
    const sidecar = new FakeSidecar();
    await sidecar.putChat('Seraphina - 1 Checkpoint', { member_ids: ['Seraphina.png'] });
    const known = setup({ chat: [msg('u1', { user: true })], chatId: 'Seraphina - 1 Checkpoint', sidecar });
    known.ctx.chatMetadata = { main_chat: 'Seraphina - 1' };
    await known.sync.syncCurrentChat('test').done;
    const plain = setup({ chat: [msg('u1', { user: true })] });
    plain.ctx.chatMetadata = {};
    await plain.sync.syncCurrentChat('test').done;
    for (const s of [known, plain]) {
        assert.ok(s.sidecar.calls.filter(c => c[0] === 'putChat').every(c => c[2].branch_of === undefined));
    }
    assert.equal(plain.sidecar.calls.some(c => c[0] === 'getChat'), false);
});

test('cp1e: a chat synced gets its own id as origin mark in its metadata, saved once', async () => {
    const s = setup({ chat: [msg('u1', { user: true })] });
    s.ctx.chatMetadata = {};
    let saves = 0;
    s.ctx.saveMetadataDebounced = () => { saves += 1; };
    await s.sync.syncCurrentChat('test').done;
    assert.equal(s.ctx.chatMetadata.chronicler_chat_id, 'Seraphina - 1');
    await s.sync.syncCurrentChat('test').done;
    assert.equal(saves, 1);
});

test('cp1e: "Convert to group" (a group chat carrying a solo chat\'s mark) is a branch at its last message that keeps the campaign', async () => {
    const sidecar = new FakeSidecar();
    await sidecar.putChat('Seraphina - 1', { member_ids: ['Seraphina.png'], campaign_id: 'Saga' });
    const chat = [msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const s = setup({ chat, chatId: '2026-12-02@11h00m00s', group: ['Seraphina.png'], sidecar });
    s.ctx.chatMetadata = { chronicler_chat_id: 'Seraphina - 1' };
    await s.sync.syncCurrentChat('test').done;
    const [put] = s.sidecar.calls.filter(c => c[0] === 'putChat' && c[1] === '2026-12-02@11h00m00s');
    assert.deepEqual(put[2].branch_of, { chat_id: 'Seraphina - 1', message_id: 'r1' });
    assert.equal(put[2].campaign_id, 'Saga');
    assert.equal(s.ctx.chatMetadata.chronicler_chat_id, '2026-12-02@11h00m00s', 'the copy now marks itself');
});

test('cp1e: a one-to-one copy carrying another chat\'s mark is a plain branch (a campaign of its own)', async () => {
    const sidecar = new FakeSidecar();
    await sidecar.putChat('Seraphina - 1', { member_ids: ['Seraphina.png'], campaign_id: 'Saga' });
    const s = setup({ chat: [msg('u1', { user: true })], chatId: 'Seraphina - copy', sidecar });
    s.ctx.chatMetadata = { chronicler_chat_id: 'Seraphina - 1' };
    await s.sync.syncCurrentChat('test').done;
    const [put] = s.sidecar.calls.filter(c => c[0] === 'putChat' && c[1] === 'Seraphina - copy');
    assert.deepEqual(put[2].branch_of, { chat_id: 'Seraphina - 1', message_id: 'u1' });
    assert.equal(put[2].campaign_id, undefined);
});

test('dc2: two tabs on one chat — the sidecar follows the chat SillyTavern saved last', async () => {
    // This tab sent g, a1, a2; another tab saved the chat as g, b1, b2 after it (the last save wins).
    const mine = [msg('g'), msg('a1', { user: true }), msg('a2', { turn: 't1' })];
    const theirs = [msg('g'), msg('b1', { user: true }), msg('b2', { turn: 't2' })];
    const s = setup({ chat: mine });
    let file = theirs;
    s.sync.deps.savedMessages = async () => structuredClone(file);
    await s.sync.syncCurrentChat('test').done;
    await s.sidecar.upsertMessages('Seraphina - 1', chatRecords([theirs[1]], DATE, 'Seraphina.png').map(r => ({ ...r, index: 1 })));
    await s.sync.followSaved('Seraphina - 1');
    const held = () => [...s.sidecar.chats.get('Seraphina - 1').messages.values()].map(m => [m.id, m.index]).sort();
    assert.deepEqual(held(), [['b1', 1], ['b2', 2], ['g', 0]]);
    // This tab speaks again and saves: its chat is the file now, and its own messages come back.
    mine.push(msg('a3', { user: true }));
    file = mine;
    await s.sync.syncCurrentChat('test').done;
    await s.sync.followSaved('Seraphina - 1');
    assert.deepEqual(held(), [['a1', 1], ['a2', 2], ['a3', 3], ['g', 0]]);
    assert.deepEqual(s.errors, []);
});

test('dc2: a saved chat only behind this page (its own save still coming) changes nothing', async () => {
    const chat = [msg('g'), msg('u1', { user: true }), msg('r1', { turn: 't1' })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('test').done;
    s.sync.deps.savedMessages = async () => [msg('g'), msg('u1', { user: true })];
    await s.sync.followSaved('Seraphina - 1');
    assert.deepEqual([...s.sidecar.chats.get('Seraphina - 1').messages.keys()].sort(), ['g', 'r1', 'u1']);
});

test('dc2: following the saved chat waits while a saved message has no id of ours yet', async () => {
    const chat = [msg('g'), msg('u1', { user: true })];
    const s = setup({ chat });
    await s.sync.syncCurrentChat('test').done;
    const bare = { ...msg('x', { user: true }), extra: {} };
    s.sync.deps.savedMessages = async () => [msg('g'), bare];
    await s.sync.followSaved('Seraphina - 1');
    assert.deepEqual([...s.sidecar.chats.get('Seraphina - 1').messages.keys()].sort(), ['g', 'u1']);
    s.ctx.chatId = 'Other chat';  // and when the chat is no longer open
    s.sync.deps.savedMessages = async () => [msg('g')];
    await s.sync.followSaved('Seraphina - 1');
    assert.deepEqual([...s.sidecar.chats.get('Seraphina - 1').messages.keys()].sort(), ['g', 'u1']);
});

test('dc2: the saved chat is read through SillyTavern\'s own routes, its header line dropped', async () => {
    const calls = [];
    const fetchFn = async (url, init) => {
        calls.push([url, JSON.parse(init.body), init.headers]);
        return { ok: true, json: async () => [{ user_name: 'User', chat_metadata: {} }, msg('g')] };
    };
    const ctx = {
        characters: [{ avatar: 'Seraphina.png', name: 'Seraphina' }], characterId: 0,
        getCurrentChatId: () => 'Seraphina - 1', getRequestHeaders: () => ({ 'X-CSRF-Token': 'tok' }),
    };
    assert.deepEqual((await savedMessages(ctx, fetchFn)).map(m => m.extra[ID_KEY]), ['g']);
    assert.deepEqual(calls[0].slice(0, 2), ['/api/chats/get', { ch_name: 'Seraphina', file_name: 'Seraphina - 1', avatar_url: 'Seraphina.png' }]);
    assert.equal(calls[0][2]['X-CSRF-Token'], 'tok');
    await savedMessages({ ...ctx, groupId: 'g1', getCurrentChatId: () => 'Party chat' }, fetchFn);
    assert.deepEqual(calls[1].slice(0, 2), ['/api/chats/group/get', { id: 'Party chat' }]);
    assert.equal(await savedMessages(ctx, async () => ({ ok: false })), null);
});

test('dc2: a generation that starts postpones a following of the saved chat not begun yet; its end asks again', async () => {
    const s = setup({ chat: [msg('g')] });
    let reads = 0;
    s.sync.deps.savedMessages = async () => { reads += 1; return [msg('g')]; };
    s.sync.followSavedSoon(5);
    s.sync.postponeFollowSaved();
    await new Promise(resolve => setTimeout(resolve, 30));
    assert.equal(reads, 0);
    s.sync.followSavedSoon(5);
    await new Promise(resolve => setTimeout(resolve, 30));
    await s.sync.idle(1000);
    assert.equal(reads, 1);
});
