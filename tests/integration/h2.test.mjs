// HTTP/2 and TLS at the edge (issue 16): sluice with h2c on its plaintext
// listener (prior knowledge) and a TLS listener (ALPN h2, http/1.1) on a
// certificate from a CA the test makes with the openssl CLI.
//
// - The stock OpenAI Node SDK over https:// (a child node process with
//   NODE_EXTRA_CA_CERTS, read at start-up) gets what it gets from mock-vllm
//   directly: the same objects, the same chunks. Without the variable the
//   same child fails on the certificate (so the CA is really what it trusts).
// - curl --http2-prior-knowledge (h2c) and curl --http2 --cacert (TLS):
//   JSON and SSE bodies byte-equal to direct's (curl de-chunks direct's
//   HTTP/1.1 reply; sluice sends events as DATA frames), HTTP version 2.
// - h2load -n 200 -c 1 -m 100 (one connection, 100 streams at a time, h2c
//   and TLS): 200 answered 2xx, 0 failed / errored / timed out.
// - A client RST_STREAM mid-SSE: mock-vllm prints its abort line for the
//   request (the GPU stops), within the 100 ms failures.test.mjs holds the
//   HTTP/1.1 path to; the audit line says 499 client_closed, cancelled.
//
// mock-vllm runs with a fixed --created and answers with the request's
// X-Request-Id as its id, so the same request direct and through sluice
// gives byte-identical answers.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http2 from 'node:http2';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

import { audit_of, curl_post, run_program, start_sluice_edge } from './lib/h2_gateway.mjs';
import { bound_ms, chat_body, http_post, sse_events, start_mock_vllm, stop_all, test_key } from './lib/harness.mjs';
import { data_frame, error_code, field, frame_type, h2_connection, rst_stream_frame, window_update_frame } from './lib/raw_h2.mjs';
import { make_test_ca } from './lib/test_ca.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const abort_limit_ms = 100;
const auth = `Authorization: Bearer ${test_key}`;

// The SDK scenarios, run in a child node process (NODE_EXTRA_CA_CERTS is
// read when node starts): for each base URL in SDK_SPEC.bases, a non-stream
// chat, a stream, and a stream with include_usage, each with its own
// X-Request-Id. Prints {name: {plain, stream, usage} | {error, code}}.
const sdk_child = `
import OpenAI from 'openai';
const spec = JSON.parse(process.env.SDK_SPEC);
const out = {};
async function collect(s) { const a = []; for await (const c of s) a.push(c); return a; }
for (const [name, base] of Object.entries(spec.bases)) {
  const c = new OpenAI({ apiKey: spec.key, baseURL: base, maxRetries: 0, timeout: 10000 });
  const h = (x) => ({ headers: { 'X-Request-Id': spec.id + '-' + x } });
  try {
    out[name] = {
      plain: await c.chat.completions.create(spec.plain, h('plain')),
      stream: await collect(await c.chat.completions.create(spec.stream, h('stream'))),
      usage: await collect(await c.chat.completions.create(spec.usage, h('usage'))),
    };
  } catch (e) {
    const chain = [];
    for (let x = e; x && chain.length < 6; x = x.cause) chain.push(String(x.code ?? '') + ' ' + String(x.message ?? x));
    out[name] = { error: String(e), code: e.code ?? null, cause: chain.join(' <- ') };
  }
}
process.stdout.write(JSON.stringify(out));
`;

async function run_sdk_child(bases, { id, ca_file }) {
  const spec = {
    key: test_key, id, bases,
    plain: chat_body({ max_tokens: 12 }),
    stream: chat_body({ max_tokens: 12, stream: true }),
    usage: chat_body({ max_tokens: 12, stream: true, include_usage: true }),
  };
  const env = { SDK_SPEC: JSON.stringify(spec), NODE_EXTRA_CA_CERTS: ca_file };
  const r = await run_program(process.execPath, ['--input-type=module', '-e', sdk_child], { cwd: here, env, timeout_ms: bound_ms(30000) });
  assert.equal(r.code, 0, `the SDK child failed: ${r.stderr}`);
  return JSON.parse(r.stdout.toString());
}

// h2load's summary: {total, started, done, succeeded, failed, errored,
// timeout, s2xx, s3xx, s4xx, s5xx}.
function parse_h2load(text) {
  const req = text.match(/requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout/);
  const st = text.match(/status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx/);
  if (!req || !st) throw new Error(`h2load printed no summary:\n${text}`);
  const [total, started, done, succeeded, failed, errored, timeout] = req.slice(1).map(Number);
  const [s2xx, s3xx, s4xx, s5xx] = st.slice(1).map(Number);
  return { total, started, done, succeeded, failed, errored, timeout, s2xx, s3xx, s4xx, s5xx };
}

describe('HTTP/2 and TLS at the edge', () => {
  // `plain`: sluice with h2c on its plaintext port and no TLS listener, for
  // the h2c cases; the TLS cases use a second sluice with a TLS listener,
  // started by the first of them (tls_sluice()), so that a TLS listener
  // that cannot start fails the TLS cases only.
  let ca, mock, plain, tls_started;
  const tls_sluice = () => {
    tls_started ??= start_sluice_edge({ backends: [mock.url], ca });
    return tls_started;
  };

  before(async () => {
    ca = make_test_ca();
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 3000 });
    plain = await start_sluice_edge({ backends: [mock.url] });
  });
  after(async () => {
    const tls = tls_started ? await tls_started.catch(() => null) : null;
    await stop_all(plain, tls, mock);
    ca?.remove();
  });

  describe('the OpenAI Node SDK over https:// (NODE_EXTRA_CA_CERTS = the test CA)', () => {
    it('non-stream, stream and stream with include_usage equal the same against mock-vllm direct', async () => {
      const sluice = await tls_sluice();
      const out = await run_sdk_child({ direct: `${mock.url}/v1`, via: `${sluice.tls_url}/v1` }, { id: 'h2-sdk', ca_file: ca.ca_cert });
      assert.equal(out.direct.error, undefined, `direct: ${out.direct.error}`);
      assert.equal(out.via.error, undefined, `through sluice over TLS: ${out.via.error} (${out.via.code}) ${out.via.cause}`);
      assert.ok(out.direct.plain.usage.completion_tokens > 0);
      assert.ok(out.direct.stream.length >= 3, `the backend streamed ${out.direct.stream.length} chunks`);
      assert.deepStrictEqual(out.direct.usage.at(-1).choices, [], 'the last chunk is the usage chunk');
      assert.deepStrictEqual(out.via.plain, out.direct.plain);
      assert.deepStrictEqual(out.via.stream, out.direct.stream);
      assert.deepStrictEqual(out.via.usage, out.direct.usage);
    });

    it('without NODE_EXTRA_CA_CERTS the same child refuses the certificate (the test CA is what it trusts)', async () => {
      const spec_bases = { via: `${(await tls_sluice()).tls_url}/v1` };
      const out = await run_sdk_child(spec_bases, { id: 'h2-sdk-noca', ca_file: undefined });
      assert.ok(out.via.error, 'the SDK failed');
      assert.match(`${out.via.code} ${out.via.cause} ${out.via.error}`, /CERT|certificate|self.signed|verify/i);
    });
  });

  describe('curl', () => {
    const cases = [
      ['h2c prior knowledge', async () => plain.url, ['--http2-prior-knowledge']],
      ['TLS, ALPN h2', async () => (await tls_sluice()).tls_url, () => ['--http2', '--cacert', ca.ca_cert]],
    ];
    for (const [name, base, args_of] of cases) {
      const args = () => (typeof args_of === 'function' ? args_of() : args_of);
      it(`${name}: the JSON body equals direct's, over HTTP/2`, async () => {
        const body = chat_body({ max_tokens: 16 });
        const id = `h2-curl-json-${name.split(' ')[0].replace(/[^A-Za-z0-9]/g, '')}`;  // a plain token: sluice keeps it
        const direct = await curl_post(`${mock.url}/v1/chat/completions`, body, { headers: [`X-Request-Id: ${id}`] });
        const via = await curl_post(`${await base()}/v1/chat/completions`, body, { args: args(), headers: [auth, `X-Request-Id: ${id}`] });
        assert.equal(direct.status, 200);
        assert.equal(via.status, 200, via.body.toString());
        assert.equal(via.http_version, '2');
        assert.match(via.content_type, /^application\/json/);
        assert.equal(via.body.toString(), direct.body.toString());
      });

      it(`${name}: the SSE body equals direct's (de-chunked), [DONE] last`, async () => {
        const body = chat_body({ max_tokens: 200, stream: true, include_usage: true });
        const id = `h2-curl-sse-${name.split(' ')[0].replace(/[^A-Za-z0-9]/g, '')}`;
        const direct = await curl_post(`${mock.url}/v1/chat/completions`, body, { headers: [`X-Request-Id: ${id}`] });
        const via = await curl_post(`${await base()}/v1/chat/completions`, body, { args: args(), headers: [auth, `X-Request-Id: ${id}`] });
        assert.equal(via.status, 200, via.body.toString());
        assert.equal(via.http_version, '2');
        assert.match(via.content_type, /^text\/event-stream/);
        const events = sse_events(direct.body.toString());
        assert.ok(events.length > 100, `${events.length} events direct`);
        assert.equal(events.at(-1), '[DONE]');
        assert.equal(via.body.length, direct.body.length);
        assert.ok(via.body.equals(direct.body), 'the SSE bytes equal direct');
      });
    }

    it('h2c and HTTP/1.1 on the same plaintext port: curl without --http2 still gets HTTP/1.1', async () => {
      const via = await curl_post(`${plain.url}/v1/chat/completions`, chat_body({ max_tokens: 4 }), { headers: [auth] });
      assert.equal(via.status, 200);
      assert.equal(via.http_version, '1.1');
    });

    it('TLS with ALPN http/1.1 only (curl --http1.1) is answered over HTTP/1.1', async () => {
      const via = await curl_post(`${(await tls_sluice()).tls_url}/v1/chat/completions`, chat_body({ max_tokens: 4 }),
        { args: ['--http1.1', '--cacert', ca.ca_cert], headers: [auth] });
      assert.equal(via.status, 200);
      assert.equal(via.http_version, '1.1');
    });
  });

  describe('h2load -n 200 -c 1 -m 100 (100 streams at once on one connection)', () => {
    const body_file = () => {
      const f = path.join(ca.dir, 'h2load-body.json');
      fs.writeFileSync(f, JSON.stringify(chat_body({ max_tokens: 8 })));
      return f;
    };
    for (const [name, url] of [['h2c', async () => `${plain.url}/v1/chat/completions`], ['TLS', async () => `${(await tls_sluice()).tls_url}/v1/chat/completions`]]) {
      it(`${name}: every stream answered 2xx, zero errors, 200 requests reach the backend`, async () => {
        const target = await url();
        await mock.clear_requests();
        const r = await run_program('h2load', ['-n', '200', '-c', '1', '-m', '100', '-d', body_file(),
          '-H', 'content-type: application/json', '-H', `authorization: Bearer ${test_key}`, target], { timeout_ms: bound_ms(60000) });
        const text = `${r.stdout}${r.stderr}`;
        assert.equal(r.code, 0, text);
        const s = parse_h2load(text);
        assert.deepEqual(s, { total: 200, started: 200, done: 200, succeeded: 200, failed: 0, errored: 0, timeout: 0, s2xx: 200, s3xx: 0, s4xx: 0, s5xx: 0 }, text);
        if (name === 'TLS') assert.match(text, /Application protocol: h2/, text);
        const reached = (await mock.requests()).filter((x) => x.target === '/v1/chat/completions');
        assert.equal(reached.length, 200);
      });
    }
  });

  describe('a raw h2 client', () => {
    it('h2c: a chat answered on stream 1 and 3 of one connection, the JSON equal to direct', async () => {
      const body = chat_body({ max_tokens: 10 });
      const expected = await http_post(mock.url, '/v1/chat/completions', body, { headers: { 'x-request-id': 'h2-raw-1' } });
      const c = await h2_connection.connect({ port: plain.port });
      try {
        const settings = await c.handshake();
        assert.equal(settings[0x3], 100, 'SETTINGS_MAX_CONCURRENT_STREAMS 100');
        assert.equal(settings[0x4], 65536, 'SETTINGS_INITIAL_WINDOW_SIZE 64 KiB');
        for (const id of [1, 3]) {
          const sid = c.request({ method: 'POST', path: '/v1/chat/completions', headers: [['content-type', 'application/json'],
            ['authorization', `Bearer ${test_key}`], ['x-request-id', 'h2-raw-1']], body });
          assert.equal(sid, id);
          const s = await c.response(sid);
          assert.equal(s.status, 200, c.summary());
          assert.equal(s.rst_code, null);
          assert.equal(s.body.toString(), expected.text);
          assert.match(field(s.headers, 'content-type'), /^application\/json/);
        }
        assert.equal(c.goaways().length, 0);
      } finally {
        c.destroy();
      }
    });

    it('expect: 100-continue: an interim 100 comes before the body is sent; a refused request gets its 401 instead', async () => {
      const ask = (key) => new Promise((resolve, reject) => {
        const session = http2.connect(plain.url);
        session.on('error', reject);
        const headers = { ':method': 'POST', ':path': '/v1/chat/completions', 'content-type': 'application/json',
          expect: '100-continue' };
        if (key) headers.authorization = `Bearer ${key}`;
        const req = session.request(headers, { endStream: false });
        let continued = false;
        // The body goes out only once the server said so (as a client that
        // honours expect does).
        req.on('continue', () => {
          continued = true;
          req.end(JSON.stringify(chat_body({ max_tokens: 4 })));
        });
        req.on('response', (h) => {
          const parts = [];
          req.on('data', (d) => parts.push(d));
          req.on('end', () => {
            session.close();
            resolve({ status: h[':status'], continued, text: Buffer.concat(parts).toString() });
          });
        });
        req.setTimeout(bound_ms(10000), () => reject(new Error('no answer: the 100 never came')));
      });
      const ok = await ask(test_key);
      assert.equal(ok.continued, true);
      assert.equal(ok.status, 200, ok.text);
      assert.equal(JSON.parse(ok.text).object, 'chat.completion');
      const refused = await ask(null);
      assert.equal(refused.continued, false);
      assert.equal(refused.status, 401, refused.text);
    });

    it('the connection window: a WINDOW_UPDATE on stream 0 opens it past 64 KiB toward 1 MiB', async () => {
      const c = await h2_connection.connect({ port: plain.port });
      try {
        await c.handshake();
        // sluice's connection receive window (1 MiB) is announced with a
        // WINDOW_UPDATE on stream 0 after its SETTINGS.
        const wu = await c.wait_frame((f) => f.type === frame_type.WINDOW_UPDATE && f.stream_id === 0, { what: 'the connection WINDOW_UPDATE' });
        assert.equal(wu.increment + 65535, 1 << 20);
      } finally {
        c.destroy();
      }
    });

    it('a client RST_STREAM CANCEL mid-SSE: the backend request is aborted at once, audited 499 client_closed', async () => {
      const id = 'h2-rst-mid-sse';
      const from = mock.proc.mark();
      const c = await h2_connection.connect({ port: plain.port });
      try {
        await c.handshake();
        const sid = c.request({ method: 'POST', path: '/v1/chat/completions', headers: [['content-type', 'application/json'],
          ['authorization', `Bearer ${test_key}`], ['x-request-id', id]], body: chat_body({ stream: true, max_tokens: 2000 }) });
        await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === sid && f.length > 0, { what: 'the first SSE bytes' });
        assert.equal(c.stream(sid).status, 200);
        const reset_at = performance.now();
        await c.send(rst_stream_frame(sid, error_code.CANCEL));
        const { line } = await mock.proc.wait_for_line(new RegExp(`abort request_id=\\S*${id}\\b`), { from, timeout_ms: bound_ms(5000) });
        const ms = line.at_ms - reset_at;
        console.log(`h2 RST_STREAM -> mock-vllm abort: ${ms.toFixed(1)} ms`);
        assert.ok(ms < abort_limit_ms, `${ms.toFixed(1)} ms >= ${abort_limit_ms} ms`);
        const rec = await audit_of(plain, id);
        assert.deepEqual({ status: rec.status, error: rec.error, cancelled: rec.cancelled, stream: rec.stream },
          { status: 499, error: 'client_closed', cancelled: true, stream: true });
        assert.ok(rec.completion_tokens >= 1 && rec.completion_tokens < 2000, `completion_tokens ${rec.completion_tokens}`);
        // The connection is still good for another stream.
        const next = c.request({ method: 'POST', path: '/v1/chat/completions', headers: [['content-type', 'application/json'],
          ['authorization', `Bearer ${test_key}`]], body: chat_body({ max_tokens: 4 }) });
        const s = await c.response(next);
        assert.equal(s.status, 200, c.summary());
        assert.equal(c.goaways().length, 0);
      } finally {
        c.destroy();
      }
    });

    it('a connection error over TLS while the client still writes: the GOAWAY, then an orderly close, no reset', async () => {
      // What h2_hostile checks on h2c, through the TLS session: the
      // ciphertext the client sends after the GOAWAY is read and dropped
      // until its close, so no RST destroys the GOAWAY.
      const sluice = await tls_sluice();
      const c = await h2_connection.connect({ port: sluice.tls_port, tls: { ca: ca.ca_pem } });
      try {
        await c.handshake();
        const sid = c.request({ method: 'POST', path: '/v1/chat/completions', scheme: 'https', headers: [['content-type', 'application/json'],
          ['authorization', `Bearer ${test_key}`]], body: chat_body({ stream: true, max_tokens: 2000 }) });
        await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === sid && f.length > 0, { what: 'the first SSE bytes' });
        const burst = Buffer.concat(Array.from({ length: 100 }, () => window_update_frame(0, 1)));
        const writing = c.send(data_frame(sid, 'after END_STREAM')).then(() => c.write_while_open(burst));
        const closed = await c.wait_closed({ timeout_ms: bound_ms(10000) });
        const writes = await writing;
        assert.ok(closed, c.summary());
        assert.deepEqual(c.goaways().map((g) => g.error_code), [error_code.STREAM_CLOSED], c.summary());
        assert.equal(c.error, null, `no reset (${c.error?.code}) after ${writes} writes; ${c.summary()}`);
        assert.ok(c.ended, `the server's FIN came; ${c.summary()}`);
      } finally {
        c.destroy();
      }
    });

    it('a client closing the TLS connection mid-SSE (h2 over TLS) aborts the backend request too', async () => {
      const id = 'h2-tls-close-mid-sse';
      const sluice = await tls_sluice();
      const from = mock.proc.mark();
      const c = await h2_connection.connect({ port: sluice.tls_port, tls: { ca: ca.ca_pem } });
      assert.equal(c.alpn, 'h2');
      await c.handshake();
      const sid = c.request({ method: 'POST', path: '/v1/chat/completions', scheme: 'https', headers: [['content-type', 'application/json'],
        ['authorization', `Bearer ${test_key}`], ['x-request-id', id]], body: chat_body({ stream: true, max_tokens: 2000 }) });
      await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === sid && f.length > 0, { what: 'the first SSE bytes' });
      c.destroy();
      await mock.proc.wait_for_line(new RegExp(`abort request_id=\\S*${id}\\b`), { from, timeout_ms: bound_ms(5000) });
      const rec = await audit_of(sluice, id);
      assert.deepEqual({ status: rec.status, error: rec.error, cancelled: rec.cancelled }, { status: 499, error: 'client_closed', cancelled: true });
    });
  });
});

describe('HTTP/2 and a graceful stop (SIGTERM)', () => {
  let mock, sluice;
  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 200, reply_tokens: 100 });
    sluice = await start_sluice_edge({ backends: [mock.url], server: { drain_timeout_ms: 20000 } });
  });
  after(() => stop_all(sluice, mock));

  it('GOAWAY NO_ERROR at once; the stream in flight finishes whole; no new stream is taken; exit 0', async () => {
    const c = await h2_connection.connect({ port: sluice.port });
    try {
      await c.handshake();
      const sid = c.request({ method: 'POST', path: '/v1/chat/completions', headers: [['content-type', 'application/json'],
        ['authorization', `Bearer ${test_key}`]], body: chat_body({ stream: true, max_tokens: 100 }) });
      await c.wait_frame((f) => f.type === frame_type.DATA && f.stream_id === sid && f.length > 0, { what: 'the first SSE bytes' });
      sluice.proc.child.kill('SIGTERM');
      const goaway = await c.wait_goaway();
      assert.equal(goaway.error_code, error_code.NO_ERROR);
      assert.ok(goaway.last_stream_id >= sid, `last stream ${goaway.last_stream_id} covers stream ${sid}`);
      const s = await c.response(sid);
      assert.equal(s.status, 200, c.summary());
      assert.equal(s.rst_code, null, 'not reset');
      const events = sse_events(s.body.toString());
      assert.equal(events.at(-1), '[DONE]', 'the stream ended whole');
      const exit = await sluice.proc.exited;
      assert.equal(exit.code, 0, `sluice exited ${JSON.stringify(exit)}`);
    } finally {
      c.destroy();
    }
  });
});
