// The Summaries tab (RV3, SW2): the chat's three tiers of rolling summaries with the messages they
// cover, edit in place, rebuild, how many messages are not summarised yet; the sessions with their
// short summaries, and the full one on demand.
// Routes: GET /v1/chats/{id}/summaries, PATCH /v1/summaries/{id}, POST /v1/chats/{id}/summaries/rebuild,
// GET /v1/chats/{id}/sessions, GET /v1/chats/{id}/sessions/{n}.

import { messageId } from '../sync/index.js';
import { autoGrow, button, charCounter, clear, el, messageLine, onEscape, setDisabled } from './dom.js';
import { describeError, routeUnavailable } from './memory_model.js';
import { ago, plural } from './text.js';

export const TIERS = Object.freeze([
    ['long_term', 'Long-term', 'Four consolidated summaries merged into one.'],
    ['consolidated', 'Consolidated', 'Four recent summaries merged into one.'],
    ['recent', 'Recent', 'Chunks of messages that left the live window.'],
]);

/**
 * What a summary covers, in words: for a recent summary the range of this chat's messages it
 * covers; for a merged tier how many summaries of the tier below it merges (RV3: 4 -> 1).
 * @param {{tier: string, covers: string[]}} summary
 * @param {Map<string, number>} indexOf message id -> index in the chat
 */
export function coversLabel(summary, indexOf) {
    const ids = Array.isArray(summary?.covers) ? summary.covers : [];
    if (!ids.length) return 'Covers nothing yet';
    if (summary.tier === 'consolidated') return `Merges ${plural(ids.length, 'recent summary', 'recent summaries')}`;
    if (summary.tier === 'long_term') return `Merges ${plural(ids.length, 'consolidated summary', 'consolidated summaries')}`;
    const at = ids.map((id) => indexOf.get(id)).filter((i) => Number.isInteger(i));
    if (!at.length) return `Covers ${plural(ids.length, 'message', 'messages')} (no longer in this chat)`;
    const lo = Math.min(...at);
    const hi = Math.max(...at);
    const range = lo === hi ? `Message #${lo}` : `Messages #${lo}–#${hi}`;
    const missing = ids.length - at.length;
    return missing > 0 ? `${range} (+${missing} no longer in this chat)` : range;
}

/**
 * @param {import('./panel.js').PanelContext} pctx
 */
export function createSummariesTab(pctx) {
    const tab = new SummariesTab(pctx);
    return { element: tab.element, show: () => tab.show() };
}

class SummariesTab {
    constructor(pctx) {
        this.pctx = pctx;
        this.count = el('span', { class: 'chronicler-quota', attrs: { 'aria-live': 'polite' } });
        this.rebuild = button('Rebuild', { icon: 'fa-arrows-rotate', title: 'Write every summary of this chat again from the transcript', onClick: () => this.doRebuild() });
        this.message = messageLine();
        this.tiers = el('div', { class: 'chronicler-tiers' });
        this.sessions = el('div', { class: 'chronicler-sessions' });
        this.element = el('div', { class: 'chronicler-summaries' },
            el('div', { class: 'chronicler-toolbar' }, this.count, el('div', { class: 'chronicler-spacer' }), this.rebuild),
            this.message, this.tiers,
            el('h4', { class: 'chronicler-group', text: 'Sessions' }), this.sessions);
    }

    async show() {
        const { chatId } = this.pctx.chat();
        this.message.show('');
        clear(this.tiers);
        clear(this.sessions);
        if (!chatId) {
            this.count.textContent = '';
            setDisabled(this.rebuild, true);
            this.tiers.append(el('p', { class: 'chronicler-empty', text: 'Open a chat to see its summaries.' }));
            return;
        }
        setDisabled(this.rebuild, false);
        const client = this.pctx.client();
        const [summaries, sessions] = await Promise.allSettled([client.getSummaries(chatId), client.listSessions(chatId)]);
        if (summaries.status === 'fulfilled') this.renderTiers(summaries.value ?? {});
        else await this.fail(this.tiers, summaries.reason, 'Summaries');
        if (sessions.status === 'fulfilled') this.renderSessions(chatId, sessions.value?.sessions ?? []);
        else await this.fail(this.sessions, sessions.reason, 'Sessions');
    }

    async fail(host, error, what) {
        if (error?.code === 'chat_not_found') {
            host.append(el('p', { class: 'chronicler-empty', text: 'The sidecar has not seen this chat yet; send a message first.' }));
        } else if (await routeUnavailable(error, this.pctx.client())) {
            host.append(el('p', { class: 'chronicler-empty', text: `${what}: this sidecar does not offer them yet; update Chronicler's sidecar.` }));
            setDisabled(this.rebuild, true);
            this.count.textContent = '';
        } else {
            host.append(el('p', { class: 'chronicler-error', attrs: { role: 'alert' }, text: describeError(error) }));
        }
    }

    renderTiers(data) {
        const n = Number(data.unsummarized_count) || 0;
        const pending = Number(data.pending_count) || 0;
        this.count.textContent = (n ? `${plural(n, 'message', 'messages')} not summarised yet (the newest stay whole in the live window)` : 'Every message is summarised')
            + (pending ? ` · ${plural(pending, 'summary is', 'summaries are')} being written` : '');
        const chat = this.pctx.st().chat ?? [];
        const indexOf = new Map(chat.map((m, i) => [messageId(m), i]).filter(([id]) => id));
        const all = TIERS.flatMap(([key]) => data[key] ?? []);
        if (!all.length) {
            this.tiers.append(el('p', { class: 'chronicler-empty', text: 'No summaries yet: messages are summarised once they leave the live window.' }));
            return;
        }
        for (const [key, label, hint] of TIERS) {
            const items = data[key] ?? [];
            if (!items.length) continue;
            const section = el('section', { class: 'chronicler-tier', attrs: { 'aria-label': `${label} summaries` } },
                el('h4', { class: 'chronicler-group', text: `${label} (${items.length})`, attrs: { title: hint } }));
            for (const s of items) section.append(this.card(s, coversLabel({ tier: key, ...s }, indexOf)));
            this.tiers.append(section);
        }
    }

    card(summary, covers) {
        const pending = summary.text === null || summary.text === undefined;
        const text = pending ? el('p', { class: 'chronicler-empty', text: 'Being written by a background job…' })
            : el('p', { class: 'chronicler-summary-text', text: summary.text });
        const head = el('div', { class: 'chronicler-meta' }, el('span', { text: covers }),
            summary.edited ? el('span', { class: 'chronicler-badge recent', text: 'edited by you', attrs: { title: 'Later merges read your text; jobs never overwrite it.' } }) : null,
            summary.stale ? el('span', { class: 'chronicler-badge', text: 'outdated', attrs: { title: 'A message it covers was edited; it is being written again.' } }) : null);
        const edit = button('Edit', { icon: 'fa-pen', onClick: () => this.edit(card, text, edit, summary) });
        edit.hidden = pending;
        const quotes = (summary.quotes ?? []).length
            ? el('ul', { class: 'chronicler-quotes', attrs: { 'aria-label': 'Lines kept word for word' } },
                ...summary.quotes.map((q) => el('li', { text: `${q.speaker}: “${q.text}”` }))) : null;
        const card = el('article', { class: 'chronicler-summary', attrs: { 'data-id': summary.id } },
            el('div', { class: 'chronicler-field-head' }, head, edit), text, quotes);
        return card;
    }

    edit(card, text, editButton, summary) {
        const box = el('textarea', { class: 'text_pole', attrs: { rows: 6, 'aria-label': 'Summary text' } });
        box.value = summary.text;
        autoGrow(box, 14);
        const counter = charCounter(box, 20000);
        const error = messageLine('alert');
        const done = () => { editor.replaceWith(text); editButton.hidden = false; editButton.focus(); };
        const save = button('Save', { icon: 'fa-check', onClick: async () => {
            setDisabled(save, true);
            try {
                const body = { text: box.value };
                if (summary.version) body.version = summary.version;
                await this.pctx.client().patchSummary(summary.id, body);
                await this.show();
                this.message.show('Summary saved; later merges read your text.', 'ok');
            } catch (e) {
                setDisabled(save, false);
                error.show(e?.code === 'version_conflict' ? 'This summary was rewritten meanwhile (a background job finished). Cancel to see the new text, then edit again.' : describeError(e), 'error');
            }
        } });
        const editor = el('div', { class: 'chronicler-form' }, box,
            el('div', { class: 'chronicler-toolbar' }, counter, el('div', { class: 'chronicler-spacer' }), save, button('Cancel', { icon: 'fa-xmark', onClick: done })), error);
        onEscape(editor, done);
        text.replaceWith(editor);
        editButton.hidden = true;
        box.focus();
    }

    renderSessions(chatId, sessions) {
        if (!sessions.length) {
            this.sessions.append(el('p', { class: 'chronicler-empty', text: 'No session has ended yet. A session ends after a long pause, or when the sidecar is told so.' }));
            return;
        }
        for (const s of [...sessions].reverse()) {
            const full = el('div', { class: 'chronicler-session-full', attrs: { hidden: true } });
            const done = s.state === 'summarized';
            const open = button('Read full summary', { icon: 'fa-book', onClick: async () => {
                const expanded = open.getAttribute('aria-expanded') === 'true';
                open.setAttribute('aria-expanded', String(!expanded));
                full.hidden = expanded;
                if (expanded || full.dataset.loaded) return;
                full.textContent = 'Loading…';
                try {
                    const answer = await this.pctx.client().getSession(chatId, s.n);
                    const session = answer?.session ?? answer;
                    clear(full).append(el('p', { class: 'chronicler-summary-text', text: session?.full ?? session?.short ?? '' }));
                    const quotes = session?.quotes ?? [];
                    if (quotes.length) full.append(el('ul', { class: 'chronicler-quotes' }, ...quotes.map((q) => el('li', { text: `${q.speaker}: “${q.text}”` }))));
                    full.dataset.loaded = '1';
                } catch (error) {
                    full.textContent = describeError(error);
                }
            } });
            open.setAttribute('aria-expanded', 'false');
            open.hidden = !done;
            const when = [s.started_at, s.ended_at].filter(Boolean).map((t) => new Date(t).toLocaleString()).join(' – ');
            const state = s.state === 'open' ? 'current' : done ? '' : 'being summarised';
            const title = `Session ${s.n}${state ? ` (${state})` : ''}`;
            const count = Number.isInteger(s.message_count) ? ` · ${plural(s.message_count, 'message', 'messages')}` : '';
            this.sessions.append(el('article', { class: 'chronicler-summary chronicler-session' },
                el('div', { class: 'chronicler-field-head' },
                    el('b', { text: title }), el('span', { class: 'chronicler-when', text: `${when}${count}`, attrs: { title: ago(s.ended_at ?? s.started_at) } }), open),
                el('p', { class: 'chronicler-summary-text', text: s.short ?? (s.state === 'open' ? 'Still going: summarised when it ends.' : 'Not summarised yet.') }), full));
        }
    }

    async doRebuild() {
        const { chatId } = this.pctx.chat();
        const ok = await this.pctx.confirm('Rebuild the summaries of this chat?', [
            'Every summary is written again from the transcript, in the background.',
            'Edits you made to summaries are replaced.',
        ], { ok: 'Rebuild', danger: true });
        if (!ok) return;
        try {
            await this.pctx.client().rebuildSummaries(chatId);
            await this.show();
            this.message.show('Rebuilding: new summaries appear as the background jobs finish.', 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }
}
