// Pure rules of the Memories tab: scopes, quota counters, filtering, ordering, error wording.

import { PANEL_LIMITS } from './limits.js';
import { fold } from './text.js';

/** The key of a memory's scope: "global" or "character:<id>". */
export function scopeKey(memory) {
    return memory?.scope === 'character' ? `character:${memory.character_id}` : 'global';
}

/**
 * The view the panel shows: one scope, or every character scope at once.
 * @typedef {{kind: 'global'} | {kind: 'character', characterId: string} | {kind: 'all'}} View
 */

/** The `GET /v1/memories` filters of a view. */
export function viewQuery(view) {
    if (view.kind === 'global') return { scope: 'global' };
    if (view.kind === 'character') return { scope: 'character', character_id: view.characterId };
    return { scope: 'character' };
}

/** The `{scope, character_id}` a new memory gets in this view (null for "all": the person must choose). */
export function viewTarget(view) {
    if (view.kind === 'global') return { scope: 'global', character_id: null };
    if (view.kind === 'character') return { scope: 'character', character_id: view.characterId };
    return null;
}

/** View <-> the value of the scope picker. */
export function viewValue(view) {
    return view.kind === 'character' ? `character:${view.characterId}` : view.kind;
}

export function parseView(value) {
    if (value === 'global' || value === 'all') return { kind: value };
    if (typeof value === 'string' && value.startsWith('character:')) return { kind: 'character', characterId: value.slice(10) };
    return { kind: 'global' };
}

/**
 * Per scope: how many active pinned and unpinned memories, and how many archived.
 * @param {object[]} active memories with archived false
 * @param {object[]} [archived]
 * @returns {Map<string, {pinned: number, unpinned: number, archived: number}>}
 */
export function quotaCounts(active, archived = []) {
    const counts = new Map();
    const at = (key) => {
        if (!counts.has(key)) counts.set(key, { pinned: 0, unpinned: 0, archived: 0 });
        return counts.get(key);
    };
    for (const m of active) at(scopeKey(m))[m.pinned ? 'pinned' : 'unpinned'] += 1;
    for (const m of archived) at(scopeKey(m)).archived += 1;
    return counts;
}

/**
 * The quota line of one scope, and whether each quota is full.
 * @param {{pinned: number, unpinned: number, archived?: number}} count
 */
export function quotaLine(count, limits = PANEL_LIMITS) {
    const c = count ?? { pinned: 0, unpinned: 0, archived: 0 };
    return {
        text: `Pinned ${c.pinned} / ${limits.pinnedPerScope} · Unpinned ${c.unpinned} / ${limits.unpinnedPerScope}`,
        pinnedFull: c.pinned >= limits.pinnedPerScope,
        unpinnedFull: c.unpinned >= limits.unpinnedPerScope,
        pinnedRoom: Math.max(0, limits.pinnedPerScope - c.pinned),
    };
}

/** Pinned first, then the most recently updated, then by id (the sidecar's own order). */
export function sortMemories(list) {
    return [...list].sort((a, b) => (Number(b.pinned) - Number(a.pinned))
        || String(b.updated_at).localeCompare(String(a.updated_at))
        || String(a.id).localeCompare(String(b.id)));
}

/**
 * The memories whose text contains every word of `query` (case and accents ignored).
 * @param {object[]} list
 * @param {string} query
 */
export function filterMemories(list, query) {
    const words = fold(query).split(' ').filter(Boolean);
    if (!words.length) return list;
    return list.filter((m) => {
        const text = fold(m.text);
        return words.every((w) => text.includes(w));
    });
}

/**
 * Group a list by scope, in the order of `order` (scope keys), unknown scopes after.
 * @returns {Array<{key: string, items: object[]}>}
 */
export function groupByScope(list, order = []) {
    const groups = new Map(order.map((k) => [k, []]));
    for (const m of list) {
        const key = scopeKey(m);
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(m);
    }
    return [...groups].map(([key, items]) => ({ key, items })).filter((g) => g.items.length);
}

/** True when a call failed because the sidecar has no such route (an older sidecar). */
export function isMissingRoute(error) {
    return (error?.status === 404 && (error.code === 'not_found' || error.code === 'http_404'))
        || error?.status === 405;
}

/**
 * True when a call failed because this sidecar lacks the route. From a browser a missing route
 * often looks like an unreachable sidecar (its CORS preflight answers 404, so fetch itself
 * fails); then the sidecar is asked for its health: if it answers, the route is what is missing.
 * @param {any} error
 * @param {{health: () => Promise<any>}} client
 */
export async function routeUnavailable(error, client) {
    if (isMissingRoute(error)) return true;
    if (error?.code !== 'unreachable') return false;
    try {
        await client.health();
        return true;
    } catch {
        return false;
    }
}

/**
 * One sentence for a failed call, for the person using the panel.
 * @param {{status?: number, code?: string, message?: string}} error
 */
export function describeError(error) {
    if (!error) return '';
    if (error.code === 'unreachable' || error.code === 'timeout') {
        return `The Chronicler sidecar is not answering (${error.message}) Is it running? Extensions → Chronicler → Test connection.`;
    }
    if (error.status === 401) return 'The sidecar did not accept the token. Paste it in Extensions → Chronicler.';
    if (isMissingRoute(error)) return 'This sidecar does not offer this yet; update Chronicler\'s sidecar.';
    if (error.code === 'version_conflict') return 'This memory was changed meanwhile (by the model or another window). The list is reloaded; your text is still in the editor.';
    return error.message || String(error);
}
