// The Lore tab (SW7, QS5, SW9b): lore entries and story cards with their triggers and who knows
// them; add, edit, delete; import a SillyTavern World Info file, export entries as one; the
// proposals of lore grown from play that wait for a person (accept, edit, reject), and grown
// entries marked with the messages they rest on (SW7a-SW7d).
// Routes: GET/POST /v1/lore, PATCH/DELETE /v1/lore/{id}, POST /v1/lore/import,
// GET /v1/lore/proposals, PATCH /v1/lore/proposals/{id}, POST /v1/lore/proposals/{id}/accept|reject.

import { button, checkbox, clear, debounce, el, iconButton, messageLine, newId, onEscape, select, setDisabled } from './dom.js';
import { PANEL_LIMITS } from './limits.js';
import { PagedList, emptyNote } from './list.js';
import { REVIEW_MODES, grownLabel, proposalLine, reviewLabel, reviewModeNote, toWorldInfo } from './lore_model.js';
import { describeError, routeUnavailable } from './memory_model.js';
import { cut, fold, plural } from './text.js';

const SOURCE_LABELS = { import: 'imported', job: 'written by a session job' };

/** "a, b ,, c" -> ["a", "b", "c"] (duplicates dropped, case kept). */
export function parseTriggers(text) {
    const seen = new Set();
    return String(text ?? '').split(',').map((t) => t.trim()).filter((t) => {
        const key = t.toLowerCase();
        if (!t || seen.has(key)) return false;
        seen.add(key);
        return true;
    });
}

/** Entries whose title, text or triggers contain every word of `query`. */
export function filterLore(entries, query) {
    const words = fold(query).split(' ').filter(Boolean);
    if (!words.length) return entries;
    return entries.filter((e) => {
        const hay = fold([e.title, e.text, ...(e.triggers ?? [])].join(' '));
        return words.every((w) => hay.includes(w));
    });
}

/**
 * What an import did, in one sentence (POST /v1/lore/import's `report`).
 * @param {{lore?: object[], report?: {entries?: Array<{status: string}>, not_mapped?: object[], notes?: string[]}}} answer
 */
export function importSummary(answer, fileName) {
    const entries = answer?.report?.entries ?? [];
    const imported = entries.filter((e) => e.status === 'imported').length || (answer?.lore?.length ?? 0);
    const skipped = entries.filter((e) => e.status === 'skipped').length;
    const kept = new Set([...(answer?.report?.not_mapped ?? []), ...entries.flatMap((e) => e.not_mapped ?? [])].map((n) => n.field)).size;
    const parts = [`Imported ${plural(imported, 'entry', 'entries')} from ${fileName}.`];
    if (skipped) parts.push(`${plural(skipped, 'entry was', 'entries were')} skipped.`);
    if (kept) parts.push(`${plural(kept, 'World Info setting', 'World Info settings')} we do not use ${kept === 1 ? 'was' : 'were'} kept in the entries' metadata.`);
    return parts.join(' ');
}

/**
 * @param {import('./panel.js').PanelContext} pctx
 */
export function createLoreTab(pctx, remembered) {
    const tab = new LoreTab(pctx, remembered);
    return { element: tab.element, show: () => tab.show(), dispose: () => tab.list.dispose() };
}

class LoreTab {
    constructor(pctx, remembered) {
        this.pctx = pctx;
        this.remembered = remembered;
        this.entries = [];
        this.known = new Map();
        this.filter = el('input', { class: 'text_pole chronicler-filter', attrs: { type: 'search', placeholder: 'Filter lore…', 'aria-label': 'Filter lore by text or trigger' } });
        this.filter.value = remembered.filter ?? '';
        this.filter.addEventListener('input', debounce(() => { this.remembered.filter = this.filter.value; this.render(); }, PANEL_LIMITS.filterDebounceMs));
        this.file = el('input', { attrs: { type: 'file', accept: '.json,application/json', hidden: true, 'aria-label': 'World Info file' } });
        this.file.addEventListener('change', () => this.importFile());
        this.addButton = button('Add entry', { icon: 'fa-plus', onClick: () => this.openForm(null) });
        this.importButton = button('Import World Info…', { icon: 'fa-file-import', onClick: () => this.file.click() });
        this.exportButton = button('Export as World Info', { icon: 'fa-file-export', onClick: () => this.exportFile() });
        this.message = messageLine();
        this.reviewHost = el('div', { class: 'chronicler-form chronicler-lore-review' });
        this.proposals = [];
        this.proposalHost = el('div', { class: 'chronicler-lore-proposals', attrs: { role: 'list', 'aria-label': 'Lore proposals waiting for you' } });
        this.formHost = el('div');
        this.listHost = el('div', { class: 'chronicler-list', attrs: { role: 'list', 'aria-label': 'Lore entries' } });
        this.element = el('div', { class: 'chronicler-lore' },
            el('div', { class: 'chronicler-toolbar' }, this.filter, el('div', { class: 'chronicler-spacer' }), this.addButton, this.importButton, this.exportButton, this.file),
            this.reviewHost, this.message, this.proposalHost, this.formHost, this.listHost);
        this.list = new PagedList(this.listHost, null, PANEL_LIMITS.pageSize);
    }

    async show() {
        this.message.show('');
        this.known = await this.pctx.characters();
        try {
            const answer = await this.pctx.client().listLore();
            this.entries = answer?.lore ?? answer?.entries ?? [];
            this.available = true;
        } catch (error) {
            this.entries = [];
            const missing = await routeUnavailable(error, this.pctx.client());
            this.available = !missing;
            if (missing) this.missing = 'Lore: this sidecar does not offer it yet; update Chronicler\'s sidecar.';
            else this.message.show(describeError(error), 'error');
        }
        setDisabled(this.addButton, !this.available);
        setDisabled(this.importButton, !this.available);
        setDisabled(this.exportButton, !this.available || !this.entries.length);
        await Promise.all([this.loadProposals(), this.loadReviewMode()]);
        this.render();
    }

    /** SW7: the store's `lore_growth_review` as a choice (absent on a sidecar without the setting). */
    async loadReviewMode() {
        clear(this.reviewHost);
        let mode;
        try {
            mode = (await this.pctx.client().getStoreSettings())?.settings?.lore_growth_review;
        } catch {
            mode = undefined;  // an older sidecar: no run-time settings, nothing to choose
        }
        if (!mode) return;
        const picker = select(REVIEW_MODES, { value: mode, label: 'Lore grown from play', onChange: (value) => this.setReviewMode(value, picker, mode) });
        this.reviewHost.append(el('label', { text: 'Lore grown from play: ' }), picker);
    }

    async setReviewMode(value, picker, previous) {
        try {
            await this.pctx.client().patchStoreSettings({ lore_growth_review: value });
            this.message.show(reviewModeNote(value), 'ok');
        } catch (error) {
            picker.value = previous;
            this.message.show(describeError(error), 'error');
        }
    }

    /** The pending proposals of the open chat (of every chat when none is open). */
    async loadProposals() {
        const { chatId } = this.pctx.chat();
        try {
            const answer = await this.pctx.client().listLoreProposals({ chat_id: chatId || undefined, state: 'pending' });
            this.proposals = answer?.proposals ?? [];
        } catch {
            this.proposals = [];  // an older sidecar without grown lore: nothing waits
        }
        this.renderProposals();
    }

    renderProposals() {
        clear(this.proposalHost);
        if (!this.proposals.length) return;
        this.proposalHost.append(el('b', { text: `Waiting for you: ${this.proposals.length === 1 ? '1 proposal' : `${this.proposals.length} proposals`} grown from play` }));
        for (const p of this.proposals) {
            const actions = el('div', { class: 'chronicler-row-actions' },
                button('Accept', { icon: 'fa-check', onClick: () => this.decide(p, 'accept') }),
                button('Edit…', { icon: 'fa-pen', onClick: () => this.editProposal(p) }),
                button('Reject', { icon: 'fa-xmark', onClick: () => this.decide(p, 'reject') }));
            const meta = el('div', { class: 'chronicler-meta' }, el('span', { class: 'chronicler-when', text: 'Triggers:' }),
                ...(p.triggers ?? []).map((t) => el('span', { class: 'chronicler-chip chronicler-trigger', text: t })),
                el('span', { class: 'chronicler-when', text: grownLabel(p) }), actions);
            this.proposalHost.append(el('div', { class: 'chronicler-memory chronicler-lore-proposal', attrs: { role: 'listitem', 'data-id': p.id } },
                el('div', { class: 'chronicler-row-main' }, el('b', { text: proposalLine(p, this.entries) }),
                    el('p', { class: 'chronicler-memory-text clamp', text: p.text }), meta)));
        }
    }

    async decide(proposal, how, body) {
        try {
            if (how === 'accept') await this.pctx.client().acceptLoreProposal(proposal.id, body ?? {});
            else await this.pctx.client().rejectLoreProposal(proposal.id);
            clear(this.formHost);
            await this.show();
            this.message.show(how === 'accept' ? 'Proposal accepted: the entry is written.' : 'Proposal rejected.', 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }

    editProposal(proposal) {
        clear(this.formHost);
        const title = el('input', { class: 'text_pole', attrs: { maxlength: 300, 'aria-label': 'Title' } });
        const text = el('textarea', { class: 'text_pole', attrs: { rows: 5, 'aria-label': 'Text' } });
        const triggers = el('input', { class: 'text_pole', attrs: { 'aria-label': 'Triggers, separated by commas' } });
        title.value = proposal.title;
        text.value = proposal.text;
        triggers.value = (proposal.triggers ?? []).join(', ');
        const close = () => clear(this.formHost);
        const accept = button('Accept edited', { icon: 'fa-check', onClick: () => {
            if (!title.value.trim() || !text.value.trim()) return this.message.show('A proposal needs a title and a text.', 'error');
            return this.decide(proposal, 'accept', { title: title.value.trim(), text: text.value, triggers: parseTriggers(triggers.value) });
        } });
        const form = el('div', { class: 'chronicler-form', attrs: { role: 'group', 'aria-label': 'Edit lore proposal' } },
            title, text, triggers, el('div', { class: 'chronicler-toolbar' }, el('div', { class: 'chronicler-spacer' }), accept, button('Cancel', { icon: 'fa-xmark', onClick: close })));
        onEscape(form, close);
        this.formHost.append(form);
        title.focus();
    }

    /** The entries shown (the filter applies) as a SillyTavern World Info file, downloaded. */
    exportFile() {
        const shown = filterLore(this.entries, this.filter.value);
        const blob = new Blob([JSON.stringify(toWorldInfo(shown), null, 2)], { type: 'application/json' });
        const link = el('a', { attrs: { href: URL.createObjectURL(blob), download: 'chronicler-lore.json' } });
        link.click();
        setTimeout(() => URL.revokeObjectURL(link.href), 1000);
        this.message.show(`Exported ${plural(shown.length, 'entry', 'entries')} as a World Info file.`, 'ok');
    }

    render() {
        const shown = filterLore(this.entries, this.filter.value);
        const empty = this.available === false ? this.missing
            : this.entries.length ? 'No entry matches the filter.' : 'No lore yet. Add entries, or import a SillyTavern World Info file.';
        const items = shown.length ? shown : [{ note: empty }];
        this.list.set(items, (e) => (e.note ? emptyNote(e.note) : this.row(e)));
    }

    visibility(entry) {
        const ids = entry.known_by;
        if (!Array.isArray(ids)) return 'Known by everyone';
        if (!ids.length) return 'Known by nobody yet';
        return `Known by ${ids.map((id) => this.pctx.nameOf(id, this.known)).join(', ')}`;
    }

    row(entry) {
        const triggers = el('div', { class: 'chronicler-meta' });
        if (entry.enabled === false) triggers.append(el('span', { class: 'chronicler-badge', text: 'disabled' }));
        if (entry.always) triggers.append(el('span', { class: 'chronicler-badge pinned', text: 'always' }));
        if (SOURCE_LABELS[entry.source]) triggers.append(el('span', { class: 'chronicler-badge', text: SOURCE_LABELS[entry.source] }));
        if (entry.locked) triggers.append(el('span', { class: 'chronicler-badge pinned', text: 'locked' }));
        if (reviewLabel(entry)) triggers.append(el('span', { class: 'chronicler-badge', text: reviewLabel(entry) }));
        if (grownLabel(entry)) triggers.append(el('span', { class: 'chronicler-when chronicler-lore-sources', text: grownLabel(entry) }));
        if ((entry.triggers ?? []).length) triggers.append(el('span', { class: 'chronicler-when', text: 'Triggers:' }));
        for (const t of entry.triggers ?? []) triggers.append(el('span', { class: 'chronicler-chip chronicler-trigger', text: t }));
        if (!(entry.triggers ?? []).length && !entry.always) triggers.append(el('span', { class: 'chronicler-hint', text: 'no triggers' }));
        triggers.append(el('span', { class: 'chronicler-when', text: this.visibility(entry) }));
        triggers.append(el('div', { class: 'chronicler-row-actions' },
            iconButton('fa-pen', `Edit lore entry ${entry.title}`, () => this.openForm(entry)),
            iconButton('fa-trash-can', `Delete lore entry ${entry.title}`, () => this.remove(entry))));
        return el('div', { class: 'chronicler-memory chronicler-lore-entry', attrs: { role: 'listitem', 'data-id': entry.id } },
            el('div', { class: 'chronicler-row-main' },
                el('b', { class: 'chronicler-lore-title', text: entry.title || '(untitled)' }),
                el('p', { class: 'chronicler-memory-text clamp', text: entry.text }), triggers));
    }

    openForm(entry) {
        clear(this.formHost);
        const titleId = newId('lore_title');
        const textId = newId('lore_text');
        const trigId = newId('lore_triggers');
        const title = el('input', { class: 'text_pole', attrs: { id: titleId, maxlength: 300 } });
        const text = el('textarea', { class: 'text_pole', attrs: { id: textId, rows: 5 } });
        const triggers = el('input', { class: 'text_pole', attrs: { id: trigId, placeholder: 'Words or phrases, separated by commas' } });
        const always = checkbox('Always include (no trigger needed)', { checked: Boolean(entry?.always) });
        const enabled = checkbox('Enabled', { checked: entry?.enabled !== false, title: 'A disabled entry is kept but never used.' });
        const locked = checkbox('Locked (a session job never changes it)', { checked: Boolean(entry?.locked) });
        title.value = entry?.title ?? '';
        text.value = entry?.text ?? '';
        triggers.value = (entry?.triggers ?? []).join(', ');
        let knownBy = Array.isArray(entry?.known_by) ? [...entry.known_by] : null;
        const who = el('div', { class: 'chronicler-known-by' });
        const renderWho = () => {
            clear(who).append(el('span', { text: 'Known by:' }));
            if (!knownBy) who.append(el('span', { class: 'chronicler-hint', text: 'everyone' }));
            for (const id of knownBy ?? []) {
                who.append(el('span', { class: 'chronicler-chip' }, this.pctx.nameOf(id, this.known),
                    iconButton('fa-xmark', `${this.pctx.nameOf(id, this.known)} no longer knows it`, () => {
                        knownBy = knownBy.filter((x) => x !== id);
                        if (!knownBy.length) knownBy = null;
                        renderWho();
                    })));
            }
            const others = [...this.known.keys()].filter((id) => !(knownBy ?? []).includes(id));
            if (others.length) {
                who.append(select([['', knownBy ? 'Add who knows…' : 'Only some characters know it…'], ...others.map((id) => [id, this.pctx.nameOf(id, this.known)])], {
                    label: 'Add a character who knows this entry',
                    onChange: (id) => { if (id) { knownBy = [...(knownBy ?? []), id]; renderWho(); } },
                }));
            }
        };
        renderWho();
        const error = messageLine('alert');
        const close = () => { clear(this.formHost); this.addButton.focus(); };
        const save = button(entry ? 'Save entry' : 'Add entry', { icon: 'fa-check', onClick: async () => {
            if (!title.value.trim() || !text.value.trim()) return error.show('An entry needs a title and a text.', 'error');
            const body = { title: title.value.trim(), text: text.value, triggers: parseTriggers(triggers.value), known_by: knownBy,
                always: always.input.checked, enabled: enabled.input.checked, locked: locked.input.checked };
            if (entry?.review) body.review = null;  // a person looked at it
            if (entry?.version) body.version = entry.version;
            setDisabled(save, true);
            try {
                if (entry) await this.pctx.client().patchLore(entry.id, body);
                else await this.pctx.client().createLore(body);
                close();
                await this.show();
                this.message.show(entry ? 'Entry saved.' : 'Entry added.', 'ok');
            } catch (e) {
                setDisabled(save, false);
                error.show(e?.code === 'version_conflict' ? 'This entry was changed meanwhile (by a session job or another window). Cancel and open it again.' : describeError(e), 'error');
            }
        } });
        const form = el('div', { class: 'chronicler-form', attrs: { role: 'group', 'aria-label': entry ? 'Edit lore entry' : 'New lore entry' } },
            el('div', { class: 'chronicler-grid' },
                el('label', { attrs: { for: titleId }, text: 'Title' }), title,
                el('label', { attrs: { for: trigId }, text: 'Triggers' }), triggers),
            el('label', { attrs: { for: textId }, text: 'Text' }), text,
            el('div', { class: 'chronicler-toolbar' }, always, enabled, locked), who,
            el('div', { class: 'chronicler-toolbar' }, el('div', { class: 'chronicler-spacer' }), save, button('Cancel', { icon: 'fa-xmark', onClick: close })), error);
        onEscape(form, close);
        this.formHost.append(form);
        title.focus();
    }

    async remove(entry) {
        const ok = await this.pctx.confirm('Delete this lore entry?', [`“${cut(entry.title || entry.text, 120)}”`, 'This cannot be undone.'], { ok: 'Delete', danger: true });
        if (!ok) return;
        try {
            await this.pctx.client().deleteLore(entry.id);
            await this.show();
            this.message.show('Entry deleted.', 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }

    async importFile() {
        const file = this.file.files?.[0];
        this.file.value = '';
        if (!file) return;
        let data;
        try {
            data = JSON.parse(await file.text());
        } catch {
            return this.message.show(`${file.name} is not a JSON file.`, 'error');
        }
        if (!data || typeof data !== 'object' || !('entries' in data)) {
            return this.message.show(`${file.name} does not look like a SillyTavern World Info file (it has no "entries").`, 'error');
        }
        this.message.show(`Importing ${file.name}…`, 'info');
        const name = String(data.name ?? file.name.replace(/\.json$/i, '')).slice(0, 200) || 'World Info';
        try {
            const answer = await this.pctx.client().importLore({ world_info: data, name });
            await this.show();
            this.message.show(importSummary(answer, file.name), 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }
}
