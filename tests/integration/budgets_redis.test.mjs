// Budgets kept in Redis (issue 17 §3 with [cluster]): two sluice processes
// sharing one redis-server (lib/redis.mjs: a free loopback port, no
// persistence, always stopped) use up one key's daily token budget
// together; both refuse it (429 insufficient_quota); stopped and started
// again, both still show what was used and still refuse. Every amount is
// checked against the audit lines of both processes.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { bound_ms, chat_body, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { gateway_config, poll, post_fresh, read_audit, samples, scrape } from './lib/gateway.mjs';
import { start_redis } from './lib/redis.mjs';

const alice = 'sk-budget-redis-alice-5e5e';
const audit_name = 'sluice-audit.jsonl';
const daily_tokens = 60;

// The budget scripts Redis has run so far (EVALSHA calls).
function budget_pushes(redis) {
  const m = redis.cli('INFO', 'commandstats').match(/cmdstat_evalsha:calls=(\d+)/);
  return m ? Number(m[1]) : 0;
}

// alice's hash for today: {instance id: own tokens}.
function own_fields(redis) {
  const day = Math.floor(Date.now() / 86400000);
  const flat = redis.cli('HGETALL', `budget-it:budget:day:${day}:key:alice`).split('\n').filter((l) => l !== '');
  const out = {};
  for (let i = 0; i + 1 < flat.length; i += 2) if (flat[i].startsWith('t:')) out[flat[i].slice(2)] = Number(flat[i + 1]);
  return out;
}

function config_text(backend, redis) {
  return gateway_config({
    audit_path: audit_name,
    tables: { cluster: { redis: redis.url, key_prefix: 'budget-it:' } },
    groups: [{ name: 'fast', models: ['fast'], backends: [backend.url] }],
    keys: [{ id: 'alice', key: alice, daily_tokens, groups: ['fast'] }],
  });
}

async function used_on(sluice) {
  const res = await fetch(`${sluice.admin_url}/keys/alice`);
  assert.equal(res.status, 200);
  return (await res.json()).budgets.daily_tokens.used;
}

// Polls GET /keys/alice on `sluice` until it shows `want` used.
async function shows_used(sluice, want, what) {
  let last;
  await poll(async () => { last = await used_on(sluice); return last === want; },
    { timeout_ms: bound_ms(5000), what: `${what}: ${want} used (last: ${last})` });
}

const tokens_in = (sluice) => read_audit(path.join(sluice.dir, audit_name))
  .filter((l) => l.key_id === 'alice').reduce((n, l) => n + l.total_tokens, 0);

function assert_refused(reply) {
  assert.equal(reply.status, 429, reply.text);
  const body = JSON.parse(reply.text);
  assert.equal(body.error.code, 'insufficient_quota');
  assert.match(body.error.message, /^The daily token budget of key alice \(60 tokens\) is used up/);
  assert.equal(reply.headers['x-budget-remaining-daily-tokens'], '0');
}

describe('budgets kept in Redis, shared by two instances', () => {
  let redis, backend, a, b;

  before(async () => {
    redis = await start_redis();
    backend = await start_mock_vllm({ model: 'fast', reply_tokens: 10 });
    const config = config_text(backend, redis);
    [a, b] = await Promise.all([start_sluice({ config }), start_sluice({ config })]);
  });
  after(async () => {
    await stop_all(a, b, backend);
    await redis?.stop();
  });

  let total = 0;

  it('a budget used up through both instances is refused on both', async () => {
    assert.equal(await used_on(a), 0);
    assert.equal(await used_on(b), 0);
    // Alternate until the budget is used up: each instance sees the other's
    // usage (and its own) before the next request.
    const served = [];
    for (let i = 0; total < daily_tokens; ++i) {
      assert.ok(i < 10, `the budget never filled (${total} used)`);
      const via = i % 2 === 0 ? a : b;
      const before_count = served.length;
      const r = await post_fresh(via.url, chat_body({ model: 'fast', content: `request ${i} against a shared budget` }), { key: alice });
      assert.equal(r.status, 200, r.text);
      served.push(i % 2 === 0 ? 'a' : 'b');
      assert.equal(served.length, before_count + 1);
      await poll(() => tokens_in(a) + tokens_in(b) > total, { timeout_ms: bound_ms(5000), what: `request ${i}'s audit line` });
      total = tokens_in(a) + tokens_in(b);
      await shows_used(a, total, 'instance a');
      await shows_used(b, total, 'instance b');
    }
    assert.ok(served.includes('a') && served.includes('b'), `both served (${served})`);
    assert.ok(tokens_in(a) < daily_tokens && tokens_in(b) < daily_tokens,
      `neither used the budget up alone (a ${tokens_in(a)}, b ${tokens_in(b)})`);

    for (const sluice of [a, b]) {
      assert_refused(await post_fresh(sluice.url, chat_body({ model: 'fast' }), { key: alice }));
      const m = (await scrape(sluice.admin_url)).parsed;
      assert.deepEqual(samples(m, 'sluice_budget_used', { key: 'alice', budget: 'daily_tokens' }).map((s) => s.value), [total]);
      assert.deepEqual(samples(m, 'sluice_budget_rejections_total', { key: 'alice', budget: 'daily_tokens' }).map((s) => s.value), [1]);
    }
    // With [cluster] the state file is not written (the usage lives in Redis).
    assert.ok(!fs.existsSync(path.join(a.dir, 'sluice-budgets.json')));
    assert.ok(!fs.existsSync(path.join(b.dir, 'sluice-budgets.json')));
  });

  it('both stopped and started again: the usage is still shown and still refused, counted once', async () => {
    assert.ok(total >= daily_tokens, 'the first case used the budget up');
    const first_pids = [a.proc.child.pid, b.proc.child.pid];
    for (const sluice of [a, b]) assert.equal((await sluice.stop()).code, 0);
    a = b = null;
    // Each process's own total under its own name (host:pid:start ms),
    // the last of it pushed at shutdown.
    const kept = own_fields(redis);
    assert.equal(Object.keys(kept).length, 2, JSON.stringify(kept));
    for (const pid of first_pids) assert.ok(Object.keys(kept).some((id) => id.includes(`:${pid}:`)), JSON.stringify(kept));
    assert.equal(Object.values(kept).reduce((n, v) => n + v, 0), total);
    const config = config_text(backend, redis);
    [a, b] = await Promise.all([start_sluice({ config }), start_sluice({ config })]);
    // Loaded before the shards start: no wait.
    assert.equal(await used_on(a), total);
    assert.equal(await used_on(b), total);
    assert_refused(await post_fresh(a.url, chat_body({ model: 'fast' }), { key: alice }));
    assert_refused(await post_fresh(b.url, chat_body({ model: 'fast' }), { key: alice }));
    // The new processes' periodic pushes (a few each) take nothing of the
    // old ones' usage for their own: the hash keeps the two old fields.
    const pushes = budget_pushes(redis);
    await poll(() => budget_pushes(redis) >= pushes + 6, { timeout_ms: bound_ms(5000), what: 'the new processes\' pushes' });
    assert.deepEqual(own_fields(redis), kept);
    assert.equal(await used_on(a), total);
    assert.equal(await used_on(b), total);
  });

  it('Redis gone: both keep refusing on what they know, and keep serving the admin view', async () => {
    await redis.kill();
    await redis.stop();
    redis = null;
    for (const sluice of [a, b]) {
      await sluice.proc.wait_for_line(/cluster: redis 127\.0\.0\.1:\d+ unreachable/, { timeout_ms: bound_ms(5000) });
      assert_refused(await post_fresh(sluice.url, chat_body({ model: 'fast' }), { key: alice }));
      assert.equal(await used_on(sluice), total);
    }
    for (const sluice of [a, b]) assert.equal((await sluice.stop()).code, 0);
    a = b = null;
  });
});
