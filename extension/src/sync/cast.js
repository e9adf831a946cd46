// Who is in a chat, and keeping the sidecar's characters in step with SillyTavern's cards.
//
// A character's id in the sidecar is its card's avatar file name (SillyTavern's de-facto unique
// key). The pure functions read SillyTavern's context object passed in; `CastSync` does the I/O.
//
// A card renamed in SillyTavern (CHARACTER_RENAMED) changes its avatar file name. The sidecar has
// no rename route for characters, so the move is done with ordinary calls: copy the character to
// the new id, move every memory that names the old id (its scope, or its known_by list), then
// delete the old id — last, because deleting a character turns its remaining memories global (RV6).
// These are a person's edits (the user renamed the card), so they are made with actor "user":
// pinned memories move too (RV11 forbids only the model and background jobs to touch them).

import { allowNotFound } from '../client.js';
import { speakerOf } from './records.js';

/** The avatar file name of the open one-character chat's card, or undefined (in a group, say). */
export function characterAvatar(ctx) {
    return ctx.characters?.[ctx.characterId]?.avatar;
}

/** The group with the context's `groupId`, or undefined. */
function groupOf(ctx) {
    return (ctx.groups ?? []).find(g => String(g.id) === String(ctx.groupId));
}

/**
 * Who is in the current chat, as sidecar character ids (SillyTavern avatar file names).
 * @param {{groupId?: string, groups?: object[], characters?: object[], characterId?: any}} ctx
 * @returns {{isGroup: boolean, memberIds: string[], activeMemberIds: string[]}}
 */
export function chatMembers(ctx) {
    if (ctx.groupId !== undefined && ctx.groupId !== null) {
        const group = groupOf(ctx);
        const members = (group?.members ?? []).filter(m => typeof m === 'string' && m);
        const disabled = new Set(group?.disabled_members ?? []);
        return { isGroup: true, memberIds: members, activeMemberIds: members.filter(m => !disabled.has(m)) };
    }
    const avatar = characterAvatar(ctx);
    const ids = avatar ? [avatar] : [];
    return { isGroup: false, memberIds: ids, activeMemberIds: ids };
}

/**
 * The open chat's title as people know it: the group's name, or the character's.
 * @param {{groupId?: string, groups?: object[], name2?: string}} ctx
 * @returns {string|undefined}
 */
export function chatTitle(ctx) {
    return ctx.groupId ? groupOf(ctx)?.name : ctx.name2;
}

/**
 * Who is speaking now, for the model's tools: the chat, the generating character, the scene's
 * members and the current turn (when it belongs to this chat). Null outside a character chat.
 * @param {any} ctx SillyTavern.getContext()
 * @param {{id: string, chatId: string}|null} turn the interceptor's current turn
 * @returns {import('../tools.js').Speaker|null}
 */
export function speakerNow(ctx, turn) {
    const chatId = ctx.getCurrentChatId?.();
    const speakerId = characterAvatar(ctx);
    if (!chatId || !speakerId) return null;
    return {
        chatId,
        speakerId,
        memberIds: chatMembers(ctx).memberIds,
        turnId: turn && turn.chatId === chatId ? turn.id : undefined,
    };
}

/**
 * Where the person at the keyboard is, for slash commands: the chat, its members, the card (or in
 * a group the member who replied last), and every card's name.
 * @param {any} ctx SillyTavern.getContext()
 */
export function placeNow(ctx) {
    const members = chatMembers(ctx);
    const lastReply = [...(ctx.chat ?? [])].reverse().find(m => m && !m.is_user && !m.is_system);
    return {
        chatId: ctx.getCurrentChatId?.(),
        isGroup: members.isGroup,
        memberIds: members.memberIds,
        characterId: members.isGroup ? undefined : members.memberIds[0],
        lastSpeakerId: members.isGroup ? speakerOf(lastReply, undefined) : undefined,
        characters: (ctx.characters ?? []).map(ch => ({ avatar: ch.avatar, name: ch.name })),
    };
}

/**
 * The sidecar's character record for a SillyTavern card seen for the first time. Only identity:
 * SillyTavern already puts the card itself into the prompt, so copying it into the sheet would
 * send it twice; sheets grow from play and from the panel.
 * @param {{name?: string, avatar?: string}} card
 */
export function characterFromCard(card) {
    return { name: String(card?.name ?? card?.avatar ?? ''), aliases: [], sheet: {}, is_player: false };
}

/**
 * The PUT body of the character under its new id: same sheet and switches, the old name kept as
 * an alias so text that still says it keeps matching.
 * @param {{name: string, aliases?: string[], sheet?: object, is_player?: boolean, learn_from_chat?: boolean}} old
 * @param {string|undefined} newName the card's new name, when SillyTavern already has it
 */
export function characterCopy(old, newName) {
    const name = String(newName || old.name);
    const aliases = [...new Set([...(old.aliases ?? []), old.name].filter(a => a && a !== name))];
    const body = { name, aliases, sheet: old.sheet ?? {} };
    if (typeof old.is_player === 'boolean') body.is_player = old.is_player;
    if (typeof old.learn_from_chat === 'boolean') body.learn_from_chat = old.learn_from_chat;
    return body;
}

/**
 * The PATCH of each memory that names the old id: in its scope, or in its known_by list.
 * @param {Array<{id: string, scope: string, character_id: string|null, known_by: string[]|null}>} memories
 * @param {string} oldId
 * @param {string} newId
 * @returns {Array<{id: string, patch: object}>}
 */
export function memoryMoves(memories, oldId, newId) {
    const moves = [];
    for (const m of memories) {
        const patch = {};
        if (m.scope === 'character' && m.character_id === oldId) {
            patch.scope = 'character';
            patch.character_id = newId;
        }
        if (Array.isArray(m.known_by) && m.known_by.includes(oldId)) {
            patch.known_by = [...new Set(m.known_by.map(id => (id === oldId ? newId : id)))];
        }
        if (Object.keys(patch).length) moves.push({ id: m.id, patch: { ...patch, actor: 'user' } });
    }
    return moves;
}

/** The sidecar's character `id`, or null when it has none (404). */
async function findCharacter(client, id) {
    const answer = await allowNotFound(client.getCharacter(id));
    return answer?.character ?? answer ?? null;
}

/**
 * Move a character from `oldId` to `newId` in the sidecar (see the top of this file).
 * @param {import('../client.js').SidecarClient} client
 * @param {string} oldId
 * @param {string} newId
 * @param {string|undefined} newName
 * @returns {Promise<{moved: number}|null>} null when the sidecar never knew the old id
 */
export async function moveCharacter(client, oldId, newId, newName) {
    const old = await findCharacter(client, oldId);
    if (!old) return null;
    if (!(await findCharacter(client, newId))) await client.putCharacter(newId, characterCopy(old, newName));
    const listed = [];
    for (const archived of [false, true]) {
        const answer = await client.listMemories({ archived });
        listed.push(...(answer?.memories ?? []));
    }
    const moves = memoryMoves(listed, oldId, newId);
    for (const { id, patch } of moves) await client.patchMemory(id, patch);
    await client.deleteCharacter(oldId);
    return { moved: moves.length };
}

/** What the sidecar has of SillyTavern's cards, as far as this page knows; the calls that change it. */
export class CastSync {
    constructor() {
        /** @type {Set<string>} character ids known to exist in the sidecar */
        this.knownCharacters = new Set();
        /** @type {Set<string>} renamed characters whose sidecar name may still be the old one */
        this.namesToCheck = new Set();
    }

    /**
     * Create sidecar characters for cards seen for the first time (never overwrite a sheet); give a
     * renamed card's character its new name (the old one kept as an alias).
     * @param {import('../client.js').SidecarClient} client
     * @param {Array<{avatar: string, name?: string}>} cards
     */
    async register(client, cards) {
        for (const card of cards) {
            if (this.knownCharacters.has(card.avatar)) continue;
            const character = await findCharacter(client, card.avatar);
            if (!character) {
                await client.putCharacter(card.avatar, characterFromCard(card));
            } else if (this.namesToCheck.has(card.avatar) && card.name && character.name !== card.name) {
                await client.putCharacter(card.avatar, characterCopy(character, card.name));
            }
            this.namesToCheck.delete(card.avatar);
            this.knownCharacters.add(card.avatar);
        }
    }

    /**
     * Move a renamed card's character (CHARACTER_RENAMED) to its new id.
     * @param {import('../client.js').SidecarClient} client
     * @param {string} oldAvatar
     * @param {string} newAvatar
     * @param {string|undefined} name the card's new name, if SillyTavern has it yet
     */
    async rename(client, oldAvatar, newAvatar, name) {
        await moveCharacter(client, oldAvatar, newAvatar, name);
        this.knownCharacters.delete(oldAvatar);
        // SillyTavern reloads its cards after the event: when the new name was not known yet,
        // the next sync that sees the card renames the sidecar's character (`register`).
        if (name) {
            this.knownCharacters.add(newAvatar);
        } else {
            this.knownCharacters.delete(newAvatar);
            this.namesToCheck.add(newAvatar);
        }
    }

    /**
     * Delete a card's character in the sidecar (RV6: its memories turn global).
     * @param {import('../client.js').SidecarClient} client
     * @param {string} avatar
     */
    async remove(client, avatar) {
        await allowNotFound(client.deleteCharacter(avatar));
        this.knownCharacters.delete(avatar);
    }
}
