// Chronicler for SillyTavern: wiring only. Rules live in src/; SillyTavern is reached only through
// SillyTavern.getContext(), the sidecar only through src/client.js.

import { SidecarClient, isMissingRoute } from './src/client.js';
import { registerCommands } from './src/commands.js';
import { testConnection } from './src/connection.js';
import { Features } from './src/features.js';
import { escapeHtml } from './src/html.js';
import { clearPrompts } from './src/inject.js';
import { RingBuffer, createInterceptor } from './src/interceptor.js';
import { OutageNotifier, outageMessage } from './src/notify.js';
import { installPanel } from './src/panel/panel.js';
import { bindSettingsPanel } from './src/settings_panel.js';
import { INSTALL_CONFIG_FILE, SETTINGS_KEY, fromInstallConfig, withDefaults } from './src/settings.js';
import { ChatSync, chatMembers, speakerOf, stampTurn, swipePending } from './src/sync/index.js';
import { TightBudgetNotice, cachedCounter, standingText } from './src/reserve.js';
import { registerTools } from './src/tools.js';
import { JobWorker } from './src/worker.js';

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
    const before = settings();
    c.extensionSettings[SETTINGS_KEY] = { ...(c.extensionSettings[SETTINGS_KEY] ?? {}), ...patch };
    c.saveSettingsDebounced();
    const after = settings();
    if (before.sidecarUrl !== after.sidecarUrl || before.token !== after.token) {
        features.reset();
        refreshFeatures();
    }
    if (before.llmMode !== after.llmMode || before.enabled !== after.enabled) startWorker();
}

function client(timeoutKey = 'requestTimeoutMs') {
    const s = settings();
    return new SidecarClient({ baseUrl: s.sidecarUrl, token: s.token, timeoutMs: s[timeoutKey] });
}

const notifier = new OutageNotifier();

function toast(kind, text, options = {}) {
    globalThis.toastr?.[kind](text, 'Chronicler', { preventDuplicates: true, ...options });
}

// A route this sidecar lacks is not an outage: say so once per page load, not on every turn.
let missingRouteTold = false;

function tellMissingRoute(error) {
    if (missingRouteTold) return;
    missingRouteTold = true;
    toast('warning', outageMessage(error), { timeOut: 8000 });
}

function notifyFailure(error, what = 'context') {
    console.warn(`[Chronicler] ${what} failed:`, error);
    if (isMissingRoute(error)) return tellMissingRoute(error);
    if (notifier.failed(error)) toast('warning', outageMessage(error), { timeOut: 8000 });
}

function notifySuccess() {
    notifier.succeeded();
}

const features = new Features({ getClient: () => client() });

// Shared state, also readable from the page (panel, E2E measurements): window.chronicler.
const state = {
    turns: { current: null },
    injected: { keys: new Set() },
    // timings: each intercepted generation, ms; handlers: each event handler's synchronous part, ms.
    // parts: of each answered generation, ms spent waiting for syncs and on the context call.
    stats: { timings: new RingBuffer(200), handlers: new RingBuffer(400), parts: new RingBuffer(200), lastReport: null, lastError: null, lastTrimmed: 0 },
    notifier,
    features,
};

const sync = new ChatSync({
    getContext: ctx,
    getClient: () => client(),
    batchSize: () => settings().syncBatchSize,
    onSuccess: notifySuccess,
    onError: (error, what) => notifyFailure(error, what),
    features,
});
state.sync = sync;

// Tokens of SillyTavern's own standing prompt, counted once per text with the model's tokenizer
// (a rough count when it cannot answer within STANDING_COUNT_MS).
const STANDING_COUNT_MS = 250;
const countStanding = cachedCounter(text => ctx().getTokenCountAsync(text), STANDING_COUNT_MS);

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
    features,
    standingTokens: c => countStanding(standingText(c)),
    tightBudget: new TightBudgetNotice(),
    notifyTightBudget: message => toast('warning', message, { timeOut: 10000 }),
});
globalThis.chronicler = state;

function enabled() {
    return settings().enabled;
}

function refreshFeatures(force = false) {
    if (!enabled()) return Promise.resolve();
    return features.refresh({ force }).then((known) => {
        refreshPanel?.();
        startWorker();
        if (known.context === false) {
            tellMissingRoute({ status: 404, code: 'not_found', message: 'It has no POST /v1/context.' });
        }
    });
}

function syncNow(what) {
    if (!enabled()) return;
    const started = performance.now();
    const { assigned } = sync.syncCurrentChat(what);
    // The synchronous part holds up SillyTavern's event flow (handlers are awaited): measure it.
    state.stats.handlers.push(performance.now() - started);
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
    refreshFeatures();
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

function onGenerationStarted(type, options, dryRun) {
    worker.generationStarted(type, options, dryRun);
    // Hold the user's new message's upsert until the context call is done (ChatSync.hold); the
    // interceptor releases it, the limit covers generations that never reach the interceptor.
    const s = settings();
    if (!dryRun && type !== 'quiet' && s.enabled) sync.hold(s.contextTimeoutMs + 500);
}

function onGenerationEnded() {
    sync.release();
    worker.generationEnded();
}

function onCharacterDeleted(payload) {
    if (enabled()) sync.deleteCharacter(payload?.character?.avatar);
}

/** CHAT_RENAMED gives file names with `.jsonl`; chat ids are the names without it. */
function chatIdOf(fileName) {
    return String(fileName ?? '').replace(/\.jsonl$/i, '');
}

function onChatRenamed(payload) {
    if (!enabled()) return;
    sync.renameChat(chatIdOf(payload?.oldFileName), chatIdOf(payload?.newFileName))
        .then(() => syncNow('CHAT_RENAMED'));
}

function onChatDeleted(chatId) {
    if (enabled()) sync.deleteChat(chatIdOf(chatId));
}

function onCharacterRenamed(oldAvatar, newAvatar) {
    if (!enabled()) return;
    sync.renameCharacter(oldAvatar, newAvatar, () => ctx().characters?.find(c => c.avatar === newAvatar)?.name);
}

// --- who is speaking (tools) and where we are (commands) -------------------------------------
function currentSpeaker() {
    const c = ctx();
    const chatId = c.getCurrentChatId?.();
    const speakerId = c.characters?.[c.characterId]?.avatar;
    if (!chatId || !speakerId) return null;
    const turn = state.turns.current;
    return {
        chatId,
        speakerId,
        memberIds: chatMembers(c).memberIds,
        turnId: turn && turn.chatId === chatId ? turn.id : undefined,
    };
}

function currentPlace() {
    const c = ctx();
    const members = chatMembers(c);
    const lastReply = [...(c.chat ?? [])].reverse().find(m => m && !m.is_user && !m.is_system);
    return {
        chatId: c.getCurrentChatId?.(),
        isGroup: members.isGroup,
        memberIds: members.memberIds,
        characterId: members.isGroup ? undefined : members.memberIds[0],
        lastSpeakerId: members.isGroup ? speakerOf(lastReply, undefined) : undefined,
        characters: (c.characters ?? []).map(ch => ({ avatar: ch.avatar, name: ch.name })),
    };
}

// --- the client LLM worker ---------------------------------------------------------------------
const worker = new JobWorker({
    claim: () => client().claimJob({}),
    complete: (id, text, attempt) => client().completeJob(id, text, attempt),
    fail: (id, error, attempt) => client().failJob(id, error, { retryable: true, attempt }),
    generate: (args) => ctx().generateRaw(args),
    useSchema: () => settings().jobJsonSchema,
    isActive: () => {
        const s = settings();
        return s.enabled && s.llmMode === 'sillytavern' && features.has('jobs');
    },
    isGenerating: () => document.body.dataset.generating === 'true',
    onStop: (error) => {
        console.error('[Chronicler] background job failed; the job worker stopped:', error);
        toast('error', `Background jobs stopped: ${error?.message ?? error}. Switch the mode off and on again to retry.`, { timeOut: 0 });
    },
    idleMs: () => settings().workerIdleMs,
    pollMs: () => settings().workerPollMs,
    maxPollMs: () => settings().workerMaxPollMs,
});
state.worker = worker;

function startWorker() {
    const s = settings();
    if (s.enabled && s.llmMode === 'sillytavern' && features.has('jobs')) worker.start();
    else worker.stop();
}

// --- settings drawer ---------------------------------------------------------------------------
let refreshPanel = null;

async function addSettingsDrawer() {
    const html = await ctx().renderExtensionTemplateAsync(EXTENSION_PATH, 'settings');
    const host = document.getElementById('extensions_settings2') ?? document.getElementById('extensions_settings');
    host.insertAdjacentHTML('beforeend', html);
    refreshPanel = bindSettingsPanel(document.getElementById('chronicler_settings'), {
        read: settings,
        write: writeSettings,
        test: async () => {
            const outcome = await testConnection(client(), location.origin);
            if (outcome.ok) await refreshFeatures(true);
            return outcome;
        },
        features: () => features.known,
    });
}

/** Take the sidecar's URL and token from the file `chronicler install-extension` wrote, if ours are empty. */
async function readInstallConfig() {
    let file;
    try {
        // Beside our folder (extensions/chronicler.config.json), never inside it: see server_plugin/install.py.
        const response = await fetch(new URL(`../${INSTALL_CONFIG_FILE}`, import.meta.url), { cache: 'no-store' });
        if (!response.ok) return;
        file = await response.json();
    } catch {
        return; // no file: installed by hand
    }
    const patch = fromInstallConfig(ctx().extensionSettings[SETTINGS_KEY], file);
    if (patch) writeSettings(patch);
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
    eventSource.on(e.CHARACTER_RENAMED, onCharacterRenamed);
    eventSource.on(e.CHAT_RENAMED, onChatRenamed);
    eventSource.on(e.CHAT_DELETED, onChatDeleted);
    eventSource.on(e.GROUP_CHAT_DELETED, onChatDeleted);
    eventSource.on(e.GENERATION_STARTED, onGenerationStarted);
    eventSource.on(e.GENERATION_ENDED, onGenerationEnded);
    eventSource.on(e.GENERATION_STOPPED, onGenerationEnded);
}

function registerExtras() {
    const c = ctx();
    try {
        registerTools(c, {
            getClient: () => client(),
            speaker: currentSpeaker,
            getSettings: settings,
            features,
        });
    } catch (error) {
        console.error('[Chronicler] could not register tools:', error);
    }
    try {
        registerCommands(c, { getClient: () => client(), where: currentPlace, getSettings: settings }, {
            ok: (text) => toast('success', text),
            fail: (error) => toast('error', error?.message ?? String(error)),
            show: (title, lines) => c.callGenericPopup?.(`<h3>${escapeHtml(title)}</h3><pre class="chronicler-recall">${escapeHtml(lines.join('\n') || 'Nothing found.')}</pre>`, c.POPUP_TYPE?.TEXT ?? 1),
        });
    } catch (error) {
        console.error('[Chronicler] could not register slash commands:', error);
    }
}

// Listen first: the memory works even if the drawer cannot be drawn.
listen();
registerExtras();
await readInstallConfig();
refreshFeatures();
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
