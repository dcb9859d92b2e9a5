// Limits that need real processes: a key whose traffic all lands on one
// shard still gets its whole bucket (the slices lend), and the upstream
// total timeout.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';

import { chat_body, http_post, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { gateway_config, post_fresh } from './lib/gateway.mjs';

describe('skew: one connection, one shard', () => {
  let mock;
  let sluice;
  const key = 'sk-skew-7777';

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 2 });
    sluice = await start_sluice({
      config: gateway_config({
        groups: [{ name: 'default', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'skew', key, requests_per_minute: 600, groups: ['*'] }],
      }),
      // Two shards, so the connection's shard starts with half the bucket.
      extra_args: ['--cpus', '0,1'],
    });
  });
  after(() => stop_all(sluice, mock));

  it('gets at least 90% of the key\'s bucket, not its shard\'s half', async () => {
    // One keep-alive connection: every request lands on the same shard,
    // whose own slice is 300 of the 600. Refill adds 10 a second, so
    // within ~2 s only lending from the other shard can go past ~320.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const started = Date.now();
    let admitted = 0;
    let refused = 0;
    try {
      while (Date.now() - started < 2000 && admitted < 600) {
        const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 2 }), {
          agent, headers: { authorization: `Bearer ${key}` },
        });
        if (r.status === 200) ++admitted;
        else if (r.status === 429) ++refused;
        else assert.fail(`unexpected ${r.status}: ${r.text}`);
      }
    } finally {
      agent.destroy();
    }
    const seconds = (Date.now() - started) / 1000;
    const bucket = 600 + 10 * seconds;
    console.log(`skew: ${admitted} admitted, ${refused} refused in ${seconds.toFixed(2)} s; bucket ${bucket.toFixed(0)}`);
    assert.ok(admitted >= 0.9 * 600, `admitted ${admitted} of 600 on one shard`);
    assert.ok(admitted <= bucket + 1, `admitted ${admitted} exceeds the bucket ${bucket}`);
  });
});

describe('upstream total timeout', () => {
  let slow_head;
  let slow_stream;
  let sluice;

  before(async () => {
    slow_head = await start_mock_vllm({ ttft_ms: 5000, reply_tokens: 4 });
    slow_stream = await start_mock_vllm({ tokens_per_sec: 10, reply_tokens: 200 });
    sluice = await start_sluice({
      config: gateway_config({
        groups: [
          { name: 'head', models: ['head'], backends: [slow_head.url], upstream: { total_timeout_ms: 400, max_retries: 0 } },
          { name: 'stream', models: ['stream'], backends: [slow_stream.url], upstream: { total_timeout_ms: 400 } },
        ],
        keys: [{ id: 'test', key: 'test-key', groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, slow_head, slow_stream));

  it('answers 504 when the backend has not answered within total_timeout_ms', async () => {
    const t0 = Date.now();
    const r = await post_fresh(sluice.url, chat_body({ model: 'head' }), { key: 'test-key' });
    const ms = Date.now() - t0;
    assert.equal(r.status, 504, r.text);
    assert.equal(JSON.parse(r.text).error.code, 'upstream_timeout');
    // Well before the backend's 5 s: the timeout acted, not the backend.
    assert.ok(ms < 4000, `answered after ${ms} ms`);
  });

  it('cuts a stream that runs past total_timeout_ms: no terminal chunk, no [DONE]', async () => {
    const t0 = Date.now();
    const r = await post_fresh(sluice.url, chat_body({ model: 'stream', stream: true, max_tokens: 200 }), { key: 'test-key' });
    const ms = Date.now() - t0;
    assert.equal(r.status, 200);
    assert.equal(r.complete, false, 'the response must end truncated');
    assert.ok(!r.text.includes('[DONE]'), 'never a fake [DONE]');
    assert.ok(ms < 15000, `cut after ${ms} ms (the whole stream takes 20 s)`);
  });
});
