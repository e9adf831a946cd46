// "Continue the campaign in a new chat" (rule CP1f): the panel's button and /chronicler-continue.
// A new chat with the same character or group is started in SillyTavern, registered in the open
// chat's campaign, and opens with a short "previously" recap (GET /v1/campaigns/{id}/recap) as a
// narrator message, so the model and the person read where the story stands.
//
// The logic is a plain function of `deps` (tests drive it with fakes); SillyTavern is reached
// through `deps.st`, made from its context by `stDeps`.

/**
 * @typedef {object} ContinueDeps
 * @property {() => import('./client.js').SidecarClient} getClient
 * @property {() => {chatId?: string, memberIds: string[]}} where the open chat and its members
 * @property {{newChat: () => Promise<void>, currentChatId: () => string|undefined,
 *   addMessage: (message: object) => Promise<void>, now: () => string}} st SillyTavern's side
 */

/** The narrator message that opens the new chat with the recap (hidden from nobody). */
export function recapMessage(text, sendDate) {
    return { name: 'Previously', is_user: false, is_system: false, send_date: sendDate, mes: text,
        extra: { type: 'narrator', chronicler_recap: true } };
}

/**
 * Start a new chat in the open chat's campaign, opening with the recap. Returns the new chat's id
 * (for pipes) and a sentence for a toast.
 * @param {ContinueDeps} deps
 */
export async function continueCampaign(deps) {
    const here = deps.where();
    if (!here.chatId) throw new Error('Open the chat whose campaign goes on first.');
    const client = deps.getClient();
    const campaignId = (await client.getChat(here.chatId))?.chat?.campaign_id ?? here.chatId;
    const recap = (await client.campaignRecap(campaignId))?.text ?? '';
    await deps.st.newChat();
    const chatId = deps.st.currentChatId();
    if (!chatId || chatId === here.chatId) throw new Error('SillyTavern did not open a new chat.');
    await client.putChat(chatId, { member_ids: here.memberIds, campaign_id: campaignId });
    if (recap) await deps.st.addMessage(recapMessage(recap, deps.st.now()));
    return { value: chatId, message: recap ? 'A new chat of the campaign, opening with what happened before.'
        : 'A new chat of the campaign (nothing is summarised yet to recap).' };
}

/**
 * SillyTavern's side of `continueCampaign`: `/newchat` starts the chat (with the open character
 * or group), the recap is appended to it and saved. The context is asked anew each time (a new
 * chat may replace what an older one held).
 * @param {() => any} getContext SillyTavern.getContext
 */
export function stDeps(getContext) {
    return {
        newChat: async () => {
            const ctx = getContext();
            await (ctx.executeSlashCommandsWithOptions ?? ctx.executeSlashCommands)('/newchat');
        },
        currentChatId: () => getContext().getCurrentChatId?.(),
        addMessage: async (message) => {
            const ctx = getContext();
            ctx.chat.push(message);
            ctx.addOneMessage?.(message);
            await ctx.saveChat?.();
        },
        now: () => {
            const ctx = getContext();
            return ctx.humanizedDateTime ? ctx.humanizedDateTime() : new Date().toISOString();
        },
    };
}
