// Malformed and hostile requests: each gets its 4xx (501/505 for methods,
// codings and versions sluice does not do) with an OpenAI-shaped JSON error,
// framing errors close the connection, and none of them reaches the backend
// (mock-vllm's /debug/requests stays empty). A second, shorter table holds
// the look-alike shapes sluice accepts (upgrades it does not honour, trailers
// it drops, limits met exactly): for those the check is what the backend
// received. docs/architecture.md §9 is the reference for statuses and closes.
import assert from 'node:assert/strict';
import { after, afterEach, before, describe, it } from 'node:test';

import { header_of } from './lib/gateway.mjs';
import {
  bound_ms, build_request, chat_body, is_openai_error, raw_connection, raw_exchange, sluice_config,
  start_mock_vllm, start_sluice, stop_all, test_key,
} from './lib/harness.mjs';

const max_body_bytes = 4096;
// Named (it is sluice's default) so the early refusals below can be shown
// to come well before it.
const header_timeout_ms = 10000;
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
const hex = valid.length.toString(16);
const utf8_as_latin1 = (s) => Buffer.from(s, 'utf8').toString('latin1');
const chunked_req = (body, extra = [], te = 'Transfer-Encoding: chunked') =>
  raw({ headers: [...base_headers, te, ...extra], body, cl: false });
const with_auth = (value) => raw({ headers: ['Host: 127.0.0.1', `Authorization: ${value}`, 'Content-Type: application/json'] });
// A valid body with one more top-level member, written raw.
const with_member = (member) => with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],${member}}`);
// A valid body whose message content is `inner`: JSON text, or raw bytes.
const with_content = (inner) => with_body(Buffer.concat([
  Buffer.from(`{"model":"${model}","messages":[{"role":"user","content":"`),
  Buffer.isBuffer(inner) ? inner : Buffer.from(inner, 'latin1'), Buffer.from('"}]}')]));

// Exact-size heads for the limit boundaries. They go to a path sluice does
// not serve: a 404 shows the head got past the limits, and still nothing
// reaches the backend.
const nowhere = 'POST /v1/nothing HTTP/1.1';
const line_of = (bytes) => `POST /v1/nothing?${'q'.repeat(bytes - 'POST /v1/nothing? HTTP/1.1'.length)} HTTP/1.1`;
const field_of = (bytes) => `X-Big: ${'b'.repeat(bytes - 'X-Big: '.length)}`;
// `count` fields in all: raw() adds Content-Length to the three base ones.
const fields_of = (count) => [...base_headers, ...Array.from({ length: count - 4 }, (_, i) => `X-H${i}: v`)];
// A head (request line to the blank line, CRLFs included) of exactly `bytes`.
function head_of(bytes) {
  const bare = raw({ line: nowhere }).length - Buffer.byteLength(valid);
  let left = bytes - bare;
  const pads = [];
  for (let i = 0; left > 0; ++i) {
    const line = Math.min(left, 8000);  // CRLF included
    pads.push(`X-P${i}: ${'p'.repeat(line - 2 - `X-P${i}: `.length)}`);
    left -= line;
  }
  const out = raw({ line: nowhere, headers: [...base_headers, ...pads] });
  assert.equal(out.length - Buffer.byteLength(valid), bytes);
  return out;
}

// {name, bytes, status, close (true: must close; undefined: either), code,
//  message (a pattern the error message must match)}
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
  ...[
    ['an empty Host', 'Host: '],
    ['a space inside the Host', 'Host: 127.0.0.1 evil.example'],
    ['userinfo in the Host', 'Host: user@127.0.0.1'],
    ['a Host port that is not digits', 'Host: 127.0.0.1:abc'],
    ['a Host port over 65535', 'Host: 127.0.0.1:99999'],
    ['a Host with an empty port', 'Host: 127.0.0.1:'],
    ['an unterminated IPv6 literal in the Host', 'Host: [::1'],
  ].map(([what, host]) => ({ name: `${what} (invalid Host header)`, status: 400, close: true, message: /invalid Host header/,
    bytes: raw({ headers: [host, auth, 'Content-Type: application/json'] }) })),

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

  // TE.TE and CL.TE disguises.
  { name: 'CL.TE with Transfer-Encoding:<HTAB>chunked', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${valid.length}`, 'Transfer-Encoding:\tchunked'], body: chunked(valid), cl: false }) },
  { name: 'CL.TE with the Transfer-Encoding name and value upper-cased', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 4', 'TRANSFER-ENCODING: CHUNKED'], body: chunked(valid), cl: false }) },
  { name: 'TE.CL with Content-Length: 0', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Transfer-Encoding: chunked', 'Content-Length: 0'], body: chunked(valid), cl: false }) },
  { name: 'Transfer-Encoding with HTAB before the colon', status: 400, close: true,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding\t: chunked') },
  { name: 'two Transfer-Encoding: chunked fields', status: 400, close: true,
    bytes: chunked_req(chunked(valid), ['Transfer-Encoding: chunked']) },
  { name: 'Transfer-Encoding: chunked, chunked', status: 400, close: true,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding: chunked, chunked') },
  { name: 'Transfer-Encoding: identity', status: 400, close: true,
    bytes: chunked_req(valid, [], 'Transfer-Encoding: identity') },
  { name: 'Transfer-Encoding: "chunked" (quoted)', status: 400, close: true,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding: "chunked"') },
  { name: 'Transfer-Encoding: chunked;q=1 (a parameter on chunked)', status: 400, close: true,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding: chunked;q=1') },
  { name: 'Transfer-Encoding: chunked with a trailing comma', status: 400, close: true,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding: chunked,') },
  { name: 'Transfer-Encoding: chunked followed by a vertical tab', status: 400, close: true,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding: chunked\x0b') },

  // Content-Length values.
  { name: 'Content-Length of 2^64 + 1', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 18446744073709551617'], cl: false }) },
  { name: 'Content-Length of 2^63 (past the parser range)', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 9223372036854775808'], cl: false }) },
  { name: 'Content-Length of 2^63 - 1 parses, then is over max_body_bytes', status: 413, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: 9223372036854775807'], body: '', cl: false }) },
  { name: 'Content-Length written 0x..', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: 0x${valid.length.toString(16)}`], cl: false }) },
  { name: 'Content-Length with leading zeros past 19 digits', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${String(valid.length).padStart(24, '0')}`], cl: false }) },
  { name: 'Content-Length with a space between its digits', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${String(valid.length).replace(/^(\d)/, '$1 ')}`], cl: false }) },
  { name: 'Content-Length list with an empty element', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: , ${valid.length}`], cl: false }) },
  { name: 'empty Content-Length', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Length: '], cl: false }) },
  { name: 'Content-Length with a decimal point', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${valid.length}.0`], cl: false }) },
  { name: 'Content-Length in full-width digits (UTF-8)', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${utf8_as_latin1('\uff18\uff18')}`], cl: false }) },

  // Chunk sizes, extensions, trailers.
  { name: 'chunk size of 2^64 in hex is over max_body_bytes', status: 413, close: true,
    bytes: chunked_req(`10000000000000000\r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'chunk size padded past 16 hex digits', status: 400, close: true,
    bytes: chunked_req(`${hex.padStart(17, '0')}\r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'chunk extension over 4 KiB', status: 400, close: true,
    bytes: chunked_req(`${hex};x=${'e'.repeat(5000)}\r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'bare LF after the chunk size', status: 400, close: true,
    bytes: chunked_req(`${hex}\n${valid}\r\n0\r\n\r\n`) },
  { name: 'bare LF after a chunk extension', status: 400, close: true,
    bytes: chunked_req(`${hex};a=b\n${valid}\r\n0\r\n\r\n`) },
  { name: 'bare CR after the chunk size', status: 400, close: true,
    bytes: chunked_req(`${hex}\r${valid}\r\n0\r\n\r\n`) },
  { name: 'chunk data followed by a bare LF', status: 400, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\n0\r\n\r\n`) },
  { name: 'negative chunk size', status: 400, close: true,
    bytes: chunked_req(`-${hex}\r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'chunk size with a leading space', status: 400, close: true,
    bytes: chunked_req(` ${hex}\r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'whitespace after the chunk size with no extension', status: 400, close: true,
    bytes: chunked_req(`${hex} \r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'control byte in a chunk extension', status: 400, close: true,
    bytes: chunked_req(`${hex};a\x01b\r\n${valid}\r\n0\r\n\r\n`) },
  { name: 'last chunk ended by a bare CR', status: 400, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\n\rX`) },
  { name: 'obs-fold in the trailer section', status: 400, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\nX-T: a\r\n b\r\n\r\n`) },
  { name: 'bare LF in the trailer section', status: 400, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\nX-T: a\n\r\n`) },
  { name: 'NUL in a trailer value', status: 400, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\nX-T: a\0b\r\n\r\n`) },
  { name: 'space before the colon in a trailer field', status: 400, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\nX-T : a\r\n\r\n`) },
  { name: 'more than 100 trailer fields', status: 431, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\n${Array.from({ length: 101 }, (_, i) => `T${i}: v\r\n`).join('')}\r\n`) },
  { name: 'trailer section over 32 KiB', status: 431, close: true,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\n${Array.from({ length: 5 }, (_, i) => `T${i}: ${'t'.repeat(7000)}\r\n`).join('')}\r\n`) },
  { name: 'chunks that together pass max_body_bytes', status: 413, close: true,
    bytes: chunked_req(`bb8\r\n${' '.repeat(3000)}\r\nbb8\r\n${' '.repeat(3000)}\r\n0\r\n\r\n`) },
  { name: 'one-byte chunks with 1 KiB extensions: framing past 64 KiB', status: 413, close: true,
    bytes: chunked_req(`${[...valid].map((ch) => `1;x=${'e'.repeat(1024)}\r\n${ch}\r\n`).join('')}0\r\n\r\n`) },
  { name: 'chunked body of only the last chunk (empty body)', status: 400, bytes: chunked_req('0\r\n\r\n') },

  // Control and high bytes in the head.
  { name: 'DEL in a header value', status: 400, close: true, bytes: raw({ headers: [...base_headers, 'X-A: a\x7fb'] }) },
  { name: 'DEL in a header name', status: 400, close: true, bytes: raw({ headers: [...base_headers, 'X-\x7fA: v'] }) },
  { name: '0x01 in a header name', status: 400, close: true, bytes: raw({ headers: [...base_headers, 'X-\x01A: v'] }) },
  { name: 'high byte (0xff) in a header name', status: 400, close: true, bytes: raw({ headers: [...base_headers, 'X-\xffA: v'] }) },
  { name: 'a quote (not a token character) in a header name', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-"A": v'] }) },
  { name: 'empty header name (an HTTP/2 pseudo-header)', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, ':authority: backend.internal'] }) },
  { name: 'vertical tab in a header value', status: 400, close: true, bytes: raw({ headers: [...base_headers, 'X-A: a\x0bb'] }) },
  { name: 'ESC in the Authorization value', status: 400, close: true,
    bytes: raw({ headers: ['Host: 127.0.0.1', `Authorization: Bearer ${test_key}\x1b`, 'Content-Type: application/json'] }) },
  { name: 'control byte in the request target', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/\x01completions HTTP/1.1' }) },
  { name: 'NUL in the request target', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions\0 HTTP/1.1' }) },
  { name: 'DEL in the request target', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions\x7f HTTP/1.1' }) },
  { name: 'HTAB between method and target', status: 400, close: true, bytes: raw({ line: 'POST\t/v1/chat/completions HTTP/1.1' }) },
  { name: 'bare CR in the request line', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions\r HTTP/1.1' }) },
  { name: 'raw space inside the request target', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat completions HTTP/1.1' }) },

  // Request-target forms.
  { name: 'asterisk-form target with POST', status: 400, close: true, bytes: raw({ line: 'POST * HTTP/1.1' }) },
  { name: 'empty request target', status: 400, close: true, bytes: raw({ line: 'POST  HTTP/1.1' }) },
  { name: 'network-path target (//host/...) is a path, not an authority', status: 404,
    bytes: raw({ line: 'POST //backend.internal/v1/chat/completions HTTP/1.1' }) },
  { name: 'percent-encoded dot-segments are not decoded into an endpoint', status: 404,
    bytes: raw({ line: 'POST /v1/%2e%2e/v1/chat/completions HTTP/1.1' }) },
  { name: 'percent-encoded slash is not decoded into an endpoint', status: 404, bytes: raw({ line: 'POST /v1/chat%2Fcompletions HTTP/1.1' }) },
  { name: 'trailing slash is another path', status: 404, bytes: raw({ line: 'POST /v1/chat/completions/ HTTP/1.1' }) },
  { name: 'paths are case-sensitive', status: 404, bytes: raw({ line: 'POST /V1/chat/completions HTTP/1.1' }) },
  { name: 'a ;parameter is part of the path', status: 404, bytes: raw({ line: 'POST /v1/chat/completions;x=1 HTTP/1.1' }) },

  // Head limits: exactly at each limit passes on to routing; one byte or field more is refused.
  { name: 'request line of exactly 8 KiB reaches routing', status: 404, bytes: raw({ line: line_of(8192) }) },
  { name: 'request line of 8 KiB + 1', status: 414, close: true, bytes: raw({ line: line_of(8193) }) },
  { name: 'header line of exactly 8 KiB reaches routing', status: 404,
    bytes: raw({ line: nowhere, headers: [...base_headers, field_of(8192)] }) },
  { name: 'header line of 8 KiB + 1', status: 431, close: true, bytes: raw({ line: nowhere, headers: [...base_headers, field_of(8193)] }) },
  { name: 'exactly 100 header fields reach routing', status: 404, bytes: raw({ line: nowhere, headers: fields_of(100) }) },
  { name: '101 header fields', status: 431, close: true, bytes: raw({ line: nowhere, headers: fields_of(101) }) },
  { name: 'head of exactly 32 KiB reaches routing', status: 404, bytes: head_of(32768) },
  { name: 'head of 32 KiB + 1', status: 431, close: true, bytes: head_of(32769) },

  // Methods and versions.
  { name: 'HTTP/1.2', status: 505, close: true, bytes: raw({ line: 'POST /v1/chat/completions HTTP/1.2' }) },
  { name: 'HTTP/0.9 as a version token', status: 505, close: true, bytes: raw({ line: 'POST /v1/chat/completions HTTP/0.9' }) },
  { name: 'HTTP/2 (no minor version)', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions HTTP/2' }) },
  { name: 'HTTP/1.10', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions HTTP/1.10' }) },
  { name: 'a space after HTTP/1.1', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions HTTP/1.1 ' }) },
  { name: 'lower-case http/1.1', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions http/1.1' }) },
  { name: 'a token after the version', status: 400, close: true, bytes: raw({ line: 'POST /v1/chat/completions HTTP/1.1 extra' }) },
  { name: 'a space before the method', status: 400, close: true, bytes: raw({ line: ' POST /v1/chat/completions HTTP/1.1' }) },
  { name: 'HTTP/2 connection preface (h2c = false here: HTTP/1.1 only)', status: 505, close: true,
    bytes: Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]) },
  { name: 'a 64-letter method (over the 32-byte limit: no HTTP client)', status: 400, close: true,
    bytes: raw({ line: `${'X'.repeat(64)} /v1/chat/completions HTTP/1.1` }) },
  { name: 'PATCH on a POST endpoint', status: 405, bytes: raw({ line: 'PATCH /v1/chat/completions HTTP/1.1' }) },
  { name: 'TRACE on a POST endpoint', status: 405, bytes: raw({ line: 'TRACE /v1/chat/completions HTTP/1.1', body: '', cl: false }) },
  { name: 'PROPFIND (a WebDAV method the parser knows)', status: 405, bytes: raw({ line: 'PROPFIND /v1/chat/completions HTTP/1.1' }) },

  // Auth edge cases.
  { name: 'Bearer followed by HTAB', status: 401, code: 'invalid_api_key', bytes: with_auth(`Bearer\t${test_key}`) },
  { name: 'Bearer with no token and no space', status: 401, code: 'invalid_api_key', bytes: with_auth('Bearer') },
  { name: 'empty Authorization value', status: 401, code: 'invalid_api_key', bytes: with_auth('') },
  { name: 'a 2 KiB key', status: 401, code: 'invalid_api_key', bytes: with_auth(`Bearer ${'k'.repeat(2048)}`) },
  { name: 'the key followed by a second word', status: 401, code: 'invalid_api_key', bytes: with_auth(`Bearer ${test_key} x`) },
  { name: 'the key in quotes', status: 401, code: 'invalid_api_key', bytes: with_auth(`Bearer "${test_key}"`) },
  { name: 'the key percent-encoded', status: 401, code: 'invalid_api_key',
    bytes: with_auth(`Bearer ${[...test_key].map((ch) => `%${ch.charCodeAt(0).toString(16)}`).join('')}`) },
  { name: 'the key with a homoglyph (UTF-8 Cyrillic e)', status: 401, code: 'invalid_api_key',
    bytes: with_auth(`Bearer ${utf8_as_latin1(test_key.replace('e', '\u0435'))}`) },
  { name: 'a Token scheme', status: 401, code: 'invalid_api_key', bytes: with_auth(`Token ${test_key}`) },
  { name: 'two credentials in one Authorization value', status: 401, code: 'invalid_api_key',
    bytes: with_auth(`Bearer nope, Bearer ${test_key}`) },
  { name: 'the key in Proxy-Authorization only', status: 401, code: 'invalid_api_key',
    bytes: raw({ headers: ['Host: 127.0.0.1', `Proxy-Authorization: Bearer ${test_key}`, 'Content-Type: application/json'] }) },
  { name: 'duplicate Authorization with differently cased names', status: 400, close: true,
    bytes: raw({ headers: ['Host: 127.0.0.1', `authorization: Bearer ${test_key}`, 'AUTHORIZATION: Bearer other', 'Content-Type: application/json'] }) },
  { name: 'duplicate Content-Type', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'Content-Type: text/plain'] }) },
  { name: 'duplicate X-Request-ID', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-Request-ID: a', 'X-Request-ID: b'] }) },
  { name: 'duplicate X-Session-ID', status: 400, close: true,
    bytes: raw({ headers: [...base_headers, 'X-Session-ID: a', 'x-session-id: b'] }) },

  // JSON numbers and literals.
  { name: '-Infinity', status: 400, bytes: with_member('"temperature":-Infinity') },
  { name: 'max_tokens 1e999', status: 400, bytes: with_member('"max_tokens":1e999') },
  { name: 'max_tokens with a leading zero', status: 400, bytes: with_member('"max_tokens":01') },
  { name: 'max_tokens -0', status: 400, bytes: with_member('"max_tokens":-0') },
  { name: 'max_tokens +1', status: 400, bytes: with_member('"max_tokens":+1') },
  { name: 'max_tokens 0x10', status: 400, bytes: with_member('"max_tokens":0x10') },
  { name: 'max_tokens 2^20 + 1 (over any cap)', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: 2 ** 20 + 1 }) },
  { name: 'max_tokens 32769 (over the default group cap)', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: 32769 }) },
  { name: 'max_tokens 2^64 - 1 (unsigned 64-bit)', status: 400, bytes: with_member('"max_tokens":18446744073709551615') },
  { name: 'max_tokens true', status: 400, bytes: with_json({ model, messages: msgs, max_tokens: true }) },
  { name: 'max_completion_tokens as a string', status: 400, bytes: with_json({ model, messages: msgs, max_completion_tokens: '8' }) },

  // JSON strings and encodings.
  { name: 'lone low surrogate escape', status: 400, bytes: with_content('\\udc00') },
  { name: 'overlong UTF-8 (C0 AF)', status: 400, bytes: with_content(Buffer.from([0xc0, 0xaf])) },
  { name: 'UTF-8 encoded surrogate (ED A0 80)', status: 400, bytes: with_content(Buffer.from([0xed, 0xa0, 0x80])) },
  { name: 'UTF-8 past U+10FFFF (F4 90 80 80)', status: 400, bytes: with_content(Buffer.from([0xf4, 0x90, 0x80, 0x80])) },
  { name: 'UTF-8 sequence cut before the closing quote', status: 400, bytes: with_content(Buffer.from([0xe2, 0x82])) },
  { name: 'invalid UTF-8 in an object key', status: 400,
    bytes: with_body(Buffer.concat([Buffer.from(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"`), Buffer.from([0xff]), Buffer.from('":1}')])) },
  { name: 'unescaped control byte inside a string', status: 400, bytes: with_content('a\x01b') },
  { name: 'invalid escape \\x41', status: 400, bytes: with_content('\\x41') },
  { name: 'NUL after the JSON', status: 400, bytes: with_body(`${valid}\0`) },

  // JSON structure.
  { name: 'duplicate key inside a message', status: 400,
    bytes: with_body(`{"model":"${model}","messages":[{"role":"user","role":"system","content":"hi"}]}`) },
  { name: 'duplicate key among 20 keys (the sorted check)', status: 400,
    bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],${Array.from({ length: 18 }, (_, i) => `"k${i}":${i}`).join(',')},"k3":0}`) },
  { name: 'nesting depth 1900 (refused without deep recursion)', status: 400,
    bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"x":${nested(1900)}}`) },
  { name: 'body is null', status: 400, bytes: with_body('null') },
  { name: 'body is a JSON string', status: 400, bytes: with_body('"hi"') },
  { name: 'body of only whitespace', status: 400, bytes: with_body(' \r\n\t ') },
  { name: 'trailing comma in an object', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],}`) },
  { name: 'trailing comma in an array', status: 400, bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"},]}`) },
  { name: 'a comment', status: 400, bytes: with_body(`{"model":"${model}", /* x */ "messages":[{"role":"user","content":"hi"}]}`) },
  { name: 'single-quoted strings', status: 400, bytes: with_body(`{'model':'${model}','messages':[{'role':'user','content':'hi'}]}`) },
  { name: 'an unquoted key', status: 400, bytes: with_body(`{model:"${model}","messages":[{"role":"user","content":"hi"}]}`) },

  // Field types.
  { name: 'messages is null', status: 400, bytes: with_json({ model, messages: null }) },
  { name: 'a message that is a string', status: 400, bytes: with_json({ model, messages: ['hi'] }) },
  { name: 'stream is the string "true"', status: 400, bytes: with_json({ model, messages: msgs, stream: 'true' }) },
  { name: 'stream is 1', status: 400, bytes: with_json({ model, messages: msgs, stream: 1 }) },
  { name: 'stream_options.include_usage is a string', status: 400,
    bytes: with_json({ model, messages: msgs, stream: true, stream_options: { include_usage: 'yes' } }) },
  { name: 'model is an empty string', status: 400, bytes: with_json({ model: '', messages: msgs }) },
  { name: 'model is null', status: 400, bytes: with_json({ model: null, messages: msgs }) },
  { name: '/v1/completions without prompt', status: 400,
    bytes: raw({ line: 'POST /v1/completions HTTP/1.1', body: JSON.stringify({ model, max_tokens: 4 }) }) },
  { name: '/v1/completions with an object prompt', status: 400,
    bytes: raw({ line: 'POST /v1/completions HTTP/1.1', body: JSON.stringify({ model, prompt: { text: 'hi' } }) }) },
  { name: '/v1/embeddings without input', status: 400,
    bytes: raw({ line: 'POST /v1/embeddings HTTP/1.1', body: JSON.stringify({ model }) }) },
];

// First bytes that cannot begin `method SP`, sent alone with no head to
// complete: each is refused as soon as it arrives (400 + close), not held
// until header_timeout_ms. {name, bytes}
const not_http = [
  { name: 'a TLS ClientHello record header (16 03 01 02 00) on the plaintext port', bytes: Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00]), alert: true },
  { name: 'a NUL byte', bytes: Buffer.from([0x00]) },
  { name: 'a JSON body with no request line', bytes: Buffer.from('{') },
  { name: 'a space before the method', bytes: Buffer.from(' GET') },
  { name: 'a method longer than 32 bytes', bytes: Buffer.from('X'.repeat(33)) },
];

// Shapes sluice accepts: each is answered (200) and what reaches the backend
// is checked: `forwarded` requests, without what must not pass a hop.
// {name, bytes, forwarded (0 or 1), check(recorded request)}
const no_header = (...names) => (r) => {
  for (const n of names) assert.equal(header_of(r, n), undefined, `${n} is not passed on`);
};
const passed = [
  { name: 'Upgrade: h2c with HTTP2-Settings is not honoured; the upgrade fields are not passed on', forwarded: 1,
    bytes: raw({ headers: [...base_headers, 'Connection: Upgrade, HTTP2-Settings', 'Upgrade: h2c', 'HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA'] }),
    check: no_header('upgrade', 'http2-settings', 'connection') },
  { name: 'Upgrade: websocket on a POST is not honoured; the upgrade fields are not passed on', forwarded: 1,
    bytes: raw({ headers: [...base_headers, 'Connection: upgrade', 'Upgrade: websocket', 'Sec-WebSocket-Version: 13', 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=='] }),
    check: no_header('upgrade', 'connection') },
  { name: 'Upgrade: websocket on GET /v1/models is answered locally', forwarded: 0,
    bytes: raw({ line: 'GET /v1/models HTTP/1.1', headers: [...base_headers, 'Connection: Upgrade', 'Upgrade: websocket'], body: '', cl: false }) },
  { name: 'Transfer-Encoding and Content-Length in the trailer are dropped', forwarded: 1,
    bytes: chunked_req(`${hex}\r\n${valid}\r\n0\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n`),
    check: (r) => {
      assert.equal(r.body, valid);
      assert.equal(header_of(r, 'content-length'), String(valid.length));
      assert.equal(header_of(r, 'transfer-encoding'), undefined);
    } },
  { name: 'Transfer-Encoding:<HTAB>chunked alone is chunked; forwarded with a Content-Length', forwarded: 1,
    bytes: chunked_req(chunked(valid), [], 'Transfer-Encoding:\tchunked'),
    check: (r) => {
      assert.equal(r.body, valid);
      assert.equal(header_of(r, 'content-length'), String(valid.length));
      assert.equal(header_of(r, 'transfer-encoding'), undefined);
    } },
  { name: 'one-byte chunks with extensions decode to the same body', forwarded: 1,
    bytes: chunked_req(`${[...valid].map((ch) => `1;ext="v"\r\n${ch}\r\n`).join('')}0\r\n\r\n`),
    check: (r) => assert.equal(r.body, valid) },
  { name: 'Content-Length with leading zeros (19 digits) is that length', forwarded: 1,
    bytes: raw({ headers: [...base_headers, `Content-Length: ${String(valid.length).padStart(19, '0')}`], cl: false }),
    check: (r) => assert.equal(r.body, valid) },
  { name: 'the auth scheme is case-insensitive (bearer)', forwarded: 1, bytes: with_auth(`bearer ${test_key}`) },
  { name: 'whitespace after the key is field whitespace, not part of the key', forwarded: 1, bytes: with_auth(`Bearer ${test_key} \t`) },
  { name: 'the client key is never passed to the backend', forwarded: 1, bytes: with_body(valid),
    check: (r) => assert.ok(!JSON.stringify(r.headers).includes(test_key), JSON.stringify(r.headers)) },
  { name: 'a field named in Connection is hop-by-hop and not passed on', forwarded: 1,
    bytes: raw({ headers: [...base_headers, 'Connection: keep-alive, X-Hop', 'X-Hop: secret', 'Keep-Alive: timeout=5', 'Proxy-Authorization: Basic eDp5'] }),
    check: no_header('x-hop', 'connection', 'keep-alive', 'proxy-authorization') },
  { name: 'a client X-Forwarded-For is appended to, not trusted as the peer', forwarded: 1,
    bytes: raw({ headers: [...base_headers, 'X-Forwarded-For: 10.9.8.7'] }),
    check: (r) => assert.equal(header_of(r, 'x-forwarded-for'), '10.9.8.7, 127.0.0.1') },
  { name: 'JSON nesting depth exactly 64 is accepted', forwarded: 1,
    bytes: with_body(`{"model":"${model}","messages":[{"role":"user","content":"hi"}],"x":${nested(63)}}`),
    check: (r) => assert.ok(r.body.includes(nested(63))) },
  { name: 'max_tokens exactly the default group cap (32768)', forwarded: 1, bytes: with_json({ model, messages: msgs, max_tokens: 32768 }) },
];

describe('malformed and hostile requests', () => {
  let mock;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 1000, reply_tokens: 4 });
    sluice = await start_sluice({
      backends: [mock.url],
      config: sluice_config({ backends: [mock.url], server: { max_body_bytes, header_timeout_ms, h2c: false } }),
    });
  });
  after(() => stop_all(sluice, mock));
  afterEach(() => mock.clear_requests());

  it('lets a well-formed request through (the check below can fail)', async () => {
    const { responses } = await raw_exchange(sluice.port, with_body(valid), { timeout_ms: bound_ms(5000) });
    assert.equal(responses[0].status, 200, responses[0].text?.());
    assert.equal((await mock.requests()).length, 1, 'the backend saw it');
  });

  it(`has at least 120 refusal cases (${cases.length}) and the accepted shapes (${passed.length})`, () => {
    assert.ok(cases.length >= 120);
    assert.ok(new Set(cases.map((c) => c.name)).size === cases.length, 'case names are distinct');
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
      if (c.message) assert.match(body.error.message, c.message);
      if (c.close) assert.equal(result.closed, true, 'the connection is closed');
      const reached = await mock.requests();
      assert.deepEqual(reached, [], 'nothing reached the backend');
    });
  }

  for (const c of not_http) {
    it(`refuses at once, without waiting out the header timeout: ${c.name} -> ${c.alert ? 'a TLS alert' : '400'} + close`, async () => {
      // Well under header_timeout_ms, even scaled for a slow build.
      const within_ms = Math.min(bound_ms(2000), header_timeout_ms / 2);
      const conn = await raw_connection.connect(sluice.port);
      try {
        const sent_at_ms = performance.now();
        await conn.write(c.bytes);
        if (c.alert) {
          // A TLS client gets what its stack can read: a fatal alert record
          // (content type 21), then the close.
          assert.equal(await conn.wait_close({ timeout_ms: within_ms }), true, 'the connection is closed');
          assert.equal(conn.received[0], 0x15, `an alert record first: ${conn.received.toString('hex')}`);
          assert.ok(conn.closed_at_ms - sent_at_ms < within_ms, `closed after ${conn.closed_at_ms - sent_at_ms} ms`);
          assert.deepEqual(await mock.requests(), [], 'nothing reached the backend');
          return;
        }
        const response = await conn.read_response({ timeout_ms: within_ms });
        assert.match(conn.received.toString('latin1'), /^HTTP\/1\.1 400 /);
        const body = JSON.parse(response.text());
        assert.ok(is_openai_error(body), `OpenAI error shape: ${response.text()}`);
        assert.match(body.error.message, /not an HTTP\/1\.1 request/);
        assert.equal(await conn.wait_close({ timeout_ms: within_ms }), true, 'the connection is closed');
        assert.ok(conn.closed_at_ms - sent_at_ms < within_ms, `closed after ${conn.closed_at_ms - sent_at_ms} ms`);
      } finally {
        conn.destroy();
      }
      assert.deepEqual(await mock.requests(), [], 'nothing reached the backend');
    });
  }

  for (const c of passed) {
    it(`accepts: ${c.name}`, async () => {
      const result = await raw_exchange(sluice.port, c.bytes, { timeout_ms: bound_ms(5000) });
      const response = result.responses.find((r) => r.status !== 100);
      assert.ok(response, 'a final response');
      assert.equal(response.status, 200, `body: ${response.text?.()}`);
      const reached = await mock.requests();
      assert.equal(reached.length, c.forwarded, JSON.stringify(reached));
      if (c.forwarded) c.check?.(reached[0]);
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
