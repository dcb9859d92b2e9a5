// The client side of bench/soak (which starts mock-vllm and sluice and runs
// this twice). Not meant to be run by hand.
//
//   node bench/soak.mjs run --url URL --pid PID --backend-port P --seconds N
//        [--clients C] [--warmup S] [--settle S] [--burst B] [--kinds a,b]
//        --state FILE
//     Mixed traffic from C concurrent clients, with sluice's RSS, fds and
//     pipes measured after a warm-up and again after the traffic. Both
//     measurements follow the same steps: a burst of B concurrent streams
//     (it fills sluice's bounded caches, the pipe pool and the pooled
//     backend connections, to their caps, so that start and end compare
//     like with like), the clients close every connection, a settle of S
//     seconds, then samples until two agree. Writes what it sent and
//     measured to FILE (JSON). --kinds: only these kinds of traffic (the
//     names in the report's table), to find which one holds memory.
//   node bench/soak.mjs report --state FILE --audit PATH [--other-requests N]
//     Prints the table and the audit check; exits 1 when RSS grew more
//     than 5%, the fd or pipe count differs, or a request is missing from
//     (or doubled in) the audit log.
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { pathToFileURL } from 'node:url';
import { parse_args } from './args.mjs';

const repo = new URL('..', import.meta.url);
const sdk_entry = new URL('tests/integration/node_modules/openai/index.mjs', repo);
const model = 'mock-model';
const key = 'test-key';
const oversize_bytes = 80 * 1024;   // over the soak config's max_body_bytes (64 KiB)

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------
// What sluice holds: RSS, fds by kind

function tcp_sockets(pid) {
  // inode -> {local_port, remote_port, state}, from sluice's own view.
  const map = new Map();
  for (const file of ['tcp', 'tcp6']) {
    let text = '';
    try { text = fs.readFileSync(`/proc/${pid}/net/${file}`, 'utf8'); } catch { continue; }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10) continue;
      map.set(f[9], {
        local_port: parseInt(f[1].split(':')[1], 16),
        remote_port: parseInt(f[2].split(':')[1], 16),
        state: f[3],
      });
    }
  }
  return map;
}

function sample(pid, ports) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (name) => Number(status.match(new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm'))?.[1] ?? 0);
  const rss_kib = kib('VmRSS');
  const tcp = tcp_sockets(pid);
  const s = { rss_kib, rss_anon_kib: kib('RssAnon'), rss_file_kib: kib('RssFile'), fds: 0, pipes: 0, backend_sockets: 0, client_sockets: 0, other_fds: 0 };
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    let target;
    try { target = fs.readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { continue; }  // closed meanwhile
    ++s.fds;
    const sock = target.match(/^socket:\[(\d+)\]$/);
    if (target.startsWith('pipe:')) ++s.pipes;
    else if (sock && tcp.get(sock[1])?.remote_port === ports.backend) ++s.backend_sockets;
    else if (sock && tcp.get(sock[1])?.local_port === ports.sluice && tcp.get(sock[1]).state !== '0A') ++s.client_sockets;
    else ++s.other_fds;
  }
  return s;
}

// Samples until two in a row agree on every fd count (a health probe's
// short-lived socket must not decide the result), at most `tries` times.
async function settled_sample(pid, ports, tries = 10) {
  let last = sample(pid, ports);
  for (let i = 1; i < tries; ++i) {
    await sleep(500);
    const next = sample(pid, ports);
    const same = ['fds', 'pipes', 'backend_sockets', 'client_sockets', 'other_fds'].every((k) => next[k] === last[k]);
    last = next;
    if (same) break;
  }
  return last;
}

// ---------------------------------------------------------------------------
// Requests. None of these rejects: a transport failure is status 0.

let next_id = 0;
const sent = [];   // {id, kind}: every request whose head was sent
const outcomes = new Map();  // kind -> Map(status -> count)
let response_ids = [];       // ids sluice gave requests sent without one

function note(kind, status) {
  if (!outcomes.has(kind)) outcomes.set(kind, new Map());
  const m = outcomes.get(kind);
  m.set(status, (m.get(status) ?? 0) + 1);
}

function new_id(kind) {
  const id = `soak-${next_id++}`;
  sent.push({ id, kind });
  return id;
}

function request(base, method, target, { body, headers = {}, agent, on_data, on_finish } = {}) {
  const payload = body === undefined ? undefined : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  return new Promise((resolve) => {
    const h = { authorization: `Bearer ${key}`, ...headers };
    if (payload) { h['content-type'] = 'application/json'; h['content-length'] = payload.length; }
    const req = http.request(new URL(target, base), { method, agent, headers: h });
    const timer = setTimeout(() => req.destroy(new Error('timeout')), 30000);
    let settled = false;
    const done = (r) => { if (!settled) { settled = true; clearTimeout(timer); resolve(r); } };
    req.on('error', (error) => done({ status: 0, error: error.code ?? error.message, headers: {}, text: '', complete: false }));
    req.on('finish', () => on_finish?.(req));
    req.on('response', (res) => {
      const parts = [];
      res.on('data', (d) => { parts.push(d); on_data?.(d, req); });
      res.on('error', () => {});
      res.on('close', () => done({ status: res.statusCode, headers: res.headers, text: Buffer.concat(parts).toString('utf8'), complete: res.complete }));
    });
    req.end(payload);
  });
}

// Raw bytes on a fresh connection; returns the status line's code and the
// x-request-id of whatever came back before the close.
function raw(port, bytes) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const parts = [];
    const timer = setTimeout(() => socket.destroy(), 10000);
    socket.on('error', () => {});
    socket.on('data', (d) => parts.push(d));
    socket.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(parts).toString('latin1');
      const status = Number(text.match(/^HTTP\/1\.1 (\d{3})/)?.[1] ?? 0);
      resolve({ status, request_id: text.match(/\r\nx-request-id: ([^\r]*)\r\n/i)?.[1] });
    });
    socket.on('connect', () => socket.write(bytes));
  });
}

const chat = (max_tokens, extra = {}) => ({ model, messages: [{ role: 'user', content: `soak ${next_id % 97}` }], max_tokens, ...extra });
const rand = (lo, hi) => lo + Math.floor(Math.random() * (hi - lo + 1));

// The traffic mix: [kind, weight, run(client)]. Each run sends one request
// and notes its outcome.
function mix(base, port) {
  const sdk_call = async (kind, fn) => {
    const id = new_id(kind);
    try {
      note(kind, await fn(id));
    } catch (err) {
      note(kind, err.status ?? `error ${err.constructor.name}`);
    }
  };
  const http_call = async (kind, method, target, opts, c) => {
    const id = new_id(kind);
    const r = await request(base, method, target, { ...opts, agent: c.agent, headers: { 'x-request-id': id, ...opts.headers } });
    let outcome = r.status || r.error;
    if (kind === 'backend_dies' && r.status === 200) outcome = r.complete ? '200 complete' : '200 truncated';
    if (kind === 'nonstream_cancel' && r.status === 0) outcome = 'cancelled';
    note(kind, outcome);
  };
  return [
    ['chat', 24, (c) => sdk_call('chat', async (id) => {
      const { data, response } = await c.sdk.chat.completions.create(chat(rand(2, 32)), { headers: { 'x-request-id': id } }).withResponse();
      return data.choices[0].message.content.length > 0 ? response.status : 'empty reply';
    })],
    ['stream', 23, (c) => sdk_call('stream', async (id) => {
      const usage = Math.random() < 0.5;
      const stream = await c.sdk.chat.completions.create(
        chat(rand(4, 64), { stream: true, ...(usage ? { stream_options: { include_usage: true } } : {}) }),
        { headers: { 'x-request-id': id } });
      let finish = null;
      for await (const ev of stream) finish = ev.choices[0]?.finish_reason ?? finish;
      return finish ? 200 : 'no finish_reason';
    })],
    ['stream_cancel', 8, (c) => sdk_call('stream_cancel', async (id) => {
      const stream = await c.sdk.chat.completions.create(chat(400, { stream: true }), { headers: { 'x-request-id': id } });
      let events = 0;
      try {
        for await (const _ of stream) if (++events === 3) stream.controller.abort();
      } catch (err) {
        if (err.constructor.name !== 'APIUserAbortError') throw err;
      }
      return events >= 3 ? 'cancelled' : 'ended early';
    })],
    ['nonstream_cancel', 4, (c) => http_call('nonstream_cancel', 'POST', '/v1/chat/completions', {
      body: chat(300), on_finish: (req) => setTimeout(() => req.destroy(), 30),
    }, c)],
    ['completions', 5, (c) => http_call('completions', 'POST', '/v1/completions', { body: { model, prompt: 'soak', max_tokens: rand(2, 16) } }, c)],
    ['embeddings', 3, (c) => http_call('embeddings', 'POST', '/v1/embeddings', { body: { model, input: ['a', 'b'] } }, c)],
    ['models', 3, (c) => http_call('models', 'GET', '/v1/models', {}, c)],
    ['bad_json', 5, (c) => http_call('bad_json', 'POST', '/v1/chat/completions', { body: `{"model":"${model}","messages":[` }, c)],
    ['wrong_key', 5, (c) => http_call('wrong_key', 'POST', '/v1/chat/completions', { body: chat(4), headers: { authorization: 'Bearer not-the-key' } }, c)],
    ['unknown_model', 4, (c) => http_call('unknown_model', 'POST', '/v1/chat/completions', { body: chat(4, { model: 'no-such-model' }) }, c)],
    ['unknown_url', 2, (c) => http_call('unknown_url', 'POST', '/v1/nothing', { body: chat(4) }, c)],
    ['backend_error', 4, (c) => http_call('backend_error', 'POST', '/v1/chat/completions', {
      // Valid for sluice, refused by the backend (vLLM: content must be a
      // string, an array or null).
      body: { model, messages: [{ role: 'user', content: 5 }], max_tokens: 4 },
    }, c)],
    ['backend_dies', 4, (c) => http_call('backend_dies', 'POST', '/v1/chat/completions', {
      body: chat(50, { stream: true }), headers: { 'x-mock-fail-after-tokens': '3' },
    }, c)],
    ['oversize', 3, async () => {
      const id = new_id('oversize');
      const body = JSON.stringify(chat(4, { pad: 'x'.repeat(oversize_bytes) }));
      const r = await raw(port, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${key}\r\n` +
        `Content-Type: application/json\r\nX-Request-Id: ${id}\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      note('oversize', r.status || 'no answer');
    }],
    ['malformed', 3, async () => {
      // No id of ours: the head does not parse. sluice's own id comes back.
      sent.push({ id: null, kind: 'malformed' });
      const r = await raw(port, 'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello');
      if (r.request_id) response_ids.push(r.request_id);
      note('malformed', r.status || 'no answer');
    }],
  ];
}

function picker(kinds) {
  const total = kinds.reduce((n, k) => n + k[1], 0);
  return () => {
    let x = Math.random() * total;
    for (const k of kinds) if ((x -= k[1]) < 0) return k;
    return kinds[0];
  };
}

async function traffic(base, port, OpenAI, clients, seconds, only) {
  const kinds = mix(base, port).filter((k) => only === undefined || only.includes(k[0]));
  if (kinds.length === 0) throw new Error(`--kinds: none of ${only} is a traffic kind`);
  const pick = picker(kinds);
  const until = performance.now() + seconds * 1000;
  await Promise.all(Array.from({ length: clients }, async () => {
    const c = {
      agent: new http.Agent({ keepAlive: true, maxSockets: 1 }),
      sdk: new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 30000 }),
    };
    while (performance.now() < until) await pick()[2](c);
    c.agent.destroy();
  }));
}

// B streams at once, each on its own connection, all open together (the
// backend paces them): the peak that fills sluice's caches.
async function burst(base, count) {
  const results = await Promise.all(Array.from({ length: count }, () => {
    const agent = new http.Agent({ keepAlive: false });
    return request(base, 'POST', '/v1/chat/completions', {
      // include_usage: nothing for sluice to cut, so these take the splice
      // path and hold two pipes each.
      agent, body: chat(200, { stream: true, stream_options: { include_usage: true } }),
      headers: { 'x-request-id': new_id('burst') },
    }).finally(() => agent.destroy());
  }));
  for (const r of results) note('burst', r.status === 200 && r.complete ? 200 : (r.status || r.error));
}

async function run(args) {
  const { default: OpenAI } = await import(pathToFileURL(sdk_entry.pathname).href);
  const base = args.url;
  const port = Number(new URL(base).port);
  const pid = Number(args.pid);
  const ports = { sluice: port, backend: Number(args['backend-port']) };
  const clients = Number(args.clients ?? 8);
  const seconds = Number(args.seconds);
  const warmup = Number(args.warmup ?? 5);
  const settle = Number(args.settle ?? 6);
  const burst_size = Number(args.burst ?? 64);
  const only = args.kinds?.split(',');

  const measure = async (label) => {
    await burst(base, burst_size);
    // The SDK's fetch keeps idle connections 4 s: the settle outlasts it.
    await sleep(settle * 1000);
    const s = await settled_sample(pid, ports);
    console.error(`soak: ${label}: RSS ${s.rss_kib} KiB, ${s.fds} fds, ${s.pipes} pipes`);
    return s;
  };

  console.error(`soak: warm-up ${warmup} s, ${clients} clients`);
  await traffic(base, port, OpenAI, clients, warmup, only);
  // The start is sluice's working set, not a point on its way there: more
  // warm-up rounds until two settled samples agree within 2% (on a slow,
  // shared machine 30 s of traffic may not reach it).
  let start = await measure('warm-up sample');
  for (let round = 0; round < 8; ++round) {
    await traffic(base, port, OpenAI, clients, 15, only);
    const next = await measure('warm-up sample');
    const stable = Math.abs(next.rss_kib - start.rss_kib) <= start.rss_kib * 0.02;
    start = next;
    if (stable) break;
  }
  console.error(`soak: start: RSS ${start.rss_kib} KiB, ${start.fds} fds, ${start.pipes} pipes`);
  const started = performance.now();
  const sent_before = sent.length;
  console.error(`soak: mixed traffic for ${seconds} s`);
  // RSS along the way, to tell a slope from a step.
  const trace = [];
  const tracer = setInterval(() => {
    try { trace.push([Math.round((performance.now() - started) / 1000), sample(pid, ports).rss_kib]); } catch { /* gone */ }
  }, Math.max(1000, seconds * 1000 / 20));
  await traffic(base, port, OpenAI, clients, seconds, only);
  clearInterval(tracer);
  const traffic_s = (performance.now() - started) / 1000;
  const measured = sent.length - sent_before;
  const end = await measure('end');
  const by_kind = {};
  for (const [kind, m] of outcomes) by_kind[kind] = Object.fromEntries(m);
  fs.writeFileSync(args.state, JSON.stringify({ start, end, traffic_s, measured, warmup, clients, sent, response_ids, by_kind, trace }));
}

// ---------------------------------------------------------------------------
// The report

function report(args) {
  const st = JSON.parse(fs.readFileSync(args.state, 'utf8'));
  const text = fs.existsSync(args.audit) ? fs.readFileSync(args.audit, 'utf8') : '';
  const lines = text.length === 0 ? [] : text.replace(/\n$/, '').split('\n');
  const audit_ids = new Map();
  let torn = 0;
  for (const line of lines) {
    try {
      const id = JSON.parse(line).request_id;
      audit_ids.set(id, (audit_ids.get(id) ?? 0) + 1);
    } catch {
      ++torn;
    }
  }
  const ours = st.sent.filter((s) => s.id !== null);
  const missing = ours.filter((s) => !audit_ids.has(s.id));
  const doubled = [...audit_ids].filter(([, n]) => n > 1);
  const missing_theirs = st.response_ids.filter((id) => !audit_ids.has(id));
  // bench/soak's own check that sluice answers, before the client ran.
  const others = Number(args['other-requests'] ?? 0);
  const failures = [];

  const row = (name, a, b, change) => console.log(`| ${name.padEnd(18)} | ${String(a).padStart(9)} | ${String(b).padStart(9)} | ${change.padStart(8)} |`);
  console.log(`\nsoak: ${st.traffic_s.toFixed(0)} s of mixed traffic after a ${st.warmup} s warm-up, ${st.clients} clients: ` +
    `${st.measured} requests (${(st.measured / st.traffic_s).toFixed(0)}/s); ${st.sent.length} with the warm-up and the bursts\n`);
  console.log('| sluice             |     start |       end |   change |');
  console.log('|--------------------|-----------|-----------|----------|');
  const rss_change = (st.end.rss_kib - st.start.rss_kib) / st.start.rss_kib * 100;
  row('RSS KiB', st.start.rss_kib, st.end.rss_kib, `${rss_change >= 0 ? '+' : ''}${rss_change.toFixed(1)}%`);
  for (const k of ['rss_anon_kib', 'rss_file_kib']) {
    if (st.start[k] !== undefined) row(`  ${k.replace('_kib', '')}`, st.start[k], st.end[k], `${st.end[k] - st.start[k] >= 0 ? '+' : ''}${st.end[k] - st.start[k]}`);
  }
  for (const k of ['fds', 'pipes', 'backend_sockets', 'client_sockets', 'other_fds']) {
    const d = st.end[k] - st.start[k];
    row(k === 'fds' || k === 'pipes' ? k : `  ${k}`, st.start[k], st.end[k], `${d > 0 ? '+' : ''}${d}`);
  }
  if (rss_change > 5) failures.push(`RSS grew ${rss_change.toFixed(1)}% (limit 5%)`);
  if (st.end.fds !== st.start.fds) failures.push(`fd count ${st.start.fds} -> ${st.end.fds}`);
  if (st.end.pipes !== st.start.pipes) failures.push(`pipe count ${st.start.pipes} -> ${st.end.pipes}`);

  console.log('\n| requests         |  sent | outcomes (status: count)');
  console.log('|------------------|-------|-------------------------');
  const sent_by_kind = {};
  for (const s of st.sent) sent_by_kind[s.kind] = (sent_by_kind[s.kind] ?? 0) + 1;
  for (const [kind, n] of Object.entries(sent_by_kind).sort()) {
    const o = Object.entries(st.by_kind[kind] ?? {}).map(([s, c]) => `${s}: ${c}`).join(', ');
    console.log(`| ${kind.padEnd(16)} | ${String(n).padStart(5)} | ${o}`);
  }

  console.log(`\nRSS KiB during the traffic (s: KiB): ${(st.trace ?? []).map(([t, kib]) => `${t}: ${kib}`).join(', ')}`);
  console.log(`\naudit: ${lines.length} records for ${st.sent.length + others} requests (${others} before the soak); ` +
    `${missing.length} of our ids missing, ${doubled.length} ids twice, ${missing_theirs.length} of sluice's own ids (malformed heads) missing` +
    (torn ? `, ${torn} lines not JSON` : ''));
  if (lines.length !== st.sent.length + others) {
    failures.push(`${lines.length} audit records for ${st.sent.length + others} requests`);
  }
  if (missing.length) failures.push(`${missing.length} requests missing from the audit log (e.g. ${missing.slice(0, 5).map((s) => `${s.id} ${s.kind}`).join(', ')})`);
  if (doubled.length) failures.push(`${doubled.length} request ids audited more than once (e.g. ${doubled.slice(0, 5).map(([id, n]) => `${id} x${n}`).join(', ')})`);
  if (missing_theirs.length) failures.push(`${missing_theirs.length} answered malformed requests missing from the audit log`);
  if (torn) failures.push(`${torn} audit lines are not JSON`);

  if (failures.length) {
    console.log(`\nFAIL:\n${failures.map((f) => `  - ${f}`).join('\n')}`);
    return 1;
  }
  console.log('\nPASS: RSS within 5%, fd and pipe counts equal, every request audited once');
  return 0;
}

const args = parse_args(process.argv.slice(2));
if (args._[0] === 'run') {
  await run(args);
} else if (args._[0] === 'report') {
  process.exitCode = report(args);
} else {
  console.error('usage: node bench/soak.mjs run|report ... (see bench/soak)');
  process.exitCode = 2;
}
