// The generate interceptor: before SillyTavern builds a prompt, ask the sidecar for this turn's
// context, keep the request's chat to the live window, and inject the blocks.
//
// It fails open: on a timeout or any error the generation goes on exactly as without the
// extension, and the user sees one toast per outage (OutageNotifier), not one per turn.
// When the same request was asked for as the generation started (early.js), its answer is taken
// and the request sent once more without waiting, for the sidecar to record the turn.

import { isMissingRoute } from './client.js';
import { applyPrompts, blocksToPrompts, clearPrompts } from './inject.js';
import { characterAvatar, chatMembers, idMaker, messageId, messageTurn } from './sync/index.js';
import { sidecarBudget } from './reserve.js';

/** Generation types that get no context: our own background generations. */
export const SKIPPED_TYPES = Object.freeze(['quiet']);

/**
 * Which turn this generation is, and which turns it replaces.
 *
 * - `quiet`: none (background generations are not turns).
 * - `swipe`: a new turn; the swipe being replaced (the last message's current turn) is rolled back (RV10).
 * - `continue`: the message being continued keeps its turn.
 * - `normal` right after a tool call (last message is SillyTavern's tool-invocation message):
 *   the same turn goes on, so what the tools saved and the reply that follows share one turn id.
 * - anything else (`normal`, `regenerate`, `impersonate`): a new turn. A `regenerate` has already
 *   cut the old reply from the chat before the interceptor runs; `ChatSync` rolls that turn back.
 *
 * @param {{type: string, lastMessage?: object, current?: {id: string, chatId: string}|null, chatId: string, newId: () => string}} args
 * @returns {{turnId: string, rollback: string[]}|null}
 */
export function planTurn({ type, lastMessage, current, chatId, newId }) {
    if (SKIPPED_TYPES.includes(type)) return null;
    if (type === 'swipe') {
        const replaced = lastMessage && !lastMessage.is_user ? messageTurn(lastMessage) : undefined;
        return { turnId: newId(), rollback: replaced ? [replaced] : [] };
    }
    if (type === 'continue') {
        const own = lastMessage && !lastMessage.is_user ? messageTurn(lastMessage) : undefined;
        return { turnId: own ?? newId(), rollback: [] };
    }
    const afterToolCall = lastMessage?.is_system && Array.isArray(lastMessage?.extra?.tool_invocations);
    if (afterToolCall && current && current.chatId === chatId) {
        return { turnId: current.id, rollback: [] };
    }
    return { turnId: newId(), rollback: [] };
}

/**
 * QS2's Last Action: the latest player message, or for a Continue the message being continued.
 * @param {object[]} chat the interceptor's chat array
 * @param {string} type generation type
 * @returns {{text: string, kind: 'action'|'continue'}}
 */
export function lastAction(chat, type) {
    const last = chat.at(-1);
    if (type === 'continue' && last) return { text: String(last.mes ?? ''), kind: 'continue' };
    const player = [...chat].reverse().find(m => m?.is_user);
    return { text: String((player ?? last)?.mes ?? ''), kind: 'action' };
}

/**
 * Index of the first message of the live window: the earliest message whose id the sidecar
 * listed as live. Everything after it stays (including messages the sidecar has not seen yet);
 * 0 when none of the ids is in the chat (then nothing is trimmed: never lose the chat by mistake).
 * @param {Array<string|undefined>} chatIds our ids of the chat's messages, in order
 * @param {string[]} liveIds the sidecar's live_message_ids
 */
export function liveCut(chatIds, liveIds) {
    if (!Array.isArray(liveIds) || !liveIds.length) return 0;
    const live = new Set(liveIds);
    const first = chatIds.findIndex(id => id !== undefined && live.has(id));
    return first < 0 ? 0 : first;
}

/**
 * Drop the messages before the live window from the interceptor's array, in place. The array
 * holds shallow copies made for this request: the stored chat is untouched (its `extra` objects
 * are shared, so nothing here writes to them).
 * @param {object[]} chat the interceptor's chat array
 * @param {string[]} liveIds
 * @returns {number} how many messages were dropped
 */
export function trimToLive(chat, liveIds) {
    const cut = liveCut(chat.map(messageId), liveIds);
    if (cut > 0) chat.splice(0, cut);
    return cut;
}

/**
 * The `POST /v1/context` body (API.md).
 */
export function contextRequest({ chatId, speakerId, presentIds, contextSize, type, chat, memoryBank = true }) {
    return {
        chat_id: chatId,
        speaker_id: speakerId,
        present_ids: presentIds,
        context_tokens: Math.max(0, Math.floor(Number(contextSize) || 0)),
        last_action: lastAction(chat, type),
        generation_type: type,
        memory_bank: memoryBank,
    };
}

/**
 * A turn's `POST /v1/context` body from SillyTavern's prompt size and its standing prompt's tokens,
 * with the sidecar's budget it carries: the interceptor's request, and the one early.js asks
 * ahead of it (the two must be the same request for the early answer to be taken).
 * @returns {{budget: number, body: object}}
 */
export function turnRequest({ chatId, speakerId, presentIds, contextSize, standing, settings, type, chat }) {
    const budget = sidecarBudget(contextSize, standing, settings.promptOverheadTokens);
    const body = contextRequest({
        chatId, speakerId, presentIds, contextSize: budget, type, chat, memoryBank: settings.memoryBank !== false,
    });
    return { budget, body };
}

/** Keep the last `size` numbers (per-generation timings, for the panel and the E2E measurement). */
export class RingBuffer {
    constructor(size = 200) {
        this.size = size;
        this.items = [];
    }

    push(value) {
        this.items.push(value);
        if (this.items.length > this.size) this.items.shift();
    }
}

/**
 * Build the interceptor function SillyTavern calls as `(chat, contextSize, abort, type)`.
 *
 * @param {{
 *   getContext: () => any,
 *   getSettings: () => import('./settings.js').DEFAULTS,
 *   getClient: () => import('./client.js').SidecarClient,
 *   sync: import('./sync/index.js').ChatSync,
 *   turns: {current: {id: string, chatId: string}|null},
 *   injected: {keys: Set<string>},
 *   notifyFailure: (error: Error) => void,
 *   notifySuccess: () => void,
 *   stats: {timings: RingBuffer, lastReport: any, lastError: any, lastTrimmed: number},
 *   features?: {known: Record<string, boolean|undefined>, note: (name: string, exists: boolean) => void},
 *   standingTokens?: (ctx: any) => Promise<number>,
 *   tightBudget?: import('./reserve.js').TightBudgetNotice,
 *   notifyTightBudget?: (message: string) => void,
 *   early?: import('./early.js').EarlyContext,
 * }} deps
 */
export function createInterceptor(deps) {
    return async function chroniclerInterceptor(chat, contextSize, _abort, rawType) {
        const type = rawType ?? 'normal'; // Generate()'s type may be left undefined by callers
        const settings = deps.getSettings();
        if (!settings.enabled || SKIPPED_TYPES.includes(type)) return;
        const ctx = deps.getContext();
        const chatId = ctx.getCurrentChatId?.();
        const speakerId = characterAvatar(ctx);
        if (!chatId || !speakerId) return;

        const started = performance.now();
        const remaining = () => Math.max(1, settings.contextTimeoutMs - (performance.now() - started));
        const plan = planTurn({
            type, lastMessage: ctx.chat.at(-1), current: deps.turns.current, chatId,
            newId: idMaker(ctx),
        });
        deps.turns.current = { id: plan.turnId, chatId };
        for (const turnId of plan.rollback) deps.sync.rollback(chatId, turnId);
        // A sidecar without the context route: nothing to ask (the user was told once).
        if (deps.features?.known?.context === false) {
            deps.sync.release?.();
            deps.stats.timings.push(performance.now() - started);
            return;
        }
        // Let a swipe's or regenerate's rollback (and deletes, a first registration) land first, but
        // leave the context call the rest of the time limit (ChatSync.settled).
        await deps.sync.settled(chatId, Math.min(settings.syncWaitMs, remaining()));
        const waited = performance.now() - started;
        let recording = null;

        try {
            const { activeMemberIds, isGroup } = chatMembers(ctx);
            // SillyTavern's own card, persona and system prompt take their part of contextSize first.
            const standing = (await deps.standingTokens?.(ctx)) ?? 0;
            const counted = performance.now();
            const { budget, body } = turnRequest({
                chatId, speakerId, presentIds: isGroup ? activeMemberIds : [speakerId],
                contextSize, standing, settings, type, chat,
            });
            const tight = deps.tightBudget?.check(chatId, {
                contextSize, standing, budget, minimum: settings.minMemoryBudgetTokens ?? 0,
            });
            if (tight) deps.notifyTightBudget?.(tight);
            deps.stats.lastRequest = body;
            deps.early?.noteSize(chatId, contextSize);
            const asked = performance.now();
            // The early ask's answer (early.js) when it was this request; if it failed, ask here.
            const early = deps.early?.take(body);
            const earlyAnswer = early ? await early.promise.catch(() => null) : null;
            let timing = {};
            let answer = earlyAnswer;
            if (earlyAnswer) {
                timing = early.timing;
                // The same request once more, not awaited: the sidecar records the turn. The
                // user's message's upsert waits for it, as it waits for any context call.
                recording = deps.getClient().context(body, { timeoutMs: settings.contextTimeoutMs })
                    .then(() => deps.notifySuccess(), error => deps.notifyFailure(error));
            } else {
                answer = await deps.getClient().context(body, { timeoutMs: remaining(), timing });
            }
            const answered = performance.now();
            deps.notifySuccess();
            deps.stats.lastTrimmed = trimToLive(chat, answer?.live_message_ids);
            const calls = blocksToPrompts(answer?.blocks, settings.injection);
            deps.injected.keys = applyPrompts(ctx.setExtensionPrompt, calls, deps.injected.keys);
            // Where this generation's time went (the panel, bench/extension_overhead.py).
            deps.stats.parts?.push({
                wait: waited, standing: counted - started - waited, request: asked - counted,
                context: answered - asked, apply: performance.now() - answered,
                // An early answer's sidecar time was spent before the generation started.
                ...(timing.serverMs === undefined || earlyAnswer ? {} : { server: timing.serverMs }),
                ...(timing.ahead ? { ahead: true } : {}),
                ...(earlyAnswer ? { early: true } : {}),
            });
            deps.stats.lastReport = answer?.report ?? null;
            deps.stats.lastError = null;
        } catch (error) {
            // Fail open: no stale blocks from an earlier turn, the chat untouched.
            clearPrompts(ctx.setExtensionPrompt, deps.injected.keys);
            deps.injected.keys = new Set();
            deps.stats.lastError = error;
            if (isMissingRoute(error)) deps.features?.note('context', false);
            deps.notifyFailure(error);
        } finally {
            // The upserts held since GENERATION_STARTED may go now (after the recording call).
            if (recording) recording.finally(() => deps.sync.release?.());
            else deps.sync.release?.();
            // The early ask's main-thread time is this generation's too (early.js).
            deps.stats.timings.push(performance.now() - started + (deps.early?.drainSpent() ?? 0));
        }
    };
}
