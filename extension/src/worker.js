// The client LLM worker: in "use SillyTavern's connection" mode the sidecar queues its background
// model work (summaries, extraction) as jobs, and this page runs them through SillyTavern's own
// connection with generateRaw — only while the user is not generating, so the user's own turns
// never wait behind a summary.
//
// Timing rules:
// - idle means: SillyTavern is not generating and no generation started or ended within `idleMs`;
// - no job waiting: ask again after `pollMs`, doubling up to `maxPollMs`; a job done: ask again soon;
// - the sidecar unreachable: back off the same way, quietly (the interceptor already tells the user);
// - the model answered something the sidecar's strict parser refused (422 model_output_invalid), or
//   the job was rolled back meanwhile (409): the sidecar has recorded it; go on with the next job;
// - any other failure (the model call itself, a refused token): hand the job back, stop, and tell
//   the user once.

import { neutraliseMacros } from './macros.js';

/**
 * SillyTavern's generateRaw arguments for one job request (`{systemPrompt, prompt,
 * responseLength, jsonSchema}` from the sidecar).
 *
 * - generateRaw runs SillyTavern's macro substitution over `prompt` and `systemPrompt`
 *   (createRawPrompt → substituteParams), so `{{…}}` in transcript text is neutralised first.
 * - Its `jsonSchema` is SillyTavern's wrapper `{name, value, description?, strict?, returnInvalid?}`;
 *   a bare JSON Schema from the sidecar is wrapped. `returnInvalid: true` so an answer that is not
 *   valid JSON comes back as text for the sidecar's strict parser to judge (otherwise SillyTavern
 *   returns "{}"), and `strict: false` because OpenAI's strict mode rejects most schemas. It is sent
 *   only when `useSchema` (many local backends reject structured output; the prompts ask for the
 *   format and the sidecar parses strictly either way), and never an empty schema.
 * @param {{systemPrompt?: string, prompt?: string, responseLength?: number, jsonSchema?: any}} request
 * @param {string} [kind] the job's kind, for the schema's name
 * @param {boolean} [useSchema]
 */
export function generateRawArgs(request, kind = 'job', useSchema = true) {
    const args = {
        systemPrompt: neutraliseMacros(String(request?.systemPrompt ?? '')),
        prompt: neutraliseMacros(String(request?.prompt ?? '')),
    };
    const length = Number(request?.responseLength);
    if (Number.isInteger(length) && length > 0) args.responseLength = length;
    const schema = request?.jsonSchema;
    if (useSchema && schema && typeof schema === 'object') {
        const wrapped = schema.value && typeof schema.value === 'object' && typeof schema.name === 'string';
        const value = wrapped ? schema.value : schema;
        if (Object.keys(value).length) {
            args.jsonSchema = wrapped
                ? { strict: false, ...schema, name: schemaName(schema.name), returnInvalid: true }
                : { name: schemaName(kind), value, strict: false, returnInvalid: true };
        }
    }
    return args;
}

/** A schema name OpenAI accepts: letters, digits, _ and -, at most 64. */
export function schemaName(kind) {
    const name = String(kind ?? 'job').replace(/[^A-Za-z0-9_-]/g, '_');
    return (name.startsWith('chronicler_') ? name : `chronicler_${name}`).slice(0, 64);
}

/**
 * True for a failure of one job that the sidecar has already recorded (the next job may well
 * work): a malformed model answer (422 `model_output_invalid`: the attempt is failed and retried
 * later) or a job that moved on meanwhile (409: rolled back, reclaimed, a stale attempt).
 * @param {any} error
 */
export function isJobLevel(error) {
    return (error?.status === 422 && error?.code === 'model_output_invalid') || error?.status === 409;
}

/** The job inside a claim answer (`{job: {...}}` or `{job: null}`), or null. */
export function jobFrom(answer) {
    const job = answer?.job;
    return job && typeof job === 'object' && job.id ? job : null;
}

/**
 * SillyTavern's Connection Manager profiles a background job may use, or why there are none.
 * @param {any} context SillyTavern.getContext()
 * @returns {{available: boolean, profiles: Array<{id: string, name: string}>, reason: string}}
 */
export function connectionProfiles(context) {
    const service = context?.ConnectionManagerRequestService;
    const profiles = context?.extensionSettings?.connectionManager?.profiles;
    if (!service?.sendRequest || !Array.isArray(profiles)) {
        return { available: false, profiles: [], reason: 'Connection Manager is off: turn it on in SillyTavern\'s extensions to pick a profile for background jobs.' };
    }
    const usable = profiles.filter((p) => p && typeof p.id === 'string' && p.id)
        .map((p) => ({ id: p.id, name: String(p.name || p.id) }));
    return { available: true, profiles: usable, reason: usable.length ? '' : 'Connection Manager has no profiles yet.' };
}

/**
 * A `generate` that runs a job through one Connection Manager profile
 * (`ConnectionManagerRequestService.sendRequest(profileId, messages, maxTokens)`, Chat and Text
 * Completion profiles). It gives no token usage: the sidecar counts the tokens itself.
 * @param {() => any} getContext
 * @param {string} profileId
 */
export function profileGenerate(getContext, profileId) {
    return async (args) => {
        const service = getContext()?.ConnectionManagerRequestService;
        if (!service?.sendRequest) {
            throw new Error('Connection Manager is off, so the profile chosen for background jobs cannot be used (turn it on, or pick the chat\'s own connection).');
        }
        const messages = [{ role: 'system', content: args.systemPrompt ?? '' }, { role: 'user', content: args.prompt ?? '' }];
        const answer = await service.sendRequest(profileId, messages, args.responseLength ?? 1024);
        return typeof answer === 'string' ? answer : String(answer?.content ?? '');
    };
}

export class JobWorker {
    /**
     * @param {{
     *   claim: () => Promise<any>,                       // POST /v1/jobs/claim
     *   complete: (id: string, text: string, attempt?: number) => Promise<any>,
     *   fail: (id: string, error: string, attempt?: number) => Promise<any>, // the job could not run here
     *   generate: (args: object) => Promise<string>,     // SillyTavern's generateRaw
     *   useSchema?: () => boolean,                       // pass the job's JSON schema to generateRaw
     *   isActive: () => boolean,                         // mode, enable switch, route present
     *   isGenerating: () => boolean,                     // SillyTavern busy with the user's generation
     *   onStop: (error: Error) => void,                  // tell the user (called once per stop)
     *   idleMs?: () => number, pollMs?: () => number, maxPollMs?: () => number,
     *   now?: () => number,
     *   setTimer?: (fn: Function, ms: number) => any, clearTimer?: (t: any) => void,
     * }} deps
     */
    constructor(deps) {
        this.deps = deps;
        this.now = deps.now ?? (() => Date.now());
        this.setTimer = deps.setTimer ?? ((fn, ms) => setTimeout(fn, ms));
        this.clearTimer = deps.clearTimer ?? ((t) => clearTimeout(t));
        this.idleMs = deps.idleMs ?? (() => 5000);
        this.pollMs = deps.pollMs ?? (() => 5000);
        this.maxPollMs = deps.maxPollMs ?? (() => 60000);
        this.timer = null;
        this.running = false;   // a job is in flight
        this.stopped = false;   // stopped after an error, until start() again
        this.lastActivity = -Infinity;
        this.delay = 0;
        this.stats = { done: 0, empty: 0, errors: 0, rejected: 0, lastError: null, lastJob: null, mode: null };
    }

    /** (Re)start polling, e.g. after the mode was switched on or an error was dealt with. */
    start() {
        this.stopped = false;
        this.delay = 0;
        this.schedule(0);
    }

    /** Stop polling (the running job, if any, finishes). */
    stop() {
        this.stopped = true;
        if (this.timer !== null) this.clearTimer(this.timer);
        this.timer = null;
    }

    /** GENERATION_STARTED(type, options, dryRun): a real generation pushes the next job back. */
    generationStarted(_type, _options, dryRun) {
        if (dryRun) return;
        this.lastActivity = this.now();
    }

    /** GENERATION_ENDED / GENERATION_STOPPED: wait `idleMs` from now before the next job. */
    generationEnded() {
        this.lastActivity = this.now();
        if (!this.stopped && !this.running) this.schedule(this.idleMs());
    }

    /** Whether the user's side is quiet enough to run a job now; else ms to wait. */
    waitBeforeJob() {
        if (this.deps.isGenerating()) return this.idleMs();
        const since = this.now() - this.lastActivity;
        return since >= this.idleMs() ? 0 : this.idleMs() - since;
    }

    schedule(ms) {
        if (this.stopped) return;
        if (this.timer !== null) this.clearTimer(this.timer);
        this.timer = this.setTimer(() => {
            this.timer = null;
            this.tick();
        }, Math.max(0, ms));
    }

    backoff() {
        this.delay = this.delay ? Math.min(this.delay * 2, this.maxPollMs()) : this.pollMs();
        return this.delay;
    }

    /** One step: maybe claim and run a job, then schedule the next step. Never throws. */
    async tick() {
        if (this.stopped || this.running) return;
        if (!this.deps.isActive()) return; // start() is called again when the mode is switched on
        const wait = this.waitBeforeJob();
        if (wait > 0) return this.schedule(wait);
        this.running = true;
        let next;
        try {
            next = await this.runOne();
        } catch (error) {
            this.stats.errors += 1;
            this.stats.lastError = error;
            if (error?.isOutage) {
                next = this.backoff();
            } else if (isJobLevel(error)) {
                this.stats.rejected += 1;
                next = 250;
            } else {
                this.stop();
                this.deps.onStop(error);
            }
        } finally {
            this.running = false;
        }
        if (next !== undefined) this.schedule(next);
    }

    /** Claim one job and run it; returns ms until the next step. */
    async runOne() {
        const answer = await this.deps.claim();
        this.stats.mode = answer?.mode ?? null; // not 'client': the sidecar runs its jobs itself
        const job = jobFrom(answer);
        if (!job) {
            this.stats.empty += 1;
            return this.backoff();
        }
        this.stats.lastJob = job.id;
        let text;
        try {
            text = await this.deps.generate(generateRawArgs(job.request, job.kind, this.deps.useSchema?.() ?? true));
        } catch (error) {
            // Hand the job back at once (it is retried later, maybe by the sidecar's own worker).
            await this.deps.fail?.(job.id, error?.message ?? String(error), job.attempt).catch(() => {});
            throw error;
        }
        await this.deps.complete(job.id, String(text ?? ''), job.attempt);
        this.stats.done += 1;
        this.delay = 0;
        return 250; // more may be waiting; the idle check runs again first
    }
}

/**
 * DC6: make the sidecar's own job mode follow the drawer's choice, through PATCH /v1/settings (no
 * restart, this store only). "SillyTavern's connection" sets `llm_mode` to client, remembering the
 * mode it had (`sidecarJobMode`); "the sidecar's own" puts that back (extractive when none was
 * remembered) and leaves any other mode as it is. Returns the sidecar's mode now, or null when it
 * has no run-time settings (an older sidecar: then it is configured where it runs).
 * @param {{getStoreSettings: Function, patchStoreSettings: Function}} client
 * @param {'sidecar'|'sillytavern'} choice
 * @param {{sidecarJobMode?: string}} settings
 * @param {(patch: object) => void} write stores extension settings
 */
export async function followJobMode(client, choice, settings, write) {
    let current;
    try {
        current = (await client.getStoreSettings())?.settings?.llm_mode;
    } catch {
        return null;
    }
    if (!current) return null;
    let wanted = current;
    if (choice === 'sillytavern') {
        if (current !== 'client') write({ sidecarJobMode: current });
        wanted = 'client';
    } else if (current === 'client') {
        wanted = settings.sidecarJobMode && settings.sidecarJobMode !== 'client' ? settings.sidecarJobMode : 'extractive';
    }
    if (wanted !== current) await client.patchStoreSettings({ llm_mode: wanted });
    return wanted;
}

/**
 * Whether this page should run the sidecar's jobs: Chronicler on, the "SillyTavern's connection"
 * mode chosen, and a sidecar with the job routes.
 * @param {{enabled: boolean, llmMode: string}} settings
 * @param {{has: (name: string) => boolean}} features
 */
export function workerWanted(settings, features) {
    return settings.enabled && settings.llmMode === 'sillytavern' && features.has('jobs');
}

/**
 * The page's JobWorker: jobs from the sidecar, run with SillyTavern's generateRaw.
 * @param {{
 *   getClient: () => import('./client.js').SidecarClient,
 *   getContext: () => any,
 *   getSettings: () => import('./settings.js').DEFAULTS,
 *   features: {has: (name: string) => boolean},
 *   isGenerating: () => boolean,
 *   toast: (kind: string, text: string, options?: object) => void,
 * }} deps
 * @returns {JobWorker}
 */
export function pageWorker({ getClient, getContext, getSettings, features, isGenerating, toast }) {
    return new JobWorker({
        claim: () => getClient().claimJob({}),
        complete: (id, text, attempt) => getClient().completeJob(id, text, attempt),
        fail: (id, error, attempt) => getClient().failJob(id, error, { retryable: true, attempt }),
        generate: (args) => {
            const profileId = getSettings().jobProfileId;
            return profileId ? profileGenerate(getContext, profileId)(args) : getContext().generateRaw(args);
        },
        useSchema: () => getSettings().jobJsonSchema,
        isActive: () => workerWanted(getSettings(), features),
        isGenerating,
        onStop: (error) => {
            console.error('[Chronicler] background job failed; the job worker stopped:', error);
            toast('error', `Background jobs stopped: ${error?.message ?? error}. Switch the mode off and on again to retry.`, { timeOut: 0 });
        },
        idleMs: () => getSettings().workerIdleMs,
        pollMs: () => getSettings().workerPollMs,
        maxPollMs: () => getSettings().workerMaxPollMs,
    });
}
