// Blocks -> setExtensionPrompt calls (extension/src/inject.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { KEY_PREFIX, POSITIONS, ROLES, applyPrompts, blocksToPrompts, clearPrompts, toPosition, toRole } from '../../extension/src/inject.js';

const blocks = [
    { section: 'pinned_memories', text: 'Aria is allergic to cats.', tokens: 7, position: 'before_prompt', depth: 0, role: 'system' },
    { section: 'story_summary', text: 'They met in Ravenhold.', tokens: 6, position: 'in_prompt', depth: 0, role: 'system' },
    { section: 'memory_bank', text: '', tokens: 0, position: 'in_chat', depth: 2, role: 'system' },
    { section: 'last_action', text: 'I draw my sword.', tokens: 5, position: 'in_chat', depth: 0, role: 'user' },
];

test('dc2: each non-empty block becomes one call at its position, depth and role', () => {
    const calls = blocksToPrompts(blocks);
    assert.deepEqual(calls, [
        { key: `${KEY_PREFIX}00_pinned_memories`, value: 'Aria is allergic to cats.', position: POSITIONS.before_prompt, depth: 0, scan: false, role: ROLES.system },
        { key: `${KEY_PREFIX}01_story_summary`, value: 'They met in Ravenhold.', position: POSITIONS.in_prompt, depth: 0, scan: false, role: ROLES.system },
        { key: `${KEY_PREFIX}03_last_action`, value: 'I draw my sword.', position: POSITIONS.in_chat, depth: 0, scan: false, role: ROLES.user },
    ]);
});

test('sw2: keys sort in the sidecar\'s block order (SillyTavern joins same-place prompts by sorted key)', () => {
    const many = Array.from({ length: 12 }, (_, i) => ({ section: `s${i}`, text: `t${i}`, position: 'in_prompt' }));
    const keys = blocksToPrompts(many).map(c => c.key);
    assert.deepEqual([...keys].sort(), keys);
});

test('dc2: a user override replaces position, depth and role of its section only', () => {
    const calls = blocksToPrompts(blocks, {
        story_summary: { position: 'in_chat', depth: 4, role: 'assistant' },
        pinned_memories: { position: 'default', depth: 9 },
    });
    assert.deepEqual(calls[0], { key: `${KEY_PREFIX}00_pinned_memories`, value: 'Aria is allergic to cats.', position: POSITIONS.before_prompt, depth: 0, scan: false, role: ROLES.system });
    assert.deepEqual(calls[1], { key: `${KEY_PREFIX}01_story_summary`, value: 'They met in Ravenhold.', position: POSITIONS.in_chat, depth: 4, scan: false, role: ROLES.assistant });
});

test('dc2: positions and roles may come as names or as SillyTavern numbers; unknown ones get safe defaults', () => {
    assert.equal(toPosition('IN_CHAT'), 1);
    assert.equal(toPosition(2), 2);
    assert.equal(toPosition('sideways'), POSITIONS.in_prompt);
    assert.equal(toRole('assistant'), 2);
    assert.equal(toRole(1), 1);
    assert.equal(toRole(undefined), ROLES.system);
    const [call] = blocksToPrompts([{ section: 'x', text: 'y', depth: -3 }]);
    assert.equal(call.depth, 0);
});

test('dc2: applyPrompts passes arguments in SillyTavern\'s order (scan before role) and clears stale keys', () => {
    const seen = [];
    const setExtensionPrompt = (...args) => seen.push(args);
    const first = applyPrompts(setExtensionPrompt, blocksToPrompts(blocks), []);
    assert.deepEqual(seen[2], [`${KEY_PREFIX}03_last_action`, 'I draw my sword.', 1, 0, false, 1]);
    seen.length = 0;
    const second = applyPrompts(setExtensionPrompt, blocksToPrompts([blocks[1]]), first);
    // The summary moved from index 01 to 00: its old key is cleared like the others.
    assert.deepEqual(seen, [
        [`${KEY_PREFIX}00_pinned_memories`, '', 0, 0, false, 0],
        [`${KEY_PREFIX}01_story_summary`, '', 0, 0, false, 0],
        [`${KEY_PREFIX}03_last_action`, '', 0, 0, false, 0],
        [`${KEY_PREFIX}00_story_summary`, 'They met in Ravenhold.', 0, 0, false, 0],
    ]);
    assert.deepEqual([...second], [`${KEY_PREFIX}00_story_summary`]);
});

test('dc2: clearPrompts never touches keys that are not ours', () => {
    const seen = [];
    clearPrompts((...args) => seen.push(args[0]), ['1_memory', `${KEY_PREFIX}00_x`]);
    assert.deepEqual(seen, [`${KEY_PREFIX}00_x`]);
});
