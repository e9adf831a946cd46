// The Context tab (QS1–QS8 explained): for the last generation, a bar of the budget by section
// (required / story cards / history / memory bank / free) and the report's lists — what was
// included, truncated and dropped, with the reason. Reads the report the interceptor kept
// (window.chronicler.stats.lastReport, from POST /v1/context); names items through GET /v1/memories
// and GET /v1/lore when the report cites them.

import { messageId } from '../sync/index.js';
import { DYNAMIC_SECTIONS, QUIET_REASONS, budgetSegments, entryGroups, entryName, reasonLabel, reportSections } from './budget.js';
import { append, button, clear, el } from './dom.js';
import { describeError } from './memory_model.js';
import { cut } from './text.js';

const KIND_LABELS = { included: 'Included', truncated: 'Truncated', dropped: 'Left out' };

/** A number with thousands separators. */
function n(value) {
    return Number(value || 0).toLocaleString('en-US');
}

/**
 * @param {import('./panel.js').PanelContext} pctx
 */
export function createContextTab(pctx) {
    const tab = new ContextTab(pctx);
    return { element: tab.element, show: () => tab.show() };
}

class ContextTab {
    constructor(pctx) {
        this.pctx = pctx;
        this.body = el('div', { class: 'chronicler-context-body' });
        this.element = el('div', { class: 'chronicler-context' },
            el('div', { class: 'chronicler-toolbar' },
                el('span', { class: 'chronicler-hint', text: 'What went into the prompt of the last generation, and why.' }),
                el('div', { class: 'chronicler-spacer' }),
                button('Refresh', { icon: 'fa-arrows-rotate', onClick: () => this.show() })),
            this.body);
    }

    async show() {
        const stats = this.pctx.stats();
        const report = stats.lastReport;
        clear(this.body);
        if (stats.lastError) {
            this.body.append(el('p', { class: 'chronicler-warning', attrs: { role: 'note' },
                text: `The last generation went on without Chronicler's context: ${describeError(stats.lastError)}` }));
        }
        if (!report) {
            this.body.append(el('p', { class: 'chronicler-empty', text: 'No generation with Chronicler\'s context yet. Send a message: the budget of each generation shows here.' }));
            return;
        }
        const known = await this.pctx.characters();
        const labels = await this.labels(report, known);
        append(this.body, this.summary(report, stats), this.present(report, known), this.bar(report), ...this.sections(report, labels));
    }

    summary(report, stats) {
        const { used, total } = budgetSegments(report);
        const timings = stats.timings?.items ?? [];
        const last = timings.length ? ` · assembled in ${Math.round(timings.at(-1))} ms` : '';
        const trimmed = stats.lastTrimmed ? ` · ${stats.lastTrimmed} older messages left to the summaries` : '';
        return el('p', { class: 'chronicler-context-summary' },
            el('b', { text: `${n(used)} of ${n(total)} tokens used` }),
            ` · Required is capped at ${n(report.required_cap)} (70%)${last}${trimmed}`);
    }

    /** Who was in the scene (SW1) and why: the report's `present`. */
    present(report, known) {
        const entries = Object.entries(report.present ?? {});
        if (!entries.length) return null;
        const why = { speaker: 'speaking', member: 'in the chat', present_ids: 'present', mentioned: 'mentioned' };
        return el('p', { class: 'chronicler-hint chronicler-present' },
            `Present: ${entries.map(([id, reason]) => `${this.pctx.nameOf(id, known)} (${why[reason] ?? reason})`).join(', ')}`);
    }

    bar(report) {
        const { segments, capPercent } = budgetSegments(report);
        const words = segments.map((s) => `${s.label} ${n(s.tokens)} tokens (${s.percent}%)`).join(', ');
        const bar = el('div', { class: 'chronicler-bar', attrs: { role: 'img', 'aria-label': `Budget: ${words}` } });
        for (const s of segments) {
            if (!s.width) continue;
            bar.append(el('div', { class: `chronicler-bar-part part-${s.key}`, attrs: { style: `width: ${s.width.toFixed(3)}%`, title: `${s.label}: ${n(s.tokens)} tokens (${s.percent}%)` } }));
        }
        if (capPercent !== null) bar.append(el('div', { class: 'chronicler-bar-cap', attrs: { style: `left: ${capPercent.toFixed(3)}%`, title: 'The 70% cap of Required' } }));
        const legend = el('ul', { class: 'chronicler-legend', attrs: { 'aria-hidden': 'true' } },
            ...segments.map((s) => el('li', {}, el('span', { class: `chronicler-swatch part-${s.key}` }), `${s.label} ${n(s.tokens)} (${s.percent}%)`)),
            capPercent !== null ? el('li', {}, el('span', { class: 'chronicler-swatch chronicler-swatch-cap' }), 'Cap of Required (70%)') : null);
        return el('div', { class: 'chronicler-budget' }, bar, legend);
    }

    sections(report, labels) {
        return reportSections(report).map((s) => {
            const groups = entryGroups(s.entries);
            const line = groups.map((g) => `${g.total} ${KIND_LABELS[g.kind].toLowerCase()}`).join(', ');
            const dynamic = DYNAMIC_SECTIONS.includes(s.name);
            const size = dynamic ? `${n(s.used)} of ${n(s.available)} tokens available` : `${n(s.used)} tokens`;
            const head = el('summary', {},
                el('b', { text: s.label }),
                el('span', { class: 'chronicler-when', text: ` ${size}${line ? ` · ${line}` : ''}` }));
            const loudDrops = s.entries.some((e) => e.kind !== 'included' && !QUIET_REASONS.includes(e.reason));
            const open = loudDrops || ['pinned_memories', 'memory_bank'].includes(s.name);
            const details = el('details', { class: 'chronicler-section', attrs: { open } }, head);
            for (const g of groups) {
                const list = el('ul', { class: `chronicler-entries ${g.kind}` }, ...g.shown.map((e) => el('li', {},
                    el('span', { class: 'chronicler-entry-name', text: entryName(e.id, labels) }),
                    el('span', { class: 'chronicler-entry-why', text: ` — ${reasonLabel(e.reason)}${e.tokens ? ` · ${n(e.tokens)} tokens` : ''}${e.detail ? ` · ${e.detail}` : ''}` }))));
                if (g.more) list.append(el('li', { class: 'chronicler-hint', text: `…and ${g.more} more` }));
                for (const [reason, count] of g.quiet) list.append(el('li', { class: 'chronicler-hint', text: `${count} ${reasonLabel(reason)}` }));
                details.append(el('h5', { text: `${KIND_LABELS[g.kind]} (${g.total})` }), list);
            }
            return details;
        });
    }

    /** Names for the ids a report cites: chat messages, memories, lore entries. */
    async labels(report, known) {
        const labels = new Map();
        for (const [id, character] of known ?? []) labels.set(id, character.name);
        (this.pctx.st().chat ?? []).forEach((m, i) => {
            const id = messageId(m);
            if (id) labels.set(id, `#${i} ${m.name ?? ''}: ${cut(String(m.mes ?? '').replace(/\s+/g, ' '), 70)}`);
        });
        const sections = report.sections ?? {};
        const cites = (names) => names.some((s) => ['included', 'truncated', 'dropped'].some((k) => (sections[s]?.[k] ?? []).length));
        const client = this.pctx.client();
        const jobs = [];
        if (cites(['pinned_memories', 'memory_bank'])) {
            jobs.push(client.listMemories({}).then((a) => (a?.memories ?? []).forEach((m) => labels.set(m.id, `“${cut(m.text, 90)}”`))));
        }
        if (cites(['story_cards'])) {
            jobs.push(client.listLore().then((a) => (a?.lore ?? []).forEach((e) => labels.set(e.id, e.title || cut(e.text, 60)))));
        }
        await Promise.allSettled(jobs);
        return labels;
    }
}
