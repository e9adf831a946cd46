// An in-memory stand-in for SidecarClient, for node tests of the extension's logic (tools, slash
// commands, the job worker, sync). It keeps the sidecar's rules the extension relies on: pinned
// memories refuse the model (403 pinned_protected, RV11), unknown ids answer 404 with a domain code,
// and a route listed in `missing` answers like a sidecar without it (Flask's 404 `not_found`).
// The real sidecar is exercised by the Python tests and the E2E run; this only records calls.
import { SidecarError } from '../../extension/src/client.js';

export class FakeSidecar {
    constructor({ missing = [] } = {}) {
        this.baseUrl = 'http://fake.invalid';
        this.calls = [];
        this.missing = new Set(missing);
        this.characters = new Map();
        this.chats = new Map(); // id -> {member_ids, messages: Map}
        this.memories = new Map();
        this.searchResults = [];
        this.sessionsByChat = new Map(); // chat id -> [{n, short, full}]
        this.jobs = [];
        this.completed = [];
        this.failNext = null; // a SidecarError to throw on the next call
        this.delayMs = {}; // method name -> ms it takes (a slow embedding, say)
        this.seq = 0;
    }

    async slow(name) {
        const ms = this.delayMs[name];
        if (ms) await new Promise(resolve => setTimeout(resolve, ms));
    }

    record(name, ...args) {
        this.calls.push([name, ...args]);
        if (this.failNext) {
            const error = this.failNext;
            this.failNext = null;
            throw error;
        }
        if (this.missing.has(name)) throw new SidecarError({ status: 404, code: 'not_found', message: 'Not Found' });
    }

    names() {
        return this.calls.map(c => c[0]);
    }

    // --- the next turn's query embedding ---
    async prefetchContext(body) {
        this.record('prefetchContext', body);
        return { started: true };
    }

    // --- characters and chats ---
    async getCharacter(id) {
        this.record('getCharacter', id);
        const c = this.characters.get(id);
        if (!c) throw new SidecarError({ status: 404, code: 'character_not_found', message: 'no such character' });
        return { character: structuredClone(c) };
    }
    async putCharacter(id, body) {
        this.record('putCharacter', id, body);
        this.characters.set(id, { id, aliases: [], sheet: {}, is_player: false, learn_from_chat: true, ...structuredClone(body) });
        return { character: this.characters.get(id) };
    }
    async deleteCharacter(id) {
        this.record('deleteCharacter', id);
        if (!this.characters.delete(id)) throw new SidecarError({ status: 404, code: 'character_not_found', message: 'no' });
        for (const m of this.memories.values()) {
            if (m.character_id === id) Object.assign(m, { scope: 'global', character_id: null }); // RV6
        }
        return { deleted: id };
    }
    async getChat(id) {
        this.record('getChat', id);
        const chat = this.chats.get(id);
        if (!chat) throw new SidecarError({ status: 404, code: 'chat_not_found', message: 'no chat' });
        const { messages, ...rest } = chat;
        return { chat: { id, ...structuredClone(rest) } };
    }
    async putChat(id, body) {
        this.record('putChat', id, body);
        const chat = this.chats.get(id) ?? { messages: new Map() };
        this.chats.set(id, { ...chat, ...structuredClone(body) });
        return { chat: { id, ...body } };
    }
    async upsertMessages(chatId, messages) {
        this.record('upsertMessages', chatId, messages);
        await this.slow('upsertMessages');
        const chat = this.chats.get(chatId);
        if (!chat) throw new SidecarError({ status: 404, code: 'chat_not_found', message: 'no chat' });
        for (const m of messages) chat.messages.set(m.id, structuredClone(m));
        return { upserted: messages.length };
    }
    async deleteMessage(chatId, id) {
        this.record('deleteMessage', chatId, id);
        const chat = this.chats.get(chatId);
        if (!chat?.messages.delete(id)) throw new SidecarError({ status: 404, code: 'message_not_found', message: 'no' });
        return { deleted: id };
    }
    async rollbackTurn(chatId, turnId) {
        this.record('rollbackTurn', chatId, turnId);
        await this.slow('rollbackTurn');
        for (const [id, m] of this.memories) if (m.turn_id === turnId && !m.pinned) this.memories.delete(id);
        return {};
    }
    async listMessageIds(chatId, offset = 0) {
        this.record('listMessageIds', chatId, offset);
        const chat = this.chats.get(chatId);
        if (!chat) throw new SidecarError({ status: 404, code: 'chat_not_found', message: 'no chat' });
        const ids = [...chat.messages.keys()];
        const limit = this.pageSize ?? 1000;
        return { ids: ids.slice(offset, offset + limit), total: ids.length, offset, limit };
    }
    async renameChat(oldId, newId) {
        this.record('renameChat', oldId, newId);
        const chat = this.chats.get(oldId);
        if (!chat) throw new SidecarError({ status: 404, code: 'chat_not_found', message: 'no chat' });
        if (this.chats.has(newId)) throw new SidecarError({ status: 409, code: 'chat_exists', message: 'taken' });
        this.chats.delete(oldId);
        this.chats.set(newId, chat);
        return { chat: { id: newId } };
    }
    async deleteChat(id) {
        this.record('deleteChat', id);
        if (!this.chats.delete(id)) throw new SidecarError({ status: 404, code: 'chat_not_found', message: 'no chat' });
        return { deleted: id };
    }

    // --- memories ---
    addMemory(fields) {
        const id = fields.id ?? `m_${++this.seq}`;
        const memory = {
            id, text: '', scope: 'global', character_id: null, pinned: false, archived: false, actor: 'user',
            chat_id: null, turn_id: null, known_by: null, version: 1, ...fields,
        };
        this.memories.set(id, memory);
        return memory;
    }
    async createMemory(body) {
        this.record('createMemory', body);
        if (body.pinned && body.actor !== 'user') throw new SidecarError({ status: 403, code: 'pinned_protected', message: 'pins are a person\'s' });
        const memory = this.addMemory({ ...structuredClone(body) });
        return { memory: structuredClone(memory), archived_ids: [] };
    }
    async getMemory(id) {
        this.record('getMemory', id);
        const m = this.memories.get(id);
        if (!m) throw new SidecarError({ status: 404, code: 'memory_not_found', message: 'no memory' });
        return { memory: structuredClone(m) };
    }
    async listMemories(params = {}) {
        this.record('listMemories', params);
        const archived = Boolean(params.archived);
        return { memories: [...this.memories.values()].filter(m => m.archived === archived).map(m => structuredClone(m)) };
    }
    async patchMemory(id, body) {
        this.record('patchMemory', id, body);
        const m = this.memories.get(id);
        if (!m) throw new SidecarError({ status: 404, code: 'memory_not_found', message: 'no memory' });
        if (m.pinned && body.actor !== 'user') throw new SidecarError({ status: 403, code: 'pinned_protected', message: 'pinned' });
        const { actor: _actor, ...fields } = body;
        Object.assign(m, structuredClone(fields), { version: m.version + 1 });
        return { memory: structuredClone(m), archived_ids: [] };
    }
    async deleteMemory(id, actor) {
        this.record('deleteMemory', id, actor);
        const m = this.memories.get(id);
        if (!m) throw new SidecarError({ status: 404, code: 'memory_not_found', message: 'no memory' });
        if (m.pinned && actor !== 'user') throw new SidecarError({ status: 403, code: 'pinned_protected', message: 'pinned' });
        this.memories.delete(id);
        return { deleted: id };
    }

    // --- search, sessions, jobs ---
    async search(body) {
        this.record('search', body);
        return { results: this.searchResults.slice(0, body.k) };
    }
    async getSession(chatId, n) {
        this.record('session', chatId, n);
        const found = (this.sessionsByChat.get(chatId) ?? []).find(s => s.n === n);
        if (!found) throw new SidecarError({ status: 404, code: 'session_not_found', message: 'no session' });
        return { session: structuredClone(found) };
    }
    async endSession(chatId) {
        this.record('endSession', chatId);
        const list = this.sessionsByChat.get(chatId) ?? [];
        const session = { n: list.length + 1, short: '', full: '' };
        list.push(session);
        this.sessionsByChat.set(chatId, list);
        return { session };
    }
    async claimJob(body) {
        this.record('claimJob', body);
        return { job: this.jobs.shift() ?? null, mode: 'client' };
    }
    async completeJob(id, text, attempt) {
        this.record('completeJob', id, text, attempt);
        this.completed.push({ id, text, attempt });
        return { job: { id, state: 'done' } };
    }
    async request(method, path, options) {
        this.record('request', method, path, options);
        return {};
    }
}

/** A SidecarError like a refused connection (an outage). */
export function outage() {
    return new SidecarError({ code: 'unreachable', message: 'cannot connect' });
}
