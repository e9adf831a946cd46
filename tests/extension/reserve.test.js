// SillyTavern's own standing prompt comes out of the sidecar's budget (extension/src/reserve.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { TightBudgetNotice, cachedCounter, roughTokens, sidecarBudget, standingText, withDeadline } from '../../extension/src/reserve.js';

const card = {
    system: 'Be Seraphina.', description: 'A guardian of the glade.', personality: 'Kind.',
    scenario: 'The forest.', persona: 'A traveller.', mesExamples: '<START>', jailbreak: '', charDepthPrompt: '  ',
    firstMessage: 'Not in every prompt: only the greeting.',
};

test('qs1: the standing text holds the card fields sent every turn and the main prompt, nothing else', () => {
    const ctx = {
        getCharacterCardFields: () => card,
        chatCompletionSettings: { prompts: [{ identifier: 'main', content: 'Write the next reply.' }, { identifier: 'nsfw', content: 'x' }] },
    };
    const text = standingText(ctx);
    for (const part of ['Be Seraphina.', 'A guardian of the glade.', 'Kind.', 'The forest.', 'A traveller.', '<START>', 'Write the next reply.']) {
        assert.ok(text.includes(part), part);
    }
    assert.ok(!text.includes('only the greeting'));
    assert.equal(text.split('\n').length, 7, 'empty and blank fields are left out');
});

test('qs1: without card fields (an old SillyTavern, or a throwing getter) the standing text is empty', () => {
    assert.equal(standingText({}), '');
    assert.equal(standingText({ getCharacterCardFields: () => { throw new Error('no character'); } }), '');
});

test('qs1: the budget leaves the standing prompt and the overhead, never below zero', () => {
    assert.equal(sidecarBudget(1748.9, 900, 100), 748);
    assert.equal(sidecarBudget(500, 900, 100), 0);
    assert.equal(sidecarBudget('x', 10, 10), 0);
    assert.equal(sidecarBudget(1000, -5, -5), 1000);
});

test('a text is counted once; a new text is counted again', async () => {
    const calls = [];
    const count = cachedCounter(text => { calls.push(text); return text.length; }, 1000);
    assert.equal(await count('abcd'), 4);
    assert.equal(await count('abcd'), 4);
    assert.equal(await count('abcdef'), 6);
    assert.deepEqual(calls, ['abcd', 'abcdef']);
});

test('a tokenizer that fails or is too slow gives a rough count, and is asked again next time', async () => {
    let calls = 0;
    const slow = cachedCounter(() => { calls += 1; return new Promise(resolve => setTimeout(() => resolve(1), 200)); }, 20);
    assert.equal(await slow('a'.repeat(30)), roughTokens('a'.repeat(30)));
    assert.equal(await slow('a'.repeat(30)), 10);
    assert.equal(calls, 2, 'the rough count was not kept');
    const failing = cachedCounter(() => { throw new Error('no tokenizer'); }, 20);
    assert.equal(await failing('abcdef'), 2);
});

test('withDeadline: the value in time, the fallback after the deadline or on rejection', async () => {
    assert.equal(await withDeadline(Promise.resolve(5), 50, 0), 5);
    assert.equal(await withDeadline(new Promise(resolve => setTimeout(() => resolve(5), 100)), 10, 0), 0);
    assert.equal(await withDeadline(Promise.reject(new Error('x')), 50, 7), 7);
});

test('qs1: a budget below the minimum is told once per chat, and again only after it recovered', () => {
    const notice = new TightBudgetNotice();
    const tight = { contextSize: 1200, standing: 1000, budget: 100, minimum: 400 };
    const first = notice.check('chat-a', tight);
    assert.match(first, /only 100 tokens/);
    assert.match(first, /about 1000 of the model's 1200-token context/);
    assert.equal(notice.check('chat-a', tight), null, 'not on every turn');
    assert.ok(notice.check('chat-b', tight), 'another chat is news');
    assert.equal(notice.check('chat-a', { ...tight, budget: 400 }), null, 'enough again');
    assert.ok(notice.check('chat-a', tight), 'tight again after it recovered');
    assert.equal(new TightBudgetNotice().check('c', { ...tight, minimum: 0 }), null, 'minimum 0 never warns');
});
