// What an exchange owns, and for how long: a backend connection whose
// request is still being written when its answer comes, and a request the
// backend may already have started when its connection fails. Backends are
// raw sockets the test scripts, so each step happens when the test says.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import { poll, samples, scrape } from './lib/gateway.mjs';
import { bound_ms, chat_body, http_post, sluice_config, start_sluice, stop_all, test_key } from './lib/harness.mjs';

const auth = { authorization: `Bearer ${test_key}` };

// A backend that parses requests by Content-Length and calls
// `on_head(conn, head)` as soon as a head is complete, before its body.
// Each connection: {id, socket, heads: [], body_bytes, ended}.
async function start_raw_backend(on_head) {
  const conns = [];
  const server = net.createServer((socket) => {
    const conn = { id: conns.length, socket, heads: [], body_bytes: 0, ended: false };
    conns.push(conn);
    socket.on('error', () => {});
    socket.on('close', () => { conn.ended = true; });
    let buf = Buffer.alloc(0);
    let body_left = 0;
    socket.on('data', (data) => {
      buf = Buffer.concat([buf, data]);
      for (;;) {
        if (body_left > 0) {
          const take = Math.min(body_left, buf.length);
          body_left -= take;
          conn.body_bytes += take;
          buf = buf.subarray(take);
          if (body_left > 0) return;
        }
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buf.subarray(0, end).toString('latin1');
        buf = buf.subarray(end + 4);
        const m = /\r\ncontent-length:[ \t]*(\d+)/i.exec(head);
        body_left = m ? Number(m[1]) : 0;
        conn.heads.push(head);
        on_head(conn, head);
      }
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    conns,
    async stop() {
      for (const c of conns) c.socket.destroy();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

const small_answer = (text) => {
  const body = JSON.stringify({
    id: 'cmpl-raw', object: 'chat.completion', created: 1700000000, model: 'mock-model',
    choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
  });
  return `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
};

describe('a backend that answers before it has read the whole request', () => {
  let backend, sluice;
  const big = 32 << 20;

  before(async () => {
    backend = await start_raw_backend((conn, head) => {
      // Answer at once; a large body is then left unread (the socket
      // paused) until the test resumes it, so sluice's send is still in
      // flight when the answer arrives.
      conn.socket.write(small_answer(`conn ${conn.id}`));
      const m = /\r\ncontent-length:[ \t]*(\d+)/i.exec(head);
      if (m && Number(m[1]) >= big) conn.socket.pause();
    });
    sluice = await start_sluice({
      // No health probes: every connection the backend sees is a request's.
      config: `${sluice_config({ backends: [backend.url], server: { max_body_bytes: 64 << 20 } })}\n[health]\ninterval_ms = 0\n`,
      extra_args: ['--cpus', '0'],
    });
  });
  after(() => stop_all(sluice, backend));

  const is_big = (head) => Number(/\r\ncontent-length:[ \t]*(\d+)/i.exec(head)?.[1] ?? 0) >= big;

  // A large request answered early, then a small one: the small one must
  // go out whole on a connection of its own.
  async function big_then_small() {
    const before_count = backend.conns.length;
    const pad = 'x'.repeat(big);
    const first = await http_post(sluice.url, '/v1/chat/completions', chat_body({ content: pad }), {
      headers: auth, timeout_ms: bound_ms(20000),
    });
    assert.equal(first.status, 200, first.text.slice(0, 300));
    const big_conn = backend.conns.filter((c) => c.heads.some(is_big)).at(-1);
    assert.ok(big_conn, 'the large request reached the backend');
    assert.equal(JSON.parse(first.text).choices[0].message.content, `conn ${big_conn.id}`);
    big_conn.socket.resume();

    const second = await http_post(sluice.url, '/v1/chat/completions', chat_body({ content: 'small' }), {
      headers: auth, timeout_ms: bound_ms(10000),
    });
    assert.equal(second.status, 200, second.text.slice(0, 300));
    const used = JSON.parse(second.text).choices[0].message.content;
    assert.notEqual(used, `conn ${big_conn.id}`, 'the second request went out on the connection still busy with the first');
    assert.equal(used, `conn ${backend.conns.length - 1}`);
    assert.ok(backend.conns.length > before_count);
    // The connection whose request was cut short carried nothing else and
    // was closed by sluice.
    assert.ok(is_big(big_conn.heads.at(-1)), 'the busy connection carried no request after the large one');
    await poll(() => big_conn.ended, { what: 'sluice to close the connection whose request it had not finished writing' });
    assert.ok(big_conn.body_bytes < big, `the large body was not written on to the end (${big_conn.body_bytes} bytes)`);
  }

  it('on a new connection: the answer is read while the request is still going out', async () => {
    await big_then_small();
  });

  it('on a pooled connection: that connection is not pooled again, the next request gets a fresh one', async () => {
    // A small request first leaves its connection pooled (with its idle
    // receive armed): the large request takes it.
    const warm = await http_post(sluice.url, '/v1/chat/completions', chat_body({ content: 'warm' }), { headers: auth });
    assert.equal(warm.status, 200);
    await big_then_small();
  });
});

describe('a backend connection that fails after the whole request was written', () => {
  let backends, sluice;

  before(async () => {
    // Each backend reads the request whole, then drops the connection
    // without an answer: it may have started the generation.
    backends = await Promise.all([0, 1].map(() => start_raw_backend((conn) => {
      setImmediate(() => conn.socket.destroy());
    })));
    sluice = await start_sluice({
      config: `${sluice_config({ backends: backends.map((b) => b.url), upstream: { max_retries: 1 } })}\n[health]\ninterval_ms = 0\n`,
      extra_args: ['--cpus', '0'],
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  it('is not retried: one backend saw the POST, the client gets a 502', async () => {
    const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({}), { headers: auth });
    assert.equal(r.status, 502, r.text);
    assert.equal(JSON.parse(r.text).error.code, 'upstream_reset');
    const seen = backends.reduce((n, b) => n + b.conns.reduce((m, c) => m + c.heads.length, 0), 0);
    assert.equal(seen, 1, 'the request reached exactly one backend');
    const m = await scrape(sluice.admin_url);
    assert.equal(samples(m.parsed, 'sluice_upstream_reset_after_send_total').reduce((a, s) => a + s.value, 0), 1);
  });
});

describe('a pooled backend connection that stops taking the request', () => {
  let backends, sluice;
  const big = 32 << 20;

  before(async () => {
    // Each backend answers a request once it has read it whole, except a
    // large one on a connection that already carried a request: that one it
    // stops reading (a backend wedged, or a path that black-holes), so the
    // connection's window closes before sluice has written the request.
    backends = await Promise.all(['a', 'b'].map((name) => {
      const b = start_raw_backend((conn, head) => {
        const len = Number(/\r\ncontent-length:[ \t]*(\d+)/i.exec(head)?.[1] ?? 0);
        if (len >= big && conn.heads.length > 1) {
          conn.socket.pause();
          return;
        }
        const answer = () => conn.socket.write(small_answer(name));
        if (len === 0) {
          answer();
        } else {
          // Answer once the body is in (start_raw_backend counts it).
          const want = conn.body_bytes + len;
          const check = () => (conn.body_bytes >= want ? answer() : setTimeout(check, 5));
          check();
        }
      });
      return b;
    }));
    sluice = await start_sluice({
      config: `${sluice_config({
        backends: backends.map((b) => b.url),
        server: { max_body_bytes: 64 << 20 },
        upstream: { max_retries: 1, first_byte_timeout_ms: 45000 },
      }).replace('balance = "round-robin"', 'balance = "session"')}\n[health]\ninterval_ms = 0\n`,
      extra_args: ['--cpus', '0'],
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  // One session: the large request takes the connection the small one left
  // in the pool.
  it('is cut by TCP_USER_TIMEOUT and retried on the other backend, before the first-byte timeout', async () => {
    const session = { ...auth, 'x-session-id': 'wedged-pool' };
    const warm = await http_post(sluice.url, '/v1/chat/completions', chat_body({ content: 'warm' }), { headers: session });
    assert.equal(warm.status, 200, warm.text);
    const first = JSON.parse(warm.text).choices[0].message.content;
    const t0 = Date.now();
    const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ content: 'x'.repeat(big) }), {
      headers: session, timeout_ms: bound_ms(60000),
    });
    const took_ms = Date.now() - t0;
    assert.equal(r.status, 200, r.text.slice(0, 300));
    const second = JSON.parse(r.text).choices[0].message.content;
    assert.notEqual(second, first, 'the retry went to the other backend, not the wedged one again');
    // Well before the 45 s first-byte timeout (the socket's user timeout is 15 s).
    assert.ok(took_ms < 40000, `answered after ${took_ms} ms`);
    const wedged = backends[first === 'a' ? 0 : 1];
    assert.ok(wedged.conns.some((c) => c.heads.length === 2), 'the large request went out on the pooled connection');
    const m = await scrape(sluice.admin_url);
    assert.ok(samples(m.parsed, 'sluice_upstream_retries_total').reduce((a, s) => a + s.value, 0) >= 1);
  });
});
