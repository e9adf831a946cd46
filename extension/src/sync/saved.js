// The chat as SillyTavern saved it, read back through SillyTavern's own routes. SillyTavern keeps a
// chat's last save: with two tabs (or two devices) on one chat, the file holds whichever saved
// last, while each tab's sync sent its own messages. ChatSync.followSaved makes the sidecar's copy
// that file again (chat.js).

/**
 * The messages of the open chat as SillyTavern saved it (its header line dropped), or null when
 * there is no open chat or SillyTavern did not answer.
 * @param {any} ctx SillyTavern's context
 * @param {typeof fetch} [fetchFn]
 * @returns {Promise<object[] | null>}
 */
export async function savedMessages(ctx, fetchFn = globalThis.fetch) {
    const chatId = ctx.getCurrentChatId?.();
    if (!chatId) return null;
    let url;
    let body;
    if (ctx.groupId) {
        url = '/api/chats/group/get';
        body = { id: chatId };
    } else {
        const character = ctx.characters?.[ctx.characterId];
        if (!character) return null;
        url = '/api/chats/get';
        body = { ch_name: character.name, file_name: chatId, avatar_url: character.avatar };
    }
    const response = await fetchFn(url, {
        method: 'POST', headers: ctx.getRequestHeaders(), cache: 'no-cache', body: JSON.stringify(body),
    });
    if (!response.ok) return null;
    const data = await response.json();
    if (!Array.isArray(data)) return null;
    // The first line of a chat file is its header (chat_metadata, user_name...): no `mes`.
    return data.filter(line => line && typeof line === 'object' && 'mes' in line);
}
