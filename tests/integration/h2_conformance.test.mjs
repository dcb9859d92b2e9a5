// HTTP/2 conformance after an early answer (issue 41 §3): h2spec's cases
// for frames on an open stream, run on a stream sluice answered from its
// head alone (401: no key; the body still coming) and on one it forwards
// (a chat request whose body is still coming), over h2c and TLS (ALPN h2),
// through lib/raw_h2.mjs. Each case is sent after the early answer's
// END_STREAM has arrived, so what is judged is the frame, not a race with
// the answer:
//
//   WINDOW_UPDATE of 0 on the stream                -> PROTOCOL_ERROR (RST_STREAM or GOAWAY)
//   a stream window over 2^31-1                     -> FLOW_CONTROL_ERROR
//   a second HEADERS without END_STREAM             -> PROTOCOL_ERROR
//   trailers with a pseudo-header                   -> PROTOCOL_ERROR
//   content-length that the DATA does not match     -> PROTOCOL_ERROR
//   DATA whose padding is longer than the frame     -> GOAWAY PROTOCOL_ERROR (RFC 9113 §6.1: a connection error)
//   DATA, or HEADERS, after the client's RST_STREAM -> STREAM_CLOSED
//
// Before, sluice reset an early-answered stream at once (RST_STREAM
// NO_ERROR) and ignored the client's later frames on it. Now the stream
// stays half-closed (local) for a second or 64 KiB of body, whichever comes
// first; a client that just sends its body on is then reset NO_ERROR, which
// the last case checks.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { start_sluice_edge } from './lib/h2_gateway.mjs';
import { bound_ms, start_mock_vllm, stop_all, test_key } from './lib/harness.mjs';
import { data_frame, error_code, flag, frame, frame_type, h2_connection, headers_frame, hpack_encode, rst_stream_frame, window_update_frame } from './lib/raw_h2.mjs';
import { make_test_ca } from './lib/test_ca.mjs';

const kinds = {
  early: { method: 'GET', path: '/v1/models', headers: [['content-type', 'application/json']] },
  forwarded: { method: 'POST', path: '/v1/chat/completions', headers: [['content-type', 'application/json'], ['authorization', `Bearer ${test_key}`]] },
};

// The frame that says the stream (or the connection) failed with `code`.
async function expect_error(c, id, code, { connection = false } = {}) {
  const f = await c.wait_frame((x) => x.type === frame_type.GOAWAY || (!connection && x.type === frame_type.RST_STREAM && x.stream_id === id),
    { what: `an error ${code} for stream ${id}` });
  assert.equal(f.error_code, code, c.summary());
  if (connection) assert.equal(f.type, frame_type.GOAWAY, c.summary());
}

const cases = {
  'WINDOW_UPDATE of 0 on the stream: PROTOCOL_ERROR': async (c, id) => {
    c.write(window_update_frame(id, 0));
    await expect_error(c, id, error_code.PROTOCOL_ERROR);
  },
  'a stream window past 2^31-1: FLOW_CONTROL_ERROR': async (c, id) => {
    c.write(window_update_frame(id, 0x7fffffff));
    await expect_error(c, id, error_code.FLOW_CONTROL_ERROR);
  },
  'a second HEADERS without END_STREAM: PROTOCOL_ERROR': async (c, id) => {
    c.write(headers_frame(id, hpack_encode([['x-trailer', 'one']]), { end_stream: false }));
    await expect_error(c, id, error_code.PROTOCOL_ERROR);
  },
  'trailers with a pseudo-header: PROTOCOL_ERROR': async (c, id) => {
    c.write(headers_frame(id, hpack_encode([[':path', '/x']]), { end_stream: true }));
    await expect_error(c, id, error_code.PROTOCOL_ERROR);
  },
  'DATA past the padding it announces: a connection error, PROTOCOL_ERROR': async (c, id) => {
    c.write(frame(frame_type.DATA, flag.PADDED, id, Buffer.from([9, 0x61, 0x62])));
    await expect_error(c, id, error_code.PROTOCOL_ERROR, { connection: true });
  },
  'DATA after the client reset the stream: STREAM_CLOSED': async (c, id) => {
    c.write(rst_stream_frame(id, error_code.CANCEL));
    c.write(data_frame(id, 'late'));
    await expect_error(c, id, error_code.STREAM_CLOSED);
  },
  'HEADERS after the client reset the stream: STREAM_CLOSED': async (c, id) => {
    c.write(rst_stream_frame(id, error_code.CANCEL));
    c.write(headers_frame(id, hpack_encode([['x-trailer', 'late']]), { end_stream: true }));
    await expect_error(c, id, error_code.STREAM_CLOSED);
  },
};

describe('HTTP/2 conformance on early-answered and forwarded streams', () => {
  let mock, sluice, ca;
  before(async () => {
    ca = make_test_ca();
    mock = await start_mock_vllm({ reply_tokens: 4 });
    sluice = await start_sluice_edge({ backends: [mock.url], ca, server: { cpus: '0' } });
  });
  after(() => stop_all(sluice, mock));

  for (const transport of ['h2c', 'tls']) {
    const connect = () => h2_connection.connect(transport === 'tls'
      ? { port: sluice.tls_port, tls: { ca: ca.ca_pem } }
      : { port: sluice.port });
    for (const [kind, request] of Object.entries(kinds)) {
      for (const [name, run] of Object.entries(cases)) {
        it(`${transport}, ${kind}: ${name}`, async () => {
          const c = await connect();
          try {
            await c.handshake();
            const id = c.request({ ...request, end_stream: false });
            if (kind === 'early') {
              const s = await c.response(id);
              assert.equal(s.status ?? s.headers?.[':status'], 401, c.summary());
              assert.ok(s.ended && s.rst_code === null, `answered, not reset: ${c.summary()}`);
            } else {
              // Content-length case: announce 10 bytes, send 5 and END_STREAM.
              await new Promise((r) => setImmediate(r));
            }
            await run(c, id);
          } finally {
            c.destroy();
          }
        });
      }
      it(`${transport}, ${kind}: content-length that the DATA does not match: PROTOCOL_ERROR`, async () => {
        const c = await connect();
        try {
          await c.handshake();
          const id = c.request({ ...request, headers: [...request.headers, ['content-length', '10']], end_stream: false });
          if (kind === 'early') await c.response(id);
          c.write(data_frame(id, '12345', { end_stream: true }));
          await expect_error(c, id, error_code.PROTOCOL_ERROR);
        } finally {
          c.destroy();
        }
      });
    }
    it(`${transport}, early: a client that sends its body on is reset NO_ERROR past the linger, and the connection serves on`, async () => {
      const c = await connect();
      try {
        await c.handshake();
        const id = c.request({ ...kinds.early, end_stream: false });
        await c.response(id);
        for (let i = 0; i < 8; ++i) c.write(data_frame(id, Buffer.alloc(16000, 0x61)));  // past 64 KiB
        const f = await c.wait_frame((x) => x.type === frame_type.RST_STREAM && x.stream_id === id, { what: 'the reset' });
        assert.equal(f.error_code, error_code.NO_ERROR);
        const next = c.request({ ...kinds.forwarded, body: JSON.stringify({ model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }) });
        const s = await c.response(next);
        assert.equal(s.status ?? s.headers?.[':status'], 200, c.summary());
      } finally {
        c.destroy();
      }
    });
  }
});
