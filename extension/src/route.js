// Which way the extension reaches the sidecar: through SillyTavern's Chronicler server plugin (on
// the page's own origin, behind SillyTavern's login and CSRF token: no URL or token in the page), or
// directly (a sidecar URL and its bearer token). Learnt from the file `chronicler install-extension`
// wrote beside the extension, never by trying a route that may answer 404.

import { SidecarClient } from './client.js';

export const PLUGIN_ROUTE = '/api/plugins/chronicler';

/**
 * The way in, from the parsed install file.
 * @param {any} installed chronicler.config.json, or null
 * @returns {{mode: 'plugin', route: string, version: string} | {mode: 'direct'}}
 */
export function connectionFrom(installed) {
    if (installed && typeof installed === 'object' && installed.mode === 'plugin') {
        const route = typeof installed.route === 'string' && /^\/[\w/-]+$/.test(installed.route) ? installed.route : PLUGIN_ROUTE;
        return { mode: 'plugin', route: route.replace(/\/+$/, ''), version: String(installed.version ?? '') };
    }
    return { mode: 'direct' };
}

/**
 * A client through the plugin: the page's origin, SillyTavern's session cookie and CSRF header.
 * @param {{route: string}} via
 * @param {string} origin location.origin
 * @param {() => Record<string, string>} requestHeaders SillyTavern's getRequestHeaders()
 * @param {number} timeoutMs
 */
export function pluginClient(via, origin, requestHeaders, timeoutMs) {
    const csrf = () => {
        const token = (requestHeaders?.() ?? {})['X-CSRF-Token'];
        return token ? { 'X-CSRF-Token': token } : {};
    };
    return new SidecarClient({ baseUrl: origin + via.route, timeoutMs, headers: csrf, credentials: 'same-origin' });
}

/** What the drawer says about the way in. */
export function describePath(via, settings) {
    return via.mode === 'plugin'
        ? `Connected through SillyTavern's Chronicler plugin (${via.route}): the sidecar runs with SillyTavern, and this works from any device that opens it.`
        : `Connected directly to the sidecar at ${settings.sidecarUrl} (no server plugin installed).`;
}

/**
 * A warning when the extension, the plugin and the sidecar are not the same version, else null.
 * @param {{extension?: string, plugin?: string|null, sidecar?: string|null}} versions
 */
export function versionWarning({ extension, plugin, sidecar }) {
    const known = Object.entries({ extension, plugin, sidecar }).filter(([, v]) => typeof v === 'string' && v);
    if (known.length < 2 || new Set(known.map(([, v]) => v)).size === 1) return null;
    return `Chronicler's parts disagree on their version (${known.map(([k, v]) => `${k} ${v}`).join(', ')}). `
        + 'Run `chronicler install-extension` again from the same checkout, then restart SillyTavern.';
}
