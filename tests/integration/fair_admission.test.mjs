// Fair admission (issue 43, docs/architecture.md §2c): a group with admission = "fair"
// runs at most max_inflight_per_backend requests per backend; the rest wait
// at the gateway and are released by virtual token counters, priority
// first. mock-vllm's capacity model (--max-running) stands for vLLM's
// scheduler; what the backend saw, in the order it saw it, is its
// /debug/requests. Each request is sent once the one before it is known to
// be queued (sluice_admission_queue_depth), so the arrival order is a fact,
// not a timing.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { gateway_config, poll, post_fresh, read_audit, samples, scrape } from './lib/gateway.mjs';
import { run_program } from './lib/h2_gateway.mjs';
import { bound_ms, http_post, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';

const keys = [
  { id: 'alice', key: 'sk-fair-alice', groups: ['*'] },
  { id: 'bob', key: 'sk-fair-bob', groups: ['*'] },
  { id: 'heavy', key: 'sk-fair-heavy', groups: ['*'], weight: 3 },
  { id: 'urgent', key: 'sk-fair-urgent', groups: ['*'], priority: 1 },
];
const key_of = Object.fromEntries(keys.map((k) => [k.id, k.key]));

// mock-vllm answers min(max_tokens, --reply-tokens) tokens.
const body = (tag, extra = {}) => ({ model: 'm', max_tokens: 10, messages: [{ role: 'user', content: `request ${tag}` }], ...extra });
// The request that holds the slot while the others queue: 3 s at 100 tokens/s.
const long = { max_tokens: 300 };

async function metric(admin_url, name, labels = {}) {
  const { parsed } = await scrape(admin_url);
  return samples(parsed, name, labels)[0]?.value ?? 0;
}

// The tags of the requests the backend received, in the order received.
async function backend_order(mock) {
  return (await mock.requests()).filter((r) => r.target === '/v1/chat/completions')
    .map((r) => /request (\S+)/.exec(JSON.parse(r.body).messages[0].content)[1]);
}

// Starts a gateway on one shard in front of `mock`, with `group` settings.
async function gateway(mock, group, server = {}) {
  const config = gateway_config({
    tables: { server: { cpus: '0', ...server } },
    groups: [{ name: 'g', models: ['*'], backends: [mock.url], admission: 'fair', ...group }],
    keys,
  });
  return start_sluice({ config });
}

describe('fair admission on one backend', () => {
  let mock, sluice;
  const audit = () => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
  const depth = () => metric(sluice.admin_url, 'sluice_admission_queue_depth', { group: 'g' });
  // Sends a request of `key` and waits until sluice holds it: running on
  // the backend (running = n) or queued (depth = n). Returns [its reply].
  async function send(key, tag, { running, queued, extra, target, headers } = {}) {
    const reply = post_fresh(sluice.url, body(tag, extra), { key: key_of[key], target, headers, timeout_ms: bound_ms(30000) });
    if (running !== undefined) {
      await poll(async () => (await backend_order(mock)).length === running, { what: `${tag} on the backend` });
    }
    if (queued !== undefined) await poll(async () => (await depth()) === queued, { what: `${tag} queued (depth ${queued})` });
    return [reply];  // in an array: an async function's promise would adopt the reply's and wait for it
  }

  before(async () => {
    // 100 tokens/s: 0.1 s a request of 10 tokens; the backend could run 8 at once.
    mock = await start_mock_vllm({ tokens_per_sec: 100, reply_tokens: 300, extra_args: ['--max-running', '8'] });
    sluice = await gateway(mock, { max_inflight_per_backend: 1, queue_timeout_ms: 20000 });
  });
  after(() => stop_all(sluice, mock));

  it('one slot: the backend runs one request at a time, and a key that arrives later is served before the backlog of another', async () => {
    await mock.clear_requests();
    const replies = [...await send('alice', 'a1', { running: 1, extra: long })];
    for (let i = 2; i <= 5; ++i) replies.push(...await send('alice', `a${i}`, { queued: i - 1 }));
    const queued_before_bob = await depth();
    replies.push(...await send('bob', 'b1', { queued: queued_before_bob + 1 }));
    replies.push(...await send('bob', 'b2', { queued: queued_before_bob + 2 }));
    const all = await Promise.all(replies);
    for (const r of all) assert.equal(r.status, 200, r.text);
    const order = await backend_order(mock);
    assert.equal(order.length, 7);
    // First come first served would give a1..a5, b1, b2. Bob's counter is
    // lifted to alice's when he arrives, and alice's grows with every
    // request she is served: bob's two come before alice's last two.
    assert.ok(order.indexOf('b1') < order.indexOf('a4'), order.join(' '));
    assert.ok(order.indexOf('b2') < order.indexOf('a5'), order.join(' '));
    // One at a time: the mock never had a second request waiting or running.
    const lines = await poll(() => { const l = audit(); return l.length === 7 && l; }, { what: 'seven audit lines' });
    assert.equal(lines.filter((l) => l.queued_ms !== undefined).length, 6, 'every request but the first waited');
    for (const l of lines) if (l.queued_ms !== undefined) assert.ok(l.queued_ms >= 0 && l.queued_ms < bound_ms(20000));
    assert.equal(await depth(), 0);
    assert.equal(await metric(sluice.admin_url, 'sluice_admission_wait_seconds_count', { group: 'g' }), 6);
    const alice = await (await fetch(`${sluice.admin_url}/keys/alice`)).json();
    assert.equal(alice.admission.queued, 4);
    assert.ok(alice.admission.queued_ms > 0);
    assert.equal(alice.served.requests, 5);
    // The status page's key table: queued requests, their mean wait, weight / priority.
    const status = await poll(async () => {
      const j = await (await fetch(`${sluice.admin_url}/status.json`)).json();
      return j.keys.find((k) => k.id === 'alice')?.queued === 4 && j;
    }, { what: 'the sampled key rows' });
    const row = (id) => status.keys.find((k) => k.id === id);
    assert.ok(row('alice').queued_ms_mean > 0);
    assert.equal(row('bob').queued, 2);
    assert.deepEqual([row('heavy').weight, row('heavy').priority, row('urgent').priority], [3, 0, 1]);
    const page = await (await fetch(`${sluice.admin_url}/`)).text();
    assert.match(page, /<th>queued<\/th><th>mean wait ms<\/th><th>weight \/ priority<\/th>/);
  });

  it('weights: a key of weight 3 is released about three times as often as a key of weight 1 while both wait', async () => {
    await mock.clear_requests();
    const replies = [...await send('alice', 'w0', { running: 1, extra: long })];
    // Interleaved arrivals: first come first served would alternate.
    for (let i = 0; i < 8; ++i) {
      replies.push(...await send('heavy', `h${i}`, { queued: 2 * i + 1 }));
      replies.push(...await send('bob', `b${i}`, { queued: 2 * i + 2 }));
    }
    for (const r of await Promise.all(replies)) assert.equal(r.status, 200, r.text);
    const order = (await backend_order(mock)).slice(1, 9);  // the first 8 released while both keys wait
    const heavy = order.filter((t) => t.startsWith('h')).length;
    assert.ok(heavy >= 5 && heavy <= 7, `weight 3 against 1 in the first 8 releases: ${order.join(' ')}`);
  });

  it('priority: a priority-1 key goes before every priority-0 waiter', async () => {
    await mock.clear_requests();
    const replies = [...await send('alice', 'p0', { running: 1, extra: long })];
    for (let i = 1; i <= 3; ++i) replies.push(...await send('bob', `p${i}`, { queued: i }));
    replies.push(...await send('urgent', 'u1', { queued: 4 }));
    for (const r of await Promise.all(replies)) assert.equal(r.status, 200, r.text);
    const order = await backend_order(mock);
    assert.equal(order[1], 'u1', order.join(' '));
  });

  it('a client that leaves while queued is dropped at once, audited 499, and never reaches the backend', async () => {
    await mock.clear_requests();
    const [first] = await send('alice', 'l0', { running: 1, extra: long });
    const agent = new http.Agent({ keepAlive: false });
    let request;
    const left = http_post(sluice.url, '/v1/chat/completions', body('l1'), {
      agent, headers: { authorization: `Bearer ${key_of.bob}`, 'x-request-id': 'fair-left-1' }, on_request: (r) => { request = r; },
    }).catch((err) => err);
    await poll(async () => (await depth()) === 1, { what: 'l1 queued' });
    request.destroy();
    await left;
    await poll(async () => (await depth()) === 0, { what: 'the queue to drop it' });
    const line = await poll(() => audit().find((l) => l.request_id === 'fair-left-1'), { what: 'its audit line' });
    assert.equal(line.status, 499);
    assert.equal(line.cancelled, true);
    assert.ok(line.queued_ms >= 0);
    assert.equal(line.backend, null);
    const [after_it] = await send('bob', 'l2', {});
    assert.equal((await first).status, 200);
    assert.equal((await after_it).status, 200);
    assert.deepEqual(await backend_order(mock), ['l0', 'l2']);
    agent.destroy();
  });
});

describe('fair admission: bounds and answers', () => {
  let mock, sluice;
  const audit = () => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
  const depth = () => metric(sluice.admin_url, 'sluice_admission_queue_depth', { group: 'g' });

  before(async () => {
    // A long request holds the slot for 3 s at 100 tokens/s; a queued one
    // gives up after 1 s.
    mock = await start_mock_vllm({ tokens_per_sec: 100, reply_tokens: 300, extra_args: ['--max-running', '8'] });
    sluice = await gateway(mock, { max_inflight_per_backend: 1, queue_timeout_ms: 1000, queue_max: 1 });
  });
  after(() => stop_all(sluice, mock));

  it('queue_timeout_ms: 429 queue_timeout with retry-after, in the OpenAI shape on chat and Anthropic\'s on /v1/messages', async () => {
    const first = post_fresh(sluice.url, body('t0', long), { key: key_of.alice });
    await poll(async () => (await backend_order(mock)).length === 1, { what: 't0 on the backend' });
    const chat = await post_fresh(sluice.url, body('t1'), { key: key_of.bob, headers: { 'x-request-id': 'fair-timeout-1' } });
    assert.equal(chat.status, 429);
    assert.equal(JSON.parse(chat.text).error.code, 'queue_timeout');
    assert.match(JSON.parse(chat.text).error.message, /waited \d+ ms for a slot/);
    assert.equal(chat.headers['retry-after'], '1');
    const messages = await post_fresh(sluice.url, { model: 'm', max_tokens: 16, messages: [{ role: 'user', content: 'request t2' }] },
      { target: '/v1/messages', headers: { 'x-api-key': key_of.bob } });
    assert.equal(messages.status, 429);
    const m = JSON.parse(messages.text);
    assert.equal(m.type, 'error');
    assert.equal(m.error.type, 'rate_limit_error');
    assert.ok(messages.headers['retry-after']);
    assert.equal((await first).status, 200);
    const line = await poll(() => audit().find((l) => l.request_id === 'fair-timeout-1'), { what: 'its audit line' });
    assert.equal(line.status, 429);
    assert.equal(line.error, 'queue_timeout');
    assert.ok(line.queued_ms >= 1000, `queued ${line.queued_ms} ms`);
    const backend = await backend_order(mock);
    assert.ok(!backend.includes('t1') && !backend.includes('t2'), 'a refused request is never forwarded');
  });

  it('queue_max: past it a request is refused at once with 429 queue_full', async () => {
    await mock.clear_requests();
    const first = post_fresh(sluice.url, body('q0', long), { key: key_of.alice });
    await poll(async () => (await backend_order(mock)).length === 1, { what: 'q0 on the backend' });
    // One waits (queue_max = 1) until it times out; the next finds the queue full.
    const waiting = post_fresh(sluice.url, body('q1'), { key: key_of.alice });
    await poll(async () => (await depth()) === 1, { what: 'q1 queued' });
    const refused = await post_fresh(sluice.url, body('q2'), { key: key_of.bob });
    assert.equal(refused.status, 429);
    assert.equal(JSON.parse(refused.text).error.code, 'queue_full');
    assert.equal(await depth(), 1, 'refused before it waited: q1 still waits');
    assert.equal((await waiting).status, 429);
    assert.equal((await first).status, 200);
  });
});

describe('fair admission: slots follow the backends', () => {
  let mocks = [], sluice;
  const depth = () => metric(sluice.admin_url, 'sluice_admission_queue_depth', { group: 'g' });
  const config = (slots) => gateway_config({
    tables: { server: { cpus: '0' } },
    groups: [{ name: 'g', models: ['*'], balance: 'round-robin', backends: mocks.map((m) => m.url), admission: 'fair',
               max_inflight_per_backend: slots, queue_timeout_ms: 20000 }],
    keys,
  });

  before(async () => {
    mocks = [await start_mock_vllm({ tokens_per_sec: 50, reply_tokens: 25, extra_args: ['--max-running', '8'] }),
             await start_mock_vllm({ tokens_per_sec: 50, reply_tokens: 25, extra_args: ['--max-running', '8'] })];
    sluice = await start_sluice({ config: config(1) });
  });
  after(() => stop_all(sluice, ...mocks));

  it('a backend that fails mid-stream gives its slot back: every queued request is served', async () => {
    for (const m of mocks) await m.clear_requests();
    const fail = { 'x-mock-fail-after-tokens': '3' };
    const replies = [];
    for (let i = 0; i < 6; ++i) {
      replies.push(post_fresh(sluice.url, body(`f${i}`, { stream: true }), { key: key_of.alice, headers: fail, timeout_ms: bound_ms(20000) }));
    }
    const all = await Promise.all(replies);
    for (const r of all) assert.notEqual(r.status, 0, 'every request was answered');
    const seen = (await backend_order(mocks[0])).length + (await backend_order(mocks[1])).length;
    assert.equal(seen, 6, 'all six reached a backend, two at a time');
    assert.equal(await depth(), 0);
    for (const m of mocks) {
      assert.equal(await metric(sluice.admin_url, 'sluice_backend_inflight', { backend: m.url }), 0);
    }
  });

  it('a drained backend takes no new request: its slots leave the group, the other backend serves the queue', async () => {
    for (const m of mocks) await m.clear_requests();
    const drained = await fetch(`${sluice.admin_url}/backends/drain?url=${encodeURIComponent(mocks[0].url)}`, { method: 'POST' });
    assert.equal(drained.status, 200);
    const replies = [];
    for (let i = 0; i < 3; ++i) replies.push(post_fresh(sluice.url, body(`d${i}`), { key: key_of.alice }));
    for (const r of await Promise.all(replies)) assert.equal(r.status, 200);
    assert.equal((await backend_order(mocks[0])).length, 0);
    assert.equal((await backend_order(mocks[1])).length, 3);
    const undrained = await fetch(`${sluice.admin_url}/backends/undrain?url=${encodeURIComponent(mocks[0].url)}`, { method: 'POST' });
    assert.equal(undrained.status, 200);
  });

  it('a reload that raises max_inflight_per_backend releases the queued requests into the new slots', async () => {
    for (const m of mocks) await m.clear_requests();
    const replies = [];
    for (let i = 0; i < 6; ++i) replies.push(post_fresh(sluice.url, body(`r${i}`), { key: key_of.alice, timeout_ms: bound_ms(20000) }));
    await poll(async () => (await depth()) === 4, { what: 'two running, four queued' });
    fs.writeFileSync(path.join(sluice.dir, 'sluice.toml'), config(3));
    const from = sluice.proc.mark();
    sluice.proc.child.kill('SIGHUP');
    await sluice.proc.wait_for_line(/SIGHUP: reloaded/, { from, timeout_ms: bound_ms(5000) });
    await poll(async () => (await depth()) === 0, { what: 'the queue to empty into three slots a backend' });
    const running = await Promise.all(mocks.map((m) => metric(sluice.admin_url, 'sluice_backend_inflight', { backend: m.url })));
    assert.ok(running[0] + running[1] === 6 || (await Promise.all(replies)).every((r) => r.status === 200), `running ${running}`);
    for (const r of await Promise.all(replies)) assert.equal(r.status, 200);
  });
});

describe('fair admission across 2 shards', () => {
  // Keys arriving on different shards: with reuseport_steering, a client
  // pinned to CPU i reaches shard i. Key A sends from both CPUs, key B from
  // CPU 1 only. Each shard owns 2 of the backend's 4 slots; what each
  // shard served reaches the other's counters, so shard 1 gives its slots
  // to B while A is served on shard 0: A and B are served alike. Without
  // the exchange shard 1 would split its slots between A and B, and A would
  // be served 3 times B's tokens.
  let mock, sluice, cpus;
  before(async () => {
    const r = await run_program('taskset', ['-cp', String(process.pid)]);
    cpus = [];
    for (const part of r.stdout.toString().split(':').at(-1).trim().split(',')) {
      const [a, b] = part.split('-').map(Number);
      for (let c = a; c <= (b ?? a); ++c) cpus.push(c);
    }
    cpus = cpus.slice(0, 2);
    mock = await start_mock_vllm({ tokens_per_sec: 200, reply_tokens: 32, extra_args: ['--max-running', '16'] });
    sluice = await start_sluice({ config: gateway_config({
      tables: { server: { cpus: cpus.join(','), reuseport_steering: true } },
      groups: [{ name: 'g', models: ['*'], backends: [mock.url], admission: 'fair', max_inflight_per_backend: 4, queue_timeout_ms: 20000 }],
      keys,
    }) });
  });
  after(() => stop_all(sluice, mock));

  it('a key on both shards and a key on one are served alike, and the backend never runs more than its 4 slots', async (t) => {
    if (cpus.length < 2) {
      t.skip('fewer than 2 cpus in this process\'s affinity mask');
      return;
    }
    const lanes_js = path.join(path.dirname(new URL(import.meta.url).pathname), 'lib', 'fair_lanes.mjs');
    const duration = bound_ms(6000);
    const lane = (cpu, key, n) => run_program('taskset', ['-c', String(cpu), process.execPath, lanes_js, String(sluice.port), key, String(n), String(duration)]);
    let most = 0, sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const text = await (await fetch(`${mock.url}/metrics`)).text();
        most = Math.max(most, Number(/^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$/m.exec(text)[1]));
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    const runs = await Promise.all([lane(cpus[0], key_of.alice, 6), lane(cpus[1], key_of.alice, 6), lane(cpus[1], key_of.bob, 6)]);
    sampling = false;
    await sampler;
    for (const r of runs) {
      assert.equal(r.code, 0, r.stderr.toString());
      assert.equal(JSON.parse(r.stdout.toString()).failed, 0);
    }
    const lines = await poll(() => {
      const l = read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
      const want = runs.reduce((a, r) => a + JSON.parse(r.stdout.toString()).answers, 0);
      return l.length >= want && l;
    }, { what: 'every answer audited' });
    const shard = (l) => parseInt(l.request_id.slice(0, 2), 16);
    assert.deepEqual([...new Set(lines.filter((l) => l.key_id === 'bob').map(shard))], [1], 'bob arrives on shard 1 only');
    assert.deepEqual([...new Set(lines.filter((l) => l.key_id === 'alice').map(shard))].sort(), [0, 1], 'alice on both');
    const tokens = (id) => lines.filter((l) => l.key_id === id && l.status === 200)
      .reduce((a, l) => a + l.prompt_tokens + 2 * l.completion_tokens, 0);
    const ratio = tokens('alice') / tokens('bob');
    assert.ok(ratio > 0.75 && ratio < 1.33, `alice:bob served ${ratio.toFixed(2)} (without the counters' exchange: about 3)`);
    assert.ok(most <= 4, `the backend ran ${most} at once`);
  });
});
