// The two dialogs that turn drafts into pinned memories: "generate memories" (RV9c: a person's
// description, never the chat) and the review of drafts (RV9c, RV9d: up to 5, editable, saved
// pinned). Routes: POST /v1/memories/drafts, GET /v1/memories (pinned count), POST /v1/memories.

import { autoGrow, charCounter, checkbox, clear, el, messageLine, newId, select } from './dom.js';
import { DraftReview } from './drafts_model.js';
import { PANEL_LIMITS } from './limits.js';
import { describeError, parseView, quotaLine } from './memory_model.js';
import { plural } from './text.js';

function scopeChoices(pctx, known, extra = []) {
    const chat = pctx.chat();
    const ids = [...chat.memberIds];
    for (const id of [...(known?.keys?.() ?? []), ...extra]) if (id && !ids.includes(id)) ids.push(id);
    return [['global', 'Everyone (global)'], ...ids.map((id) => [`character:${id}`, pctx.nameOf(id, known)])];
}

function targetOf(value) {
    const view = parseView(value);
    return view.kind === 'character' ? { scope: 'character', character_id: view.characterId } : { scope: 'global', character_id: null };
}

function valueOf(target) {
    return target?.scope === 'character' ? `character:${target.character_id}` : 'global';
}

/**
 * "Generate memories" (RV9c): ask "What should the character remember?", get drafts, review them.
 * @param {import('./panel.js').PanelContext} pctx
 */
export async function openGenerate(pctx, { target, known, onSaved } = {}) {
    const c = pctx.st();
    const max = PANEL_LIMITS.descriptionMaxChars;
    const boxId = newId('describe');
    const box = el('textarea', { class: 'text_pole', attrs: { id: boxId, rows: 7, placeholder: 'For example: I am Ann, a beekeeper from the valley. I hate being called Annie. My sister Lise is missing since the flood.' } });
    const counter = charCounter(box, max);
    const who = select(scopeChoices(pctx, known, [target?.character_id]), { value: valueOf(target), label: 'Whose memories' });
    const error = messageLine('alert');
    const content = el('div', { class: 'chronicler-dialog' },
        el('h3', { text: 'Generate memories' }),
        el('div', { class: 'chronicler-field-head' }, el('label', { attrs: { for: boxId }, text: 'What should the character remember?' }), counter),
        box,
        el('div', { class: 'chronicler-toolbar' }, el('span', { text: 'For' }), who),
        el('p', { class: 'chronicler-hint', text: 'Only what you write here is used: the chat is not read. You review the drafts before anything is saved.' }),
        error);
    let answer = null;
    const popup = new c.Popup(content, c.POPUP_TYPE.TEXT, '', {
        okButton: 'Draft memories', cancelButton: 'Cancel', leftAlign: true, wider: true,
        onClosing: async (p) => {
            if (p.result !== c.POPUP_RESULT.AFFIRMATIVE) return true;
            const text = box.value.trim();
            if (!text) { error.show('Write what the character should remember first.', 'error'); return false; }
            if (box.value.length > max) { error.show(`The description holds at most ${max} characters.`, 'error'); return false; }
            error.show('Drafting…', 'info');
            p.okButton.classList.add('disabled');
            try {
                answer = await pctx.client().memoryDrafts({ mode: 'description', description: text, character_id: targetOf(who.value).character_id },
                    { timeoutMs: PANEL_LIMITS.draftsTimeoutMs });
                return true;
            } catch (e) {
                error.show(describeError(e), 'error');
                return false;
            } finally {
                p.okButton.classList.remove('disabled');
            }
        },
    });
    popup.dlg.classList.add('chronicler-popup');
    box.setAttribute('autofocus', '');
    await popup.show();
    if (!answer) return false;
    if (!answer.drafts?.length) {
        pctx.toast('warning', 'No memory could be drawn from that description.');
        return false;
    }
    return openReview(pctx, {
        drafts: answer.drafts, warning: answer.warning, target: targetOf(who.value), known,
        intro: 'From your description. Edit them and untick any you do not want.', pinChoice: true, onSaved,
    });
}

/**
 * Review up to 5 drafts and save the kept ones (pinned, RV9d).
 * @param {import('./panel.js').PanelContext} pctx
 * @param {{drafts: Array<{text: string, sourceMessageIds?: string[], source_message_ids?: string[]}>, target: {scope: string, character_id: string|null},
 *          known?: Map<string, any>, intro: string, warning?: string|null, pinChoice?: boolean, labelOf?: (id: string) => string, onSaved?: Function}} options
 * @returns {Promise<boolean>} whether anything was saved
 */
export async function openReview(pctx, options) {
    const c = pctx.st();
    const known = options.known ?? await pctx.characters();
    const review = new DraftReview(options.drafts);
    const client = pctx.client();
    const who = select(scopeChoices(pctx, known, [options.target?.character_id]), { value: valueOf(options.target), label: 'Save them for' });
    const pin = options.pinChoice ? checkbox('Pin them', { checked: true, title: 'Pinned memories are sent every turn and only you can change them.' }) : null;
    const room = el('span', { class: 'chronicler-room', attrs: { 'aria-live': 'polite' } });
    const problems = messageLine('alert');
    const list = el('div', { class: 'chronicler-drafts', attrs: { role: 'list', 'aria-label': 'Drafts' } });
    let pinned = 0;

    const pinning = () => (pin ? pin.input.checked : true);
    const roomLeft = () => (pinning() ? Math.max(0, PANEL_LIMITS.pinnedPerScope - pinned) : Infinity);
    const name = () => who.selectedOptions[0]?.textContent ?? '';
    const refreshRoom = async () => {
        const target = targetOf(who.value);
        try {
            const query = { scope: target.scope, pinned: true };
            if (target.character_id) query.character_id = target.character_id;
            pinned = ((await client.listMemories(query))?.memories ?? []).length;
        } catch { pinned = 0; }
        const line = quotaLine({ pinned, unpinned: 0 });
        room.textContent = pinning() ? `${name()} has ${pinned} of ${PANEL_LIMITS.pinnedPerScope} pinned memories: room for ${line.pinnedRoom}.` : '';
        check();
    };
    const check = () => problems.show(review.problems(roomLeft(), name()).join(' '), 'error');

    const render = () => {
        clear(list);
        for (const item of review.items) {
            const boxId = newId('draft');
            const box = el('textarea', { class: 'text_pole', attrs: { id: boxId, rows: 3, 'aria-label': `Text of draft ${item.key + 1}` } });
            box.value = item.text;
            autoGrow(box, 8);
            const counter = charCounter(box, PANEL_LIMITS.memoryMaxChars);
            box.addEventListener('input', () => { review.setText(item.key, box.value); check(); });
            const keep = checkbox(`Draft ${item.key + 1}`, { checked: item.keep, onChange: (on) => { review.setKeep(item.key, on); row.classList.toggle('dropped', !on); check(); } });
            keep.input.setAttribute('aria-label', `Keep draft ${item.key + 1}`);
            const sources = item.sourceMessageIds.length && options.labelOf
                ? el('small', { class: 'chronicler-hint', text: `from ${item.sourceMessageIds.map(options.labelOf).join(', ')}` }) : null;
            const state = item.saved ? el('span', { class: 'chronicler-badge pinned', text: 'saved' })
                : item.error ? el('span', { class: 'chronicler-error', attrs: { role: 'alert' }, text: item.error }) : null;
            const row = el('div', { class: `chronicler-draft${item.saved ? ' saved' : ''}${item.keep ? '' : ' dropped'}`, attrs: { role: 'listitem' } },
                el('div', { class: 'chronicler-field-head' }, keep, sources, counter), box, state);
            if (item.saved) { box.readOnly = true; keep.input.disabled = true; }
            list.append(row);
        }
    };

    const content = el('div', { class: 'chronicler-dialog' },
        el('h3', { text: 'Review memory drafts' }),
        el('p', { text: options.intro }),
        options.warning ? el('p', { class: 'chronicler-warning', attrs: { role: 'note' }, text: options.warning }) : null,
        review.overflow ? el('p', { class: 'chronicler-hint', text: `${plural(review.overflow, 'more draft was', 'more drafts were')} left out: at most ${PANEL_LIMITS.maxDrafts} are offered.` }) : null,
        el('div', { class: 'chronicler-toolbar' }, el('span', { text: 'Save for' }), who, pin, room),
        list, problems);
    who.addEventListener('change', refreshRoom);
    pin?.input.addEventListener('change', refreshRoom);
    render();

    let saved = 0;
    const popup = new c.Popup(content, c.POPUP_TYPE.TEXT, '', {
        okButton: options.pinChoice ? 'Save memories' : 'Save as pinned memories', cancelButton: 'Cancel', leftAlign: true, wider: true,
        allowVerticalScrolling: true,
        onClosing: async (p) => {
            if (p.result !== c.POPUP_RESULT.AFFIRMATIVE) return true;
            await refreshRoom();
            const blocking = review.problems(roomLeft(), name());
            if (blocking.length) { problems.show(blocking.join(' '), 'error'); return false; }
            p.okButton.classList.add('disabled');
            saved += await saveChosen(client, review, targetOf(who.value), pinning());
            p.okButton.classList.remove('disabled');
            if (review.done) return true;
            render();
            problems.show('Some drafts were not saved; see each one.', 'error');
            return false;
        },
    });
    popup.dlg.classList.add('chronicler-popup');
    const closed = popup.show();
    await refreshRoom();
    await closed;
    if (saved) {
        const target = targetOf(who.value);
        pctx.toast('success', `Saved ${plural(saved, pinning() ? 'pinned memory' : 'memory', pinning() ? 'pinned memories' : 'memories')} for ${name()}.`);
        options.onSaved?.(target);
    }
    return saved > 0;
}

/** Save the chosen drafts one by one; stop at a quota error (the rest would fail the same way). */
async function saveChosen(client, review, target, pinned) {
    let count = 0;
    const chosen = review.chosen();
    for (let i = 0; i < chosen.length; i++) {
        const item = chosen[i];
        const body = { text: item.text, scope: target.scope, pinned, actor: 'user' };
        if (target.character_id) body.character_id = target.character_id;
        if (item.sourceMessageIds.length) body.source_message_ids = item.sourceMessageIds;
        try {
            await client.createMemory(body);
            review.markSaved(item.key);
            count += 1;
        } catch (error) {
            review.markFailed(item.key, describeError(error));
            if (error.code === 'quota_exceeded') {
                chosen.slice(i + 1).forEach((rest) => review.markFailed(rest.key, 'Not saved: the pinned limit was reached.'));
                break;
            }
        }
    }
    return count;
}
