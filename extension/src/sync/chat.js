// Keeping the sidecar's copy of the chat in step with SillyTavern's: `ChatSync` does the I/O of
// syncing, serialised in one queue so events never overtake each other and SillyTavern's own
// event flow is never held up (handlers enqueue and return). What to send is decided by the pure
// parts: records.js (messages -> records), ledger.js (what was sent, what vanished), cast.js
// (who is in the chat, the sidecar's characters).

import { allowNotFound, isMissingRoute } from '../client.js';
import { CastSync, chatMembers, chatTitle } from './cast.js';
import { ChatLedger, listAllIds, orphanIds, reconcile } from './ledger.js';
import { SyncQueue } from './queue.js';
import { ID_KEY, branchLink, chatRecords, ensureIds, idMaker, markOrigin, messageId } from './records.js';

/**
 * Split a list into batches of at most `size`.
 * @template T
 * @param {T[]} items
 * @param {number} size
 * @returns {T[][]}
 */
export function batches(items, size) {
    const out = [];
    for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
    return out;
}

/** True when the sidecar has no such chat yet (any other answer: not known to be new). */
async function isNewChat(client, chatId) {
    try {
        await client.getChat(chatId);
        return false;
    } catch (error) {
        return error?.status === 404 && error?.code === 'chat_not_found';
    }
}

/** The campaign the sidecar files a chat under (CP1), or undefined (unknown chat, older sidecar). */
async function campaignOf(client, chatId) {
    try {
        return (await client.getChat(chatId))?.chat?.campaign_id ?? undefined;
    } catch {
        return undefined;
    }
}

/** The sidecar's copy of every chat this page opened, and the calls that keep it in step. */
export class ChatSync {
    /**
     * @param {{
     *   getContext: () => any,
     *   getClient: () => import('../client.js').SidecarClient,
     *   batchSize: () => number,
     *   onSuccess: () => void,
     *   onError: (error: Error, what: string) => void,
     *   features?: import('../features.js').Features,
     *   now?: () => string,
     *   savedMessages?: (ctx: any) => Promise<object[] | null>,
     * }} deps  savedMessages: the open chat as SillyTavern saved it (saved.js), for followSaved
     */
    constructor(deps) {
        this.deps = deps;
        this.now = deps.now ?? (() => new Date().toISOString());
        /** @type {Map<string, ChatLedger>} chat id -> ledger */
        this.ledgers = new Map();
        this.cast = new CastSync();
        /** @type {Map<string, string>} chat id -> fingerprint of its last registration */
        this.registered = new Map();
        // Work that must reach the sidecar even across an outage: kept until it succeeds.
        /** @type {Map<string, Set<string>>} chat id -> turns to roll back */
        this.pendingRollbacks = new Map();
        /** @type {Map<string, Set<string>>} chat id -> message ids to delete */
        this.pendingDeletes = new Map();
        this.tasks = new SyncQueue({
            onSuccess: () => this.deps.onSuccess(),
            onError: (error, what) => this.deps.onError(error, what),
        });
    }

    /**
     * Hold ordinary upserts (not rollbacks, deletes or registrations) until `release()` or `ms`.
     * A generation starts by adding the user's message (MESSAGE_SENT) and then asks for its
     * context; the context does not need that upsert (it carries the last action), and on the
     * sidecar the upsert's embedding would run at the same time as the context call's and slow it.
     * @param {number} ms the longest hold
     */
    hold(ms) {
        this.tasks.hold(ms);
    }

    /** Let held upserts go (idempotent). */
    release() {
        this.tasks.release();
    }

    /**
     * Resolves when every queued sync is done, or after `ms` (whichever comes first).
     * @param {number} ms
     */
    idle(ms) {
        return this.tasks.idle(ms);
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
        return pending ? this.tasks.idle(ms) : this.tasks.criticalDone(chatId, ms);
    }

    /** The ledger of a chat (a new, empty one the first time). */
    ledger(chatId) {
        if (!this.ledgers.has(chatId)) this.ledgers.set(chatId, new ChatLedger());
        return this.ledgers.get(chatId);
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
        const assigned = ensureIds(ctx.chat, idMaker(ctx));
        const snapshot = this.snapshot(ctx);
        // After the snapshot read the mark a copied file brought (originLink), this file's own.
        if (markOrigin(ctx, chatId) && !assigned.length) ctx.saveMetadataDebounced?.();
        const { removed, rollbackTurns } = reconcile(this.ledger(chatId), ctx.chat.map(messageId), snapshot.records.map(r => r.id));
        this.ledger(chatId).observe(snapshot.records);
        for (const turnId of rollbackTurns) addTo(this.pendingRollbacks, chatId, turnId);
        for (const id of removed) addTo(this.pendingDeletes, chatId, id);
        for (const r of snapshot.records) this.pendingDeletes.get(chatId)?.delete(r.id); // back again (unhidden)
        const critical = rollbackTurns.length || removed.length || !this.registered.has(chatId);
        const done = this.tasks.enqueue(what, () => this.push(chatId, snapshot),
            critical ? { critical: chatId } : { held: true });
        return { assigned, done };
    }

    /** What the open chat holds now: its records, members, their cards and its title. */
    snapshot(ctx) {
        const members = chatMembers(ctx);
        const defaultSpeaker = members.isGroup ? undefined : members.memberIds[0];
        return {
            records: chatRecords(ctx.chat, this.now(), defaultSpeaker),
            members,
            cards: members.memberIds.map(id => ctx.characters?.find(c => c.avatar === id)).filter(Boolean),
            title: chatTitle(ctx),
            branch: branchLink(ctx),
        };
    }

    /**
     * In `ms` (counted again from the last call), make the sidecar's copy of the open chat the chat
     * SillyTavern saved: another tab or device on the same chat may have saved after this page,
     * and SillyTavern keeps the last save. Called when a generation ends.
     * @param {number} ms
     */
    followSavedSoon(ms) {
        const chatId = this.deps.getContext().getCurrentChatId?.();
        if (!this.deps.savedMessages || !chatId) return;
        clearTimeout(this.followTimer);
        this.followTimer = setTimeout(() => { this.followSaved(chatId).catch(() => {}); }, ms);
    }

    /**
     * A generation starts: a following of the saved chat not begun yet waits for its end (which
     * asks for it again). It reads the whole chat file and every id the sidecar holds, which on a
     * long chat would run beside the context call and slow it.
     */
    postponeFollowSaved() {
        clearTimeout(this.followTimer);
        this.followTimer = undefined;
    }

    /**
     * Queued: read the saved chat; delete what the sidecar holds of it that the file does not have,
     * send what the file has that the sidecar lacks. Skipped when the chat is no longer open, a
     * saved message has no id of ours yet, or the file is only behind this page (it lacks some of
     * this page's messages and has none of another's: this page's own save is still coming).
     * Messages this page holds are left to the ordinary sync (the file may be older than them).
     * @param {string} chatId
     */
    followSaved(chatId) {
        return this.tasks.enqueue('saved chat', async () => {
            const ctx = this.deps.getContext();
            if (ctx.getCurrentChatId?.() !== chatId || this.deps.features?.known?.messageIds === false) return;
            const saved = await this.deps.savedMessages(ctx);
            if (!saved || ctx.getCurrentChatId?.() !== chatId || saved.some(m => !m?.extra?.[ID_KEY])) return;
            const members = chatMembers(ctx);
            const defaultSpeaker = members.isGroup ? undefined : members.memberIds[0];
            const records = chatRecords(saved, this.now(), defaultSpeaker);
            const fileIds = new Set(records.map(r => r.id));
            const mine = chatRecords(ctx.chat, this.now(), defaultSpeaker).map(r => r.id);
            // A set: at 10,000 messages a list's `includes` per record held the page for seconds.
            const mineSet = new Set(mine);
            const foreign = records.some(r => !mineSet.has(r.id));
            if (!foreign && mine.some(id => !fileIds.has(id))) return;
            const client = this.deps.getClient();
            const held = new Set(await listAllIds(client, chatId));
            for (const id of orphanIds([...held], [...fileIds])) await this.deleteMessage(client, chatId, id);
            const ledger = this.ledger(chatId);
            const missing = records.filter(r => !held.has(r.id));
            for (const batch of batches(missing, this.deps.batchSize())) {
                await client.upsertMessages(chatId, batch);
                ledger.markSent(batch);
            }
        });
    }

    /** The network part of a sync: register, roll back, delete what vanished, upsert changes. */
    async push(chatId, { records, members, cards, title, branch }) {
        const client = this.deps.getClient();
        await this.cast.register(client, cards);
        await this.registerChat(client, chatId, members.memberIds, title, branch);
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
     * Tell the sidecar about the chat and its members (again only when they changed). A branch or
     * checkpoint the sidecar does not know yet is registered with `branch_of` (CP2): the sidecar
     * then copies what its parent derived before the branch point instead of deriving it again.
     */
    async registerChat(client, chatId, memberIds, title, branch = null) {
        const body = { member_ids: memberIds };
        if (title) body.title = String(title);
        const key = JSON.stringify(body);
        if (this.registered.get(chatId) === key) return;
        if (branch && !this.registered.has(chatId) && await isNewChat(client, chatId)) {
            const { keep_campaign: keep, ...link } = branch;
            body.branch_of = link;
            if (keep) body.campaign_id = await campaignOf(client, link.chat_id);
            if (!body.campaign_id) delete body.campaign_id;
        }
        await client.putChat(chatId, body);
        this.registered.set(chatId, key);
    }

    /**
     * Roll a turn back (queued behind pending syncs). A rollback that fails stays pending and is
     * retried before the next sync of that chat, so an outage cannot leave a replaced turn's
     * memories behind.
     * @param {string} chatId
     * @param {string} turnId
     */
    rollback(chatId, turnId) {
        addTo(this.pendingRollbacks, chatId, turnId);
        return this.tasks.enqueue('rollback', () => this.drainRollbacks(this.deps.getClient(), chatId), { critical: chatId });
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
        for (const id of [...(pending ?? [])]) {
            await this.deleteMessage(client, chatId, id);
            pending.delete(id);
        }
    }

    /** Delete one message in the sidecar; one it never got, or no longer has, is fine. */
    async deleteMessage(client, chatId, id) {
        await allowNotFound(client.deleteMessage(chatId, id));
        this.ledger(chatId).markDeleted([id]);
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
            if (isMissingRoute(error)) this.deps.features?.note('messageIds', false);
            // A missing route, or a chat new to the sidecar (404): nothing to reconcile.
            if (isMissingRoute(error) || error?.status === 404) {
                ledger.reconciled = true;
                return;
            }
            throw error;
        }
        for (const id of orphanIds(held, records.map(r => r.id))) await this.deleteMessage(client, chatId, id);
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
        return this.tasks.enqueue('CHAT_RENAMED', async () => {
            if (!(await this.moveChat(oldId, newId))) return;
            this.ledgers.delete(oldId);
            this.registered.delete(oldId);
            // What the sidecar holds under the new id is now the old chat's copy: send everything again.
            this.ledger(newId).sent.clear();
            this.registered.delete(newId);
        });
    }

    /** Rename the sidecar's chat; false when there was nothing to rename. */
    async moveChat(oldId, newId) {
        const client = this.deps.getClient();
        try {
            await client.renameChat(oldId, newId);
        } catch (error) {
            if (isMissingRoute(error)) return false; // an older sidecar: the new id lives on as a new chat
            if (error?.status === 404) return false; // the old chat never reached the sidecar
            if (error?.status !== 409) throw error;
            await client.deleteChat(newId);
            await client.renameChat(oldId, newId);
        }
        return true;
    }

    /**
     * SillyTavern deleted a chat (CHAT_DELETED / GROUP_CHAT_DELETED): delete it in the sidecar too.
     * @param {string} chatId
     */
    deleteChat(chatId) {
        if (!chatId) return Promise.resolve();
        this.pendingRollbacks.delete(chatId);
        this.pendingDeletes.delete(chatId);
        return this.tasks.enqueue('CHAT_DELETED', async () => {
            await this.deps.getClient().deleteChat(chatId).catch(err => {
                if (err?.status !== 404 && !isMissingRoute(err)) throw err;
            });
            this.ledgers.delete(chatId);
            this.registered.delete(chatId);
        });
    }

    /**
     * A character card was renamed (CHARACTER_RENAMED gives the old and new avatar file names):
     * move the sidecar's character and its memories to the new id (cast.js).
     * @param {string} oldAvatar
     * @param {string} newAvatar
     * @param {() => string|undefined} newName the card's new name, read when the move runs
     */
    renameCharacter(oldAvatar, newAvatar, newName = () => undefined) {
        if (!oldAvatar || !newAvatar || oldAvatar === newAvatar) return Promise.resolve();
        return this.tasks.enqueue('CHARACTER_RENAMED', async () => {
            await this.cast.rename(this.deps.getClient(), oldAvatar, newAvatar, newName());
            this.registered.clear(); // member lists name the new id from the next sync on
        });
    }

    /**
     * A character card was deleted in SillyTavern: delete it in the sidecar (RV6: its memories turn global).
     * @param {string} avatar
     */
    deleteCharacter(avatar) {
        if (!avatar) return Promise.resolve();
        return this.tasks.enqueue('CHARACTER_DELETED', () => this.cast.remove(this.deps.getClient(), avatar));
    }
}

/** Move the set under `from` into the one under `to` (a renamed chat's pending work). */
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
