// Chronicler for SillyTavern: builds the parts and connects them, nothing else; the rules live in
// src/. SillyTavern is reached only through SillyTavern.getContext(), the sidecar only through src/client.js.

import { clientFor } from './src/client.js';
import { stDeps } from './src/campaign.js';
import { commandUi, registerCommands } from './src/commands.js';
import { testConnection } from './src/connection.js';
import { EarlyContext } from './src/early.js';
import { EventHandlers, listen } from './src/events.js';
import { Features } from './src/features.js';
import { RingBuffer, createInterceptor } from './src/interceptor.js';
import { Notices, toast } from './src/notify.js';
import { installPanel } from './src/panel/panel.js';
import { QueryPrefetch } from './src/prefetch.js';
import { TightBudgetNotice, cachedCounter, standingText } from './src/reserve.js';
import { INSTALL_CONFIG_FILE, SETTINGS_KEY, fetchInstallConfig, fromInstallConfig, readSettings, storeSettings } from './src/settings.js';
import { addSettingsDrawer } from './src/settings_panel.js';
import { bindStoreSettings } from './src/settings_store_panel.js';
import { ChatSync, placeNow, savedMessages, speakerNow } from './src/sync/index.js';
import { connectionFrom, describePath, pluginClient, versionWarning } from './src/route.js';
import { registerTools } from './src/tools.js';
import { followJobMode, pageWorker } from './src/worker.js';

const ctx = () => SillyTavern.getContext();
const settings = () => readSettings(ctx());
// The file `chronicler install-extension` wrote beside our folder (never inside it: see
// server_plugin/sillytavern/install.py): the plugin's route, or the direct sidecar's URL and token.
const installed = await fetchInstallConfig(new URL(`../${INSTALL_CONFIG_FILE}`, import.meta.url));
const via = connectionFrom(installed);
const client = (timeoutKey = 'requestTimeoutMs') => (via.mode === 'plugin'
    ? pluginClient(via, location.origin, () => ctx().getRequestHeaders(), settings()[timeoutKey])
    : clientFor(settings(), timeoutKey));

// The folder SillyTavern serves us from, e.g. "third-party/Chronicler" (whatever it was named).
const EXTENSION_PATH = decodeURIComponent(new URL('.', import.meta.url).pathname)
    .replace(/^.*\/scripts\/extensions\//, '').replace(/\/$/, '');
// Tokens of SillyTavern's own standing prompt are counted once per text with the model's
// tokenizer; a rough count when it cannot answer within this many ms.
const STANDING_COUNT_MS = 250;

const notices = new Notices({ toast });
const features = new Features({ getClient: () => client() });
// Shared state, also readable from the page (panel, E2E measurements): window.chronicler.
const state = {
    turns: { current: null },
    injected: { keys: new Set() },
    // timings: each intercepted generation, ms; handlers: each event handler's synchronous part, ms.
    // parts: of each answered generation, ms spent waiting for syncs and on the context call.
    stats: { timings: new RingBuffer(200), handlers: new RingBuffer(400), parts: new RingBuffer(200), lastReport: null, lastError: null, lastTrimmed: 0 },
    notifier: notices.notifier,
    features,
};
state.sync = new ChatSync({
    getContext: ctx, getClient: () => client(), batchSize: () => settings().syncBatchSize, features,
    onSuccess: () => notices.success(), onError: (error, what) => notices.failure(error, what),
    savedMessages: c => savedMessages(c),
});
state.worker = pageWorker({
    getClient: () => client(), getContext: ctx, getSettings: settings, features, toast,
    isGenerating: () => document.body.dataset.generating === 'true',
});
state.prefetch = new QueryPrefetch({
    getClient: () => client(), getSettings: settings, features, chatId: () => ctx().getCurrentChatId?.(),
    names: () => ({ user: ctx().name1, char: ctx().name2 }),
});
const countStanding = cachedCounter(text => ctx().getTokenCountAsync(text), STANDING_COUNT_MS);
state.early = new EarlyContext({
    getContext: ctx, getSettings: settings, getClient: () => client('contextTimeoutMs'), features,
    sync: state.sync, standingTokens: c => countStanding(standingText(c)),
    names: () => ({ user: ctx().name1, char: ctx().name2 }),
});
const inputBox = () => document.querySelector('#send_textarea');
let refreshDrawer = null;
const on = new EventHandlers({
    getContext: ctx, getSettings: settings, sync: state.sync, worker: state.worker, features, state,
    tellMissingRoute: (error) => notices.missingRoute(error), refreshDrawer: () => refreshDrawer?.(),
    prefetch: state.prefetch, readInput: () => inputBox()?.value ?? '', early: state.early,
});
globalThis.chroniclerInterceptor = createInterceptor({
    getContext: ctx, getSettings: settings, getClient: () => client('contextTimeoutMs'), sync: state.sync,
    turns: state.turns, injected: state.injected, stats: state.stats, features,
    notifyFailure: (error) => notices.failure(error), notifySuccess: () => notices.success(),
    standingTokens: c => countStanding(standingText(c)),
    tightBudget: new TightBudgetNotice(), notifyTightBudget: message => toast('warning', message, { timeOut: 10000 }),
    early: state.early,
});
globalThis.chronicler = state;

function writeSettings(patch) {
    const { before, after } = storeSettings(ctx(), patch);
    on.settingsChanged(before, after);
}

/** One optional part of the start: a failure is logged and the rest goes on. */
async function attempt(what, part) {
    try {
        return await part();
    } catch (error) {
        console.error(`[Chronicler] could not ${what}:`, error);
        return undefined;
    }
}

// Listen first: the memory works even if the drawer cannot be drawn.
const c = ctx();
listen(c.eventSource, c.eventTypes, on);
attempt('register tools', () => registerTools(c, { getClient: () => client(), speaker: () => speakerNow(ctx(), state.turns.current), getSettings: settings, features }));
attempt('register slash commands', () => registerCommands(c, { getClient: () => client(), where: () => placeNow(ctx()), getSettings: settings, st: stDeps(ctx) }, commandUi(c, toast)));
// Directly: the URL and token of the install file, taken only while ours are empty.
const patch = via.mode === 'direct' ? fromInstallConfig(ctx().extensionSettings[SETTINGS_KEY], installed) : null;
if (patch) writeSettings(patch);
on.refreshFeatures();
// A pause in typing: the action is probably final, so its query embedding may start.
attempt('watch the input box', () => inputBox()
    ?.addEventListener('input', event => state.prefetch.typed(event.target.value)));
refreshDrawer = await attempt('add the settings drawer', () => addSettingsDrawer(ctx(), EXTENSION_PATH, {
    read: settings,
    write: writeSettings,
    test: async () => {
        const outcome = await testConnection(client(), location.origin);
        if (outcome.ok) await on.refreshFeatures(true);
        return outcome;
    },
    features: () => features.known,
    followJobMode: (choice) => followJobMode(client(), choice, settings(), writeSettings),
}));
// The store's own settings (model endpoint, budgets, windows, embedder), in the drawer.
attempt('add the store settings form', () => {
    const root = document.getElementById('chronicler_settings');
    if (root) state.storeSettings = bindStoreSettings(root, { getClient: () => client() });
});
state.panel = await attempt('add the memory panel', () => installPanel({ getContext: ctx, getClient: () => client(), state }));

// Say which way the memory goes, and warn once when the parts' versions disagree.
attempt('show the connection path', () => {
    const line = document.createElement('div');
    line.id = 'chronicler_path';
    line.className = 'chronicler-path';
    line.textContent = describePath(via, settings());
    document.querySelector('#chronicler_settings')?.prepend(line);
});
if (via.mode === 'plugin') {
    attempt('compare versions', async () => {
        const manifest = await (await fetch(new URL('manifest.json', import.meta.url), { cache: 'no-store' })).json();
        const status = await client().request('GET', '/status');
        const warning = versionWarning({ extension: manifest.version, plugin: status?.plugin_version, sidecar: status?.sidecar_version });
        if (warning) toast('warning', warning, { timeOut: 15000 });
    });
}
