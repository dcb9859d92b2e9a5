// An Anthropic Messages API backend (POST /v1/messages) on node:http, in the
// API's documented shapes: the message object, the error object, and the
// streaming events (message_start, content_block_start, ping,
// content_block_delta with text_delta / input_json_delta, content_block_stop,
// message_delta, message_stop, error). Checked against the official
// @anthropic-ai/sdk in peers.test.mjs, so a gateway test against it is a test
// against Anthropic's wire format, not against our reading of it.
//
// `shape` writes the same events in other legal (and some illegal) wire
// forms, so a parser is tested on SSE structure, not on exact bytes.
import { EventEmitter } from 'node:events';
import http from 'node:http';

import { bound_ms, with_timeout } from './harness.mjs';

const default_error_types = {
  400: 'invalid_request_error', 401: 'authentication_error', 403: 'permission_error', 404: 'not_found_error',
  413: 'request_too_large', 429: 'rate_limit_error', 500: 'api_error', 504: 'timeout_error', 529: 'overloaded_error',
};

export const shapes = ['canonical', 'crlf', 'many_per_chunk', 'split', 'spaces', 'no_event_lines', 'unknown_event', 'malformed'];

// 'Hello from Claude.' -> ['Hello', ' from', ' Claude.']
export function word_tokens(text) {
  return text.match(/\s*\S+/g) ?? (text ? [text] : []);
}

// A tool input's JSON in pieces, as input_json_delta sends it (the first
// piece empty, as the API does).
function json_pieces(input) {
  const json = JSON.stringify(input);
  const third = Math.max(1, Math.ceil(json.length / 3));
  const out = [''];
  for (let i = 0; i < json.length; i += third) out.push(json.slice(i, i + third));
  return out;
}

function spaced_json(value) {
  // One line (SSE data must not contain raw newlines; JSON.stringify escapes
  // those inside strings), with spaces after colons and commas.
  return JSON.stringify(value, null, 1).replace(/\n */g, ' ');
}

// Starts the peer on 127.0.0.1:<free port>. `script` is an object of knobs,
// or a function (body, headers) returning one; set() replaces it:
//
//   text          the assistant text (default 'Hello from Claude.'), one
//                 text_delta per word; '' or null: no text block
//   tokens        the text pieces instead (overrides text)
//   tool_use      {id, name, input} or an array of them: tool_use blocks
//                 after the text block (input streamed as input_json_delta)
//   stop_reason   default 'end_turn' ('tool_use' with tool_use blocks)
//   input_tokens, output_tokens, cache_read_input_tokens,
//   cache_creation_input_tokens   usage (defaults 12, deltas sent, 0, 0)
//   status        answer this HTTP status with Anthropic's error body
//                 {"type":"error","error":{"type":error_type,"message":...},
//                 "request_id":...}; error_type defaults by status (429
//                 rate_limit_error, 529 overloaded_error, ...);
//                 `error_message` its message; `retry_after` a retry-after
//                 header (seconds), `retry_after_ms` a retry-after-ms header,
//                 `should_retry` an x-should-retry header
//   stream_error_after  after this many content deltas an `event: error`
//                 (error_type, default overloaded_error) ends the stream
//   delay_ms      between streamed events (not with many_per_chunk)
//   hang          streaming: send the head and message_start, then nothing
//   shape         one of `shapes` or an array of them:
//                   canonical       `event:` + `data:` lines, LF, one write per event
//                   crlf            CRLF line endings
//                   many_per_chunk  the whole stream in one write
//                   split           each event in 2-3 writes, cut inside the JSON
//                                   and between the data line and the blank line
//                   spaces          JSON with spaces after colons and commas
//                   no_event_lines  data lines only (the type is in the JSON)
//                   unknown_event   an extra event of an unknown type mid-stream
//                   malformed       a content_block_delta whose data is not JSON
//
// Resolves {url, port, requests, headers, cancels, set(script),
// wait_for(list, count, timeout_ms), stop()}:
//   requests  each request body, parsed ({raw} when it was not JSON)
//   headers   each request's headers (node's lower-case object), same index
//   cancels   {index} for each stream the client closed before its end
export async function start_anthropic_peer(script = {}) {
  const events = new EventEmitter();
  const requests = [];
  const headers = [];
  const cancels = [];
  const sockets = new Set();
  const timers = new Set();
  let next_id = 1;

  const wait = (ms) => new Promise((resolve) => {
    const t = setTimeout(() => { timers.delete(t); resolve(); }, ms);
    timers.add(t);
  });

  const server = http.createServer((req, res) => {
    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', () => {
      const text = Buffer.concat(parts).toString('utf8');
      let body;
      try { body = text ? JSON.parse(text) : null; } catch { body = { raw: text }; }
      if (req.method !== 'POST' || new URL(req.url, 'http://x').pathname !== '/v1/messages') {
        return send_error(res, 404, { error_type: 'not_found_error', error_message: `Not found: ${req.method} ${req.url}` });
      }
      const index = requests.length;
      requests.push(body);
      headers.push({ ...req.headers });
      events.emit('recorded');
      const knobs = (typeof script === 'function' ? script(body, req.headers) : script) ?? {};
      answer(res, body ?? {}, knobs, index).catch(() => res.destroy());
    });
  });
  server.on('connection', (s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });

  function send_error(res, status, knobs) {
    const type = knobs.error_type ?? default_error_types[status] ?? 'api_error';
    const payload = JSON.stringify({
      type: 'error',
      error: { type, message: knobs.error_message ?? `scripted ${type}` },
      request_id: `req_peer${String(next_id++).padStart(6, '0')}`,
    });
    const head = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), 'request-id': `req_peer${next_id}` };
    if (knobs.retry_after !== undefined) head['retry-after'] = String(knobs.retry_after);
    if (knobs.retry_after_ms !== undefined) head['retry-after-ms'] = String(knobs.retry_after_ms);
    if (knobs.should_retry !== undefined) head['x-should-retry'] = String(knobs.should_retry);
    res.writeHead(status, head);
    res.end(payload);
  }

  async function answer(res, body, knobs, index) {
    if (knobs.status) return send_error(res, knobs.status, knobs);
    const id = `msg_peer${String(next_id++).padStart(6, '0')}`;
    const model = body.model ?? 'claude-peer';
    const text_pieces = knobs.tokens ?? (knobs.text === null || knobs.text === '' ? [] : word_tokens(knobs.text ?? 'Hello from Claude.'));
    const tools = knobs.tool_use ? [].concat(knobs.tool_use) : [];
    const stop_reason = knobs.stop_reason ?? (tools.length ? 'tool_use' : 'end_turn');
    const tool_pieces = tools.map((t) => json_pieces(t.input ?? {}));
    const delta_count = text_pieces.length + tool_pieces.reduce((n, p) => n + p.length, 0);
    const usage = {
      input_tokens: knobs.input_tokens ?? 12,
      cache_creation_input_tokens: knobs.cache_creation_input_tokens ?? 0,
      cache_read_input_tokens: knobs.cache_read_input_tokens ?? 0,
      output_tokens: knobs.output_tokens ?? delta_count,
    };
    const content = [];
    if (text_pieces.length) content.push({ type: 'text', text: text_pieces.join('') });
    for (const t of tools) content.push({ type: 'tool_use', id: t.id, name: t.name, input: t.input ?? {} });

    if (!body.stream) {
      const payload = JSON.stringify({ id, type: 'message', role: 'assistant', model, content, stop_reason, stop_sequence: null, usage });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), 'request-id': `req_${id}` });
      return res.end(payload);
    }

    // The event list.
    const list = [];
    const ev = (type, data) => list.push({ type, data: { type, ...data } });
    ev('message_start', { message: { id, type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } } });
    let block = 0;
    let deltas = 0;
    let cut = false;
    const error_event = () => ({ type: 'error', data: { type: 'error', error: { type: knobs.error_type ?? 'overloaded_error', message: knobs.error_message ?? 'Overloaded' } } });
    const delta = (data) => {
      if (knobs.stream_error_after !== undefined && deltas >= knobs.stream_error_after) { cut = true; return; }
      ev('content_block_delta', data);
      ++deltas;
    };
    if (text_pieces.length) {
      ev('content_block_start', { index: block, content_block: { type: 'text', text: '' } });
      ev('ping', {});
      for (const [i, piece] of text_pieces.entries()) {
        if (cut) break;
        delta({ index: block, delta: { type: 'text_delta', text: piece } });
        if (i === 0 && has(knobs, 'unknown_event')) list.push({ type: 'future_event_type', data: { type: 'future_event_type', detail: { index: block, note: 'clients ignore unknown events' } } });
        if (i === 0 && has(knobs, 'malformed')) list.push({ type: 'content_block_delta', raw: '{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "trunc' });
      }
      if (!cut) ev('content_block_stop', { index: block });
      ++block;
    } else {
      ev('ping', {});
    }
    for (const [ti, t] of tools.entries()) {
      if (cut) break;
      ev('content_block_start', { index: block, content_block: { type: 'tool_use', id: t.id, name: t.name, input: {} } });
      for (const piece of tool_pieces[ti]) {
        if (cut) break;
        delta({ index: block, delta: { type: 'input_json_delta', partial_json: piece } });
      }
      if (!cut) ev('content_block_stop', { index: block });
      ++block;
    }
    if (cut) {
      list.push(error_event());
    } else {
      ev('message_delta', { delta: { stop_reason, stop_sequence: null }, usage: { output_tokens: usage.output_tokens } });
      ev('message_stop', {});
    }

    // Their bytes.
    const eol = has(knobs, 'crlf') ? '\r\n' : '\n';
    const json = has(knobs, 'spaces') ? spaced_json : JSON.stringify;
    const encode = (e) => {
      const data = e.raw ?? json(e.data);
      return (has(knobs, 'no_event_lines') ? '' : `event: ${e.type}${eol}`) + `data: ${data}${eol}${eol}`;
    };

    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'request-id': `req_${id}`,
    });
    let closed = false;
    res.on('close', () => {
      if (!res.writableFinished) { closed = true; cancels.push({ index }); events.emit('recorded'); }
    });
    const write = (text) => new Promise((resolve) => { if (closed) resolve(); else res.write(text, () => resolve()); });

    if (knobs.hang) {
      await write(encode(list[0]));
      return;  // never more; the client (or stop()) closes
    }
    if (has(knobs, 'many_per_chunk')) {
      res.end(list.map(encode).join(''));
      return;
    }
    for (const e of list) {
      if (closed) return;
      const bytes = encode(e);
      if (has(knobs, 'split')) {
        // Inside the JSON, then between the data line's end and the blank line.
        const data_at = bytes.indexOf('data: ') + 6;
        const blank_at = bytes.length - eol.length;
        const mid = data_at + Math.max(1, Math.floor((blank_at - eol.length - data_at) / 2));
        for (const piece of [bytes.slice(0, mid), bytes.slice(mid, blank_at), bytes.slice(blank_at)]) {
          if (piece) await write(piece);
          await new Promise((resolve) => setImmediate(resolve));
        }
      } else {
        await write(bytes);
      }
      if (knobs.delay_ms) await wait(knobs.delay_ms);
    }
    if (!closed) res.end();
  }

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  const lists = { requests, headers, cancels };
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    headers,
    cancels,
    set(next) { script = next; },
    wait_for(name, count = 1, timeout_ms = bound_ms(5000)) {
      const list = lists[name];
      if (list.length >= count) return Promise.resolve(list);
      let on;
      const reached = new Promise((resolve) => {
        on = () => { if (list.length >= count) resolve(list); };
        events.on('recorded', on);
      });
      return with_timeout(reached, timeout_ms, `${count} ${name} at the anthropic peer (have ${list.length})`)
        .finally(() => events.off('recorded', on));
    },
    async stop() {
      for (const t of timers) clearTimeout(t);
      timers.clear();
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function has(knobs, shape) {
  const s = knobs.shape;
  return Array.isArray(s) ? s.includes(shape) : s === shape;
}
