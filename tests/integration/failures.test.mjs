// Failure in the middle of a stream.
// - A client that goes away: mock-vllm must see its backend connection close
//   (and print its `abort` line) within 100 ms of the client's destroy():
//   that is what makes vLLM stop generating and free the KV cache.
// - A backend that dies: the client's response ends truncated (no terminal
//   chunk, no `[DONE]`, connection closed), promptly, and sluice goes on
//   serving.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import {
  bound_ms, build_request, chat_body, http_post, raw_connection, sluice_config, sse_content, sse_events,
  restart_mock_vllm_on, start_mock_vllm, start_sluice, stop_all, test_key,
} from './lib/harness.mjs';

const abort_limit_ms = 100;

// Starts a stream, destroys the client once the first body bytes arrived,
// and returns how long mock-vllm took to print its abort line for it.
async function abort_latency_ms(mock, base_url, id, headers = {}) {
  const from = mock.proc.mark();
  let destroyed_at = null;
  const reply = http_post(base_url, '/v1/chat/completions', chat_body({ stream: true, max_tokens: 2000 }), {
    headers: { 'x-request-id': id, ...headers },
    on_data: (data, req) => {
      if (destroyed_at !== null) return;
      destroyed_at = performance.now();
      req.destroy();
    },
  }).catch(() => null);
  const pattern = new RegExp(`abort request_id=\\S*${id}\\b`);
  const { line } = await mock.proc.wait_for_line(pattern, { from, timeout_ms: bound_ms(5000) });
  await reply;
  assert.notEqual(destroyed_at, null, 'the stream had started');
  return line.at_ms - destroyed_at;
}

describe('client disconnect mid-stream', () => {
  let mock;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 20, reply_tokens: 2000 });
    sluice = await start_sluice({ backends: [mock.url] });
  });
  after(() => stop_all(sluice, mock));

  it('mock-vllm itself sees a direct client\'s close promptly (control)', async () => {
    const ms = await abort_latency_ms(mock, mock.url, 'abort-direct');
    console.log(`direct client close -> mock-vllm abort: ${ms.toFixed(1)} ms`);
    assert.ok(ms < abort_limit_ms, `${ms.toFixed(1)} ms`);
  });

  for (const [mode, splice] of [['copy', false]]) {
    it(`closes the backend connection within ${abort_limit_ms} ms of the client's close (${mode} path)`, async () => {
      // Each path explicitly, whatever the default.
      const server = await start_sluice({ backends: [mock.url], config: sluice_config({ backends: [mock.url], server: { splice } }) });
      try {
        const samples = [];
        for (let i = 0; i < 3; ++i) {
          samples.push(await abort_latency_ms(mock, server.url, `abort-${mode}-${i}`, { authorization: `Bearer ${test_key}` }));
        }
        console.log(`client close -> backend abort through sluice (${mode}): ${samples.map((ms) => ms.toFixed(1)).join(', ')} ms`);
        for (const ms of samples) assert.ok(ms < abort_limit_ms, `${ms.toFixed(1)} ms >= ${abort_limit_ms} ms`);
        // And sluice still serves.
        const next = await http_post(server.url, '/v1/chat/completions', chat_body({ max_tokens: 2 }), { headers: { authorization: `Bearer ${test_key}` } });
        assert.equal(next.status, 200);
      } finally {
        await stop_all(server);
      }
    });
  }
});

describe('backend killed mid-stream', () => {
  let failing;
  let healthy;
  let sluice;

  before(async () => {
    failing = await start_mock_vllm({ tokens_per_sec: 50, reply_tokens: 50, fail_after_tokens: 3 });
    sluice = await start_sluice({ backends: [failing.url] });
  });
  after(() => stop_all(sluice, failing, healthy));

  it('the client gets a truncated response, promptly, and sluice serves the next request', async () => {
    const body = JSON.stringify(chat_body({ stream: true, max_tokens: 50 }));
    const conn = await raw_connection.connect(sluice.port);
    const started = performance.now();
    let response;
    try {
      await conn.write(build_request({
        headers: [['Host', '127.0.0.1'], ['Authorization', `Bearer ${test_key}`], ['Content-Type', 'application/json'], ['X-Request-Id', 'killed-1']],
        body,
      }));
      // Bounded: a hang fails here.
      response = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(await conn.wait_close({ timeout_ms: bound_ms(2000) }), true, 'sluice closes the client connection');
    } finally {
      conn.destroy();
    }
    console.log(`truncated response ended after ${(performance.now() - started).toFixed(0)} ms`);
    assert.equal(response.status, 200, 'the head was already sent');
    assert.equal(response.terminal_chunk, false, 'no terminal chunk');
    assert.equal(response.complete, false, 'the response is truncated');
    const text = response.text();
    assert.ok(!text.includes('[DONE]'), `no fake [DONE]: ${JSON.stringify(text)}`);
    assert.ok(text.startsWith('data: '), 'some events came through before the failure');

    // The same port now gets a healthy backend; sluice must serve it.
    const port = failing.port;
    await failing.stop();
    healthy = await start_healthy_on(port);
    const next = await http_post(sluice.url, '/v1/chat/completions', chat_body({ stream: true, max_tokens: 5 }), {
      headers: { authorization: `Bearer ${test_key}`, 'x-request-id': 'after-kill' },
    });
    assert.equal(next.status, 200);
    assert.equal(next.complete, true);
    assert.equal(sse_events(next.text).at(-1), '[DONE]');
    assert.ok(sse_content(next.text).length > 0);
    const plain = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 5 }), {
      headers: { authorization: `Bearer ${test_key}` },
    });
    assert.equal(plain.status, 200);
    assert.ok(JSON.parse(plain.text).choices[0].message.content.length > 0);
  });
});

// Re-binding a port just freed can briefly fail; retry for a bounded time.
function start_healthy_on(port) {
  return restart_mock_vllm_on(port, { tokens_per_sec: 1000, reply_tokens: 10 });
}
