// Keeping the sidecar's copy of the chat in step with SillyTavern's.
//
// Every message gets a stable id of ours in `message.extra.chronicler_id`; SillyTavern saves it
// with the chat and copies `extra` into each swipe, so a message keeps its id when swiped. A
// branch copies the messages (ids included) into a new chat: ids are unique within one chat,
// and the sidecar keys messages by (chat id, message id).
//
// After any chat event the whole chat is compared with what was seen and sent before (the
// `ChatLedger`): new and changed messages are upserted, vanished ones deleted. That one rule
// covers sends, replies, edits, swipes, deletes (MESSAGE_DELETED gives only the new length) and
// recovers by itself after an outage. Pure functions first; the `ChatSync` class does the I/O.

import { isMissingRoute } from './client.js';
import { characterCopy, moveCharacter } from './rename.js';

export const ID_KEY = 'chronicler_id';
export const TURN_KEY = 'chronicler_turn_id';

/** Our id of a message, or undefined. */
export function messageId(message) {
    const id = message?.extra?.[ID_KEY];
    return typeof id === 'string' && id ? id : undefined;
}

/** The turn that generated a message (its current swipe), or undefined. */
export function messageTurn(message) {
    const id = message?.extra?.[TURN_KEY];
    return typeof id === 'string' && id ? id : undefined;
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
        if (!message.extra || typeof message.extra !== 'object') message.extra = {};
        message.extra[ID_KEY] = newId();
        assigned.push(index);
    });
    return assigned;
}

/**
 * Stamp the turn that produced a message (an assistant reply or a new swipe of it).
 * @returns {boolean} whether the message changed
 */
export function stampTurn(message, turnId) {
    if (!message || message.is_user || !turnId) return false;
    if (!message.extra || typeof message.extra !== 'object') message.extra = {};
    if (message.extra[TURN_KEY] === turnId) return false;
    message.extra[TURN_KEY] = turnId;
    return true;
}

/**
 * SillyTavern's send_date (ISO string today; a number or a "November 29, 2026 4:52pm" string in
 * older chats) -> ISO 8601 UTC; `fallback` when it cannot be read.
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
 * leaves out of the prompt, and messages without an id yet.
 * @param {object} message
 * @param {string} fallbackDate ISO date for messages without a readable send_date
 * @param {{index?: number, defaultSpeaker?: string}} [where] its position in the chat; the chat's
 *   character when it is a one-character chat
 */
export function toRecord(message, fallbackDate, { index, defaultSpeaker } = {}) {
    const id = messageId(message);
    if (!id || message.is_system) return null;
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

/** A short fingerprint of a record, to skip re-sending unchanged messages. FNV-1a, 2x32 bits. */
export function fingerprint(record) {
    const text = [record.role, record.name, record.text, record.sent_at, record.turn_id ?? '',
        record.speaker_id ?? '', record.index ?? ''].join('\u0000');
    let h1 = 0x811c9dc5;
    let h2 = 0x01000193 ^ text.length;
    for (let i = 0; i < text.length; i++) {
        const c = text.charCodeAt(i);
        h1 = Math.imul(h1 ^ c, 0x01000193);
        h2 = Math.imul(h2 ^ c, 0x5bd1e995);
    }
    return (h1 >>> 0).toString(36) + (h2 >>> 0).toString(36);
}

/**
 * One chat as this page last saw it and as the sidecar last accepted it.
 *
 * `seen` and `order` are updated at every sync, synchronously (what the chat held then: roles and
 * turns of its sendable messages, in order); `sent` holds the fingerprint of each message the
 * sidecar accepted. Deciding what vanished uses `seen`, so a regenerate is recognised (and its
 * turn rolled back) even when the reply never reached the sidecar.
 */
export class ChatLedger {
    constructor() {
        /** @type {Map<string, {role: string, turnId?: string}>} */
        this.seen = new Map();
        /** @type {string[]} ids of `seen` in chat order */
        this.order = [];
        /** @type {Map<string, string>} id -> fingerprint accepted by the sidecar */
        this.sent = new Map();
        /** Whether the sidecar's copy was checked for orphans since the page loaded. */
        this.reconciled = false;
    }

    /** Remember the chat's sendable records as they stand now. */
    observe(records) {
        this.seen = new Map(records.map(r => [r.id, { role: r.role, turnId: r.turn_id }]));
        this.order = records.map(r => r.id);
    }

    /** Records that are new or changed since the sidecar last accepted them. */
    changed(records) {
        return records.filter(r => this.sent.get(r.id) !== fingerprint(r));
    }

    /** Note records as accepted by the sidecar. */
    markSent(records) {
        for (const r of records) this.sent.set(r.id, fingerprint(r));
    }

    /** Note messages as deleted in the sidecar. */
    markDeleted(ids) {
        for (const id of ids) this.sent.delete(id);
    }
}

/**
 * Compare the last observation with the chat now: which messages the sidecar should no longer
 * hold, whether they vanished from the end (a regenerate, or the user deleting the last replies),
 * and which turns to roll back.
 *
 * Rule (RV10 in SillyTavern's terms): when generated replies are cut from the end of the chat,
 * the turns that wrote them are rolled back; a delete in the middle only deletes the message.
 * A message merely hidden (still in the chat) is deleted from the sidecar, never rolled back.
 *
 * @param {ChatLedger} ledger
 * @param {Array<string|undefined>} chatIds ids of every message now in the chat, in order (hidden ones too)
 * @param {Set<string>|string[]} sendableIds ids the sidecar should hold now
 * @returns {{removed: string[], tail: boolean, rollbackTurns: string[]}}
 */
export function reconcile(ledger, chatIds, sendableIds) {
    const sendable = sendableIds instanceof Set ? sendableIds : new Set(sendableIds);
    const inChat = new Set(chatIds);
    const removed = ledger.order.filter(id => !sendable.has(id));
    const vanished = removed.filter(id => !inChat.has(id));
    if (!vanished.length) return { removed, tail: false, rollbackTurns: [] };
    // A tail cut: what survives of the observed order is a prefix of it.
    const survivors = ledger.order.filter(id => inChat.has(id));
    const tail = survivors.every((id, i) => ledger.order[i] === id);
    const turns = [];
    if (tail) {
        for (const id of vanished) {
            const entry = ledger.seen.get(id);
            if (entry?.role === 'assistant' && entry.turnId && !turns.includes(entry.turnId)) turns.push(entry.turnId);
        }
    }
    return { removed, tail, rollbackTurns: turns };
}

/**
 * True while a swipe is waiting for its generation: SillyTavern moves `swipe_id` one past the
 * last swipe before generating, and the message still shows the previous text.
 */
export function swipePending(message) {
    return Array.isArray(message?.swipes) && Number.isInteger(message.swipe_id) && message.swipe_id >= message.swipes.length;
}

/** Split a list into batches of at most `size`. */
export function batches(items, size) {
    const out = [];
    for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
    return out;
}

/**
 * Who is in the current chat, as sidecar character ids (SillyTavern avatar file names).
 * @param {{groupId?: string, groups?: object[], characters?: object[], characterId?: any}} ctx
 * @returns {{isGroup: boolean, memberIds: string[], activeMemberIds: string[]}}
 */
export function chatMembers(ctx) {
    if (ctx.groupId !== undefined && ctx.groupId !== null) {
        const group = (ctx.groups ?? []).find(g => String(g.id) === String(ctx.groupId));
        const members = (group?.members ?? []).filter(m => typeof m === 'string' && m);
        const disabled = new Set(group?.disabled_members ?? []);
        return { isGroup: true, memberIds: members, activeMemberIds: members.filter(m => !disabled.has(m)) };
    }
    const avatar = ctx.characters?.[ctx.characterId]?.avatar;
    const ids = avatar ? [avatar] : [];
    return { isGroup: false, memberIds: ids, activeMemberIds: ids };
}

/**
 * The sidecar's character record for a SillyTavern card seen for the first time. Only identity:
 * SillyTavern already puts the card itself into the prompt, so copying it into the sheet would
 * send it twice; sheets grow from play and from the panel.
 */
export function characterFromCard(card) {
    return { name: String(card?.name ?? card?.avatar ?? ''), aliases: [], sheet: {}, is_player: false };
}

/**
 * Does the I/O of syncing, serialised in one queue so events never overtake each other and
 * SillyTavern's own event flow is never held up (handlers enqueue and return).
 */
export class ChatSync {
    /**
     * @param {{
     *   getContext: () => any,
     *   getClient: () => import('./client.js').SidecarClient,
     *   batchSize: () => number,
     *   onSuccess: () => void,
     *   onError: (error: Error, what: string) => void,
     *   features?: import('./features.js').Features,
     *   now?: () => string,
     * }} deps
     */
    constructor(deps) {
        this.deps = deps;
        this.now = deps.now ?? (() => new Date().toISOString());
        /** @type {Map<string, ChatLedger>} chat id -> ledger */
        this.ledgers = new Map();
        /** @type {Set<string>} character ids known to exist in the sidecar */
        this.knownCharacters = new Set();
        /** @type {Set<string>} renamed characters whose sidecar name may still be the old one */
        this.namesToCheck = new Set();
        /** @type {Map<string, string>} chat id -> fingerprint of its last registration */
        this.registered = new Map();
        // Work that must reach the sidecar even across an outage: kept until it succeeds.
        /** @type {Map<string, Set<string>>} chat id -> turns to roll back */
        this.pendingRollbacks = new Map();
        /** @type {Map<string, Set<string>>} chat id -> message ids to delete */
        this.pendingDeletes = new Map();
        this.queue = Promise.resolve();
        /** @type {Map<string, Promise<void>>} chat id -> last queued task with a rollback, delete or registration */
        this.critical = new Map();
        /** While a generation waits for its context, ordinary upserts wait too (see `hold`). */
        this.gate = null;
        this.openGate = null;
    }

    /**
     * Hold ordinary upserts (not rollbacks, deletes or registrations) until `release()` or `ms`.
     * A generation starts by adding the user's message (MESSAGE_SENT) and then asks for its
     * context; the context does not need that upsert (it carries the last action), and on the
     * sidecar the upsert's embedding would run at the same time as the context call's and slow it.
     * @param {number} ms the longest hold
     */
    hold(ms) {
        this.release();
        let open;
        const gate = new Promise(resolve => { open = resolve; });
        const timer = setTimeout(() => this.release(), Math.max(0, ms));
        this.gate = gate;
        this.openGate = () => {
            clearTimeout(timer);
            open();
        };
    }

    /** Let held upserts go (idempotent). */
    release() {
        const open = this.openGate;
        this.gate = null;
        this.openGate = null;
        open?.();
    }

    ledger(chatId) {
        if (!this.ledgers.has(chatId)) this.ledgers.set(chatId, new ChatLedger());
        return this.ledgers.get(chatId);
    }

    /** Run `task` after everything queued before it; errors are reported, never thrown here. */
    enqueue(what, task) {
        const run = this.queue.then(task).then(
            () => this.deps.onSuccess(),
            (error) => this.deps.onError(error, what),
        );
        this.queue = run;
        return run;
    }

    /** Resolves when the queue is empty, or after `ms` (whichever comes first). */
    idle(ms) {
        return raceTimeout(this.queue, ms);
    }

    /**
     * Resolves when the work a turn's context depends on has reached the sidecar, or after `ms`:
     * a swipe's or regenerate's rollback (RV10: the rolled-back memories must not be in the next
     * prompt), deleted messages, and the chat's first registration. Ordinary upserts are not waited
     * for: the context request carries the last action itself, so waiting for the new message's
     * upsert (an embedding on the sidecar) would only add its time to every generation.
     * @param {string} chatId
     * @param {number} ms
     */
    settled(chatId, ms) {
        const pending = this.pendingRollbacks.get(chatId)?.size || this.pendingDeletes.get(chatId)?.size
            || !this.registered.has(chatId);
        const critical = this.critical.get(chatId);
        if (!pending && !critical) return Promise.resolve();
        return raceTimeout(pending ? this.queue : critical, ms);
    }

    /** Remember the queued task that carries critical work for a chat (see `settled`). */
    markCritical(chatId, run) {
        this.critical.set(chatId, run);
        run.finally(() => {
            if (this.critical.get(chatId) === run) this.critical.delete(chatId);
        });
    }

    /**
     * Bring the sidecar in step with the current chat. Ids are assigned and the chat compared with
     * the last observation at once (synchronously: SillyTavern's next save includes the ids, and a
     * regenerate's rollback is known before its generation starts); the network part is queued.
     * @param {string} what the event that asked, for error messages
     * @returns {{assigned: number[], done: Promise<void>}} indexes that got new ids; the queued work
     */
    syncCurrentChat(what) {
        const ctx = this.deps.getContext();
        const chatId = ctx.getCurrentChatId?.();
        if (!chatId) return { assigned: [], done: Promise.resolve() };
        const chat = ctx.chat;
        const assigned = ensureIds(chat, ctx.uuidv4 ?? (() => crypto.randomUUID()));
        const members = chatMembers(ctx);
        const defaultSpeaker = members.isGroup ? undefined : members.memberIds[0];
        const records = chatRecords(chat, this.now(), defaultSpeaker);
        const ledger = this.ledger(chatId);
        const { removed, rollbackTurns } = reconcile(ledger, chat.map(messageId), records.map(r => r.id));
        ledger.observe(records);
        for (const turnId of rollbackTurns) addTo(this.pendingRollbacks, chatId, turnId);
        for (const id of removed) addTo(this.pendingDeletes, chatId, id);
        for (const r of records) this.pendingDeletes.get(chatId)?.delete(r.id); // back again (unhidden)
        const cards = members.memberIds.map(id => ctx.characters?.find(c => c.avatar === id)).filter(Boolean);
        const title = ctx.groupId ? (ctx.groups ?? []).find(g => String(g.id) === String(ctx.groupId))?.name : ctx.name2;
        const critical = rollbackTurns.length || removed.length || !this.registered.has(chatId);
        const gate = critical ? null : this.gate;
        const done = this.enqueue(what, async () => {
            if (gate) await gate;
            return this.push(chatId, { records, members, cards, title });
        });
        if (critical) this.markCritical(chatId, done);
        return { assigned, done };
    }

    /** The network part of a sync: register, roll back, delete what vanished, upsert changes. */
    async push(chatId, { records, members, cards, title }) {
        const client = this.deps.getClient();
        await this.registerCharacters(client, cards);
        await this.registerChat(client, chatId, members.memberIds, title);
        await this.drainRollbacks(client, chatId);
        await this.drainDeletes(client, chatId);
        await this.deleteOrphans(client, chatId, records);
        const ledger = this.ledger(chatId);
        for (const batch of batches(ledger.changed(records), this.deps.batchSize())) {
            await client.upsertMessages(chatId, batch);
            ledger.markSent(batch);
        }
    }

    /**
     * Create sidecar characters for cards seen for the first time (never overwrite a sheet); give a
     * renamed card's character its new name (the old one kept as an alias).
     */
    async registerCharacters(client, cards) {
        for (const card of cards) {
            if (this.knownCharacters.has(card.avatar)) continue;
            try {
                const existing = await client.getCharacter(card.avatar);
                const character = existing?.character ?? existing;
                if (this.namesToCheck.has(card.avatar) && card.name && character?.name !== card.name) {
                    await client.putCharacter(card.avatar, characterCopy(character, card.name));
                }
            } catch (err) {
                if (err?.status !== 404) throw err;
                await client.putCharacter(card.avatar, characterFromCard(card));
            }
            this.namesToCheck.delete(card.avatar);
            this.knownCharacters.add(card.avatar);
        }
    }

    /** Tell the sidecar about the chat and its members (again only when they changed). */
    async registerChat(client, chatId, memberIds, title) {
        const body = { member_ids: memberIds };
        if (title) body.title = String(title);
        const key = JSON.stringify(body);
        if (this.registered.get(chatId) === key) return;
        await client.putChat(chatId, body);
        this.registered.set(chatId, key);
    }

    /**
     * Roll a turn back (queued behind pending syncs). A rollback that fails stays pending and is
     * retried before the next sync of that chat, so an outage cannot leave a replaced turn's
     * memories behind.
     */
    rollback(chatId, turnId) {
        addTo(this.pendingRollbacks, chatId, turnId);
        const run = this.enqueue('rollback', () => this.drainRollbacks(this.deps.getClient(), chatId));
        this.markCritical(chatId, run);
        return run;
    }

    async drainRollbacks(client, chatId) {
        const pending = this.pendingRollbacks.get(chatId);
        for (const turnId of [...(pending ?? [])]) {
            await client.rollbackTurn(chatId, turnId);
            pending.delete(turnId);
        }
    }

    async drainDeletes(client, chatId) {
        const pending = this.pendingDeletes.get(chatId);
        const ledger = this.ledger(chatId);
        for (const id of [...(pending ?? [])]) {
            await client.deleteMessage(chatId, id).catch(err => {
                if (err?.status !== 404) throw err; // never sent, or already gone: fine
            });
            pending.delete(id);
            ledger.markDeleted([id]);
        }
    }

    /**
     * Once per chat and page load: delete what the sidecar holds of this chat that the chat no
     * longer has (messages deleted while the page was closed or the sidecar down). Skipped, and
     * tried again next time, when the sidecar cannot list ids; a sidecar without the route never
     * gets asked again.
     */
    async deleteOrphans(client, chatId, records) {
        const ledger = this.ledger(chatId);
        if (ledger.reconciled || this.deps.features?.known?.messageIds === false) return;
        let held;
        try {
            held = await listAllIds(client, chatId);
        } catch (error) {
            if (isMissingRoute(error)) {
                this.deps.features?.note('messageIds', false);
                ledger.reconciled = true;
                return;
            }
            if (error?.status === 404) { // the chat is new to the sidecar: nothing to reconcile
                ledger.reconciled = true;
                return;
            }
            throw error;
        }
        const orphans = orphanIds(held, records.map(r => r.id));
        for (const id of orphans) {
            await client.deleteMessage(chatId, id).catch(err => {
                if (err?.status !== 404) throw err;
            });
            ledger.markDeleted([id]);
        }
        ledger.reconciled = true;
    }

    /**
     * SillyTavern renamed a chat file (CHAT_RENAMED). It reopens the chat under its new id before
     * telling us, so by the time this runs the new id usually exists in the sidecar as a fresh
     * copy: that copy is dropped and the old chat (with its summaries and sessions) renamed onto it.
     * @param {string} oldId
     * @param {string} newId
     */
    renameChat(oldId, newId) {
        if (!oldId || !newId || oldId === newId) return Promise.resolve();
        moveKey(this.pendingRollbacks, oldId, newId);
        moveKey(this.pendingDeletes, oldId, newId);
        return this.enqueue('CHAT_RENAMED', async () => {
            const client = this.deps.getClient();
            try {
                await client.renameChat(oldId, newId);
            } catch (error) {
                if (isMissingRoute(error)) return; // an older sidecar: the new id lives on as a new chat
                if (error?.status === 404) return; // the old chat never reached the sidecar
                if (error?.status !== 409) throw error;
                await client.deleteChat(newId);
                await client.renameChat(oldId, newId);
            }
            this.ledgers.delete(oldId);
            this.registered.delete(oldId);
            // What the sidecar holds under the new id is now the old chat's copy: send everything again.
            this.ledger(newId).sent.clear();
            this.registered.delete(newId);
        });
    }

    /** SillyTavern deleted a chat (CHAT_DELETED / GROUP_CHAT_DELETED): delete it in the sidecar too. */
    deleteChat(chatId) {
        if (!chatId) return Promise.resolve();
        this.pendingRollbacks.delete(chatId);
        this.pendingDeletes.delete(chatId);
        return this.enqueue('CHAT_DELETED', async () => {
            await this.deps.getClient().deleteChat(chatId).catch(err => {
                if (err?.status !== 404 && !isMissingRoute(err)) throw err;
            });
            this.ledgers.delete(chatId);
            this.registered.delete(chatId);
        });
    }

    /**
     * A character card was renamed (CHARACTER_RENAMED gives the old and new avatar file names):
     * move the sidecar's character and its memories to the new id (rename.js).
     * @param {string} oldAvatar
     * @param {string} newAvatar
     * @param {() => string|undefined} newName the card's new name, read when the move runs
     */
    renameCharacter(oldAvatar, newAvatar, newName = () => undefined) {
        if (!oldAvatar || !newAvatar || oldAvatar === newAvatar) return Promise.resolve();
        return this.enqueue('CHARACTER_RENAMED', async () => {
            const name = newName();
            await moveCharacter(this.deps.getClient(), oldAvatar, newAvatar, name);
            this.knownCharacters.delete(oldAvatar);
            // SillyTavern reloads its cards after the event: when the new name was not known yet,
            // the next sync that sees the card renames the sidecar's character (registerCharacters).
            if (name) this.knownCharacters.add(newAvatar);
            else this.knownCharacters.delete(newAvatar);
            if (!name) this.namesToCheck.add(newAvatar);
            this.registered.clear(); // member lists name the new id from the next sync on
        });
    }

    /** A character card was deleted in SillyTavern: delete it in the sidecar (RV6: its memories turn global). */
    deleteCharacter(avatar) {
        if (!avatar) return Promise.resolve();
        return this.enqueue('CHARACTER_DELETED', async () => {
            await this.deps.getClient().deleteCharacter(avatar).catch(err => {
                if (err?.status !== 404) throw err;
            });
            this.knownCharacters.delete(avatar);
        });
    }
}

/**
 * Message ids from `GET /v1/chats/{id}/messages?ids_only=true`: `{ids: [...]}`, or the list
 * wrapping of API.md (`{messages: [{id}, ...]}`).
 * @param {any} answer
 * @returns {string[]}
 */
export function idsFromListing(answer) {
    const raw = Array.isArray(answer?.ids) ? answer.ids : Array.isArray(answer?.messages) ? answer.messages : [];
    return raw.map(x => (typeof x === 'string' ? x : x?.id)).filter(x => typeof x === 'string' && x);
}

/**
 * Every id the sidecar holds for a chat, page by page (`{ids, total, offset, limit}`).
 * @param {{listMessageIds: (chatId: string, offset: number) => Promise<any>}} client
 * @param {string} chatId
 */
export async function listAllIds(client, chatId) {
    const all = [];
    for (;;) {
        const answer = await client.listMessageIds(chatId, all.length);
        const page = idsFromListing(answer);
        all.push(...page);
        const total = Number.isInteger(answer?.total) ? answer.total : all.length;
        if (!page.length || all.length >= total) return all;
    }
}

/**
 * Ids the sidecar holds that the chat no longer sends.
 * @param {string[]} held ids in the sidecar
 * @param {string[]} current ids the chat sends now
 */
export function orphanIds(held, current) {
    const keep = new Set(current);
    return held.filter(id => !keep.has(id));
}

/** `promise`, or nothing after `ms` — whichever comes first (never rejects). */
function raceTimeout(promise, ms) {
    let timer;
    const limit = new Promise(resolve => { timer = setTimeout(resolve, Math.max(0, ms)); });
    return Promise.race([promise.catch(() => {}), limit]).finally(() => clearTimeout(timer));
}

function moveKey(map, from, to) {
    const value = map.get(from);
    if (!value) return;
    map.delete(from);
    const target = map.get(to) ?? new Set();
    for (const v of value) target.add(v);
    map.set(to, target);
}

function addTo(map, key, value) {
    if (!map.has(key)) map.set(key, new Set());
    map.get(key).add(value);
}
