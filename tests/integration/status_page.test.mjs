// The operator's status page on the admin listener: GET /status.json (rates,
// latencies, backends, keys, shards from the control thread's sampler) and
// GET / (the HTML page, tables rendered server-side, drain forms that work
// without JavaScript). A real sluice in front of two mock-vllm backends.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { gateway_config, poll, post_fresh, samples, scrape, start_backends } from './lib/gateway.mjs';
import { bound_ms, chat_body, start_mock_vllm, start_sluice, start_streams, stop_all } from './lib/harness.mjs';

const key_secret = 'sk-status-page-secret-4d1c';

async function status_json(admin_url, headers = {}) {
  const r = await fetch(`${admin_url}/status.json`, { headers });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /application\/json/);
  const text = await r.text();
  return { text, json: JSON.parse(text) };
}

function assert_traffic_shape(row, what) {
  for (const f of ['requests_s', 'tokens_in_s', 'tokens_out_s', 'errors_4xx_s', 'errors_5xx_s']) {
    assert.equal(typeof row[f], 'number', `${what}.${f}`);
  }
  for (const f of ['ttft_p50_ms', 'ttft_p99_ms', 'duration_p50_ms', 'duration_p99_ms']) {
    assert.ok(row[f] === null || typeof row[f] === 'number', `${what}.${f}`);
  }
  for (const f of ['requests', 'tokens_in', 'tokens_out', 'errors_4xx', 'errors_5xx']) {
    assert.equal(typeof row.totals[f], 'number', `${what}.totals.${f}`);
  }
  assert.equal(typeof row.totals.by_code, 'object');
}

// The drain form's action for `url` in the page, as a browser would post it.
function form_action(html, url) {
  const escaped = encodeURIComponent(url).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  const m = html.match(new RegExp(`<form method="post" action="(/backends/(?:drain|undrain)\\?url=${escaped}&amp;then=page)"`));
  return m ? m[1].replaceAll('&amp;', '&') : null;
}

describe('status page', () => {
  let backends, sluice;

  before(async () => {
    backends = await start_backends(2, { ttft_ms: 5 });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 100 } },
        groups: [{ name: 'chat', models: ['*'], backends: backends.map((b) => b.url) }],
        keys: [{ id: 'alice', key: key_secret, groups: ['*'], tokens_per_minute: 1000000, requests_per_minute: 10000 }],
      }),
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('/status.json has traffic, backends, keys and shards; the key id shows, its secret never', async () => {
    const { text, json } = await status_json(sluice.admin_url);
    assert.equal(json.object, 'status');
    assert.equal(json.step_ms, 2000);
    assert.equal(json.inflight, 0);
    assert_traffic_shape(json.overall, 'overall');
    assert.deepEqual(json.groups.map((g) => g.name), ['chat']);
    assert_traffic_shape(json.groups[0], 'groups[0]');
    assert.ok(Array.isArray(json.series.ms_ago));
    assert.equal(json.series.overall.requests_s.length, json.series.ms_ago.length);
    assert.deepEqual(Object.keys(json.series.groups), ['chat']);
    assert.deepEqual(json.backends.map((b) => b.url).sort(), backends.map((b) => b.url).sort());
    for (const b of json.backends) assert.equal(b.state, 'up');
    assert.deepEqual(json.keys.map((k) => k.id), ['alice']);
    assert.equal(json.keys[0].tokens_per_minute, 1000000);
    assert.ok(json.shards.length >= 1);
    for (const s of json.shards) assert.equal(typeof s.loop_iterations, 'number');
    assert.ok(!text.includes(key_secret), 'the key secret is in /status.json');
  });

  it('its numbers move after requests are sent', async () => {
    const before_json = (await status_json(sluice.admin_url)).json;
    const n = 12;
    for (let i = 0; i < n; ++i) {
      const r = await post_fresh(sluice.url, chat_body({ stream: i % 2 === 0, content: `status page request ${i}` }), { key: key_secret });
      assert.equal(r.status, 200, r.text);
    }
    const bad = await post_fresh(sluice.url, chat_body({}), { key: 'not-a-key' });
    assert.equal(bad.status, 401);
    // The sampler takes a point every 2 s: the totals and rates follow.
    const after_json = await poll(async () => {
      const { json } = await status_json(sluice.admin_url);
      return json.overall.totals.requests >= before_json.overall.totals.requests + n + 1 && json.overall.requests_s > 0 &&
        json.overall.totals.errors_4xx >= 1 && json.keys[0].daily_tokens_used > 0 ? json : null;
    }, { timeout_ms: bound_ms(10000), interval_ms: 200, what: 'the status totals to count the requests' });
    const o = after_json.overall;
    assert.ok(o.tokens_in_s > 0 && o.tokens_out_s > 0, JSON.stringify(o));
    assert.ok(o.errors_4xx_s > 0, JSON.stringify(o));
    assert.ok(o.totals.by_code['200'] >= n && o.totals.by_code['401'] >= 1, JSON.stringify(o.totals));
    assert.ok(o.duration_p50_ms > 0 && o.duration_p99_ms >= o.duration_p50_ms, JSON.stringify(o));
    // Streams were observed: a TTFT exists (behind a 5 ms backend).
    assert.ok(o.ttft_p50_ms > 0 && o.ttft_p99_ms >= o.ttft_p50_ms, JSON.stringify(o));
    const g = after_json.groups[0];
    assert.ok(g.totals.requests >= n && g.requests_s > 0, JSON.stringify(g));
    const answers = after_json.backends.reduce((s, b) => s + b.answers, 0);
    assert.ok(answers >= n, `backend answers ${answers}`);
    // The key's own counts: every request it made, and the same tokens as
    // its only group (the 401 has no key and no tokens).
    const alice = after_json.keys[0];
    assert.ok(alice.requests >= n && alice.requests_s > 0, JSON.stringify(alice));
    assert.ok(alice.tokens_in > 0 && alice.tokens_out > 0 && alice.tokens_s > 0, JSON.stringify(alice));
    assert.equal(alice.requests, g.totals.requests, 'alice made every request of the group');
    assert.equal(alice.tokens_in, g.totals.tokens_in);
    assert.equal(alice.tokens_out, g.totals.tokens_out);
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.equal(samples(m, 'sluice_key_requests_total', { key: 'alice' })[0]?.value >= alice.requests, true);
    assert.equal(samples(m, 'sluice_key_tokens_total', { key: 'alice', kind: 'prompt' })[0]?.value >= alice.tokens_in, true);
    assert.ok(samples(m, 'sluice_key_requests_total', { key: '' })[0]?.value >= 1, 'the 401 counts on the no-key row');
    assert.ok(after_json.series.overall.requests_s.some((v) => v > 0), 'a step of the series shows the requests');
    const iterations = (j) => j.shards.reduce((s, x) => s + x.loop_iterations, 0);
    assert.ok(iterations(after_json) > iterations(before_json));
    // vLLM's gauges from the health checker's scrape of mock-vllm.
    const scraped = await poll(async () => {
      const { json } = await status_json(sluice.admin_url);
      return json.backends.every((b) => b.waiting !== null && b.running !== null && b.kv_cache_usage !== null) ? json : null;
    }, { timeout_ms: bound_ms(10000), interval_ms: 100, what: 'the backends\' vLLM gauges' });
    for (const b of scraped.backends) assert.ok(b.kv_cache_usage >= 0 && b.kv_cache_usage <= 1);
  });

  it('GET / renders the tables without JavaScript: backends, the key id, not its secret', async () => {
    const r = await fetch(`${sluice.admin_url}/`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /text\/html/);
    assert.match(r.headers.get('content-security-policy'), /default-src 'none'/);
    const html = await r.text();
    for (const b of backends) assert.ok(html.includes(`<td>${b.url}</td>`), `backend ${b.url} in the page`);
    assert.ok(html.includes('<td>alice</td>'));
    for (const th of ['in flight', 'failures/s', 'failures', 'requests', 'tokens in', 'tokens out']) {
      assert.ok(html.includes(`<th>${th}</th>`), `column ${th}`);
    }
    assert.ok(html.includes('<td>chat</td>'));
    assert.ok(!html.includes(key_secret), 'the key secret is in the page');
    assert.ok(!/<script[^>]+src=|<link[^>]+href="http/.test(html), 'the page loads nothing from elsewhere');
  });

  it('drains and undrains a backend through the page\'s form (no JavaScript)', async () => {
    const target = backends[1].url;
    const page = await (await fetch(`${sluice.admin_url}/`)).text();
    const action = form_action(page, target);
    assert.ok(action && action.startsWith('/backends/drain?'), `the drain form of ${target}`);
    const r = await fetch(`${sluice.admin_url}${action}`, { method: 'POST', redirect: 'manual' });
    assert.equal(r.status, 303);
    assert.equal(r.headers.get('location'), '/');
    await r.arrayBuffer();
    const listed = await (await fetch(`${sluice.admin_url}/backends`)).json();
    assert.equal(listed.backends.find((b) => b.url === target).draining, true);
    assert.equal(listed.backends.find((b) => b.url === backends[0].url).draining, false);
    // The page now offers to undrain it, and says so in /status.json.
    const again = await (await fetch(`${sluice.admin_url}/`)).text();
    const undo = form_action(again, target);
    assert.ok(undo && undo.startsWith('/backends/undrain?'), 'the undrain form');
    const s = (await status_json(sluice.admin_url)).json;
    assert.equal(s.backends.find((b) => b.url === target).state, 'draining');
    assert.equal(s.backends.find((b) => b.url === target).last_change, 'drained by the operator');
    // Every request now goes to the other backend.
    for (let i = 0; i < 4; ++i) {
      const c = await post_fresh(sluice.url, chat_body({ content: `after drain ${i}` }), { key: key_secret });
      assert.equal(c.status, 200);
      assert.match(c.text, /"model":"backend-0"/);
    }
    const u = await fetch(`${sluice.admin_url}${undo}`, { method: 'POST', redirect: 'manual' });
    assert.equal(u.status, 303);
    await u.arrayBuffer();
    const back = await (await fetch(`${sluice.admin_url}/backends`)).json();
    assert.equal(back.backends.find((b) => b.url === target).draining, false);
  });

  it('refuses a drain posted by a page of another origin', async () => {
    const r = await fetch(`${sluice.admin_url}/backends/drain?url=${encodeURIComponent(backends[0].url)}&then=page`, {
      method: 'POST', redirect: 'manual', headers: { origin: 'http://attacker.example' },
    });
    assert.equal(r.status, 403);
    await r.arrayBuffer();
    const listed = await (await fetch(`${sluice.admin_url}/backends`)).json();
    assert.equal(listed.backends.find((b) => b.url === backends[0].url).draining, false);
  });
});

describe('status page: sluice\'s own load and failures per backend', () => {
  let slow, flaky, sluice;

  before(async () => {
    // Streams of 40 tokens at 20/s hold their backend ~2 s; the flaky one
    // drops every connection after 2 tokens.
    slow = await start_mock_vllm({ model: 'slow', tokens_per_sec: 20, reply_tokens: 40 });
    flaky = await start_mock_vllm({ model: 'flaky', tokens_per_sec: 200, reply_tokens: 20, fail_after_tokens: 2 });
    sluice = await start_sluice({
      config: gateway_config({
        groups: [{ name: 'slow', models: ['slow'], backends: [slow.url] }, { name: 'flaky', models: ['flaky'], backends: [flaky.url] }],
        keys: [{ id: 'carol', key: key_secret, groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, slow, flaky));

  const row = (json, url) => json.backends.find((b) => b.url === url);

  it('in flight: the streams sluice has open to a backend now, back to 0 once they end', async () => {
    const n = 3;
    const { replies, until_started } = start_streams(sluice.url, n,
      (i) => chat_body({ model: 'slow', stream: true, max_tokens: 40, content: `held stream ${i}` }),
      { headers: () => ({ authorization: `Bearer ${key_secret}` }) });
    await until_started();
    const { json } = await status_json(sluice.admin_url);
    assert.equal(row(json, slow.url).inflight, n, JSON.stringify(row(json, slow.url)));
    assert.equal(row(json, flaky.url).inflight, 0);
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.deepEqual(samples(m, 'sluice_backend_inflight', { backend: slow.url }).map((s) => s.value), [n]);
    for (const r of await Promise.all(replies)) assert.equal(r.status, 200);
    await poll(async () => row((await status_json(sluice.admin_url)).json, slow.url).inflight === 0 ? true : null,
      { what: 'the slow backend\'s in-flight count to fall to 0' });
    assert.equal(row((await status_json(sluice.admin_url)).json, slow.url).failures, 0);
  });

  it('failures: a backend that drops its streams counts them, the healthy one none', async () => {
    const n = 3;
    for (let i = 0; i < n; ++i) {
      const r = await post_fresh(sluice.url, chat_body({ model: 'flaky', stream: true, max_tokens: 20, content: `cut ${i}` }),
        { key: key_secret });
      assert.equal(r.status, 200);
      assert.ok(!r.text.includes('[DONE]'), 'the stream was cut');
    }
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.deepEqual(samples(m, 'sluice_backend_failures_total', { backend: flaky.url }).map((s) => s.value), [n]);
    assert.deepEqual(samples(m, 'sluice_backend_failures_total', { backend: slow.url }).map((s) => s.value), [0]);
    // The page's columns come from the sampler's next point (every 2 s).
    const json = await poll(async () => {
      const { json } = await status_json(sluice.admin_url);
      return row(json, flaky.url).failures === n ? json : null;
    }, { timeout_ms: bound_ms(10000), interval_ms: 200, what: 'the status page to count the failures' });
    assert.ok(row(json, flaky.url).failures_s > 0, JSON.stringify(row(json, flaky.url)));
    assert.equal(row(json, slow.url).failures, 0);
    assert.equal(row(json, flaky.url).inflight, 0);
  });
});

describe('status page with an admin token', () => {
  let backends, sluice;

  before(async () => {
    backends = await start_backends(1);
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { admin_token_env: 'SLUICE_TEST_ADMIN_TOKEN' } },
        groups: [{ name: 'g', models: ['*'], backends: [backends[0].url] }],
        keys: [{ id: 'bob', key: key_secret, groups: ['*'] }],
      }),
      env: { SLUICE_TEST_ADMIN_TOKEN: 'status-admin-token' },
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('serves the page without data until the token comes; /status.json wants it', async () => {
    const page = await fetch(`${sluice.admin_url}/`);
    assert.equal(page.status, 200);
    const html = await page.text();
    assert.ok(!html.includes('<td>bob</td>') && !html.includes(backends[0].url), 'data without the token');
    assert.ok(html.includes('admin token'));
    const none = await fetch(`${sluice.admin_url}/status.json`);
    assert.equal(none.status, 401);
    await none.arrayBuffer();
    const auth = { authorization: 'Bearer status-admin-token' };
    const { text, json } = await status_json(sluice.admin_url, auth);
    assert.deepEqual(json.keys.map((k) => k.id), ['bob']);
    assert.ok(!text.includes('status-admin-token') && !text.includes(key_secret));
    const full = await (await fetch(`${sluice.admin_url}/`, { headers: auth })).text();
    assert.ok(full.includes('<td>bob</td>'));
    assert.ok(!full.includes('status-admin-token'));
    const drain = await fetch(`${sluice.admin_url}/backends/drain?url=${encodeURIComponent(backends[0].url)}&then=page`, { method: 'POST' });
    assert.equal(drain.status, 401);
    await drain.arrayBuffer();
  });
});
