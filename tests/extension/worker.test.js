// The client LLM worker (extension/src/worker.js): idle detection, back-off, the generateRaw
// arguments, and stopping with one notice. Time is a manual clock; timers run when the test says.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { SidecarError } from '../../extension/src/client.js';
import { DEFAULTS } from '../../extension/src/settings.js';
import { JobWorker, connectionProfiles, followJobMode, generateRawArgs, isJobLevel, jobFrom, pageWorker, profileGenerate, schemaName, workerWanted } from '../../extension/src/worker.js';
import { FakeSidecar, outage } from './fake_sidecar.js';

/** Manual time: `advance(ms)` runs due timers in order and awaits what they started. */
function clock() {
    let now = 0;
    let timers = [];
    let seq = 0;
    return {
        now: () => now,
        setTimer: (fn, ms) => { const t = { at: now + ms, fn, id: ++seq }; timers.push(t); return t; },
        clearTimer: (t) => { timers = timers.filter(x => x !== t); },
        pending: () => timers.map(t => t.at - now),
        async advance(ms) {
            const until = now + ms;
            for (;;) {
                timers.sort((a, b) => a.at - b.at || a.id - b.id);
                const next = timers[0];
                if (!next || next.at > until) break;
                timers.shift();
                now = next.at;
                await next.fn();
                await new Promise(resolve => setImmediate(resolve));
            }
            now = until;
        },
    };
}

function setup({ generating = false, active = true, generate, failJob } = {}) {
    const time = clock();
    const sidecar = new FakeSidecar();
    const generated = [];
    const stops = [];
    const state = { generating, active };
    const worker = new JobWorker({
        claim: () => sidecar.claimJob({}),
        complete: (id, text, attempt) => sidecar.completeJob(id, text, attempt),
        fail: failJob,
        generate: generate ?? (async (args) => { generated.push(args); return `summary of ${args.prompt}`; }),
        isActive: () => state.active,
        isGenerating: () => state.generating,
        onStop: (error) => stops.push(error),
        idleMs: () => 1000, pollMs: () => 2000, maxPollMs: () => 8000,
        now: time.now, setTimer: time.setTimer, clearTimer: time.clearTimer,
    });
    return { time, sidecar, generated, stops, state, worker };
}

const JOB = (id, prompt = 'the chunk') => ({
    id, kind: 'summary', attempt: 1, lease_until: '2030-01-01T00:00:00Z',
    request: { systemPrompt: 'You summarise.', prompt, responseLength: 300, jsonSchema: null },
});

test('dc2: a claimed job runs through generateRaw and its text is completed on the sidecar', async () => {
    const s = setup();
    s.sidecar.jobs.push(JOB('j1'));
    s.worker.start();
    await s.time.advance(0);
    assert.deepEqual(s.generated, [{ systemPrompt: 'You summarise.', prompt: 'the chunk', responseLength: 300 }]);
    assert.deepEqual(s.sidecar.completed, [{ id: 'j1', text: 'summary of the chunk', attempt: 1 }]);
    assert.equal(s.worker.stats.mode, 'client');
    assert.equal(s.worker.stats.done, 1);
});

test('dc2: never during the user\'s own generation — a job waits until SillyTavern is idle for idleMs', async () => {
    const s = setup({ generating: true });
    s.sidecar.jobs.push(JOB('j1'));
    s.worker.start();
    await s.time.advance(5000);
    assert.deepEqual(s.sidecar.names(), [], 'nothing claimed while generating');
    s.state.generating = false;
    s.worker.generationEnded();
    await s.time.advance(999);
    assert.deepEqual(s.sidecar.names(), [], 'still inside the quiet time after the generation');
    await s.time.advance(1);
    assert.deepEqual(s.sidecar.names(), ['claimJob', 'completeJob']);
});

test('dc2: dry runs (token counting) do not count as the user generating', async () => {
    const s = setup();
    s.sidecar.jobs.push(JOB('j1'));
    s.worker.generationStarted('normal', {}, true);
    s.worker.start();
    await s.time.advance(0);
    assert.equal(s.sidecar.completed.length, 1);
    s.worker.generationStarted('normal', {}, false);
    s.sidecar.jobs.push(JOB('j2'));
    await s.time.advance(500);
    assert.equal(s.sidecar.completed.length, 1, 'a real generation started: wait');
});

test('dc2: with no job waiting the worker asks again later, doubling the wait up to the maximum', async () => {
    const s = setup();
    s.worker.start();
    await s.time.advance(0);
    const claimsAt = [];
    let seen = 1;
    for (let t = 0; t < 40000; t += 500) {
        await s.time.advance(500);
        const n = s.sidecar.names().filter(x => x === 'claimJob').length;
        if (n > seen) claimsAt.push(s.time.now());
        seen = n;
    }
    // Waits of 2 s, 4 s, 8 s, then 8 s again (the maximum).
    assert.deepEqual(claimsAt.slice(0, 5), [2000, 6000, 14000, 22000, 30000]);
});

test('dc2: a job found resets the back-off and the next claim follows soon', async () => {
    const s = setup();
    s.worker.start();
    await s.time.advance(0);
    await s.time.advance(2000 + 4000); // two empty polls: the wait is now 8 s
    s.sidecar.jobs.push(JOB('j1'), JOB('j2'));
    await s.time.advance(8000);
    assert.equal(s.sidecar.completed.length, 1);
    await s.time.advance(250);
    assert.equal(s.sidecar.completed.length, 2, 'the second job follows after 250 ms');
    const claims = () => s.sidecar.names().filter(x => x === 'claimJob').length;
    await s.time.advance(250);
    assert.equal(claims(), 6, 'one more look finds nothing');
    await s.time.advance(1999);
    assert.equal(claims(), 6);
    await s.time.advance(1);
    assert.equal(claims(), 7, 'then polling starts again at 2 s');
});

test('dc2: the sidecar unreachable means back off quietly, not stop', async () => {
    const s = setup();
    s.sidecar.failNext = outage();
    s.worker.start();
    await s.time.advance(0);
    assert.deepEqual(s.stops, []);
    s.sidecar.jobs.push(JOB('j1'));
    await s.time.advance(2000);
    assert.equal(s.sidecar.completed.length, 1);
});

test('dc2: a failing model call hands the job back, then stops the worker with exactly one notice', async () => {
    const failed = [];
    const s = setup({
        generate: async () => { throw new Error('401 from the model'); },
        failJob: async (...args) => { failed.push(args); },
    });
    s.sidecar.jobs.push(JOB('j1'), JOB('j2'));
    s.worker.start();
    await s.time.advance(60000);
    assert.equal(s.stops.length, 1);
    assert.match(s.stops[0].message, /401 from the model/);
    assert.deepEqual(s.sidecar.names(), ['claimJob'], 'no further claims after the stop');
    assert.deepEqual(failed, [['j1', '401 from the model', 1]]);
    assert.deepEqual(s.time.pending(), []);
    s.worker.start(); // the user switched it on again
    await s.time.advance(0);
    assert.equal(s.sidecar.names().filter(x => x === 'claimJob').length, 2);
});

test('dc2: an inactive worker (mode off, or no job route) claims nothing', async () => {
    const s = setup({ active: false });
    s.sidecar.jobs.push(JOB('j1'));
    s.worker.start();
    await s.time.advance(30000);
    assert.deepEqual(s.sidecar.names(), []);
});

test('dc2: generateRaw gets literal text (macros neutralised) and SillyTavern\'s jsonSchema wrapper', () => {
    const schema = { type: 'object', properties: { summary: { type: 'string' } }, required: ['summary'] };
    const args = generateRawArgs({ systemPrompt: 'Sys {{char}}', prompt: 'User said {{user}} <USER>', responseLength: 120, jsonSchema: schema }, 'summary/recent');
    assert.equal(args.prompt.includes('{{'), false);
    assert.equal(args.prompt.replace(/\u2060/g, ''), 'User said {{user}} <USER>');
    assert.equal(args.systemPrompt.replace(/\u2060/g, ''), 'Sys {{char}}');
    assert.equal(args.responseLength, 120);
    assert.deepEqual(args.jsonSchema, { name: 'chronicler_summary_recent', value: schema, strict: false, returnInvalid: true });
    // The sidecar's own shape ({name, strict, value}: Prompt.for_client in jobs/tasks/base.py) is kept, name made safe.
    const wrapped = generateRawArgs({ prompt: 'p', jsonSchema: { name: 'session summary', value: schema, strict: true } });
    assert.deepEqual(wrapped.jsonSchema, { name: 'chronicler_session_summary', value: schema, strict: true, returnInvalid: true });
    assert.equal('jsonSchema' in generateRawArgs({ prompt: 'p', jsonSchema: { name: 'x', strict: false, value: {} } }), false, 'never an empty schema');
    assert.equal('jsonSchema' in generateRawArgs({ prompt: 'p', jsonSchema: schema }, 'k', false), false, 'switched off');
    assert.deepEqual(generateRawArgs({ prompt: 'p', responseLength: 0, jsonSchema: null }), { systemPrompt: '', prompt: 'p' });
    assert.equal(schemaName('x'.repeat(100)).length, 64);
});

test('dc2: a claim answer without a job is no job', () => {
    assert.equal(jobFrom({ job: null }), null);
    assert.equal(jobFrom({}), null);
    assert.equal(jobFrom({ job: { id: 'j' } }).id, 'j');
});

test('dc2: a malformed answer the sidecar refused (422) or a job that moved on (409) does not stop the worker', async () => {
    const s = setup();
    s.sidecar.jobs.push(JOB('j1'), JOB('j2'));
    const complete = s.sidecar.completeJob.bind(s.sidecar);
    let first = true;
    s.sidecar.completeJob = async (...args) => {
        if (first) {
            first = false;
            throw new SidecarError({ status: 422, code: 'model_output_invalid', message: 'not JSON' });
        }
        return complete(...args);
    };
    s.worker.start();
    await s.time.advance(1000);
    assert.deepEqual(s.stops, []);
    assert.equal(s.worker.stats.rejected, 1);
    assert.deepEqual(s.sidecar.completed.map(c => c.id), ['j2']);
    assert.equal(isJobLevel(new SidecarError({ status: 409, code: 'job_not_running', message: '' })), true);
    assert.equal(isJobLevel(new SidecarError({ status: 401, code: 'unauthorized', message: '' })), false);
});

test('dc2: the page runs jobs only when on, in SillyTavern\'s-connection mode, and the sidecar has the job routes', () => {
    const jobs = { has: (name) => name === 'jobs' };
    const none = { has: () => false };
    assert.equal(workerWanted({ enabled: true, llmMode: 'sillytavern' }, jobs), true);
    assert.equal(workerWanted({ enabled: false, llmMode: 'sillytavern' }, jobs), false);
    assert.equal(workerWanted({ enabled: true, llmMode: 'sidecar' }, jobs), false);
    assert.equal(workerWanted({ enabled: true, llmMode: 'sillytavern' }, none), false);
});

test('dc2: the page\'s worker claims from the sidecar, generates with generateRaw and reads its limits from the settings', async () => {
    const sidecar = new FakeSidecar();
    sidecar.failJob = async (...args) => { sidecar.calls.push(['failJob', ...args]); return {}; };
    sidecar.jobs.push(JOB('j1'), JOB('j2', 'breaks'));
    const settings = { ...DEFAULTS, enabled: true, llmMode: 'sillytavern', workerIdleMs: 7, jobJsonSchema: true };
    const toasts = [];
    const worker = pageWorker({
        getClient: () => sidecar,
        getContext: () => ({ generateRaw: async (args) => { if (args.prompt === 'breaks') throw new Error('model down'); return `done: ${args.prompt}`; } }),
        getSettings: () => settings,
        features: { has: () => true },
        isGenerating: () => false,
        toast: (...args) => toasts.push(args),
    });
    assert.equal(worker.deps.isActive(), true);
    assert.equal(worker.idleMs(), 7);
    assert.equal(worker.deps.useSchema(), true);
    assert.equal(await worker.runOne(), 250);
    assert.deepEqual(sidecar.completed, [{ id: 'j1', text: 'done: the chunk', attempt: 1 }]);
    await assert.rejects(worker.runOne(), /model down/);
    assert.deepEqual(sidecar.calls.at(-1), ['failJob', 'j2', 'model down', { retryable: true, attempt: 1 }], 'the job is handed back');
    const error = console.error;
    console.error = () => {};
    try {
        worker.deps.onStop(new Error('model down'));
    } finally {
        console.error = error;
    }
    assert.equal(toasts.length, 1);
    assert.deepEqual([toasts[0][0], toasts[0][2]], ['error', { timeOut: 0 }], 'it stays until read');
    assert.match(toasts[0][1], /Background jobs stopped: model down/);
});


test('mj1: a Connection Manager profile runs background jobs (a cheaper model than the chat\'s)', async () => {
    const sent = [];
    const context = {
        extensionSettings: { connectionManager: { profiles: [{ id: 'p1', name: 'Cheap local' }, { id: '' }] } },
        ConnectionManagerRequestService: {
            sendRequest: async (...args) => { sent.push(args); return { content: '{"summary": "ok"}', reasoning: 'hm' }; },
        },
    };
    assert.deepEqual(connectionProfiles(context), { available: true, profiles: [{ id: 'p1', name: 'Cheap local' }], reason: '' });
    const text = await profileGenerate(() => context, 'p1')({ systemPrompt: 'S', prompt: 'U', responseLength: 300 });
    assert.equal(text, '{"summary": "ok"}');
    assert.deepEqual(sent, [['p1', [{ role: 'system', content: 'S' }, { role: 'user', content: 'U' }], 300]]);
    const off = connectionProfiles({ extensionSettings: {} });
    assert.equal(off.available, false);
    assert.match(off.reason, /Connection Manager is off/);
    await assert.rejects(profileGenerate(() => ({}), 'p1')({ prompt: 'U' }), /Connection Manager is off/);
});

test('mj1: the page worker uses the chosen profile, else generateRaw', async () => {
    const calls = [];
    const context = {
        generateRaw: async () => { calls.push('raw'); return 'raw'; },
        ConnectionManagerRequestService: { sendRequest: async (id) => { calls.push(id); return { content: 'cm' }; } },
    };
    let settings = { ...DEFAULTS, enabled: true, llmMode: 'sillytavern', jobProfileId: 'p9' };
    const w = pageWorker({ getClient: () => ({}), getContext: () => context, getSettings: () => settings,
        features: { has: () => true }, isGenerating: () => false, toast: () => {} });
    assert.equal(await w.deps.generate({ prompt: 'x' }), 'cm');
    settings = { ...settings, jobProfileId: '' };
    assert.equal(await w.deps.generate({ prompt: 'x' }), 'raw');
    assert.deepEqual(calls, ['p9', 'raw']);
});

test('dc6: the sidecar\'s job mode follows the drawer\'s choice through PATCH /v1/settings, and comes back', async () => {
    let mode = 'openai';
    const patches = [];
    const client = {
        getStoreSettings: async () => ({ settings: { llm_mode: mode } }),
        patchStoreSettings: async (patch) => { patches.push(patch); mode = patch.llm_mode; return { settings: { llm_mode: mode } }; },
    };
    const stored = {};
    const write = (patch) => Object.assign(stored, patch);
    assert.equal(await followJobMode(client, 'sillytavern', stored, write), 'client');
    assert.deepEqual(stored, { sidecarJobMode: 'openai' });
    assert.equal(await followJobMode(client, 'sillytavern', stored, write), 'client');  // already: no second PATCH
    assert.equal(await followJobMode(client, 'sidecar', stored, write), 'openai');      // the remembered mode back
    assert.deepEqual(patches, [{ llm_mode: 'client' }, { llm_mode: 'openai' }]);
    assert.equal(await followJobMode(client, 'sidecar', stored, write), 'openai');      // nothing to change
    mode = 'client';
    assert.equal(await followJobMode(client, 'sidecar', {}, write), 'extractive');      // none remembered
    const old = { getStoreSettings: async () => { throw new Error('404'); }, patchStoreSettings: async () => assert.fail('no PATCH') };
    assert.equal(await followJobMode(old, 'sillytavern', {}, write), null);           // an older sidecar: nothing
});
