// bench/compare's client for workload (f), idle open streams: opens N
// streaming chat requests through a proxy to a mock-vllm that answers with
// the response head at once and its first token only after a long TTFT
// (--ttft-ms), holds them all open, and reads the proxy's memory (VmRSS,
// summed over --pids) and descriptors from /proc before and with all open.
//
//   node bench/idle.mjs --port PORT --streams 10000 --pids P1,P2
//        [--backend-pid P] [--cap C] [--warm 100] [--probe 200]
//        [--concurrency 256] [--settle-ms 1000] [--timeout-ms 30000]
//
// Steps: --warm streams opened and closed (first-use allocations land in the
// baseline), a settle, the baseline; --probe streams opened, from which the
// descriptors each stream costs the proxy (and the backend) are read; N is
// lowered, with a warning on stderr, to what the proxy's and the backend's
// open-file limits (soft RLIMIT_NOFILE, /proc/PID/limits), this process's
// own, and --cap (a limit of the proxy's config: HAProxy's maxconn, nginx's
// worker_connections) allow; the rest are opened, at most --concurrency
// waiting for their head at once; once every head is in, a settle, then
// samples until two agree within 0.5%. A stream counts as open when its
// "HTTP/1.1 200" head arrived and the connection is still up at the end.
// The last line is
//   IDLE_RESULT asked=.. target=.. open=.. failed=.. rss_base_kb=..
//     rss_open_kb=.. fds_base=.. fds_open=.. backend_fds_per_stream_x100=..
//     open_ms=..
import fs from 'node:fs';
import net from 'node:net';
import { parse_args } from './args.mjs';
import { chat_request } from './chat-body.mjs';

const args = parse_args(process.argv.slice(2), { positional: false });
const host = args.host ?? '127.0.0.1';
const port = Number(args.port);
const asked = Number(args.streams ?? 10000);
const pids = (args.pids ?? '').split(',').filter(Boolean).map(Number);
const backend_pid = args['backend-pid'] ? Number(args['backend-pid']) : 0;
const config_cap = Number(args.cap ?? Infinity);
const warm = Math.min(Number(args.warm ?? 100), asked);
const probe = Math.min(Number(args.probe ?? 200), asked);
const concurrency = Number(args.concurrency ?? 256);
const settle_ms = Number(args['settle-ms'] ?? 1000);
const timeout_ms = Number(args['timeout-ms'] ?? 30000);
const request = Buffer.from(chat_request(`${host}:${port}`, { stream: true, max_tokens: 16 }));

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const warn = (text) => process.stderr.write(`warning: ${text}\n`);

// --- /proc --------------------------------------------------------------------

function rss_kb(pid_list) {
  let sum = 0;
  for (const pid of pid_list) {
    try {
      const m = fs.readFileSync(`/proc/${pid}/status`, 'latin1').match(/^VmRSS:\s+(\d+) kB/m);
      if (m) sum += Number(m[1]);
    } catch { /* gone */ }
  }
  return sum;
}

function fd_count(pid) {
  try { return fs.readdirSync(`/proc/${pid}/fd`).length; } catch { return 0; }
}

function nofile_soft(pid) {
  const text = fs.readFileSync(`/proc/${pid}/limits`, 'latin1');
  const m = text.match(/^Max open files\s+(\S+)/m);
  return m && m[1] !== 'unlimited' ? Number(m[1]) : Infinity;
}

// Samples until two in a row agree within 0.5% (at most 10, 300 ms apart).
async function stable_rss() {
  let prev = rss_kb(pids);
  for (let i = 0; i < 10; ++i) {
    await sleep(300);
    const now = rss_kb(pids);
    if (Math.abs(now - prev) <= prev * 0.005) return now;
    prev = now;
  }
  return prev;
}

// --- streams ------------------------------------------------------------------

const streams = [];   // { socket, ok }
let failed = 0;
let first_failure = '';

// Opens one stream; resolves once its head arrived (true: 200) or it failed.
function open_stream() {
  return new Promise((resolve) => {
    const s = { socket: null, ok: false, closed: false };
    let head = '';
    let done = false;
    const finish = (ok, why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.ok = ok;
      if (!ok) {
        ++failed;
        if (!first_failure) first_failure = why;
        s.socket.destroy();
      }
      resolve(ok);
    };
    const timer = setTimeout(() => finish(false, `no response head within ${timeout_ms} ms`), timeout_ms);
    s.socket = net.connect({ host, port }, () => s.socket.write(request));
    s.socket.setNoDelay(true);
    s.socket.on('data', (chunk) => {
      if (done) return;   // body bytes of an open stream: not expected, not kept
      head += chunk.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      if (head.startsWith('HTTP/1.1 200')) finish(true, '');
      else finish(false, head.slice(0, head.indexOf('\r\n')));
    });
    s.socket.on('error', (e) => { s.closed = true; finish(false, e.code ?? String(e)); });
    s.socket.on('close', () => { s.closed = true; finish(false, 'closed before the head'); });
    streams.push(s);
  });
}

// Opens `count` streams, at most `concurrency` waiting for their head at once.
async function open_many(count) {
  let started = 0;
  const lane = async () => {
    while (started < count) {
      ++started;
      await open_stream();
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, lane));
}

function close_all() {
  for (const s of streams) s.socket.destroy();
  streams.length = 0;
}

// --- the run ------------------------------------------------------------------

await open_many(warm);
close_all();
failed = 0;
await sleep(settle_ms);
const rss_base = await stable_rss();
const fds_base = pids.map(fd_count);
const backend_fds_base = backend_pid ? fd_count(backend_pid) : 0;

const t_open = performance.now();
await open_many(probe);
// Descriptors per open stream, per proxy process: the limit each process
// has left decides how many streams it can hold.
let target = Math.min(asked, config_cap);
const probe_open = streams.filter((s) => s.ok).length;
if (probe_open > 0) {
  pids.forEach((pid, i) => {
    const per = (fd_count(pid) - fds_base[i]) / probe_open;
    if (per <= 0) return;
    const cap = Math.floor((nofile_soft(pid) - fds_base[i] - 64) / per);
    if (cap < target) {
      warn(`process ${pid} uses ${per.toFixed(2)} descriptors per open stream and may open ` +
           `${nofile_soft(pid)}: it can hold ${cap} streams`);
      target = cap;
    }
  });
}
let backend_per = 0;
if (backend_pid && probe_open > 0) {
  backend_per = (fd_count(backend_pid) - backend_fds_base) / probe_open;
  if (backend_per > 0) {
    const cap = Math.floor((nofile_soft(backend_pid) - backend_fds_base - 64) / backend_per);
    if (cap < target) {
      warn(`the backend (pid ${backend_pid}) can hold ${cap} streams`);
      target = cap;
    }
  }
}
const own_cap = nofile_soft(process.pid) - fd_count(process.pid) - 64 + streams.length;
if (own_cap < target) {
  warn(`this client's open-file limit allows ${own_cap} streams`);
  target = own_cap;
}
if (target < asked) warn(`holding ${target} idle streams, not ${asked}`);
if (target > streams.length) await open_many(target - streams.length);
const open_ms = Math.round(performance.now() - t_open);

await sleep(settle_ms);
const rss_open = await stable_rss();
const fds_open = pids.reduce((sum, pid) => sum + fd_count(pid), 0);
const open = streams.filter((s) => s.ok && !s.closed).length;
if (failed) warn(`${failed} streams failed; the first: ${first_failure}`);
close_all();

const fields = {
  asked,
  target,
  open,
  failed,
  rss_base_kb: rss_base,
  rss_open_kb: rss_open,
  fds_base: fds_base.reduce((a, b) => a + b, 0),
  fds_open,
  backend_fds_per_stream_x100: Math.round(backend_per * 100),
  open_ms,
};
process.stdout.write(`IDLE_RESULT ${Object.entries(fields).map(([k, v]) => `${k}=${v}`).join(' ')}\n`);
process.exit(0);
