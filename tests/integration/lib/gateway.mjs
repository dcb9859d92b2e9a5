// Helpers for the routing, auth, quota and audit/metrics tests: several
// mock-vllm backends that name themselves in every answer, a TOML writer for
// groups and keys, fresh-connection requests, bounded polling, audit-file
// reading, mock-vllm's token formula and a strict Prometheus text parser.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { bound_ms, http_post, start_mock_vllm } from './harness.mjs';

// ---------------------------------------------------------------------------
// Backends

// Starts `count` mock-vllm backends; backend i answers with model "backend-i"
// whatever the request asked, so a response tells which backend served it.
export async function start_backends(count, options = {}) {
  const out = [];
  try {
    for (let i = 0; i < count; ++i) out.push(await start_mock_vllm({ ...options, model: `backend-${i}` }));
  } catch (err) {
    await Promise.all(out.map((m) => m.stop().catch(() => {})));
    throw err;
  }
  return out;
}

// The backend index named by a JSON answer or by the first SSE chunk; -1
// when the text names none.
export function backend_of(text) {
  const m = text.match(/"model":"backend-(\d+)"/);
  return m ? Number(m[1]) : -1;
}

// Every request the backends recorded, each tagged with its backend index;
// only /v1/* (not health probes or metrics scrapes).
export async function recorded_requests(backends) {
  const all = [];
  for (const [i, b] of backends.entries()) {
    for (const r of await b.requests()) if (r.target.startsWith('/v1/')) all.push({ ...r, backend: i });
  }
  return all;
}

export function header_of(recorded, name) {
  const hit = recorded.headers.find(([n]) => n.toLowerCase() === name);
  return hit ? hit[1] : undefined;
}

// ---------------------------------------------------------------------------
// Config

const toml_value = (v) => {
  if (Array.isArray(v)) return `[${v.map(toml_value).join(', ')}]`;
  if (v !== null && typeof v === 'object') return `{ ${Object.entries(v).map(([k, x]) => `${k} = ${toml_value(x)}`).join(', ')} }`;
  if (typeof v === 'string') return JSON.stringify(v);
  return String(v);
};

function toml_table(header, obj) {
  const lines = [header];
  const subtables = [];
  for (const [k, v] of Object.entries(obj)) {
    if (v === undefined) continue;
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) subtables.push([k, v]);
    else lines.push(`${k} = ${toml_value(v)}`);
  }
  const name = header.replace(/^\[+|\]+$/g, '');
  for (const [k, v] of subtables) lines.push('', toml_table(`[${name}.${k}]`, v));
  return lines.join('\n');
}

// TOML text: `tables` are plain tables ({server: {...}, health: {...}}),
// `groups` and `keys` arrays of tables ([[group]], [[key]]).
export function gateway_config({ tables = {}, groups = [], keys = [], audit_path = 'sluice-audit.jsonl' }) {
  const parts = [];
  for (const [name, obj] of Object.entries({ audit: { path: audit_path }, ...tables })) parts.push(toml_table(`[${name}]`, obj));
  for (const g of groups) parts.push(toml_table('[[group]]', g));
  for (const k of keys) parts.push(toml_table('[[key]]', k));
  return parts.join('\n\n') + '\n';
}

// ---------------------------------------------------------------------------
// Requests

// A new agent per request with keepAlive off: every request gets its own
// connection, which SO_REUSEPORT spreads over sluice's shards.
export function fresh_agent() {
  return new http.Agent({ keepAlive: false, maxSockets: Infinity });
}

// POST a chat request on a fresh connection; never rejects: a transport
// failure comes back as {status: 0, error}.
export async function post_fresh(base_url, body, { key, headers = {}, target = '/v1/chat/completions', timeout_ms, ...rest } = {}) {
  const agent = fresh_agent();
  const h = { ...headers };
  if (key !== undefined && key !== null) h.authorization = `Bearer ${key}`;
  try {
    return await http_post(base_url, target, body, { headers: h, agent, timeout_ms, ...rest });
  } catch (error) {
    return { status: 0, headers: {}, text: '', complete: false, error };
  } finally {
    agent.destroy();
  }
}

// Runs `worker(i)` for i in [0, count) with at most `width` at a time;
// resolves with the results in index order.
export async function run_pool(count, width, worker) {
  const results = new Array(count);
  let next = 0;
  const lane = async () => {
    for (;;) {
      const i = next++;
      if (i >= count) return;
      results[i] = await worker(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(width, count) }, lane));
  return results;
}

// Polls `probe` (sync or async) until it returns a truthy value; resolves
// with that value, rejects with `what` after the bound.
export async function poll(probe, { timeout_ms = bound_ms(10000), interval_ms = 20, what = 'a condition' } = {}) {
  const deadline = performance.now() + timeout_ms;
  let last_error;
  for (;;) {
    try {
      const v = await probe();
      if (v) return v;
    } catch (err) {
      last_error = err;
    }
    if (performance.now() >= deadline) {
      throw new Error(`timed out after ${timeout_ms} ms waiting for ${what}${last_error ? `: ${last_error.message}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, interval_ms));
  }
}

// ---------------------------------------------------------------------------
// mock-vllm's deterministic token counts (tools/mock-vllm --help)

export function words(s) {
  return (String(s ?? '').match(/[^ \t\n\v\f\r]+/g) ?? []).length;
}

export function mock_prompt_tokens(body) {
  if (Array.isArray(body.messages)) {
    let n = 0;
    for (const m of body.messages) {
      n += 4;
      if (typeof m.content === 'string') n += words(m.content);
      else if (Array.isArray(m.content)) for (const p of m.content) n += words(p.text);
    }
    return n;
  }
  const p = body.prompt;
  if (typeof p === 'string') return words(p);
  if (Array.isArray(p)) return p.reduce((n, x) => n + (typeof x === 'string' ? words(x) : Array.isArray(x) ? x.length : 1), 0);
  return 0;
}

export function mock_completion_tokens(body, reply_tokens) {
  const max = body.max_completion_tokens ?? body.max_tokens;
  return max === undefined ? reply_tokens : Math.min(reply_tokens, max);
}

// ---------------------------------------------------------------------------
// Audit file

// The audit file's lines; throws when a line is torn (no final newline) or
// is not a JSON object.
export function read_audit(file) {
  if (!fs.existsSync(file)) return [];
  const text = fs.readFileSync(file, 'utf8');
  if (text.length === 0) return [];
  if (!text.endsWith('\n')) throw new Error(`${path.basename(file)}: last line is torn: ${JSON.stringify(text.slice(text.lastIndexOf('\n') + 1))}`);
  return text.slice(0, -1).split('\n').map((line, i) => {
    let json;
    try {
      json = JSON.parse(line);
    } catch (err) {
      throw new Error(`${path.basename(file)} line ${i + 1} is not JSON (${err.message}): ${JSON.stringify(line)}`);
    }
    if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new Error(`line ${i + 1} is not an object`);
    return json;
  });
}

// ---------------------------------------------------------------------------
// Prometheus text exposition format 0.0.4, parsed strictly

const metric_name = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const label_name = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const types = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

function parse_value(text, where) {
  if (/^[+-]?Inf$/.test(text)) return text.startsWith('-') ? -Infinity : Infinity;
  if (text === 'NaN') return NaN;
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(text)) throw new Error(`${where}: bad value ${JSON.stringify(text)}`);
  return Number(text);
}

function parse_labels(text, where) {
  // text: the inside of {...}
  const labels = {};
  let i = 0;
  while (i < text.length) {
    const eq = text.indexOf('=', i);
    if (eq < 0) throw new Error(`${where}: label without '='`);
    const name = text.slice(i, eq);
    if (!label_name.test(name)) throw new Error(`${where}: bad label name ${JSON.stringify(name)}`);
    if (name in labels) throw new Error(`${where}: label ${name} twice`);
    if (text[eq + 1] !== '"') throw new Error(`${where}: label ${name} value is not quoted`);
    let j = eq + 2;
    let value = '';
    for (;;) {
      if (j >= text.length) throw new Error(`${where}: unterminated label value`);
      const c = text[j];
      if (c === '"') break;
      if (c === '\n') throw new Error(`${where}: raw newline in label value`);
      if (c === '\\') {
        const e = text[j + 1];
        if (e === 'n') value += '\n';
        else if (e === '\\') value += '\\';
        else if (e === '"') value += '"';
        else throw new Error(`${where}: bad escape \\${e} in label value`);
        j += 2;
        continue;
      }
      value += c;
      ++j;
    }
    labels[name] = value;
    i = j + 1;
    if (i < text.length) {
      if (text[i] !== ',') throw new Error(`${where}: expected ',' between labels`);
      ++i;
    }
  }
  return labels;
}

// Strict parse: every sample belongs to a family declared by # TYPE before it
// (histogram samples by their _bucket/_sum/_count suffix), HELP/TYPE at most
// once per family, no duplicate series, histogram buckets cumulative with an
// +Inf bucket equal to _count. Returns {families: Map(name -> {type, help,
// samples: [{name, labels, value}]})}; throws with the line number on error.
export function parse_prometheus(text) {
  if (text.length > 0 && !text.endsWith('\n')) throw new Error('exposition does not end with a newline');
  const families = new Map();
  const seen = new Set();
  const family_of = (name) => {
    if (families.has(name)) return families.get(name);
    for (const suffix of ['_bucket', '_sum', '_count']) {
      if (name.endsWith(suffix)) {
        const f = families.get(name.slice(0, -suffix.length));
        if (f && (f.type === 'histogram' || f.type === 'summary')) return f;
      }
    }
    return undefined;
  };
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  for (const [n, line] of lines.entries()) {
    const where = `/metrics line ${n + 1} ${JSON.stringify(line)}`;
    if (line === '') continue;
    if (line.startsWith('#')) {
      const m = line.match(/^# (HELP|TYPE) (\S+) ?(.*)$/);
      if (!m) {
        if (/^# (HELP|TYPE)\b/.test(line)) throw new Error(`${where}: malformed ${line.split(' ')[1]} line`);
        continue;  // a comment
      }
      const [, kind, name, rest] = m;
      if (!metric_name.test(name)) throw new Error(`${where}: bad metric name`);
      let f = families.get(name);
      if (!f) { f = { name, type: 'untyped', help: undefined, typed: false, samples: [] }; families.set(name, f); }
      if (kind === 'TYPE') {
        if (f.typed) throw new Error(`${where}: TYPE twice for ${name}`);
        if (f.samples.length > 0) throw new Error(`${where}: TYPE after samples of ${name}`);
        if (!types.has(rest)) throw new Error(`${where}: unknown type ${JSON.stringify(rest)}`);
        f.type = rest;
        f.typed = true;
      } else {
        if (f.help !== undefined) throw new Error(`${where}: HELP twice for ${name}`);
        f.help = rest;
      }
      continue;
    }
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?\d+))?$/);
    if (!m) throw new Error(`${where}: not a sample line`);
    const [, name, label_text, value_text] = m;
    const labels = label_text === undefined ? {} : parse_labels(label_text, where);
    const value = parse_value(value_text, where);
    const f = family_of(name);
    if (!f || !f.typed) throw new Error(`${where}: sample of ${name} has no # TYPE before it`);
    const series = `${name}{${Object.entries(labels).sort().map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(',')}}`;
    if (seen.has(series)) throw new Error(`${where}: duplicate series ${series}`);
    seen.add(series);
    if ((f.type === 'counter') && !(value >= 0)) throw new Error(`${where}: counter is negative or NaN`);
    f.samples.push({ name, labels, value });
  }
  for (const f of families.values()) {
    if (f.type !== 'histogram') continue;
    // Group by the labels other than `le`.
    const sets = new Map();
    for (const s of f.samples) {
      const { le, ...rest } = s.labels;
      const id = JSON.stringify(Object.entries(rest).sort());
      if (!sets.has(id)) sets.set(id, { buckets: [], sum: undefined, count: undefined });
      const set = sets.get(id);
      if (s.name === `${f.name}_bucket`) {
        if (le === undefined) throw new Error(`${f.name}_bucket without le`);
        set.buckets.push([parse_value(le, `${f.name} le`), s.value]);
      } else if (s.name === `${f.name}_sum`) set.sum = s.value;
      else if (s.name === `${f.name}_count`) set.count = s.value;
      else throw new Error(`histogram ${f.name} has a plain sample ${s.name}`);
    }
    for (const [id, set] of sets) {
      if (set.count === undefined || set.sum === undefined) throw new Error(`histogram ${f.name}${id} lacks _sum or _count`);
      if (set.buckets.length === 0 || set.buckets[set.buckets.length - 1][0] !== Infinity) throw new Error(`histogram ${f.name}${id}: last bucket is not le="+Inf"`);
      for (let i = 1; i < set.buckets.length; ++i) {
        if (!(set.buckets[i][0] > set.buckets[i - 1][0])) throw new Error(`histogram ${f.name}${id}: le not increasing`);
        if (set.buckets[i][1] < set.buckets[i - 1][1]) throw new Error(`histogram ${f.name}${id}: buckets not cumulative`);
      }
      if (set.buckets[set.buckets.length - 1][1] !== set.count) throw new Error(`histogram ${f.name}${id}: +Inf bucket != _count`);
    }
  }
  return { families };
}

// The samples of family `name` whose labels include `match`.
export function samples(parsed, name, match = {}) {
  const base = name.replace(/_(bucket|sum|count)$/, '');
  const f = parsed.families.get(name) ?? parsed.families.get(base);
  if (!f) return [];
  return f.samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
}

// Waits until sluice has no request in flight (sluice_inflight_requests,
// which drops in the same step as the shard's own in-flight count): from
// then on the shards' reports of their loads are what the next request
// is routed by.
export async function until_idle(admin_url) {
  await poll(async () => samples((await scrape(admin_url)).parsed, 'sluice_inflight_requests')[0]?.value === 0,
    { what: 'no request in flight' });
}

export async function scrape(admin_url) {
  const res = await fetch(`${admin_url}/metrics`);
  const text = await res.text();
  if (res.status !== 200) throw new Error(`GET /metrics: ${res.status} ${text.slice(0, 200)}`);
  return { text, content_type: res.headers.get('content-type'), parsed: parse_prometheus(text) };
}
