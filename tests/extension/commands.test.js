// Slash commands /remember, /recall, /session-end (extension/src/commands.js) against a fake sidecar.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
    CommandError, commandUi, recallCommand, registerCommands, rememberCommand, rememberRequest, resolveCharacter, resultsHtml,
    sessionEndCommand,
} from '../../extension/src/commands.js';
import { FakeSidecar } from './fake_sidecar.js';

const CARDS = [{ avatar: 'Seraphina.png', name: 'Seraphina' }, { avatar: 'Luke.png', name: 'Luke' }, { avatar: 'Other.png', name: 'Other' }];
const SINGLE = { chatId: 'Seraphina - 1', isGroup: false, memberIds: ['Seraphina.png'], characterId: 'Seraphina.png', characters: CARDS };
const GROUP = { chatId: 'group chat', isGroup: true, memberIds: ['Seraphina.png', 'Luke.png'], lastSpeakerId: 'Luke.png', characters: CARDS };

function deps(here = SINGLE) {
    const sidecar = new FakeSidecar();
    return { sidecar, getClient: () => sidecar, where: () => here, getSettings: () => ({ recallResults: 4 }) };
}

test('rv9b: /remember text saves an unpinned memory of the chat\'s character, as the person, with the chat', () => {
    assert.deepEqual(rememberRequest(SINGLE, {}, ' Mara likes tea '), {
        text: 'Mara likes tea', scope: 'character', character_id: 'Seraphina.png', pinned: false, actor: 'user', chat_id: 'Seraphina - 1',
    });
});

test('rv9b/rv11: /remember scope=global pin=true saves a pinned global memory (a person may pin)', () => {
    const body = rememberRequest(SINGLE, { scope: 'global', pin: 'true' }, 'The war ended in 1312.');
    assert.equal(body.scope, 'global');
    assert.equal(body.character_id, null);
    assert.equal(body.pinned, true);
    assert.equal(body.actor, 'user');
    assert.equal('turn_id' in body, false, 'a person\'s memory is not undone by a swipe');
});

test('rv5: in a group, /remember is for the last speaker unless for= names a member', () => {
    assert.equal(rememberRequest(GROUP, {}, 'x').character_id, 'Luke.png');
    assert.equal(rememberRequest(GROUP, { for: 'seraphina' }, 'x').character_id, 'Seraphina.png');
    assert.equal(resolveCharacter(GROUP, 'Other.png'), 'Other.png');
    assert.throws(() => resolveCharacter(GROUP, 'Nobody'), /No character named "Nobody"/);
    assert.throws(() => resolveCharacter({ ...GROUP, lastSpeakerId: undefined }, undefined), /say whose memory/);
});

test('rv9b: /remember refuses bad arguments with a usage sentence', () => {
    assert.throws(() => rememberRequest(SINGLE, {}, '  '), CommandError);
    assert.throws(() => rememberRequest(SINGLE, { scope: 'everyone' }, 'x'), /scope= is global or character/);
    assert.throws(() => rememberRequest(SINGLE, { pin: 'maybe' }, 'x'), /pin= takes true or false/);
    assert.throws(() => rememberRequest({ ...SINGLE, characterId: undefined }, {}, 'x'), /Open a character chat/);
});

test('rv9b: /remember returns the new id for pipes and says what was saved', async () => {
    const d = deps();
    const out = await rememberCommand(d, { pin: 'true' }, 'Seraphina guards the glade.');
    assert.equal(out.value, 'm_1');
    assert.equal(out.message, 'Saved a pinned memory of Seraphina.');
    assert.equal(d.sidecar.memories.get('m_1').pinned, true);
});

test('sw6: /recall searches everything (a person is not filtered), for this chat, and lists results', async () => {
    const d = deps();
    d.sidecar.searchResults = [{ id: 'm_1', kind: 'memory', text: 'Yuki cried in the hallway', score: 1, source_message_ids: [] }];
    const out = await recallCommand(d, 'Yuki crying');
    assert.deepEqual(d.sidecar.calls[0], ['search', { query: 'Yuki crying', k: 4, chat_id: 'Seraphina - 1' }]);
    assert.equal(out.value, '[memory] Yuki cried in the hallway');
    assert.equal(out.message, '1 found.');
    await assert.rejects(recallCommand(d, ''), /Usage: \/recall/);
});

test('sw2: /session-end closes the open chat\'s session and names its number', async () => {
    const d = deps();
    const out = await sessionEndCommand(d);
    assert.deepEqual(d.sidecar.calls[0], ['endSession', 'Seraphina - 1']);
    assert.equal(out.value, '1');
    assert.match(out.message, /Session 1 ended/);
    await assert.rejects(sessionEndCommand(deps({ ...SINGLE, chatId: undefined })), /Open a chat first/);
    const idle = deps();
    idle.sidecar.endSession = async () => ({ session: null }); // the sidecar: no session open
    assert.match((await sessionEndCommand(idle)).message, /No session is open/);
});

test('dc2: registerCommands adds /remember, /recall and /session-end with help strings and arguments', async () => {
    const added = [];
    const fromProps = (props) => ({ ...props });
    const ctx = {
        SlashCommandParser: { addCommandObject: (c) => added.push(c) },
        SlashCommand: { fromProps },
        SlashCommandArgument: { fromProps },
        SlashCommandNamedArgument: { fromProps },
        ARGUMENT_TYPE: { STRING: 'string', BOOLEAN: 'bool' },
    };
    const said = [];
    const d = deps();
    const names = registerCommands(ctx, d, { ok: (t) => said.push(['ok', t]), fail: (e) => said.push(['fail', e.message]), show: () => {} });
    assert.deepEqual(names, ['remember', 'recall', 'session-end']);  // no SillyTavern side given: no /chronicler-continue
    assert.deepEqual(added.map(c => c.name), names);
    for (const c of added) assert.ok(c.helpString.length > 30, c.name);
    assert.deepEqual(added[0].namedArgumentList.map(a => a.name), ['scope', 'pin', 'for']);
    // The callback as SillyTavern calls it: (named, unnamed) -> string.
    assert.equal(await added[0].callback({ scope: 'global' }, 'A fact'), 'm_1');
    assert.equal(await added[0].callback({ scope: 'nope' }, 'A fact'), '');
    assert.deepEqual(said, [['ok', 'Saved a global memory.'], ['fail', 'scope= is global or character, not "nope".']]);
    assert.deepEqual(registerCommands({}, d, {}), [], 'an older SillyTavern without the parser: nothing');
});

test('dc2: the commands\' toasts and the /recall popup; memory text in the popup is escaped', () => {
    const toasts = [];
    const popups = [];
    const ui = commandUi({ callGenericPopup: (...args) => popups.push(args), POPUP_TYPE: { TEXT: 7 } }, (...args) => toasts.push(args));
    ui.ok('Saved.');
    ui.fail(new CommandError('No character named "x".'));
    ui.show('Chronicler: recall', ['[memory] <b>Mara</b> & tea']);
    ui.show('Chronicler: recall', []);
    assert.deepEqual(toasts, [['success', 'Saved.'], ['error', 'No character named "x".']]);
    assert.deepEqual(popups[0], ['<h3>Chronicler: recall</h3><pre class="chronicler-recall">[memory] &lt;b&gt;Mara&lt;/b&gt; &amp; tea</pre>', 7]);
    assert.match(popups[1][0], /Nothing found\./);
    assert.equal(resultsHtml('<t>', ['a', 'b']), '<h3>&lt;t&gt;</h3><pre class="chronicler-recall">a\nb</pre>');
});
