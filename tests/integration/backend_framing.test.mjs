// Backend framing that mock-vllm never writes, from a scripted backend:
// a read that ends inside the injected usage chunk (between the event's
// blank line and the chunk's CRLF, or inside the JSON), a chunked 204 on a
// kept-alive connection, a non-stream answer over the 1 MiB that sluice
// keeps of a body to read its usage.
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { poll, read_audit, samples, scrape } from './lib/gateway.mjs';
import {
  bound_ms, build_request, chat_body, http_post, raw_connection, sluice_config, sse_events,
  start_sluice, stop_all, test_key,
} from './lib/harness.mjs';
import { chat_stream_events, chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

const auth = { authorization: `Bearer ${test_key}` };

// Where the backend's first write of the usage chunk ends (the rest follows
// once the client has seen everything before that chunk).
const usage_splits = [
  ['after the event\'s blank line, before the chunk\'s CRLF', (c) => c.length - 2],
  ['between the CR and the LF after the event', (c) => c.length - 1],
  ['inside the usage JSON', (c) => Math.floor(c.length / 2)],
  ['after the size line', (c) => c.indexOf('\r\n') + 2],
];

describe('the injected usage chunk is cut wherever a read ends in it', () => {
  let backend, sluice;
  let release = () => {};
  let split_at = null;

  before(async () => {
    backend = await start_scripted_backend(async (socket) => {
      const events = chat_stream_events({ tokens: 3, prompt_tokens: 7 });
      const usage = chunk(events.at(-2));
      const before_usage = Buffer.concat([Buffer.from(sse_head), ...events.slice(0, -2).map(chunk)]);
      const cut = split_at(usage);
      const go = new Promise((resolve) => { release = resolve; });
      socket.write(Buffer.concat([before_usage, usage.subarray(0, cut)]));
      await go;
      socket.write(Buffer.concat([usage.subarray(cut), chunk(events.at(-1)), Buffer.from('0\r\n\r\n')]));
    });
    // Probes every 50 ms: several land while an answer is held; the
    // scripted backend answers them itself and the held answer stays held
    // for its own request.
    sluice = await start_sluice({ config: sluice_config({ backends: [backend.url], health: { interval_ms: 50 } }) });
    await poll(() => backend.probes.length >= 2, { what: 'two health probes answered' });
  });
  after(() => stop_all(sluice, backend));

  for (const [i, [where, at]] of usage_splits.entries()) {
    it(`split ${where}: the client gets no usage chunk, the audit the backend's usage`, async () => {
      split_at = at;
      const id = `usage-split-${i}`;
      let seen = '';
      const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ stream: true }), {
        headers: { ...auth, 'x-request-id': id },
        timeout_ms: bound_ms(10000),
        // Everything before the usage chunk has reached the client: sluice
        // has read (and held) the first part of that chunk. Now the rest.
        on_data: (d) => {
          seen += d.toString();
          if (seen.includes('"finish_reason":"stop"')) release();
        },
      });
      assert.equal(r.status, 200);
      assert.ok(r.complete);
      const events = sse_events(r.text);
      assert.equal(events.at(-1), '[DONE]');
      const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
      assert.ok(chunks.every((c) => c.choices.length > 0 && c.usage === undefined),
        `a chunk without choices (the usage sluice asked for) reached the client: ${r.text}`);
      assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), 'tok0 tok1 tok2');
      const rec = await poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === id),
        { what: `the audit record of ${id}` });
      assert.equal(rec.prompt_tokens, 7);
      assert.equal(rec.completion_tokens, 3);
    });
  }
});

describe('an answer without a body', () => {
  let backend, sluice;

  before(async () => {
    backend = await start_scripted_backend(async (socket, request) => {
      if (request.body.max_tokens === 1) {
        // No body follows a 204, whatever its framing headers say.
        socket.write('HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n');
        return;
      }
      const body = JSON.stringify({ id: 'chatcmpl-after', object: 'chat.completion', created: 1700000000, model: 'mock-model',
        choices: [{ index: 0, message: { role: 'assistant', content: 'after' }, logprobs: null, finish_reason: 'stop' }],
        usage: { prompt_tokens: 5, total_tokens: 6, completion_tokens: 1 } });
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    // An idle timeout far longer than the test's bound: an exchange left
    // open after the 204 would hold the connection past it.
    sluice = await start_sluice({ config: sluice_config({ backends: [backend.url], upstream: { stream_idle_timeout_ms: 120000 } }) });
  });
  after(() => stop_all(sluice, backend));

  it('a chunked 204 ends the exchange at its head: the next request on the connection is answered', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      const request = (max_tokens, id) => build_request({
        headers: [['Host', '127.0.0.1'], ['Content-Type', 'application/json'], ['Authorization', `Bearer ${test_key}`], ['X-Request-Id', id]],
        body: JSON.stringify(chat_body({ max_tokens })),
      });
      await conn.write(request(1, 'no-body-204'));
      const first = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(first.status, 204);
      await conn.write(request(2, 'no-body-after'));
      const second = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(second.status, 200);
      assert.equal(JSON.parse(second.body.toString()).choices[0].message.content, 'after');
      assert.equal(backend.requests.length, 2);
    } finally {
      conn.destroy();
    }
    const rec = await poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === 'no-body-204'),
      { what: 'the audit record of no-body-204' });
    assert.equal(rec.status, 204);
    assert.equal(rec.error, null);
  });
});

describe('a non-stream answer over the 1 MiB kept of a body', () => {
  let backend, sluice;
  const content = 'x'.repeat(3 << 20);

  before(async () => {
    backend = await start_scripted_backend(async (socket) => {
      // vLLM's layout: the usage after the choices, 3 MiB into the body.
      const body = Buffer.from(JSON.stringify({ id: 'chatcmpl-big', object: 'chat.completion', created: 1700000000, model: 'mock-model',
        choices: [{ index: 0, message: { role: 'assistant', content }, logprobs: null, finish_reason: 'length', stop_reason: null }],
        usage: { prompt_tokens: 11, total_tokens: 1011, prompt_tokens_details: null, completion_tokens: 1000 }, prompt_logprobs: null }));
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`);
      // In pieces of odd sizes: the usage object may straddle any two reads.
      for (let at = 0; at < body.length; at += 77777) socket.write(body.subarray(at, at + 77777));
    });
    sluice = await start_sluice({ config: sluice_config({ backends: [backend.url] }) });
  });
  after(() => stop_all(sluice, backend));

  it('is billed with the usage at its end', async () => {
    const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 1000 }),
      { headers: { ...auth, 'x-request-id': 'big-body' }, timeout_ms: bound_ms(20000) });
    assert.equal(r.status, 200);
    const json = JSON.parse(r.text);
    assert.equal(json.choices[0].message.content.length, content.length);
    const rec = await poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === 'big-body'),
      { what: 'the audit record of big-body' });
    assert.equal(rec.prompt_tokens, 11);
    assert.equal(rec.completion_tokens, 1000);
    assert.equal(rec.finish_reason, 'length');
  });
});

describe('a client that stops reading a stream', () => {
  for (const splice of [false]) {
    describe(`on the ${splice ? 'splice' : 'copy'} path`, () => {
      let backend, sluice;

      before(async () => {
        backend = await start_scripted_backend(async (socket) => {
          // Far more than the socket buffers between sluice and the client
          // hold, then the stream stays open: sluice waits on the client.
          const events = chat_stream_events({ tokens: 1 });
          const pad = 'p'.repeat(16000);
          const big = chunk(`data: ${JSON.stringify({ id: 'chatcmpl-s', object: 'chat.completion.chunk', created: 1700000000, model: 'mock-model',
            choices: [{ index: 0, delta: { content: pad }, logprobs: null, finish_reason: null }] })}\n\n`);
          socket.write(Buffer.concat([Buffer.from(sse_head), chunk(events[0]), ...Array(2048).fill(big)]));
        });
        sluice = await start_sluice({ config: sluice_config({ backends: [backend.url], server: { splice }, upstream: { stream_idle_timeout_ms: 1000 } }) });
      });
      after(() => stop_all(sluice, backend));

      it('is closed as stalled once the idle time passes; the backend is not blamed', async () => {
        const id = `stalled-${splice ? 'splice' : 'copy'}`;
        const socket = net.connect({ port: sluice.port, host: '127.0.0.1' });
        socket.on('error', () => {});
        await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); });
        socket.write(build_request({
          headers: [['Host', '127.0.0.1'], ['Content-Type', 'application/json'], ['Authorization', `Bearer ${test_key}`], ['X-Request-Id', id]],
          body: JSON.stringify(chat_body({ stream: true, include_usage: true })),
        }));
        socket.pause();  // reads nothing
        try {
          const rec = await poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === id),
            { what: `the audit record of ${id}`, timeout_ms: bound_ms(15000) });
          assert.equal(rec.error, 'client_timeout');
          assert.equal(rec.status, 200);
          const m = (await scrape(sluice.admin_url)).parsed;
          assert.equal(samples(m, 'sluice_client_stalls_total')[0].value, 1);
          assert.equal(samples(m, 'sluice_upstream_timeouts_total')[0].value, 0);
          assert.equal(samples(m, 'sluice_upstream_truncated_total')[0].value, 0);
        } finally {
          socket.destroy();
        }
      });
    });
  }
});
