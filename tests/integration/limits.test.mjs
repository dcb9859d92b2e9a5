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
        keys: [{ id: 'skew', key, requests_per_minute: 60, groups: ['*'] }],
      }),
      // Two shards, so the connection's shard starts with half the bucket.
      extra_args: ['--cpus', '0,1'],
    });
  });
  after(() => stop_all(sluice, mock));

  it('gets the key\'s whole bucket, not its shard\'s half', async () => {
    // One keep-alive connection: every request lands on the same shard,
    // whose own slice is 30 of the 60. Refill adds 1 a second, so without
    // lending from the other shard the 60th admission would come half a
    // minute in; the loop gives up at 20 s. Then a few more requests: the
    // whole bucket spent, they may take only what refill added.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const started = Date.now();
    let admitted = 0;
    let refused = 0;
    let full_at = 0;  // seconds until the 60th admission
    const post = async () => {
      const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 2 }), {
        agent, headers: { authorization: `Bearer ${key}` },
      });
      if (r.status === 200) ++admitted;
      else if (r.status === 429) ++refused;
      else assert.fail(`unexpected ${r.status}: ${r.text}`);
    };
    try {
      while (Date.now() - started < 20000 && admitted < 60) await post();
      full_at = (Date.now() - started) / 1000;
      for (let i = 0; i < 10; ++i) await post();
    } finally {
      agent.destroy();
    }
    const seconds = (Date.now() - started) / 1000;
    console.log(`skew: ${admitted} admitted, ${refused} refused in ${seconds.toFixed(2)} s (60 by ${full_at.toFixed(2)} s)`);
    assert.ok(admitted >= 60, `admitted ${admitted} of 60 in ${full_at.toFixed(2)} s on one shard`);
    // More than one shard's slice and its refill could give: lending.
    assert.ok(admitted > 30 + Math.ceil(full_at) + 1, `admitted ${admitted}: no more than the shard's own slice`);
    assert.ok(admitted <= 60 + Math.ceil(seconds) + 1, `admitted ${admitted} exceeds the bucket (60 + 1/s over ${seconds} s)`);
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
