// The embeddings router (issue 18): [router] semantic = "embeddings". The
// groups' examples are embedded at start by the embeddings group; a prompt's
// vector picks the group whose centroid is nearest (cosine). The expected
// group is computed here from the embeddings backend's own answers (asked
// directly, not through sluice), so the test checks sluice's arithmetic
// against an independent one.
//
// Two embeddings backends: mock-vllm (vLLM's bytes: Content-Length, compact
// JSON) and a scripted one written here (chunked, spaces and newlines in its
// JSON, a 26-letter bag-of-letters vector) that can also hang or answer 500.
// When the embeddings backend is down, hangs past embeddings_timeout_ms or
// answers garbage, the classifier decides and the client never sees it.
import assert from 'node:assert/strict';
import http from 'node:http';
import http2 from 'node:http2';
import { after, before, describe, it } from 'node:test';

import { bound_ms, start_sluice, stop_all } from './lib/harness.mjs';
import { backend_of, gateway_config, header_of, post_fresh, read_audit, recorded_requests, samples, scrape, start_backends } from './lib/gateway.mjs';

const key = 'sk-router-embeddings-5e1d';
const groups = ['alpha', 'beta', 'gamma'];
const examples = {
  alpha: ['an apple a day', 'apples and pears', 'a basket of apples'],
  beta: ['quiet zebras buzz', 'fuzzy jazz quiz'],
  gamma: ['the river runs to the sea', 'rivers meet the ocean', 'streams become rivers', 'the sea is wide'],
};
// Prompts never seen in the examples (and the examples themselves).
const prompts = [
  'apple pie', 'a jazz zebra', 'the wide river', 'zzz buzz', 'seas and oceans', 'pear tree', 'quiz night',
  'hello there', '苹果和梨', 'x', ...Object.values(examples).flat(),
];

const unit = (v) => {
  const n = Math.hypot(...v);
  return n > 0 ? v.map((x) => x / n) : v;
};
const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);

// The nearest centroid, computed from the backend's own vectors.
function expected_group(centroids, v) {
  let best = -1;
  let best_dot = -2;
  for (const [i, c] of centroids.entries()) {
    const d = dot(c.vec, v);
    if (d > best_dot) { best_dot = d; best = i; }
  }
  return { group: centroids[best].group, cosine: best_dot / Math.hypot(...v) };
}

async function embed_direct(url, input) {
  const r = await fetch(`${url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'embed', input }) });
  assert.equal(r.status, 200);
  return (await r.json()).data.map((d) => d.embedding);
}

async function centroids_of(url) {
  const out = [];
  for (const g of groups) {
    const vecs = await embed_direct(url, examples[g]);
    const sum = vecs.map(unit).reduce((s, v) => s.map((x, i) => x + v[i]));
    out.push({ group: g, vec: unit(sum) });
  }
  return out;
}

const config = (embed_url, extra = {}) => gateway_config({
  tables: { router: { semantic: 'embeddings', embeddings_group: 'embed', default_group: 'alpha', min_confidence: 0, group_header: true, embeddings_timeout_ms: 300, ...extra } },
  groups: [
    ...groups.map((name, i) => ({ name, models: [name], backends: [backends[i].url], examples: examples[name] })),
    { name: 'embed', models: ['embed-model'], backends: [embed_url], api_key_env: 'SLUICE_TEST_EMBED_KEY' },
  ],
  keys: [{ id: 'all', key, groups: ['*'] }],
});

let backends = [];

async function send(sluice, content, headers = {}) {
  const r = await post_fresh(sluice.url, { model: 'auto', messages: [{ role: 'user', content }], max_tokens: 2 }, { key, headers });
  assert.equal(r.status, 200, r.text.slice(0, 300));
  const b = backend_of(r.text);
  assert.ok(b >= 0 && b < groups.length, r.text.slice(0, 200));
  assert.equal(r.headers['x-sluice-group'], groups[b]);
  return { group: groups[b], request_id: r.headers['x-request-id'] };
}

const counter = async (admin_url, name, match) => {
  const s = samples((await scrape(admin_url)).parsed, name, match);
  return s.reduce((t, x) => t + x.value, 0);
};

async function audit_by_id(sluice, ids) {
  const want = new Set(ids);
  let lines = [];
  for (let i = 0; i < 200; ++i) {
    lines = read_audit(`${sluice.dir}/sluice-audit.jsonl`).filter((l) => want.has(l.request_id));
    if (lines.length === want.size) break;
    await new Promise((r) => setTimeout(r, 25));
  }
  return new Map(lines.map((l) => [l.request_id, l]));
}

describe('embeddings router in front of mock-vllm', () => {
  let embed;
  let sluice;
  before(async () => {
    backends = await start_backends(groups.length + 1);
    embed = backends[groups.length];
    sluice = await start_sluice({ config: config(embed.url), extra_args: ['--cpus', '0'], env: { ...process.env, SLUICE_TEST_EMBED_KEY: 'sk-embed-backend-key' } });
    await sluice.proc.wait_for_line(/embeddings centroids ready: 3 groups from 9 examples, 8 dimensions/, { timeout_ms: bound_ms(10000) });
  });
  after(async () => { await stop_all(sluice, ...backends); });

  it('picks the group of the nearest centroid, as computed from the backend\'s own vectors; audited as embeddings', async () => {
    const centroids = await centroids_of(embed.url);
    const vecs = await embed_direct(embed.url, prompts);
    await embed.clear_requests();
    const sent = [];
    for (const [i, p] of prompts.entries()) {
      const want = expected_group(centroids, vecs[i]);
      const got = await send(sluice, p);
      assert.equal(got.group, want.group, `prompt ${JSON.stringify(p)}`);
      sent.push({ ...got, want });
    }
    const audit = await audit_by_id(sluice, sent.map((s) => s.request_id));
    for (const s of sent) {
      const line = audit.get(s.request_id);
      assert.ok(line, `audit line of ${s.request_id}`);
      assert.equal(line.group, s.want.group);
      assert.equal(line.route, 'embeddings');
      // The audit writes the cosine to 3 decimals; a negative one as 0.
      assert.ok(Math.abs(line.route_confidence - Math.max(0, s.want.cosine)) <= 1.5e-3, `${line.route_confidence} vs ${s.want.cosine}`);
    }
    // What the embeddings backend was sent: one call per prompt, the
    // group's model and key, never the client's key.
    const calls = (await recorded_requests([embed])).filter((r) => r.target === '/v1/embeddings');
    assert.equal(calls.length, prompts.length);
    for (const c of calls) {
      assert.equal(header_of(c, 'authorization'), 'Bearer sk-embed-backend-key');
      const b = JSON.parse(c.body);
      assert.equal(b.model, 'embed-model');
      assert.equal(typeof b.input, 'string');
    }
    const decided = await counter(sluice.admin_url, 'sluice_router_decisions_total', { how: 'embeddings' });
    assert.ok(decided >= prompts.length, `decisions{how=embeddings} = ${decided}`);
  });

  it('answers a repeated prompt from the shard\'s cache: no call, the hit counted', async () => {
    const hits0 = await counter(sluice.admin_url, 'sluice_router_embeddings_cache_total', { result: 'hit' });
    const ok0 = await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'ok' });
    await embed.clear_requests();
    const first = await send(sluice, 'a fresh prompt about apples');
    for (let i = 0; i < 5; ++i) assert.equal((await send(sluice, 'a fresh prompt about apples')).group, first.group);
    const calls = (await recorded_requests([embed])).filter((r) => r.target === '/v1/embeddings');
    assert.equal(calls.length, 1);
    assert.equal(await counter(sluice.admin_url, 'sluice_router_embeddings_cache_total', { result: 'hit' }), hits0 + 5);
    assert.equal(await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'ok' }), ok0 + 1);
  });

  it('over HTTP/2 (h2c) a stream parks for its call and is answered as over HTTP/1.1', async () => {
    const centroids = await centroids_of(embed.url);
    const fresh = ['an h2 prompt about rivers', 'an h2 prompt about zebras and jazz'];
    const vecs = await embed_direct(embed.url, fresh);
    const session = http2.connect(sluice.url);
    try {
      const ask = (content) => new Promise((resolve, reject) => {
        const req = session.request({ ':method': 'POST', ':path': '/v1/chat/completions', 'content-type': 'application/json', authorization: `Bearer ${key}` });
        let text = '';
        let headers;
        req.on('response', (h) => { headers = h; });
        req.on('data', (d) => { text += d; });
        req.on('end', () => resolve({ headers, text }));
        req.on('error', reject);
        req.end(JSON.stringify({ model: 'auto', messages: [{ role: 'user', content }], max_tokens: 2 }));
      });
      // Both at once on one connection: each waits for its own call.
      const got = await Promise.all(fresh.map(ask));
      for (const [i, r] of got.entries()) {
        assert.equal(r.headers[':status'], 200, r.text);
        assert.equal(r.headers['x-sluice-group'], expected_group(centroids, vecs[i]).group);
      }
    } finally {
      session.close();
    }
  });

  it('with the embeddings backend down, the classifier decides: 200s, no client error, the failure counted', async () => {
    const failed0 = await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'failed' });
    await embed.stop();
    const sent = [];
    for (const p of ['never asked before one', 'never asked before two', 'apples again, fresh']) sent.push(await send(sluice, p));
    const audit = await audit_by_id(sluice, sent.map((s) => s.request_id));
    for (const s of sent) {
      const line = audit.get(s.request_id);
      assert.ok(['classifier', 'default'].includes(line.route), line.route);
      assert.equal(line.status, 200);
    }
    assert.ok(await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'failed' }) >= failed0 + 3);
  });
});

// A scripted embeddings backend of other bytes: chunked bodies, JSON with
// spaces and newlines, vectors of letter counts. `mode` switches it to
// hanging (accepts, never answers) or to 500s.
function scripted_embeddings() {
  const state = { mode: 'answer', calls: 0 };
  const letters = (s) => {
    const v = new Array(26).fill(0);
    for (const ch of s.toLowerCase()) { const c = ch.charCodeAt(0) - 97; if (c >= 0 && c < 26) v[c] += 1; }
    v[0] += 0.01;  // never the zero vector
    return v;
  };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      if (req.url !== '/v1/embeddings') { res.writeHead(200, { 'content-type': 'application/json' }); res.end('{}'); return; }
      state.calls += 1;
      if (state.mode === 'hang') return;  // never answers
      if (state.mode === 'fail') { res.writeHead(500, { 'content-type': 'application/json' }); res.end('{"error": {"message": "boom"}}'); return; }
      const input = JSON.parse(body).input;
      const list = Array.isArray(input) ? input : [input];
      const json = JSON.stringify({ object: 'list', data: list.map((t, i) => ({ object: 'embedding', index: i, embedding: letters(t) })), model: 'letters' }, null, 2);
      res.writeHead(200, { 'content-type': 'application/json' });
      const half = Math.floor(json.length / 2);
      res.write(json.slice(0, half));
      setImmediate(() => res.end(json.slice(half)));
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    state,
    letters,
    url: `http://127.0.0.1:${server.address().port}`,
    stop: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  })));
}

describe('embeddings router in front of a scripted backend (chunked, spaced JSON)', () => {
  let embed;
  let sluice;
  before(async () => {
    backends = await start_backends(groups.length);
    embed = await scripted_embeddings();
    sluice = await start_sluice({ config: config(embed.url), extra_args: ['--cpus', '0'], env: { ...process.env, SLUICE_TEST_EMBED_KEY: 'sk-embed-backend-key' } });
    await sluice.proc.wait_for_line(/embeddings centroids ready: 3 groups from 9 examples, 26 dimensions/, { timeout_ms: bound_ms(10000) });
  });
  after(async () => { await stop_all(sluice, ...backends, embed); });

  it('reads the other shape and picks the nearest centroid', async () => {
    const centroids = groups.map((g) => ({ group: g, vec: unit(examples[g].map((e) => unit(embed.letters(e))).reduce((s, v) => s.map((x, i) => x + v[i]))) }));
    for (const p of prompts) {
      const want = expected_group(centroids, embed.letters(p));
      assert.equal((await send(sluice, p)).group, want.group, `prompt ${JSON.stringify(p)}`);
    }
  });

  it('a backend that hangs past embeddings_timeout_ms, or answers 500: the classifier decides, in time', async () => {
    const t0 = await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'timeout' });
    const f0 = await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'failed' });
    embed.state.mode = 'hang';
    const hung = await send(sluice, 'hanging prompt, never cached');
    embed.state.mode = 'fail';
    const failed = await send(sluice, 'failing prompt, never cached');
    embed.state.mode = 'answer';
    assert.equal(await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'timeout' }), t0 + 1);
    assert.equal(await counter(sluice.admin_url, 'sluice_router_embeddings_calls_total', { result: 'failed' }), f0 + 1);
    const audit = await audit_by_id(sluice, [hung.request_id, failed.request_id]);
    for (const id of [hung.request_id, failed.request_id]) {
      assert.ok(['classifier', 'default'].includes(audit.get(id).route), audit.get(id).route);
      assert.equal(audit.get(id).status, 200);
    }
  });

  it('a client that leaves while its prompt is being embedded: audited 499, the shard serves on', async () => {
    embed.state.mode = 'hang';
    const r = await post_fresh(sluice.url, { model: 'auto', messages: [{ role: 'user', content: 'leaving early, never cached' }], max_tokens: 2 }, { key, timeout_ms: 50 });
    assert.equal(r.status, 0);
    // Audited at once as a client that left: 499, client_closed.
    let gone = [];
    for (let i = 0; i < 200 && gone.length === 0; ++i) {
      gone = read_audit(`${sluice.dir}/sluice-audit.jsonl`).filter((l) => l.status === 499);
      if (gone.length === 0) await new Promise((res) => setTimeout(res, 25));
    }
    assert.equal(gone.length, 1);
    assert.equal(gone[0].error, 'client_closed');
    embed.state.mode = 'answer';
    const next = await send(sluice, 'apple pie');
    assert.equal(next.group, 'alpha');
  });
});
