// shared_schema/ in JS: every schema compiles with Ajv (draft 2020-12) and the example fixtures are
// classified exactly as tests/test_schemas.py classifies them with Python's jsonschema.
//
// Same settings as the Python side: every file registered under its $id (relative $refs resolve
// against https://chronicler.invalid/schema/) and checked against the 2020-12 meta-schema, all
// errors collected, `format` treated as an annotation only (Python's Draft202012Validator does not
// assert formats without a checker). Ajv's "strict mode" is off: it refuses schemas that are valid
// JSON Schema (e.g. `required` inside a oneOf branch without `properties`), which Python accepts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

import Ajv2020 from 'ajv/dist/2020.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const SCHEMA_DIR = join(ROOT, 'shared_schema');
const EXAMPLES = join(SCHEMA_DIR, 'examples');
const BASE_URI = 'https://chronicler.invalid/schema/';

function readJson(path) {
    return JSON.parse(readFileSync(path, 'utf8'));
}

function loadSchemas() {
    const ajv = new Ajv2020({ allErrors: true, strict: false, validateSchema: true, validateFormats: false });
    const names = readdirSync(SCHEMA_DIR).filter(f => f.endsWith('.json')).sort();
    for (const file of names) ajv.addSchema(readJson(join(SCHEMA_DIR, file)));
    return { ajv, names: names.map(f => f.replace(/\.json$/, '')) };
}

/** [schemaName, caseFile] for every fixture of one kind ('valid' | 'invalid'). */
function cases(kind) {
    const folder = join(EXAMPLES, kind);
    if (!existsSync(folder)) return [];
    const out = [];
    for (const schema of readdirSync(folder).sort()) {
        for (const file of readdirSync(join(folder, schema)).filter(f => f.endsWith('.json')).sort()) {
            out.push([schema, join(folder, schema, file)]);
        }
    }
    return out;
}

const { ajv, names } = loadSchemas();

function validatorFor(name) {
    const validate = ajv.getSchema(`${BASE_URI}${name}.json`);
    assert.ok(validate, `no schema ${name}.json in shared_schema/`);
    return validate;
}

test('dc2: every shared schema compiles in Ajv 2020 under its $id', () => {
    assert.ok(names.length > 0);
    for (const name of names) {
        const schema = readJson(join(SCHEMA_DIR, `${name}.json`));
        assert.equal(schema.$id, `${BASE_URI}${name}.json`, name);
        assert.equal(schema.$schema, 'https://json-schema.org/draft/2020-12/schema', name);
        assert.equal(typeof validatorFor(name), 'function', name);
    }
});

test('dc2: there are valid and invalid fixtures to check', () => {
    assert.ok(cases('valid').length > 0);
    assert.ok(cases('invalid').length > 0);
});

for (const [schema, path] of cases('valid')) {
    test(`dc2: valid fixture passes ${schema}: ${path.split('/').at(-1)}`, () => {
        const validate = validatorFor(schema);
        const ok = validate(readJson(path));
        assert.ok(ok, JSON.stringify(validate.errors));
    });
}

for (const [schema, path] of cases('invalid')) {
    test(`dc2: invalid fixture fails ${schema}: ${path.split('/').at(-1)}`, () => {
        assert.equal(validatorFor(schema)(readJson(path)), false);
    });
}
