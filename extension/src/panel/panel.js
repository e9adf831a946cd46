// The memory panel (DC4): a SillyTavern popup with one tab per kind of memory, opened from the
// extensions menu (the magic wand) and by `/memories [tab]`. Each tab lives in its own module and
// gets the same small context object (`PanelContext`): the sidecar client, SillyTavern's
// context, the current chat, names of characters, confirmations and toasts.

import { escapeHtml } from '../html.js';
import { chatMembers, chatTitle } from '../sync/index.js';
import { createCharactersTab } from './characters.js';
import { createContextTab } from './context.js';
import { el, icon, newId } from './dom.js';
import { createJobsLine } from './jobs.js';
import { createLoreTab } from './lore.js';
import { createMemoriesTab } from './memories.js';
import { startPick } from './pick.js';
import { createSummariesTab } from './summaries.js';

export const TABS = Object.freeze([
    { id: 'memories', label: 'Memories', icon: 'fa-brain', create: createMemoriesTab },
    { id: 'characters', label: 'Characters', icon: 'fa-users', create: createCharactersTab },
    { id: 'summaries', label: 'Summaries', icon: 'fa-book-open', create: createSummariesTab },
    { id: 'lore', label: 'Lore', icon: 'fa-book-atlas', create: createLoreTab },
    { id: 'context', label: 'Context', icon: 'fa-chart-simple', create: createContextTab },
]);

/**
 * What every tab may use.
 * @typedef {ReturnType<typeof makeContext>} PanelContext
 */

/**
 * @param {{getContext: () => any, getClient: () => import('../client.js').SidecarClient, state: any}} deps
 * @param {Panel} panel
 */
function makeContext(deps, panel) {
    let names = null;
    const pctx = {
        st: deps.getContext,
        client: deps.getClient,
        stats: () => deps.state?.stats ?? {},
        /** The open chat: id, members (sidecar character ids), whether it is a group, its title. */
        chat() {
            const c = deps.getContext();
            const chatId = c.getCurrentChatId?.() ?? null;
            const { isGroup, memberIds } = chatId ? chatMembers(c) : { isGroup: false, memberIds: [] };
            const title = chatTitle(c);
            return { chatId, isGroup, memberIds, title: chatId ? String(title ?? chatId) : '' };
        },
        /** Sidecar characters (id -> record), loaded once per panel opening. */
        async characters(reload = false) {
            if (!names || reload) {
                names = (async () => {
                    const out = new Map();
                    try {
                        const answer = await deps.getClient().listCharacters();
                        for (const c of answer?.characters ?? []) out.set(c.id, c);
                    } catch (error) {
                        console.warn('[Chronicler] could not list characters:', error);
                    }
                    return out;
                })();
            }
            return names;
        },
        /** A character's name: the sidecar's, else SillyTavern's card, else the id. */
        nameOf(id, known) {
            if (id === null || id === undefined) return 'Everyone (global)';
            const fromSidecar = known?.get?.(id)?.name;
            if (fromSidecar) return fromSidecar;
            const card = (deps.getContext().characters ?? []).find((c) => c.avatar === id);
            return card?.name ?? String(id);
        },
        /**
         * Ask a yes/no question in SillyTavern's own popup (stacked on the panel).
         * @returns {Promise<boolean>}
         */
        async confirm(title, lines, { ok = 'Yes', cancel = 'Cancel', danger = false } = {}) {
            const c = deps.getContext();
            const body = el('div', { class: 'chronicler-confirm' },
                el('h3', { text: title }),
                ...[].concat(lines).map((line) => el('p', { text: line })));
            // A destructive question defaults to the safe answer: Enter keeps things.
            const popup = new c.Popup(body, c.POPUP_TYPE.CONFIRM, '', {
                okButton: ok, cancelButton: cancel, leftAlign: true,
                defaultResult: danger ? c.POPUP_RESULT.NEGATIVE : c.POPUP_RESULT.AFFIRMATIVE,
            });
            if (danger) popup.okButton.classList.add('chronicler-danger');
            return (await popup.show()) === c.POPUP_RESULT.AFFIRMATIVE;
        },
        /** A toast; `text` is escaped (toastr renders HTML). */
        toast(kind, text) {
            globalThis.toastr?.[kind]?.(escapeHtml(text), 'Chronicler');
        },
        /** Leave the panel and pick messages in the chat (RV9d). */
        pickMessages() {
            panel.close();
            startPick(pctx, { onSaved: (target) => panel.open('memories', { view: target }) });
        },
        open: (tab, options) => panel.open(tab, options),
        refresh: () => panel.refreshActive(),
    };
    return pctx;
}

/** The panel: at most one open at a time. */
export class Panel {
    constructor(deps) {
        this.deps = deps;
        this.popup = null;
        this.tabs = new Map();
        this.active = 'memories';
        this.remembered = {}; // per-tab state kept between openings (view, filter)
    }

    get isOpen() {
        return Boolean(this.popup);
    }

    /**
     * Open the panel (or switch tab when it is open).
     * @param {string} [tab]
     * @param {object} [options] passed to the tab's show()
     */
    async open(tab = this.active, options = {}) {
        const wanted = TABS.some((t) => t.id === tab) ? tab : 'memories';
        if (this.popup) return this.select(wanted, { focus: true, options });
        const c = this.deps.getContext();
        this.pctx = makeContext(this.deps, this);
        this.tabs = new Map();
        this.root = this.build();
        this.popup = new c.Popup(this.root, c.POPUP_TYPE.DISPLAY, '', {
            wide: true, large: true, leftAlign: true, animation: 'fast',
            onClose: () => this.closed(),
        });
        const close = this.popup.closeButton;
        close.setAttribute('role', 'button');
        close.setAttribute('aria-label', 'Close the memory panel');
        close.setAttribute('tabindex', '0');
        this.popup.dlg.classList.add('chronicler-popup');
        this.popup.dlg.setAttribute('aria-label', 'Chronicler memory panel');
        const shown = this.popup.show();
        this.jobs.start();
        await this.select(wanted, { focus: true, options });
        return shown;
    }

    close() {
        this.popup?.completeCancelled();
    }

    closed() {
        this.jobs?.stop();
        for (const tab of this.tabs.values()) tab.dispose?.();
        this.popup = null;
        this.tabs = new Map();
    }

    build() {
        const chat = this.pctx.chat();
        this.tablist = el('div', { class: 'chronicler-tabs', attrs: { role: 'tablist', 'aria-label': 'Memory panel sections' } });
        this.panels = el('div', { class: 'chronicler-tabpanels' });
        for (const t of TABS) {
            const tabId = `chronicler_tab_${t.id}`;
            const button = el('div', {
                class: 'chronicler-tab',
                attrs: { role: 'tab', id: tabId, 'aria-selected': 'false', 'aria-controls': `chronicler_tabpanel_${t.id}`, tabindex: -1, 'data-tab': t.id },
                on: { click: () => this.select(t.id, { focus: true }), keydown: (e) => this.onTabKey(e, t.id) },
            }, icon(t.icon), el('span', { class: 'chronicler-tab-label', text: t.label }));
            this.tablist.append(button);
            this.panels.append(el('section', {
                class: 'chronicler-tabpanel',
                attrs: { role: 'tabpanel', id: `chronicler_tabpanel_${t.id}`, 'aria-labelledby': tabId, tabindex: -1, hidden: true },
            }));
        }
        this.jobs = createJobsLine(this.pctx);
        const heading = el('h3', { class: 'chronicler-title', attrs: { id: newId('title') } },
            icon('fa-feather-pointed'), el('span', { text: 'Chronicler' }),
            el('small', { class: 'chronicler-subtitle', text: chat.chatId ? chat.title : 'No chat open' }));
        return el('div', { class: 'chronicler-panel', attrs: { 'aria-labelledby': heading.id } },
            heading, this.tablist, this.panels, this.jobs.element);
    }

    onTabKey(event, id) {
        const ids = TABS.map((t) => t.id);
        const i = ids.indexOf(id);
        const moves = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: ids.length - 1 };
        if (event.key in moves) {
            event.preventDefault();
            this.select(ids[(moves[event.key] + ids.length) % ids.length], { focus: true });
        } else if (event.key === 'Enter' || event.key === ' ') {
            event.preventDefault();
            this.select(id, { focus: false });
            this.panels.querySelector(`#chronicler_tabpanel_${id}`)?.focus();
        }
    }

    /** Show one tab (created on first use). */
    async select(id, { focus = false, options = {} } = {}) {
        if (!this.popup) return;
        this.active = id;
        for (const tab of this.tablist.children) {
            const on = tab.dataset.tab === id;
            tab.setAttribute('aria-selected', String(on));
            tab.setAttribute('tabindex', on ? '0' : '-1');
            tab.classList.toggle('active', on);
            if (on && focus) tab.focus();
        }
        for (const section of this.panels.children) section.hidden = section.id !== `chronicler_tabpanel_${id}`;
        let tab = this.tabs.get(id);
        if (!tab) {
            const spec = TABS.find((t) => t.id === id);
            const remembered = (this.remembered[id] ??= {});
            tab = spec.create(this.pctx, remembered);
            this.tabs.set(id, tab);
            this.panels.querySelector(`#chronicler_tabpanel_${id}`).append(tab.element);
        }
        await tab.show?.(options);
    }

    refreshActive() {
        return this.tabs.get(this.active)?.show?.({});
    }
}

/**
 * Put the panel in SillyTavern: an entry in the extensions menu (magic wand) and `/memories`.
 * @param {{getContext: () => any, getClient: () => import('../client.js').SidecarClient, state: any}} deps
 * @returns {Panel}
 */
export function installPanel(deps) {
    const panel = new Panel(deps);
    addMenuEntry(() => panel.open());
    registerCommand(deps.getContext(), panel);
    return panel;
}

function addMenuEntry(open) {
    const menu = document.getElementById('extensionsMenu');
    if (!menu || document.getElementById('chronicler_menu_item')) return;
    const item = el('div', {
        class: 'list-group-item flex-container flexGap5',
        attrs: { id: 'chronicler_menu_item', title: 'Open the Chronicler memory panel', role: 'menuitem' },
        on: { click: () => open() },
    }, el('div', { class: 'extensionsMenuExtensionButton fa-solid fa-brain', attrs: { 'aria-hidden': 'true' } }),
    el('span', { text: 'Memories (Chronicler)' }));
    const container = el('div', { class: 'extension_container', attrs: { id: 'chronicler_wand_container' } }, item);
    menu.append(container);
}

function registerCommand(c, panel) {
    const { SlashCommandParser, SlashCommand, SlashCommandArgument, ARGUMENT_TYPE } = c;
    if (!SlashCommandParser || !SlashCommand) return;
    const tabs = TABS.map((t) => t.id);
    SlashCommandParser.addCommandObject(SlashCommand.fromProps({
        name: 'memories',
        callback: async (_named, value) => {
            const wanted = String(value ?? '').trim().toLowerCase();
            if (wanted === 'pick' || wanted === 'save') {
                await panel.open('memories');
                panel.pctx.pickMessages();
                return '';
            }
            panel.open(tabs.includes(wanted) ? wanted : undefined);
            return '';
        },
        unnamedArgumentList: SlashCommandArgument ? [SlashCommandArgument.fromProps({
            description: `tab to open: ${tabs.join(', ')}; or "pick" to save messages from the chat`,
            typeList: [ARGUMENT_TYPE.STRING],
            isRequired: false,
            enumList: [...tabs, 'pick'],
        })] : [],
        helpString: 'Opens the Chronicler memory panel (memories, characters, summaries, lore, context). <code>/memories pick</code> starts "save from conversation".',
    }));
}
