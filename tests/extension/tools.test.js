// The model's memory tools (extension/src/tools.js) against a fake sidecar client.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
    MEMORY_MAX_CHARS, TOOL_NAMES, ToolRefusal, forgetMemory, formatResults, readSessionSummary, recall, recallBody,
    refusalFor, registerTools, remember, rememberBody, toolDefinitions, updateMemory,
} from '../../extension/src/tools.js';
import { FakeSidecar } from './fake_sidecar.js';

const SERA = 'Seraphina.png';
const LUKE = 'Luke.png';

function deps({ speaker = { chatId: 'chat 1', speakerId: SERA, memberIds: [SERA], turnId: 't1' }, settings = {}, features = [] } = {}) {
    const sidecar = new FakeSidecar();
    const known = new Set(features);
    return {
        sidecar,
        getClient: () => sidecar,
        speaker: () => speaker,
        getSettings: () => ({ enabled: true, tools: true, recallResults: 5, ...settings }),
        features: { has: (name) => known.has(name) },
    };
}

test('rv9a: remember saves an unpinned memory of the speaker, by the model, tagged with this turn (RV10)', async () => {
    const d = deps();
    const out = await remember(d, { text: '  Mara is allergic to bees. ' });
    const [, body] = d.sidecar.calls.find(c => c[0] === 'createMemory');
    assert.deepEqual(body, {
        text: 'Mara is allergic to bees.', scope: 'character', character_id: SERA, pinned: false,
        actor: 'model', chat_id: 'chat 1', turn_id: 't1', known_by: [SERA],
    });
    assert.match(out, /^Saved memory m_1: Mara is allergic to bees\.$/);
});

test('sw9b: in a group, what the model remembers is known by the scene\'s witnesses (the members)', () => {
    const body = rememberBody({ chatId: 'g', speakerId: SERA, memberIds: [SERA, LUKE], turnId: 't' }, { text: 'The key is under the mat.' });
    assert.deepEqual(body.known_by, [SERA, LUKE]);
    assert.equal(body.character_id, SERA);
});

test('rv4: remember with scope global saves common knowledge without a character or restriction', () => {
    const body = rememberBody({ chatId: 'c', speakerId: SERA, memberIds: [SERA], turnId: 't' }, { text: 'The war ended in 1312.', scope: 'global' });
    assert.equal(body.scope, 'global');
    assert.equal(body.character_id, null);
    assert.equal(body.known_by, null);
    assert.equal(body.pinned, false);
});

test('rv8: remember refuses empty and over-long text before calling the sidecar', async () => {
    const d = deps();
    await assert.rejects(remember(d, { text: '   ' }), ToolRefusal);
    await assert.rejects(remember(d, { text: 'x'.repeat(MEMORY_MAX_CHARS + 1) }), /at most 500/);
    assert.deepEqual(d.sidecar.names(), []);
});

test('rv9a: no tool acts outside a chat with a speaking character', async () => {
    const d = deps({ speaker: null });
    await assert.rejects(remember(d, { text: 'x' }), /No character is speaking/);
    await assert.rejects(recall(d, { query: 'x' }), /No character is speaking/);
});

test('rv9a: update_memory rewrites the speaker\'s own unpinned memory as the model', async () => {
    const d = deps();
    d.sidecar.addMemory({ id: 'm_own', scope: 'character', character_id: SERA, text: 'old' });
    const out = await updateMemory(d, { id: 'm_own', text: 'new fact' });
    assert.equal(d.sidecar.memories.get('m_own').text, 'new fact');
    assert.deepEqual(d.sidecar.calls.find(c => c[0] === 'patchMemory').slice(1), ['m_own', { text: 'new fact', actor: 'model' }]);
    assert.match(out, /Updated memory m_own/);
});

test('rv9a: a global unpinned memory may be edited and forgotten by the model', async () => {
    const d = deps();
    d.sidecar.addMemory({ id: 'm_g', scope: 'global', text: 'g' });
    await updateMemory(d, { id: 'm_g', text: 'g2' });
    await forgetMemory(d, { id: 'm_g' });
    assert.equal(d.sidecar.memories.has('m_g'), false);
    assert.deepEqual(d.sidecar.calls.find(c => c[0] === 'deleteMemory').slice(1), ['m_g', 'model']);
});

test('rv11: pinned memories are refused by the extension before the sidecar is asked to change them', async () => {
    const d = deps();
    d.sidecar.addMemory({ id: 'm_pin', scope: 'character', character_id: SERA, pinned: true, text: 'pinned' });
    await assert.rejects(updateMemory(d, { id: 'm_pin', text: 'x' }), /pinned: only the user/);
    await assert.rejects(forgetMemory(d, { id: 'm_pin' }), /pinned/);
    assert.equal(d.sidecar.memories.get('m_pin').text, 'pinned');
    assert.ok(!d.sidecar.names().includes('patchMemory') && !d.sidecar.names().includes('deleteMemory'));
});

test('rv9a/sw9b: another character\'s memory, or one the speaker does not know, looks like no memory at all', async () => {
    const d = deps();
    d.sidecar.addMemory({ id: 'm_luke', scope: 'character', character_id: LUKE, text: 'Luke\'s' });
    d.sidecar.addMemory({ id: 'm_secret', scope: 'global', known_by: [LUKE], text: 'secret' });
    for (const id of ['m_luke', 'm_secret', 'm_missing']) {
        await assert.rejects(forgetMemory(d, { id }), /no memory with that id among yours/, id);
    }
    assert.equal(d.sidecar.memories.size, 2);
});

test('rv11: refusalFor is the whole rule in one place', () => {
    const mine = { scope: 'character', character_id: SERA, pinned: false, known_by: null };
    assert.equal(refusalFor(mine, SERA), null);
    assert.equal(refusalFor({ ...mine, known_by: [SERA] }, SERA), null);
    assert.match(refusalFor({ ...mine, pinned: true }, SERA), /pinned/);
    assert.match(refusalFor({ ...mine, character_id: LUKE }, SERA), /no memory/);
    assert.match(refusalFor(null, SERA), /no memory/);
});

test('rv11: the sidecar\'s own 403 on a pin still reaches the model as a failure', async () => {
    const d = deps();
    d.sidecar.addMemory({ id: 'm_race', scope: 'global', text: 'g' });
    // Pinned by a person between our check and our edit: the sidecar refuses.
    const original = d.sidecar.getMemory.bind(d.sidecar);
    d.sidecar.getMemory = async (id) => {
        const answer = await original(id);
        d.sidecar.memories.get(id).pinned = true;
        return answer;
    };
    const tool = toolDefinitions(d).find(t => t.name === TOOL_NAMES.update);
    await assert.rejects(tool.action({ id: 'm_race', text: 'x' }), /Chronicler could not do that \(pinned\)/);
});

test('sw9b: recall searches only what the speaker knows (viewer_id) in this chat, at most the set number', async () => {
    const d = deps({ settings: { recallResults: 3 } });
    d.sidecar.searchResults = [
        { id: 'm_1', kind: 'memory', text: 'Mara fears bees', score: 0.9, source_message_ids: [] },
        { id: 'msg_2', kind: 'message', text: ' She ran. ', score: 0.5, source_message_ids: ['msg_2'] },
    ];
    const out = await recall(d, { query: 'bees', k: 10 });
    assert.deepEqual(d.sidecar.calls.find(c => c[0] === 'search')[1], { query: 'bees', chat_id: 'chat 1', viewer_id: SERA, k: 3 });
    assert.equal(out, '[memory m_1] Mara fears bees\n[message msg_2] She ran.');
    assert.equal(recallBody({ chatId: 'c', speakerId: SERA }, { query: 'q', k: '2' }, 5).k, 2);
    assert.equal(formatResults([]), 'Nothing found.');
    await assert.rejects(recall(d, { query: ' ' }), /what to look for/);
});

test('sw2: read_session_summary returns the full summary of session n, or says there is none', async () => {
    const d = deps();
    d.sidecar.sessionsByChat.set('chat 1', [{ n: 1, short: 'short one', full: 'The long story of session one.' }]);
    assert.equal(await readSessionSummary(d, { n: 1 }), 'Session 1:\nThe long story of session one.');
    await assert.rejects(readSessionSummary(d, { n: 2 }), /no session 2/);
    await assert.rejects(readSessionSummary(d, { n: 0 }), /numbered 1, 2, 3/);
});

test('rv15: tools are offered only with the switches on and a speaker; recall and sessions only where the sidecar has the route', () => {
    const on = (d) => Object.fromEntries(toolDefinitions(d).map(t => [t.name, t.shouldRegister()]));
    assert.deepEqual(on(deps()), { remember: true, update_memory: true, forget_memory: true, recall: false, read_session_summary: false });
    assert.deepEqual(Object.values(on(deps({ features: ['search', 'sessions'] }))), [true, true, true, true, true]);
    for (const settings of [{ enabled: false }, { tools: false }]) {
        assert.ok(Object.values(on(deps({ settings, features: ['search', 'sessions'] }))).every(v => v === false), JSON.stringify(settings));
    }
    assert.ok(Object.values(on(deps({ speaker: null }))).every(v => v === false));
});

test('rv9a: every tool has a description, a JSON-Schema object of parameters and a message for the toast', () => {
    const defs = toolDefinitions(deps());
    assert.deepEqual(defs.map(d => d.name), ['remember', 'update_memory', 'forget_memory', 'recall', 'read_session_summary']);
    for (const def of defs) {
        assert.ok(def.description.length > 40, def.name);
        assert.equal(def.parameters.type, 'object');
        for (const required of def.parameters.required) assert.ok(def.parameters.properties[required], `${def.name}.${required}`);
        assert.equal(typeof def.formatMessage({}), 'string');
        assert.match(def.formatMessage({ text: 'a', query: 'b', id: 'c', n: 1 }), /^Chronicler: /);
    }
});

test('rv15: registerTools registers with SillyTavern when it can, and does nothing on an older SillyTavern', () => {
    const registered = [];
    assert.deepEqual(registerTools({ registerFunctionTool: (def) => registered.push(def.name) }, deps()), Object.values(TOOL_NAMES));
    assert.deepEqual(registered, Object.values(TOOL_NAMES));
    assert.deepEqual(registerTools({}, deps()), []);
});
