// What the Lore tab shows of lore grown from play (SW7), as pure functions: a grown entry's
// sources, a pending proposal in words, and entries as a SillyTavern World Info file.

import { plural } from './text.js';

const KIND_LABELS = { place: 'place', faction: 'faction', item: 'item', creature: 'creature', custom: 'custom', rule: 'rule of the world' };
const WAITS = { review: 'waits for your review', protected: 'waits for you: the entry is yours, imported or locked' };
const REVIEWS = { source_edited: 'a message it rests on was edited', source_deleted: 'a message it rests on was deleted', source_rolled_back: 'a turn it rests on was rolled back' };

/** The choices of `lore_growth_review` (SW7): what happens to lore a model proposes from play. */
export const REVIEW_MODES = Object.freeze([['apply', 'added at once'], ['review', 'kept for my review']]);

/** What the chosen mode means, in one sentence for the message line. */
export function reviewModeNote(mode) {
    return mode === 'review'
        ? 'New lore from play now waits here for you: nothing reaches the prompt until you accept it.'
        : 'New lore from play is now added at once; entries you wrote, imported or locked still wait for you.';
}

/** "Grown from play: 2 messages (a1, b7)" for an entry with sources; '' otherwise. */
export function grownLabel(entry) {
    const sources = entry?.sources ?? [];
    if (!sources.length) return '';
    const shown = sources.slice(0, 3).join(', ') + (sources.length > 3 ? ', …' : '');
    return `Grown from play: ${plural(sources.length, 'message', 'messages')} (${shown})`;
}

/** Why an entry waits for a look ("Check it: a message it rests on was edited"), or ''. */
export function reviewLabel(entry) {
    return entry?.review ? `Check it: ${REVIEWS[entry.review] ?? entry.review}` : '';
}

/**
 * A pending proposal in one line: "New place: Veyra — waits for your review" or
 * "Update of “Veyra” — waits for you: …".
 * @param {{lore_id: string|null, kind: string, title: string, reason: string}} proposal
 * @param {Array<{id: string, title: string}>} entries
 */
export function proposalLine(proposal, entries = []) {
    const target = proposal.lore_id ? entries.find((e) => e.id === proposal.lore_id) : null;
    const what = proposal.lore_id ? `Update of “${target?.title ?? proposal.title}”`
        : `New ${KIND_LABELS[proposal.kind] ?? 'entry'}: ${proposal.title}`;
    return WAITS[proposal.reason] ? `${what} — ${WAITS[proposal.reason]}` : what;
}

/**
 * Entries as a SillyTavern World Info file ({entries: {"0": {uid, key, comment, content, …}}}):
 * triggers are its keys, the title its comment, the text its content; `always` is constant,
 * a disabled entry is disabled. What an import kept of the entry's own World Info settings
 * (metadata.sillytavern) goes back in.
 */
export function toWorldInfo(entries, name = 'Chronicler lore') {
    const out = {};
    entries.forEach((entry, uid) => {
        const kept = entry?.metadata?.sillytavern && typeof entry.metadata.sillytavern === 'object' ? entry.metadata.sillytavern : {};
        out[String(uid)] = {
            keysecondary: [], selective: true, selectiveLogic: 0, order: 100, position: 0, probability: 100, useProbability: true, depth: 4,
            ...kept,
            uid, key: [...(entry.triggers ?? [])], comment: entry.title ?? '', content: entry.text ?? '',
            constant: Boolean(entry.always), disable: entry.enabled === false, displayIndex: uid,
        };
    });
    return { name, entries: out };
}
