// Pure rules of "save from conversation" (RV9d) and "generate memories" (RV9c): picking messages,
// raw-text drafts, and the review state.

import { PANEL_LIMITS } from './limits.js';
import { cut, plural, squash } from './text.js';

/** Messages picked in the chat, at most `limit` (RV9d: 20); a pick past the limit is refused. */
export class SelectionSet {
    constructor(limit = PANEL_LIMITS.maxSelected) {
        this.limit = limit;
        /** @type {Set<number>} chat indexes */
        this.picked = new Set();
    }

    get size() { return this.picked.size; }

    has(index) { return this.picked.has(index); }

    /**
     * Pick or unpick one message.
     * @returns {{selected: boolean, refused: boolean, message: string}}
     */
    toggle(index) {
        if (this.picked.has(index)) {
            this.picked.delete(index);
            return { selected: false, refused: false, message: '' };
        }
        if (this.picked.size >= this.limit) {
            return { selected: false, refused: true, message: limitMessage(this.limit) };
        }
        this.picked.add(index);
        return { selected: true, refused: false, message: '' };
    }

    /** The picked indexes in chat order. */
    indexes() {
        return [...this.picked].sort((a, b) => a - b);
    }

    clear() { this.picked.clear(); }
}

export function limitMessage(limit) {
    return `You can pick at most ${limit} messages. Unpick one to choose another.`;
}

/**
 * Split `n` consecutive items into at most `parts` runs of near-equal size.
 * @returns {number[]} run lengths
 */
export function runLengths(n, parts) {
    if (n <= 0) return [];
    const k = Math.min(n, Math.max(1, parts));
    const base = Math.floor(n / k);
    return Array.from({ length: k }, (_, i) => base + (i < n % k ? 1 : 0));
}

/**
 * Fit lines into `max` characters joined by newlines: short lines stay whole, long ones share
 * what is left fairly (each cut at a word with an ellipsis).
 * @param {string[]} lines
 * @param {number} max
 */
export function fitLines(lines, max) {
    const joined = lines.join('\n');
    if (joined.length <= max) return joined;
    let room = max - (lines.length - 1);
    const out = new Array(lines.length);
    const order = lines.map((line, i) => [line.length, i]).sort((a, b) => a[0] - b[0]);
    order.forEach(([length, i], done) => {
        const share = Math.floor(room / (lines.length - done));
        out[i] = length <= share ? lines[i] : cut(lines[i], Math.max(1, share));
        room -= out[i].length;
    });
    return out.join('\n');
}

/**
 * "Keep raw text" (RV9d): drafts are the picked messages' own words, `Name: text`, each draft at
 * most `maxChars`. More messages than `maxDrafts` are grouped into consecutive runs, one draft
 * per run, so every picked message is in some draft.
 * @param {Array<{id: string, name: string, text: string}>} messages in chat order
 * @returns {Array<{text: string, sourceMessageIds: string[]}>}
 */
export function rawDrafts(messages, { maxDrafts = PANEL_LIMITS.maxDrafts, maxChars = PANEL_LIMITS.memoryMaxChars } = {}) {
    const usable = messages.filter((m) => squash(m.text));
    const drafts = [];
    let at = 0;
    for (const length of runLengths(usable.length, maxDrafts)) {
        const run = usable.slice(at, at + length);
        at += length;
        const lines = run.map((m) => (m.name ? `${squash(m.name)}: ${squash(m.text)}` : squash(m.text)));
        drafts.push({ text: fitLines(lines, maxChars), sourceMessageIds: run.map((m) => m.id) });
    }
    return drafts;
}

/**
 * The review of drafts before saving: which are kept, their edited texts, what was saved.
 */
export class DraftReview {
    /**
     * @param {Array<{text: string, sourceMessageIds?: string[]}>} drafts
     */
    constructor(drafts, { maxDrafts = PANEL_LIMITS.maxDrafts, maxChars = PANEL_LIMITS.memoryMaxChars } = {}) {
        this.maxChars = maxChars;
        this.overflow = Math.max(0, drafts.length - maxDrafts);
        this.items = drafts.slice(0, maxDrafts).map((d, key) => ({
            key,
            text: String(d.text ?? '').slice(0, maxChars),
            keep: true,
            sourceMessageIds: [...(d.sourceMessageIds ?? d.source_message_ids ?? [])],
            saved: false,
            error: '',
        }));
    }

    item(key) { return this.items.find((i) => i.key === key); }

    setText(key, text) { this.item(key).text = String(text); }

    setKeep(key, keep) { this.item(key).keep = Boolean(keep); }

    /** Drafts to save now: kept and not saved yet. */
    chosen() { return this.items.filter((i) => i.keep && !i.saved); }

    /**
     * What stops saving, as sentences (empty: ready).
     * @param {number} room how many more pinned memories the target scope takes (RV8)
     * @param {string} who the scope's name
     */
    problems(room = Infinity, who = 'This scope') {
        const chosen = this.chosen();
        const out = [];
        if (!chosen.length) out.push('Tick at least one draft to save.');
        chosen.forEach((i) => {
            if (!i.text.trim()) out.push(`Draft ${i.key + 1} is empty.`);
            if (i.text.length > this.maxChars) out.push(`Draft ${i.key + 1} is longer than ${this.maxChars} characters.`);
        });
        if (chosen.length > room) {
            out.push(room === 0
                ? `${who} already has the most pinned memories allowed. Unpin or delete one first.`
                : `${who} has room for ${plural(room, 'more pinned memory', 'more pinned memories')}; untick ${plural(chosen.length - room, 'draft', 'drafts')}.`);
        }
        return out;
    }

    markSaved(key) { Object.assign(this.item(key), { saved: true, error: '' }); }

    markFailed(key, error) { this.item(key).error = String(error); }

    /** Every kept draft is saved. */
    get done() { return this.items.every((i) => !i.keep || i.saved); }
}
