// A small OpenAI-compatible server (`POST /v1/chat/completions`, streamed or not; `GET /v1/models`)
// over node-llama-cpp's prebuilt llama.cpp, for bench/real_model.py on machines where
// llama-cpp-python has no wheel and its build from source takes hours. Bench only: never a
// dependency of the product. One completion at a time (one context sequence, like a one-slot
// local server); a client that goes away stops its generation.
//
//   npm install --prefix DIR node-llama-cpp@3.22.1
//   node bench/llama_server.mjs --modules DIR --model X.gguf --port 8080 [--ctx 8192] [--threads 2] [--log FILE]
//
// `--log FILE` appends one JSON line per completion (the messages asked, the answer, its finish,
// usage and seconds), to see what a real model made of each prompt.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const args = Object.fromEntries(process.argv.slice(2).reduce((pairs, arg, i, all) =>
    (arg.startsWith('--') ? [...pairs, [arg.slice(2), all[i + 1]]] : pairs), []));
const entry = path.join(args.modules, 'node_modules', 'node-llama-cpp', 'dist', 'index.js');
const { getLlama, LlamaChatSession } = await import(pathToFileURL(entry).href);
const llama = await getLlama({ gpu: false, build: 'never' });
const model = await llama.loadModel({ modelPath: args.model });
const context = await model.createContext({ contextSize: Number(args.ctx ?? 8192), threads: Number(args.threads ?? 2) });
const sequence = context.getSequence();
const jsonGrammar = await llama.getGrammarFor('json');
const name = path.basename(args.model);
let queue = Promise.resolve();

/** OpenAI messages -> node-llama-cpp chat history (all but the last user message) and that message. */
function split(messages) {
    const history = [];
    for (const m of messages.slice(0, -1)) {
        const text = typeof m.content === 'string' ? m.content : JSON.stringify(m.content);
        if (m.role === 'system') history.push({ type: 'system', text });
        else if (m.role === 'assistant') history.push({ type: 'model', response: [text] });
        else history.push({ type: 'user', text });
    }
    const last = messages[messages.length - 1] ?? { content: '' };
    return { history, prompt: typeof last.content === 'string' ? last.content : JSON.stringify(last.content) };
}

async function grammarFor(format) {
    if (format?.type === 'json_schema' && format.json_schema?.schema) {
        try {
            return await llama.createGrammarForJsonSchema(format.json_schema.schema);
        } catch {
            return jsonGrammar;  // a schema the grammar builder does not take: plain JSON then
        }
    }
    return format?.type === 'json_object' ? jsonGrammar : undefined;
}

async function complete(body, onText, signal) {
    const { history, prompt } = split(body.messages ?? []);
    const session = new LlamaChatSession({ contextSequence: sequence, autoDisposeSequence: false });
    try {
        session.setChatHistory(history);
        let finish = 'stop';
        const text = await session.prompt(prompt, {
            maxTokens: body.max_tokens ?? 512, temperature: body.temperature ?? 0,
            grammar: await grammarFor(body.response_format), signal, stopOnAbortSignal: true,
            // OpenAI's frequency_penalty (the sidecar asks for it on a retry after a loop).
            ...(body.frequency_penalty ? { repeatPenalty: { frequencyPenalty: body.frequency_penalty,
                presencePenalty: body.presence_penalty ?? 0 } } : {}),
            onTextChunk: onText,
            onResponseChunk: () => {},
        }).catch((error) => { if (signal.aborted) { finish = 'abort'; return ''; } throw error; });
        const completion = model.tokenize(text).length;
        if (completion >= (body.max_tokens ?? 512)) finish = 'length';
        const promptTokens = model.tokenize((body.messages ?? []).map((m) => String(m.content ?? '')).join('\n')).length;
        return { text, finish, usage: { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion } };
    } finally {
        session.dispose({ disposeSequence: false });
        await sequence.clearHistory();
    }
}

/** One line of `--log`: what was asked and what the model answered. */
function record(body, out, started) {
    if (!args.log) return;
    const line = { at: new Date().toISOString(), seconds: (Date.now() - started) / 1000, messages: body.messages,
        max_tokens: body.max_tokens, response_format: body.response_format?.type, answer: out.text, finish: out.finish, usage: out.usage };
    fs.appendFileSync(args.log, JSON.stringify(line) + '\n');
}

function send(res, status, value) {
    res.writeHead(status, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify(value));
}

http.createServer((req, res) => {
    if (req.method === 'GET' && req.url.startsWith('/v1/models')) return send(res, 200, { object: 'list', data: [{ id: name, object: 'model' }] });
    if (req.method !== 'POST' || !req.url.startsWith('/v1/chat/completions')) return send(res, 404, { error: { message: 'not found' } });
    let raw = '';
    req.on('data', (chunk) => { raw += chunk; });
    req.on('end', () => {
        const abort = new AbortController();
        res.on('close', () => { if (!res.writableFinished) abort.abort(); });
        queue = queue.then(async () => {
            if (abort.signal.aborted) return;
            const body = JSON.parse(raw || '{}');
            const started = Date.now();
            const base = { id: `chatcmpl-${Date.now()}`, model: name, created: Math.floor(Date.now() / 1000) };
            try {
                if (!body.stream) {
                    const out = await complete(body, undefined, abort.signal);
                    record(body, out, started);
                    return send(res, 200, { ...base, object: 'chat.completion', usage: out.usage,
                        choices: [{ index: 0, message: { role: 'assistant', content: out.text }, finish_reason: out.finish }] });
                }
                res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
                const chunk = (delta, finish = null, extra = {}) => res.write(`data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', ...extra,
                    choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`);
                const out = await complete(body, (text) => chunk({ content: text }), abort.signal);
                record(body, out, started);
                chunk({}, out.finish, { usage: out.usage });
                res.end('data: [DONE]\n\n');
            } catch (error) {
                if (!res.headersSent) send(res, 500, { error: { message: String(error?.message ?? error) } });
                else res.end();
            }
        });
    });
}).listen(Number(args.port), '127.0.0.1', () => console.log(`listening on 127.0.0.1:${args.port} with ${name}`));
