// What SillyTavern itself spends of the context every turn, so the sidecar's budget leaves room
// for it. The generate interceptor's `contextSize` is the whole prompt budget (max context minus
// the response); SillyTavern fills part of it with its own standing prompt (the speaker's card,
// the persona, the system prompt) before our blocks and the chat. Asking the sidecar for all of
// it would overflow the model's context, and SillyTavern would then drop the oldest in-chat
// injections — pinned memories among them — to make the prompt fit.
// Pure module: SillyTavern is reached only through the context object passed in.

/** The card fields SillyTavern puts in every prompt (getCharacterCardFields' names). */
export const STANDING_FIELDS = Object.freeze([
    'system', 'description', 'personality', 'scenario', 'persona', 'mesExamples', 'jailbreak',
    'charDepthPrompt',
]);

/**
 * The text of SillyTavern's standing prompt for the current speaker: its card fields, and the
 * Chat Completion main prompt when there is one.
 *
 * @param {any} ctx SillyTavern.getContext()
 * @returns {string}
 */
export function standingText(ctx) {
    let fields = {};
    try {
        fields = ctx.getCharacterCardFields?.() ?? {};
    } catch {
        fields = {};
    }
    const parts = STANDING_FIELDS.map(name => fields[name]).filter(v => typeof v === 'string' && v.trim());
    const main = ctx.chatCompletionSettings?.prompts?.find?.(p => p?.identifier === 'main')?.content;
    if (typeof main === 'string' && main.trim()) parts.push(main);
    return parts.join('\n');
}

/**
 * A counter of the standing prompt's tokens that counts a text once (the card seldom changes
 * from turn to turn). A count that fails or takes longer than `ms` gives a rough one instead,
 * not kept: the next turn asks the tokenizer again.
 *
 * @param {(text: string) => number|Promise<number>} count the current model's token counter
 * @param {number} ms
 * @returns {(text: string) => Promise<number>}
 */
export function cachedCounter(count, ms) {
    let lastText = null;
    let lastCount = 0;
    return async text => {
        if (text === lastText) return lastCount;
        const answer = await withDeadline(Promise.resolve().then(() => count(text)), ms, null);
        const exact = typeof answer === 'number' ? answer : NaN; // Number(null) would be 0
        if (!Number.isFinite(exact) || exact < 0) return roughTokens(text);
        lastText = text;
        lastCount = Math.ceil(exact);
        return lastCount;
    };
}

/**
 * The budget to ask the sidecar for: the interceptor's context size minus the standing prompt and
 * a fixed overhead (message framing, names, SillyTavern's own separators), never below zero.
 *
 * @param {number} contextSize
 * @param {number} standingTokens
 * @param {number} overheadTokens
 */
export function sidecarBudget(contextSize, standingTokens, overheadTokens) {
    const tokens = value => Math.max(0, Math.floor(Number(value) || 0));
    return Math.max(0, tokens(contextSize) - tokens(standingTokens) - tokens(overheadTokens));
}

/**
 * Tells once per chat when SillyTavern's own prompt leaves Chronicler almost nothing: with a small
 * model context the card, persona and system prompt can take nearly all of it, and the memory the
 * user counts on silently stops reaching the model. Told again only after the budget recovered.
 */
export class TightBudgetNotice {
    constructor() {
        /** @type {Set<string>} chats told about while their budget stays tight */
        this.told = new Set();
    }

    /**
     * @param {string} chatId
     * @param {{contextSize: number, standing: number, budget: number, minimum: number}} sizes
     * @returns {string|null} the warning to show now, or null
     */
    check(chatId, { contextSize, standing, budget, minimum }) {
        if (budget >= minimum) {
            this.told.delete(chatId);
            return null;
        }
        if (this.told.has(chatId)) return null;
        this.told.add(chatId);
        return `Chronicler has only ${budget} tokens for memory in this chat: SillyTavern's own card, `
            + `persona and system prompt take about ${standing} of the model's ${contextSize}-token context. `
            + 'Pinned memories and summaries may not reach the model; raise the context size or shorten the card.';
    }
}

/**
 * `promise`'s value, or `fallback` when it rejects or takes longer than `ms` (a tokenizer that
 * asks the server must not hold up the generation).
 *
 * @template T
 * @param {Promise<T>} promise
 * @param {number} ms
 * @param {T} fallback
 * @returns {Promise<T>}
 */
export function withDeadline(promise, ms, fallback) {
    let timer;
    const late = new Promise(resolve => { timer = setTimeout(() => resolve(fallback), ms); });
    return Promise.race([Promise.resolve(promise).catch(() => fallback), late]).finally(() => clearTimeout(timer));
}

/** A rough count when the tokenizer cannot answer in time: about 3 characters a token (errs high). */
export function roughTokens(text) {
    return Math.ceil(String(text ?? '').length / 3);
}
