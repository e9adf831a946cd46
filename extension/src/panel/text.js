// Small pure text helpers shared by the panel's modules (node-testable).

/** Whitespace collapsed to single spaces, trimmed. */
export function squash(text) {
    return String(text ?? '').replace(/\s+/g, ' ').trim();
}

/**
 * Cut `text` to at most `max` characters, at a word boundary when one is near, with an ellipsis.
 * @param {string} text
 * @param {number} max
 */
export function cut(text, max) {
    const s = String(text ?? '');
    if (s.length <= max) return s;
    if (max <= 1) return s.slice(0, Math.max(0, max));
    const room = s.slice(0, max - 1);
    const space = room.lastIndexOf(' ');
    const head = space >= Math.floor(max * 0.6) ? room.slice(0, space) : room;
    return head.replace(/[\s,;:.-]+$/, '') + '\u2026';
}

/** "3 / 20": a counter's text. */
export function counterText(used, limit) {
    return `${used} / ${limit}`;
}

/** Lower-cased, accents removed, whitespace collapsed: the form text is compared in. */
export function fold(text) {
    return squash(text).normalize('NFD').replace(/[\u0300-\u036f]/g, '').toLowerCase();
}

/** "1 memory", "2 memories". */
export function plural(n, one, many) {
    return `${n} ${n === 1 ? one : many}`;
}

/** Relative time in words for an ISO timestamp ("3 days ago"). */
export function ago(iso, now = Date.now()) {
    const t = Date.parse(iso);
    if (!Number.isFinite(t)) return '';
    const s = Math.max(0, Math.round((now - t) / 1000));
    if (s < 60) return 'just now';
    const steps = [[60, 'minute'], [24, 'hour'], [30, 'day'], [12, 'month'], [Infinity, 'year']];
    let value = Math.floor(s / 60);
    for (const [size, unit] of steps) {
        if (value < size) return `${value} ${unit}${value === 1 ? '' : 's'} ago`;
        value = Math.floor(value / size);
    }
    return '';
}
