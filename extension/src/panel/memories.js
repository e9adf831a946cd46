// The Memories tab (DC4, RV4, RV7, RV8, RV9b, RV11, RV19): saved memories per scope, pinned first,
// quota counters, `recent` badges, archived items behind a toggle; add, edit, pin, delete, restore;
// a text filter; "delete all" in two steps. Routes: GET/POST /v1/memories, PATCH/DELETE
// /v1/memories/{id}, POST /v1/memories/delete-all.

import { autoGrow, button, charCounter, checkbox, clear, debounce, el, iconButton, messageLine, onEscape, select, setDisabled } from './dom.js';
import { openGenerate } from './drafts.js';
import { PANEL_LIMITS } from './limits.js';
import { PagedList, emptyNote } from './list.js';
import {
    describeError, filterMemories, groupByScope, parseView, quotaCounts, quotaLine, scopeKey,
    sortMemories, viewQuery, viewTarget, viewValue,
} from './memory_model.js';
import { ago, cut, plural } from './text.js';

const ACTOR_LABELS = { model: 'saved by the model', background: 'saved by deep memory' };

/**
 * @param {import('./panel.js').PanelContext} pctx
 * @param {{view?: string, filter?: string, archived?: boolean}} remembered state kept between openings
 */
export function createMemoriesTab(pctx, remembered) {
    const tab = new MemoriesTab(pctx, remembered);
    return { element: tab.element, show: (o) => tab.show(o), dispose: () => tab.list.dispose() };
}

class MemoriesTab {
    constructor(pctx, remembered) {
        this.pctx = pctx;
        this.remembered = remembered;
        this.view = parseView(remembered.view ?? defaultView(pctx));
        this.active = [];
        this.archived = [];
        this.rows = new Map(); // cache: key -> row element
        this.known = new Map();
        this.build();
    }

    build() {
        this.viewPicker = select([], { label: 'Whose memories', onChange: (v) => this.setView(parseView(v)) });
        this.viewPicker.classList.add('chronicler-view');
        this.filter = el('input', {
            class: 'text_pole chronicler-filter',
            attrs: { type: 'search', placeholder: 'Filter by text…', 'aria-label': 'Filter memories by text', value: this.remembered.filter ?? '' },
        });
        this.filter.value = this.remembered.filter ?? '';
        this.filter.addEventListener('input', debounce(() => {
            this.remembered.filter = this.filter.value;
            this.renderList();
        }, PANEL_LIMITS.filterDebounceMs));
        onEscape(this.filter, () => {
            if (!this.filter.value) return this.filter.blur();
            this.filter.value = '';
            this.remembered.filter = '';
            this.renderList();
        });
        this.archivedToggle = checkbox('Show archived', {
            checked: Boolean(this.remembered.archived),
            title: 'Show the items archived by the 100-per-scope limit instead: kept and searchable, no longer sent to the character.',
            onChange: (on) => { this.remembered.archived = on; this.renderList(); },
        });
        this.quota = el('div', { class: 'chronicler-quota', attrs: { 'aria-live': 'polite' } });
        this.addButton = button('Add', { icon: 'fa-plus', title: 'Add a memory', onClick: () => this.toggleAdd(true) });
        this.pickButton = button('Save from conversation', { icon: 'fa-list-check', title: 'Pick up to 20 chat messages and save them as pinned memories', onClick: () => this.pctx.pickMessages() });
        this.generateButton = button('Generate memories', { icon: 'fa-wand-magic-sparkles', title: 'Describe what the character should remember', onClick: () => this.generate() });
        this.deleteAllButton = button('Delete all…', { icon: 'fa-trash-can', class: 'chronicler-danger-button', onClick: () => this.deleteAll() });
        this.message = messageLine();
        this.message.classList.add('chronicler-status');
        this.addForm = this.buildAddForm();
        this.listHost = el('div', { class: 'chronicler-list', attrs: { role: 'list', 'aria-label': 'Memories' } });
        this.element = el('div', { class: 'chronicler-memories' },
            el('div', { class: 'chronicler-toolbar' }, this.viewPicker, this.filter, this.archivedToggle),
            el('div', { class: 'chronicler-toolbar chronicler-actions' }, this.quota, el('div', { class: 'chronicler-spacer' }),
                this.addButton, this.pickButton, this.generateButton, this.deleteAllButton),
            this.addForm, this.message, this.listHost);
        this.list = new PagedList(this.listHost, null, PANEL_LIMITS.pageSize);
    }

    buildAddForm() {
        const max = PANEL_LIMITS.memoryMaxChars;
        this.addText = el('textarea', { class: 'text_pole', attrs: { rows: 3, 'aria-label': 'Text of the new memory', placeholder: 'A durable fact: a name, a birthday, an allergy, a promise…' } });
        const counter = charCounter(this.addText, max);
        this.addScope = select([], { label: 'Who remembers it' });
        this.addPin = checkbox('Pin it', { title: 'Pinned memories are sent every turn, never pushed out, and only you can change them.' });
        this.addSave = button('Save memory', { icon: 'fa-check', onClick: () => this.create() });
        this.addError = messageLine('alert');
        const cancel = button('Cancel', { icon: 'fa-xmark', onClick: () => this.toggleAdd(false) });
        this.addText.addEventListener('input', () => setDisabled(this.addSave, this.addText.value.length > max || !this.addText.value.trim()));
        this.addText.addEventListener('keydown', (e) => { if (e.key === 'Enter' && e.ctrlKey) { e.preventDefault(); this.create(); } });
        const form = el('div', { class: 'chronicler-form chronicler-add', attrs: { role: 'group', 'aria-label': 'New memory', hidden: true } },
            el('div', { class: 'chronicler-field-head' }, el('b', { text: 'New memory' }), counter),
            this.addText,
            el('div', { class: 'chronicler-toolbar' }, el('span', { text: 'For' }), this.addScope, this.addPin, el('div', { class: 'chronicler-spacer' }), this.addSave, cancel),
            this.addError);
        onEscape(form, () => this.toggleAdd(false));
        setDisabled(this.addSave, true);
        counter.update();
        return form;
    }

    async show(options = {}) {
        if (options.view) this.view = options.view.scope === 'character' ? { kind: 'character', characterId: options.view.character_id } : { kind: 'global' };
        await this.load();
    }

    setView(view) {
        this.view = view;
        this.remembered.view = viewValue(view);
        this.load();
    }

    /** Scopes the pickers offer: global, the chat's members, then every other known character. */
    scopeOptions() {
        const chat = this.pctx.chat();
        const ids = [...chat.memberIds];
        for (const id of this.known.keys()) if (!ids.includes(id)) ids.push(id);
        if (this.view.kind === 'character' && !ids.includes(this.view.characterId)) ids.push(this.view.characterId);
        return ids.map((id) => [`character:${id}`, this.pctx.nameOf(id, this.known) + (chat.memberIds.includes(id) ? '' : ' (not in this chat)')]);
    }

    fillPickers() {
        const characters = this.scopeOptions();
        const view = [['global', 'Everyone (global)'], ...characters, ['all', 'All characters']];
        clear(this.viewPicker);
        for (const [v, t] of view) this.viewPicker.append(el('option', { text: t, attrs: { value: v } }));
        this.viewPicker.value = viewValue(this.view);
        const keep = this.addScope.value;
        clear(this.addScope);
        for (const [v, t] of [['global', 'Everyone (global)'], ...characters]) this.addScope.append(el('option', { text: t, attrs: { value: v } }));
        const target = viewTarget(this.view);
        this.addScope.value = keep || (target ? viewValue(target.scope === 'global' ? { kind: 'global' } : { kind: 'character', characterId: target.character_id }) : 'global');
    }

    async load() {
        this.message.show('');
        try {
            this.known = await this.pctx.characters();
            this.fillPickers();
            const client = this.pctx.client();
            const query = viewQuery(this.view);
            const [active, archived] = await Promise.all([
                client.listMemories(query),
                client.listMemories({ ...query, archived: true }),
            ]);
            this.active = sortMemories(active?.memories ?? []);
            this.archived = sortMemories(archived?.memories ?? []);
        } catch (error) {
            this.active = [];
            this.archived = [];
            this.message.show(describeError(error), 'error');
        }
        this.renderQuota();
        this.renderList();
        const single = this.view.kind !== 'all';
        setDisabled(this.deleteAllButton, !single);
        this.deleteAllButton.title = single ? 'Delete every unpinned memory of this scope (pinned ones need a second confirmation)' : 'Choose one scope to delete all of its memories';
        setDisabled(this.pickButton, !this.pctx.chat().chatId);
    }

    counts() {
        return quotaCounts(this.active, this.archived);
    }

    renderQuota() {
        const counts = this.counts();
        if (this.view.kind === 'all') {
            const pinned = this.active.filter((m) => m.pinned).length;
            this.quota.textContent = `${plural(this.active.length, 'memory', 'memories')} (${pinned} pinned) in ${plural(counts.size, 'character', 'characters')}`;
            return;
        }
        const key = this.view.kind === 'global' ? 'global' : `character:${this.view.characterId}`;
        const line = quotaLine(counts.get(key));
        this.quota.textContent = line.text;
        this.quota.classList.toggle('full', line.pinnedFull);
    }

    renderList() {
        this.archivedToggle.querySelector('span').textContent = `Show archived (${this.archived.length})`;
        if (this.remembered.archived) return this.renderArchived();
        const shown = filterMemories(this.active, this.filter.value);
        const items = [];
        const grouped = this.view.kind === 'all';
        const counts = this.counts();
        if (grouped) {
            for (const group of groupByScope(shown)) {
                items.push({ header: this.groupTitle(group.key, counts.get(group.key)) });
                items.push(...group.items.map((m) => ({ memory: m })));
            }
        } else {
            items.push(...shown.map((m) => ({ memory: m })));
        }
        if (!shown.length) {
            items.push({ note: this.active.length ? 'No memory matches the filter.' : 'No memories here yet. Add one, save some from the conversation, or let the characters save them as you play.' });
        }
        this.list.set(items, (item) => this.renderItem(item, grouped));
    }

    /** The archived items instead of the active ones (RV8 overflow: kept, restorable). */
    renderArchived() {
        const archived = filterMemories(this.archived, this.filter.value);
        const items = [{ header: `Archived (${archived.length}): kept and searchable, no longer sent to the character. Restore one to use it again.` }];
        items.push(...archived.map((m) => ({ memory: m })));
        if (!archived.length) items.push({ note: this.archived.length ? 'No archived memory matches the filter.' : 'Nothing is archived: items are archived only when a scope goes past 100 unpinned memories.' });
        this.list.set(items, (item) => this.renderItem(item, this.view.kind === 'all'));
    }

    groupTitle(key, count) {
        const id = key.startsWith('character:') ? key.slice(10) : null;
        return `${this.pctx.nameOf(id, this.known)} · ${quotaLine(count).text}`;
    }

    renderItem(item, grouped) {
        if (item.header) return el('h4', { class: 'chronicler-group', attrs: { role: 'presentation' }, text: item.header });
        if (item.note) return emptyNote(item.note);
        const m = item.memory;
        const key = `${m.id}:${m.version}:${m.archived}:${grouped}`;
        if (!this.rows.has(key)) this.rows.set(key, this.row(m, grouped));
        return this.rows.get(key);
    }

    row(m, grouped) {
        const text = el('p', { class: 'chronicler-memory-text', text: m.text });
        const badges = el('div', { class: 'chronicler-meta' });
        if (m.pinned) badges.append(el('span', { class: 'chronicler-badge pinned', text: 'pinned' }));
        if (m.recent && !m.archived) badges.append(el('span', { class: 'chronicler-badge recent', text: 'recent', attrs: { title: 'Updated in the last 7 days' } }));
        if (m.archived) badges.append(el('span', { class: 'chronicler-badge archived', text: 'archived' }));
        if (ACTOR_LABELS[m.actor]) badges.append(el('span', { class: 'chronicler-badge', text: ACTOR_LABELS[m.actor] }));
        if (grouped || m.archived) badges.append(el('span', { text: this.pctx.nameOf(m.character_id, this.known) }));
        badges.append(el('span', { class: 'chronicler-when', text: ago(m.updated_at), attrs: { title: m.updated_at } }));
        const actions = el('div', { class: 'chronicler-row-actions' });
        if (m.archived) {
            actions.append(button('Restore', { icon: 'fa-rotate-left', title: 'Send it to the character again', onClick: () => this.patch(m, { archived: false }, 'Restored.') }));
        } else {
            actions.append(iconButton('fa-pen', 'Edit memory', () => row.edit()));
            const pin = iconButton('fa-thumbtack', m.pinned ? 'Unpin memory' : 'Pin memory',
                () => this.patch(m, { pinned: !m.pinned }, m.pinned ? 'Unpinned.' : 'Pinned.'), m.pinned ? 'toggled' : '');
            pin.setAttribute('aria-pressed', String(m.pinned));
            actions.append(pin);
        }
        actions.append(iconButton('fa-trash-can', 'Delete memory', () => this.remove(m)));
        badges.append(actions);
        const main = el('div', { class: 'chronicler-row-main' }, text, badges);
        const row = el('div', {
            class: `chronicler-memory${m.pinned ? ' pinned' : ''}${m.archived ? ' archived' : ''}`,
            attrs: { role: 'listitem', 'data-id': m.id },
        }, main);
        row.edit = (prefill) => this.edit(main, m, prefill);
        return row;
    }

    edit(main, m, prefill) {
        const max = PANEL_LIMITS.memoryMaxChars;
        const box = el('textarea', { class: 'text_pole', attrs: { rows: 3, 'aria-label': 'Edit memory text' } });
        box.value = prefill ?? m.text;
        autoGrow(box, 8);
        const counter = charCounter(box, max);
        const error = messageLine('alert');
        const done = () => { editor.replaceWith(main); main.querySelector('[aria-label="Edit memory"]')?.focus(); };
        const save = button('Save', { icon: 'fa-check', onClick: async () => {
            if (box.value.length > max || !box.value.trim()) return error.show(`A memory holds 1 to ${max} characters.`, 'error');
            setDisabled(save, true);
            try {
                await this.pctx.client().patchMemory(m.id, { text: box.value, actor: 'user', version: m.version });
                this.message.show('Saved.', 'ok');
                await this.load();
            } catch (e) {
                setDisabled(save, false);
                if (e.code === 'version_conflict') return this.afterConflict(m.id, box.value);
                error.show(describeError(e), 'error');
            }
        } });
        const cancel = button('Cancel', { icon: 'fa-xmark', onClick: done });
        box.addEventListener('keydown', (e) => { if (e.key === 'Enter' && e.ctrlKey) { e.preventDefault(); save.click(); } });
        const editor = el('div', { class: 'chronicler-row-main chronicler-form chronicler-editor' }, box,
            el('div', { class: 'chronicler-toolbar' }, counter, el('div', { class: 'chronicler-spacer' }), save, cancel), error);
        onEscape(editor, done);
        main.replaceWith(editor);
        box.focus();
    }

    async afterConflict(id, text) {
        await this.load();
        this.message.show(describeError({ code: 'version_conflict' }), 'warn');
        const fresh = this.listHost.querySelector(`[data-id="${CSS.escape(id)}"]`);
        fresh?.edit?.(text);
    }

    toggleAdd(open) {
        this.addForm.hidden = !open;
        this.addError.show('');
        if (open) this.addText.focus();
        else this.addButton.focus();
    }

    async create() {
        const text = this.addText.value;
        if (!text.trim() || text.length > PANEL_LIMITS.memoryMaxChars) return;
        const target = parseView(this.addScope.value);
        const body = { text, scope: target.kind === 'global' ? 'global' : 'character', pinned: this.addPin.input.checked, actor: 'user' };
        if (target.kind === 'character') body.character_id = target.characterId;
        setDisabled(this.addSave, true);
        try {
            const answer = await this.pctx.client().createMemory(body);
            const archived = answer?.archived_ids?.length ?? 0;
            this.addText.value = '';
            this.addText.dispatchEvent(new Event('input'));
            this.addForm.hidden = true;
            if (viewValue(this.view) !== this.addScope.value && this.view.kind !== 'all') this.view = target;
            await this.load();
            this.message.show(archived
                ? `Saved. The oldest unpinned memory was archived to stay within ${PANEL_LIMITS.unpinnedPerScope} (see Show archived).`
                : 'Saved.', 'ok');
            this.addButton.focus();
        } catch (error) {
            setDisabled(this.addSave, false);
            this.addError.show(describeError(error), 'error');
        }
    }

    async patch(m, change, done) {
        try {
            const answer = await this.pctx.client().patchMemory(m.id, { ...change, actor: 'user' });
            const archived = answer?.archived_ids?.length ?? 0;
            await this.load();
            this.message.show(archived ? `${done} ${plural(archived, 'older memory was', 'older memories were')} archived to stay within the limit.` : done, 'ok');
            this.listHost.querySelector(`[data-id="${CSS.escape(m.id)}"] .menu_button`)?.focus();
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }

    async remove(m) {
        const ok = await this.pctx.confirm(m.pinned ? 'Delete this pinned memory?' : 'Delete this memory?',
            [`“${cut(m.text, 160)}”`, 'This cannot be undone.'], { ok: 'Delete', danger: true });
        if (!ok) return;
        try {
            await this.pctx.client().deleteMemory(m.id, 'user');
            await this.load();
            this.message.show('Deleted.', 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }

    /** RV19: the first confirmation removes unpinned items only; pinned ones need a second, separate one. */
    async deleteAll() {
        const target = viewTarget(this.view);
        if (!target) return;
        const who = this.view.kind === 'global' ? 'everyone (global)' : this.pctx.nameOf(target.character_id, this.known);
        const count = quotaCounts(this.active, this.archived).get(scopeKey(target)) ?? { unpinned: 0, pinned: 0, archived: 0 };
        const unpinned = count.unpinned + count.archived;
        const first = await this.pctx.confirm(`Delete all unpinned memories of ${who}?`, [
            `${plural(unpinned, 'unpinned memory', 'unpinned memories')}${count.archived ? ` (${count.archived} of them archived)` : ''} will be deleted for good.`,
            count.pinned ? `Pinned memories are kept; you will be asked about them separately.` : 'There are no pinned memories in this scope.',
        ], { ok: 'Delete unpinned', danger: true });
        if (!first) return;
        const client = this.pctx.client();
        let answer;
        try {
            answer = await client.deleteAllMemories({ ...target, actor: 'user' });
        } catch (error) {
            return this.message.show(describeError(error), 'error');
        }
        const remaining = answer?.pinned_remaining ?? 0;
        await this.load();
        this.message.show(`Deleted ${plural(answer?.deleted ?? 0, 'memory', 'memories')}. ${remaining ? `${plural(remaining, 'pinned memory remains', 'pinned memories remain')}.` : 'No pinned memories remain.'}`, 'ok');
        if (!remaining) return;
        const second = await this.pctx.confirm(`Also delete the ${plural(remaining, 'pinned memory', 'pinned memories')} of ${who}?`, [
            'These are moments you marked yourself and protected from the AI.',
            'Deleting them cannot be undone.',
        ], { ok: `Delete ${plural(remaining, 'pinned memory', 'pinned memories')}`, cancel: 'Keep them', danger: true });
        if (!second) {
            this.message.show(`Deleted the unpinned memories; kept ${plural(remaining, 'pinned memory', 'pinned memories')}.`, 'ok');
            return;
        }
        try {
            const again = await client.deleteAllMemories({ ...target, include_pinned: true, actor: 'user' });
            await this.load();
            this.message.show(`Deleted ${plural(again?.deleted ?? 0, 'pinned memory', 'pinned memories')} as well. This scope is empty.`, 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }

    async generate() {
        const target = viewTarget(this.view) ?? { scope: 'global', character_id: null };
        await openGenerate(this.pctx, { target, known: this.known, scopes: this.scopeOptions(), onSaved: (t) => this.show({ view: t }) });
    }
}

function defaultView(pctx) {
    const chat = pctx.chat();
    return !chat.isGroup && chat.memberIds.length === 1 ? `character:${chat.memberIds[0]}` : 'global';
}
