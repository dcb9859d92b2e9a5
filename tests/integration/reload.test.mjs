// Live reload (issue 3, docs/architecture.md §6): SIGHUP re-reads the config file. A
// valid file becomes every shard's snapshot without dropping a request in
// flight; an invalid one is logged with its line, counted, and the running
// config stays. Backends, groups and keys keep their identity across the
// reload (sessions stay put, pools and quota buckets carry on).
//
// Every mock-vllm backend i answers with model "backend-i", so each response
// says which backend served it. Requests use fresh connections so they
// spread over sluice's shards, and every shard must have taken the reload.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { bound_ms, is_openai_error, start_sluice, stop_all } from './lib/harness.mjs';
import {
  backend_of, gateway_config, poll, post_fresh, run_pool, samples, scrape, start_backends, until_idle,
} from './lib/gateway.mjs';

const key = 'sk-reload-all-6a1e93';

const chat = (user, { stream, max_tokens = 2 } = {}) => {
  const body = { model: 'm', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: user }], max_tokens };
  if (stream !== undefined) body.stream = stream;
  return body;
};

async function send(base_url, body, { session, api_key = key, on_data } = {}) {
  const headers = session === undefined ? {} : { 'x-session-id': session };
  const r = await post_fresh(base_url, body, { key: api_key, headers, on_data });
  return { ...r, backend: r.status === 200 ? backend_of(r.text) : -1, done: r.text.endsWith('data: [DONE]\n\n') };
}

// Starts a stream; `streaming` resolves once its first body bytes arrive
// (the request was routed and its backend is answering), `result` with the
// whole reply.
function send_stream(base_url, body, options = {}) {
  let first;
  const streaming = new Promise((resolve) => { first = resolve; });
  const result = send(base_url, body, { ...options, on_data: () => first() });
  result.then(() => first());  // a refused or failed request ends the wait too; its result says why
  return { streaming, result };
}

// Writes the new file and sends SIGHUP; resolves with the log line that
// says how the reload went (ok or refused).
async function reload(sluice, toml) {
  fs.writeFileSync(path.join(sluice.dir, 'sluice.toml'), toml);
  const from = sluice.proc.mark();
  sluice.proc.child.kill('SIGHUP');
  const said = await sluice.proc.wait_for_line(/SIGHUP: (reloaded|.*the running config stays)/, { from, timeout_ms: bound_ms(5000) });
  return said.line.text;
}

async function reload_counts(admin_url) {
  const { parsed } = await scrape(admin_url);
  const value = (result) => samples(parsed, 'sluice_config_reloads_total', { result })[0]?.value;
  return { ok: value('ok'), failed: value('failed'), last: samples(parsed, 'sluice_config_last_reload_successful')[0]?.value };
}

describe('SIGHUP adding a 4th backend under streaming load', () => {
  let backends;
  let sluice;
  const config_for = (n) => gateway_config({
    groups: [{ name: 'g', models: ['*'], balance: 'session', backends: backends.slice(0, n).map((b) => b.url) }],
    keys: [{ id: 'all', key, groups: ['*'] }],
  });

  before(async () => {
    backends = await start_backends(4, { tokens_per_sec: 200, reply_tokens: 20 });
    sluice = await start_sluice({ config: config_for(3) });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('zero failed streams; new sessions reach the new backend; existing sessions stay or move only to it', async () => {
    // 60 fixed sessions: where each lives before the reload (one at a time,
    // so bounded load never spills one).
    const sessions = Array.from({ length: 60 }, (_, i) => `fixed-session-${i}`);
    const before_map = await run_pool(sessions.length, 1, (i) => send(sluice.url, chat(`fixed ${i}`), { session: sessions[i] }));
    assert.ok(before_map.every((r) => r.status === 200 && r.backend >= 0 && r.backend < 3), 'before the reload: all on backends 0-2');

    const results = [];
    let stop = false;
    let n = 0;
    const lane = async () => {
      while (!stop) {
        const i = n++;
        results.push(await send(sluice.url, chat(`reload ${i}`, { stream: true, max_tokens: 20 }), { session: `stream-session-${i}` }));
      }
    };
    const lanes = Array.from({ length: 16 }, lane);
    let line;
    let seen_from;
    try {
      await poll(() => results.length >= 50, { what: '50 streams before the reload' });
      line = await reload(sluice, config_for(4));
      seen_from = results.length;
      await poll(() => results.slice(seen_from).some((r) => r.backend === 3), { timeout_ms: bound_ms(10000), what: 'a new session on backend 3' });
      await poll(() => results.length >= seen_from + 200, { timeout_ms: bound_ms(30000), what: '200 streams after the reload' });
    } finally {
      stop = true;
      await Promise.all(lanes);
    }
    assert.match(line, /SIGHUP: reloaded/);
    const bad = results.filter((r) => r.status !== 200 || !r.done);
    assert.equal(bad.length, 0, `${bad.length} of ${results.length} streams failed; first: ${JSON.stringify(bad[0] && { status: bad[0].status, error: bad[0].error?.message })}`);
    const after_reload = results.slice(seen_from);
    const on_new = after_reload.filter((r) => r.backend === 3).length;
    // Consistent hashing gives the new backend about a quarter of the new sessions.
    assert.ok(on_new >= after_reload.length / 10, `only ${on_new} of ${after_reload.length} new sessions on backend 3`);

    // The lanes' loads are gone from every shard's view before the sessions
    // are placed again (else a stale one could spill a session).
    await until_idle(sluice.admin_url);
    const after_map = await run_pool(sessions.length, 1, (i) => send(sluice.url, chat(`fixed ${i}`), { session: sessions[i] }));
    let moved_to_new = 0;
    let moved_elsewhere = 0;
    for (let i = 0; i < sessions.length; ++i) {
      assert.equal(after_map[i].status, 200);
      if (after_map[i].backend === before_map[i].backend) continue;
      if (after_map[i].backend === 3) ++moved_to_new;
      else ++moved_elsewhere;
    }
    assert.ok(moved_to_new > 0, 'some sessions move to the new backend');
    // Maglev moves almost nothing between the old backends (~1% of keys).
    assert.ok(moved_elsewhere <= 3, `${moved_elsewhere} of 60 sessions moved between old backends`);

    const counts = await reload_counts(sluice.admin_url);
    assert.deepEqual(counts, { ok: 1, failed: 0, last: 1 });
    const { parsed } = await scrape(sluice.admin_url);
    assert.equal(samples(parsed, 'sluice_backend_up', { backend: backends[3].url })[0]?.value, 1);
  });
});

describe('SIGHUP with an invalid file', () => {
  let backends;
  let sluice;
  const good = () => gateway_config({
    groups: [{ name: 'g', models: ['*'], backends: [backends[0].url] }],
    keys: [{ id: 'all', key, groups: ['*'] }],
  });

  before(async () => {
    backends = await start_backends(2);
    sluice = await start_sluice({ config: good() });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('is refused with its file and line, counted, and the running config keeps serving', async () => {
    const broken = `${good()}\n[[group]]\nname = "h"\nmodels = ["x"]\nbackends = ["${backends[1].url}"]\nbounded_load = "lots"\n`;
    const line = await reload(sluice, broken);
    assert.match(line, /sluice\.toml:\d+:/, 'the message names the file and line');
    assert.match(line, /bounded_load/);
    assert.match(line, /the running config stays/);
    assert.deepEqual(await reload_counts(sluice.admin_url), { ok: 0, failed: 1, last: 0 });
    // Still the old snapshot: model "x" goes to group g (models = ["*"]) on backend 0.
    const r = await send(sluice.url, { ...chat('still here'), model: 'x' });
    assert.equal(r.status, 200);
    assert.equal(r.backend, 0);
    // A later good file applies and the gauge recovers.
    assert.match(await reload(sluice, good()), /SIGHUP: reloaded/);
    assert.deepEqual(await reload_counts(sluice.admin_url), { ok: 1, failed: 1, last: 1 });
  });

  it('changes to [server] are reported as needing a restart; the rest applies', async () => {
    const text = gateway_config({
      tables: { server: { header_timeout_ms: 1234 } },
      groups: [{ name: 'g', models: ['*'], backends: [backends[1].url] }],
      keys: [{ id: 'all', key, groups: ['*'] }],
    });
    const from = sluice.proc.mark();
    assert.match(await reload(sluice, text), /SIGHUP: reloaded/);
    await sluice.proc.wait_for_line(/\[server\] changed: .*next restart/, { from, timeout_ms: bound_ms(2000) });
    const results = await run_pool(20, 4, (i) => send(sluice.url, chat(`moved ${i}`), { session: `s-${i}` }));
    assert.ok(results.every((r) => r.status === 200 && r.backend === 1), 'every request on the group\'s new backend');
  });
});

describe('SIGHUP removing a backend while streams run on it', () => {
  let backends;
  let sluice;
  const config_for = (urls) => gateway_config({
    groups: [{ name: 'g', models: ['*'], balance: 'round-robin', backends: urls }],
    keys: [{ id: 'all', key, groups: ['*'] }],
  });

  before(async () => {
    // 30 tokens at 40/s: each stream lasts ~0.75 s, long enough to span the reload.
    backends = await start_backends(3, { tokens_per_sec: 40, reply_tokens: 30 });
    sluice = await start_sluice({ config: config_for(backends.map((b) => b.url)) });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('streams in flight on the removed backend finish whole; no new request reaches it', async () => {
    const streams = Array.from({ length: 24 }, (_, i) => send_stream(sluice.url, chat(`long ${i}`, { stream: true, max_tokens: 30 })));
    const in_flight = Promise.all(streams.map((s) => s.result));
    // Every stream has reached its backend and is streaming before the reload.
    await Promise.all(streams.map((s) => s.streaming));
    assert.match(await reload(sluice, config_for([backends[0].url, backends[1].url])), /SIGHUP: reloaded/);
    const first = await in_flight;
    const bad = first.filter((r) => r.status !== 200 || !r.done);
    assert.equal(bad.length, 0, `${bad.length} streams failed across the reload`);
    assert.ok(first.some((r) => r.backend === 2), 'some streams were on the removed backend');

    const later = await run_pool(60, 8, (i) => send(sluice.url, chat(`after ${i}`)));
    assert.ok(later.every((r) => r.status === 200), 'every request after the reload succeeds');
    assert.equal(later.filter((r) => r.backend === 2).length, 0, 'nothing reaches the removed backend');
    const { parsed } = await scrape(sluice.admin_url);
    assert.equal(samples(parsed, 'sluice_backend_up', { backend: backends[2].url })[0]?.value, 0);

    // Back in the file: it takes requests again.
    assert.match(await reload(sluice, config_for(backends.map((b) => b.url))), /SIGHUP: reloaded/);
    const again = await run_pool(30, 6, (i) => send(sluice.url, chat(`again ${i}`)));
    assert.ok(again.every((r) => r.status === 200));
    assert.ok(again.some((r) => r.backend === 2), 'the re-added backend serves again');
  });
});

describe('SIGHUP changing keys', () => {
  let backends;
  let sluice;
  const key_b = 'sk-reload-bravo-19c0d2';
  const key_c = 'sk-reload-charlie-7e44aa';
  const config_for = (keys) => gateway_config({
    groups: [{ name: 'g', models: ['*'], backends: [backends[0].url] }],
    keys,
  });

  before(async () => {
    backends = await start_backends(1);
    sluice = await start_sluice({
      config: config_for([
        { id: 'a', key, groups: ['*'] },
        { id: 'b', key: key_b, groups: ['*'], requests_per_minute: 2 },
      ]),
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('a removed key is refused at once (even just after use), an added key works, new limits apply', async () => {
    // Use key b up to its limit (2 per minute): the third is refused.
    const used = [];
    for (let i = 0; i < 3; ++i) used.push(await send(sluice.url, chat(`b ${i}`), { api_key: key_b }));
    assert.deepEqual(used.map((r) => r.status), [200, 200, 429]);
    // Key a is verified (and cached) on every shard: hit them all.
    const a_before = await run_pool(16, 4, (i) => send(sluice.url, chat(`a ${i}`)));
    assert.ok(a_before.every((r) => r.status === 200));

    assert.match(await reload(sluice, config_for([
      { id: 'b', key: key_b, groups: ['*'], requests_per_minute: 100 },
      { id: 'c', key: key_c, groups: ['*'] },
    ])), /SIGHUP: reloaded/);

    const a_after = await run_pool(16, 4, (i) => send(sluice.url, chat(`a again ${i}`)));
    for (const r of a_after) {
      assert.equal(r.status, 401, 'the removed key is refused on every shard');
      assert.equal(JSON.parse(r.text).error.code, 'invalid_api_key');
    }
    const c = await run_pool(8, 4, (i) => send(sluice.url, chat(`c ${i}`), { api_key: key_c }));
    assert.ok(c.every((r) => r.status === 200), 'the added key works');
    // Key b has new limits: a fresh bucket of 100 per minute.
    const b = await run_pool(10, 2, (i) => send(sluice.url, chat(`b again ${i}`), { api_key: key_b }));
    assert.ok(b.every((r) => r.status === 200), `key b after the reload: ${b.map((r) => r.status)}`);
    assert.ok(is_openai_error(JSON.parse(a_after[0].text)));
  });
});

describe('operator drain (admin POST /backends/drain)', () => {
  let backends;
  let sluice;

  before(async () => {
    backends = await start_backends(3, { tokens_per_sec: 40, reply_tokens: 20 });
    // bounded_load = 0: what is tested is the drain. With bounded load on,
    // a shard's view of the others' loads is advice up to a few tens of
    // milliseconds old (reports are coalesced, 10 ms apart), so a request
    // right after a burst may see a load already gone and spill a session
    // for a reason that is not the drain (bounded load has its own tests
    // in routing.test.mjs).
    sluice = await start_sluice({
      config: gateway_config({
        groups: [{ name: 'g', models: ['*'], balance: 'session', bounded_load: 0, backends: backends.map((b) => b.url) }],
        keys: [{ id: 'all', key, groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  const admin = async (method, target) => {
    const res = await fetch(`${sluice.admin_url}${target}`, { method });
    return { status: res.status, json: await res.json() };
  };

  it('a draining backend takes no new sessions, finishes its streams, and comes back when undrained', async () => {
    const sessions = Array.from({ length: 45 }, (_, i) => `drain-session-${i}`);
    const before_map = await run_pool(sessions.length, 1, (i) => send(sluice.url, chat(`d ${i}`), { session: sessions[i] }));
    const victim = before_map[0].backend;
    const url = backends[victim].url;

    // Streams in flight on the victim when the drain starts.
    const mine = sessions.filter((_, i) => before_map[i].backend === victim).slice(0, 2);
    const started = mine.map((s) => send_stream(sluice.url, chat(`long ${s}`, { stream: true, max_tokens: 20 }), { session: s }));
    const streams = Promise.all(started.map((s) => s.result));
    // Both are streaming from the victim before the drain starts.
    await Promise.all(started.map((s) => s.streaming));
    const drained = await admin('POST', `/backends/drain?url=${encodeURIComponent(url)}`);
    assert.equal(drained.status, 200);
    assert.deepEqual(drained.json.backends.find((b) => b.url === url), { url, up: true, draining: true, takes_requests: false });

    const finished = await streams;
    for (const r of finished) {
      assert.equal(r.status, 200);
      assert.ok(r.done, 'a stream in flight finishes whole');
      assert.equal(r.backend, victim);
    }
    const during = await run_pool(sessions.length, 1, (i) => send(sluice.url, chat(`d ${i}`), { session: sessions[i] }));
    for (let i = 0; i < sessions.length; ++i) {
      assert.equal(during[i].status, 200);
      assert.notEqual(during[i].backend, victim, 'no request reaches the draining backend');
      // The others' sessions stay where they were.
      if (before_map[i].backend !== victim) assert.equal(during[i].backend, before_map[i].backend);
    }
    const { parsed } = await scrape(sluice.admin_url);
    assert.equal(samples(parsed, 'sluice_backend_draining', { backend: url })[0]?.value, 1);

    assert.equal((await admin('POST', `/backends/undrain?url=${encodeURIComponent(url)}`)).status, 200);
    const back = await run_pool(sessions.length, 1, (i) => send(sluice.url, chat(`d ${i}`), { session: sessions[i] }));
    for (let i = 0; i < sessions.length; ++i) assert.equal(back[i].backend, before_map[i].backend, 'every session is home again');
  });

  it('a drain or undrain holds on every shard once its answer arrives', async () => {
    const session = 'drain-settle';
    const home = (await send(sluice.url, chat('home'), { session })).backend;
    const url = backends[home].url;
    // Each answer is followed at once by requests on fresh connections
    // (spread over the shards), one at a time: none may still see the
    // state before it.
    for (let round = 0; round < 20; ++round) {
      assert.equal((await admin('POST', `/backends/drain?url=${encodeURIComponent(url)}`)).status, 200);
      const away = await run_pool(4, 1, () => send(sluice.url, chat('home'), { session }));
      assert.ok(away.every((r) => r.status === 200 && r.backend !== home), `round ${round}: drained, yet ${away.map((r) => r.backend)}`);
      assert.equal((await admin('POST', `/backends/undrain?url=${encodeURIComponent(url)}`)).status, 200);
      const back = await run_pool(4, 1, () => send(sluice.url, chat('home'), { session }));
      assert.ok(back.every((r) => r.status === 200 && r.backend === home), `round ${round}: undrained, yet ${back.map((r) => r.backend)}`);
    }
  });

  it('refuses an unknown backend (404), a missing url (400) and GET (405), in OpenAI\'s error shape', async () => {
    const unknown = await admin('POST', '/backends/drain?url=http%3A%2F%2F127.0.0.1%3A1');
    assert.equal(unknown.status, 404);
    assert.ok(is_openai_error(unknown.json));
    const missing = await admin('POST', '/backends/drain');
    assert.equal(missing.status, 400);
    assert.ok(is_openai_error(missing.json));
    const get = await admin('GET', '/backends/drain?url=x');
    assert.equal(get.status, 405);
    const list = await admin('GET', '/backends');
    assert.equal(list.status, 200);
    assert.deepEqual(list.json.backends.map((b) => b.url), backends.map((b) => b.url));
  });
});
