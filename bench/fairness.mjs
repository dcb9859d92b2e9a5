// bench/fairness's driver: the experiments of "Fairness in Serving Large
// Language Models" (Sheng et al., OSDI 2024) on one backend of 4 slots,
// admission = "fcfs" and "fair" side by side in one run (issue 43).
//
//   node bench/fairness.mjs [--seconds 8] [--shards 1] [--only demand,weights,idle,priority] [--build DIR]
//
// The backend is mock-vllm's capacity model: 4 requests generate at once
// at 200 tokens/s each, the rest wait first come first served (vLLM's
// scheduler); answers are 32 tokens (160 ms). Under fcfs sluice forwards
// every request and the mock queues them; under fair, sluice runs
// max_inflight_per_backend = 4 and queues the rest itself. Each experiment
// gets a fresh mock and a fresh sluice per mode; clients are closed-loop
// lanes (a lane sends its next request when the last one ends), so a key's
// lanes are its demand. Served tokens are counted by the client from each
// answer's usage, weighted as quota weighs them (prompt x1, completion x2),
// over the window after a warm-up.
//
// Experiments:
//   demand   keys A and B of weight 1 with 24 and 6 lanes (4:1 demand)
//   weights  keys A (weight 2) and B (weight 1), 12 lanes each
//   idle     A 12 lanes throughout; B 12 lanes, idle from 25 % to 60 % of
//            the run: B's lead over A in the second after it returns
//   priority A 24 and B 6 lanes; key I (priority 1) sends one short stream
//            every 0.4 s: its median time to the first content token,
//            against the same key's on an idle backend
// The last line is FAIRNESS_RESULT with every figure.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { parse_args } from './args.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const args = parse_args(process.argv.slice(2), { positional: false });
const build = args.build ?? process.env.SLUICE_BUILD_DIR ?? path.join(root, 'build');
const seconds = Number(args.seconds ?? 8);
const shards = Number(args.shards ?? 1);
const only = (args.only ?? 'demand,weights,idle,priority').split(',');
const warm_s = Math.min(2, seconds / 4);
const slots = 4, tokens_per_sec = 200, reply_tokens = 32;
const keys = {
  A: { id: 'tenant-a', key: 'sk-bench-a' },
  B: { id: 'tenant-b', key: 'sk-bench-b' },
  A2: { id: 'tenant-a2', key: 'sk-bench-a2', weight: 2 },
  I: { id: 'interactive', key: 'sk-bench-i', priority: 1 },
};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (xs) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

function start(name, bin, argv, pattern, cwd) {
  const child = spawn(bin, argv, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start: ${out}`)), 10000);
    const on = (d) => {
      out += d;
      const m = pattern.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ child, match: m });
      }
    };
    child.stdout.on('data', on);
    child.stderr.on('data', on);
    child.on('exit', (code) => reject(new Error(`${name} exited ${code}: ${out}`)));
  });
}

async function stop(p) {
  if (p.child.exitCode !== null) return;
  const done = new Promise((r) => p.child.once('exit', r));
  p.child.kill('SIGTERM');
  await Promise.race([done, sleep(5000).then(() => p.child.kill('SIGKILL'))]);
}

async function stack(mode) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-fairness-'));
  const mock = await start('mock-vllm', path.join(build, 'mock-vllm'),
    ['--port', '0', '--max-running', String(slots), '--tokens-per-sec', String(tokens_per_sec), '--reply-tokens', String(reply_tokens)],
    /listening on (http:\/\/127\.0\.0\.1:\d+)/, dir);
  const mock_url = mock.match[1];
  const toml = [
    '[server]', `cpus = "${Array.from({ length: shards }, (_, i) => i % os.cpus().length).join(',')}"`,
    '[audit]', `path = "${path.join(dir, 'audit.jsonl')}"`,
    '[[group]]', 'name = "g"', 'models = ["*"]', `backends = ["${mock_url}"]`, `admission = "${mode}"`,
    ...(mode === 'fair' ? [`max_inflight_per_backend = ${slots}`] : []),
    ...Object.values(keys).flatMap((k) => ['[[key]]', `id = "${k.id}"`, `key = "${k.key}"`,
      ...(k.weight ? [`weight = ${k.weight}`] : []), ...(k.priority ? [`priority = ${k.priority}`] : [])]),
  ].join('\n') + '\n';
  fs.writeFileSync(path.join(dir, 'sluice.toml'), toml);
  const sluice = await start('sluice', path.join(build, 'sluice'),
    ['--config', path.join(dir, 'sluice.toml'), '--listen', '127.0.0.1:0', '--admin', '127.0.0.1:0'],
    /sluice listening on http:\/\/127\.0\.0\.1:(\d+)/, dir);
  return {
    port: Number(sluice.match[1]),
    async close() {
      await stop(sluice);
      await stop(mock);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

// One request; resolves with its timings and usage (status 0: failed).
function request(agent, port, key, { stream = false, max_tokens = reply_tokens } = {}) {
  const body = JSON.stringify({ model: 'm', max_tokens, stream, ...(stream ? { stream_options: { include_usage: true } } : {}),
    messages: [{ role: 'user', content: 'Summarise the quarterly report.' }] });
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', agent,
      headers: { authorization: `Bearer ${key.key}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
    req.on('error', () => resolve({ status: 0, t0, t1: performance.now() }));
    req.on('response', (res) => {
      let text = '', ttft = -1;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        text += d;
        if (ttft < 0 && stream && /"content":"[^"]/.test(text)) ttft = performance.now() - t0;
      });
      res.on('end', () => {
        let prompt = 0, completion = 0;
        const m = /"prompt_tokens":(\d+).*?"completion_tokens":(\d+)/s.exec(text.slice(text.lastIndexOf('"usage"')));
        if (m) [prompt, completion] = [Number(m[1]), Number(m[2])];
        resolve({ status: res.statusCode, t0, t1: performance.now(), ttft, prompt, completion });
      });
    });
    req.end(body);
  });
}

// Closed-loop lanes of `key` while `active(t)` (t in s since `start`);
// every answer is recorded with its key name.
function lanes(port, name, count, start, end_ms, records, active = () => true) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: count });
  const lane = async () => {
    for (;;) {
      const now = performance.now();
      if (now >= end_ms) break;
      if (!active((now - start) / 1000)) {
        await sleep(20);
        continue;
      }
      const r = await request(agent, port, keys[name]);
      records.push({ name, ...r });
    }
  };
  return Promise.all(Array.from({ length: count }, lane)).finally(() => agent.destroy());
}

// Weighted tokens per key among answers that ended in [from, to) s.
function served(records, start, from, to) {
  const out = {};
  for (const r of records) {
    const t = (r.t1 - start) / 1000;
    if (r.status !== 200 || t < from || t >= to) continue;
    out[r.name] = (out[r.name] ?? 0) + r.prompt + 2 * r.completion;
  }
  return out;
}

async function experiment(mode, kind) {
  const s = await stack(mode);
  try {
    const records = [];
    const start = performance.now();
    const end = start + seconds * 1000;
    const runs = [];
    const result = {};
    if (kind === 'demand') {
      runs.push(lanes(s.port, 'A', 24, start, end, records), lanes(s.port, 'B', 6, start, end, records));
    } else if (kind === 'weights') {
      runs.push(lanes(s.port, 'A2', 12, start, end, records), lanes(s.port, 'B', 12, start, end, records));
    } else if (kind === 'idle') {
      const off = seconds * 0.25, on = seconds * 0.6;
      result.back_at = on;
      runs.push(lanes(s.port, 'A', 12, start, end, records),
        lanes(s.port, 'B', 12, start, end, records, (t) => t < off || t >= on));
    } else if (kind === 'priority') {
      // Unloaded first: the interactive key alone.
      const agent = new http.Agent({ keepAlive: true });
      const alone = [];
      for (let i = 0; i < 5; ++i) alone.push((await request(agent, s.port, keys.I, { stream: true, max_tokens: 8 })).ttft);
      result.ttft_unloaded_ms = median(alone);
      const loaded_start = performance.now();
      const loaded_end = loaded_start + seconds * 1000;
      runs.push(lanes(s.port, 'A', 24, loaded_start, loaded_end, records), lanes(s.port, 'B', 6, loaded_start, loaded_end, records));
      const ttfts = [];
      const probes = [];
      await sleep(warm_s * 1000);
      while (performance.now() < loaded_end - 1000) {
        probes.push(request(agent, s.port, keys.I, { stream: true, max_tokens: 8 }).then((r) => { if (r.status === 200) ttfts.push(r.ttft); }));
        await sleep(400);
      }
      await Promise.all(probes);
      agent.destroy();
      result.ttft_loaded_ms = median(ttfts);
      result.ttft_samples = ttfts.length;
    }
    await Promise.all(runs);
    const window = served(records, start, warm_s, seconds);
    result.tokens = window;
    result.tokens_per_s = Object.values(window).reduce((a, b) => a + b, 0) / (seconds - warm_s);
    result.errors = records.filter((r) => r.status !== 200).length;
    result.answers = records.length;
    if (kind === 'idle') {
      const back = served(records, start, result.back_at, result.back_at + 1);
      result.after_return = back;
      result.lead = (back.B ?? 0) - (back.A ?? 0);
    }
    return result;
  } finally {
    await s.close();
  }
}

const ratio = (t, a, b) => (t[b] ? (t[a] ?? 0) / t[b] : NaN);
const f2 = (x) => (Number.isFinite(x) ? x.toFixed(2) : 'n/a');
const f0 = (x) => (Number.isFinite(x) ? x.toFixed(0) : 'n/a');
const rows = [];
const result = {};
for (const kind of ['demand', 'weights', 'idle', 'priority']) {
  if (!only.includes(kind)) continue;
  for (const mode of ['fcfs', 'fair']) {
    const r = await experiment(mode, kind);
    result[`${kind}_${mode}`] = r;
    process.stderr.write(`${kind} ${mode}: ${JSON.stringify(r)}\n`);
  }
}
// One request's weighted cost: the bound on a returning key's lead is one
// such request per slot (a key lifted to the lowest active counter can be
// ahead by what its released requests cost before the counters catch up).
const cost = 2 * reply_tokens + 8;  // one request: ~8 prompt tokens and its answer x2
const none = { tokens: {}, tokens_per_s: NaN, errors: 0, lead: NaN };
for (const kind of ['demand', 'weights', 'idle', 'priority']) {
  for (const mode of ['fcfs', 'fair']) result[`${kind}_${mode}`] ??= none;
}
rows.push(['A:B served, demand 4:1 (weights 1:1)', f2(ratio(result.demand_fcfs.tokens, 'A', 'B')), f2(ratio(result.demand_fair.tokens, 'A', 'B')), '1.00 ± 10 %']);
rows.push(['A:B served, weights 2:1 (demand 1:1)', f2(ratio(result.weights_fcfs.tokens, 'A2', 'B')), f2(ratio(result.weights_fair.tokens, 'A2', 'B')), '2.00 ± 10 %']);
rows.push(['returning key\'s lead in its first second (weighted tokens)', f0(result.idle_fcfs.lead), f0(result.idle_fair.lead), `≤ ${slots * cost} (${slots} slots × one request)`]);
rows.push(['interactive TTFT, unloaded (ms)', f0(result.priority_fcfs.ttft_unloaded_ms), f0(result.priority_fair.ttft_unloaded_ms), '']);
const release_ms = 1000 * reply_tokens / tokens_per_sec / slots;
rows.push(['interactive TTFT, saturated, median (ms)', f0(result.priority_fcfs.ttft_loaded_ms), f0(result.priority_fair.ttft_loaded_ms),
  `≤ unloaded + ${f0(release_ms)} (one slot release)`]);
rows.push(['weighted tokens served per second (demand)', f0(result.demand_fcfs.tokens_per_s), f0(result.demand_fair.tokens_per_s),
  `fair ÷ fcfs = ${f2(result.demand_fair.tokens_per_s / result.demand_fcfs.tokens_per_s)} (≥ 0.95)`]);
console.log(`\nbench/fairness: one backend of ${slots} slots (mock-vllm --max-running ${slots}), ${reply_tokens}-token answers at ${tokens_per_sec} tokens/s, ${shards} shard(s), ${seconds} s per run (first ${warm_s} s not counted)\n`);
console.log('| figure | fcfs | fair | goal |');
console.log('|---|---:|---:|---|');
for (const r of rows) console.log(`| ${r.join(' | ')} |`);
const errors = Object.values(result).reduce((a, r) => a + r.errors, 0);
console.log(`\nFAIRNESS_RESULT demand_fcfs=${f2(ratio(result.demand_fcfs.tokens, 'A', 'B'))} demand_fair=${f2(ratio(result.demand_fair.tokens, 'A', 'B'))} ` +
  `weights_fcfs=${f2(ratio(result.weights_fcfs.tokens, 'A2', 'B'))} weights_fair=${f2(ratio(result.weights_fair.tokens, 'A2', 'B'))} ` +
  `lead_fcfs=${f0(result.idle_fcfs.lead)} lead_fair=${f0(result.idle_fair.lead)} ` +
  `ttft_unloaded_ms=${f0(result.priority_fair.ttft_unloaded_ms)} ttft_fcfs_ms=${f0(result.priority_fcfs.ttft_loaded_ms)} ttft_fair_ms=${f0(result.priority_fair.ttft_loaded_ms)} ` +
  `busy=${f2(result.demand_fair.tokens_per_s / result.demand_fcfs.tokens_per_s)} errors=${errors}`);
