// lib/raw_h2.mjs checked against node's own HTTP/2 server (node:http2, that
// is nghttp2): requests answered and read (HPACK with Huffman and the
// dynamic table, flow control, CONTINUATION), resets and GOAWAYs both
// ways with their codes, hostile frames that a real server rejects with the
// codes RFC 9113 names, and TLS with ALPN h2 on a certificate from
// lib/test_ca.mjs. Needs no build: this is the harness that h2.test.mjs and
// h2_hostile.test.mjs point at sluice.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http2 from 'node:http2';
import { after, before, describe, it } from 'node:test';

import { bound_ms } from './lib/harness.mjs';
import {
  continuation_frame, data_frame, error_code, field, frame_type, goaway_frame, h2_connection, h2_request,
  headers_frame, hpack_decoder, hpack_encode, hpack_indexed, hpack_literal, huffman_decode, huffman_encode,
  ping_frame, rst_stream_frame, setting, settings_frame, window_update_frame,
} from './lib/raw_h2.mjs';
import { make_test_ca } from './lib/test_ca.mjs';

const printable = Array.from({ length: 0x7f - 0x21 }, (_, i) => String.fromCharCode(0x21 + i)).join('');

// A node:http2 server whose routes a test can see: `seen` has every request
// head, `closed` every stream's rstCode as the server saw it.
function start_node_h2({ secure, padding } = {}) {
  const seen = [];
  const closed = [];
  const waiters = new Set();
  const notify = () => { for (const w of [...waiters]) w(); };
  const on_stream = (stream, headers, flags, raw) => {
    seen.push({ headers, raw });
    stream.on('close', () => { closed.push({ path: headers[':path'], rst: stream.rstCode }); notify(); });
    stream.on('error', () => {});
    const path = headers[':path'];
    notify();
    if (path === '/hello') {
      stream.respond({ ':status': 200, 'content-type': 'text/plain', 'x-printable': printable, 'x-words': 'custom-value www.example.com' });
      stream.end('hello');
    } else if (path === '/high') {
      // Bytes 0x80..0xff: each after 24 'a's, so nghttp2 Huffman-codes the value.
      const h = { ':status': 200 };
      for (let b = 0x80; b <= 0xff; ++b) h[`x-h${b}`] = 'a'.repeat(24) + String.fromCharCode(b);
      stream.respond(h);
      stream.end();
    } else if (path === '/echo') {
      const parts = [];
      stream.on('data', (d) => parts.push(d));
      stream.on('end', () => { stream.respond({ ':status': 201 }); stream.end(Buffer.concat(parts)); });
    } else if (path === '/big') {
      stream.respond({ ':status': 200 });
      stream.end(Buffer.alloc(300000, 'z'));
    } else if (path === '/refuse') {
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
    } else if (path === '/hold') {
      stream.respond({ ':status': 200, 'content-type': 'text/event-stream' });
      stream.write('data: first\n\n');
    } else if (path === '/calm') {
      stream.session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM, stream.id, Buffer.from('calm down'));
    } else if (path === '/headers') {
      stream.respond({ ':status': 200 });
      stream.end(JSON.stringify(raw));
    } else {
      stream.respond({ ':status': 404 });
      stream.end();
    }
  };
  let server;
  const ca = secure ? make_test_ca() : null;
  if (secure) {
    server = http2.createSecureServer({ key: fs.readFileSync(ca.key), cert: fs.readFileSync(ca.cert), allowHTTP1: false });
  } else {
    server = http2.createServer({ maxHeaderListPairs: 4096, maxSessionMemory: 64, ...(padding ? { paddingStrategy: http2.constants.PADDING_STRATEGY_MAX } : {}) });
  }
  server.on('stream', on_stream);
  server.on('sessionError', () => {});
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({
      port: server.address().port, seen, closed, ca,
      wait(cond, what) {
        return new Promise((res, rej) => {
          const check = () => { if (cond()) { clearTimeout(t); waiters.delete(check); res(); } };
          const t = setTimeout(() => { waiters.delete(check); rej(new Error(`node h2 server: no ${what}`)); }, bound_ms(5000));
          waiters.add(check);
          check();
        });
      },
      stop() { return new Promise((r) => { server.close(() => r()); for (const s of sessions) s.destroy(); ca?.remove(); }); },
    }));
    const sessions = new Set();
    server.on('session', (s) => { sessions.add(s); s.on('close', () => sessions.delete(s)); });
  });
}

describe('HPACK pieces', () => {
  it('Huffman-codes RFC 7541 C.4.1 "www.example.com" and round-trips every byte', () => {
    assert.equal(huffman_encode(Buffer.from('www.example.com')).toString('hex'), 'f1e3c2e5f23a6ba0ab90f4ff');
    const all = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    assert.deepEqual(huffman_decode(huffman_encode(all)), all);
  });

  it('decodes RFC 7541 C.4 (three requests sharing a dynamic table)', () => {
    const d = new hpack_decoder();
    assert.deepEqual(d.decode(Buffer.from('828684418cf1e3c2e5f23a6ba0ab90f4ff', 'hex')),
      [[':method', 'GET'], [':scheme', 'http'], [':path', '/'], [':authority', 'www.example.com']]);
    assert.deepEqual(d.decode(Buffer.from('828684be5886a8eb10649cbf', 'hex')),
      [[':method', 'GET'], [':scheme', 'http'], [':path', '/'], [':authority', 'www.example.com'], ['cache-control', 'no-cache']]);
    assert.deepEqual(d.decode(Buffer.from('828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf', 'hex')),
      [[':method', 'GET'], [':scheme', 'https'], [':path', '/index.html'], [':authority', 'www.example.com'], ['custom-key', 'custom-value']]);
    assert.equal(d.size, 164);
  });

  it('decodes RFC 7541 C.5.1 (a response, with eviction at a 256-byte table)', () => {
    const d = new hpack_decoder({ max_table_size: 256 });
    const block = Buffer.from('4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d', 'hex');
    assert.deepEqual(d.decode(block), [[':status', '302'], ['cache-control', 'private'],
      ['date', 'Mon, 21 Oct 2013 20:13:21 GMT'], ['location', 'https://www.example.com']]);
    assert.equal(d.size, 222);
    assert.deepEqual(d.decode(Buffer.from('4803333037c1c0bf', 'hex')), [[':status', '307'], ['cache-control', 'private'],
      ['date', 'Mon, 21 Oct 2013 20:13:21 GMT'], ['location', 'https://www.example.com']]);
    assert.equal(d.size, 222);  // :status 302 evicted for :status 307
  });
});

describe('raw_h2 against node:http2 (h2c)', () => {
  let server;
  before(async () => { server = await start_node_h2(); });
  after(() => server.stop());

  it('a GET is answered; Huffman and dynamic-table headers decode on a second request', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      const settings = await c.handshake();
      assert.equal(typeof settings, 'object');
      for (let i = 0; i < 2; ++i) {
        const id = c.request({ path: '/hello' });
        const s = await c.response(id);
        assert.equal(s.status, 200);
        assert.equal(s.ended, true);
        assert.equal(s.body.toString(), 'hello');
        assert.equal(field(s.headers, 'x-printable'), printable);
        assert.equal(field(s.headers, 'x-words'), 'custom-value www.example.com');
        assert.equal(field(s.headers, 'content-type'), 'text/plain');
      }
      assert.ok(c.decoder.dynamic.length > 0, 'node indexed some response fields');
      assert.equal(c.decode_error, null);
    } finally {
      c.destroy();
    }
  });

  it('bytes 0x80..0xff in Huffman-coded values', async () => {
    const r = await h2_request({ port: server.port, path: '/high' });
    assert.equal(r.status, 200);
    for (let b = 0x80; b <= 0xff; ++b) assert.equal(field(r.headers, `x-h${b}`), 'a'.repeat(24) + String.fromCharCode(b), `byte ${b}`);
  });

  it('a POST body in DATA frames; a 300 KB answer past the 64 KiB windows (WINDOW_UPDATEs sent)', async () => {
    const body = Buffer.alloc(40000, 'q');
    const r = await h2_request({ port: server.port, method: 'POST', path: '/echo', body });
    assert.equal(r.status, 201);
    assert.deepEqual(r.body, body);
    const big = await h2_request({ port: server.port, path: '/big' });
    assert.equal(big.status, 200);
    assert.equal(big.body.length, 300000);
  });

  it('a header block over HEADERS + CONTINUATION frames', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const block = c.request_block({ path: '/headers', headers: [['x-a', 'one'], ['x-b', 'two']] });
      const cut1 = 10;
      const cut2 = 25;
      await c.send(headers_frame(1, block.subarray(0, cut1), { end_stream: true, end_headers: false }),
        continuation_frame(1, block.subarray(cut1, cut2), { end_headers: false }),
        continuation_frame(1, block.subarray(cut2)));
      const s = await c.response(1);
      assert.equal(s.status, 200);
      const raw = JSON.parse(s.body.toString());
      assert.ok(raw.includes('x-a') && raw.includes('two'));
    } finally {
      c.destroy();
    }
  });

  it('request() splits a header block over 16 KiB into HEADERS + CONTINUATION', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const s = await c.response(c.request({ path: '/headers', headers: [['x-long', 'l'.repeat(20000)]] }));
      assert.equal(s.status, 200, c.summary());
      const raw = JSON.parse(s.body.toString());
      assert.equal(raw[raw.indexOf('x-long') + 1].length, 20000);
    } finally {
      c.destroy();
    }
  });

  it('a crafted HPACK block: one dynamic-table entry, then indexed many times', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const block = Buffer.concat([
        c.request_block({ path: '/headers' }),
        hpack_literal('x-bomb', 'b'.repeat(100), { kind: 'incremental', name_index: false }),
        ...Array(9).fill(hpack_indexed(62)),
      ]);
      await c.send(headers_frame(1, block, { end_stream: true }));
      const s = await c.response(1);
      assert.equal(s.status, 200);
      const raw = JSON.parse(s.body.toString());
      assert.equal(raw.filter((x, i) => i % 2 === 0 && x === 'x-bomb').length, 10, 'the server decoded ten copies');
    } finally {
      c.destroy();
    }
  });

  it('PING is answered with an ACK carrying the same opaque data', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      await c.send(ping_frame(Buffer.from('12345678')));
      const ack = await c.wait_frame((f) => f.type === frame_type.PING && f.ack, { what: 'PING ACK' });
      assert.equal(ack.opaque.toString(), '12345678');
    } finally {
      c.destroy();
    }
  });

  it("a server's RST_STREAM code is read (REFUSED_STREAM)", async () => {
    const r = await h2_request({ port: server.port, path: '/refuse' });
    assert.equal(r.rst_code, error_code.REFUSED_STREAM);
    assert.equal(r.status, null);
  });

  it("a client's RST_STREAM CANCEL mid-stream reaches the server", async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const id = c.request({ path: '/hold' });
      await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === id, { what: 'the first event' });
      await c.send(rst_stream_frame(id, error_code.CANCEL));
      await server.wait(() => server.closed.some((x) => x.path === '/hold'), 'close of /hold');
      assert.equal(server.closed.find((x) => x.path === '/hold').rst, error_code.CANCEL);
    } finally {
      c.destroy();
    }
  });

  it("a server's GOAWAY: last stream id and ENHANCE_YOUR_CALM (0xb) parsed", async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      c.request({ path: '/hello' });
      await c.response(1);
      const id = c.request({ path: '/calm' });
      const g = await c.wait_goaway();
      assert.equal(g.error_code, error_code.ENHANCE_YOUR_CALM);
      assert.equal(g.error_name, 'ENHANCE_YOUR_CALM');
      assert.equal(g.last_stream_id, id);
      assert.equal(g.debug, 'calm down');
    } finally {
      c.destroy();
    }
  });

  // nghttp2 rejects it as PROTOCOL_ERROR; node's wrapper then ends the
  // session itself with INTERNAL_ERROR (0x2): a GOAWAY with an error code.
  it('HEADERS on an even (server-side) stream id: GOAWAY with an error (node says INTERNAL_ERROR), then close', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      c.request({ path: '/hello' });
      await c.response(1);
      await c.send(headers_frame(2, c.request_block({ path: '/hello' }), { end_stream: true }));
      const g = await c.wait_goaway();
      assert.ok([error_code.PROTOCOL_ERROR, error_code.INTERNAL_ERROR].includes(g.error_code), c.summary());
      assert.equal(g.last_stream_id, 1);
      assert.ok(await c.wait_closed(), 'the server closed the connection');
    } finally {
      c.destroy();
    }
  });

  // nghttp2 by itself ignores a HEADERS whose id is below the last one and
  // names no stream it still holds (RFC 9113 wants PROTOCOL_ERROR): sluice's
  // session checks ids itself (h2_hostile.test.mjs). Shown here so that a
  // GOAWAY from sluice for it is known to be sluice's own check.
  it('a stream id going backwards is ignored by bare nghttp2 (no answer, no GOAWAY)', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      await c.send(headers_frame(5, c.request_block({ path: '/hello' }), { end_stream: true }));
      await c.response(5);
      await c.send(headers_frame(3, c.request_block({ path: '/hello' }), { end_stream: true }), ping_frame(Buffer.from('barrier!')));
      await c.wait_frame((f) => f.type === frame_type.PING && f.ack, { what: 'PING ACK' });
      assert.equal(c.stream(3).status, null);
      assert.equal(c.goaways().length, 0);
    } finally {
      c.destroy();
    }
  });

  it('DATA on a half-closed (remote) stream: STREAM_CLOSED (0x5), as RST_STREAM or GOAWAY', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const id = c.request({ path: '/hold' });  // END_STREAM: half-closed (remote); the answer stays open
      await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === id, { what: 'the first event' });
      await c.send(data_frame(id, 'late'));
      const f = await c.wait_frame((x) => x.type === frame_type.GOAWAY || (x.type === frame_type.RST_STREAM && x.stream_id === id),
        { what: 'RST_STREAM or GOAWAY' });
      assert.equal(f.error_code, error_code.STREAM_CLOSED);
    } finally {
      c.destroy();
    }
  });

  it('a zero initial window: HEADERS come, DATA waits for our WINDOW_UPDATE', async () => {
    const c = await h2_connection.connect({ port: server.port, auto_window_update: false });
    try {
      await c.handshake({ settings: [[setting.INITIAL_WINDOW_SIZE, 0]] });
      await c.wait_frame((f) => f.type === frame_type.SETTINGS && f.ack, { what: 'our SETTINGS acked' });
      const id = c.request({ path: '/hello' });
      await c.wait_frame((f) => f.type === frame_type.HEADERS && f.stream_id === id, { what: 'the response HEADERS' });
      // A PING round trip after the HEADERS: DATA the server could send
      // would have been written before the ACK.
      await c.send(ping_frame(Buffer.from('barrier!')));
      await c.wait_frame((f) => f.type === frame_type.PING && f.ack, { what: 'PING ACK' });
      assert.equal(c.stream(id).data_frames, 0, 'no DATA through a zero window');
      await c.send(window_update_frame(id, 100));
      const s = await c.response(id);
      assert.equal(s.body.toString(), 'hello');
    } finally {
      c.destroy();
    }
  });

  it('we can send GOAWAY and the server stops', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      await c.send(goaway_frame(0, error_code.NO_ERROR));
      assert.ok(await c.wait_closed(), 'node closed after our GOAWAY');
    } finally {
      c.destroy();
    }
  });

  it('a literal block with hpack_encode reaches the server as sent', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const block = hpack_encode([[':method', 'GET'], [':scheme', 'http'], [':authority', 'x'], [':path', '/headers'], ['x-raw', 'v a l']]);
      await c.send(headers_frame(1, block, { end_stream: true }), settings_frame([]));
      const s = await c.response(1);
      const raw = JSON.parse(s.body.toString());
      assert.equal(raw[raw.indexOf('x-raw') + 1], 'v a l');
    } finally {
      c.destroy();
    }
  });
});

describe('raw_h2 against node:http2 with padded frames (paddingStrategy MAX)', () => {
  let server;
  before(async () => { server = await start_node_h2({ padding: true }); });
  after(() => server.stop());

  it('PADDED HEADERS and DATA are read without their padding', async () => {
    const c = await h2_connection.connect({ port: server.port });
    try {
      await c.handshake();
      const s = await c.response(c.request({ path: '/hello' }));
      assert.equal(s.status, 200);
      assert.equal(s.body.toString(), 'hello');
      assert.equal(field(s.headers, 'x-printable'), printable);
      assert.ok(c.frames.some((f) => (f.type === frame_type.DATA || f.type === frame_type.HEADERS) && (f.flags & 0x8)), `padded frames seen: ${c.summary()}`);
    } finally {
      c.destroy();
    }
  });
});

describe('raw_h2 over TLS with ALPN h2 (node:http2 secure server, lib/test_ca.mjs certificate)', () => {
  let server;
  before(async () => { server = await start_node_h2({ secure: true }); });
  after(() => server.stop());

  it('negotiates h2 and is answered, the certificate verified against the test CA', async () => {
    const c = await h2_connection.connect({ port: server.port, tls: { ca: server.ca.ca_pem } });
    try {
      assert.equal(c.alpn, 'h2');
      assert.equal(c.socket.authorized, true);
      await c.handshake();
      const s = await c.response(c.request({ path: '/hello', scheme: 'https' }));
      assert.equal(s.status, 200);
      assert.equal(s.body.toString(), 'hello');
    } finally {
      c.destroy();
    }
  });

  it('also verifies for the IP address 127.0.0.1 (SAN IP)', async () => {
    const c = await h2_connection.connect({ port: server.port, tls: { ca: server.ca.ca_pem, servername: undefined } });
    try {
      assert.equal(c.socket.authorized, true);
    } finally {
      c.destroy();
    }
  });
});
