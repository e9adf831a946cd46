// Escaping for the few places where text reaches HTML: templates, toastr and popups (both render
// their message as HTML). Memory text, names, lore and error messages are untrusted.

const HTML_ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/**
 * Escape text for an HTML template, a popup or toastr.
 * @param {unknown} value
 * @returns {string}
 */
export function escapeHtml(value) {
    return String(value ?? '').replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]);
}
