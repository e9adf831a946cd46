// Chronicler for SillyTavern: wiring only. Rules live in src/; SillyTavern is reached only through
// SillyTavern.getContext(), the sidecar only through src/client.js.

import { SidecarClient } from './src/client.js';
import { testConnection } from './src/connection.js';
import { clearPrompts } from './src/inject.js';
import { RingBuffer, createInterceptor } from './src/interceptor.js';
import { OutageNotifier, outageMessage } from './src/notify.js';
import { installPanel } from './src/panel/panel.js';
import { bindSettingsPanel } from './src/settings_panel.js';
import { SETTINGS_KEY, withDefaults } from './src/settings.js';
import { ChatSync, stampTurn, swipePending } from './src/sync.js';

const ctx = () => SillyTavern.getContext();

// The folder SillyTavern serves us from, e.g. "third-party/Chronicler" (whatever it was named).
const EXTENSION_PATH = decodeURIComponent(new URL('.', import.meta.url).pathname)
    .replace(/^.*\/scripts\/extensions\//, '').replace(/\/$/, '');

// Generation types whose MESSAGE_RECEIVED carries a reply produced by an intercepted generation.
const NOT_A_TURN = new Set(['first_message', 'command', 'extension', 'quiet', 'impersonate']);

function settings() {
    return withDefaults(ctx().extensionSettings[SETTINGS_KEY]);
}

function writeSettings(patch) {
    const c = ctx();
    c.extensionSettings[SETTINGS_KEY] = { ...(c.extensionSettings[SETTINGS_KEY] ?? {}), ...patch };
    c.saveSettingsDebounced();
}

function client(timeoutKey = 'requestTimeoutMs') {
    const s = settings();
    return new SidecarClient({ baseUrl: s.sidecarUrl, token: s.token, timeoutMs: s[timeoutKey] });
}

const notifier = new OutageNotifier();

function notifyFailure(error, what = 'context') {
    console.warn(`[Chronicler] ${what} failed:`, error);
    if (notifier.failed(error)) {
        globalThis.toastr?.warning(outageMessage(error), 'Chronicler', { preventDuplicates: true, timeOut: 8000 });
    }
}

function notifySuccess() {
    notifier.succeeded();
}

// Shared state, also readable from the page (panel, E2E measurements): window.chronicler.
const state = {
    turns: { current: null },
    injected: { keys: new Set() },
    stats: { timings: new RingBuffer(200), lastReport: null, lastError: null, lastTrimmed: 0 },
    notifier,
};

const sync = new ChatSync({
    getContext: ctx,
    getClient: () => client(),
    batchSize: () => settings().syncBatchSize,
    onSuccess: notifySuccess,
    onError: (error, what) => notifyFailure(error, what),
});
state.sync = sync;

globalThis.chroniclerInterceptor = createInterceptor({
    getContext: ctx,
    getSettings: settings,
    getClient: () => client('contextTimeoutMs'),
    sync,
    turns: state.turns,
    injected: state.injected,
    notifyFailure,
    notifySuccess,
    stats: state.stats,
});
globalThis.chronicler = state;

function enabled() {
    return settings().enabled;
}

function syncNow(what) {
    if (!enabled()) return;
    const { assigned } = sync.syncCurrentChat(what);
    // New ids must reach the chat file. SillyTavern saves a user's message *before* MESSAGE_SENT
    // (and an existing chat may never be saved again), so ask for a save whenever ids were given;
    // the debounced save is skipped if the chat changes meanwhile.
    if (assigned.length) ctx().saveMetadataDebounced();
}

function onChatChanged() {
    // SillyTavern empties all extension prompts when it clears a chat; clear ours explicitly anyway,
    // so no block of the previous chat can reach the next one.
    clearPrompts(ctx().setExtensionPrompt, state.injected.keys);
    state.injected.keys = new Set();
    state.turns.current = null;
    syncNow('CHAT_CHANGED');
}

function onMessageReceived(index, type) {
    const c = ctx();
    const message = c.chat[index];
    const turn = state.turns.current;
    if (message && turn && turn.chatId === c.getCurrentChatId() && !NOT_A_TURN.has(type)) {
        stampTurn(message, turn.id);
    }
    syncNow('MESSAGE_RECEIVED');
}

function onMessageSwiped(index) {
    // A swipe that is about to generate still shows the old text: the reply will sync it.
    if (!swipePending(ctx().chat[index])) syncNow('MESSAGE_SWIPED');
}

function onCharacterDeleted(payload) {
    if (enabled()) sync.deleteCharacter(payload?.character?.avatar);
}

async function addSettingsDrawer() {
    const html = await ctx().renderExtensionTemplateAsync(EXTENSION_PATH, 'settings');
    const host = document.getElementById('extensions_settings2') ?? document.getElementById('extensions_settings');
    host.insertAdjacentHTML('beforeend', html);
    bindSettingsPanel(document.getElementById('chronicler_settings'), {
        read: settings,
        write: writeSettings,
        test: () => testConnection(client(), location.origin),
    });
}

function listen() {
    const { eventSource, eventTypes: e } = ctx();
    eventSource.on(e.CHAT_CHANGED, onChatChanged);
    eventSource.on(e.MESSAGE_SENT, () => syncNow('MESSAGE_SENT'));
    eventSource.on(e.MESSAGE_RECEIVED, onMessageReceived);
    eventSource.on(e.MESSAGE_EDITED, () => syncNow('MESSAGE_EDITED'));
    eventSource.on(e.MESSAGE_UPDATED, () => syncNow('MESSAGE_UPDATED'));
    eventSource.on(e.MESSAGE_SWIPED, onMessageSwiped);
    eventSource.on(e.MESSAGE_SWIPE_DELETED, () => syncNow('MESSAGE_SWIPE_DELETED'));
    eventSource.on(e.MESSAGE_DELETED, () => syncNow('MESSAGE_DELETED'));
    eventSource.on(e.GROUP_UPDATED, () => syncNow('GROUP_UPDATED'));
    eventSource.on(e.CHARACTER_DELETED, onCharacterDeleted);
}

// Listen first: the memory works even if the drawer cannot be drawn.
listen();
try {
    await addSettingsDrawer();
} catch (error) {
    console.error('[Chronicler] could not add the settings drawer:', error);
}
try {
    state.panel = installPanel({ getContext: ctx, getClient: () => client(), state });
} catch (error) {
    console.error('[Chronicler] could not add the memory panel:', error);
}
