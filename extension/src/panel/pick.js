// "Save from conversation" (RV9d), first half: a selection mode on the chat. Each message gets a
// checkbox; at most 20 may be picked (the 21st is refused, with a message); then "keep raw text"
// or "extract with the model" makes drafts, reviewed in drafts.js and saved pinned.

import { messageId } from '../sync/index.js';
import { button, el, messageLine, setDisabled } from './dom.js';
import { openReview } from './drafts.js';
import { SelectionSet, rawDrafts } from './drafts_model.js';
import { PANEL_LIMITS } from './limits.js';
import { describeError } from './memory_model.js';

let current = null;

/**
 * Start picking messages (ends a pick already running).
 * @param {import('./panel.js').PanelContext} pctx
 * @param {{onSaved?: (target: {scope: string, character_id: string|null}) => void}} [options]
 */
export function startPick(pctx, options = {}) {
    current?.stop();
    current = new PickMode(pctx, options);
    current.start();
    return current;
}

/** The running pick, if any (for tests in the page). */
export function currentPick() {
    return current;
}

class PickMode {
    constructor(pctx, options) {
        this.pctx = pctx;
        this.options = options;
        this.selection = new SelectionSet(PANEL_LIMITS.maxSelected);
        this.chatId = pctx.chat().chatId;
        this.onKey = (event) => {
            if (event.key !== 'Escape' || document.querySelector('dialog.popup[open]:not([closing])')) return;
            event.stopPropagation();
            this.stop();
        };
        this.onChat = () => this.stop();
    }

    start() {
        const chat = document.getElementById('chat');
        if (!chat || !this.chatId) {
            this.pctx.toast('warning', 'Open a chat first: its messages are what you pick from.');
            return;
        }
        document.body.classList.add('chronicler-picking');
        this.buildBar();
        chat.querySelectorAll('.mes').forEach((m) => this.decorate(m));
        this.observer = new MutationObserver((records) => records.forEach((r) => r.addedNodes.forEach((n) => {
            if (n.nodeType === 1 && n.classList.contains('mes')) this.decorate(n);
        })));
        this.observer.observe(chat, { childList: true });
        document.addEventListener('keydown', this.onKey, true);
        const { eventSource, eventTypes } = this.pctx.st();
        eventSource.on(eventTypes.CHAT_CHANGED, this.onChat);
        this.update();
        this.bar.querySelector('.chronicler-pick-count').focus();
    }

    stop() {
        if (current === this) current = null;
        this.observer?.disconnect();
        document.removeEventListener('keydown', this.onKey, true);
        const { eventSource, eventTypes } = this.pctx.st();
        eventSource.removeListener?.(eventTypes.CHAT_CHANGED, this.onChat);
        document.body.classList.remove('chronicler-picking');
        document.querySelectorAll('.chronicler-pick').forEach((n) => n.remove());
        this.bar?.remove();
    }

    buildBar() {
        this.count = el('span', { class: 'chronicler-pick-count', attrs: { tabindex: -1, 'aria-live': 'polite' } });
        this.message = messageLine('alert');
        this.raw = button('Keep raw text', { icon: 'fa-quote-left', title: 'Drafts are the picked messages\' own words', onClick: () => this.finish('raw') });
        this.extract = button('Extract with the model', { icon: 'fa-wand-magic-sparkles', title: 'The model writes up to 5 drafts from the picked messages', onClick: () => this.finish('model') });
        const cancel = button('Cancel', { icon: 'fa-xmark', onClick: () => this.stop() });
        this.bar = el('div', { class: 'chronicler-pick-bar', attrs: { role: 'region', 'aria-label': 'Save from conversation' } },
            el('div', { class: 'chronicler-pick-head' },
                el('b', { text: 'Save from conversation' }), this.count),
            el('div', { class: 'chronicler-pick-buttons' }, this.raw, this.extract, cancel),
            this.message);
        const form = document.getElementById('form_sheld');
        const send = document.getElementById('send_form');
        if (form && send) form.insertBefore(this.bar, send);
        else document.body.append(this.bar);
    }

    decorate(node) {
        if (node.querySelector('.chronicler-pick')) return;
        const index = Number(node.getAttribute('mesid'));
        const message = this.pctx.st().chat?.[index];
        if (!Number.isInteger(index) || !message || message.is_system || !String(message.mes ?? '').trim()) return;
        const input = el('input', { attrs: { type: 'checkbox', 'aria-label': `Pick message ${index} (${message.name ?? ''})` } });
        input.checked = this.selection.has(index);
        input.addEventListener('change', () => {
            const result = this.selection.toggle(index);
            if (result.refused) {
                input.checked = false;
                this.message.show(result.message, 'error');
            } else {
                input.checked = result.selected;
                this.message.show('');
            }
            node.classList.toggle('chronicler-picked', input.checked);
            this.update();
        });
        const label = el('label', { class: 'chronicler-pick', attrs: { title: 'Pick this message' } }, input);
        const head = node.querySelector('.ch_name') ?? node;
        head.prepend(label);
    }

    update() {
        const n = this.selection.size;
        this.count.textContent = n ? `${n} / ${PANEL_LIMITS.maxSelected} messages picked`
            : `Tick up to ${PANEL_LIMITS.maxSelected} messages worth remembering`;
        setDisabled(this.raw, n === 0);
        setDisabled(this.extract, n === 0);
    }

    /** The picked messages, in chat order, as the drafts route wants them. */
    picked() {
        const chat = this.pctx.st().chat ?? [];
        return this.selection.indexes().map((i) => {
            const m = chat[i];
            return { id: messageId(m) ?? `st-${i}`, name: String(m?.name ?? ''), text: String(m?.mes ?? ''), role: m?.is_user ? 'user' : 'assistant', index: i };
        }).filter((m) => m.text.trim());
    }

    async finish(how) {
        const messages = this.picked();
        if (!messages.length) return;
        const info = this.pctx.chat();
        const target = !info.isGroup && info.memberIds.length === 1
            ? { scope: 'character', character_id: info.memberIds[0] } : { scope: 'global', character_id: null };
        const labels = new Map(messages.map((m) => [m.id, `#${m.index}`]));
        let drafts;
        let warning = null;
        if (how === 'raw') {
            drafts = rawDrafts(messages);
        } else {
            this.message.show('Asking the model for drafts… this can take a while.', 'info');
            setDisabled(this.raw, true);
            setDisabled(this.extract, true);
            try {
                const answer = await this.pctx.client().memoryDrafts({
                    mode: 'conversation',
                    messages: messages.map(({ id, name, text, role }) => ({ id, name, text, role })),
                    character_id: target.character_id,
                }, { timeoutMs: PANEL_LIMITS.draftsTimeoutMs });
                drafts = answer?.drafts ?? [];
                warning = answer?.warning ?? null;
            } catch (error) {
                this.update();
                this.message.show(describeError(error), 'error');
                return;
            }
            if (!drafts.length) {
                this.update();
                this.message.show('The model found nothing durable to remember in these messages. Try "Keep raw text".', 'error');
                return;
            }
        }
        this.stop();
        await openReview(this.pctx, {
            drafts, warning, target,
            intro: `From ${messages.length === 1 ? 'one message' : `${messages.length} messages`}${how === 'raw' ? ', in their own words' : ''}. Edit them and untick any you do not want; they are saved as pinned memories.`,
            labelOf: (id) => labels.get(id) ?? id,
            onSaved: this.options.onSaved,
        });
    }
}
