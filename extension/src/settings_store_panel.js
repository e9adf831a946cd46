// The drawer's "Memory settings" section: this SillyTavern user's store settings, read from and
// saved to the sidecar (GET/PATCH /v1/settings, DC6). Thin DOM code; the rules live in
// settings_store.js.

import { isMissingRoute } from './client.js';
import { STORE_FIELDS, STORE_GROUPS, changedSettings, formModel, keyStatus, refusalMessages } from './settings_store.js';

const inputId = (name) => `chronicler_store_${name}`;

function element(tag, props = {}) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
        if (key === 'text') el.textContent = value;
        else if (key === 'className') el.className = value;
        else el.setAttribute(key, value);
    }
    return el;
}

function fieldRow(field) {
    const row = element('div', { className: 'flex-container flexFlowColumn chronicler-store-field' });
    row.dataset.field = field.name;
    row.append(element('label', { for: inputId(field.name), text: field.label }));
    let control;
    if (field.kind === 'choice') {
        control = element('select', { className: 'text_pole' });
        for (const choice of field.choices) control.append(element('option', { value: choice, text: choice }));
    } else {
        control = element('input', { className: 'text_pole', autocomplete: 'off' });
        control.type = field.kind === 'secret' ? 'password' : field.kind === 'string' ? 'text' : 'number';
        if (field.kind === 'integer' || field.kind === 'number') {
            control.step = field.kind === 'integer' ? '1' : 'any';
            if (field.min !== undefined) control.min = String(field.min);
            if (field.max !== undefined) control.max = String(field.max);
        }
        if (field.kind === 'secret') control.placeholder = 'type a new key to set it';
    }
    control.id = inputId(field.name);
    row.append(control);
    if (field.kind === 'secret') {
        const line = element('div', { className: 'flex-container alignItemsCenter' });
        line.append(element('span', { id: `${inputId(field.name)}_status`, className: 'chronicler-key-status' }));
        line.append(element('div', { id: `${inputId(field.name)}_clear`, className: 'menu_button', role: 'button', tabindex: '0', text: 'Clear key' }));
        row.append(line);
    }
    if (field.hint) row.append(element('small', { className: 'chronicler-hint', text: field.hint }));
    row.append(element('small', { id: `${inputId(field.name)}_error`, className: 'chronicler-field-error', role: 'alert' }));
    return row;
}

function onActivate(el, run) {
    el.addEventListener('click', run);
    el.addEventListener('keydown', (event) => {
        if (event.key === 'Enter' || event.key === ' ') {
            event.preventDefault();
            run();
        }
    });
}

/**
 * Draw and bind the section. It reads the store's settings when it is opened and on "Reload";
 * "Save" sends only what changed, then shows the values read back.
 * @param {HTMLElement} root the drawer element (#chronicler_settings)
 * @param {{getClient: () => import('./client.js').SidecarClient}} io
 * @returns {{load: () => Promise<void>}}
 */
export function bindStoreSettings(root, io) {
    const $ = (id) => root.querySelector(`#${id}`);
    const section = $('chronicler_store_settings');
    const host = $('chronicler_store_fields');
    const status = $('chronicler_store_status');
    const store = $('chronicler_store_name');
    for (const [group, title] of STORE_GROUPS) {
        const box = element('fieldset', { className: 'chronicler-store-group' });
        box.dataset.group = group;
        box.append(element('legend', { text: title }));
        for (const field of STORE_FIELDS.filter((f) => f.group === group)) box.append(fieldRow(field));
        host.append(box);
    }
    let model = null;
    let busy = false;
    for (const field of STORE_FIELDS) $(inputId(field.name)).disabled = true; // until read

    const say = (text, kind = '') => {
        status.className = `chronicler-test-result ${kind}`.trim();
        status.textContent = text;
    };
    // Not `hidden`: SillyTavern's .menu_button sets its own display.
    const showClear = (name, shown) => { $(`${inputId(name)}_clear`).style.display = shown ? '' : 'none'; };
    for (const field of STORE_FIELDS.filter((f) => f.kind === 'secret')) showClear(field.name, false);
    const showErrors = (errors = {}) => {
        for (const field of STORE_FIELDS) $(`${inputId(field.name)}_error`).textContent = errors[field.name] ?? '';
    };
    const show = (next) => {
        model = next;
        store.textContent = next.store ? `Store: ${next.store}` : '';
        for (const field of STORE_FIELDS) {
            const control = $(inputId(field.name));
            const offered = next.available.has(field.name);
            control.disabled = !offered;
            if (field.kind === 'secret') {
                control.value = '';
                $(`${inputId(field.name)}_status`).textContent = offered ? keyStatus(next.keySet[field.name]) : '';
                showClear(field.name, offered && next.keySet[field.name]);
            } else {
                control.value = offered ? next.shown[field.name] : '';
            }
            control.closest('.chronicler-store-field').classList.toggle('chronicler-store-changed', next.changed.has(field.name));
        }
    };
    const read = async () => show(formModel(await io.getClient().getStoreSettings()));
    const failed = (error) => {
        if (isMissingRoute(error)) return say('This sidecar has no settings API (an older version).', 'error');
        const { fields, general } = refusalMessages(error);
        showErrors(fields);
        return say(general, 'error');
    };

    const load = async () => {
        if (busy) return;
        busy = true;
        say('Reading the store\'s settings…');
        try {
            await read();
            showErrors();
            say('');
        } catch (error) {
            failed(error);
        } finally {
            busy = false;
        }
    };

    const send = async (patch) => {
        busy = true;
        say('Saving…');
        try {
            await io.getClient().patchStoreSettings(patch);
            await read();
            showErrors();
            say('Saved', 'ok');
        } catch (error) {
            failed(error);
        } finally {
            busy = false;
        }
    };

    const save = async () => {
        if (busy || !model) return;
        const entered = {};
        for (const field of STORE_FIELDS) {
            if (model.available.has(field.name)) entered[field.name] = $(inputId(field.name)).value;
        }
        const { patch, errors } = changedSettings(model, entered);
        showErrors(errors);
        if (!patch) return say('Not saved: a value is refused (see under the field).', 'error');
        if (!Object.keys(patch).length) return say('Nothing changed.');
        await send(patch);
    };

    onActivate($('chronicler_store_save'), save);
    onActivate($('chronicler_store_reload'), load);
    for (const field of STORE_FIELDS.filter((f) => f.kind === 'secret')) {
        // Only the key goes: what else is being edited waits for Save.
        onActivate($(`${inputId(field.name)}_clear`), async () => {
            if (busy || !model) return;
            const { patch } = changedSettings(model, {}, { clear: [field.name] });
            if (!patch || !Object.keys(patch).length) return;
            busy = true;
            try {
                await io.getClient().patchStoreSettings(patch);
                const next = formModel(await io.getClient().getStoreSettings());
                model = { ...model, keySet: next.keySet };
                $(`${inputId(field.name)}_status`).textContent = keyStatus(next.keySet[field.name]);
                showClear(field.name, next.keySet[field.name]);
                say('Key cleared', 'ok');
            } catch (error) {
                failed(error);
            } finally {
                busy = false;
            }
        });
    }
    // Read when the section is opened: the sidecar (or the way to it) may have changed since.
    section.querySelector('.inline-drawer-toggle').addEventListener('click', () => { load(); });
    return { load };
}
