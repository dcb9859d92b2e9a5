// Budgets (issue 17 §3, local mode): daily token budgets per key and per
// group, spend budgets at a group's costs, the state file across a restart,
// and GET /keys/{id} on the admin listener. Every amount is checked against
// the audit lines, which say what each request used.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import fs from 'node:fs';
import http2 from 'node:http2';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { bound_ms, chat_body, http_post, program, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { gateway_config, poll, post_fresh, read_audit, samples, scrape } from './lib/gateway.mjs';
import { run_program } from './lib/h2_gateway.mjs';

const alice = 'sk-budget-alice-1a1a';
const bob = 'sk-budget-bob-2b2b';
const carol = 'sk-budget-carol-3c3c';
const dave = 'sk-budget-dave-4d4d';
const audit_name = 'sluice-audit.jsonl';

function config_text(backends, state_file) {
  return gateway_config({
    audit_path: audit_name,
    tables: { quota: { budget_state_file: state_file } },
    groups: [
      { name: 'slow', models: ['slow'], backends: [backends.slow.url] },
      { name: 'shared', models: ['shared'], backends: [backends.fast.url], daily_tokens: 40 },
      { name: 'priced', models: ['priced'], backends: [backends.fast.url], input_cost_per_mtok: 1000, output_cost_per_mtok: 3000 },
    ],
    keys: [
      { id: 'alice', key: alice, daily_tokens: 30, groups: ['slow'] },
      { id: 'bob', key: bob, groups: ['shared'] },
      { id: 'carol', key: carol, groups: ['shared'] },
      { id: 'dave', key: dave, daily_spend: 0.05, monthly_spend: 10, groups: ['priced'] },
    ],
  });
}

async function get_key(sluice, id) {
  const res = await fetch(`${sluice.admin_url}/keys/${id}`);
  return { status: res.status, json: await res.json() };
}

const audit_of_key = (sluice, key_id) => read_audit(path.join(sluice.dir, audit_name)).filter((l) => l.key_id === key_id);
const tokens_of = (lines) => lines.reduce((n, l) => n + l.total_tokens, 0);

// Polls GET /keys/{id} until `pick(json)` equals `want` (the ledger sums the
// shards every 50 ms); returns the body.
async function key_shows(sluice, id, pick, want, what) {
  let last;
  await poll(async () => {
    last = (await get_key(sluice, id)).json;
    return Math.abs(pick(last) - want) < 1e-6;
  }, { timeout_ms: bound_ms(5000), what: `${what} (last: ${JSON.stringify(last)})` });
  return last;
}

// One request over HTTP/2 (h2c prior knowledge): {status, headers, text}.
async function post_h2(base_url, body, key) {
  const client = http2.connect(base_url);
  client.on('error', () => {});
  try {
    const req = client.request({ ':method': 'POST', ':path': '/v1/chat/completions', authorization: `Bearer ${key}`, 'content-type': 'application/json' });
    req.end(JSON.stringify(body));
    const [headers] = await once(req, 'response');
    const parts = [];
    req.on('data', (d) => parts.push(d));
    await once(req, 'end');
    return { status: headers[':status'], headers, text: Buffer.concat(parts).toString('utf8') };
  } finally {
    client.close();
  }
}

function assert_insufficient_quota(reply, message) {
  assert.equal(reply.status, 429, reply.text);
  const body = JSON.parse(reply.text);
  assert.equal(body.error.type, 'insufficient_quota');
  assert.equal(body.error.code, 'insufficient_quota');
  assert.match(body.error.message, message);
  assert.equal(reply.headers['x-should-retry'], 'false');
}

describe('budgets', () => {
  let backends, dir, state_file, sluice;

  before(async () => {
    backends = {
      fast: await start_mock_vllm({ model: 'fast', reply_tokens: 10 }),
      slow: await start_mock_vllm({ model: 'slow', reply_tokens: 2000, tokens_per_sec: 200 }),
    };
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-budgets-'));
    state_file = path.join(dir, 'budgets.json');
    sluice = await start_sluice({ config: config_text(backends, state_file) });
  });
  after(async () => {
    await stop_all(sluice, backends?.fast, backends?.slow);
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a daily token budget used up by a stream cut short: used = the audit lines\' tokens, then 429 insufficient_quota', async () => {
    const before_stream = await get_key(sluice, 'alice');
    assert.equal(before_stream.status, 200);
    assert.deepEqual(before_stream.json.budgets.daily_tokens.used, 0);
    assert.equal(before_stream.json.budgets.daily_tokens.limit, 30);
    assert.equal(before_stream.json.id, 'alice');
    assert.ok(!JSON.stringify(before_stream.json).includes(alice), 'the key itself is never shown');

    // The client leaves after 25 content events of a 2000-token stream.
    const from = backends.slow.proc.mark();
    let head;
    let events = 0;
    const reply = http_post(sluice.url, '/v1/chat/completions',
      chat_body({ model: 'slow', stream: true, max_tokens: 1000, content: 'tell me a long story' }), {
        headers: { authorization: `Bearer ${alice}`, 'x-request-id': 'budget-cut-1' },
        on_response: (res) => { head = res.headers; },
        on_data: (d, req) => {
          events += (d.toString().match(/"content":/g) ?? []).length;
          if (events >= 25) req.destroy();
        },
      }).catch(() => null);
    await backends.slow.proc.wait_for_line(/abort request_id=\S*budget-cut-1\b/, { from, timeout_ms: bound_ms(10000) });
    await reply;
    assert.equal(head['x-budget-remaining-daily-tokens'], '30', 'the headers show what is left, also on success');
    assert.match(head['x-budget-reset-daily'], /^\d{4}-\d\d-\d\dT00:00:00Z$/);

    let lines;
    await poll(() => { lines = audit_of_key(sluice, 'alice'); return lines.length === 1; },
      { timeout_ms: bound_ms(5000), what: 'the cancelled stream\'s audit line' });
    assert.equal(lines[0].cancelled, true);
    assert.ok(lines[0].completion_tokens >= 20 && lines[0].completion_tokens < 2000, JSON.stringify(lines[0]));
    const used = tokens_of(lines);
    assert.ok(used >= 30, `the stream used ${used} tokens, more than the budget`);
    const shown = await key_shows(sluice, 'alice', (j) => j.budgets.daily_tokens.used, used, 'the budget charged with the audit\'s tokens');
    assert.equal(shown.budgets.daily_tokens.left, 0);

    const refused = await post_fresh(sluice.url, chat_body({ model: 'slow', max_tokens: 5 }), { key: alice });
    assert_insufficient_quota(refused, /^The daily token budget of key alice \(30 tokens\) is used up; it resets at \d{4}-\d\d-\d\dT00:00:00Z\.$/);
    assert.equal(refused.headers['x-budget-remaining-daily-tokens'], '0');
    const over_h2 = await post_h2(sluice.url, chat_body({ model: 'slow', max_tokens: 5 }), alice);
    assert_insufficient_quota(over_h2, /^The daily token budget of key alice/);
    assert.equal(over_h2.headers['x-budget-remaining-daily-tokens'], '0');
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.deepEqual(samples(m, 'sluice_budget_rejections_total', { key: 'alice', budget: 'daily_tokens' }).map((s) => s.value), [2]);
    assert.deepEqual(samples(m, 'sluice_budget_used', { key: 'alice', budget: 'daily_tokens' }).map((s) => s.value), [used]);
  });

  it('a group budget counts every key of the group together', async () => {
    // Each request: 9 prompt tokens (mock-vllm's count) + 10 completion.
    const seen = [];
    for (const [i, key] of [bob, carol, bob].entries()) {
      const r = await post_fresh(sluice.url, chat_body({ model: 'shared', content: 'a group budget request' }), { key });
      assert.equal(r.status, 200, r.text);
      if (i === 0) assert.equal(r.headers['x-budget-remaining-group-daily-tokens'], '40');
      let lines;
      await poll(() => { lines = [...audit_of_key(sluice, 'bob'), ...audit_of_key(sluice, 'carol')]; return lines.length === i + 1; },
        { timeout_ms: bound_ms(5000), what: 'the audit line' });
      seen.push(tokens_of(lines));
      await key_shows(sluice, 'carol', (j) => j.groups[0].budgets.daily_tokens.used, seen[i], 'the group charged');
    }
    assert.ok(seen[1] < 40 && seen[2] >= 40, `group usage ${seen}`);
    const refused = await post_fresh(sluice.url, chat_body({ model: 'shared' }), { key: carol });
    assert_insufficient_quota(refused, /^The daily token budget of group shared \(40 tokens, all keys together\) is used up; it resets at .*Z\.$/);
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.deepEqual(samples(m, 'sluice_budget_rejections_total', { key: 'carol', budget: 'group_daily_tokens' }).map((s) => s.value), [1]);
    assert.deepEqual(samples(m, 'sluice_group_budget_used_tokens', { group: 'shared', budget: 'daily_tokens' }).map((s) => s.value), [seen[2]]);
  });

  it('a spend budget at the group\'s costs per 1M tokens', async () => {
    const cost = (lines) => lines.reduce((n, l) => n + l.prompt_tokens * 0.001 + l.completion_tokens * 0.003, 0);
    let spent = 0;
    for (let i = 0; spent < 0.05; ++i) {
      assert.ok(i < 5, 'the spend budget never filled');
      const r = await post_fresh(sluice.url, chat_body({ model: 'priced', content: 'what does this cost' }), { key: dave });
      assert.equal(r.status, 200, r.text);
      if (i === 0) assert.equal(r.headers['x-budget-remaining-daily-spend'], '0.050000');
      let lines;
      await poll(() => { lines = audit_of_key(sluice, 'dave'); return lines.length === i + 1; },
        { timeout_ms: bound_ms(5000), what: 'the audit line' });
      spent = cost(lines);
      const shown = await key_shows(sluice, 'dave', (j) => j.budgets.daily_spend.used, spent, 'the spend charged');
      assert.ok(Math.abs(shown.budgets.monthly_spend.used - spent) < 1e-6);
    }
    const refused = await post_fresh(sluice.url, chat_body({ model: 'priced' }), { key: dave });
    assert_insufficient_quota(refused, /^The daily spend budget of key dave \(0\.05\) is used up; it resets at .*Z\.$/);
    assert.equal(refused.headers['x-budget-remaining-daily-spend'], '0.000000');
    assert.ok(Number(refused.headers['x-budget-remaining-monthly-spend']) > 9.9);
  });

  it('GET /keys/{id}: limits, levels and budgets; an unknown id is 404 in OpenAI\'s shape', async () => {
    const { status, json } = await get_key(sluice, 'bob');
    assert.equal(status, 200);
    assert.deepEqual(Object.keys(json.limits).sort(), ['max_concurrent', 'requests_per_minute', 'tokens_per_minute']);
    assert.ok('tokens_remaining' in json.levels);
    const missing = await get_key(sluice, 'nobody');
    assert.equal(missing.status, 404);
    assert.equal(missing.json.error.code, 'key_not_found');
  });

  it('a restart with the same state file keeps what was used, and the budget stays refused', async () => {
    const alice_used = (await get_key(sluice, 'alice')).json.budgets.daily_tokens.used;
    const dave_used = (await get_key(sluice, 'dave')).json.budgets.daily_spend.used;
    const exit = await sluice.stop();
    assert.equal(exit.code, 0);
    const kept = JSON.parse(fs.readFileSync(state_file, 'utf8'));
    assert.equal(kept.format, 'sluice-budgets');
    assert.equal(kept.keys.alice.daily_tokens, alice_used);
    assert.equal(fs.readdirSync(dir).filter((f) => f !== 'budgets.json').length, 0, 'no temp file left behind');

    sluice = await start_sluice({ config: config_text(backends, state_file) });
    const after_restart = await get_key(sluice, 'alice');
    assert.equal(after_restart.json.budgets.daily_tokens.used, alice_used);
    assert.ok(Math.abs((await get_key(sluice, 'dave')).json.budgets.daily_spend.used - dave_used) < 1e-9);
    const refused = await post_fresh(sluice.url, chat_body({ model: 'slow', max_tokens: 5 }), { key: alice });
    assert_insufficient_quota(refused, /daily token budget of key alice/);
  });

  it('GET /keys/{id} wants the admin token when one is set', async () => {
    const guarded = await start_sluice({
      config: gateway_config({
        tables: { server: { admin_token_env: 'SLUICE_BUDGET_TEST_ADMIN' }, quota: { budget_state_file: '' } },
        groups: [{ name: 'slow', models: ['slow'], backends: [backends.slow.url] }],
        keys: [{ id: 'alice', key: alice, daily_tokens: 30, groups: ['slow'] }],
      }),
      env: { SLUICE_BUDGET_TEST_ADMIN: 'admin-secret-1' },
    });
    try {
      const bare = await fetch(`${guarded.admin_url}/keys/alice`);
      assert.equal(bare.status, 401);
      await bare.arrayBuffer();
      const with_token = await fetch(`${guarded.admin_url}/keys/alice`, { headers: { authorization: 'Bearer admin-secret-1' } });
      assert.equal(with_token.status, 200);
      assert.equal((await with_token.json()).budgets.daily_tokens.used, 0);
    } finally {
      await guarded.stop();
    }
  });

  it('a corrupt state file is refused at start and by --check-config, naming the file', async () => {
    const bad_dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-budgets-bad-'));
    try {
      const bad = path.join(bad_dir, 'budgets.json');
      fs.writeFileSync(bad, '{"keys": {}}');
      const toml = path.join(bad_dir, 'sluice.toml');
      fs.writeFileSync(toml, config_text(backends, bad));
      const check = await run_program(program('sluice'), ['--config', toml, '--check-config']);
      assert.equal(check.code, 1, check.stderr);
      assert.match(check.stderr, /budget state file .*budgets\.json: not a sluice budget state/);
      const run = await run_program(program('sluice'), ['--config', toml, '--listen', '127.0.0.1:0', '--admin', '127.0.0.1:0']);
      assert.notEqual(run.code, 0);
      assert.match(run.stderr, /refusing to start/);
    } finally {
      fs.rmSync(bad_dir, { recursive: true, force: true });
    }
  });
});
