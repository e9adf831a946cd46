// A list that renders in pages: the first rows at once, the next when the end scrolls into view
// (or "Show more" is pressed), so hundreds of items open fast. Rows come from a cache the caller
// keeps, so a new filter re-arranges existing rows instead of building them again.

import { button, el } from './dom.js';

export class PagedList {
    /**
     * @param {HTMLElement} container where rows go
     * @param {HTMLElement} scrollRoot the scrolling ancestor
     * @param {number} pageSize
     */
    constructor(container, scrollRoot, pageSize) {
        this.container = container;
        this.pageSize = pageSize;
        this.items = [];
        this.shown = 0;
        this.render = () => null;
        this.more = button('Show more', { icon: 'fa-angles-down', class: 'chronicler-more', onClick: () => this.next() });
        this.observer = typeof IntersectionObserver === 'function'
            ? new IntersectionObserver((entries) => entries.some((e) => e.isIntersecting) && this.next(), { root: scrollRoot, rootMargin: '300px' })
            : null;
    }

    /**
     * Show `items` (rendered by `render(item)`), replacing what was shown.
     * @param {any[]} items
     * @param {(item: any) => Node} render
     */
    set(items, render) {
        this.items = items;
        this.render = render;
        this.shown = 0;
        this.container.replaceChildren();
        this.next();
    }

    next() {
        this.observer?.unobserve(this.more);
        this.more.remove();
        const end = Math.min(this.items.length, this.shown + this.pageSize);
        const fragment = document.createDocumentFragment();
        for (let i = this.shown; i < end; i++) fragment.append(this.render(this.items[i]));
        this.container.append(fragment);
        this.shown = end;
        const left = this.items.length - end;
        if (left > 0) {
            this.more.querySelector('span').textContent = `Show more (${left} left)`;
            this.container.append(this.more);
            this.observer?.observe(this.more);
        }
    }

    dispose() {
        this.observer?.disconnect();
    }
}

/** An empty-state line. */
export function emptyNote(text) {
    return el('p', { class: 'chronicler-empty', text });
}
