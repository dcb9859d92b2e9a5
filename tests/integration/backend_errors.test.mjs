// A backend's error answers (docs/architecture.md §8): vLLM's flat error body, its
// integer codes and its --api-key 401 reach the client in OpenAI's shape;
// a 502/503 before anything reached the client is retried on the next
// backend of the ring (issue 3: retry), at most upstream.max_retries times.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { chat_body, is_openai_error, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { backend_of, gateway_config, header_of, post_fresh, recorded_requests, run_pool, start_backends } from './lib/gateway.mjs';

const key = 'sk-backend-errors-31c9';
// The same loopback backend, named by the shorter address form 127.1.
const short_url = (b) => `http://127.1:${b.port}`;

describe('a backend\'s error answers in OpenAI\'s shape', () => {
  let flat;
  let nested;
  let locked;
  let sluice;

  before(async () => {
    flat = await start_mock_vllm({ model: 'flat' });
    nested = await start_mock_vllm({ model: 'nested', extra_args: ['--error-format', 'nested'] });
    // A backend that wants a key sluice does not send: its 401.
    locked = await start_mock_vllm({ model: 'locked', api_key: 'backend-secret' });
    sluice = await start_sluice({
      config: gateway_config({
        groups: [
          { name: 'flat', models: ['flat'], backends: [flat.url] },
          { name: 'nested', models: ['nested'], backends: [nested.url] },
          { name: 'locked', models: ['locked'], backends: [locked.url] },
        ],
        keys: [{ id: 'k', key, groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, flat, nested, locked));

  // A body sluice accepts (content is any JSON value to it) and vLLM refuses.
  const refused = (model) => ({ model, messages: [{ role: 'user', content: 5 }], max_tokens: 4 });

  for (const model of ['flat', 'nested']) {
    it(`a 400 with vLLM's ${model} body: same status, OpenAI's shape, the backend's message, no integer code`, async () => {
      const direct = await post_fresh(model === 'flat' ? flat.url : nested.url, refused(model), {});
      assert.equal(direct.status, 400);
      const backend_body = JSON.parse(direct.text);
      const backend_message = backend_body.message ?? backend_body.error.message;
      assert.ok(backend_message.length > 0);

      const r = await post_fresh(sluice.url, refused(model), { key });
      assert.equal(r.status, 400);
      assert.match(r.headers['content-type'], /^application\/json/);
      assert.ok(r.headers['x-request-id']);
      const body = JSON.parse(r.text);
      assert.ok(is_openai_error(body), r.text);
      assert.deepEqual(Object.keys(body), ['error']);
      assert.equal(body.error.message, backend_message);
      assert.equal(body.error.type, 'invalid_request_error');
      assert.equal(body.error.code, null);
      assert.equal(Number(r.headers['content-length']), Buffer.byteLength(r.text));
    });
  }

  it('the OpenAI SDK raises a BadRequestError carrying the backend\'s message', async () => {
    const client = new OpenAI({ apiKey: key, baseURL: `${sluice.url}/v1`, maxRetries: 0 });
    await assert.rejects(client.chat.completions.create(refused('flat')), (err) => {
      assert.equal(err.status, 400);
      assert.equal(err.constructor.name, 'BadRequestError');
      assert.match(err.message, /400/);
      assert.ok(err.error && typeof err.error.message === 'string' && err.error.message.length > 0);
      return true;
    });
  });

  it('a backend\'s 401 (sluice\'s credential refused) is a 502 bad_gateway, never the client\'s invalid_api_key', async () => {
    const r = await post_fresh(sluice.url, chat_body({ model: 'locked' }), { key });
    assert.equal(r.status, 502);
    const body = JSON.parse(r.text);
    assert.ok(is_openai_error(body));
    assert.equal(body.error.code, 'bad_gateway');
    assert.match(body.error.message, /credentials/);
    assert.ok(!r.text.includes(key), 'the client key is not echoed');
  });

  it('the connection stays usable: a good request follows on the same keep-alive connection', async () => {
    const agent = new (await import('node:http')).Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const { http_post } = await import('./lib/harness.mjs');
      const headers = { authorization: `Bearer ${key}` };
      const bad = await http_post(sluice.url, '/v1/chat/completions', refused('flat'), { headers, agent });
      assert.equal(bad.status, 400);
      const good = await http_post(sluice.url, '/v1/chat/completions', chat_body({ model: 'flat' }), { headers, agent });
      assert.equal(good.status, 200);
      assert.equal(JSON.parse(good.text).object, 'chat.completion');
    } finally {
      agent.destroy();
    }
  });
});

describe('a backend answering 503: retried on the next backend before anything reached the client', () => {
  let backends;
  let down;
  let sluice;
  let sluice_no_retry;

  before(async () => {
    backends = await start_backends(2);
    down = await start_mock_vllm({ model: 'down', extra_args: ['--fail-status', '503'] });
    const config = (max_retries) => gateway_config({
      tables: { upstream: { max_retries } },
      // Backend 0 is named by a shorter address form (127.1): a retry from
      // the failing backend to it rewrites the host to a shorter one.
      // No passive ejection: the failing backend stays in the ring, so every
      // test here sees retries.
      groups: [{
        name: 'g', models: ['*'], balance: 'round-robin', backends: [down.url, short_url(backends[0]), backends[1].url],
        health: { eject_after: 0 },
      }],
      keys: [{ id: 'k', key, groups: ['*'] }],
    });
    sluice = await start_sluice({ config: config(1), extra_args: ['--cpus', '0'] });
    sluice_no_retry = await start_sluice({ config: config(0), extra_args: ['--cpus', '0'] });
  });
  after(() => stop_all(sluice, sluice_no_retry, down, ...(backends ?? [])));

  it('with max_retries = 1 every request succeeds, a third of them after a 503 from the failing backend', async () => {
    await down.clear_requests();
    const results = await run_pool(30, 1, (i) => post_fresh(sluice.url, chat_body({ content: `r ${i}` }), { key }));
    for (const r of results) {
      assert.equal(r.status, 200, r.text);
      assert.ok(backend_of(r.text) >= 0, 'served by a healthy backend');
    }
    const seen_by_down = (await recorded_requests([down])).length;
    assert.ok(seen_by_down >= 5, `the failing backend was tried (${seen_by_down} times)`);
  });

  it('every attempt carries its own backend\'s host, and the body arrives byte-identical after a retry', async () => {
    await down.clear_requests();
    for (const b of backends) await b.clear_requests();
    const bodies = Array.from({ length: 12 }, (_, i) => JSON.stringify(chat_body({ content: `host check ${i}` })));
    const results = await run_pool(bodies.length, 1, (i) => post_fresh(sluice.url, bodies[i], { key }));
    assert.ok(results.every((r) => r.status === 200));
    const hosts = [new URL(down.url).host, `127.1:${backends[0].port}`, new URL(backends[1].url).host];
    const seen = await recorded_requests([down, ...backends]);
    assert.ok(seen.filter((q) => q.backend === 0).length >= 2, 'round-robin reached the failing backend, and each of those was retried');
    for (const q of seen) {
      assert.equal(header_of(q, 'host'), hosts[q.backend], `backend ${q.backend}'s host`);
      assert.ok(bodies.includes(q.body), `a body arrived altered: ${q.body}`);
    }
    // Every body reached a healthy backend exactly once.
    const served = seen.filter((q) => q.backend > 0).map((q) => q.body).sort();
    assert.deepEqual(served, [...bodies].sort());
  });

  it('with max_retries = 0 the 503 reaches the client, in OpenAI\'s shape', async () => {
    const results = await run_pool(9, 1, (i) => post_fresh(sluice_no_retry.url, chat_body({ content: `n ${i}` }), { key }));
    const shed = results.filter((r) => r.status === 503);
    assert.ok(shed.length >= 1, 'round-robin reaches the failing backend');
    for (const r of shed) {
      const body = JSON.parse(r.text);
      assert.ok(is_openai_error(body), r.text);
      assert.equal(body.error.type, 'server_error');
      assert.match(body.error.message, /cannot take requests/);
      assert.equal(body.error.code, null);
    }
  });
});
