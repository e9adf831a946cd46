// Settings defaults and cleaning (extension/src/settings.js), and the connection test's wording.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
    DEFAULTS, fetchInstallConfig, fromInstallConfig, normaliseUrl, readSettings, storeSettings, withDefaults,
} from '../../extension/src/settings.js';
import { describeConnection } from '../../extension/src/connection.js';

test('dc2: empty settings get the defaults (sidecar on 127.0.0.1:7711, 1.5 s per-turn limit)', () => {
    const s = withDefaults(undefined);
    assert.equal(s.sidecarUrl, 'http://127.0.0.1:7711');
    assert.equal(s.contextTimeoutMs, 1500);
    assert.equal(s.enabled, true);
    assert.equal(s.llmMode, 'sidecar');
    assert.deepEqual(s.injection, {});
});

test('dc2: wrong or broken stored values fall back to defaults; unknown keys survive', () => {
    const s = withDefaults({ contextTimeoutMs: -5, syncBatchSize: 2.5, llmMode: 'nonsense', enabled: 'yes', injection: null, future: 1 });
    assert.equal(s.contextTimeoutMs, DEFAULTS.contextTimeoutMs);
    assert.equal(s.syncBatchSize, DEFAULTS.syncBatchSize);
    assert.equal(s.llmMode, DEFAULTS.llmMode);
    assert.equal(s.enabled, DEFAULTS.enabled);
    assert.deepEqual(s.injection, {});
    assert.equal(s.future, 1);
});

test('dc2: sidecar URLs lose trailing slashes and a trailing /v1', () => {
    assert.equal(normaliseUrl(' http://127.0.0.1:7711/v1/ '), 'http://127.0.0.1:7711');
    assert.equal(normaliseUrl('http://localhost:9000//'), 'http://localhost:9000');
    assert.equal(withDefaults({ sidecarUrl: '   ' }).sidecarUrl, DEFAULTS.sidecarUrl);
});

test('rv17: the connection test tells a refused token apart from a sidecar that is down', () => {
    const down = describeConnection({ healthError: { status: 0, message: 'x' }, origin: 'http://127.0.0.1:8000', baseUrl: 'http://127.0.0.1:7711' });
    assert.equal(down.ok, false);
    assert.match(down.text, /No answer from http:\/\/127\.0\.0\.1:7711/);
    assert.match(down.text, /http:\/\/127\.0\.0\.1:8000/);
    const badToken = describeConnection({ health: { version: '0.1.0' }, authError: { status: 401, message: 'bad token' } });
    assert.equal(badToken.ok, false);
    assert.match(badToken.text, /token was not accepted/);
    const origin = describeConnection({ healthError: { status: 403, message: 'origin' }, origin: 'http://127.0.0.1:8000' });
    assert.match(origin.text, /CHRONICLER_ORIGINS/);
    const ok = describeConnection({ health: { version: '0.1.0', embedder: { ready: false } } });
    assert.equal(ok.ok, true);
    assert.match(ok.text, /0\.1\.0/);
    assert.match(ok.text, /still loading/);
});

test('dc2: the install config fills URL and token only while the user has set neither', () => {
    const file = { sidecarUrl: 'http://127.0.0.1:7712/v1/', token: ' abc ' };
    assert.deepEqual(fromInstallConfig(undefined, file), { sidecarUrl: 'http://127.0.0.1:7712', token: 'abc' });
    assert.deepEqual(fromInstallConfig({ enabled: true, sidecarUrl: '' }, file), { sidecarUrl: 'http://127.0.0.1:7712', token: 'abc' });
    assert.equal(fromInstallConfig({ token: 'mine' }, file), null);
    assert.equal(fromInstallConfig({ sidecarUrl: 'http://127.0.0.1:9999' }, file), null);
    assert.equal(fromInstallConfig({}, null), null);
    assert.deepEqual(fromInstallConfig({}, { sidecarUrl: 'javascript:alert(1)', token: 't' }), { token: 't' });
});

test('dc2: settings are read with defaults and a change is stored beside what was there, then saved', () => {
    let saves = 0;
    const ctx = { extensionSettings: { chronicler: { token: 't', future: 1 } }, saveSettingsDebounced: () => { saves += 1; } };
    assert.equal(readSettings(ctx).contextTimeoutMs, DEFAULTS.contextTimeoutMs);
    const { before, after } = storeSettings(ctx, { sidecarUrl: 'http://127.0.0.1:9000/' });
    assert.equal(before.sidecarUrl, DEFAULTS.sidecarUrl);
    assert.equal(after.sidecarUrl, 'http://127.0.0.1:9000');
    assert.deepEqual(ctx.extensionSettings.chronicler, { token: 't', future: 1, sidecarUrl: 'http://127.0.0.1:9000/' });
    assert.equal(saves, 1);
    const fresh = { extensionSettings: {}, saveSettingsDebounced: () => {} };
    assert.equal(storeSettings(fresh, { enabled: false }).after.enabled, false, 'a first change creates the entry');
});

test('dc2: the install config is read when served, and is null when missing, refused or not JSON', async () => {
    const asked = [];
    const serve = (response) => async (url, init) => { asked.push([String(url), init]); if (response instanceof Error) throw response; return response; };
    const file = { sidecarUrl: 'http://127.0.0.1:7711', token: 'abc' };
    assert.deepEqual(await fetchInstallConfig('http://st/x.json', serve({ ok: true, json: async () => file })), file);
    assert.deepEqual(asked[0], ['http://st/x.json', { cache: 'no-store' }], 'never a cached copy');
    assert.equal(await fetchInstallConfig('u', serve({ ok: false, json: async () => file })), null);
    assert.equal(await fetchInstallConfig('u', serve(new TypeError('Failed to fetch'))), null);
    assert.equal(await fetchInstallConfig('u', serve({ ok: true, json: async () => { throw new SyntaxError('bad'); } })), null);
});
