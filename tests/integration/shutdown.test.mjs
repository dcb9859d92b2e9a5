// SIGTERM while 50 streams are in flight: sluice stops accepting, lets every
// stream finish with its full content and `[DONE]`, then exits 0.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';

import path from 'node:path';

import { read_audit } from './lib/gateway.mjs';
import {
  bound_ms, chat_body, http_post, restart_mock_vllm_on, sse_events, start_mock_vllm, start_sluice, start_streams, stop_all, test_key,
  with_timeout,
} from './lib/harness.mjs';

const streams = 50;

describe('SIGTERM during active streams', () => {
  let mock;
  let sluice;
  let agent;

  before(async () => {
    // 20 tokens at 20/s: each stream lasts about a second after SIGTERM.
    mock = await start_mock_vllm({ tokens_per_sec: 20, reply_tokens: 20 });
    sluice = await start_sluice({ backends: [mock.url] });
    agent = new http.Agent({ keepAlive: true, maxSockets: streams });
  });
  after(async () => {
    agent.destroy();
    await stop_all(sluice, mock);
  });

  it(`all ${streams} streams complete and sluice exits 0`, async () => {
    const body = (i) => chat_body({ stream: true, max_tokens: 20, content: `drain ${i}` });
    const expected = await Promise.all(Array.from({ length: streams }, (_, i) => http_post(
      mock.url, '/v1/chat/completions', body(i), { headers: { 'x-request-id': `drain-${i}` }, timeout_ms: bound_ms(30000) })));

    // Start every stream and wait until each has body bytes flowing.
    const { replies, until_started } = start_streams(sluice.url, streams, body, {
      agent, headers: (i) => ({ authorization: `Bearer ${test_key}`, 'x-request-id': `drain-${i}` }),
    });
    await until_started();

    sluice.proc.child.kill('SIGTERM');
    const signalled_at = performance.now();
    const results = await Promise.all(replies);
    const exit = await with_timeout(sluice.proc.exited, bound_ms(15000), 'sluice to exit after SIGTERM');
    console.log(`sluice exited ${JSON.stringify(exit)} ${(performance.now() - signalled_at).toFixed(0)} ms after SIGTERM`);

    for (let i = 0; i < streams; ++i) {
      const r = results[i];
      assert.equal(r.status, 200, `stream ${i}`);
      assert.equal(r.complete, true, `stream ${i} completed`);
      assert.equal(sse_events(r.text).at(-1), '[DONE]', `stream ${i} ends with [DONE]`);
      assert.equal(r.text, expected[i].text, `stream ${i} has the full content`);
    }
    assert.deepEqual(exit, { code: 0, signal: null }, `sluice output:\n${sluice.proc.output()}`);
  });
});

describe('a second SIGTERM during a drain', () => {
  let mock;
  let sluice;

  before(async () => {
    // Streams of a minute (600 tokens at 10/s) against a drain of a minute:
    // only the second signal can end them in time.
    mock = await start_mock_vllm({ tokens_per_sec: 10, reply_tokens: 600 });
    sluice = await start_sluice({ backends: [mock.url], extra_args: ['--cpus', '0'] });
  });
  after(() => stop_all(sluice, mock));

  it('cuts the open streams at once: exit 0 within 1 s, one audit line each, marked cancelled', async () => {
    const count = 4;
    let started = 0;
    let all_started;
    const all_started_promise = new Promise((resolve) => { all_started = resolve; });
    const replies = Array.from({ length: count }, (_, i) => {
      let counted = false;
      return http_post(sluice.url, '/v1/chat/completions', chat_body({ stream: true, max_tokens: 600, content: `cut ${i}` }), {
        headers: { authorization: `Bearer ${test_key}`, 'x-request-id': `cut-${i}` },
        timeout_ms: bound_ms(30000),
        on_data: () => {
          if (counted) return;
          counted = true;
          if (++started === count) all_started();
        },
      }).catch((err) => ({ error: err }));
    });
    await with_timeout(all_started_promise, bound_ms(10000), `all ${count} streams to start (${started} did)`);

    const mark = sluice.proc.mark();
    sluice.proc.child.kill('SIGTERM');
    await sluice.proc.wait_for_line(/draining/, { from: mark });
    const second_at = performance.now();
    sluice.proc.child.kill('SIGTERM');
    const exit = await with_timeout(sluice.proc.exited, bound_ms(5000), 'sluice to exit after the second SIGTERM');
    const took_ms = performance.now() - second_at;
    assert.deepEqual(exit, { code: 0, signal: null }, `sluice output:\n${sluice.proc.output()}`);
    assert.ok(took_ms < bound_ms(1000), `sluice took ${took_ms.toFixed(0)} ms to exit after the second SIGTERM`);

    const results = await Promise.all(replies);
    for (const r of results) {
      // Cut mid-stream: the response never ends with its terminal chunk.
      assert.ok(r.error !== undefined || r.complete === false, `a cut stream ended as complete: ${JSON.stringify(r).slice(0, 300)}`);
    }
    const records = read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
    for (let i = 0; i < count; ++i) {
      const mine = records.filter((a) => a.request_id === `cut-${i}`);
      assert.equal(mine.length, 1, `one audit line for cut-${i}: ${JSON.stringify(records)}`);
      assert.equal(mine[0].cancelled, true, `cut-${i} is marked cancelled: ${JSON.stringify(mine[0])}`);
      assert.equal(mine[0].status, 200);
      assert.ok(mine[0].completion_tokens > 0, `cut-${i} is billed what it streamed: ${JSON.stringify(mine[0])}`);
    }
  });
});

describe('pooled backend connections the backend closes', () => {
  let mock;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({});
    sluice = await start_sluice({ backends: [mock.url], extra_args: ['--cpus', '0'] });
  });
  after(() => stop_all(sluice, mock));

  it('leave the pool cleanly (the next requests use new connections) and SIGTERM still exits 0', async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
    const post = () => http_post(sluice.url, '/v1/chat/completions', chat_body({}), {
      agent, headers: { authorization: `Bearer ${test_key}` },
    });
    try {
      // Fill the pool with several connections, then the backend goes away
      // and comes back on the same port: every pooled socket sees EOF.
      const first = await Promise.all(Array.from({ length: 8 }, post));
      assert.ok(first.every((r) => r.status === 200));
      const port = mock.port;
      await mock.stop();
      mock = await restart_mock_vllm_on(port);
      const again = await Promise.all(Array.from({ length: 8 }, post));
      assert.deepEqual(again.map((r) => r.status), Array(8).fill(200));
    } finally {
      agent.destroy();
    }
    sluice.proc.child.kill('SIGTERM');
    const exit = await with_timeout(sluice.proc.exited, bound_ms(15000), 'sluice to exit after SIGTERM');
    assert.deepEqual(exit, { code: 0, signal: null }, `sluice output:\n${sluice.proc.output()}`);
  });
});
