// The server plugin's added latency per request: the same call to the sidecar directly and through
// the plugin's proxy (a plain Node HTTP server standing in for SillyTavern's routing, as in
// tests/st_plugin/harness.js; SillyTavern's own middleware is not included). Real sidecar, started
// by the plugin.   node bench/plugin_proxy.mjs [N]
import { createRequire } from 'node:module';
import { REPO, eventually, fakeRouter, pluginConfig, python, serveRouter } from '../tests/st_plugin/harness.js';

const require = createRequire(import.meta.url);
const N = Number(process.argv[2] ?? 300);
const plugin = require(`${REPO}/st_plugin/index.js`);
const cfg = pluginConfig(python());
const router = fakeRouter();
await plugin.init(router, { env: cfg.env });
const st = await serveRouter(router);
await eventually(() => plugin.plugin.sidecar?.version, 120000);
const { port, token } = plugin.plugin.sidecar;
const direct = () => fetch(`http://127.0.0.1:${port}/v1/memories`, { headers: { Authorization: `Bearer ${token}`, 'X-Chronicler-User': 'alice' } });
const proxied = () => fetch(`${st.url}/v1/memories`, { headers: { 'x-test-session': 'alice' } });
const pct = (xs, p) => xs.slice().sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];
const times = { direct: [], proxied: [] };
for (let i = 0; i < 20; i++) { await (await direct()).text(); await (await proxied()).text(); }
for (let i = 0; i < N; i++) {
    for (const [name, call] of i % 2 ? [['direct', direct], ['proxied', proxied]] : [['proxied', proxied], ['direct', direct]]) {
        const t = performance.now();
        await (await call()).text();
        times[name].push(performance.now() - t);
    }
}
const added = times.proxied.map((t, i) => t - times.direct[i]);
const fmt = xs => `p50 ${pct(xs, 0.5).toFixed(2)} ms, p95 ${pct(xs, 0.95).toFixed(2)} ms`;
console.log(`GET /v1/memories x${N}: direct ${fmt(times.direct)}; through the plugin ${fmt(times.proxied)}; added ${fmt(added)}`);
await plugin.exit();
await st.close();
