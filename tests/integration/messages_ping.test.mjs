// A Messages stream sluice renders (a chat backend, an Anthropic client)
// is kept alive as Anthropic keeps its own: while the backend is quiet (a
// long prefill, a slow token) the client gets a `ping` event every
// [server] ping_interval_ms, between whole events, over HTTP/1.1 and
// HTTP/2, and the Anthropic SDK reads the stream as if nothing came
// between. A ping is no sign of life from the backend: one that stays
// quiet still ends the stream at stream_idle_timeout_ms. A Responses
// stream (whose dialect has no ping) gets none.
import assert from 'node:assert/strict';
import http from 'node:http';
import http2 from 'node:http2';
import { after, before, describe, it } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';

import { gateway_config } from './lib/gateway.mjs';
import { post_h2 } from './lib/h2_gateway.mjs';
import { bound_ms, http_post, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { chat_stream_events, chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A chat backend that sends its head and role chunk, is quiet for
// `pause_ms` (forever when the prompt says "hang"), then sends the rest.
function pausing_backend(pause_ms) {
  return start_scripted_backend(async (socket, request) => {
    const events = chat_stream_events({ tokens: 3 });
    socket.write(sse_head + chunk(events[0]).toString('latin1'), 'latin1');
    if (JSON.stringify(request.body).includes('hang')) return;  // never more
    await sleep(pause_ms);
    socket.write(events.slice(1).map((e) => chunk(e).toString('latin1')).join('') + '0\r\n\r\n', 'latin1');
  });
}

// The SSE events of a body, in order: [{event, data}].
function events_of(text) {
  return text.split(/\n\n/).filter((b) => b.trim() !== '').map((b) => {
    const lines = b.split('\n');
    return { event: lines.find((l) => l.startsWith('event: '))?.slice(7),
      data: JSON.parse(lines.find((l) => l.startsWith('data: ')).slice(6)) };
  });
}

// What a ping-laden stream would be without its pings: the event names.
const names = (evs) => evs.map((e) => e.event);

describe('Messages streams sluice renders: ping while the backend is quiet', () => {
  const pause_ms = 1200;
  const ping_ms = 200;
  let backend, sluice, sdk;
  before(async () => {
    backend = await pausing_backend(pause_ms);
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { ping_interval_ms: ping_ms }, health: { interval_ms: 0 }, upstream: { stream_idle_timeout_ms: 3000 } },
        groups: [{ name: 'chat', models: ['mock-model'], backends: [backend.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    sdk = new Anthropic({ apiKey: test_key, baseURL: sluice.url, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, backend));

  const body = (extra = {}) => ({ model: 'mock-model', max_tokens: 20, stream: true,
    messages: [{ role: 'user', content: 'Think first.' }], ...extra });

  for (const [proto, post] of [['HTTP/1.1', (p, b) => http_post(sluice.url, p, b, { headers: { 'x-api-key': test_key, 'anthropic-version': '2023-06-01' } })],
    ['HTTP/2', (p, b) => post_h2(sluice.url, b, test_key, { path: p, headers: { 'x-api-key': test_key, 'anthropic-version': '2023-06-01' } })]]) {
    it(`${proto}: pings come between whole events while the backend is quiet, and only then`, async () => {
      const r = await post('/v1/messages', body());
      assert.equal(r.status, 200, r.text);
      const evs = events_of(r.text);
      for (const e of evs) if (e.event === 'ping') assert.deepEqual(e.data, { type: 'ping' });
      const quiet = names(evs).slice(2, names(evs).indexOf('content_block_start'));
      // message_start and the opening ping, then the pause's pings (about
      // pause / ping_ms of them; a loaded machine sends fewer, never none).
      assert.deepEqual(names(evs).slice(0, 2), ['message_start', 'ping']);
      assert.ok(quiet.length >= 2 && quiet.every((n) => n === 'ping'), `pings in the pause: ${names(evs).join(' ')}`);
      // Not one a loop turn either: at most one a ping_ms (twice the pause
      // allowed, for a loaded machine's late timers).
      assert.ok(quiet.length <= Math.ceil((2 * pause_ms) / ping_ms) + 1, `no more than the pause holds: ${quiet.length}`);
      // The rest is the stream a quiet-free backend gives: no ping after the tokens came.
      const rest = names(evs).slice(2 + quiet.length);
      assert.deepEqual(rest, ['content_block_start', 'content_block_delta', 'content_block_delta', 'content_block_delta',
        'content_block_stop', 'message_delta', 'message_stop']);
    });
  }

  it('the Anthropic SDK reads a pinged stream whole: finalMessage and its usage', async () => {
    const m = await sdk.messages.stream(body({ stream: undefined })).finalMessage();
    assert.equal(m.content[0].text, 'tok0 tok1 tok2');
    assert.equal(m.stop_reason, 'end_turn');
    assert.equal(m.usage.output_tokens, 3);
  });

  it('pings do not keep a dead backend alive: the stream still ends at stream_idle_timeout_ms, as a failure', async () => {
    const started = Date.now();
    const r = await http_post(sluice.url, '/v1/messages', body({ messages: [{ role: 'user', content: 'hang' }] }),
      { headers: { 'x-api-key': test_key, 'anthropic-version': '2023-06-01' }, timeout_ms: bound_ms(10000) });
    const evs = events_of(r.text);
    assert.ok(names(evs).filter((n) => n === 'ping').length >= 5, names(evs).join(' '));
    assert.equal(evs.at(-1).event, 'error');
    assert.ok(Date.now() - started >= 2900, 'not before the idle timeout');
  });

  it('a Responses stream over the same backend gets no ping (its dialect has none)', async () => {
    const r = await http_post(sluice.url, '/v1/responses', { model: 'mock-model', input: 'Think first.', stream: true },
      { headers: { authorization: `Bearer ${test_key}` } });
    assert.equal(r.status, 200, r.text);
    assert.ok(!r.text.includes('ping'), r.text);
    assert.ok(r.text.includes('response.completed'));
  });
});

describe('Messages streams: pings beside a client that reads slowly and a backend that bursts', () => {
  // Bursts of large deltas with pauses between them (a ping falls due in
  // each), to a client that stops reading now and then: a ping may find
  // the client's socket full and still be going out when the backend's
  // next burst is ready (that send then waits for the ping, and goes).
  // Whatever the interleaving, the client reads whole events, the text
  // whole and in order, and pings only between events.
  const bursts = 30;
  const per_burst = 5;  // events of 12 kB each (under the 16 KiB an event may have to be rendered)
  const piece = 'x'.repeat(12000);
  let backend, sluice;
  before(async () => {
    backend = await start_scripted_backend(async (socket) => {
      const base = { id: 'chatcmpl-burst', object: 'chat.completion.chunk', created: 1700000000, model: 'mock-model' };
      const ev = (choices, extra = {}) => chunk(`data: ${JSON.stringify({ ...base, choices, ...extra })}\n\n`).toString('latin1');
      socket.write(sse_head + ev([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]), 'latin1');
      for (let i = 0; i < bursts; ++i) {
        await sleep(20);
        socket.write(Array.from({ length: per_burst }, (_, k) =>
          ev([{ index: 0, delta: { content: `${i}.${k}:${piece};` }, finish_reason: null }])).join(''), 'latin1');
      }
      socket.write(ev([{ index: 0, delta: {}, finish_reason: 'stop' }]) +
        ev([], { usage: { prompt_tokens: 3, completion_tokens: bursts * per_burst, total_tokens: 3 + bursts * per_burst } }) +
        chunk('data: [DONE]\n\n').toString('latin1') + '0\r\n\r\n', 'latin1');
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { ping_interval_ms: 1 }, health: { interval_ms: 0 } },
        groups: [{ name: 'chat', models: ['mock-model'], backends: [backend.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, backend));

  it('the text comes whole and in order, every event whole, for HTTP/1.1 and HTTP/2 readers that stall', async () => {
    const body = JSON.stringify({ model: 'mock-model', max_tokens: 100, stream: true, messages: [{ role: 'user', content: 'go' }] });
    const headers = { 'x-api-key': test_key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
    const expected = Array.from({ length: bursts * per_burst }, (_, j) => `${Math.floor(j / per_burst)}.${j % per_burst}:${piece};`).join('');
    // Reads `res` (a readable stream), pausing 40 ms after every ~256 KiB.
    const slow_read = (res) => new Promise((resolve, reject) => {
      const parts = [];
      let since = 0;
      res.on('data', (d) => {
        parts.push(d);
        since += d.length;
        if (since >= 256 * 1024) {
          since = 0;
          res.pause();
          setTimeout(() => res.resume(), 40);
        }
      });
      res.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
      res.on('error', reject);
    });
    const h1 = await new Promise((resolve, reject) => {
      const req = http.request(`${sluice.url}/v1/messages`, { method: 'POST', headers }, (res) => slow_read(res).then(resolve, reject));
      req.on('error', reject);
      req.end(body);
    });
    const session = http2.connect(sluice.url);
    session.on('error', () => {});
    let h2;
    try {
      const req = session.request({ ':method': 'POST', ':path': '/v1/messages', ...headers });
      req.end(body);
      h2 = await slow_read(req);
    } finally {
      session.close();
    }
    for (const text of [h1, h2]) {
      const evs = events_of(text);
      const deltas = evs.filter((e) => e.event === 'content_block_delta').map((e) => e.data.delta.text).join('');
      assert.equal(deltas.length, expected.length);
      assert.ok(deltas === expected, 'the text in order');
      assert.equal(evs.at(-1).event, 'message_stop');
      for (const e of evs) if (e.event === 'ping') assert.deepEqual(e.data, { type: 'ping' });
    }
  });
});

describe('Messages streams: ping_interval_ms = 0 sends none', () => {
  let backend, sluice;
  before(async () => {
    backend = await pausing_backend(800);
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { ping_interval_ms: 0 }, health: { interval_ms: 0 } },
        groups: [{ name: 'chat', models: ['mock-model'], backends: [backend.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, backend));

  it('only the opening ping', async () => {
    const r = await http_post(sluice.url, '/v1/messages', { model: 'mock-model', max_tokens: 20, stream: true,
      messages: [{ role: 'user', content: 'x' }] }, { headers: { 'x-api-key': test_key, 'anthropic-version': '2023-06-01' } });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(names(events_of(r.text)).filter((n) => n === 'ping'), ['ping']);
  });
});
