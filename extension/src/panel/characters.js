// The Characters tab (SW1, SW9b, RV14, RV16, CP1): a character's sheet (free fields and secrets with
// who knows them), its "learn from chat" switch, the open chat's memory switch and its campaign
// (join another chat's campaign, split off into one of its own, or continue it in a new chat, CP1f).
// Routes: GET /v1/characters, PUT /v1/characters/{id} (fields left out keep their values),
// GET /v1/chats/{id}, PUT /v1/chats/{id}, GET /v1/campaigns.

import { autoGrow, button, checkbox, clear, el, iconButton, messageLine, newId, select, setDisabled } from './dom.js';
import { continueCampaign, stDeps } from '../campaign.js';
import { describeError } from './memory_model.js';

const FIELD_NAME = /^[a-z][a-z0-9_]{0,39}$/;
const MAX_FIELDS = 40;
const SUGGESTED = ['personality', 'appearance', 'backstory', 'speech', 'relationships', 'goals'];

/** A field name typed by a person -> the sheet's key form ("Eye colour" -> "eye_colour"), or ''. */
export function fieldKey(text) {
    const key = String(text ?? '').trim().toLowerCase().replace(/[^a-z0-9]+/g, '_').replace(/^_+|_+$/g, '').slice(0, 40);
    return FIELD_NAME.test(key) && key !== 'secrets' ? key : '';
}

/** A sheet key in words ("eye_colour" -> "Eye colour"). */
export function fieldLabel(key) {
    const text = String(key).replace(/_/g, ' ');
    return text.charAt(0).toUpperCase() + text.slice(1);
}

/**
 * Rule CP1: the campaigns a chat may belong to, as [value, label] options: its own (alone), then
 * every other campaign named by its chats. The chat's current campaign is `current`.
 * @param {Array<{id: string, chats: Array<{id: string, title?: string|null}>}>} campaigns
 * @param {string} chatId
 * @returns {{options: Array<[string, string]>, current: string}}
 */
export function campaignChoices(campaigns, chatId) {
    const mine = campaigns.find(c => c.chats.some(ch => ch.id === chatId));
    const current = mine?.id ?? chatId;
    const others = campaigns.filter(c => c.id !== chatId);
    const options = [[chatId, 'This chat alone'],
        ...others.map(c => [c.id, `With ${c.chats.filter(ch => ch.id !== chatId).map(ch => ch.title || ch.id).join(', ') || c.id}`])];
    if (!options.some(([v]) => v === current)) options.push([current, `Campaign ${current}`]);
    return { options, current };
}

/**
 * @param {import('./panel.js').PanelContext} pctx
 */
export function createCharactersTab(pctx, remembered) {
    const tab = new CharactersTab(pctx, remembered);
    return { element: tab.element, show: () => tab.show() };
}

class CharactersTab {
    constructor(pctx, remembered) {
        this.pctx = pctx;
        this.remembered = remembered;
        this.known = new Map();
        this.chatSwitch = checkbox('Memory for this chat', { onChange: (on) => this.setChatMemory(on) });
        this.chatNote = el('small', { class: 'chronicler-hint', text: 'Off: nothing is saved or recalled in this chat; every attempt starts blank.' });
        this.campaign = el('label', { class: 'chronicler-campaign', text: 'Campaign ' });
        this.chatBox = el('div', { class: 'chronicler-form chronicler-chat-switch', attrs: { role: 'group', 'aria-label': 'This chat' } }, this.chatSwitch, this.chatNote, this.campaign);
        this.picker = select([], { label: 'Character', onChange: (id) => { this.remembered.id = id; this.renderSheet(); } });
        this.message = messageLine();
        this.sheet = el('div', { class: 'chronicler-sheet' });
        this.element = el('div', { class: 'chronicler-characters' }, this.chatBox,
            el('div', { class: 'chronicler-toolbar' }, el('span', { text: 'Character' }), this.picker),
            this.message, this.sheet);
    }

    async show() {
        this.message.show('');
        await Promise.all([this.loadChat(), this.loadCharacters()]);
    }

    async loadChat() {
        const { chatId } = this.pctx.chat();
        this.chatBox.hidden = !chatId;
        if (!chatId) return;
        try {
            this.chatRecord = (await this.pctx.client().getChat(chatId))?.chat;
            this.chatSwitch.input.checked = this.chatRecord?.memory_enabled !== false;
            this.chatSwitch.input.disabled = false;
            await this.loadCampaigns(chatId);
        } catch (error) {
            this.chatRecord = null;
            this.chatSwitch.input.disabled = true;
            this.chatNote.textContent = error?.code === 'chat_not_found'
                ? 'The sidecar has not seen this chat yet; send a message first.' : describeError(error);
        }
    }

    /** CP1: which campaign the chat is in, and a choice to join another or go alone. */
    async loadCampaigns(chatId) {
        let campaigns;
        try {
            campaigns = (await this.pctx.client().listCampaigns())?.campaigns ?? [];
        } catch {
            clear(this.campaign);  // an older sidecar without campaigns: nothing to choose
            return;
        }
        const { options, current } = campaignChoices(campaigns, chatId);
        const picker = select(options, { value: current, label: 'Campaign', onChange: (value) => this.setCampaign(value, picker, current) });
        const onward = button('Continue in a new chat', { icon: 'fa-forward', title: 'A new chat with the same character or group in this campaign, opening with a "previously" recap',
            onClick: () => this.continueInNewChat() });
        clear(this.campaign).append('Campaign ', picker, onward);
    }

    /** CP1f: a new chat of this campaign, opening with the recap (as /chronicler-continue). */
    async continueInNewChat() {
        const { chatId } = this.pctx.chat();
        if (!chatId || !this.chatRecord) return;
        const memberIds = this.chatRecord.member_ids;
        try {
            const out = await continueCampaign({ getClient: this.pctx.client, where: () => ({ chatId, memberIds }), st: stDeps(this.pctx.st) });
            this.message.show(out.message, 'ok');
        } catch (error) {
            this.message.show(describeError(error), 'error');
        }
    }

    async setCampaign(campaignId, picker, previous) {
        const { chatId } = this.pctx.chat();
        if (!chatId || !this.chatRecord) return;
        const body = { member_ids: this.chatRecord.member_ids, campaign_id: campaignId };
        if (this.chatRecord.title) body.title = this.chatRecord.title;
        try {
            this.chatRecord = (await this.pctx.client().putChat(chatId, body))?.chat ?? this.chatRecord;
            this.message.show(campaignId === chatId ? 'This chat is a campaign of its own now.'
                : 'This chat joined the campaign: its memory covers the campaign\'s chats.', 'ok');
        } catch (error) {
            picker.value = previous;
            this.message.show(describeError(error), 'error');
        }
    }

    async setChatMemory(on) {
        const { chatId } = this.pctx.chat();
        if (!chatId || !this.chatRecord) return;
        // PUT replaces members and title: send them back as they are.
        const body = { member_ids: this.chatRecord.member_ids, memory_enabled: on };
        if (this.chatRecord.title) body.title = this.chatRecord.title;
        try {
            this.chatRecord = (await this.pctx.client().putChat(chatId, body))?.chat ?? this.chatRecord;
            this.message.show(on ? 'Memory is on for this chat.' : 'Memory is off for this chat: nothing is saved or recalled here.', 'ok');
        } catch (error) {
            this.chatSwitch.input.checked = !on;
            this.message.show(describeError(error), 'error');
        }
    }

    async loadCharacters() {
        this.known = await this.pctx.characters(true);
        const members = this.pctx.chat().memberIds;
        const ids = [...members.filter((id) => this.known.has(id)), ...[...this.known.keys()].filter((id) => !members.includes(id))];
        clear(this.picker);
        for (const id of ids) {
            this.picker.append(el('option', { text: this.known.get(id).name + (members.includes(id) ? '' : ' (not in this chat)'), attrs: { value: id } }));
        }
        if (!ids.length) {
            clear(this.sheet).append(el('p', { class: 'chronicler-empty', text: 'No characters yet. Open a chat: its characters are registered with the sidecar.' }));
            return;
        }
        this.picker.value = ids.includes(this.remembered.id) ? this.remembered.id : ids[0];
        this.renderSheet();
    }

    renderSheet() {
        const character = this.known.get(this.picker.value);
        clear(this.sheet);
        if (!character) return;
        this.draft = structuredClone(character);
        const id = character.id;
        const learn = checkbox('Learn from chat', {
            checked: character.learn_from_chat !== false,
            onChange: (on) => this.setLearning(id, on, learn),
        });
        const nameId = newId('name');
        const name = el('input', { class: 'text_pole', attrs: { id: nameId, maxlength: 200 } });
        name.value = character.name;
        name.addEventListener('input', () => { this.draft.name = name.value; });
        const aliasesId = newId('aliases');
        const aliases = el('input', { class: 'text_pole', attrs: { id: aliasesId, placeholder: 'Other names, separated by commas' } });
        aliases.value = (character.aliases ?? []).join(', ');
        aliases.addEventListener('input', () => { this.draft.aliases = aliases.value.split(',').map((a) => a.trim()).filter(Boolean); });
        const player = checkbox("This is the player's character", { checked: character.is_player, onChange: (on) => { this.draft.is_player = on; } });
        this.fields = el('div', { class: 'chronicler-fields' });
        this.secrets = el('div', { class: 'chronicler-secrets', attrs: { role: 'list', 'aria-label': 'Secrets' } });
        this.sheetMessage = messageLine('alert');
        const save = button('Save sheet', { icon: 'fa-check', onClick: () => this.save(id, save) });
        const revert = button('Revert', { icon: 'fa-rotate-left', onClick: () => this.renderSheet() });
        this.sheet.append(
            el('div', { class: 'chronicler-form' }, learn,
                el('small', { class: 'chronicler-hint', text: 'Off: this character neither saves new memories nor reads the ones it has.' })),
            el('div', { class: 'chronicler-grid' },
                el('label', { attrs: { for: nameId }, text: 'Name' }), name,
                el('label', { attrs: { for: aliasesId }, text: 'Aliases' }), aliases),
            player,
            el('h4', { class: 'chronicler-group', text: 'Sheet' }), this.fields, this.addFieldRow(),
            el('h4', { class: 'chronicler-group', text: 'Secrets' }),
            el('small', { class: 'chronicler-hint', text: `Only ${character.name} and the characters listed know a secret; nobody else is told it.` }),
            this.secrets, button('Add secret', { icon: 'fa-user-secret', onClick: () => this.addSecret() }),
            el('div', { class: 'chronicler-toolbar chronicler-sheet-actions' }, save, revert), this.sheetMessage);
        this.renderFields();
        this.renderSecrets();
    }

    renderFields() {
        clear(this.fields);
        const keys = Object.keys(this.draft.sheet ?? {}).filter((k) => k !== 'secrets');
        if (!keys.length) this.fields.append(el('p', { class: 'chronicler-empty', text: 'No fields yet. Sheets grow from play; you can add fields here.' }));
        for (const key of keys) {
            const boxId = newId('field');
            const box = el('textarea', { class: 'text_pole', attrs: { id: boxId, rows: 2, maxlength: 20000 } });
            box.value = this.draft.sheet[key];
            autoGrow(box, 10);
            box.addEventListener('input', () => { this.draft.sheet[key] = box.value; });
            this.fields.append(el('div', { class: 'chronicler-field' },
                el('div', { class: 'chronicler-field-head' }, el('label', { attrs: { for: boxId }, text: fieldLabel(key) }),
                    iconButton('fa-xmark', `Remove field ${fieldLabel(key)}`, () => { delete this.draft.sheet[key]; this.renderFields(); })),
                box));
        }
    }

    addFieldRow() {
        const listId = newId('fields');
        const input = el('input', { class: 'text_pole', attrs: { placeholder: 'New field, e.g. appearance', 'aria-label': 'Name of a new sheet field', list: listId } });
        const options = el('datalist', { attrs: { id: listId } }, ...SUGGESTED.map((s) => el('option', { attrs: { value: s } })));
        const add = button('Add field', { icon: 'fa-plus', onClick: () => {
            const key = fieldKey(input.value);
            this.draft.sheet ??= {};
            const count = Object.keys(this.draft.sheet).filter((k) => k !== 'secrets').length;
            if (!key) return this.sheetMessage.show('A field name starts with a letter and uses letters, digits and spaces (up to 40).', 'error');
            if (key in this.draft.sheet) return this.sheetMessage.show(`The sheet already has “${fieldLabel(key)}”.`, 'error');
            if (count >= MAX_FIELDS) return this.sheetMessage.show(`A sheet holds at most ${MAX_FIELDS} fields.`, 'error');
            this.draft.sheet[key] = '';
            input.value = '';
            this.sheetMessage.show('');
            this.renderFields();
            this.fields.querySelector('.chronicler-field:last-child textarea')?.focus();
        } });
        input.addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); add.click(); } });
        return el('div', { class: 'chronicler-toolbar' }, input, options, add);
    }

    renderSecrets() {
        clear(this.secrets);
        const secrets = this.draft.sheet?.secrets ?? [];
        secrets.forEach((secret, i) => {
            const boxId = newId('secret');
            const box = el('textarea', { class: 'text_pole', attrs: { id: boxId, rows: 2, maxlength: 4000 } });
            box.value = secret.text;
            box.addEventListener('input', () => { secret.text = box.value; });
            this.secrets.append(el('div', { class: 'chronicler-secret', attrs: { role: 'listitem' } },
                el('div', { class: 'chronicler-field-head' }, el('label', { attrs: { for: boxId }, text: `Secret ${i + 1}` }),
                    iconButton('fa-trash-can', `Remove secret ${i + 1}`, () => { secrets.splice(i, 1); this.renderSecrets(); })),
                box, this.knownBy(secret)));
        });
    }

    /** Chips of who knows a secret, and a picker to add one. */
    knownBy(secret) {
        const owner = this.picker.value;
        const wrap = el('div', { class: 'chronicler-known-by' }, el('span', { text: 'Also known by:' }));
        const ids = (secret.known_by ?? []).filter((id) => id !== owner);
        if (!ids.length) wrap.append(el('span', { class: 'chronicler-hint', text: 'nobody else' }));
        for (const id of ids) {
            wrap.append(el('span', { class: 'chronicler-chip' }, this.pctx.nameOf(id, this.known),
                iconButton('fa-xmark', `${this.pctx.nameOf(id, this.known)} no longer knows it`, () => {
                    secret.known_by = ids.filter((x) => x !== id);
                    this.renderSecrets();
                })));
        }
        const others = [...this.known.keys()].filter((id) => id !== owner && !ids.includes(id));
        if (others.length) {
            const add = select([['', 'Tell someone…'], ...others.map((id) => [id, this.pctx.nameOf(id, this.known)])], {
                label: 'Add a character who knows this secret',
                onChange: (id) => { if (id) { secret.known_by = [...ids, id]; this.renderSecrets(); } },
            });
            wrap.append(add);
        }
        return wrap;
    }

    addSecret() {
        this.draft.sheet ??= {};
        (this.draft.sheet.secrets ??= []).push({ text: '', known_by: [] });
        this.renderSecrets();
        this.secrets.querySelector('.chronicler-secret:last-child textarea')?.focus();
    }

    async setLearning(id, on, control) {
        const character = this.known.get(id);
        try {
            const answer = await this.pctx.client().putCharacter(id, { name: character.name, learn_from_chat: on });
            this.known.set(id, answer?.character ?? { ...character, learn_from_chat: on });
            this.message.show(on ? `${character.name} learns from chat again.` : `${character.name} no longer saves or reads memories.`, 'ok');
        } catch (error) {
            control.input.checked = !on;
            this.message.show(describeError(error), 'error');
        }
    }

    async save(id, saveButton) {
        const sheet = { ...(this.draft.sheet ?? {}) };
        const secrets = (sheet.secrets ?? []).filter((s) => s.text.trim()).map((s) => ({ text: s.text, known_by: s.known_by?.length ? s.known_by : [] }));
        if (secrets.length) sheet.secrets = secrets;
        else delete sheet.secrets;
        if (!this.draft.name.trim()) return this.sheetMessage.show('A character needs a name.', 'error');
        setDisabled(saveButton, true);
        try {
            const answer = await this.pctx.client().putCharacter(id, {
                name: this.draft.name.trim(), aliases: this.draft.aliases ?? [], sheet, is_player: Boolean(this.draft.is_player),
            });
            this.known.set(id, answer?.character ?? this.draft);
            this.renderSheet();
            this.message.show('Sheet saved.', 'ok');
        } catch (error) {
            this.sheetMessage.show(describeError(error), 'error');
        } finally {
            setDisabled(saveButton, false);
        }
    }
}
