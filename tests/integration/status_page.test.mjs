// The operator's status page on the admin listener: GET /status.json (rates,
// latencies, backends, keys, shards from the control thread's sampler) and
// GET / (the HTML page, tables rendered server-side, drain forms that work
// without JavaScript). A real sluice in front of two mock-vllm backends.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { gateway_config, poll, post_fresh, start_backends } from './lib/gateway.mjs';
import { bound_ms, chat_body, start_sluice, stop_all } from './lib/harness.mjs';

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
