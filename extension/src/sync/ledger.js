// What the sidecar has of a chat: what this page last saw and sent (`ChatLedger`), what vanished
// since (`reconcile`), and what the sidecar holds that the chat no longer has (orphans).
//
// After any chat event the whole chat is compared with what was seen and sent before: new and
// changed messages are upserted, vanished ones deleted. That one rule covers sends, replies,
// edits, swipes, deletes (MESSAGE_DELETED gives only the new length) and recovers by itself after
// an outage. Pure, except `listAllIds`, which pages through the sidecar's answer.

/**
 * A short fingerprint of a record, to skip re-sending unchanged messages. FNV-1a, 2x32 bits.
 * @param {{role: string, name: string, text: string, sent_at: string, turn_id?: string, speaker_id?: string, index?: number}} record
 * @returns {string}
 */
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
    return { removed, tail, rollbackTurns: tail ? turnsOf(ledger, vanished) : [] };
}

/** The turns that wrote the generated replies among `ids`, each once, in order. */
function turnsOf(ledger, ids) {
    const turns = [];
    for (const id of ids) {
        const entry = ledger.seen.get(id);
        if (entry?.role === 'assistant' && entry.turnId && !turns.includes(entry.turnId)) turns.push(entry.turnId);
    }
    return turns;
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
 * @returns {Promise<string[]>}
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
 * @returns {string[]}
 */
export function orphanIds(held, current) {
    const keep = new Set(current);
    return held.filter(id => !keep.has(id));
}
