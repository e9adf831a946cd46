// SillyTavern messages as the sidecar's records (pure: no I/O, no SillyTavern access).
//
// Every message gets a stable id of ours in `message.extra.chronicler_id`; SillyTavern saves it
// with the chat and copies `extra` into each swipe, so a message keeps its id when swiped. A
// branch copies the messages (ids included) into a new chat: ids are unique within one chat,
// and the sidecar keys messages by (chat id, message id).

export const ID_KEY = 'chronicler_id';
export const TURN_KEY = 'chronicler_turn_id';

/** A non-empty string kept in `message.extra[key]`, or undefined. */
function extraString(message, key) {
    const value = message?.extra?.[key];
    return typeof value === 'string' && value ? value : undefined;
}

/** Our id of a message, or undefined. */
export function messageId(message) {
    return extraString(message, ID_KEY);
}

/** The turn that generated a message (its current swipe), or undefined. */
export function messageTurn(message) {
    return extraString(message, TURN_KEY);
}

/**
 * How new ids are made: SillyTavern's uuidv4 when the context has it (the ids then look like the
 * rest of SillyTavern's), else the browser's.
 * @param {{uuidv4?: () => string}} ctx SillyTavern.getContext()
 * @returns {() => string}
 */
export function idMaker(ctx) {
    return ctx.uuidv4 ?? (() => crypto.randomUUID());
}

/** `message.extra`, created when missing or not an object (SillyTavern saves it with the chat). */
function extraOf(message) {
    if (!message.extra || typeof message.extra !== 'object') message.extra = {};
    return message.extra;
}

/**
 * Give every message without one an id (this changes the stored chat, on purpose).
 * @param {object[]} chat SillyTavern's live chat array
 * @param {() => string} newId
 * @returns {number[]} indexes that got a new id
 */
export function ensureIds(chat, newId) {
    const assigned = [];
    chat.forEach((message, index) => {
        if (!message || typeof message !== 'object' || messageId(message)) return;
        extraOf(message)[ID_KEY] = newId();
        assigned.push(index);
    });
    return assigned;
}

/**
 * Stamp the turn that produced a message (an assistant reply or a new swipe of it).
 * @param {object} message
 * @param {string} turnId
 * @returns {boolean} whether the message changed
 */
export function stampTurn(message, turnId) {
    if (!message || message.is_user || !turnId) return false;
    const extra = extraOf(message);
    if (extra[TURN_KEY] === turnId) return false;
    extra[TURN_KEY] = turnId;
    return true;
}

/**
 * SillyTavern's send_date (ISO string today; a number or a "November 29, 2026 4:52pm" string in
 * older chats) -> ISO 8601 UTC; `fallback` when it cannot be read.
 * @param {string|number|undefined|null} sendDate
 * @param {string} fallback
 */
export function toIso(sendDate, fallback) {
    if (sendDate === undefined || sendDate === null || sendDate === '') return fallback;
    const date = typeof sendDate === 'number' ? new Date(sendDate) : new Date(String(sendDate).replace(/(\d)(am|pm)$/i, '$1 $2'));
    return Number.isNaN(date.getTime()) ? fallback : date.toISOString();
}

/**
 * The persona a user message was sent as: SillyTavern locks it in `force_avatar` as a thumbnail
 * URL (`/thumbnail?type=persona&file=<avatar>`). Undefined when the message does not say.
 * @param {object} message
 */
export function personaOf(message) {
    const url = typeof message?.force_avatar === 'string' ? message.force_avatar : '';
    if (!url.includes('type=persona')) return undefined;
    try {
        const file = new URL(url, 'http://x.invalid').searchParams.get('file');
        return file || undefined;
    } catch {
        return undefined;
    }
}

/**
 * Who spoke a message, as a sidecar id (avatar file name): SillyTavern stamps group replies with
 * `original_avatar`; in a one-character chat every reply is that character's; a user message is
 * its persona's (API: "the persona's id for a user message"), when SillyTavern recorded one.
 * @param {object} message
 * @param {string|undefined} defaultSpeaker the chat's character in a one-character chat
 */
export function speakerOf(message, defaultSpeaker) {
    if (!message) return undefined;
    if (message.is_user) return personaOf(message);
    const avatar = typeof message.original_avatar === 'string' && message.original_avatar ? message.original_avatar : undefined;
    return avatar ?? defaultSpeaker ?? undefined;
}

/**
 * The upsert record of one message (API.md `POST /v1/chats/{id}/messages`), or null for a message
 * the sidecar does not get: hidden and system messages (`is_system`), which SillyTavern also
 * leaves out of the prompt, messages without an id yet, and the "previously" recap a continued
 * campaign's chat opens with (CP1f: it retells the memory; stored, it would be remembered twice).
 * @param {object} message
 * @param {string} fallbackDate ISO date for messages without a readable send_date
 * @param {{index?: number, defaultSpeaker?: string}} [where] its position in the chat; the chat's
 *   character when it is a one-character chat
 */
export function toRecord(message, fallbackDate, { index, defaultSpeaker } = {}) {
    const id = messageId(message);
    if (!id || message.is_system || message.extra?.chronicler_recap) return null;
    const record = {
        id,
        role: message.is_user ? 'user' : 'assistant',
        name: String(message.name ?? ''),
        text: String(message.mes ?? ''),
        sent_at: toIso(message.send_date, fallbackDate),
    };
    const turn = messageTurn(message);
    if (turn && !message.is_user) record.turn_id = turn;
    const speaker = speakerOf(message, defaultSpeaker);
    if (speaker) record.speaker_id = speaker;
    if (Number.isInteger(index) && index >= 0) record.index = index;
    return record;
}

/**
 * The records of a whole chat, in order (index = position in SillyTavern's chat array).
 * @param {object[]} chat
 * @param {string} fallbackDate
 * @param {string|undefined} defaultSpeaker
 */
export function chatRecords(chat, fallbackDate, defaultSpeaker) {
    return chat.map((m, index) => toRecord(m, fallbackDate, { index, defaultSpeaker })).filter(Boolean);
}

/**
 * True while a swipe is waiting for its generation: SillyTavern moves `swipe_id` one past the
 * last swipe before generating, and the message still shows the previous text.
 * @param {object} message
 */
export function swipePending(message) {
    return Array.isArray(message?.swipes) && Number.isInteger(message.swipe_id) && message.swipe_id >= message.swipes.length;
}

/**
 * Rule CP2: the chat a branch or checkpoint was made from. SillyTavern names the parent chat in the
 * new chat's metadata (`main_chat`) but not the message; when the branch is first opened its last
 * message is the branch point, copied with its id.
 * @param {any} ctx SillyTavern's context
 * @returns {{chat_id: string, message_id?: string} | null}
 */
export function branchLink(ctx) {
    const parent = ctx.chatMetadata?.main_chat;
    if (typeof parent !== 'string' || !parent || parent === ctx.getCurrentChatId?.()) return originLink(ctx);
    return linkAt(ctx, parent);
}

/** The chat a link names, at the open chat's last message (the branch point) when it has an id. */
function linkAt(ctx, parent) {
    const last = ctx.chat?.length ? messageId(ctx.chat[ctx.chat.length - 1]) : undefined;
    return last ? { chat_id: parent, message_id: last } : { chat_id: parent };
}

/** Where the extension writes the id of the chat a chat file was registered as (`markOrigin`). */
export const ORIGIN_KEY = 'chronicler_chat_id';

/**
 * Rule CP1, CP2: SillyTavern's "Convert to group" copies a one-to-one chat's messages and its
 * metadata (without `main_chat`) into a new group chat; the origin mark we wrote in the old chat
 * names it. Such a group chat is a branch of the old one at its last message that keeps its
 * campaign (`keep_campaign`); any other copy carrying another chat's mark is a plain branch.
 * @param {any} ctx SillyTavern's context
 * @returns {{chat_id: string, message_id?: string, keep_campaign?: boolean} | null}
 */
export function originLink(ctx) {
    const origin = ctx.chatMetadata?.[ORIGIN_KEY];
    if (typeof origin !== 'string' || !origin || origin === ctx.getCurrentChatId?.()) return null;
    const link = linkAt(ctx, origin);
    return ctx.groupId ? { ...link, keep_campaign: true } : link;
}

/**
 * Write the open chat's id into its metadata (once), so a copy SillyTavern makes of the file
 * later says which chat it came from. Returns true when the metadata changed (save it).
 * @param {any} ctx SillyTavern's context
 * @param {string} chatId
 */
export function markOrigin(ctx, chatId) {
    if (!ctx.chatMetadata || ctx.chatMetadata[ORIGIN_KEY] === chatId) return false;
    ctx.chatMetadata[ORIGIN_KEY] = chatId;
    return true;
}
