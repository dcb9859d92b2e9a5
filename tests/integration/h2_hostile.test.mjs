// Hostile HTTP/2 (issue 16), h2c with prior knowledge on sluice's plaintext
// port, through lib/raw_h2.mjs. Each case runs on its own connection; the
// defences and their codes are include/sluice/h2/session.hpp's defaults:
//
//   rapid reset (HEADERS + RST_STREAM x 200)      -> GOAWAY ENHANCE_YOUR_CALM (0xb), closed
//   CONTINUATION flood (no END_HEADERS)            -> GOAWAY 0xb (or PROTOCOL_ERROR 0x1 /
//                                                     COMPRESSION_ERROR 0x9 from nghttp2), closed
//   HPACK bomb (one 4 KB entry indexed 1000 times) -> GOAWAY 0xb, or the stream refused
//                                                     (RST_STREAM, or :status 431)
//   SETTINGS / PING flood (1000 in one write; and
//   5000 with the client not reading)              -> GOAWAY 0xb, closed
//   a stream id going backwards                    -> GOAWAY PROTOCOL_ERROR (0x1), closed
//   a stream id reused                             -> GOAWAY 0x1 (or STREAM_CLOSED 0x5), closed
//   DATA on a half-closed (remote) stream          -> STREAM_CLOSED (0x5): RST_STREAM or GOAWAY
//   ... with the client writing on after it        -> the GOAWAY, then sluice's FIN: no reset
//   DATA on a closed stream                        -> 0x5, or ignored with the connection serving
//   a header list over 32 KiB                      -> :status 431 or RST_STREAM; the connection serves on
//   101 streams at once (limit 100)                -> the 101st: GOAWAY 0x1 or RST_STREAM REFUSED_STREAM (0x7)
//   a window never opened (INITIAL_WINDOW_SIZE 0)  -> the stream ended after upstream.stream_idle_timeout_ms
//                                                     (RST_STREAM, else the connection closed); audited
//                                                     200 client_timeout
//
// After each: mock-vllm got exactly what it should have (mostly nothing); a
// bystander h2 connection opened before the attack, on the same shard (one
// shard: cpus = "0"), and a fresh h2 connection and a fresh HTTP/1.1
// request are all answered 200; sluice is still running; its RSS grew less
// than rss_growth_max_kb over the baseline.
import assert from 'node:assert/strict';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';

import { samples, scrape } from './lib/gateway.mjs';
import { audit_of, start_sluice_edge } from './lib/h2_gateway.mjs';
import { bound_ms, chat_body, http_post, start_mock_vllm, stop_all, test_key } from './lib/harness.mjs';
import {
  continuation_frame, data_frame, error_code, error_name, frame_type, h2_connection, headers_frame, hpack_encode,
  hpack_indexed, hpack_literal, ping_frame, rst_stream_frame, setting, settings_frame, window_update_frame,
} from './lib/raw_h2.mjs';

const stream_idle_timeout_ms = 1000;
const rss_growth_max_kb = 16 * 1024;
const calm = error_code.ENHANCE_YOUR_CALM;

const chat_headers = (extra = []) => [['content-type', 'application/json'], ['authorization', `Bearer ${test_key}`], ...extra];
const chat = (extra_body = {}) => JSON.stringify(chat_body({ max_tokens: 4, ...extra_body }));

// A full request's header block (literal, no indexing).
function chat_block(c, extra = [], { content_length } = {}) {
  const h = chat_headers(extra);
  if (content_length !== undefined) h.push(['content-length', String(content_length)]);
  return c.request_block({ method: 'POST', path: '/v1/chat/completions', headers: h });
}

describe('hostile HTTP/2 on the h2c port', () => {
  let mock, sluice, baseline_kb, bystander;
  let peak_kb = 0;
  let sampler = null;
  // Per case: an attack holds nothing legitimate; the 101-stream case holds
  // 100 real exchanges for a moment, and gets room for them.
  let rss_limit_kb = rss_growth_max_kb;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 3000 });
    sluice = await start_sluice_edge({
      backends: [mock.url],
      server: { cpus: '0' },
      upstream: { stream_idle_timeout_ms },
    });
    // Warm up both codecs (buffer pools, the backend pool) before the
    // baseline: RSS growth after this is what the attacks cost.
    for (let i = 0; i < 20; ++i) {
      assert.equal((await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 4 }), { headers: { authorization: `Bearer ${test_key}` } })).status, 200);
      await normal_h2_request();
    }
    baseline_kb = sluice.rss_kb();
  });
  after(() => stop_all(sluice, mock));

  async function normal_h2_request(conn) {
    const c = conn ?? await h2_connection.connect({ port: sluice.port });
    try {
      if (!conn) await c.handshake();
      const id = c.request({ method: 'POST', path: '/v1/chat/completions', headers: chat_headers(), body: chat() });
      const s = await c.response(id);
      assert.equal(s.status, 200, `a normal h2 request: ${c.summary()}`);
      assert.ok(JSON.parse(s.body.toString()).choices.length > 0);
    } finally {
      if (!conn) c.destroy();
    }
  }

  beforeEach(async () => {
    bystander = await h2_connection.connect({ port: sluice.port });
    await bystander.handshake();
    await mock.clear_requests();
    rss_limit_kb = rss_growth_max_kb;
    peak_kb = sluice.rss_kb();
    sampler = setInterval(() => { try { peak_kb = Math.max(peak_kb, sluice.rss_kb()); } catch { /* exited */ } }, 25);
  });

  // The shard keeps serving: the bystander (same shard, opened before the
  // attack), a fresh h2 connection and a fresh HTTP/1.1 request.
  afterEach(async () => {
    clearInterval(sampler);
    try {
      assert.equal(sluice.proc.exit, null, `sluice exited: ${sluice.proc.output()}`);
      await normal_h2_request(bystander);
      await normal_h2_request();
      const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 4 }), { headers: { authorization: `Bearer ${test_key}` } });
      assert.equal(r.status, 200);
      peak_kb = Math.max(peak_kb, sluice.rss_kb());
      assert.ok(peak_kb - baseline_kb < rss_limit_kb, `sluice's RSS grew ${peak_kb - baseline_kb} kB (limit ${rss_limit_kb} kB)`);
    } finally {
      bystander.destroy();
    }
  });

  async function connect(options = {}) {
    const c = await h2_connection.connect({ port: sluice.port, ...options });
    await c.handshake({ settings: options.settings ?? [] });
    return c;
  }

  // A long SSE answer on a new stream, its first bytes already here: the
  // stream is half-closed (remote) and busy when the attack comes.
  async function streaming(c, request_id) {
    const id = c.request({ method: 'POST', path: '/v1/chat/completions', headers: chat_headers([['x-request-id', request_id]]), body: chat({ stream: true, max_tokens: 2000 }) });
    await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === id && f.length > 0, { what: 'the first SSE bytes' });
    return id;
  }

  // Client-originated requests that reached mock-vllm (the afterEach
  // requests come after this is read).
  const reached = async () => (await mock.requests()).filter((r) => r.target.startsWith('/v1/'));

  async function expect_goaway(c, codes, what) {
    const g = await c.wait_goaway({ timeout_ms: bound_ms(5000), what: `GOAWAY for ${what}` });
    assert.ok(codes.includes(g.error_code), `${what}: GOAWAY ${error_name(g.error_code)}, expected ${codes.map(error_name).join(' or ')}; ${c.summary()}`);
    assert.ok(await c.wait_closed({ timeout_ms: bound_ms(5000) }), `${what}: sluice closed the connection after its GOAWAY`);
    return g;
  }

  it('rapid reset: 200 x (HEADERS + RST_STREAM) in one write -> GOAWAY ENHANCE_YOUR_CALM, nothing forwarded', async () => {
    const c = await connect();
    try {
      const frames = [];
      for (let i = 0; i < 200; ++i) {
        const id = 1 + 2 * i;
        // A POST whose body never comes: reset before it is whole, so no
        // request is complete enough to forward.
        frames.push(headers_frame(id, chat_block(c, [], { content_length: 100 }), { end_stream: false }), rst_stream_frame(id, error_code.CANCEL));
      }
      await c.send(frames);
      const g = await expect_goaway(c, [calm], 'rapid reset');
      assert.ok(g.last_stream_id <= 399, `last_stream_id ${g.last_stream_id}`);
      assert.deepEqual(await reached(), []);
    } finally {
      c.destroy();
    }
  });

  it('rapid reset of complete requests: streams reset at once are not all forwarded, GOAWAY ENHANCE_YOUR_CALM', async () => {
    const c = await connect();
    try {
      const frames = [];
      for (let i = 0; i < 200; ++i) {
        const id = 1 + 2 * i;
        const body = chat({ stream: true, max_tokens: 2000 });
        frames.push(headers_frame(id, chat_block(c, [['x-request-id', `rr-${id}`]], { content_length: Buffer.byteLength(body) })),
          data_frame(id, body, { end_stream: true }), rst_stream_frame(id, error_code.CANCEL));
      }
      await c.send(frames);
      await expect_goaway(c, [calm], 'rapid reset of complete requests');
      // Whatever reached the backend was cancelled: no stream is left running.
      const got = await reached();
      assert.ok(got.length <= 101, `${got.length} forwarded`);
    } finally {
      c.destroy();
    }
  });

  it('CONTINUATION flood: HEADERS without END_HEADERS, then 1000 CONTINUATIONs -> GOAWAY, closed, nothing forwarded', async () => {
    const c = await connect();
    try {
      const frames = [headers_frame(1, chat_block(c), { end_stream: true, end_headers: false })];
      for (let i = 0; i < 1000; ++i) frames.push(continuation_frame(1, hpack_encode([[`x-c${i % 10}`, 'v']]), { end_headers: false }));
      await c.send(frames);
      await expect_goaway(c, [calm, error_code.PROTOCOL_ERROR, error_code.COMPRESSION_ERROR], 'CONTINUATION flood');
      assert.equal(c.stream(1).status, null, 'no answer on the flooded stream');
      assert.deepEqual(await reached(), []);
    } finally {
      c.destroy();
    }
  });

  it('a header block over HEADERS + 4 CONTINUATIONs (well within the limit) is answered', async () => {
    const c = await connect();
    try {
      const block = chat_block(c, [['x-request-id', 'cont-ok']], { content_length: Buffer.byteLength(chat()) });
      const n = 5;
      const step = Math.ceil(block.length / n);
      const pieces = Array.from({ length: n }, (_, i) => block.subarray(i * step, (i + 1) * step));
      await c.send(headers_frame(1, pieces[0], { end_headers: false }),
        ...pieces.slice(1).map((p, i) => continuation_frame(1, p, { end_headers: i === n - 2 })),
        data_frame(1, chat(), { end_stream: true }));
      const s = await c.response(1);
      assert.equal(s.status, 200, c.summary());
      assert.equal((await reached()).length, 1);
    } finally {
      c.destroy();
    }
  });

  it('HPACK bomb: a 4 KB dynamic-table entry indexed 1000 times -> GOAWAY ENHANCE_YOUR_CALM or the stream refused', async () => {
    const c = await connect();
    try {
      const block = Buffer.concat([
        chat_block(c),
        hpack_literal('x-bomb', 'b'.repeat(4000), { kind: 'incremental', name_index: false }),
        ...Array(1000).fill(hpack_indexed(62)),
      ]);
      assert.ok(block.length < 16384, 'one HEADERS frame');
      await c.send(headers_frame(1, block, { end_stream: true }));
      const f = await c.wait_frame((x) => x.type === frame_type.GOAWAY || (x.stream_id === 1 && (x.type === frame_type.RST_STREAM || x.type === frame_type.HEADERS)),
        { what: 'GOAWAY, RST_STREAM or a HEADERS answer' });
      if (f.type === frame_type.GOAWAY) {
        assert.equal(f.error_code, calm, c.summary());
        assert.ok(await c.wait_closed(), 'closed after GOAWAY');
      } else if (f.type === frame_type.HEADERS) {
        assert.equal(c.stream(1).status, 431, c.summary());
      }
      assert.deepEqual(await reached(), []);
    } finally {
      c.destroy();
    }
  });

  for (const [name, make] of [['SETTINGS', () => settings_frame([[setting.ENABLE_PUSH, 0]])], ['PING', (i) => ping_frame(Buffer.from(String(i).padStart(8, '0')))]]) {
    it(`${name} flood: 1000 in one write -> GOAWAY ENHANCE_YOUR_CALM, closed`, async () => {
      const c = await connect();
      try {
        await c.send(Array.from({ length: 1000 }, (_, i) => make(i)));
        await expect_goaway(c, [calm], `${name} flood`);
        const acks = c.frames.filter((f) => f.type === frame_type[name] && f.ack).length;
        assert.ok(acks <= 1001, `${acks} ACKs`);
      } finally {
        c.destroy();
      }
    });

    it(`${name} flood without reading: 5000 sent while the client reads nothing -> GOAWAY ENHANCE_YOUR_CALM, closed`, async () => {
      const c = await connect();
      try {
        c.pause();
        // Small enough for the loopback socket buffers: the write completes
        // while nothing is read; then the client reads what sluice sent.
        const done = c.send(Array.from({ length: 5000 }, (_, i) => make(i)));
        await Promise.race([done, c.wait_closed({ timeout_ms: bound_ms(5000) })]);
        c.resume();
        await expect_goaway(c, [calm], `${name} flood, not read`);
      } finally {
        c.destroy();
      }
    });
  }

  it('a stream id going backwards (3 after 5) -> GOAWAY PROTOCOL_ERROR, closed; only stream 5 forwarded', async () => {
    const c = await connect();
    try {
      const body = chat();
      await c.send(headers_frame(5, chat_block(c, [['x-request-id', 'back-5']], { content_length: Buffer.byteLength(body) })), data_frame(5, body, { end_stream: true }));
      assert.equal((await c.response(5)).status, 200, c.summary());
      await c.send(headers_frame(3, chat_block(c, [['x-request-id', 'back-3']], { content_length: Buffer.byteLength(body) })), data_frame(3, body, { end_stream: true }));
      const g = await expect_goaway(c, [error_code.PROTOCOL_ERROR], 'stream id going backwards');
      assert.equal(g.last_stream_id, 5);
      assert.equal(c.stream(3).status, null);
      assert.deepEqual((await reached()).map((r) => r.headers.find(([n]) => n.toLowerCase() === 'x-request-id')?.[1]), ['back-5']);
    } finally {
      c.destroy();
    }
  });

  it('a stream id reused (1 again after stream 1 ended) -> GOAWAY PROTOCOL_ERROR (or STREAM_CLOSED), closed; forwarded once', async () => {
    const c = await connect();
    try {
      const body = chat();
      await c.send(headers_frame(1, chat_block(c, [['x-request-id', 'reuse-a']], { content_length: Buffer.byteLength(body) })), data_frame(1, body, { end_stream: true }));
      assert.equal((await c.response(1)).status, 200, c.summary());
      await c.send(headers_frame(1, chat_block(c, [['x-request-id', 'reuse-b']], { content_length: Buffer.byteLength(body) })), data_frame(1, body, { end_stream: true }));
      await expect_goaway(c, [error_code.PROTOCOL_ERROR, error_code.STREAM_CLOSED], 'stream id reused');
      assert.equal((await reached()).length, 1);
    } finally {
      c.destroy();
    }
  });

  it('a stream id reused while its answer still streams -> GOAWAY PROTOCOL_ERROR or STREAM_CLOSED, closed', async () => {
    const c = await connect();
    try {
      const id = await streaming(c, 'reuse-open');
      await c.send(headers_frame(id, chat_block(c), { end_stream: true }));
      await expect_goaway(c, [error_code.PROTOCOL_ERROR, error_code.STREAM_CLOSED], 'stream id reused while open');
      assert.equal((await reached()).length, 1);
    } finally {
      c.destroy();
    }
  });

  it('DATA on a half-closed (remote) stream -> STREAM_CLOSED (0x5) as RST_STREAM or GOAWAY; nothing more forwarded', async () => {
    const c = await connect();
    try {
      const id = await streaming(c, 'data-half-closed');
      await c.send(data_frame(id, 'more body after END_STREAM'));
      const f = await c.wait_frame((x) => x.type === frame_type.GOAWAY || (x.type === frame_type.RST_STREAM && x.stream_id === id), { what: 'RST_STREAM or GOAWAY' });
      assert.equal(f.error_code, error_code.STREAM_CLOSED, c.summary());
      assert.equal((await reached()).length, 1);
    } finally {
      c.destroy();
    }
  });

  it('a connection error while the client still writes: the GOAWAY, then an orderly close (FIN), never a reset', async () => {
    // The client goes on writing (as any does: WINDOW_UPDATEs for what it
    // reads) after the frame that ends the connection. A close with those
    // bytes unread is an RST, which destroys the GOAWAY in flight or the
    // client's read of it; sluice shuts its side and drops what comes
    // until the client's own close.
    const c = await connect();
    try {
      const id = await streaming(c, 'goaway-then-fin');
      const burst = Buffer.concat(Array.from({ length: 100 }, () => window_update_frame(0, 1)));
      const writing = c.send(data_frame(id, 'more body after END_STREAM')).then(() => c.write_while_open(burst));
      const closed = await c.wait_closed({ timeout_ms: bound_ms(10000) });
      const writes = await writing;
      assert.ok(closed, `the connection closed; ${c.summary()}`);
      const g = c.goaways();
      assert.equal(g.length, 1, c.summary());
      assert.equal(g[0].error_code, error_code.STREAM_CLOSED, c.summary());
      assert.equal(c.error, null, `no reset (${c.error?.code}) after ${writes} bursts; ${c.summary()}`);
      assert.ok(c.ended, `the server's FIN came; ${c.summary()}`);
      assert.equal((await reached()).length, 1);
    } finally {
      c.destroy();
    }
  });

  it('DATA on a closed stream -> STREAM_CLOSED (0x5), or ignored with the connection still answering', async () => {
    const c = await connect();
    try {
      const first = c.request({ method: 'POST', path: '/v1/chat/completions', headers: chat_headers(), body: chat() });
      assert.equal((await c.response(first)).status, 200);
      const from = c.frames.length;
      await c.send(data_frame(first, 'late'));
      const next = c.request({ method: 'POST', path: '/v1/chat/completions', headers: chat_headers(), body: chat() });
      const f = await c.wait_frame((x) => x.type === frame_type.GOAWAY || (x.type === frame_type.RST_STREAM && x.stream_id === first) ||
        (x.stream_id === next && (x.end_stream || x.type === frame_type.RST_STREAM)), { from, what: 'an answer' });
      if (f.type === frame_type.GOAWAY || f.stream_id === first) {
        assert.equal(f.error_code, error_code.STREAM_CLOSED, c.summary());
      } else {
        assert.equal(c.stream(next).status, 200, c.summary());
      }
      assert.ok((await reached()).length <= 2);
    } finally {
      c.destroy();
    }
  });

  it('a header list over 32 KiB (one 40 KB field over HEADERS + CONTINUATIONs) -> :status 431 or RST_STREAM; the connection serves on', async () => {
    const c = await connect();
    try {
      const block = chat_block(c, [['x-big', 'x'.repeat(40000)]]);
      const pieces = [];
      for (let off = 0; off < block.length; off += 16384) pieces.push(block.subarray(off, off + 16384));
      assert.ok(pieces.length <= 4);
      await c.send(headers_frame(1, pieces[0], { end_stream: true, end_headers: pieces.length === 1 }),
        ...pieces.slice(1).map((p, i) => continuation_frame(1, p, { end_headers: i === pieces.length - 2 })));
      c.next_stream_id = 3;  // stream 1 was written by hand
      const s = await c.response(1);
      assert.ok(s.status === 431 || s.rst_code !== null, `431 or RST_STREAM: ${c.summary()}`);
      assert.equal(c.goaways().filter((g) => g.error_code !== error_code.NO_ERROR).length, 0, 'no connection error');
      assert.deepEqual(await reached(), []);
      await normal_h2_request(c);
    } finally {
      c.destroy();
    }
  });

  it('a header list of 8 KB (well under 32 KiB) is forwarded', async () => {
    const c = await connect();
    try {
      const id = c.request({ method: 'POST', path: '/v1/chat/completions', headers: chat_headers([['x-big', 'y'.repeat(8000)]]), body: chat() });
      assert.equal((await c.response(id)).status, 200, c.summary());
      assert.equal((await reached()).length, 1);
    } finally {
      c.destroy();
    }
  });

  it('101 streams at once (SETTINGS_MAX_CONCURRENT_STREAMS 100): the 101st is refused, never forwarded', async () => {
    rss_limit_kb = 3 * rss_growth_max_kb;
    const c = await connect();
    try {
      const frames = [];
      const body = chat({ stream: true, max_tokens: 2000 });
      for (let i = 0; i < 101; ++i) {
        const id = 1 + 2 * i;
        frames.push(headers_frame(id, chat_block(c, [['x-request-id', `mcs-${id}`]], { content_length: Buffer.byteLength(body) })), data_frame(id, body, { end_stream: true }));
      }
      await c.send(frames);
      const f = await c.wait_frame((x) => x.type === frame_type.GOAWAY || (x.type === frame_type.RST_STREAM && x.stream_id === 201), { what: 'stream 201 refused' });
      if (f.type === frame_type.GOAWAY) assert.equal(f.error_code, error_code.PROTOCOL_ERROR, c.summary());
      else assert.equal(f.error_code, error_code.REFUSED_STREAM, c.summary());
      const ids = (await reached()).map((r) => r.headers.find(([n]) => n.toLowerCase() === 'x-request-id')?.[1]);
      assert.ok(!ids.includes('mcs-201'), 'stream 201 never reached the backend');
      assert.ok(ids.length <= 100);
    } finally {
      c.destroy();
    }
  });

  it('a window never opened (SETTINGS_INITIAL_WINDOW_SIZE 0): the stream ends after the stream idle timeout, audited client_timeout', async () => {
    const id = 'h2-zero-window';
    const c = await connect({ settings: [[setting.INITIAL_WINDOW_SIZE, 0]], auto_window_update: false });
    try {
      await c.wait_frame((f) => f.type === frame_type.SETTINGS && f.ack, { what: 'our SETTINGS acked' });
      const started = performance.now();
      const sid = c.request({ method: 'POST', path: '/v1/chat/completions', headers: chat_headers([['x-request-id', id]]), body: chat({ stream: true, max_tokens: 2000 }) });
      // The stream ends by RST_STREAM (CANCEL expected), or the connection closes.
      await c.wait_until(() => c.stream(sid).rst_code !== null || c.stream(sid).ended || c.closed,
        { timeout_ms: stream_idle_timeout_ms + bound_ms(5000), what: 'the stalled stream to end' }).catch((err) => { if (!c.closed) throw err; });
      const ms = performance.now() - started;
      const s = c.stream(sid);
      assert.equal(s.data_frames, 0, 'no DATA through a zero window');
      assert.equal(s.ended, false, 'the stream did not end as if complete');
      assert.ok(s.rst_code !== null || c.closed, c.summary());
      if (s.rst_code !== null) assert.ok([error_code.CANCEL, error_code.INTERNAL_ERROR, calm].includes(s.rst_code), `RST_STREAM ${error_name(s.rst_code)}`);
      assert.ok(ms >= stream_idle_timeout_ms * 0.8, `ended after ${ms.toFixed(0)} ms, before the ${stream_idle_timeout_ms} ms idle timeout`);
      // The backend may have finished its reply into sluice's buffers before
      // the idle time passed (no abort line then): the audit says whose fault.
      console.log(`zero window: the stream ended after ${ms.toFixed(0)} ms (${s.rst_code !== null ? `RST_STREAM ${error_name(s.rst_code)}` : 'connection closed'}; :status ${s.status})`);
      // As HTTP/1.1's stalled reader (backend_framing.test.mjs): the client's
      // fault, client_timeout, with the status its head carried.
      const rec = await audit_of(sluice, id, { timeout_ms: bound_ms(5000) });
      assert.deepEqual({ status: rec.status, error: rec.error }, { status: s.status ?? rec.status, error: 'client_timeout' });
    } finally {
      c.destroy();
    }
  });
  // Runs last (node:test keeps the order): each defence above left its count.
  it('every defence that fired is counted in /metrics', async () => {
    const { parsed } = await scrape(sluice.admin_url);
    const count = (name, labels = {}) => samples(parsed, name, labels).reduce((t, x) => t + x.value, 0);
    const goaways = (reason) => count('sluice_h2_defence_goaways_total', { reason });
    assert.ok(goaways('rapid_reset') >= 2, `rapid_reset ${goaways('rapid_reset')}`);
    assert.ok(goaways('continuation_flood') >= 1, `continuation_flood ${goaways('continuation_flood')}`);
    assert.ok(goaways('control_flood') >= 4, `control_flood ${goaways('control_flood')} (SETTINGS and PING, read and unread)`);
    assert.ok(goaways('protocol_error') >= 2, `protocol_error ${goaways('protocol_error')} (stream ids backwards and reused)`);
    assert.ok(goaways('hpack_bomb') + count('sluice_h2_header_lists_too_large_total') >= 1, 'the HPACK bomb or the 40 KB list');
    assert.ok(count('sluice_h2_refused_streams_total') + goaways('protocol_error') >= 1, 'the 101st stream');
    assert.ok(count('sluice_client_stalls_total') >= 1, 'the window never opened');
    assert.ok(count('sluice_h2_connections_total') >= 10, `h2 connections ${count('sluice_h2_connections_total')}`);
  });
});

describe('HTTP/2: answers sluice writes itself, to a window never opened', () => {
  const idle_timeout_ms = 1500;
  let mock, sluice;
  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 1000, reply_tokens: 4 });
    sluice = await start_sluice_edge({ backends: [mock.url], server: { idle_timeout_ms } });
  });
  after(() => stop_all(sluice, mock));

  it('a 401 whose body the client never lets out ends after idle_timeout_ms (RST_STREAM CANCEL); nothing stays in flight', async () => {
    const c = await h2_connection.connect({ port: sluice.port, auto_window_update: false });
    try {
      await c.handshake({ settings: [[setting.INITIAL_WINDOW_SIZE, 0]] });
      await c.wait_frame((f) => f.type === frame_type.SETTINGS && f.ack, { what: 'our SETTINGS acked' });
      const started = performance.now();
      // No authorization: sluice answers 401 itself; its body needs a window.
      const sid = c.request({ method: 'POST', path: '/v1/chat/completions', headers: [['content-type', 'application/json']], body: chat() });
      const s = await c.response(sid, { timeout_ms: bound_ms(idle_timeout_ms * 4) });
      const ms = performance.now() - started;
      assert.equal(s.status, 401, c.summary());
      assert.equal(s.rst_code, error_code.CANCEL, c.summary());
      assert.ok(ms >= idle_timeout_ms * 0.8, `ended after ${ms.toFixed(0)} ms, before the idle timeout`);
      const { parsed } = await scrape(sluice.admin_url);
      const inflight = samples(parsed, 'sluice_inflight_requests').reduce((t, x) => t + x.value, 0);
      assert.equal(inflight, 0, 'nothing left in flight');
      assert.deepEqual(await mock.requests(), [], 'nothing forwarded');
    } finally {
      c.destroy();
    }
  });
});
