// Malformed and hostile requests: each gets its 4xx (505 for HTTP/2.0) with
// an OpenAI-shaped JSON error, framing errors close the connection, and none
// of them reaches the backend (mock-vllm's /debug/requests stays empty).
// DESIGN.md §9 is the reference for statuses and closes.
import assert from 'node:assert/strict';
import { after, afterEach, before, describe, it } from 'node:test';

import {
  bound_ms, build_request, chat_body, is_openai_error, raw_connection, raw_exchange, sluice_config,
  start_mock_vllm, start_sluice, stop_all, test_key,
} from './lib/harness.mjs';

const max_body_bytes = 4096;
const auth = `Authorization: Bearer ${test_key}`;
const valid = JSON.stringify(chat_body({ max_tokens: 4 }));

// A request from raw head lines and a body; Content-Length is appended
// unless the lines already frame the body or cl is false.
function raw({ line = 'POST /v1/chat/completions HTTP/1.1', headers = ['Host: 127.0.0.1', auth, 'Content-Type: application/json'], body = valid, cl = true, eol = '\r\n' }) {
  const body_buf = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  const lines = [line, ...headers];
  if (cl) lines.push(`Content-Length: ${body_buf.length}`);
  return Buffer.concat([Buffer.from(lines.join(eol) + eol + eol, 'latin1'), body_buf]);
}
const with_body = (body) => raw({ body });
const with_json = (obj) => raw({ body: JSON.stringify(obj) });
const base_headers = ['Host: 127.0.0.1', auth, 'Content-Type: application/json'];
const chunked = (payload) => `${payload.length.toString(16)}\r\n${payload}\r\n0\r\n\r\n`;
const nested = (depth) => '['.repeat(depth) + ']'.repeat(depth);
const msgs = [{ role: 'user', content: 'hi' }];
const model = chat_body().model;

// {name, bytes, status, close (true: must close; undefined: either), code}
const cases = [
  // Request smuggling shapes and framing.
  { name: 'CL.TE: Content-Length and Transfer-Encoding', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 4', 'Transfer-Encoding: chunked'], body: chunked(valid), cl: false }) },
  { name: 'TE.CL: Transfer-Encoding then Content-Length', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked', `Content-Length: ${chunked(valid).length}`], body: chunked(valid), cl: false }) },
  { name: 'duplicate Content-Length with different values', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${valid.length}`, `Content-Length: ${valid.length + 1}`], cl: false }) },
  { name: 'duplicate Content-Length with equal values', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${valid.length}`, `Content-Length: ${valid.length}`], cl: false }) },
  { name: 'Content-Length as a list', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${valid.length}, ${valid.length}`], cl: false }) },
  { name: 'Transfer-Encoding: xchunked', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: xchunked'], body: chunked(valid), cl: false }) },
  { name: 'Transfer-Encoding: chunked then a second Transfer-Encoding', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked', 'Transfer-Encoding: x'], body: chunked(valid), cl: false }) },
  { name: 'non-numeric Content-Length', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 1x'], cl: false }) },
  { name: 'negative Content-Length', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: -1'], cl: false }) },
  { name: 'Content-Length of 2^64 (overflow)', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 18446744073709551616'], cl: false }) },
  { name: 'invalid chunk size', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked'], body: `zz\r\n${valid}\r\n0\r\n\r\n`, cl: false }) },
  { name: 'obs-fold continuation line', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-Folded: first', ' second'] }) },
  { name: 'space before the header colon', status: 400, close: true,
    bytes: raw({ headers: ['Host: 127.0.0.1', auth, 'Content-Type : application/json'] }) },
  { name: 'space in a header name', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Bad Name: x'] }) },
  { name: 'bare LF line endings', status: 400, close: true, bytes: raw({ eol: '\n' }) },
  { name: 'bare CR inside a header value', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-A: a\rb'] }) },
  { name: 'NUL in a header value', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-A: a\0b'] }) },
  { name: 'control byte in a header value', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-A: a\x01b'] }) },
  { name: 'HTTP/2.0 in the request line', status: 505, close: true,
    bytes: raw({ line: 'POST /v1/chat/completions HTTP/2.0' }) },
  { name: 'absolute-URI request target', status: 400,
    bytes: raw({ line: 'POST http://backend.internal/v1/chat/completions HTTP/1.1' }) },
  { name: 'HTTP/1.1 without Host', status: 400,
    bytes: raw({ headers: [auth, 'Content-Type: application/json'] }) },

  // Limits.
  { name: 'head over 32 KiB', status: 431, close: true,
    bytes: raw({ headers: [...base_headers, ...Array.from({ length: 40 }, (_, i) => `X-Pad-${i}: ${'a'.repeat(1000)}`)] }) },
  { name: 'one header line over 8 KiB', status: 431, close: true,
    bytes: raw({ headers: [...base_headers, `X-Big: ${'b'.repeat(9000)}`] }) },
  { name: 'request line over 8 KiB', status: 414, close: true,
    bytes: raw({ line: `POST /v1/chat/completions?${'q'.repeat(9000)} HTTP/1.1` }) },
  { name: 'more than 100 header fields', status: 431, close: true,
    bytes: raw({ headers: [...base_headers, ...Array.from({ length: 150 }, (_, i) => `X-H${i}: v`)] }) },
  { name: 'Content-Length over max_body_bytes (head only)', status: 413,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${max_body_bytes * 4}`], body: '', cl: false }) },
  { name: 'chunked body over max_body_bytes', status: 413,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked'], body: chunked(JSON.stringify(chat_body({ content: 'x'.repeat(max_body_bytes + 500) }))), cl: false }) },

  // Bodies.
  { name: 'JSON cut short', status: 400, bytes: with_body('{"model":') },
  { name: 'trailing garbage after the JSON', status: 400, bytes: with_body(`${valid} x`) },
  { name: 'two JSON documents', status: 400, bytes: with_body(`${valid}${valid}`) },
  { name: 'duplicate JSON keys', status: 400, bytes: with_body(`{"model":"${model}","model":"other","messages":[{"role":"user","content":"hi"}]}`) },
  { name: 'NaN', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"temperature":NaN}`) },
  { name: 'Infinity', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"temperature":Infinity}`) },
  { name: 'nesting depth 65', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"x":${nested(64)}}`) },
  { name: 'lone surrogate escape', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"\\ud800"}]}`) },
  { name: 'invalid UTF-8', status: 400,
    bytes: with_body(Buffer.concat([Buffer.from(`{"model":"${model}","messages":[{"role":"user","content":"`), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"}]}')])) },
  { name: 'empty body', status: 400, bytes: with_body('') },
  { name: 'body is a JSON array', status: 400, bytes: with_body('[]') },
  { name: 'max_tokens 0', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: 0 }) },
  { name: 'max_tokens -1', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: -1 }) },
  { name: 'max_tokens as a string', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: '10' }) },
  { name: 'max_tokens 1.5', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: 1.5 }) },
  { name: 'max_tokens beyond 64 bits', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"max_tokens":99999999999999999999}`) },
  { name: 'max_completion_tokens 0', status: 400, bytes: with_json({ model, messages: msgs, max_completion_tokens: 0 }) },
  { name: 'missing model', status: 400, bytes: with_json({ messages: msgs, max_tokens: 4 }) },
  { name: 'model is not a string', status: 400, bytes: with_json({ model: 7, messages: msgs }) },
  { name: 'messages is not an array', status: 400, bytes: with_json({ model, messages: 'hi' }) },
  { name: 'stream is not a boolean', status: 400, bytes: with_json({ model, messages: msgs, stream: 'yes' }) },

  // Auth, paths, methods.
  { name: 'missing Authorization', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', 'Content-Type: application/json'] }) },
  { name: 'wrong key', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', 'Authorization: Bearer not-the-key', 'Content-Type: application/json'] }) },
  { name: 'Basic instead of Bearer', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', `Authorization: Basic ${Buffer.from(`user:${test_key}`).toString('base64')}`, 'Content-Type: application/json'] }) },
  { name: 'empty Bearer token', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', 'Authorization: Bearer ', 'Content-Type: application/json'] }) },
  { name: 'unknown path', status: 404, bytes: raw({ line: 'POST /v1/nothing-here HTTP/1.1' }) },
  { name: 'GET on a POST endpoint', status: 405, bytes: raw({ line: 'GET /v1/chat/completions HTTP/1.1', body: '', cl: false }) },
  { name: 'DELETE /v1/models', status: 405, bytes: raw({ line: 'DELETE /v1/models HTTP/1.1', body: '', cl: false }) },

  // More smuggling and framing disguises.
  { name: 'Transfer-Encoding: chunked, identity', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked, identity'], body: chunked(valid), cl: false }) },
  { name: 'Transfer-Encoding: gzip, chunked (a coding sluice does not do)', status: 501, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: gzip, chunked'], body: chunked(valid), cl: false }) },
  { name: 'Transfer-Encoding in an HTTP/1.0 request', status: 400, close: true,
    bytes: raw({ line: 'POST /v1/chat/completions HTTP/1.0', headers: [...base_headers, 'Transfer-Encoding: chunked'], body: chunked(valid), cl: false }) },
  { name: 'Content-Length with a plus sign', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: +${valid.length}`], cl: false }) },
  { name: 'chunk size written 0x10', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked'], body: `0x${valid.length.toString(16)}\r\n${valid}\r\n0\r\n\r\n`, cl: false }) },
  { name: 'chunk data without its CRLF', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked'], body: `${valid.length.toString(16)}\r\n${valid}XX0\r\n\r\n`, cl: false }) },
  { name: 'a header line without a colon', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'NoColonHere'] }) },
  { name: 'request line without a version (HTTP/0.9 shape)', status: 400, close: true,
    bytes: Buffer.from('GET /v1/models\r\n\r\n') },

  // Methods, versions, targets.
  { name: 'unknown method', status: 501, close: true, bytes: raw({ line: 'BREW /v1/chat/completions HTTP/1.1' }) },
  { name: 'lower-case method', status: 501, close: true, bytes: raw({ line: 'post /v1/chat/completions HTTP/1.1' }) },
  { name: 'asterisk-form target', status: 400, close: true, bytes: raw({ line: 'OPTIONS * HTTP/1.1', body: '', cl: false }) },
  { name: 'authority-form target (CONNECT)', status: 400, close: true,
    bytes: raw({ line: 'CONNECT 127.0.0.1:443 HTTP/1.1', body: '', cl: false }) },
  { name: 'fragment in the target', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions#x HTTP/1.1' }) },
  { name: 'dot-segments in the path are not normalised into an endpoint', status: 404,
    bytes: raw({ line: 'POST /v1/../v1/chat/completions HTTP/1.1' }) },
  { name: 'Expect other than 100-continue', status: 417, close: true,
    bytes: raw({ headers: [...base_headers, 'Expect: 200-ok'] }) },

  // Auth edge cases.
  { name: 'duplicate Authorization', status: 400, close: true,
    bytes: raw({ headers: ['Host: 127.0.0.1', auth, auth, 'Content-Type: application/json'] }) },
  { name: 'duplicate Host', status: 400, close: true,
    bytes: raw({ headers: ['Host: 127.0.0.1', 'Host: 127.0.0.2', auth, 'Content-Type: application/json'] }) },
  { name: 'key in the query string instead of the header', status: 401, code: 'invalid_api_key',
    bytes: raw({ line: `POST /v1/chat/completions?api_key=${test_key} HTTP/1.1`, headers: ['Host: 127.0.0.1', 'Content-Type: application/json'] }) },
  { name: 'case-flipped key', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', `Authorization: Bearer ${test_key.toUpperCase()}`, 'Content-Type: application/json'] }) },
  { name: 'truncated key', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', `Authorization: Bearer ${test_key.slice(0, -1)}`, 'Content-Type: application/json'] }) },

  // More JSON.
  { name: 'UTF-8 byte order mark before the JSON', status: 400, bytes: with_body(`\ufeff${valid}`) },
  { name: 'duplicate key written with an escape', status: 400,
    bytes: with_body(`{"model":"${model}","\\u006dodel":"other","messages":[{"role":"user","content":"hi"}]}`) },
  { name: 'messages is an empty array', status: 400, bytes: with_json({ model, messages: [] }) },
  { name: 'stream_options is not an object', status: 400, bytes: with_json({ model, messages: msgs, stream: true, stream_options: true }) },
  { name: 'max_tokens 1e3', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"max_tokens":1e3}`) },
  { name: 'max_tokens 10.0', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"max_tokens":10.0}`) },
];

describe('malformed and hostile requests', () => {
  let mock;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 1000, reply_tokens: 4 });
    sluice = await start_sluice({
      backends: [mock.url],
      config: sluice_config({ backends: [mock.url], server: { max_body_bytes } }),
    });
  });
  after(() => stop_all(sluice, mock));
  afterEach(() => mock.clear_requests());

  it('lets a well-formed request through (the check below can fail)', async () => {
    const { responses } = await raw_exchange(sluice.port, with_body(valid), { timeout_ms: bound_ms(5000) });
    assert.equal(responses[0].status, 200, responses[0].text?.());
    assert.equal((await mock.requests()).length, 1, 'the backend saw it');
  });

  it(`has at least 30 cases (${cases.length})`, () => {
    assert.ok(cases.length >= 30);
  });

  for (const c of cases) {
    it(`${c.name} -> ${c.status}${c.close ? ' + close' : ''}`, async () => {
      const result = await raw_exchange(sluice.port, c.bytes, {
        until_close: c.close === true, timeout_ms: bound_ms(5000), close_timeout_ms: bound_ms(2000),
      });
      const response = result.responses.find((r) => r.status !== 100);
      assert.ok(response, 'a final response');
      assert.equal(response.status, c.status, `body: ${response.text?.()}`);
      assert.match(response.header('content-type') ?? '', /^application\/json/);
      const body = JSON.parse(response.text());
      assert.ok(is_openai_error(body), `OpenAI error shape: ${response.text()}`);
      if (c.code) assert.equal(body.error.code, c.code);
      if (c.close) assert.equal(result.closed, true, 'the connection is closed');
      const reached = await mock.requests();
      assert.deepEqual(reached, [], 'nothing reached the backend');
    });
  }

  it('answers 413 to Expect: 100-continue with an oversize body, without 100 Continue', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      await conn.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${auth}\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${max_body_bytes * 2}\r\nExpect: 100-continue\r\n\r\n`);
      const response = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(response.status, 413);
      assert.ok(is_openai_error(JSON.parse(response.text())));
    } finally {
      conn.destroy();
    }
    assert.deepEqual(await mock.requests(), []);
  });

  it('still serves well-formed requests after all of that', async () => {
    const { responses } = await raw_exchange(sluice.port, with_body(valid), { timeout_ms: bound_ms(5000) });
    assert.equal(responses[0].status, 200);
  });
});
