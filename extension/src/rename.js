// A character card renamed in SillyTavern (CHARACTER_RENAMED) changes its avatar file name, which
// is the character's id in the sidecar. The sidecar has no rename route for characters, so the
// move is done with ordinary calls: copy the character to the new id, move every memory that names
// the old id (its scope, or its known_by list), then delete the old id — last, because deleting a
// character turns its remaining memories global (RV6).
//
// These are a person's edits (the user renamed the card), so they are made with actor "user":
// pinned memories move too (RV11 forbids only the model and background jobs to touch them).

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

/**
 * Move a character from `oldId` to `newId` in the sidecar (see the top of this file).
 * @param {import('./client.js').SidecarClient} client
 * @param {string} oldId
 * @param {string} newId
 * @param {string|undefined} newName
 * @returns {Promise<{moved: number}|null>} null when the sidecar never knew the old id
 */
export async function moveCharacter(client, oldId, newId, newName) {
    let old;
    try {
        old = await client.getCharacter(oldId);
    } catch (error) {
        if (error?.status === 404) return null;
        throw error;
    }
    old = old?.character ?? old;
    try {
        await client.getCharacter(newId);
    } catch (error) {
        if (error?.status !== 404) throw error;
        await client.putCharacter(newId, characterCopy(old, newName));
    }
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
