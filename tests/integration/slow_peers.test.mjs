// Slow peers (issue 6 acceptance):
// - slowloris: 64 connections trickle a request head that never ends; a
//   legitimate request meanwhile is served well within the header deadline,
//   and every trickling connection gets 408 + close at the deadline (a total
//   deadline: a per-read one would never fire on bytes every 200 ms); none of
//   them reaches the backend.
// - a slow reader of a 400 MiB stream: the client takes bytes in bursts, far
//   slower than mock-vllm makes them; sluice's RSS must stay within 8 MiB of
//   where it started (backpressure, not buffering; on the copy path the
//   shard's 4 MiB ring of backend receive buffers is taken in turn, so it
//   warms up within the run), the backend must still be
//   generating when a quarter has been read (it is read only as fast as the
//   client takes), and the client must get every byte the backend sent.
//   Splice and copy paths both.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import { fresh_agent, samples, scrape } from './lib/gateway.mjs';
import {
  bound_ms, chat_body, http_post, is_openai_error, parse_response, sluice_config, sse_events,
  start_mock_vllm, start_sluice, stop_all, test_key,
} from './lib/harness.mjs';

const auth = { authorization: `Bearer ${test_key}` };
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------
// Process memory

function rss_bytes(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB$/m);
  if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}

const MiB = 1024 * 1024;

// ---------------------------------------------------------------------------
// Slowloris

const header_timeout_ms = 1500;
const slowloris_count = 64;
const trickle_bytes = 4;
const trickle_interval_ms = 200;
// A head that never reaches its blank line within the test: 4 bytes per
// 200 ms take minutes to get through it.
const endless_head = Buffer.from(
  `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${test_key}\r\n` +
  `Content-Type: application/json\r\nX-Slow: ${'a'.repeat(4000)}`, 'latin1');

// One trickling connection: records when it connected, what came back and
// when the server closed it. Stops sending once the server answered.
function slowloris(port) {
  return new Promise((resolve, reject) => {
    // Before the connect: sluice's accept, where its deadline starts, can
    // only come after this (the connect callback may run late).
    const started_ms = performance.now();
    const socket = net.connect({ port, host: '127.0.0.1' });
    const s = { socket, started_ms, connected_ms: 0, first_byte_ms: null, closed_ms: null, sent: 0, received: Buffer.alloc(0), timer: null };
    const tick = () => {
      if (s.first_byte_ms !== null || socket.destroyed || s.sent >= endless_head.length) return;
      socket.write(endless_head.subarray(s.sent, s.sent + trickle_bytes));
      s.sent += trickle_bytes;
    };
    s.closed = new Promise((done) => socket.on('close', () => {
      s.closed_ms = performance.now();
      clearInterval(s.timer);
      done();
    }));
    socket.on('error', () => {});  // a reset shows as a missing 408
    socket.on('data', (d) => {
      if (s.first_byte_ms === null) s.first_byte_ms = performance.now();
      s.received = Buffer.concat([s.received, d]);
    });
    socket.once('connect', () => {
      socket.setNoDelay(true);
      s.connected_ms = performance.now();
      tick();
      s.timer = setInterval(tick, trickle_interval_ms);
      resolve(s);
    });
    socket.once('error', reject);
  });
}

describe('slowloris', () => {
  let mock;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 8 });
    sluice = await start_sluice({
      config: sluice_config({ backends: [mock.url], server: { header_timeout_ms } }),
    });
  });
  after(() => stop_all(sluice, mock));

  it(`${slowloris_count} trickling heads do not delay a legitimate request; each gets 408 and a close at the ${header_timeout_ms} ms header deadline`, async () => {
    await mock.clear_requests();
    const conns = [];
    try {
      for (let i = 0; i < slowloris_count; ++i) conns.push(await slowloris(sluice.port));
      const first_connected = conns[0].connected_ms;

      // Legitimate requests while all of them trickle: each on its own
      // connection, spread over the window before the first deadline.
      const latencies = [];
      let legit = 0;
      let legit_done = 0;
      await delay(300);
      while (performance.now() - first_connected < header_timeout_ms - 400) {
        const agent = fresh_agent();
        const started = performance.now();
        try {
          const reply = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 4 }), {
            headers: { ...auth, 'x-request-id': `legit-${legit}` }, agent, timeout_ms: bound_ms(10000),
          });
          legit_done = performance.now();
          latencies.push(legit_done - started);
          assert.equal(reply.status, 200, reply.text);
          assert.ok(JSON.parse(reply.text).choices[0].message.content.length > 0);
        } finally {
          agent.destroy();
        }
        ++legit;
        await delay(150);
      }
      console.log(`legitimate requests during ${slowloris_count} slowloris: ${latencies.map((ms) => ms.toFixed(1)).join(', ')} ms`);
      assert.ok(legit >= 3, `${legit} legitimate requests ran inside the trickle window`);
      for (const ms of latencies) {
        assert.ok(ms < header_timeout_ms, `a legitimate request took ${ms.toFixed(1)} ms, over the header deadline`);
      }
      // No slowloris was answered while the legit ones ran (the last one may
      // end after the first deadline on a slow machine: what came after it
      // is judged below).
      for (const s of conns) {
        assert.ok(s.first_byte_ms === null || s.first_byte_ms > legit_done, 'no slowloris was answered while the legitimate requests ran');
      }

      // Every trickler: 408 in OpenAI's shape, then the close, at the
      // deadline counted from its accept, not from its last byte.
      await Promise.all(conns.map((s) => Promise.race([s.closed, delay(header_timeout_ms + bound_ms(5000))])));
      const answered_after = [];
      for (const [i, s] of conns.entries()) {
        const what = `slowloris ${i}: received ${JSON.stringify(s.received.toString('latin1').slice(0, 300))}`;
        assert.notEqual(s.closed_ms, null, `${what}: not closed`);
        const parsed = parse_response(s.received, { at_eof: true });
        assert.ok(parsed && parsed.response.complete, `${what}: no complete response`);
        const r = parsed.response;
        assert.equal(r.status, 408, what);
        assert.match(r.header('connection') ?? '', /close/i, what);
        const body = r.json();
        assert.ok(is_openai_error(body), what);
        assert.equal(body.error.code, 'request_timeout', what);
        assert.equal(parsed.consumed, s.received.length, `${what}: bytes after the 408`);
        const at = s.first_byte_ms - s.connected_ms;
        answered_after.push(at);
        // Not before the deadline (counted from before the connect, which
        // precedes sluice's accept; 20 ms for its loop clock), and not much
        // after it: the bytes every 200 ms did not push it back.
        const since_start = s.first_byte_ms - s.started_ms;
        assert.ok(since_start >= header_timeout_ms - 20, `${what}: answered ${since_start.toFixed(0)} ms after the connect began, before the deadline`);
        assert.ok(at <= header_timeout_ms + bound_ms(500), `${what}: answered after ${at.toFixed(0)} ms`);
        assert.ok(s.closed_ms - s.connected_ms <= header_timeout_ms + bound_ms(600), `${what}: closed late`);
      }
      answered_after.sort((a, b) => a - b);
      console.log(`408 after ${answered_after[0].toFixed(0)}..${answered_after.at(-1).toFixed(0)} ms (deadline ${header_timeout_ms} ms); ` +
        `bytes sent per connection: ${conns[0].sent}`);

      const reached = (await mock.requests()).filter((r) => r.target.startsWith('/v1/'));
      assert.equal(reached.length, legit, 'only the legitimate requests reached the backend');
      for (const r of reached) assert.ok(r.headers.some(([n, v]) => n.toLowerCase() === 'x-request-id' && v.startsWith('legit-')));
    } finally {
      for (const s of conns) {
        clearInterval(s.timer);
        s.socket.destroy();
      }
    }
  });
});

// ---------------------------------------------------------------------------
// A slow reader of a 400 MiB stream

const token_pad = 2048;          // each SSE event ~2.3 KB
const stream_tokens = 190000;    // ~430 MB of events
const stream_min_bytes = 400 * MiB;
const rss_growth_max = 8 * MiB;
// The reader alternates: a pause (the socket not read at all), then a burst
// at burst_bytes_per_s. mock-vllm makes ~400 MB/s here, so for the whole
// stream the client is the bottleneck.
const pause_ms = 400;
const burst_ms = 400;
const burst_bytes_per_s = 40 * MiB;

// include_usage: the client asks for the usage chunk itself, so sluice has
// nothing to cut: the bytes pass through as they are.
function stream_request(id) {
  return chat_body({ stream: true, include_usage: true, max_tokens: stream_tokens, content: `slow reader ${id}` });
}

// POSTs a stream and reads its body. `pace` (optional) is called with the
// response and the running byte count on every piece and may pause it.
// Resolves {status, bytes, sha256, tail, complete, ms}.
function read_stream(base_url, id, { headers = {}, on_piece } = {}) {
  const payload = Buffer.from(JSON.stringify(stream_request(id)));
  const url = new URL('/v1/chat/completions', base_url);
  return new Promise((resolve, reject) => {
    const agent = fresh_agent();
    const req = http.request(url, {
      method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': payload.length, 'x-request-id': id, ...headers },
    });
    const started = performance.now();
    req.on('error', (err) => { agent.destroy(); reject(err); });
    req.on('response', (res) => {
      const hash = createHash('sha256');
      let bytes = 0;
      let tail = Buffer.alloc(0);
      res.on('data', (d) => {
        bytes += d.length;
        hash.update(d);
        tail = Buffer.concat([tail, d]).subarray(-64);
        on_piece?.(res, bytes);
      });
      res.on('error', () => {});
      res.on('close', () => {
        agent.destroy();
        resolve({ status: res.statusCode, bytes, sha256: hash.digest('hex'), tail: tail.toString('latin1'), complete: res.complete, ms: performance.now() - started });
      });
    });
    req.end(payload);
  });
}

// A pacer for read_stream: pauses the response whenever the bytes read are
// ahead of the schedule (nothing during a pause, burst_bytes_per_s during
// a burst), and resumes it when the schedule catches up.
function bursty_pacer() {
  const start = performance.now();
  const cycle = pause_ms + burst_ms;
  const allowed = (t) => {
    const whole = Math.floor(t / cycle);
    const into = t - whole * cycle;
    const burst_part = Math.max(0, into - pause_ms);
    return (whole * burst_ms + burst_part) * burst_bytes_per_s / 1000;
  };
  let timer = null;
  return {
    on_piece(res, bytes) {
      if (timer !== null) return;
      const t = performance.now() - start;
      if (bytes <= allowed(t)) return;
      res.pause();
      // The next moment the schedule allows more than has been read.
      let wait = 1;
      while (allowed(t + wait) < bytes + 64 * 1024 && wait < cycle * 2) wait += 5;
      timer = setTimeout(() => { timer = null; res.resume(); }, wait);
    },
    stop() { clearTimeout(timer); },
  };
}

describe('slow reader of a 400 MiB stream', () => {
  let mock;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: stream_tokens, extra_args: ['--token-pad', String(token_pad), '--no-record'] });
  });
  after(() => stop_all(mock));

  {
    const mode = 'copy';
    it(`sluice's RSS grows less than 8 MiB and every byte arrives`, async () => {
      const sluice = await start_sluice({ config: sluice_config({ backends: [mock.url], quota: { max_tokens_cap: 1 << 20 } }) });
      try {
        const pid = sluice.proc.child.pid;
        const id = `slow-reader-${mode}`;
        // What mock-vllm sends for this request, read directly at full speed.
        const direct = await read_stream(mock.url, id);
        assert.equal(direct.status, 200);
        assert.ok(direct.bytes >= stream_min_bytes, `the stream is ${direct.bytes} bytes`);
        console.log(`direct: ${(direct.bytes / MiB).toFixed(1)} MiB in ${direct.ms.toFixed(0)} ms`);

        // Warm the path (buffers, pipes, pooled backend connection) with a
        // short stream, then take the baseline.
        const warm = await http_post(sluice.url, '/v1/chat/completions', chat_body({ stream: true, max_tokens: 2000 }), { headers: auth, timeout_ms: bound_ms(20000) });
        assert.equal(warm.status, 200);
        assert.equal(sse_events(warm.text).at(-1), '[DONE]');
        const baseline = rss_bytes(pid);

        let peak = baseline;
        const sampler = setInterval(() => { try { peak = Math.max(peak, rss_bytes(pid)); } catch { /* exited */ } }, 50);
        const pacer = bursty_pacer();
        let running_at_quarter = null;
        let probe = null;
        const slow = await read_stream(sluice.url, id, {
          headers: auth,
          on_piece(res, bytes) {
            if (probe === null && bytes >= direct.bytes / 4) {
              // A quarter read: if sluice read the backend ahead of the
              // client, mock-vllm would long be done.
              probe = fetch(`${mock.url}/metrics`).then((r) => r.text()).then((text) => {
                const m = text.match(/^vllm:num_requests_running\{[^}]*\} (\S+)$/m);
                running_at_quarter = m ? Number(m[1]) : NaN;
              });
            }
            pacer.on_piece(res, bytes);
          },
        }).finally(() => { clearInterval(sampler); pacer.stop(); });
        await probe;
        peak = Math.max(peak, rss_bytes(pid));
        const growth = peak - baseline;
        console.log(`${mode}: ${(slow.bytes / MiB).toFixed(1)} MiB in ${(slow.ms / 1000).toFixed(1)} s ` +
          `(${(slow.bytes / MiB / (slow.ms / 1000)).toFixed(1)} MiB/s); sluice RSS ${(baseline / MiB).toFixed(1)} MiB -> ` +
          `peak ${(peak / MiB).toFixed(1)} MiB (+${(growth / MiB).toFixed(2)} MiB); ` +
          `backend streams running at a quarter: ${running_at_quarter}`);

        assert.equal(slow.status, 200);
        assert.equal(slow.complete, true, 'the stream ended with its terminal chunk');
        assert.ok(slow.tail.endsWith('data: [DONE]\n\n'), `ends with [DONE]: ${JSON.stringify(slow.tail)}`);
        assert.equal(slow.bytes, direct.bytes, 'bytes through sluice = bytes mock-vllm sent');
        assert.equal(slow.sha256, direct.sha256, 'the same bytes');
        assert.equal(running_at_quarter, 1, 'the backend was still generating when a quarter had been read');
        // Asserted in sanitizer builds too: ASan's quarantine would only
        // add to the growth if sluice allocated per event, which it must not
        // (docs/architecture.md §2); measured there, the growth is as small as here.
        assert.ok(growth < rss_growth_max, `sluice's RSS grew ${(growth / MiB).toFixed(2)} MiB (limit 8 MiB)`);
        // And sluice still serves.
        const next = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 4 }), { headers: auth });
        assert.equal(next.status, 200);
      } finally {
        await stop_all(sluice);
      }
    });
  }
});

// ---------------------------------------------------------------------------
// Backend receive buffers all lent: a response's bytes hold a buffer from the
// shard's ring until they are sent; a client that takes nothing keeps its
// buffer lent. With one ring buffer and four paused readers at once, the
// others must fall back to buffers of their own, and every byte of every
// stream must still arrive (copy path).

describe('backend receive buffers all lent', () => {
  const tokens = 8000;  // ~18 MB per stream: more than the loopback socket buffers take
  let mock;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: tokens, extra_args: ['--token-pad', String(token_pad), '--no-record'] });
  });
  after(async () => { await stop_all(mock); });

  it('four paused readers on one ring buffer: the others take their own, and every byte arrives', async () => {
    const sluice = await start_sluice({
      config: sluice_config({ backends: [mock.url], server: { upstream_buffers: 1 }, quota: { max_tokens_cap: 1 << 20 } }),
    });
    try {
      const ids = ['lent-0', 'lent-1', 'lent-2', 'lent-3'];
      const direct = await Promise.all(ids.map((id) => read_stream(mock.url, id)));
      for (const d of direct) assert.ok(d.bytes > 16 * MiB, `a stream is ${d.bytes} bytes`);
      const fallbacks = async () => samples((await scrape(sluice.admin_url)).parsed, 'sluice_upstream_buffer_fallbacks_total')
        .reduce((n, x) => n + x.value, 0);
      const before_count = await fallbacks();

      // Each reader stops reading at its first piece until all four have
      // one, and 500 ms more: sluice's sends block on full sockets, each
      // holding the buffer its bytes are in.
      let paused = 0;
      let release;
      const all_paused = new Promise((resolve) => { release = resolve; });
      const reads = ids.map((id) => {
        let waiting = false;
        return read_stream(sluice.url, id, {
          headers: auth,
          on_piece(res) {
            if (waiting) return;
            waiting = true;
            res.pause();
            if (++paused === ids.length) setTimeout(release, 500);
            all_paused.then(() => res.resume());
          },
        });
      });
      const got = await Promise.all(reads);
      const after_count = await fallbacks();
      console.log(`fallbacks to own buffers: ${after_count - before_count}; streams ${got.map((g) => (g.bytes / MiB).toFixed(1)).join(', ')} MiB`);

      for (let i = 0; i < ids.length; i++) {
        assert.equal(got[i].status, 200);
        assert.equal(got[i].complete, true, `${ids[i]} ended with its terminal chunk`);
        assert.equal(got[i].bytes, direct[i].bytes, `${ids[i]}: bytes through sluice = bytes mock-vllm sent`);
        assert.equal(got[i].sha256, direct[i].sha256, `${ids[i]}: the same bytes`);
      }
      assert.ok(after_count - before_count >= ids.length - 1,
        `at least ${ids.length - 1} receives found the ring empty (got ${after_count - before_count})`);
      // And sluice still serves, with its one buffer back.
      const next = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 4 }), { headers: auth });
      assert.equal(next.status, 200);
    } finally {
      await stop_all(sluice);
    }
  });
});
