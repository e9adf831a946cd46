// Which way the extension reaches the sidecar, from the install file; the plugin client's headers.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { PLUGIN_ROUTE, connectionFrom, describePath, pluginClient, versionWarning } from '../../extension/src/route.js';
import { fromCapabilities } from '../../extension/src/features.js';

test('the install file decides the way in, without a request that could answer 404', () => {
    assert.deepEqual(connectionFrom({ mode: 'plugin', route: '/api/plugins/chronicler', version: '0.1.0' }),
        { mode: 'plugin', route: PLUGIN_ROUTE, version: '0.1.0' });
    assert.deepEqual(connectionFrom({ sidecarUrl: 'http://127.0.0.1:7711', token: 't' }), { mode: 'direct' });
    assert.deepEqual(connectionFrom(null), { mode: 'direct' });
    assert.equal(connectionFrom({ mode: 'plugin', route: 'https://evil.example/x' }).route, PLUGIN_ROUTE);
});

test('the plugin client calls the page origin with the session cookie and CSRF token, never a bearer token', async () => {
    const seen = [];
    const client = pluginClient({ route: PLUGIN_ROUTE }, 'http://192.168.1.5:8000',
        () => ({ 'Content-Type': 'application/json', 'X-CSRF-Token': 'csrf-1' }), 1000);
    client.fetchImpl = async (url, init) => { seen.push({ url, init }); return new Response('{"ok":true}', { status: 200 }); };
    await client.request('POST', '/v1/memories', { body: { text: 'x' } });
    assert.equal(seen[0].url, 'http://192.168.1.5:8000/api/plugins/chronicler/v1/memories');
    assert.equal(seen[0].init.credentials, 'same-origin');
    assert.equal(seen[0].init.headers['X-CSRF-Token'], 'csrf-1');
    assert.equal(seen[0].init.headers.Authorization, undefined);
});

test('the drawer names the path', () => {
    assert.match(describePath({ mode: 'plugin', route: PLUGIN_ROUTE }, {}), /plugin/);
    assert.match(describePath({ mode: 'direct' }, { sidecarUrl: 'http://127.0.0.1:7711' }), /directly.*7711/);
});

test('versions: a warning only when known versions disagree', () => {
    assert.equal(versionWarning({ extension: '0.1.0', plugin: '0.1.0', sidecar: '0.1.0' }), null);
    assert.equal(versionWarning({ extension: '0.1.0', plugin: '0.1.0', sidecar: null }), null);
    assert.match(versionWarning({ extension: '0.1.0', plugin: '0.2.0', sidecar: '0.1.0' }), /plugin 0\.2\.0/);
});

test('features come from the capabilities in health when the sidecar lists them', () => {
    assert.deepEqual(fromCapabilities({ capabilities: ['search', 'context', 'client_jobs'] }),
        { search: true, sessions: false, jobs: true, messageIds: false, context: true, prefetch: false, earlyContext: false });
    assert.equal(fromCapabilities({ capabilities: ['context', 'context_dry_run'] }).earlyContext, true);
    assert.equal(fromCapabilities({ version: '0.0.9' }), null);
});
