// DOM helpers of the panel. Text always goes in through textContent, never innerHTML: memory
// text, names and lore are untrusted (an `<img onerror>` memory must show as text).

let uid = 0;

/** A unique element id with a readable prefix. */
export function newId(prefix) {
    uid += 1;
    return `chronicler_${prefix}_${uid}`;
}

/**
 * Create an element.
 * @param {string} tag
 * @param {{class?: string, text?: string, attrs?: Record<string, string|number|boolean>, on?: Record<string, Function>}} [props]
 * @param {...(Node|string|null|undefined|false)} children strings become text nodes
 */
export function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    if (props.class) node.className = props.class;
    if (props.text !== undefined) node.textContent = String(props.text);
    for (const [name, value] of Object.entries(props.attrs ?? {})) {
        if (value === false || value === null || value === undefined) continue;
        node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const [event, handler] of Object.entries(props.on ?? {})) node.addEventListener(event, handler);
    append(node, ...children);
    return node;
}

/** Append children (strings as text). */
export function append(node, ...children) {
    for (const child of children.flat()) {
        if (child === null || child === undefined || child === false) continue;
        node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
}

/** Remove every child. */
export function clear(node) {
    node.replaceChildren();
    return node;
}

/** A Font Awesome icon, hidden from screen readers. */
export function icon(name) {
    return el('i', { class: `fa-solid ${name}`, attrs: { 'aria-hidden': 'true' } });
}

// SillyTavern's own buttons are `div.menu_button` made keyboard-interactable by its keyboard.js
// (tabindex, Enter -> click). Space is the other key a button answers to; we add it.
function onSpace(event) {
    if (event.key === ' ' && event.target === event.currentTarget) {
        event.preventDefault();
        event.currentTarget.click();
    }
}

function guarded(handler) {
    return (event) => {
        if (event.currentTarget.classList.contains('disabled')) return;
        handler(event);
    };
}

/**
 * A SillyTavern-style button with an icon and a label.
 * @param {string} label
 * @param {{icon?: string, onClick?: Function, title?: string, class?: string}} [options]
 */
export function button(label, options = {}) {
    const node = el('div', {
        class: `menu_button menu_button_icon ${options.class ?? ''}`.trim(),
        attrs: { role: 'button', tabindex: 0, title: options.title ?? false },
        on: { keydown: onSpace },
    }, options.icon ? icon(options.icon) : null, el('span', { text: label }));
    if (options.onClick) node.addEventListener('click', guarded(options.onClick));
    return node;
}

/**
 * An icon-only button; `label` is its accessible name and tooltip.
 * @param {string} iconName e.g. 'fa-trash-can'
 * @param {string} label
 * @param {Function} [onClick]
 */
export function iconButton(iconName, label, onClick, extraClass = '') {
    const node = el('div', {
        class: `menu_button chronicler-icon-button fa-solid ${iconName} ${extraClass}`.trim(),
        attrs: { role: 'button', tabindex: 0, title: label, 'aria-label': label },
        on: { keydown: onSpace },
    });
    if (onClick) node.addEventListener('click', guarded(onClick));
    return node;
}

/** Disable or enable a div button (SillyTavern's `disabled` class also drops it from tab order). */
export function setDisabled(node, disabled) {
    node.classList.toggle('disabled', Boolean(disabled));
    node.setAttribute('aria-disabled', String(Boolean(disabled)));
    if (disabled) node.removeAttribute('tabindex');
    else node.setAttribute('tabindex', '0');
}

/**
 * A live "n / max" counter for a text box; marks itself when over the limit.
 * @param {HTMLTextAreaElement|HTMLInputElement} box
 * @param {number} max
 */
export function charCounter(box, max) {
    const counter = el('span', { class: 'chronicler-counter', attrs: { 'aria-live': 'polite' } });
    const update = () => {
        const n = box.value.length;
        counter.textContent = `${n} / ${max}`;
        counter.classList.toggle('over', n > max);
    };
    box.addEventListener('input', update);
    update();
    counter.update = update;
    return counter;
}

/**
 * Let a text box grow with its text, up to `maxRows` lines (then it scrolls).
 * @param {HTMLTextAreaElement} box
 */
export function autoGrow(box, maxRows = 10) {
    const fit = () => {
        if (!box.isConnected) return;
        const style = getComputedStyle(box);
        const line = parseFloat(style.lineHeight) || 20;
        const chrome = box.offsetHeight - box.clientHeight + parseFloat(style.paddingTop) + parseFloat(style.paddingBottom);
        box.style.height = 'auto';
        box.style.height = `${Math.min(box.scrollHeight + (box.offsetHeight - box.clientHeight), line * maxRows + chrome)}px`;
    };
    box.addEventListener('input', fit);
    requestAnimationFrame(fit);
    return box;
}

/** A labelled checkbox in SillyTavern's `checkbox_label` style. */
export function checkbox(label, { checked = false, onChange, id = newId('check'), title } = {}) {
    const input = el('input', { attrs: { type: 'checkbox', id } });
    input.checked = checked;
    if (onChange) input.addEventListener('change', () => onChange(input.checked));
    const node = el('label', { class: 'checkbox_label chronicler-check', attrs: { for: id, title: title ?? false } }, input, el('span', { text: label }));
    node.input = input;
    return node;
}

/** A `<select class="text_pole">` from [value, label] pairs. */
export function select(options, { value, label, id = newId('select'), onChange } = {}) {
    const node = el('select', { class: 'text_pole', attrs: { id, 'aria-label': label ?? false } });
    for (const [v, text] of options) node.append(el('option', { text, attrs: { value: v } }));
    if (value !== undefined) node.value = value;
    if (onChange) node.addEventListener('change', () => onChange(node.value));
    return node;
}

/** A message line for results and errors (announced to screen readers). */
export function messageLine(kind = 'status') {
    const node = el('div', { class: 'chronicler-message', attrs: { role: kind === 'alert' ? 'alert' : 'status', 'aria-live': 'polite' } });
    node.show = (text, tone = 'info') => {
        node.textContent = text ?? '';
        node.dataset.tone = tone;
        node.hidden = !text;
    };
    node.hidden = true;
    return node;
}

/** Call `fn` once typing stops for `ms`. */
export function debounce(fn, ms) {
    let timer;
    return (...args) => {
        clearTimeout(timer);
        timer = setTimeout(() => fn(...args), ms);
    };
}

/**
 * Keep Escape inside a control (an inline editor) from closing the whole panel dialog, and give
 * it a meaning of its own (cancel the edit).
 */
export function onEscape(node, handler) {
    node.addEventListener('keydown', (event) => {
        if (event.key !== 'Escape') return;
        event.preventDefault();
        event.stopPropagation();
        handler(event);
    });
}
