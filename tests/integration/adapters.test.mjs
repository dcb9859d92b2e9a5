// The gateway's own work is the same whichever protocol a group's backends
// speak (issue 15 §3): for protocol = "openai" (mock-vllm's OpenAI API),
// "anthropic" (mock-vllm's POST /v1/messages: the same token texts and
// counts) and "triton" (mock-triton, KServe v2 gRPC), the stock OpenAI SDK
// through sluice checks auth, routing (sessions, prefix affinity, bounded
// load), quota reservation and settlement on the backend's counts, audit,
// metrics (the `protocol` label), retries before the first byte, reload
// and /v1/models.
//
// Every request carries its own X-Request-Id, and each backend tells which
// ids it served: mock-vllm in its /debug/requests record, mock-triton in
// its "request id=..." stdout lines (with the prompt_tokens it counted).
// The SDK runs on a fetch that opens a fresh connection per request, so
// SO_REUSEPORT spreads requests over sluice's shards: what must stick
// sticks across shards, not within one connection.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, mock_prompt_tokens, poll, read_audit, run_pool, samples, scrape } from './lib/gateway.mjs';
import { bound_ms, start_mock_triton, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';

const key = 'sk-adapters-all-5c2e81';
const tpm_key = 'sk-adapters-tpm-90d4a7';
const reply_tokens = 10;
const tpm = 3000;

// A fetch for the SDK: one request per connection (node:http, no agent
// reuse), the reply as a web Response whose body streams.
function fresh_fetch(url, init = {}) {
  return new Promise((resolve, reject) => {
    const headers = {};
    new Headers(init.headers ?? {}).forEach((v, k) => { headers[k] = v; });
    const req = http.request(url, { method: init.method ?? 'GET', headers, agent: false }, (res) => {
      const h = new Headers();
      for (let i = 0; i < res.rawHeaders.length; i += 2) h.append(res.rawHeaders[i], res.rawHeaders[i + 1]);
      const empty = res.statusCode === 204 || res.statusCode === 304;
      resolve(new Response(empty ? null : Readable.toWeb(res), { status: res.statusCode, headers: h }));
    });
    req.on('error', reject);
    const signal = init.signal;
    if (signal) {
      if (signal.aborted) req.destroy(signal.reason);
      else signal.addEventListener('abort', () => req.destroy(signal.reason), { once: true });
    }
    req.end(init.body ?? undefined);
  });
}

const sdk_of = (sluice, api_key = key) =>
  new OpenAI({ apiKey: api_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000), fetch: fresh_fetch });

const reply_text = (n) => Array.from({ length: n }, (_, i) => `tok${i}`).join(' ');

const messages = (user, { system = 'You are a careful assistant.', turns = [] } = {}) => [
  ...(system === null ? [] : [{ role: 'system', content: system }]), { role: 'user', content: user }, ...turns];

// One chat completion through the SDK, stream or not. Returns {id, text,
// finish, usage, headers, first_at, end_at}; rejects as the SDK does.
async function ask(sdk, body, { id, session, stream = false, on_first } = {}) {
  const headers = {};
  if (id !== undefined) headers['x-request-id'] = id;
  if (session !== undefined) headers['x-session-id'] = session;
  const { data, response } = await sdk.chat.completions.create({ ...body, stream }, { headers }).withResponse();
  if (!stream) {
    return { id, text: data.choices[0].message.content, finish: data.choices[0].finish_reason, usage: data.usage,
             headers: response.headers, end_at: performance.now() };
  }
  let text = '';
  let finish = null;
  let first_at = null;
  for await (const chunk of data) {
    if (first_at === null) {
      first_at = performance.now();
      on_first?.();
    }
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { id, text, finish, headers: response.headers, first_at, end_at: performance.now() };
}

// ---------------------------------------------------------------------------
// The backends of each protocol, and how each says what it served.

// mock-vllm for both HTTP protocols: `target` is where the adapter sends.
function http_fleet(protocol, target, fail_status) {
  return {
    protocol,
    backend_model: undefined,
    start: (i, o = {}) => start_mock_vllm({ model: `backend-${i}`, reply_tokens, tokens_per_sec: o.tokens_per_sec,
                                            ttft_ms: o.ttft_ms, extra_args: o.fail ? ['--fail-status', String(fail_status)] : [] }),
    // id -> {backend, prompt_tokens} for the client requests each recorded.
    async served(backends) {
      const out = new Map();
      for (const [i, b] of backends.entries()) {
        for (const r of await b.requests()) {
          if (r.target !== target) continue;
          const id = r.headers.find(([n]) => n.toLowerCase() === 'x-request-id')?.[1];
          // mock-vllm's count (tools/mock-vllm --help): the Messages API
          // counts the system prompt as one message, as chat does.
          const body = JSON.parse(r.body);
          const as_chat = target === '/v1/messages'
            ? { messages: [...(body.system ? [{ content: body.system.map((s) => s.text).join(' ') }] : []), ...body.messages] }
            : body;
          if (id !== undefined) out.set(id, { backend: i, prompt_tokens: mock_prompt_tokens(as_chat) });
        }
      }
      return out;
    },
  };
}

const fleets = {
  openai: http_fleet('openai', '/v1/chat/completions', 503),
  // Anthropic's "overloaded".
  anthropic: http_fleet('anthropic', '/v1/messages', 529),
  triton: {
    protocol: 'triton',
    backend_model: 'mock-model',
    // 14: UNAVAILABLE.
    start: (i, o = {}) => start_mock_triton({ reply_tokens, tokens_per_sec: o.tokens_per_sec, ttft_ms: o.ttft_ms,
                                              fail_status: o.fail ? 14 : undefined }),
    async served(backends) {
      const out = new Map();
      for (const [i, b] of backends.entries()) {
        for (const l of b.proc.lines) {
          const m = l.stream === 'stdout' && l.text.match(/^request id=(\S+) .*prompt_tokens=(\d+)/);
          if (m) out.set(m[1], { backend: i, prompt_tokens: Number(m[2]) });
        }
      }
      return out;
    },
  },
};

// Polls until every id is in `fleet.served(backends)`; resolves with the map.
async function served_all(fleet, backends, ids) {
  let map = new Map();
  try {
    await poll(async () => {
      map = await fleet.served(backends);
      return ids.every((id) => map.has(id));
    }, { timeout_ms: bound_ms(5000), what: 'every request seen by a backend' });
  } catch (err) {
    throw new Error(`${err.message}; not seen: ${ids.filter((id) => !map.has(id)).slice(0, 5)}`);
  }
  return map;
}

// Map value -> Set of backends.
function backends_by(ids, served, key_of) {
  const map = new Map();
  for (const id of ids) {
    const k = key_of(id);
    if (!map.has(k)) map.set(k, new Set());
    map.get(k).add(served.get(id).backend);
  }
  return map;
}

async function reload(sluice, toml) {
  fs.writeFileSync(path.join(sluice.dir, 'sluice.toml'), toml);
  const from = sluice.proc.mark();
  sluice.proc.child.kill('SIGHUP');
  const said = await sluice.proc.wait_for_line(/SIGHUP: (reloaded|.*the running config stays)/, { from, timeout_ms: bound_ms(5000) });
  return said.line.text;
}

const audit_of = (sluice) => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));

async function audit_lines(sluice, ids) {
  return poll(() => {
    const lines = audit_of(sluice).filter((l) => ids.includes(l.request_id));
    return lines.length === ids.length ? lines : null;
  }, { timeout_ms: bound_ms(5000), what: `audit lines of ${ids.length} requests` });
}

// ---------------------------------------------------------------------------

for (const protocol of ['openai', 'anthropic', 'triton']) {
  describe(`protocol = "${protocol}": auth, routing, quota, audit, metrics, retries, reload`, () => {
    const fleet = fleets[protocol];
    const p = protocol;
    let main;      // 3 fast backends: auth, routing, audit, metrics, models
    let slow;      // 3 backends holding each request ~70 ms: bounded load
    let long;      // 1 backend whose streams last ~1 s: quota, streams across a reload
    let failing;   // answers every request with its protocol's "unavailable"
    let added;     // started by the reload test
    let sluice;
    let sdk;
    const all = () => [...(main ?? []), ...(slow ?? []), long, failing, added];

    const config = ({ grow = [] } = {}) => {
      const group = (name, backends, extra) => ({
        name, models: [`${p}-${name}`], protocol, backend_model: fleet.backend_model, backends: backends.map((b) => b.url), ...extra,
      });
      return gateway_config({
        tables: { upstream: { max_retries: 1 }, health: { interval_ms: 0 }, quota: { input_weight: 1, output_weight: 2 } },
        groups: [
          // bounded_load = 0: the ring alone decides (bounded load has its own group).
          group('main', main, { models: [`${p}-main`, `${p}-main-alias`], balance: 'session', bounded_load: 0 }),
          group('bounded', slow, { balance: 'session', bounded_load: 1.25 }),
          group('retry', [failing, main[0]], { balance: 'round-robin' }),
          group('grow', [long, ...grow], { balance: 'session', bounded_load: 0 }),
          group('quota', [long], {}),
        ],
        keys: [{ id: 'all', key, groups: ['*'] }, { id: 'tpm', key: tpm_key, tokens_per_minute: tpm, groups: ['quota'] }],
      });
    };

    before(async () => {
      main = [];
      slow = [];
      for (let i = 0; i < 3; ++i) main.push(await fleet.start(i));
      // ~20 ms to the first token, then 5 tokens at 100/s.
      for (let i = 0; i < 3; ++i) slow.push(await fleet.start(i, { ttft_ms: 20, tokens_per_sec: 100 }));
      long = await fleet.start(0, { tokens_per_sec: 10 });
      failing = await fleet.start(9, { fail: true });
      sluice = await start_sluice({ config: config() });
      sdk = sdk_of(sluice);
    });
    after(() => stop_all(sluice, ...all()));

    it('no key or a wrong key: 401, and nothing reaches a backend', async () => {
      const before_ids = await fleet.served(main);
      const body = { model: `${p}-main`, messages: messages('Who goes there?'), max_tokens: 3 };
      const wrong = sdk_of(sluice, 'sk-not-a-key');
      const attempts = [
        ['wrong key', () => ask(wrong, body, { id: `${p}-auth-wrong` })],
        ['wrong key, stream', () => ask(wrong, body, { id: `${p}-auth-wrong-s`, stream: true })],
        ['no key', () => sdk.chat.completions.create(body, { headers: { authorization: null, 'x-request-id': `${p}-auth-none` } })],
        ['no key, stream', () => sdk.chat.completions.create({ ...body, stream: true },
                                                             { headers: { authorization: null, 'x-request-id': `${p}-auth-none-s` } })],
      ];
      for (const [what, call] of attempts) {
        await assert.rejects(call(), (err) => {
          assert.equal(err.status, 401, `${what}: ${err}`);
          assert.ok(err instanceof OpenAI.AuthenticationError, what);
          return true;
        });
      }
      // A good request after them: once it is seen, anything sent before it would be too.
      await ask(sdk, body, { id: `${p}-auth-ok` });
      const now = await served_all(fleet, main, [`${p}-auth-ok`]);
      const new_ids = [...now.keys()].filter((id) => !before_ids.has(id));
      assert.deepEqual(new_ids, [`${p}-auth-ok`], 'only the authorized request reached a backend');
    });

    it('GET /v1/models lists the group\'s model names', async () => {
      const ids = [];
      for await (const m of sdk.models.list()) ids.push(m.id);
      for (const name of ['main', 'main-alias', 'bounded', 'retry', 'grow', 'quota']) {
        assert.ok(ids.includes(`${p}-${name}`), `${p}-${name} in ${ids}`);
      }
      const one = await sdk.models.retrieve(`${p}-main-alias`);
      assert.equal(one.id, `${p}-main-alias`);
    });

    it('one X-Session-ID sticks to one backend over 50 requests on fresh connections; 30 sessions use all 3', async () => {
      const sticky = Array.from({ length: 50 }, (_, i) => `${p}-sticky-${i}`);
      const replies = await run_pool(50, 10, (i) => ask(sdk, {
        model: `${p}-main`, messages: messages(`question ${i}`, { system: `system ${i % 7}` }), max_tokens: 2,
      }, { id: sticky[i], session: `${p}-the-session`, stream: i % 2 === 1 }));
      for (const r of replies) assert.equal(r.text, reply_text(2));
      const spread = Array.from({ length: 30 }, (_, i) => `${p}-spread-${i}`);
      await run_pool(30, 10, (i) => ask(sdk, { model: `${p}-main`, messages: messages('Same question.'), max_tokens: 2 },
                                        { id: spread[i], session: `${p}-session-${i}` }));
      const served = await served_all(fleet, main, [...sticky, ...spread]);
      assert.equal(new Set(sticky.map((id) => served.get(id).backend)).size, 1,
                   `the session reached backends ${sticky.map((id) => served.get(id).backend)}`);
      const by_session = backends_by(spread, served, (id) => id);
      assert.equal(new Set([...by_session.values()].map((s) => [...s][0])).size, 3,
                   `30 sessions used backends ${spread.map((id) => served.get(id).backend)}`);
    });

    it('no session id: one system prompt and first user message stay on one backend; distinct ones spread', async () => {
      const same = Array.from({ length: 20 }, (_, i) => `${p}-prefix-${i}`);
      await run_pool(20, 10, (i) => ask(sdk, {
        model: `${p}-main`, max_tokens: 1 + (i % 3),
        messages: messages('The same first question.', { system: 'Shared system prompt.',
                                                          turns: [{ role: 'assistant', content: `answer ${i}` }, { role: 'user', content: `follow-up ${i}` }] }),
      }, { id: same[i] }));
      const distinct = Array.from({ length: 30 }, (_, i) => `${p}-distinct-${i}`);
      await run_pool(30, 10, (i) => ask(sdk, { model: `${p}-main`, messages: messages(`distinct opening question ${i}`), max_tokens: 1 },
                                        { id: distinct[i] }));
      const served = await served_all(fleet, main, [...same, ...distinct]);
      assert.equal(new Set(same.map((id) => served.get(id).backend)).size, 1, `backends: ${same.map((id) => served.get(id).backend)}`);
      assert.equal(new Set(distinct.map((id) => served.get(id).backend)).size, 3,
                   `backends: ${distinct.map((id) => served.get(id).backend)}`);
    });

    it('bounded_load = 1.25 spills a hot session off its loaded backend; unloaded, it sticks', async () => {
      const alone = Array.from({ length: 8 }, (_, i) => `${p}-alone-${i}`);
      for (const [i, id] of alone.entries()) {
        await ask(sdk, { model: `${p}-bounded`, messages: messages(`alone ${i}`), max_tokens: 5 }, { id, session: `${p}-hot` });
      }
      // 10 lanes of the hot session, one lane each for 10 others, 10 requests per lane, all at once.
      const lanes = [];
      for (let l = 0; l < 10; ++l) lanes.push({ session: `${p}-hot`, tag: `hot-${l}` });
      for (let c = 0; c < 10; ++c) lanes.push({ session: `${p}-cold-${c}`, tag: `cold-${c}` });
      const hot = [];
      await Promise.all(lanes.map(async ({ session, tag }) => {
        for (let i = 0; i < 10; ++i) {
          const id = `${p}-${tag}-${i}`;
          const r = await ask(sdk, { model: `${p}-bounded`, messages: messages(`${tag} ${i}`), max_tokens: 5 }, { id, session });
          assert.equal(r.text, reply_text(5));
          if (session === `${p}-hot`) hot.push(id);
        }
      }));
      const served = await served_all(fleet, slow, [...alone, ...hot]);
      assert.equal(new Set(alone.map((id) => served.get(id).backend)).size, 1, 'one at a time, the hot session sticks');
      const counts = [0, 0, 0];
      for (const id of hot) counts[served.get(id).backend] += 1;
      const spilled = hot.length - Math.max(...counts);
      assert.ok(spilled >= 10, `only ${spilled} of ${hot.length} hot requests spilled: ${counts}`);
    });

    it('audit: one line per request with the backend\'s prompt and completion tokens, stream and not', async () => {
      const ids = Array.from({ length: 6 }, (_, i) => `${p}-audit-${i}`);
      const max = [3, 7, 20, 4, 9, 15];
      const replies = await run_pool(6, 3, (i) => ask(sdk, {
        model: `${p}-main`, messages: messages(`audit me number ${i} with ${'word '.repeat(i)}`), max_tokens: max[i],
      }, { id: ids[i], stream: i % 2 === 1 }));
      const served = await served_all(fleet, main, ids);
      const lines = await audit_lines(sluice, ids);
      for (const [i, id] of ids.entries()) {
        const l = lines.filter((x) => x.request_id === id);
        assert.equal(l.length, 1, `${id}: one line`);
        const want_completion = Math.min(reply_tokens, max[i]);
        assert.equal(replies[i].text, reply_text(want_completion));
        assert.equal(l[0].status, 200);
        assert.equal(l[0].group, 'main');
        assert.equal(l[0].stream, i % 2 === 1);
        assert.equal(l[0].backend, main[served.get(id).backend].url);
        assert.equal(l[0].prompt_tokens, served.get(id).prompt_tokens, `${id}: prompt tokens as the backend counted`);
        assert.equal(l[0].completion_tokens, want_completion, `${id}: completion tokens`);
        if (i % 2 === 0) assert.deepEqual([replies[i].usage.prompt_tokens, replies[i].usage.completion_tokens],
                                          [l[0].prompt_tokens, l[0].completion_tokens]);
      }
    });

    it('metrics: requests and tokens of the group; every backend series carries protocol', async () => {
      let m;
      let want;
      await poll(async () => {
        m = await scrape(sluice.admin_url);
        const lines = audit_of(sluice).filter((l) => l.group === 'main' && l.status === 200);
        want = {
          requests: lines.length,
          prompt: lines.reduce((a, l) => a + l.prompt_tokens, 0),
          completion: lines.reduce((a, l) => a + l.completion_tokens, 0),
        };
        const sum = (name, labels) => samples(m.parsed, name, labels).reduce((a, s) => a + s.value, 0);
        const got = {
          requests: sum('sluice_requests_total', { group: 'main', code: '200' }),
          prompt: sum('sluice_tokens_total', { group: 'main', kind: 'prompt' }),
          completion: sum('sluice_tokens_total', { group: 'main', kind: 'completion' }),
        };
        return want.requests > 0 && JSON.stringify(got) === JSON.stringify(want);
      }, { timeout_ms: bound_ms(5000), what: 'sluice_requests_total and sluice_tokens_total of group main to match the audit' });
      for (const s of samples(m.parsed, 'sluice_requests_total')) {
        assert.equal(s.labels.protocol, s.labels.backend === '' ? '' : protocol, JSON.stringify(s.labels));
      }
      for (const b of main) {
        assert.ok(samples(m.parsed, 'sluice_requests_total', { group: 'main', backend: b.url, protocol, code: '200' })[0]?.value > 0,
                  `sluice_requests_total{backend="${b.url}",protocol="${protocol}"}`);
      }
      for (const b of [...main, ...slow, long, failing]) {
        assert.deepEqual(samples(m.parsed, 'sluice_backend_up', { backend: b.url }).map((s) => [s.labels.protocol, s.value]),
                         [[protocol, 1]], `sluice_backend_up ${b.url}`);
        assert.deepEqual(samples(m.parsed, 'sluice_backend_draining', { backend: b.url }).map((s) => [s.labels.protocol, s.value]),
                         [[protocol, 0]], `sluice_backend_draining ${b.url}`);
      }
    });

    it('quota: reserved at admission (estimate x 1 + max_tokens x 2), settled on the backend\'s counts', async () => {
      const q = sdk_of(sluice, tpm_key);
      const body = (max_tokens) => ({ model: `${p}-quota`, messages: messages('Count for me.', { system: null }), max_tokens });
      // Too large for the bucket: refused, and the message says what it reserves.
      const requested = [];
      for (const max_tokens of [1600, 1700]) {
        await assert.rejects(ask(q, body(max_tokens)), (err) => {
          assert.equal(err.status, 429, String(err));
          assert.equal(err.headers.get('x-should-retry'), 'false');
          requested.push(Number(err.message.match(/Requested (\d+)/)?.[1]));
          return true;
        });
      }
      const estimate = requested[0] - 2 * 1600;
      assert.ok(estimate > 0 && estimate < 50, `input estimate ${estimate} (requested ${requested})`);
      assert.equal(requested[1] - 2 * 1700, estimate, 'each max_tokens costs 2');
      const reserve = estimate + 2 * 1000;

      // A holds its reservation while it streams (~1 s); B does not fit beside it.
      let streaming;
      const first = new Promise((resolve) => { streaming = resolve; });
      const a = ask(q, body(1000), { id: `${p}-quota-a`, stream: true, on_first: () => streaming() });
      await first;
      await assert.rejects(ask(q, body(1000), { id: `${p}-quota-b` }), (err) => {
        assert.equal(err.status, 429, String(err));
        assert.equal(err.error?.type, 'tokens');
        assert.ok(Number(err.headers.get('x-ratelimit-remaining-tokens')) < reserve, 'A\'s reservation is held');
        return true;
      });
      const b_refused_at = performance.now();
      const ra = await a;
      assert.ok(b_refused_at < ra.end_at, 'B was refused while A was in flight');
      assert.equal(ra.text, reply_text(reply_tokens));
      assert.ok(Number(ra.headers.get('x-ratelimit-remaining-tokens')) <= tpm - reserve + 1, 'A\'s answer shows its reservation');

      // A settles on what the backend counted: its audit line says so.
      const [la] = await audit_lines(sluice, [`${p}-quota-a`]);
      const served = await served_all(fleet, [long], [`${p}-quota-a`]);
      assert.equal(la.prompt_tokens, served.get(`${p}-quota-a`).prompt_tokens);
      assert.equal(la.completion_tokens, reply_tokens);
      const real = la.prompt_tokens + 2 * la.completion_tokens;
      assert.equal(la.quota_charged, real, 'charged the real usage, not the reservation');

      // C fits again: the bucket holds what A really used, not its reservation.
      // Its answer's head comes once the backend has generated (~1 s), so
      // the bucket has refilled by up to tpm / 60 per second meanwhile.
      const c_sent_at = performance.now();
      const rc = await ask(q, body(1000), { id: `${p}-quota-c` });
      const refill = Math.ceil((tpm / 60000) * (rc.end_at - c_sent_at)) + 1;
      const remaining = Number(rc.headers.get('x-ratelimit-remaining-tokens'));
      assert.ok(remaining >= tpm - real - reserve - 1 && remaining <= tpm - reserve + refill,
                `remaining ${remaining}: ${tpm} - A's ${real} - C's reservation ${reserve}, refilled by at most ${real} + ${refill}`);
    });

    it('a backend failing before the first byte: every request is retried on the healthy one', async () => {
      const before_m = await scrape(sluice.admin_url);
      const retries = (m) => samples(m.parsed, 'sluice_upstream_retries_total')[0]?.value ?? 0;
      const replies = await run_pool(12, 4, (i) => ask(sdk, { model: `${p}-retry`, messages: messages(`retry ${i}`), max_tokens: 4 },
                                                       { id: `${p}-retry-${i}`, stream: i % 2 === 1 }));
      for (const r of replies) assert.equal(r.text, reply_text(4));
      // All 12 were answered by the healthy backend.
      await served_all(fleet, [main[0]], replies.map((r) => r.id));
      const m = await scrape(sluice.admin_url);
      // Round-robin over two: about half went to the failing one first.
      assert.ok(retries(m) - retries(before_m) >= 3, `retries ${retries(before_m)} -> ${retries(m)}`);
    });

    it('SIGHUP adding a backend: streams in flight finish, new sessions reach it', async () => {
      added = await fleet.start(5);
      const streams = Array.from({ length: 4 }, (_, i) => {
        let first;
        const streaming = new Promise((resolve) => { first = resolve; });
        const result = ask(sdk, { model: `${p}-grow`, messages: messages(`long ${i}`), max_tokens: reply_tokens },
                           { id: `${p}-grow-long-${i}`, session: `${p}-long-${i}`, stream: true, on_first: () => first() });
        result.then(() => first(), () => first());
        return { streaming, result };
      });
      await Promise.all(streams.map((s) => s.streaming));
      assert.match(await reload(sluice, config({ grow: [added] })), /SIGHUP: reloaded/);
      const reloaded_at = performance.now();
      const done = await Promise.all(streams.map((s) => s.result));
      for (const r of done) {
        assert.equal(r.text, reply_text(reply_tokens));
        assert.ok(r.finish, 'the stream ends with its finish reason');
        assert.ok(r.end_at > reloaded_at, 'the stream was in flight across the reload');
      }
      // New sessions: some reach the new backend (half of them, on average).
      const ids = Array.from({ length: 16 }, (_, i) => `${p}-grow-new-${i}`);
      await run_pool(16, 8, (i) => ask(sdk, { model: `${p}-grow`, messages: messages(`new ${i}`), max_tokens: 1 },
                                       { id: ids[i], session: `${p}-new-session-${i}` }));
      const served = await served_all(fleet, [long, added], ids);
      assert.ok(ids.some((id) => served.get(id).backend === 1), `new sessions: ${ids.map((id) => served.get(id).backend)}`);
      const { parsed } = await scrape(sluice.admin_url);
      assert.deepEqual(samples(parsed, 'sluice_backend_up', { backend: added.url }).map((s) => [s.labels.protocol, s.value]),
                       [[protocol, 1]]);
    });
  });
}
