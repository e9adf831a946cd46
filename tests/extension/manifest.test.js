// The manifest SillyTavern 1.19.0 reads (public/scripts/extensions.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';

const root = new URL('../../extension/', import.meta.url);
const manifest = JSON.parse(readFileSync(new URL('manifest.json', root), 'utf8'));

// SillyTavern's own check (utils.js versionCompare): a numeric localeCompare against the version
// part of /version's agent string "SillyTavern:1.19.0:Cohee#1207".
function meetsMinimum(clientVersion, minVersion) {
    return (clientVersion || '0.0.0').localeCompare(minVersion, undefined, { numeric: true, sensitivity: 'base' }) > -1;
}

test('dc2: the manifest names Chronicler, its module, its style and its interceptor', () => {
    assert.equal(manifest.display_name, 'Chronicler');
    assert.ok(existsSync(new URL(manifest.js, root)), 'js file exists');
    assert.ok(existsSync(new URL(manifest.css, root)), 'css file exists');
    const index = readFileSync(new URL(manifest.js, root), 'utf8');
    assert.ok(index.includes(`globalThis.${manifest.generate_interceptor} =`), 'index.js defines the interceptor global');
    assert.ok(Number.isInteger(manifest.loading_order));
});

test('dc2: minimum_client_version is in the format SillyTavern compares, and 1.19.0 meets it', () => {
    assert.match(manifest.minimum_client_version, /^\d+\.\d+\.\d+$/);
    assert.equal(meetsMinimum('1.19.0', manifest.minimum_client_version), true);
    assert.equal(meetsMinimum('1.20.1', manifest.minimum_client_version), true);
    assert.equal(meetsMinimum('1.18.9', manifest.minimum_client_version), false);
    assert.equal(meetsMinimum('1.9.0', manifest.minimum_client_version), false);
});
