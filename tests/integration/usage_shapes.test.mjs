// The usage chunk sluice asks for is cut from every stream whose client did
// not ask for it, whatever bytes the backend writes: a scripted backend
// writes the shapes other servers use (Python json.dumps spacing, CRLF
// event ends, chunk extensions, several events in one chunk, one event over
// two chunks, the whole stream in one large chunk, [DONE] on a response
// kept open). The stock OpenAI SDK's loop over chunk.choices[0] must never
// meet an empty `choices`, and the audit line must still have the
// backend's exact token counts.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { poll, read_audit, samples, scrape } from './lib/gateway.mjs';
import { post_h2 } from './lib/h2_gateway.mjs';
import { bound_ms, sluice_config, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { start_scripted_backend } from './lib/scripted_backend.mjs';

const head = 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n';

// The stream's events as JSON objects (the usage-only one included).
function stream_objects(tokens, prompt_tokens) {
  const base = { id: 'chatcmpl-shape', object: 'chat.completion.chunk', created: 1700000000, model: 'shape-model' };
  const out = [{ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }];
  for (let i = 0; i < tokens; ++i) {
    out.push({ ...base, choices: [{ index: 0, delta: { content: ` t${i}` }, finish_reason: null }] });
  }
  out.push({ ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
  out.push({ ...base, choices: [], usage: { prompt_tokens, completion_tokens: tokens, total_tokens: prompt_tokens + tokens } });
  return out;
}

// Python's json.dumps default: ", " and ": " separators.
const py_dumps = (o) => JSON.stringify(o).replace(/","/g, '", "').replace(/":/g, '": ').replace(/,\{/g, ', {').replace(/\},"/g, '}, "');

const hex_chunk = (payload, ext = '') => {
  const b = Buffer.from(payload);
  return Buffer.concat([Buffer.from(`${b.length.toString(16)}${ext}\r\n`), b, Buffer.from('\r\n')]);
};
const terminal = Buffer.from('0\r\n\r\n');

// Each shape: the bytes of the response body, as a list of writes.
const tokens = 5;
const prompt_tokens = 11;
const shapes = {
  'JSON with spaces (Python json.dumps)': () => {
    const ev = stream_objects(tokens, prompt_tokens).map((o) => `data: ${py_dumps(o)}\n\n`);
    return [Buffer.concat([...ev.map((e) => hex_chunk(e)), hex_chunk('data: [DONE]\n\n'), terminal])];
  },
  'CRLF-delimited events': () => {
    const ev = stream_objects(tokens, prompt_tokens).map((o) => `data: ${JSON.stringify(o)}\r\n\r\n`);
    return [Buffer.concat([...ev.map((e) => hex_chunk(e)), hex_chunk('data: [DONE]\r\n\r\n'), terminal])];
  },
  'chunk extensions': () => {
    const ev = stream_objects(tokens, prompt_tokens).map((o) => `data: ${JSON.stringify(o)}\n\n`);
    return [Buffer.concat([...ev.map((e) => hex_chunk(e, ';x=1')), hex_chunk('data: [DONE]\n\n', ';x=1'), terminal])];
  },
  'the finish, usage and [DONE] events in one chunk': () => {
    const ev = stream_objects(tokens, prompt_tokens).map((o) => `data: ${JSON.stringify(o)}\n\n`);
    return [Buffer.concat([...ev.slice(0, -2).map((e) => hex_chunk(e)), hex_chunk(ev.at(-2) + ev.at(-1) + 'data: [DONE]\n\n'), terminal])];
  },
  'the usage event over two chunks, in two writes': () => {
    const ev = stream_objects(tokens, prompt_tokens).map((o) => `data: ${JSON.stringify(o)}\n\n`);
    const usage = ev.at(-1);
    const half = Math.floor(usage.length / 2);
    return [
      Buffer.concat([...ev.slice(0, -1).map((e) => hex_chunk(e)), hex_chunk(usage.slice(0, half))]),
      Buffer.concat([hex_chunk(usage.slice(half)), hex_chunk('data: [DONE]\n\n'), terminal]),
    ];
  },
  'the whole stream in one chunk larger than a receive buffer': () => {
    const many = 3000;
    const ev = stream_objects(many, prompt_tokens).map((o) => `data: ${JSON.stringify(o)}\n\n`);
    return [Buffer.concat([hex_chunk(ev.join('') + 'data: [DONE]\n\n'), terminal])];
  },
};
const completion_of = (name) => (name.startsWith('the whole stream') ? 3000 : tokens);

describe('usage chunks in the shapes other backends write', () => {
  let backend, sluice, client;
  let shape = null;
  let keep_open = false;

  before(async () => {
    backend = await start_scripted_backend(async (socket) => {
      socket.write(head);
      const writes = shapes[shape]();
      // Kept open: no terminal chunk, ever (sluice must end the client's
      // response at [DONE] and close this connection, not pool it). Read
      // once: a test that sets it while this answer sleeps between writes
      // must not turn this (complete) answer into one that never ends.
      const open = keep_open;
      if (open) writes[writes.length - 1] = writes.at(-1).subarray(0, writes.at(-1).length - terminal.length);
      for (const w of writes) {
        socket.write(w);
        // Apart in time: the second write is a read of its own.
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      if (open) await new Promise(() => {});  // never ends its response
    });
    sluice = await start_sluice({ config: sluice_config({ backends: [backend.url] }) });
    client = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(15000) });
  });
  after(() => stop_all(sluice, backend));

  const cut_counts = async () => {
    const m = (await scrape(sluice.admin_url)).parsed;
    const sum = (n) => samples(m, n).reduce((a, s) => a + s.value, 0);
    return { cut: sum('sluice_usage_chunks_cut_total'), failed: sum('sluice_usage_cut_failed_total') };
  };

  for (const name of Object.keys(shapes)) {
    it(`${name}: the SDK's choices[0] loop sees every token and no usage chunk; the audit has the exact usage`, async () => {
      shape = name;
      const before_counts = await cut_counts();
      const id = `shape-${Object.keys(shapes).indexOf(name)}`;
      const stream = await client.chat.completions.create(
        { model: 'shape-model', stream: true, messages: [{ role: 'user', content: 'hi' }] },
        { headers: { 'x-request-id': id } });
      let text = '';
      let chunks = 0;
      for await (const chunk of stream) {
        ++chunks;
        assert.ok(chunk.choices.length > 0, `a chunk with no choices reached the client: ${JSON.stringify(chunk)}`);
        assert.equal(chunk.usage, undefined);
        text += chunk.choices[0].delta?.content ?? '';
      }
      const n = completion_of(name);
      assert.equal(chunks, n + 2);
      assert.equal(text, Array.from({ length: n }, (_, i) => ` t${i}`).join(''));
      const rec = await poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === id),
        { what: `the audit record of ${id}` });
      assert.equal(rec.prompt_tokens, prompt_tokens);
      assert.equal(rec.completion_tokens, n);
      const after_counts = await cut_counts();
      assert.equal(after_counts.cut - before_counts.cut, 1);
      assert.equal(after_counts.failed, 0);
    });
  }

  // HTTP/2 clients get the chunks' data as DATA frames, read from the
  // backend's buffer where it lies: the same bytes an HTTP/1.1 client gets
  // once it has removed the chunk framing, in every shape.
  for (const name of Object.keys(shapes)) {
    it(`${name}, over HTTP/2: the body equals the HTTP/1.1 client's, without the usage chunk`, async () => {
      shape = name;
      const before_counts = await cut_counts();
      const body = { model: 'shape-model', stream: true, messages: [{ role: 'user', content: 'hi' }] };
      const h1 = await fetch(`${sluice.url}/v1/chat/completions`, {
        method: 'POST', headers: { authorization: `Bearer ${test_key}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      assert.equal(h1.status, 200);
      const h1_text = await h1.text();
      const h2 = await post_h2(sluice.url, body);
      assert.equal(h2.status, 200);
      assert.equal(h2.text, h1_text);
      assert.ok(!h2.text.includes('"usage"'), 'no usage event reached the HTTP/2 client');
      assert.ok(h2.text.endsWith('data: [DONE]\n\n') || h2.text.endsWith('data: [DONE]\r\n\r\n'));
      const after_counts = await cut_counts();
      assert.equal(after_counts.cut - before_counts.cut, 2);
      assert.equal(after_counts.failed, 0);
    });
  }

  it('the client\'s other stream_options reach the backend beside the include_usage sluice adds', async () => {
    shape = 'JSON with spaces (Python json.dumps)';
    for (const [options, expected] of [
      [{ continuous_usage_stats: true }, { include_usage: true, continuous_usage_stats: true }],
      [{}, { include_usage: true }],
      [null, { include_usage: true }],
    ]) {
      const seen = backend.requests.length;
      const stream = await client.chat.completions.create(
        { model: 'shape-model', stream: true, stream_options: options, messages: [{ role: 'user', content: 'hi' }] });
      let empty = 0;
      for await (const chunk of stream) if (chunk.choices.length === 0) ++empty;
      assert.equal(empty, 0);
      assert.equal(backend.requests.length, seen + 1);
      assert.deepEqual(backend.requests.at(-1).body.stream_options, expected, `sent ${JSON.stringify(options)}`);
    }
  });

  it('a backend that sends [DONE] and keeps its response open: the client\'s stream ends at once', async () => {
    shape = 'JSON with spaces (Python json.dumps)';
    keep_open = true;
    try {
      const started = performance.now();
      const stream = await client.chat.completions.create(
        { model: 'shape-model', stream: true, messages: [{ role: 'user', content: 'hi' }] },
        { headers: { 'x-request-id': 'shape-open' } });
      let text = '';
      for await (const chunk of stream) text += chunk.choices[0].delta?.content ?? '';
      const took = performance.now() - started;
      assert.equal(text, Array.from({ length: tokens }, (_, i) => ` t${i}`).join(''));
      // Well before the stream idle timeout (30 s) that held it before.
      assert.ok(took < bound_ms(5000), `the stream took ${took.toFixed(0)} ms to end`);
      // The next request is served (on another backend connection).
      keep_open = false;
      const again = await client.chat.completions.create(
        { model: 'shape-model', stream: true, messages: [{ role: 'user', content: 'hi' }] });
      let n = 0;
      for await (const chunk of again) n += chunk.choices.length;
      assert.equal(n, tokens + 2);
    } finally {
      keep_open = false;
    }
  });

  it('a backend that sends [DONE] and keeps its response open: an HTTP/2 client\'s stream ends at once', async () => {
    shape = 'JSON with spaces (Python json.dumps)';
    keep_open = true;
    try {
      const started = performance.now();
      const r = await post_h2(sluice.url, { model: 'shape-model', stream: true, messages: [{ role: 'user', content: 'hi' }] });
      const took = performance.now() - started;
      assert.equal(r.status, 200);
      assert.ok(r.text.endsWith('data: [DONE]\n\n'), r.text.slice(-80));
      assert.ok(took < bound_ms(5000), `the stream took ${took.toFixed(0)} ms to end`);
    } finally {
      keep_open = false;
    }
  });
});
