// "Test connection": reach the sidecar, then prove the token, and say plainly what is wrong.

import { reembedLine } from './panel/jobs.js';

/**
 * One sentence for the settings drawer from the two probes' outcomes.
 * @param {{health?: any, healthError?: any, authError?: any, origin?: string, baseUrl?: string}} outcome
 * @returns {{ok: boolean, text: string}}
 */
export function describeConnection({ health, healthError, authError, origin = '', baseUrl = '' }) {
    if (healthError) {
        if (healthError.status === 403) {
            return { ok: false, text: `The sidecar refused this page's origin ${origin}: add it to CHRONICLER_ORIGINS.` };
        }
        if (healthError.status === 0) {
            return {
                ok: false,
                text: `No answer from ${baseUrl}. Is the sidecar running (chronicler serve), and is ${origin} in its allowed origins?`,
            };
        }
        return { ok: false, text: `The sidecar answered an error: ${healthError.message}` };
    }
    if (authError) {
        if (authError.status === 401) return { ok: false, text: 'The sidecar is up but the token was not accepted. Paste the token it printed at first start.' };
        if (authError.status === 403) return { ok: false, text: `The sidecar is up but refused this page (${authError.message}).` };
        return { ok: false, text: `The sidecar is up but a test call failed: ${authError.message}` };
    }
    const version = health?.version ? ` ${health.version}` : '';
    const embedder = health?.embedder;
    const ready = embedder && embedder.ready === false
        ? ` (the embedding model is not ready${embedder.error ? `: ${embedder.error}` : ', still loading'})` : '';
    const move = reembedLine(health);
    return { ok: true, text: `Connected to Chronicler${version}; token accepted${ready}.${move ? ` ${move}.` : ''}` };
}

/**
 * Run both probes with `client` and describe the result.
 * @param {import('./client.js').SidecarClient} client
 * @param {string} origin this page's origin, for the advice
 */
export async function testConnection(client, origin) {
    const outcome = { origin, baseUrl: client.baseUrl };
    try {
        outcome.health = await client.health();
    } catch (error) {
        outcome.healthError = error;
        return describeConnection(outcome);
    }
    try {
        await client.request('GET', '/v1/characters');
    } catch (error) {
        outcome.authError = error;
    }
    return describeConnection(outcome);
}
