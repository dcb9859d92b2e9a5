// A gRPC backend that writes whatever bytes the test says: a node:http2
// server (h2c, prior knowledge) whose every ModelStreamInfer stream runs a
// script of steps. Unlike lib/triton_peer.mjs (a well-behaved @grpc/grpc-js
// server) nothing here checks the bytes: frames may be truncated, flagged,
// over-long or malformed; trailers may be missing; streams may be reset and
// sessions destroyed, so sluice's gRPC client can be shown bad input.
//
// The valid messages are ModelStreamInferResponse as in
// lib/proto/grpc_service.proto, encoded by the small protobuf writer below:
// text_output as a BYTES output whose raw_output_contents element is a
// 4-byte little-endian length and the text.
import http2 from 'node:http2';

import { with_timeout } from './harness.mjs';

// A number per HTTP/2 session (connection), in the order they came.
const session_ids = new WeakMap();
let session_count = 0;
function session_of(session) {
  if (!session_ids.has(session)) session_ids.set(session, ++session_count);
  return session_ids.get(session);
}

export const h2 = http2.constants;

// ---------------------------------------------------------------------------
// Protobuf writer (the wire format only: varints, tags, length-delimited)

export function varint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) b |= 0x80;
    out.push(b);
  } while (v !== 0n);
  return Buffer.from(out);
}

const tag = (field, wire_type) => varint((field << 3) | wire_type);

export function len_field(field, bytes) {
  const b = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes, 'utf8');
  return Buffer.concat([tag(field, 2), varint(b.length), b]);
}

export function varint_field(field, n) {
  return Buffer.concat([tag(field, 0), varint(n)]);
}

// One BYTES element: a 4-byte little-endian length, then the bytes.
function bytes_element(text) {
  const b = Buffer.from(text, 'utf8');
  const n = Buffer.alloc(4);
  n.writeUInt32LE(b.length);
  return Buffer.concat([n, b]);
}

// A ModelStreamInferResponse carrying one token (text_output) and, when
// `final` is a boolean, the triton_final_response parameter.
export function token_message(text, { final, model = 'm', id = '' } = {}) {
  const parts = [len_field(1, model)];
  if (id) parts.push(len_field(3, id));
  if (final !== undefined) {
    // map<string, InferParameter> entry: key = 1, value = 2 { bool_param = 1 }
    const entry = Buffer.concat([len_field(1, 'triton_final_response'), len_field(2, varint_field(1, final ? 1 : 0))]);
    parts.push(len_field(4, entry));
  }
  // InferOutputTensor { name = 1, datatype = 2, shape = 3 (packed) }
  const output = Buffer.concat([len_field(1, 'text_output'), len_field(2, 'BYTES'), len_field(3, varint(1))]);
  parts.push(len_field(5, output), len_field(6, bytes_element(text)));
  return len_field(2, Buffer.concat(parts));
}

// A ModelStreamInferResponse with error_message set (the server failed the request).
export function error_message(text) {
  return len_field(1, text);
}

// The 5-byte gRPC prefix (flag, big-endian length) and the message;
// `flag` and `length` override what the prefix says.
export function grpc_frame(message, { flag = 0, length } = {}) {
  const head = Buffer.alloc(5);
  head[0] = flag;
  head.writeUInt32BE(length ?? message.length, 1);
  return Buffer.concat([head, message]);
}

export const grpc_headers = { ':status': 200, 'content-type': 'application/grpc' };

// The steps of a well-behaved answer: headers, one frame per token (the last
// one final), trailers with grpc-status 0.
export function ok_steps(tokens, options = {}) {
  return [
    { headers: grpc_headers },
    ...tokens.map((t, i) => ({ data: grpc_frame(token_message(t, { ...options, final: i === tokens.length - 1 })) })),
    { trailers: { 'grpc-status': '0' } },
  ];
}

// ---------------------------------------------------------------------------
// Protobuf reader: the top-level fields of the request (model_name = 1,
// id = 3), so a script can answer per request.

function read_varint(buf, at) {
  let v = 0n;
  let shift = 0n;
  for (;;) {
    if (at >= buf.length) throw new Error('truncated varint');
    const b = buf[at++];
    v |= BigInt(b & 0x7f) << shift;
    if ((b & 0x80) === 0) return [v, at];
    shift += 7n;
  }
}

function request_fields(message) {
  const out = {};
  let at = 0;
  while (at < message.length) {
    let key;
    [key, at] = read_varint(message, at);
    const field = Number(key >> 3n);
    const type = Number(key & 7n);
    if (type === 0) {
      [, at] = read_varint(message, at);
    } else if (type === 2) {
      let n;
      [n, at] = read_varint(message, at);
      const bytes = message.subarray(at, at + Number(n));
      at += Number(n);
      if (field === 1) out.model_name = bytes.toString('utf8');
      if (field === 3) out.id = bytes.toString('utf8');
    } else if (type === 1) {
      at += 8;
    } else if (type === 5) {
      at += 4;
    } else {
      throw new Error(`wire type ${type}`);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// The server

// `script(request)` returns the steps for one stream (an array, run in
// order). request: {headers, bytes (the request body's length),
// message_bytes (what its gRPC prefix says), model_name, id, index,
// stream_id}. Steps:
//   {informational: {...}}           a 1xx HEADERS before the response's own
//   {headers: {...}}                 respond (trailers allowed later)
//   {headers: {...}, end: true}      respond with END_STREAM (trailers-only)
//   {data: Buffer}                   DATA, handed to the session before the next step
//   {trailers: {...}}                end the stream with these trailers
//   {end: true}                      END_STREAM on an empty DATA frame: no trailers
//   {rst: code}                      RST_STREAM with that code
//   {goaway: code, last_stream}      GOAWAY on the session with streams in flight; with
//                                    NO_ERROR the script goes on (last_stream 'this':
//                                    this stream is still served), else the session goes
//   {destroy_session: true}          the connection goes (no GOAWAY, no RST)
//   {wait: promise}                  nothing more until it settles (a barrier between streams)
//   {signal: fn}                     calls fn(): tells the test the steps before it are done
//   {ping: true}                     PING, and wait for sluice's ACK: what came before
//                                    was read on its own
//   {hold: true}                     nothing more until sluice closes the stream
// Resolves {url, port, requests, closes, cancels, set(script), wait_for, stop}.
// `closes` holds {id, rst_code, by_peer} for each stream's end; `cancels`
// the closes that were sluice's RST_STREAM CANCEL.
export async function start_raw_grpc_backend(script = () => ok_steps(['ok'])) {
  let current = script;
  const requests = [];
  const closes = [];
  const cancels = [];
  const sessions = new Set();
  const events = new EventTarget();
  const notify = () => events.dispatchEvent(new Event('change'));

  const server = http2.createServer();
  server.on('session', (session) => {
    sessions.add(session);
    session.on('close', () => sessions.delete(session));
    session.on('error', () => {});
  });
  server.on('stream', (stream, headers) => {
    stream.on('error', () => {});
    let by_us = false;
    const closed = new Promise((resolve) => {
      stream.on('close', () => {
        const by_peer = !by_us && stream.rstCode !== h2.NGHTTP2_NO_ERROR;
        const rec = { id: stream.id, rst_code: stream.rstCode, by_peer };
        closes.push(rec);
        if (by_peer && stream.rstCode === h2.NGHTTP2_CANCEL) cancels.push(rec);
        notify();
        resolve();
      });
    });
    const chunks = [];
    stream.on('data', (d) => chunks.push(d));
    stream.on('end', async () => {
      const body = Buffer.concat(chunks);
      const request = { headers, bytes: body.length, index: requests.length, stream_id: stream.id, session: session_of(stream.session) };
      if (body.length >= 5) {
        request.message_bytes = body.readUInt32BE(1);
        try {
          Object.assign(request, request_fields(body.subarray(5)));
        } catch (err) {
          request.decode_error = String(err);
        }
      }
      requests.push(request);
      notify();
      try {
        await run(stream, await current(request), closed, () => { by_us = true; });
      } catch {
        // The stream or session went under a step: the script's point, often.
      }
    });
  });

  async function run(stream, steps, closed, mark_ours) {
    // Headers go out wanting trailers unless the script ends on DATA: node
    // then sends no END_STREAM of its own (a reset stays a bare RST_STREAM
    // instead of an end followed by one).
    const wants_trailers = !steps.some((s) => s.end && !s.headers);
    for (const step of steps) {
      if (stream.destroyed || stream.closed) return;
      if (step.informational) {
        stream.additionalHeaders(step.informational);
      } else if (step.headers) {
        stream.respond(step.headers, { endStream: Boolean(step.end), waitForTrailers: wants_trailers && !step.end });
        if (step.end) mark_ours();
      } else if (step.data) {
        await new Promise((resolve) => stream.write(step.data, resolve));
      } else if (step.trailers) {
        mark_ours();
        stream.once('wantTrailers', () => stream.sendTrailers(step.trailers));
        stream.end();
      } else if (step.end) {
        mark_ours();
        stream.end();
      } else if (step.rst !== undefined) {
        mark_ours();
        stream.close(step.rst);
      } else if (step.goaway !== undefined) {
        // last_stream 'this': the stream in flight is still served (graceful).
        const last = step.last_stream === 'this' ? stream.id : (step.last_stream ?? 0);
        stream.session.goaway(step.goaway, last);
        if (step.goaway !== h2.NGHTTP2_NO_ERROR) {
          mark_ours();
          stream.session.destroy();
        }
      } else if (step.destroy_session) {
        mark_ours();
        stream.session.destroy();
      } else if (step.wait) {
        await step.wait;
      } else if (step.signal) {
        step.signal();
      } else if (step.ping) {
        // sluice's ACK comes after it has read (and acted on) all before it.
        await new Promise((resolve) => stream.session.ping(() => resolve()));
      } else if (step.hold) {
        await closed;
      }
    }
  }

  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = server.address().port;
  return {
    url: `grpc://127.0.0.1:${port}`,
    port,
    requests,
    closes,
    cancels,
    set(next) {
      current = next;
    },
    // Resolves once `list` ('requests', 'closes', 'cancels') has `count`
    // entries; rejects after timeout_ms.
    wait_for(list, count, timeout_ms) {
      const arr = { requests, closes, cancels }[list];
      return with_timeout(new Promise((resolve) => {
        const check = () => {
          if (arr.length >= count) {
            events.removeEventListener('change', check);
            resolve(arr);
          }
        };
        events.addEventListener('change', check);
        check();
      }), timeout_ms, `${count} ${list} at the raw gRPC backend (have ${arr.length})`);
    },
    async stop() {
      for (const s of sessions) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}
