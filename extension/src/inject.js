// Context blocks from the sidecar -> SillyTavern extension prompts.
// Pure mapping plus two thin appliers that take `setExtensionPrompt` as an argument.

import { neutraliseMacros } from './macros.js';

// SillyTavern's enums (script.js extension_prompt_types / extension_prompt_roles). getContext()
// does not expose them, so they are restated here.
export const POSITIONS = Object.freeze({ none: -1, in_prompt: 0, in_chat: 1, before_prompt: 2 });
export const ROLES = Object.freeze({ system: 0, user: 1, assistant: 2 });

/** Every key we set starts with this; SillyTavern orders prompts at one position by sorted key. */
export const KEY_PREFIX = 'chronicler_';

/**
 * A position given by name or number -> SillyTavern's number (unknown -> in_prompt).
 * @param {string|number|undefined} value
 */
export function toPosition(value) {
    if (typeof value === 'number' && Object.values(POSITIONS).includes(value)) return value;
    const named = POSITIONS[String(value ?? '').toLowerCase()];
    return named ?? POSITIONS.in_prompt;
}

/** A role given by name or number -> SillyTavern's number (unknown -> system). */
export function toRole(value) {
    if (typeof value === 'number' && Object.values(ROLES).includes(value)) return value;
    const named = ROLES[String(value ?? '').toLowerCase()];
    return named ?? ROLES.system;
}

/**
 * The setExtensionPrompt calls for one turn's blocks, in the sidecar's order.
 *
 * Keys carry the block's index so SillyTavern's sorted-key order keeps the sidecar's order
 * among blocks that land at the same place. A user override for a section replaces the
 * sidecar's position/depth/role for that section (`position: 'default'` keeps the sidecar's).
 * Empty blocks are skipped; macro openers in the text are neutralised (macros.js).
 *
 * @param {Array<{section: string, text: string, position?: any, depth?: number, role?: any}>} blocks
 * @param {Record<string, {position?: string, depth?: number, role?: string}>} [overrides]
 * @returns {Array<{key: string, value: string, position: number, depth: number, scan: boolean, role: number}>}
 */
export function blocksToPrompts(blocks, overrides = {}) {
    const calls = [];
    (Array.isArray(blocks) ? blocks : []).forEach((block, index) => {
        const text = typeof block?.text === 'string' ? block.text : '';
        if (!text.trim()) return;
        const section = String(block.section ?? 'block').replace(/[^A-Za-z0-9_]/g, '_');
        const override = overrides?.[section];
        const useOverride = override && override.position && override.position !== 'default';
        const position = toPosition(useOverride ? override.position : block.position);
        const rawDepth = useOverride && override.depth !== undefined ? override.depth : block.depth;
        const depth = Number.isFinite(Number(rawDepth)) && Number(rawDepth) >= 0 ? Math.floor(Number(rawDepth)) : 0;
        const role = toRole(useOverride && override.role ? override.role : block.role);
        calls.push({
            key: `${KEY_PREFIX}${String(index).padStart(2, '0')}_${section}`,
            // SillyTavern runs macro substitution over injected prompts: keep our text literal.
            value: neutraliseMacros(text),
            position,
            depth,
            scan: false, // our text must not trigger SillyTavern's World Info a second time
            role,
        });
    });
    return calls;
}

/**
 * Set this turn's prompts and clear the keys of the previous turn that are not set again
 * (slots are sticky until overwritten). Returns the keys now in use.
 * @param {Function} setExtensionPrompt SillyTavern's (key, value, position, depth, scan, role)
 * @param {ReturnType<typeof blocksToPrompts>} calls
 * @param {Iterable<string>} previousKeys
 * @returns {Set<string>}
 */
export function applyPrompts(setExtensionPrompt, calls, previousKeys = []) {
    const now = new Set(calls.map(c => c.key));
    clearPrompts(setExtensionPrompt, [...previousKeys].filter(k => !now.has(k)));
    for (const c of calls) {
        // Argument order is SillyTavern's: scan comes before role.
        setExtensionPrompt(c.key, c.value, c.position, c.depth, c.scan, c.role);
    }
    return now;
}

/**
 * Empty our slots (an empty value is how SillyTavern clears one).
 * @param {Function} setExtensionPrompt
 * @param {Iterable<string>} keys
 */
export function clearPrompts(setExtensionPrompt, keys) {
    for (const key of keys) {
        if (String(key).startsWith(KEY_PREFIX)) setExtensionPrompt(key, '', POSITIONS.in_prompt, 0, false, ROLES.system);
    }
}
