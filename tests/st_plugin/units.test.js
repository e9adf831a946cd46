// The plugin's pure parts: body depth, the body limit per route, the config file's checks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { depthOf, limitFor, handleOf, DEFAULT_LIMITS } = require('../../st_plugin/src/proxy.js');
const { readConfig } = require('../../st_plugin/src/config.js');
const pkg = require('../../st_plugin/package.json');

test('depth counts nesting like the sidecar does', () => {
    assert.equal(depthOf('text', 32), 0);
    assert.equal(depthOf({}, 32), 1);
    assert.equal(depthOf({ a: [1, { b: [] }] }, 32), 4);
    let deep = null;
    for (let i = 0; i < 100000; i++) deep = [deep];
    assert.ok(depthOf(deep, 32) > 32);  // no stack overflow, and it stops early
});

test('the body limit follows the route, as the sidecar picks it', () => {
    assert.equal(limitFor('POST', '/v1/import', DEFAULT_LIMITS), DEFAULT_LIMITS.max_import_bytes);
    assert.equal(limitFor('POST', '/v1/chats/c%201/messages', DEFAULT_LIMITS), DEFAULT_LIMITS.max_messages_body_bytes);
    assert.equal(limitFor('PUT', '/v1/chats/c1/messages', DEFAULT_LIMITS), DEFAULT_LIMITS.max_body_bytes);
    assert.equal(limitFor('POST', '/v1/memories', DEFAULT_LIMITS), DEFAULT_LIMITS.max_body_bytes);
});

test('only a SillyTavern handle names a store', () => {
    assert.equal(handleOf({ user: { profile: { handle: 'default-user' } } }), 'default-user');
    for (const bad of ['../x', 'Alice', '', 'a/b', undefined]) assert.equal(handleOf({ user: { profile: { handle: bad } } }), null);
    assert.equal(handleOf({}), null);
});

test('a missing or broken config says what to do', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'chronicler-cfg-'));
    assert.match(readConfig(dir, {}).message, /install-extension/);
    fs.writeFileSync(path.join(dir, 'plugin.config.json'), JSON.stringify({ command: 'chronicler serve', dataDir: '/x' }));
    assert.match(readConfig(dir, {}).message, /command/);
    fs.writeFileSync(path.join(dir, 'plugin.config.json'), JSON.stringify({ command: ['chronicler', 'serve'], dataDir: '/x' }));
    assert.deepEqual(readConfig(dir, {}), { command: ['chronicler', 'serve'], dataDir: '/x', logFile: path.join('/x', 'sidecar.log'), version: '' });
});

test('the plugin is CommonJS with the info SillyTavern requires', () => {
    assert.equal(pkg.type, 'commonjs');
    const plugin = require('../../st_plugin/index.js');
    for (const field of ['id', 'name', 'description']) assert.equal(typeof plugin.info[field], 'string');
    assert.equal(plugin.info.id, 'chronicler');
    assert.equal(typeof plugin.init, 'function');
    assert.equal(typeof plugin.exit, 'function');
    assert.equal(plugin.VERSION, pkg.version);
});

test('the plugin uses Node built-ins only', () => {
    const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../st_plugin');
    const files = [path.join(root, 'index.js'), ...fs.readdirSync(path.join(root, 'src')).map(f => path.join(root, 'src', f))];
    for (const file of files) {
        for (const [, name] of fs.readFileSync(file, 'utf8').matchAll(/require\('([^']+)'\)/g)) {
            assert.ok(name.startsWith('node:') || name.startsWith('./'), `${file} requires ${name}`);
        }
    }
});
