// bench/compare's client for workload (c), token trickle: S concurrent SSE
// streams, each one request after another on its own keep-alive connection,
// so that S streams stay open all the time; mock-vllm paces the tokens
// (--tokens-per-sec). Counts the SSE events delivered in a measured window
// on the client side, and reads the CPU time the proxy's processes used over
// the same window from /proc.
//
//   node bench/trickle.mjs --url http://127.0.0.1:PORT/v1/chat/completions
//        --streams 256 --max-tokens 300 --expect-events 303
//        --ramp-ms 3000 --warmup-ms 4000 --seconds 6
//        [--pids P1,P2] [--cpu 1] [--key test-key]
//
// Stream i sends its first request at i × ramp / S, so that requests (and
// the ends of replies) spread evenly instead of arriving in bursts. The
// window starts warmup ms after the first request. An event is one
// "data: " line of the decoded body ([DONE] included); a reply that does
// not hold exactly --expect-events of them, or does not end in
// "data: [DONE]", counts as bad. The last line is
//   TRICKLE_RESULT events=.. window_us=.. events_per_s=.. responses=..
//     bad=.. errors=.. open_min=.. proxy_ns=.. cpu_ticks=..
//     gap_p50_us=.. gap_p99_us=.. proxy_user_ticks=.. proxy_sys_ticks=..
// proxy_ns: CPU time of --pids' threads over the window (ns, schedstat);
// proxy_user_ticks, proxy_sys_ticks: the same split into user and kernel
// time (/proc/PID/task/TID/stat utime, stime: clock ticks, coarser);
// cpu_ticks: busy ticks of CPU --cpu over the window (-1 without --cpu);
// open_min: the fewest streams with a reply in progress, sampled every 20 ms
// in the window; gap_*: time between two reads of one stream that brought
// events (the pacing the client sees; 10 ms at 100 tokens/s).
import fs from 'node:fs';
import http from 'node:http';
import { parse_args } from './args.mjs';
import { chat_body } from './chat-body.mjs';

const args = parse_args(process.argv.slice(2), { positional: false });
const url = new URL(args.url);
const streams = Number(args.streams ?? 256);
const max_tokens = Number(args['max-tokens'] ?? 300);
const expect_events = Number(args['expect-events'] ?? max_tokens + 3);
const ramp_ms = Number(args['ramp-ms'] ?? 3000);
const warmup_ms = Number(args['warmup-ms'] ?? ramp_ms + 1000);
const window_ms = Number(args.seconds ?? 6) * 1000;
const pids = (args.pids ?? '').split(',').filter(Boolean).map(Number);
const cpu = args.cpu ?? '';
const key = args.key ?? 'test-key';

// --- /proc --------------------------------------------------------------------

// CPU time of --pids' threads in ns (schedstat's first field: ns where
// /proc/PID/stat counts 10 ms ticks). Threads that exited are not counted.
function proc_ns() {
  let sum = 0;
  for (const pid of pids) {
    let tasks;
    try { tasks = fs.readdirSync(`/proc/${pid}/task`); } catch { continue; }
    for (const tid of tasks) {
      try { sum += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'latin1').split(' ')[0]); } catch { /* gone */ }
    }
  }
  return sum;
}

// [utime, stime] of --pids' threads in clock ticks (stat fields 14 and 15).
function proc_ticks() {
  const sum = [0, 0];
  for (const pid of pids) {
    let tasks;
    try { tasks = fs.readdirSync(`/proc/${pid}/task`); } catch { continue; }
    for (const tid of tasks) {
      let stat;
      try { stat = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'latin1'); } catch { continue; }
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');   // f[0] is field 3 (state)
      sum[0] += Number(f[11]);
      sum[1] += Number(f[12]);
    }
  }
  return sum;
}

function cpu_busy_ticks() {
  if (cpu === '') return 0;
  const line = fs.readFileSync('/proc/stat', 'latin1').split('\n').find((l) => l.startsWith(`cpu${cpu} `));
  const f = line.trim().split(/\s+/).map(Number);
  return f[1] + f[2] + f[3] + f[6] + f[7];   // user nice system irq softirq
}

// --- the streams --------------------------------------------------------------

const body = chat_body({ stream: true, max_tokens });
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
const t0 = performance.now();

let events = 0;          // all events seen
let responses = 0;       // replies completed in the window
let bad = 0;             // replies in the window with the wrong events or ending
let errors = 0;          // failed requests (connection errors, non-200)
let open = 0;            // streams with a reply in progress
let in_window = false;
let stopping = false;
// gaps between reads that brought events, 100 µs buckets up to 1 s
const gap_buckets = new Uint32Array(10001);

function count_events(text) {
  let n = 0;
  for (let at = text.indexOf('data: '); at >= 0; at = text.indexOf('data: ', at + 6)) ++n;
  return n;
}

function stream_once(slot) {
  if (stopping) return;
  const req = http.request(url, {
    method: 'POST',
    agent,
    headers: {
      'Authorization': `Bearer ${key}`,
      'Content-Type': 'application/json',
      'Accept': 'application/json',
      'Content-Length': Buffer.byteLength(body),
    },
  });
  let settled = false;
  const retry = () => {
    if (settled) return;
    settled = true;
    if (in_window) ++errors;
    setTimeout(() => stream_once(slot), 100);
  };
  req.on('error', retry);
  req.on('response', (res) => {
    if (res.statusCode !== 200) {
      res.resume();
      res.on('end', retry);
      res.on('error', retry);
      return;
    }
    ++open;
    // carry: the last 5 characters, so that a "data: " cut between two
    // reads is counted once; tail: the end of the body, for the [DONE] check.
    let carry = '';
    let tail = '';
    let seen = 0;
    let last_read = 0;
    res.on('data', (chunk) => {
      const s = carry + chunk.toString('latin1');
      const n = count_events(s);
      carry = s.slice(-5);
      tail = (tail + s).slice(-32);
      if (n === 0) return;
      seen += n;
      events += n;
      const now = performance.now();
      if (in_window && last_read !== 0) {
        gap_buckets[Math.min(10000, Math.floor((now - last_read) * 10))]++;
      }
      last_read = now;
    });
    res.on('error', () => { --open; retry(); });
    res.on('end', () => {
      --open;
      if (settled) return;
      settled = true;
      if (in_window) {
        ++responses;
        if (seen !== expect_events || !tail.endsWith('data: [DONE]\n\n')) ++bad;
      }
      stream_once(slot);
    });
  });
  req.end(body);
}

function gap_percentile(p) {
  let total = 0;
  for (const c of gap_buckets) total += c;
  if (total === 0) return -1;
  let at = Math.ceil(total * p / 100);
  for (let i = 0; i < gap_buckets.length; ++i) {
    at -= gap_buckets[i];
    if (at <= 0) return Math.round((i + 0.5) * 100);
  }
  return -1;
}

for (let i = 0; i < streams; ++i) setTimeout(() => stream_once(i), (i * ramp_ms) / streams);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
await sleep(Math.max(0, warmup_ms - (performance.now() - t0)));

in_window = true;
const start = { at: performance.now(), events, proxy: proc_ns(), ticks: proc_ticks(), cpu: cpu_busy_ticks() };
let open_min = open;
const sampler = setInterval(() => { open_min = Math.min(open_min, open); }, 20);
await sleep(window_ms);
const end = { at: performance.now(), events, proxy: proc_ns(), ticks: proc_ticks(), cpu: cpu_busy_ticks() };
in_window = false;
clearInterval(sampler);
open_min = Math.min(open_min, open);

stopping = true;
agent.destroy();

const window_us = Math.round((end.at - start.at) * 1000);
const n = end.events - start.events;
const fields = {
  events: n,
  window_us,
  events_per_s: Math.round(n / (window_us / 1e6)),
  responses,
  bad,
  errors,
  open_min,
  proxy_ns: pids.length ? end.proxy - start.proxy : -1,
  cpu_ticks: cpu !== '' ? end.cpu - start.cpu : -1,
  gap_p50_us: gap_percentile(50),
  gap_p99_us: gap_percentile(99),
  proxy_user_ticks: pids.length ? end.ticks[0] - start.ticks[0] : -1,
  proxy_sys_ticks: pids.length ? end.ticks[1] - start.ticks[1] : -1,
};
process.stdout.write(`TRICKLE_RESULT ${Object.entries(fields).map(([k, v]) => `${k}=${v}`).join(' ')}\n`);
process.exit(0);
