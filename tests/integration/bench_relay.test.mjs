// bench-relay, the floor bench/compare measures proxies against: the bytes
// a client gets through it are the backend's, byte for byte (JSON, SSE,
// keep-alive, a large body), and a backend that goes away closes the client
// connection.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import {
  bound_ms, chat_body, managed_process, program, raw_connection, raw_exchange, build_request, start_mock_vllm, stop_all,
} from './lib/harness.mjs';

async function start_relay(backend_port, threads = 2) {
  const proc = new managed_process('bench-relay', program('bench-relay'),
    ['--listen', '0', '--backend', `127.0.0.1:${backend_port}`, '--threads', String(threads)]);
  const line = await proc.wait_for_line(/bench-relay listening on 127\.0\.0\.1:(\d+)/, { timeout_ms: bound_ms(10000) });
  return { proc, port: Number(line.match[1]), stop: (o) => proc.stop(o) };
}

const request = (body) => build_request({
  headers: [['Host', '127.0.0.1'], ['Content-Type', 'application/json'], ['Authorization', 'Bearer k']],
  body: JSON.stringify(body),
});

describe('bench-relay', () => {
  let mock, relay;
  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 180 });
    relay = await start_relay(mock.port);
  });
  after(() => stop_all(relay, mock));

  for (const [name, body] of [
    ['a JSON answer', chat_body({ max_tokens: 16 })],
    ['an SSE stream of 180 tokens', chat_body({ stream: true, max_tokens: 180 })],
  ]) {
    it(`${name}: the same bytes as direct`, async () => {
      const direct = (await raw_exchange(mock.port, request(body), { timeout_ms: bound_ms(5000) })).responses[0];
      const relayed = (await raw_exchange(relay.port, request(body), { timeout_ms: bound_ms(5000) })).responses[0];
      assert.equal(relayed.status, 200);
      assert.equal(relayed.complete, true);
      // The mock numbers its answers' ids: the rest is the same bytes.
      const same = (b) => b.toString().replace(/chatcmpl-[0-9a-f]+/g, 'chatcmpl-ID');
      assert.equal(same(relayed.body), same(direct.body));
      assert.ok(relayed.body.length > 100);
    });
  }

  it('keeps the connection: several requests on one, each answered whole', async () => {
    const conn = await raw_connection.connect(relay.port);
    try {
      for (let i = 0; i < 5; ++i) {
        await conn.write(request(chat_body({ stream: i % 2 === 1, max_tokens: 8, content: `turn ${i}` })));
        const r = await conn.read_response({ timeout_ms: bound_ms(5000) });
        assert.equal(r.status, 200);
        assert.equal(r.complete, true, `response ${i} complete`);
      }
    } finally {
      conn.destroy();
    }
  });

  it('a backend that is gone: the client connection closes, the relay serves on', async () => {
    const gone = await start_mock_vllm();
    const port = gone.port;
    await gone.stop();
    const dead = await start_relay(port, 1);
    try {
      const conn = await raw_connection.connect(dead.port);
      try {
        assert.equal(await conn.wait_close({ timeout_ms: bound_ms(5000) }), true, 'closed when the connect fails');
      } finally {
        conn.destroy();
      }
      assert.equal(dead.proc.exit, null, 'the relay still runs');
    } finally {
      await dead.stop();
    }
    const r = await raw_exchange(relay.port, request(chat_body({})), { timeout_ms: bound_ms(5000) });
    assert.equal(r.responses[0].status, 200);
  });
});
