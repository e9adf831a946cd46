// "Continue the campaign in a new chat" (rule CP1f), over a fake client and a fake SillyTavern.
import assert from 'node:assert/strict';
import test from 'node:test';

import { continueCampaign, recapMessage, stDeps } from '../../extension/src/campaign.js';

function fakes({ recap = 'Previously: Ayla found the lantern.', campaign = 'Saga', opens = 'Seraphina - 2' } = {}) {
    const calls = [];
    const client = {
        getChat: async (id) => { calls.push(['getChat', id]); return { chat: { id, campaign_id: campaign } }; },
        campaignRecap: async (id) => { calls.push(['recap', id]); return { campaign_id: id, text: recap, parts: [] }; },
        putChat: async (id, body) => { calls.push(['putChat', id, body]); return { chat: { id, ...body } }; },
    };
    let current = 'Seraphina - 1';
    const added = [];
    const st = {
        newChat: async () => { calls.push(['newChat']); current = opens; },
        currentChatId: () => current,
        addMessage: async (m) => { added.push([current, m]); },
        now: () => 'December 2, 2026 11:20am',
    };
    const deps = { getClient: () => client, where: () => ({ chatId: 'Seraphina - 1', memberIds: ['Seraphina.png'] }), st };
    return { deps, calls, added };
}

test('cp1f: continuing starts a new chat in the campaign of the open one, opening with the recap', async () => {
    const f = fakes();
    const out = await continueCampaign(f.deps);
    assert.equal(out.value, 'Seraphina - 2');
    assert.deepEqual(f.calls, [['getChat', 'Seraphina - 1'], ['recap', 'Saga'], ['newChat'],
        ['putChat', 'Seraphina - 2', { member_ids: ['Seraphina.png'], campaign_id: 'Saga' }]]);
    assert.deepEqual(f.added, [['Seraphina - 2', recapMessage('Previously: Ayla found the lantern.', 'December 2, 2026 11:20am')]]);
    assert.equal(f.added[0][1].is_system, false, 'the model reads the recap too');
});

test('cp1f: nothing summarised yet: the new chat joins the campaign without a recap; no new chat opened is an error', async () => {
    const empty = fakes({ recap: '' });
    assert.match((await continueCampaign(empty.deps)).message, /nothing is summarised/);
    assert.deepEqual(empty.added, []);
    const stuck = fakes({ opens: 'Seraphina - 1' });
    await assert.rejects(continueCampaign(stuck.deps), /did not open a new chat/);
    assert.ok(!stuck.calls.some(c => c[0] === 'putChat'));
});

test('cp1f: stDeps runs /newchat and appends the recap to the chat SillyTavern has open then, and saves it', async () => {
    const ran = [];
    let chat = [];
    const ctx = () => ({
        chat,
        executeSlashCommandsWithOptions: async (cmd) => { ran.push(cmd); chat = []; },
        addOneMessage: (m) => ran.push(['shown', m.mes]),
        saveChat: async () => ran.push('saved'),
        getCurrentChatId: () => 'new',
    });
    const st = stDeps(ctx);
    await st.newChat();
    await st.addMessage(recapMessage('Previously: x', 'now'));
    assert.deepEqual(ran, ['/newchat', ['shown', 'Previously: x'], 'saved']);
    assert.equal(chat.length, 1);
    assert.equal(st.currentChatId(), 'new');
});

test('cp1f: /chronicler-continue is registered when SillyTavern\'s side is given, and returns the new chat\'s id', async () => {
    const { registerCommands } = await import('../../extension/src/commands.js');
    const added = [];
    const fromProps = (props) => ({ ...props });
    const ctx = { SlashCommandParser: { addCommandObject: (c) => added.push(c) }, SlashCommand: { fromProps },
        SlashCommandArgument: { fromProps }, SlashCommandNamedArgument: { fromProps }, ARGUMENT_TYPE: { STRING: 's', BOOLEAN: 'b' } };
    const f = fakes();
    const said = [];
    const names = registerCommands(ctx, { ...f.deps, getSettings: () => ({ recallResults: 5 }) },
        { ok: (t) => said.push(t), fail: (e) => said.push(e.message), show: () => {} });
    assert.equal(names.at(-1), 'chronicler-continue');
    assert.equal(await added.at(-1).callback({}, ''), 'Seraphina - 2');
    assert.match(said[0], /new chat of the campaign/);
});

test('cp1f: the recap message is not sent to the sidecar (it retells the memory; stored, it would be remembered twice)', async () => {
    const { toRecord } = await import('../../extension/src/sync/records.js');
    const recap = recapMessage('Previously: x', 'December 2, 2026 11:20am');
    recap.extra.chronicler_id = 'm1';
    assert.equal(toRecord(recap, '2026-12-02T11:20:00Z', { defaultSpeaker: 'Seraphina.png' }), null);
    delete recap.extra.chronicler_recap;
    assert.equal(toRecord(recap, '2026-12-02T11:20:00Z', { defaultSpeaker: 'Seraphina.png' }).id, 'm1');
});
