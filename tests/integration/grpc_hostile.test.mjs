// A gRPC backend that sends bad input: sluice's KServe v2 client (a group
// with protocol = "triton") in front of lib/raw_grpc_backend.mjs, which
// writes whatever HTTP/2 and gRPC bytes each case says. For every case the
// stock OpenAI SDK gets a clear OpenAI-shaped error (status and message) or
// a stream that ends with an error after the tokens that came; no request
// hangs (each is bounded); the next request on the same sluice is served;
// and sluice is still running (under ASan: with no sanitizer report).
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll } from './lib/gateway.mjs';
import { bound_ms, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import {
  error_message, grpc_frame, grpc_headers, h2, len_field, ok_steps, start_raw_grpc_backend, token_message,
} from './lib/raw_grpc_backend.mjs';

const messages = [{ role: 'user', content: 'Say hello.' }];
const cannot_read = /sluice cannot read/;
const reset_internal = /The backend reset the stream \(INTERNAL_ERROR\)\./;
const no_status = /The backend ended the stream without a gRPC status\./;
const conn_closed = /The backend closed the connection\./;

// Two tokens that are not final: whatever follows decides the end.
const two_tokens = [
  { headers: grpc_headers },
  { data: grpc_frame(token_message('a')) },
  { data: grpc_frame(token_message('b')) },
];

function sanitizer_report(proc) {
  return proc.lines.find((l) => /ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: .*Sanitizer/.test(l.text));
}

describe('a gRPC backend that sends bad input', () => {
  let be, refuses, answers, sluice, sdk, stream_sdk;
  before(async () => {
    be = await start_raw_grpc_backend();
    refuses = await start_raw_grpc_backend(() => [{ rst: h2.NGHTTP2_REFUSED_STREAM }]);
    answers = await start_raw_grpc_backend(() => ok_steps(['second', ' backend']));
    sluice = await start_sluice({
      config: gateway_config({
        tables: {
          upstream: { max_retries: 1, first_byte_timeout_ms: bound_ms(300) },
          health: { interval_ms: 0, eject_after: 0 },
        },
        groups: [
          { name: 'raw', models: ['raw'], protocol: 'triton', backend_model: 'm', backends: [be.url] },
          { name: 'pair', models: ['pair'], protocol: 'triton', backend_model: 'm', balance: 'round-robin',
            backends: [refuses.url, answers.url] },
        ],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    const options = { apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) };
    sdk = new OpenAI(options);
    stream_sdk = new OpenAI(options);
  });
  after(() => stop_all(sluice, be, refuses, answers));

  // The shard keeps serving: a well-behaved answer right after, and sluice runs on.
  async function served_after() {
    be.set(() => ok_steps(['fine', '.']));
    const r = await sdk.chat.completions.create({ model: 'raw', messages });
    assert.equal(r.choices[0].message.content, 'fine.');
    const chunks = [];
    for await (const c of await stream_sdk.chat.completions.create({ model: 'raw', messages, stream: true })) {
      chunks.push(c.choices[0]?.delta?.content ?? '');
    }
    assert.equal(chunks.join(''), 'fine.');
    assert.equal(sluice.proc.exit, null, 'sluice is still running');
    assert.equal(sanitizer_report(sluice.proc), undefined);
  }

  // A non-stream request answered with an error: its status and message.
  async function non_stream_fails(status, message) {
    await assert.rejects(sdk.chat.completions.create({ model: 'raw', messages }), (err) => {
      assert.ok(err instanceof OpenAI.APIError, String(err));
      assert.equal(err.status, status, String(err));
      assert.match(err.error?.message ?? err.message, message);
      return true;
    });
  }

  // A stream that fails before its head: the SDK's create() raises.
  async function stream_refused(status, message) {
    await assert.rejects(stream_sdk.chat.completions.create({ model: 'raw', messages, stream: true }), (err) => {
      assert.equal(err.status, status, String(err));
      assert.match(err.error?.message ?? err.message, message);
      return true;
    });
  }

  // A stream cut after its tokens: the SDK yields them, then raises.
  async function stream_cut(tokens, message) {
    const seen = [];
    await assert.rejects((async () => {
      for await (const c of await stream_sdk.chat.completions.create({ model: 'raw', messages, stream: true })) {
        seen.push(c.choices[0]?.delta?.content ?? '');
      }
    })(), (err) => {
      assert.ok(err instanceof OpenAI.APIError, String(err));
      assert.match(err.message, message);
      return true;
    });
    assert.equal(seen.join(''), tokens);
  }

  // Two tokens, then `tail`: non-stream 502 with `message`, the stream cut after 'ab'.
  async function after_tokens(tail, message) {
    be.set(() => [...two_tokens, ...tail]);
    await non_stream_fails(502, message);
    await stream_cut('ab', message);
    await served_after();
  }

  const truncated = grpc_frame(token_message('c')).subarray(0, 9);

  it('a truncated gRPC frame, then trailers OK', async () => {
    await after_tokens([{ data: truncated }, { trailers: { 'grpc-status': '0' } }], cannot_read);
    // What the backend got: a gRPC call, one whole ModelInferRequest.
    const req = be.requests.at(-1);
    assert.equal(req.headers[':path'], '/inference.GRPCInferenceService/ModelStreamInfer');
    assert.equal(req.headers['content-type'], 'application/grpc');
    assert.equal(req.headers.te, 'trailers');
    assert.equal(req.bytes, 5 + req.message_bytes);
    assert.equal(req.model_name, 'm');
  });

  it('a truncated gRPC frame, then the stream resets', async () => {
    await after_tokens([{ data: truncated }, { rst: h2.NGHTTP2_INTERNAL_ERROR }], reset_internal);
  });

  it('a truncated gRPC frame, then the connection closes', async () => {
    await after_tokens([{ data: truncated }, { destroy_session: true }], conn_closed);
  });

  it('a length prefix larger than its bytes', async () => {
    const m = token_message('c');
    await after_tokens([{ data: grpc_frame(m, { length: m.length + 100 }) }, { trailers: { 'grpc-status': '0' } }],
                       cannot_read);
  });

  it('a length prefix past 4 MiB is refused before its bytes come (and the stream cancelled)', async () => {
    be.set(() => [...two_tokens, { data: grpc_frame(Buffer.alloc(16), { length: 5 << 20 }) }, { hold: true }]);
    let cancels = be.cancels.length;
    await non_stream_fails(502, cannot_read);
    await be.wait_for('cancels', cancels + 1, bound_ms(2000));
    cancels = be.cancels.length;
    await stream_cut('ab', cannot_read);
    await be.wait_for('cancels', cancels + 1, bound_ms(2000));
    await served_after();
  });

  it('the compressed flag set (sluice asked for identity)', async () => {
    await after_tokens([{ data: grpc_frame(token_message('c'), { flag: 1 }) }, { trailers: { 'grpc-status': '0' } }],
                       cannot_read);
  });

  it('a frame flag of 2', async () => {
    await after_tokens([{ data: grpc_frame(token_message('c'), { flag: 2 }) }, { trailers: { 'grpc-status': '0' } }],
                       cannot_read);
  });

  it('a malformed protobuf: a bad varint, wire type 7, a length past the end', async () => {
    const bad = [
      Buffer.from([0x08, ...Array(11).fill(0xff), 0x01]),  // field 1 varint of 12 bytes
      Buffer.from([0x0f, 0x00]),                             // field 1, wire type 7
      Buffer.concat([Buffer.from([0x12, 100]), Buffer.from('abc')]),  // field 2: 100 bytes, 3 there
      len_field(2, Buffer.from([0x2a, 50, 1])),              // inside infer_response: an output past its end
    ];
    for (const m of bad) {
      await after_tokens([{ data: grpc_frame(m) }, { trailers: { 'grpc-status': '0' } }], cannot_read);
    }
  });

  it('trailers without grpc-status', async () => {
    await after_tokens([{ trailers: { 'x-note': 'no status' } }], no_status);
  });

  it('no trailers at all (END_STREAM on DATA)', async () => {
    await after_tokens([{ end: true }], no_status);
  });

  it('trailers-only UNAVAILABLE gives 503; INVALID_ARGUMENT 400 with its message percent-decoded', async () => {
    be.set(() => [{ headers: { ...grpc_headers, 'grpc-status': '14', 'grpc-message': 'warming%20up' }, end: true }]);
    await non_stream_fails(503, /warming up/);
    await stream_refused(503, /warming up/);
    be.set(() => [{ headers: { ...grpc_headers, 'grpc-status': '3', 'grpc-message': 'bad%20input%F0%9F%98%80' },
                    end: true }]);
    await non_stream_fails(400, /^bad input😀$/);
    await stream_refused(400, /bad input😀/);
    await served_after();
  });

  it('an error_message before any token is a 502 with the backend\'s words', async () => {
    be.set(() => [{ headers: grpc_headers }, { data: grpc_frame(error_message('model is not ready')) },
                  { trailers: { 'grpc-status': '0' } }]);
    await non_stream_fails(502, /model is not ready/);
    await stream_refused(502, /model is not ready/);
    await served_after();
  });

  it('an HTTP 503 or 415 with no grpc-status (a proxy in front)', async () => {
    for (const body of [false, true]) {
      for (const [http, status] of [[503, 503], [415, 502]]) {
        be.set(() => (body
          ? [{ headers: { ':status': http, 'content-type': 'text/html' } }, { data: Buffer.from('<html>nope</html>') },
             { end: true }]
          : [{ headers: { ':status': http }, end: true }]));
        const said = new RegExp(`The backend answered HTTP ${http} without a gRPC status\\.`);
        await non_stream_fails(status, said);
        await stream_refused(status, said);
      }
    }
    await served_after();
  });

  it('a 1xx informational HEADERS before the response is passed over', async () => {
    be.set(() => [{ informational: { ':status': 103, link: '</x>; rel=preload' } }, { ping: true }, ...ok_steps(['early', ' hints'])]);
    const r = await sdk.chat.completions.create({ model: 'raw', messages });
    assert.equal(r.choices[0].message.content, 'early hints');
    await served_after();
  });

  it('RST_STREAM REFUSED_STREAM before headers is retried on the other backend (503 with none left)', async () => {
    const refused = refuses.requests.length;
    for (let i = 0; i < 4; ++i) {
      const r = await sdk.chat.completions.create({ model: 'pair', messages: [{ role: 'user', content: `hi ${i}` }] });
      assert.equal(r.choices[0].message.content, 'second backend');
    }
    const chunks = [];
    for await (const c of await stream_sdk.chat.completions.create({ model: 'pair', messages, stream: true })) {
      chunks.push(c.choices[0]?.delta?.content ?? '');
    }
    assert.equal(chunks.join(''), 'second backend');
    assert.ok(refuses.requests.length > refused, 'the refusing backend was tried');
    // With no other backend: 503, saying why.
    be.set(() => [{ rst: h2.NGHTTP2_REFUSED_STREAM }]);
    await non_stream_fails(503, /The backend reset the stream \(REFUSED_STREAM\)\./);
    await stream_refused(503, /REFUSED_STREAM/);
    await served_after();
  });

  it('RST_STREAM INTERNAL_ERROR mid-stream, after tokens', async () => {
    await after_tokens([{ rst: h2.NGHTTP2_INTERNAL_ERROR }], reset_internal);
  });

  it('GOAWAY with the stream in flight: a graceful one lets it finish; an abrupt one cuts it', async () => {
    be.set((req) => [...two_tokens, { goaway: h2.NGHTTP2_NO_ERROR, last_stream: 'this' },
                     { data: grpc_frame(token_message('c', { final: true })) }, { trailers: { 'grpc-status': '0' } }]);
    const r = await sdk.chat.completions.create({ model: 'raw', messages });
    assert.equal(r.choices[0].message.content, 'abc');
    const chunks = [];
    for await (const c of await stream_sdk.chat.completions.create({ model: 'raw', messages, stream: true })) {
      chunks.push(c.choices[0]?.delta?.content ?? '');
    }
    assert.equal(chunks.join(''), 'abc');
    await served_after();
    await after_tokens([{ goaway: h2.NGHTTP2_PROTOCOL_ERROR, last_stream: 0 }], conn_closed);
  });

  it('a graceful GOAWAY with three streams in flight: all three finish, the next request opens a new connection', async () => {
    const base = be.requests.length;
    const all_in = be.wait_for('requests', base + 3, bound_ms(5000));
    be.set((req) => {
      const steps = [{ headers: grpc_headers }, { data: grpc_frame(token_message('a')) }, { wait: all_in }];
      if (req.index === base + 2) {
        const last = Math.max(...be.requests.slice(base, base + 3).map((r) => r.stream_id));
        steps.push({ goaway: h2.NGHTTP2_NO_ERROR, last_stream: last });
      }
      steps.push({ data: grpc_frame(token_message('b', { final: true })) }, { trailers: { 'grpc-status': '0' } });
      return steps;
    });
    const texts = await Promise.all([0, 1, 2].map(async () => {
      const r = await sdk.chat.completions.create({ model: 'raw', messages });
      return r.choices[0].message.content;
    }));
    assert.deepEqual(texts, ['ab', 'ab', 'ab']);
    await served_after();
  });

  it('the session destroyed mid-stream', async () => {
    await after_tokens([{ destroy_session: true }], conn_closed);
  });

  it('a stream that never answers: 504 after first_byte_timeout_ms, and the backend sees RST_STREAM CANCEL', async () => {
    be.set(() => [{ hold: true }]);
    let cancels = be.cancels.length;
    await non_stream_fails(504, /in time/);
    await be.wait_for('cancels', cancels + 1, bound_ms(2000));
    cancels = be.cancels.length;
    await stream_refused(504, /in time/);
    await be.wait_for('cancels', cancels + 1, bound_ms(2000));
    await served_after();
  });

  it('a client that disconnects mid-stream: the backend sees RST_STREAM CANCEL', async () => {
    be.set(() => [...two_tokens, { hold: true }]);
    const cancels = be.cancels.length;
    const controller = new AbortController();
    const stream = await stream_sdk.chat.completions.create({ model: 'raw', messages, stream: true },
                                                            { signal: controller.signal });
    let n = 0;
    try {
      for await (const c of stream) {
        if (c.choices[0]?.delta?.content && ++n === 2) controller.abort();
      }
    } catch (err) {
      assert.ok(err instanceof OpenAI.APIUserAbortError || err.name === 'AbortError', String(err));
    }
    assert.equal(n, 2);
    await be.wait_for('cancels', cancels + 1, bound_ms(2000));
    await served_after();
  });

  it('50 concurrent streams, every third one broken: the others all complete', async () => {
    const broken = [
      () => [{ data: truncated }, { trailers: { 'grpc-status': '0' } }],
      () => [{ rst: h2.NGHTTP2_INTERNAL_ERROR }],
      () => [{ data: grpc_frame(token_message('c'), { flag: 2 }) }, { trailers: { 'grpc-status': '0' } }],
      () => [{ data: grpc_frame(Buffer.from([0x0f, 0x00])) }, { trailers: { 'grpc-status': '0' } }],
      () => [{ end: true }],
    ];
    be.set((req) => {
      const i = Number(/-(\d+)$/.exec(req.id ?? '')?.[1] ?? -1);
      if (i % 3 === 2) return [...two_tokens, ...broken[Math.floor(i / 3) % broken.length]()];
      return ok_steps([`${req.id}-a`, `-${req.id}-b`]);
    });
    const ids = Array.from({ length: 50 }, (_, i) => `hostile-many-${i}`);
    const outcomes = await Promise.all(ids.map(async (id) => {
      let text = '';
      try {
        for await (const c of await stream_sdk.chat.completions.create({ model: 'raw', messages, stream: true },
                                                                       { headers: { 'x-request-id': id } })) {
          text += c.choices[0]?.delta?.content ?? '';
        }
        return { text };
      } catch (err) {
        return { text, err };
      }
    }));
    outcomes.forEach((o, i) => {
      if (i % 3 === 2) {
        assert.ok(o.err instanceof OpenAI.APIError, `${ids[i]}: ${o.err}`);
        assert.equal(o.text, 'ab', ids[i]);
      } else {
        assert.equal(o.err, undefined, `${ids[i]}: ${o.err}`);
        assert.equal(o.text, `${ids[i]}-a-${ids[i]}-b`);
      }
    });
    await served_after();
  });

  it('sluice ends cleanly at the end (no sanitizer report on exit)', async () => {
    const exit = await sluice.stop();
    assert.equal(sanitizer_report(sluice.proc), undefined, sluice.proc.output());
    assert.equal(exit.signal, null);
    assert.equal(exit.code, 0, sluice.proc.output());
  });
});

describe('a backend that says GOAWAY while a stream runs, on one shard', () => {
  let be, sluice, sdk;
  before(async () => {
    be = await start_raw_grpc_backend();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, upstream: { stream_idle_timeout_ms: bound_ms(3000) }, health: { interval_ms: 0 } },
        groups: [{ name: 'raw', models: ['raw'], protocol: 'triton', backend_model: 'm', backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, be));

  it('a new request after the GOAWAY goes on a new connection; the old stream still finishes on the draining one', async () => {
    let release, goaway_read;
    const gate = new Promise((resolve) => { release = resolve; });
    const goaway_seen = new Promise((resolve) => { goaway_read = resolve; });
    be.set((req) => {
      if (req.index === 0) {
        // A: a token, GOAWAY naming A the last stream (the PING's ack says
        // sluice has read it), then the rest once B was answered.
        return [{ headers: grpc_headers }, { data: grpc_frame(token_message('a')) },
                { goaway: h2.NGHTTP2_NO_ERROR, last_stream: 'this' }, { ping: true }, { signal: goaway_read }, { wait: gate },
                { data: grpc_frame(token_message('b', { final: true })) }, { trailers: { 'grpc-status': '0' } }];
      }
      return ok_steps(['c']);
    });
    const chunks = [];
    const a_stream = await sdk.chat.completions.create({ model: 'raw', messages, stream: true });
    const a_done = (async () => { for await (const c of a_stream) chunks.push(c.choices[0]?.delta?.content ?? ''); })();
    await goaway_seen;
    const b = await sdk.chat.completions.create({ model: 'raw', messages });
    assert.equal(b.choices[0].message.content, 'c');
    assert.notEqual(be.requests[1].session, be.requests[0].session, 'B went on a new connection');
    release();
    await a_done;
    assert.equal(chunks.join(''), 'ab', 'the stream on the draining connection finished');
  });
});

describe('a slow reader at the total deadline, with a request pipelined behind it', () => {
  let be, sluice;
  before(async () => {
    be = await start_raw_grpc_backend();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, upstream: { max_retries: 0, total_timeout_ms: bound_ms(1000), stream_idle_timeout_ms: 20000 },
                  health: { interval_ms: 0 } },
        groups: [{ name: 'raw', models: ['raw'], protocol: 'triton', backend_model: 'm', backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  it('both answers arrive whole and in order, the pipelined one only after the first went out', async () => {
    // The first reply's last message is a few MB (escaped: many more), far
    // past what the sockets hold, for a client that reads nothing until
    // past the total deadline.
    const huge = '\x01'.repeat(3_000_000);
    be.set((req) => (req.index === 0
      ? [{ headers: grpc_headers }, { data: grpc_frame(token_message('a')) },
         { data: grpc_frame(token_message(huge, { final: true })) }, { trailers: { 'grpc-status': '0' } }]
      : ok_steps(['second'])));
    const body = JSON.stringify({ model: 'raw', messages, stream: true });
    const one = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${test_key}\r\n` +
                `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const socket = net.connect({ port: sluice.port, host: '127.0.0.1' });
    await once(socket, 'connect');
    socket.pause();
    socket.write(one + one);
    // A client that takes nothing for a while, well past the deadline.
    await new Promise((resolve) => setTimeout(resolve, bound_ms(2500)));
    assert.equal(be.requests.length, 1, 'the pipelined request waits for the first answer to go out');
    const pieces = [];
    socket.on('data', (d) => pieces.push(d));
    socket.resume();
    await poll(() => Buffer.concat(pieces).toString('latin1').split('data: [DONE]').length === 3, { what: 'both answers' });
    socket.destroy();
    const all = Buffer.concat(pieces).toString('latin1');
    assert.equal(all.split('HTTP/1.1 200 ').length - 1, 2);
    assert.ok(all.includes('\\u0001'.repeat(1000)), 'the first answer\'s long text came');
    assert.ok(all.includes('"content":"second"'));
    assert.equal(be.requests.length, 2);
    assert.equal(sluice.proc.exit, null, 'sluice is still running');
  });
});
