// The settings drawer in SillyTavern's Extensions panel: fill it from the settings, write edits back.
// Thin DOM code; the rules live in settings.js and connection.js.

import { SECTIONS, normaliseUrl } from './settings.js';
import { connectionProfiles } from './worker.js';

const POSITION_CHOICES = [
    ['default', "Sidecar's choice"],
    ['before_prompt', 'Before the main prompt'],
    ['in_prompt', 'After the main prompt'],
    ['in_chat', 'In the chat, at depth'],
    ['none', 'Do not inject'],
];
const ROLE_CHOICES = [['system', 'System'], ['user', 'User'], ['assistant', 'Assistant']];

function option(value, label) {
    const el = document.createElement('option');
    el.value = value;
    el.textContent = label;
    return el;
}

function sectionLabel(section) {
    const text = section.replace(/_/g, ' ');
    return text.charAt(0).toUpperCase() + text.slice(1);
}

/**
 * Bind the drawer's controls.
 * @param {HTMLElement} root the drawer element (#chronicler_settings)
 * @param {{
 *   read: () => object,            // current settings (with defaults)
 *   write: (patch: object) => void, // store a change
 *   test: () => Promise<{ok: boolean, text: string}>,
 *   features?: () => Record<string, boolean|undefined>, // which optional sidecar routes exist
 *   profiles?: () => {available: boolean, profiles: Array<{id: string, name: string}>, reason: string},
 *   followJobMode?: (choice: string) => Promise<string|null>, // the sidecar's llm_mode follows the choice
 * }} io
 * @returns {() => void} call when the sidecar's features may have changed
 */
export function bindSettingsPanel(root, io) {
    const $ = (id) => root.querySelector(`#${id}`);
    const settings = io.read();

    const enabled = $('chronicler_enabled');
    enabled.checked = settings.enabled;
    enabled.addEventListener('change', () => io.write({ enabled: enabled.checked }));

    const url = $('chronicler_url');
    url.value = settings.sidecarUrl;
    url.addEventListener('change', () => io.write({ sidecarUrl: normaliseUrl(url.value) }));

    const token = $('chronicler_token');
    token.value = settings.token;
    token.addEventListener('change', () => io.write({ token: token.value.trim() }));

    const mode = $('chronicler_llm_mode');
    const modeHint = $('chronicler_llm_mode_hint');
    mode.value = settings.llmMode;
    mode.addEventListener('change', async () => {
        io.write({ llmMode: mode.value });
        // The sidecar's own mode follows (DC6): no restart, no environment variable.
        const now = await io.followJobMode?.(mode.value).catch((error) => {
            modeHint.textContent = `The sidecar kept its job mode: ${error?.message ?? error}`;
            return undefined;
        });
        if (now) modeHint.textContent = now === 'client' ? 'The sidecar now leaves its jobs to this page.' : `The sidecar runs its jobs itself (${now}).`;
    });
    // "SillyTavern's connection" needs the sidecar's job routes; offer it only when they exist.
    const refreshMode = () => {
        const jobs = io.features?.()?.jobs;
        const option = mode.querySelector('option[value="sillytavern"]');
        option.disabled = jobs !== true;
        modeHint.textContent = jobs === true ? ''
            : jobs === false ? 'This sidecar cannot hand jobs to SillyTavern (no job routes).'
                : 'Available once the sidecar is reachable.';
        if (jobs === true) mode.value = io.read().llmMode;
    };
    refreshMode();

    const profile = $('chronicler_job_profile');
    const profileHint = $('chronicler_job_profile_hint');
    if (profile && io.profiles) {
        const { available, profiles, reason } = io.profiles();
        for (const p of profiles) profile.append(option(p.id, p.name));
        const chosen = settings.jobProfileId;
        if (chosen && !profiles.some((p) => p.id === chosen)) profile.append(option(chosen, `${chosen} (not found)`));
        profile.value = chosen;
        profile.disabled = !available;
        profileHint.textContent = reason;
        profile.addEventListener('change', () => io.write({ jobProfileId: profile.value }));
    }

    const tools = $('chronicler_tools');
    tools.checked = settings.tools;
    tools.addEventListener('change', () => io.write({ tools: tools.checked }));

    const timeout = $('chronicler_timeout');
    timeout.value = String(settings.contextTimeoutMs);
    timeout.addEventListener('change', () => {
        const ms = Math.round(Number(timeout.value));
        if (Number.isFinite(ms) && ms >= 100) io.write({ contextTimeoutMs: ms });
    });

    bindInjectionRows($('chronicler_injection_rows'), settings.injection ?? {}, (injection) => io.write({ injection }));

    const button = $('chronicler_test');
    const result = $('chronicler_test_result');
    const run = async () => {
        result.className = 'chronicler-test-result';
        result.textContent = 'Testing…';
        const outcome = await io.test();
        result.classList.add(outcome.ok ? 'ok' : 'error');
        result.textContent = outcome.text;
    };
    button.addEventListener('click', run);
    button.addEventListener('keydown', (event) => {
        if (event.key === 'Enter' || event.key === ' ') {
            event.preventDefault();
            run();
        }
    });
    return refreshMode;
}

/**
 * Add the drawer to SillyTavern's Extensions panel and bind it.
 * @param {any} ctx SillyTavern.getContext()
 * @param {string} path our folder under scripts/extensions/, e.g. "third-party/Chronicler"
 * @param {Parameters<typeof bindSettingsPanel>[1]} io
 * @returns {Promise<() => void>} call when the sidecar's features may have changed
 */
export async function addSettingsDrawer(ctx, path, io) {
    const html = await ctx.renderExtensionTemplateAsync(path, 'settings');
    const host = document.getElementById('extensions_settings2') ?? document.getElementById('extensions_settings');
    host.insertAdjacentHTML('beforeend', html);
    return bindSettingsPanel(document.getElementById('chronicler_settings'),
        { profiles: () => connectionProfiles(ctx), ...io });
}

function bindInjectionRows(tbody, initial, save) {
    const current = structuredClone(initial);
    for (const section of SECTIONS) {
        const row = document.createElement('tr');
        row.dataset.section = section;
        const name = document.createElement('td');
        name.textContent = sectionLabel(section);

        const position = document.createElement('select');
        position.className = 'text_pole';
        position.setAttribute('aria-label', `${sectionLabel(section)} position`);
        for (const [value, label] of POSITION_CHOICES) position.append(option(value, label));
        const depth = document.createElement('input');
        depth.type = 'number';
        depth.min = '0';
        depth.max = '10000';
        depth.className = 'text_pole';
        depth.setAttribute('aria-label', `${sectionLabel(section)} depth`);
        const role = document.createElement('select');
        role.className = 'text_pole';
        role.setAttribute('aria-label', `${sectionLabel(section)} role`);
        for (const [value, label] of ROLE_CHOICES) role.append(option(value, label));

        const saved = current[section] ?? {};
        position.value = saved.position ?? 'default';
        depth.value = String(saved.depth ?? 0);
        role.value = saved.role ?? 'system';
        const refresh = () => {
            const custom = position.value !== 'default';
            depth.disabled = position.value !== 'in_chat';
            role.disabled = !custom || position.value === 'none';
        };
        refresh();
        const store = () => {
            if (position.value === 'default') delete current[section];
            else current[section] = { position: position.value, depth: Math.max(0, Math.round(Number(depth.value) || 0)), role: role.value };
            refresh();
            save(structuredClone(current));
        };
        position.addEventListener('change', store);
        depth.addEventListener('change', store);
        role.addEventListener('change', store);

        for (const control of [position, depth, role]) {
            const cell = document.createElement('td');
            cell.append(control);
            row.append(cell);
        }
        row.prepend(name);
        tbody.append(row);
    }
}
