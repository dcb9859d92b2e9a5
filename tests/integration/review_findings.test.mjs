// What a hostile backend's bytes and a client's long id once reached
// (the reliability review of 2026-12-05, findings F1-F3), each tried from
// outside on one shard:
// - F1: a backend that sends [DONE] inside one huge chunk, so the relay's
//   held bytes fill its largest buffer with no chunk end in them, then
//   size lines that wrap a 64-bit sum where the next batch begins. The
//   HTTP/2 client's codec counted them for ever (the shard hung); the
//   HTTP/1.0 client's de-chunking copied 2^64-1 bytes (the process died).
// - F2: grpc-timeout was encoded from a stack buffer gone by then.
// - F8: the budget state file's writer stuck on a disk that never answers
//   (a FIFO nobody reads) holds up nothing else.
// - F3: a 192-byte head buffer and an X-Request-ID of 46+ characters put
//   stack bytes into the Anthropic backend's request head and lost its
//   x-forwarded-for line.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http2 from 'node:http2';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll, post_fresh } from './lib/gateway.mjs';
import { run_program } from './lib/h2_gateway.mjs';
import { bound_ms, chat_body, start_mock_vllm, start_sluice, stop_all, test_key, with_timeout } from './lib/harness.mjs';
import { grpc_frame, grpc_headers, token_message, start_raw_grpc_backend } from './lib/raw_grpc_backend.mjs';
import { chat_stream_events, chat_stream_reply, chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

const messages = [{ role: 'user', content: 'Say hello.' }];
const k_hold_max = 1 << 20;  // the relay's largest held buffer (openai_http::grow_upstream_buffer)

function sanitizer_report(proc) {
  return proc.lines.find((l) => /ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: .*Sanitizer/.test(l.text));
}

// The bytes after the role chunk: one chunk of 256 MiB announced, [DONE]
// at its start, filler to exactly the held buffer's size, then `attack`
// where the next batch begins, and another buffer's worth of filler.
function huge_chunk_with(attack) {
  const head = '10000000\r\ndata: [DONE]\n\n';
  return Buffer.concat([
    Buffer.from(head), Buffer.alloc(k_hold_max - head.length, 'A'),
    Buffer.from(attack), Buffer.alloc(k_hold_max + (64 << 10), 'A'),
  ]);
}

describe('F1: a backend whose chunk never ends after [DONE], to clients that take the framing off', () => {
  let be, sluice, role_seen, attack;
  before(async () => {
    be = await start_scripted_backend(async (socket, req) => {
      if (req.body?.messages?.[0]?.content !== 'hostile') {
        socket.write(chat_stream_reply({ tokens: 2 }));
        return;
      }
      const [role] = chat_stream_events({ tokens: 0 });
      socket.write(sse_head + chunk(role).toString('latin1'));
      // The next bytes start a receive of their own once the client has
      // the role chunk (the relay sent it and dropped its buffer).
      await role_seen.promise;
      socket.write(huge_chunk_with(attack));
      await once(socket, 'close');
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, upstream: { max_retries: 0, stream_idle_timeout_ms: 20000 }, health: { interval_ms: 0 } },
        groups: [{ name: 'g', models: ['*'], backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  function arm(pattern) {
    attack = pattern;
    let resolve;
    role_seen = { promise: new Promise((r) => { resolve = r; }), resolve };
  }

  // The same shard answers a plain request, and sluice runs on.
  async function shard_still_serves() {
    const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(3000) });
    let text = '';
    for await (const c of await sdk.chat.completions.create({ model: 'm', messages, stream: true })) {
      text += c.choices[0]?.delta?.content ?? '';
    }
    assert.equal(text, 'tok0 tok1');
    assert.equal(sluice.proc.exit, null, 'sluice is still running');
    assert.equal(sanitizer_report(sluice.proc), undefined);
  }

  it('HTTP/2: the stream fails, the shard keeps serving (size lines that wrap: 1, then 2^64-19)', async () => {
    arm('1\nX\r\nFFFFFFFFFFFFFFED\n');
    const client = http2.connect(sluice.url);
    client.on('error', () => {});
    const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hostile' }], stream: true });
    const req = client.request({ ':method': 'POST', ':path': '/v1/chat/completions', authorization: `Bearer ${test_key}`,
                                 'content-type': 'application/json' });
    req.end(body);
    let got = '';
    req.on('data', (d) => {
      got += d.toString('latin1');
      if (got.includes('"role":"assistant"')) role_seen.resolve();
    });
    const ended = new Promise((resolve) => { req.on('close', resolve); req.on('error', resolve); });
    await with_timeout(ended, bound_ms(10000), 'the hostile stream to end');
    assert.ok(got.includes('"role":"assistant"'), 'the role chunk came first');
    assert.ok(!got.includes('FFFFFFFFFFFFFFED'), 'no framing reached the client as payload');
    // The response ended at [DONE], whatever the backend sent after it.
    assert.ok(!got.includes('data: [DONE]') || got.endsWith('data: [DONE]\n\n'), JSON.stringify(got.slice(-80)));
    client.close();
    await shard_still_serves();
  });

  it('HTTP/1.0: the answer ends, the process lives (a 16-digit size of 2^64-1)', async () => {
    arm('FFFFFFFFFFFFFFFF\n');
    const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hostile' }], stream: true });
    const socket = net.connect({ port: sluice.port, host: '127.0.0.1' });
    await once(socket, 'connect');
    let got = '';
    socket.on('data', (d) => {
      got += d.toString('latin1');
      if (got.includes('"role":"assistant"')) role_seen.resolve();
    });
    socket.on('error', () => {});
    socket.write(`POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\nauthorization: Bearer ${test_key}\r\n` +
                 `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await with_timeout(once(socket, 'close'), bound_ms(10000), 'the HTTP/1.0 answer to end');
    assert.ok(got.startsWith('HTTP/1.0 200') || got.startsWith('HTTP/1.1 200'), got.slice(0, 40));
    assert.ok(!got.includes('FFFFFFFFFFFFFFFF'), 'no framing reached the client as payload');
    await shard_still_serves();
  });
});

describe('F2: gRPC request fields outlive the stack and the config they came from', () => {
  let be, sluice;
  before(async () => {
    be = await start_raw_grpc_backend((req) => [
      { headers: grpc_headers }, { data: grpc_frame(token_message(`r${req.index}`, { final: true })) },
      { trailers: { 'grpc-status': '0' } },
    ]);
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, upstream: { max_retries: 0, total_timeout_ms: 5000 }, health: { interval_ms: 0 } },
        groups: [{ name: 'raw', models: ['raw'], protocol: 'triton', backend_model: 'm', backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
      env: { ASAN_OPTIONS: `${process.env.ASAN_OPTIONS ?? ''}:detect_stack_use_after_return=1` },
    });
  });
  after(() => stop_all(sluice, be));

  it('50 streams at once on one shard: every grpc-timeout is digits and a unit, at most the total', async () => {
    const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
    const texts = await Promise.all(Array.from({ length: 50 }, async () => {
      let text = '';
      for await (const c of await sdk.chat.completions.create({ model: 'raw', messages, stream: true })) {
        text += c.choices[0]?.delta?.content ?? '';
      }
      return text;
    }));
    assert.equal(texts.filter((t) => /^r\d+$/.test(t)).length, 50);
    assert.equal(be.requests.length, 50);
    for (const r of be.requests) {
      const v = r.headers['grpc-timeout'];
      assert.match(v, /^[0-9]{1,8}[mS]$/, `grpc-timeout ${JSON.stringify(v)}`);
      assert.ok(v.endsWith('m') && Number(v.slice(0, -1)) <= 5000, v);
      assert.match(r.headers[':authority'], /^127\.0\.0\.1:\d+$/);
    }
    assert.equal(sanitizer_report(sluice.proc), undefined);
  });
});

describe('F3: the Anthropic backend\'s head holds what sluice wrote and nothing else', () => {
  let be, sluice;
  const reply = JSON.stringify({
    id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-backend',
    content: [{ type: 'text', text: 'hi' }], stop_reason: 'end_turn', stop_sequence: null,
    usage: { input_tokens: 3, output_tokens: 1 },
  });
  before(async () => {
    be = await start_scripted_backend(async (socket) => {
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(reply)}\r\n\r\n${reply}`);
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { upstream: { max_retries: 0 }, health: { interval_ms: 0 } },
        groups: [{ name: 'claude', models: ['claude-*'], protocol: 'anthropic', backend_model: 'claude-backend', backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  for (const [id_len, body_bytes] of [[45, 0], [46, 0], [50, 0], [63, 0], [63, 1_200_000]]) {
    it(`an X-Request-ID of ${id_len} characters${body_bytes ? ', a 1.2 MB body' : ''}`, async () => {
      const id = 'a'.repeat(id_len - 3) + '-' + String(id_len).padStart(2, '0');
      const content = body_bytes ? 'word '.repeat(body_bytes / 5) : 'Say hello.';
      const before_count = be.requests.length;
      const r = await fetch(`${sluice.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${test_key}`, 'content-type': 'application/json', 'x-request-id': id },
        body: JSON.stringify({ model: 'claude-x', max_tokens: 16, messages: [{ role: 'user', content }] }),
      });
      assert.equal(r.status, 200, await r.clone().text());
      assert.equal((await r.json()).choices[0].message.content, 'hi');
      await poll(() => be.requests.length > before_count, { what: 'the backend request' });
      const head = be.requests[be.requests.length - 1].head;
      assert.match(head, /^[\x20-\x7e\r\n]*$/, 'every byte of the head printable');
      const lines = head.split('\r\n');
      assert.deepEqual(lines.filter((l) => /^x-request-id:/i.test(l)), [`x-request-id: ${id}`]);
      assert.deepEqual(lines.filter((l) => /^x-forwarded-for:/i.test(l)), ['x-forwarded-for: 127.0.0.1']);
      assert.ok(!head.includes(test_key), 'the client\'s key stays behind');
    });
  }
});

describe('F1 (HTTP/1.1 client): a held chunk that fills the buffer passes on as it came', () => {
  let be, sluice;
  before(async () => {
    be = await start_scripted_backend(async (socket) => {
      // A content event of 3 MiB in chunks of 1 MiB + 1, then the rest of vLLM's stream.
      const events = chat_stream_events({ tokens: 1 });
      const big = `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 'B'.repeat(3 << 20) }, finish_reason: null }] })}\n\n`;
      const parts = [];
      for (let at = 0; at < big.length; at += k_hold_max + 1) parts.push(chunk(big.slice(at, at + k_hold_max + 1)));
      socket.write(Buffer.concat([Buffer.from(sse_head), chunk(events[0]), ...parts,
                                  ...events.slice(1).map((e) => chunk(e)), Buffer.from('0\r\n\r\n')]));
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, upstream: { max_retries: 0 }, health: { interval_ms: 0 } },
        groups: [{ name: 'g', models: ['*'], backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  it('the SDK gets the whole event and the stream\'s end', async () => {
    const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(20000) });
    let text = '';
    for await (const c of await sdk.chat.completions.create(chat_body({ model: 'm', stream: true }))) {
      text += c.choices[0]?.delta?.content ?? '';
    }
    assert.equal(text, `${'B'.repeat(3 << 20)}tok0`);
    assert.equal(sluice.proc.exit, null);
  });
});

describe('F4: a gRPC backend that never ends a non-stream reply', () => {
  let be, sluice;
  before(async () => {
    const piece = 'y'.repeat(64 << 10);
    be = await start_raw_grpc_backend((req) => (req.index === 0
      ? [{ headers: grpc_headers },
         ...Array.from({ length: 80 }, () => ({ data: grpc_frame(token_message(piece)) })), { hold: true }]
      : [{ headers: grpc_headers }, { data: grpc_frame(token_message('fine', { final: true })) },
         { trailers: { 'grpc-status': '0' } }]));
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, upstream: { max_retries: 0 }, health: { interval_ms: 0 } },
        groups: [{ name: 'raw', models: ['raw'], protocol: 'triton', backend_model: 'm', backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  it('5 MiB of text with no final flag: a 502 once past 4 MiB, and the next request is served', async () => {
    const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
    await assert.rejects(sdk.chat.completions.create({ model: 'raw', messages }), (err) => {
      assert.equal(err.status, 502);
      assert.match(err.message, /over 4 MiB of text/);
      return true;
    });
    const r = await sdk.chat.completions.create({ model: 'raw', messages });
    assert.equal(r.choices[0].message.content, 'fine');
    assert.equal(sluice.proc.exit, null);
  });
});

// A raw request to the admin listener with the Host (and Origin) given.
function admin_raw(port, head) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    let got = '';
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', reject);
    s.on('close', () => resolve({ status: Number(/^HTTP\/1\.1 (\d+)/.exec(got)?.[1] ?? 0), text: got }));
    s.write(head);
  });
}

describe('F6 and F7: the admin listener with no admin token', () => {
  let be, sluice;
  before(async () => {
    be = await start_scripted_backend(async (socket) => {
      socket.write(chat_stream_reply({ tokens: 1 }));
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 } },
        groups: [{ name: 'g', models: ['*'], backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  it('F6: a rebound name is refused (421), drain included; the IP, localhost and /healthz are served', async () => {
    const port = sluice.admin_port;
    const drain = `/backends/drain?url=${encodeURIComponent(be.url)}`;
    for (const host of [`evil.example:${port}`, 'evil.example', `127.0.0.1.nip.io:${port}`]) {
      const r = await admin_raw(port, `POST ${drain} HTTP/1.1\r\nhost: ${host}\r\norigin: http://${host}\r\ncontent-length: 0\r\n\r\n`);
      assert.equal(r.status, 421, r.text);
      const s = await admin_raw(port, `GET /status.json HTTP/1.1\r\nhost: ${host}\r\n\r\n`);
      assert.equal(s.status, 421);
      const m = await admin_raw(port, `GET /metrics HTTP/1.1\r\nhost: ${host}\r\n\r\n`);
      assert.equal(m.status, 421);
    }
    const backends = await (await fetch(`${sluice.admin_url}/backends`)).json();
    assert.ok(JSON.stringify(backends).includes(be.url));
    assert.ok(!JSON.stringify(backends).includes('"draining":true'), 'nothing was drained');
    assert.equal((await admin_raw(port, `GET /healthz HTTP/1.1\r\nhost: evil.example:${port}\r\n\r\n`)).status, 200);
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`]) {
      assert.equal((await admin_raw(port, `GET /status.json HTTP/1.1\r\nhost: ${host}\r\n\r\n`)).status, 200, host);
    }
    // The same-origin POST by the address itself still drains (and undrains).
    const own = `127.0.0.1:${port}`;
    const d = await admin_raw(port, `POST ${drain} HTTP/1.1\r\nhost: ${own}\r\norigin: http://${own}\r\ncontent-length: 0\r\n\r\n`);
    assert.equal(d.status, 200, d.text);
    const u = await admin_raw(port, `POST /backends/undrain?url=${encodeURIComponent(be.url)} HTTP/1.1\r\nhost: ${own}\r\ncontent-length: 0\r\n\r\n`);
    assert.equal(u.status, 200, u.text);
  });

  it('F7: 64 connections trickling a head cannot lock out /healthz, and each is cut at the head deadline', async () => {
    const port = sluice.admin_port;
    const trick = [];
    const closed = [];
    for (let i = 0; i < 64; ++i) {
      const s = net.connect({ port, host: '127.0.0.1' });
      s.on('error', () => {});
      closed.push(once(s, 'close'));
      await once(s, 'connect');
      s.write('G');
      trick.push(s);
    }
    const timer = setInterval(() => { for (const s of trick) if (!s.destroyed) s.write('E'); }, 400);
    try {
      // A probe on a 65th connection is answered (the oldest trickler made room).
      const r = await with_timeout(admin_raw(port, 'GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n'), bound_ms(3000), '/healthz');
      assert.equal(r.status, 200);
      // Every trickler is closed by the whole-head deadline (5 s from its
      // accept), however steadily it sends.
      await with_timeout(Promise.all(closed), bound_ms(15000), 'the tricklers to be cut');
    } finally {
      clearInterval(timer);
      for (const s of trick) s.destroy();
    }
    assert.equal((await admin_raw(port, 'GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n')).status, 200);
  });
});

describe('F5: HTTP/2 request bodies count against the connection\'s cap as they come', () => {
  let be, sluice;
  before(async () => {
    be = await start_scripted_backend(async (socket) => {
      socket.write(chat_stream_reply({ tokens: 1 }));
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, health: { interval_ms: 0 } },
        groups: [{ name: 'g', models: ['*'], backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  it('40 streams each holding 1 MiB of an unfinished body: all but what fits the cap are refused, memory stays bounded', async () => {
    const client = http2.connect(sluice.url);
    client.on('error', () => {});
    const reqs = [];
    for (let i = 0; i < 40; ++i) {
      const req = client.request({ ':method': 'POST', ':path': '/v1/chat/completions', authorization: `Bearer ${test_key}`,
                                   'content-type': 'application/json' });
      req.on('error', () => {});
      req.write(Buffer.alloc(1 << 20, 0x20));  // JSON whitespace: a body still coming
      reqs.push(req);
    }
    const metric = async (re) => Number(re.exec(await (await fetch(`${sluice.admin_url}/metrics`)).text())?.[1] ?? NaN);
    try {
      // The connection's bodies may hold max(h2_memory_max_bytes, max_body_bytes) = 8 MiB: of 40
      // bodies of 1 MiB, at most 8 arrive whole within it; every other one is refused (503, then
      // RST_STREAM) at its first byte past it.
      let shed = 0;
      await poll(async () => (shed = await metric(/^sluice_shed_requests_total\{reason="memory"\} (\d+)/m)) >= 32,
                 { what: 'the streams past the cap to be refused', timeout_ms: bound_ms(15000) });
      const mem = await metric(/^sluice_connection_memory_bytes(?:\{[^}]*\})? (\d+)/m);
      assert.ok(mem > 0 && mem < 24 * (1 << 20), `sluice_connection_memory_bytes ${mem} (${shed} refused)`);
    } finally {
      for (const r of reqs) r.close();
      client.close();
    }
    // The shard still serves on a new connection.
    const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(5000) });
    let text = '';
    for await (const c of await sdk.chat.completions.create({ model: 'm', messages, stream: true })) text += c.choices[0]?.delta?.content ?? '';
    assert.equal(text, 'tok0');
  });
});

describe('F8: a budget state file whose disk never answers', () => {
  // The state's temp file is a FIFO that nobody reads: the writer's open()
  // blocks there as on a hung disk. The control thread (admin, health,
  // reload, the budget ledger) and the shards must not wait on it.
  let mock, sluice, dir, fifo;
  const config = (extra = {}) => gateway_config({
    tables: { quota: { budget_state_file: path.join(dir, 'budgets.json') }, health: { interval_ms: 100 } },
    groups: [{ name: 'g', models: ['*'], backends: [mock.url], ...extra }],
    keys: [{ id: 'test', key: test_key, daily_tokens: 1000000 }],
  });
  before(async () => {
    mock = await start_mock_vllm();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-f8-'));
    fifo = path.join(dir, 'budgets.json.tmp');
    const made = await run_program('mkfifo', [fifo]);
    assert.equal(made.code, 0, made.stderr.toString());
    sluice = await start_sluice({ config: config() });
  });
  after(async () => {
    // Unblock the writer (a reader opens the FIFO) so the process can end.
    const reader = fs.createReadStream(fifo);
    reader.on('error', () => {});
    reader.resume();
    await stop_all(sluice, mock);
    reader.destroy();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('requests, admin pages, budgets and a reload go on while the writer is stuck', async () => {
    // A request changes the usage: the state is due for a save, and the
    // writer blocks on the FIFO.
    const first = await post_fresh(sluice.url, chat_body(), { key: test_key });
    assert.equal(first.status, 200);
    await poll(async () => (await (await fetch(`${sluice.admin_url}/keys/test`)).json()).used.daily_tokens > 0,
      { what: 'the usage in the ledger' });
    // The writer has had a second to reach the FIFO; everything else answers.
    await new Promise((r) => setTimeout(r, 1200));
    assert.ok(fs.statSync(fifo).isFIFO(), 'the writer never got past the FIFO');
    const used = (await (await fetch(`${sluice.admin_url}/keys/test`)).json()).used.daily_tokens;
    assert.ok(used > 0);
    for (let i = 0; i < 5; ++i) {
      const t0 = performance.now();
      const r = await post_fresh(sluice.url, chat_body(), { key: test_key });
      assert.equal(r.status, 200);
      for (const page of ['/metrics', '/status.json', '/keys/test', '/healthz']) {
        assert.equal((await fetch(`${sluice.admin_url}${page}`)).status, 200, page);
      }
      assert.ok(performance.now() - t0 < bound_ms(1000), 'answered without waiting on the disk');
    }
    await poll(async () => (await (await fetch(`${sluice.admin_url}/keys/test`)).json()).used.daily_tokens > used,
      { what: 'the ledger moving on' });
    // A reload is read and applied by the control thread: it completes.
    fs.writeFileSync(path.join(sluice.dir, 'sluice.toml'), config({ bounded_load: 1.5 }));
    const from = sluice.proc.mark();
    sluice.proc.child.kill('SIGHUP');
    await sluice.proc.wait_for_line(/SIGHUP: reloaded/, { from, timeout_ms: bound_ms(3000) });
  });
});
