// Pure arithmetic of the Context tab: the budget bar of the last generation, and the wording of
// the report's reasons (POST /v1/context `report`, produced by server_plugin/assemble.py).

/** The Required side (QS2, QS3) and the Dynamic sections (QS4), in the assembler's names. */
export const REQUIRED_SECTIONS = Object.freeze([
    'front_memory', 'last_action', 'pinned_memories', 'authors_note', 'plot_essentials',
    'instructions', 'character_sheets', 'campaign_notes', 'story_summary',
]);
export const DYNAMIC_SECTIONS = Object.freeze(['story_cards', 'history', 'memory_bank']);

/** The bar's groups, in the order they are drawn. */
export const BAR_GROUPS = Object.freeze([
    { key: 'required', label: 'Required', sections: REQUIRED_SECTIONS },
    { key: 'cards', label: 'Story cards', sections: ['story_cards'] },
    { key: 'history', label: 'History', sections: ['history'] },
    { key: 'memory_bank', label: 'Memory bank', sections: ['memory_bank'] },
]);

const SECTION_LABELS = {
    front_memory: 'Front memory', last_action: 'Last action', pinned_memories: 'Pinned memories',
    authors_note: "Author's note", plot_essentials: 'Plot essentials', instructions: 'AI instructions',
    character_sheets: 'Character sheets', campaign_notes: 'Campaign notes', story_summary: 'Story summary',
    story_cards: 'Story cards', history: 'History', memory_bank: 'Memory bank',
};

export function sectionLabel(name) {
    return SECTION_LABELS[name] ?? String(name).replace(/_/g, ' ');
}

const REASONS = {
    always_in_full: 'always in full',
    in_full: 'in full',
    newest_first: 'newest first (pinned memories alone were over the cap)',
    triggered: 'triggered',
    always: 'always included',
    fits: 'fitted',
    over_required_cap: 'cut at the 70% cap for Required',
    over_context: 'cut: larger than the whole context',
    after_cut: 'left out: comes after the cut (QS3)',
    pinned_over_cap: 'left out: pinned memories over the cap',
    no_room: 'left out: no room left',
    not_triggered: 'not triggered',
    memory_bank_off: 'left out: memory bank is off',
    duplicate: 'left out: already in the context',
    empty: 'empty',
};

/** A report reason in words. */
export function reasonLabel(reason) {
    return REASONS[reason] ?? String(reason ?? '').replace(/_/g, ' ');
}

/** What search brought into the memory bank besides saved memories (the sidecar's `kind:id`). */
const RECALLED_KINDS = {
    character_memory: 'a character memory',
    scene_summary: 'a scene summary',
    session_summary: 'a session summary',
};

/**
 * How the Context tab names a report entry: its label when one is known (a memory's text, a chat
 * message, a card's title); a recalled message by the chat message it is; other recalled items by
 * their kind; the bare id otherwise.
 * @param {string} id
 * @param {Map<string, string>} labels
 */
export function entryName(id, labels) {
    if (labels.has(id)) return labels.get(id);
    const [kind, ...rest] = String(id).split(':');
    const ref = rest.join(':');
    if (kind === 'message' && ref) return `recalled ${labels.get(ref) ?? 'an older message'}`;
    if (RECALLED_KINDS[kind] && ref) return `recalled ${RECALLED_KINDS[kind]}`;
    return String(id);
}

/**
 * Integer percentages of `values` that sum to 100 (largest remainder), 0s when the total is 0.
 * @param {number[]} values
 */
export function percentages(values) {
    const total = values.reduce((a, b) => a + b, 0);
    if (total <= 0) return values.map(() => 0);
    const raw = values.map((v) => (v * 100) / total);
    const out = raw.map(Math.floor);
    let left = 100 - out.reduce((a, b) => a + b, 0);
    const order = raw.map((r, i) => [r - Math.floor(r), i]).sort((a, b) => b[0] - a[0]);
    for (const [, i] of order) {
        if (left <= 0) break;
        out[i] += 1;
        left -= 1;
    }
    return out;
}

/**
 * The budget bar of one report: tokens per group, what is free, and widths in percent of the
 * context (a report that used more than its context is scaled to its use, never past 100%).
 * @param {{context_tokens: number, required_cap?: number, sections?: Record<string, {used?: number}>}} report
 * @returns {{total: number, used: number, segments: Array<{key: string, label: string, tokens: number, percent: number, width: number}>, capPercent: number|null}}
 */
export function budgetSegments(report) {
    const sections = report?.sections ?? {};
    const usedOf = (names) => names.reduce((sum, n) => sum + Math.max(0, Number(sections[n]?.used) || 0), 0);
    const groups = BAR_GROUPS.map((g) => ({ key: g.key, label: g.label, tokens: usedOf(g.sections) }));
    const used = groups.reduce((a, g) => a + g.tokens, 0);
    const context = Math.max(0, Number(report?.context_tokens) || 0);
    const total = Math.max(context, used);
    groups.push({ key: 'free', label: 'Free', tokens: total - used });
    const percent = percentages(groups.map((g) => g.tokens));
    const cap = Number(report?.required_cap);
    return {
        total,
        used,
        segments: groups.map((g, i) => ({ ...g, percent: percent[i], width: total ? (g.tokens * 100) / total : 0 })),
        capPercent: total && Number.isFinite(cap) && cap > 0 ? Math.min(100, (cap * 100) / total) : null,
    };
}

/**
 * The report's sections in display order with their entries, skipping sections with nothing in them.
 * @returns {Array<{name: string, label: string, allocated: number, available: number, used: number, entries: Array<{id: string, kind: 'included'|'truncated'|'dropped', reason: string, tokens: number, detail?: string}>}>}
 */
export function reportSections(report) {
    const sections = report?.sections ?? {};
    const known = [...REQUIRED_SECTIONS, ...DYNAMIC_SECTIONS];
    const names = [...known, ...Object.keys(sections).filter((n) => !known.includes(n))];
    return names.filter((n) => sections[n]).map((name) => {
        const s = sections[name];
        const entries = ['included', 'truncated', 'dropped'].flatMap((kind) => (s[kind] ?? []).map((e) => ({
            id: String(e.id), kind, reason: e.reason, tokens: Number(e.tokens) || 0, detail: e.detail,
        })));
        return { name, label: sectionLabel(name), allocated: s.allocated ?? 0, available: s.available ?? 0, used: s.used ?? 0, entries };
    }).filter((s) => s.used || s.entries.length);
}

/** Reasons that only say an item was not a candidate: counted, not listed one by one. */
export const QUIET_REASONS = Object.freeze(['not_triggered', 'empty']);

/**
 * One section's entries as the tab lists them: per kind, at most `max` shown, the rest counted;
 * quiet reasons (a card not triggered) only counted, since a world of 500 cards would drown the list.
 * @param {Array<{kind: string, reason: string}>} entries from reportSections()
 * @returns {Array<{kind: string, shown: object[], more: number, quiet: Array<[string, number]>}>}
 */
export function entryGroups(entries, max = 30) {
    return ['included', 'truncated', 'dropped'].map((kind) => {
        const all = entries.filter((e) => e.kind === kind);
        const loud = all.filter((e) => !QUIET_REASONS.includes(e.reason));
        const quiet = new Map();
        for (const e of all) if (QUIET_REASONS.includes(e.reason)) quiet.set(e.reason, (quiet.get(e.reason) ?? 0) + 1);
        return { kind, total: all.length, shown: loud.slice(0, max), more: Math.max(0, loud.length - max), quiet: [...quiet] };
    }).filter((g) => g.total);
}
