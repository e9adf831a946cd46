// Turn planning, the last action, and trimming the request to the live window (extension/src/interceptor.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { contextRequest, lastAction, liveCut, planTurn, trimToLive } from '../../extension/src/interceptor.js';
import { ID_KEY, TURN_KEY } from '../../extension/src/sync/index.js';

function counter(prefix = 't') {
    let n = 0;
    return () => `${prefix}${++n}`;
}

function msg(id, { user = false, system = false, turn, text = `text of ${id}`, tools } = {}) {
    const extra = {};
    if (id) extra[ID_KEY] = id;
    if (turn) extra[TURN_KEY] = turn;
    if (tools) extra.tool_invocations = tools;
    return { name: user ? 'User' : 'Seraphina', is_user: user, is_system: system, mes: text, extra };
}

test('dc2: quiet generations (our own background work) are not turns', () => {
    assert.equal(planTurn({ type: 'quiet', lastMessage: msg('r', { turn: 'old' }), current: null, chatId: 'c', newId: counter() }), null);
});

test('rv10: a swipe is a new turn and rolls back the turn of the swipe it replaces', () => {
    const plan = planTurn({ type: 'swipe', lastMessage: msg('r1', { turn: 'old' }), current: null, chatId: 'c', newId: counter() });
    assert.deepEqual(plan, { turnId: 't1', rollback: ['old'] });
});

test('rv10: a swipe of a message no turn wrote (the greeting) rolls back nothing', () => {
    const plan = planTurn({ type: 'swipe', lastMessage: msg('greeting'), current: null, chatId: 'c', newId: counter() });
    assert.deepEqual(plan, { turnId: 't1', rollback: [] });
});

test('rv10: regenerate and normal start a new turn without rolling back here (the cut reply is rolled back by sync)', () => {
    for (const type of ['regenerate', 'normal', 'impersonate']) {
        const plan = planTurn({ type, lastMessage: msg('u1', { user: true }), current: { id: 'prev', chatId: 'c' }, chatId: 'c', newId: counter() });
        assert.deepEqual(plan, { turnId: 't1', rollback: [] }, type);
    }
});

test('rv10: continue keeps the turn of the message it extends', () => {
    const plan = planTurn({ type: 'continue', lastMessage: msg('r1', { turn: 'tX' }), current: null, chatId: 'c', newId: counter() });
    assert.deepEqual(plan, { turnId: 'tX', rollback: [] });
});

test('rv9a: the generation that follows a tool call continues the same turn', () => {
    const toolMessage = msg('tool', { system: true, tools: [{ name: 'remember' }] });
    const same = planTurn({ type: 'normal', lastMessage: toolMessage, current: { id: 'tT', chatId: 'c' }, chatId: 'c', newId: counter() });
    assert.deepEqual(same, { turnId: 'tT', rollback: [] });
    const otherChat = planTurn({ type: 'normal', lastMessage: toolMessage, current: { id: 'tT', chatId: 'other' }, chatId: 'c', newId: counter() });
    assert.deepEqual(otherChat, { turnId: 't1', rollback: [] });
});

test('qs2: the last action is the latest player message, or for Continue the message continued', () => {
    const chat = [msg('u1', { user: true, text: 'first' }), msg('r1', { text: 'reply' }), msg('u2', { user: true, text: 'I open the door' }), msg('r2', { text: 'It creaks' })];
    assert.deepEqual(lastAction(chat, 'normal'), { text: 'I open the door', kind: 'action' });
    assert.deepEqual(lastAction(chat, 'continue'), { text: 'It creaks', kind: 'continue' });
    assert.deepEqual(lastAction([msg('g', { text: 'greeting' })], 'swipe'), { text: 'greeting', kind: 'action' });
    assert.deepEqual(lastAction([], 'normal'), { text: '', kind: 'action' });
});

test('rv2: the live window starts at the earliest live id; newer messages unknown to the sidecar stay', () => {
    assert.equal(liveCut(['a', 'b', 'c', 'd', undefined], ['c', 'd']), 2);
    assert.equal(liveCut(['a', 'b', 'c'], ['a', 'b', 'c']), 0);
});

test('rv2: no trimming when the sidecar names no live message of this chat', () => {
    assert.equal(liveCut(['a', 'b'], []), 0);
    assert.equal(liveCut(['a', 'b'], ['zz']), 0);
    assert.equal(liveCut(['a', 'b'], undefined), 0);
});

test('rv2: trimToLive cuts only the request copy, never the stored messages', () => {
    const stored = [msg('a', { user: true }), msg('b'), msg('c', { user: true }), msg('d')];
    const snapshot = structuredClone(stored);
    // SillyTavern hands the interceptor shallow copies that share `extra` with the stored chat.
    const request = stored.map((m, index) => ({ ...m, index }));
    const dropped = trimToLive(request, ['c', 'd']);
    assert.equal(dropped, 2);
    assert.deepEqual(request.map(m => m.extra[ID_KEY]), ['c', 'd']);
    assert.deepEqual(stored, snapshot, 'the stored chat is unchanged, extra included');
});

test('dc2: the context request carries the API fields', () => {
    const chat = [msg('u1', { user: true, text: 'hello' })];
    const body = contextRequest({ chatId: 'Seraphina - 2026-11-29@16h52m03s', speakerId: 'Seraphina.png', presentIds: ['Seraphina.png'], contextSize: 3795.7, type: 'normal', chat });
    assert.deepEqual(body, {
        chat_id: 'Seraphina - 2026-11-29@16h52m03s', speaker_id: 'Seraphina.png', present_ids: ['Seraphina.png'],
        context_tokens: 3795, last_action: { text: 'hello', kind: 'action' }, generation_type: 'normal', memory_bank: true,
    });
    assert.equal(contextRequest({ chatId: 'c', speakerId: 's', presentIds: [], contextSize: 10, type: 'normal', chat, memoryBank: false }).memory_bank, false);
});
