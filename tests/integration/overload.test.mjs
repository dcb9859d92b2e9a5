// Overload: per-shard caps answer 503 + retry-after (OpenAI's error shape)
// before anything breaks, and count each shed reason.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import { start_anthropic_peer } from './lib/anthropic_peer.mjs';
import { chat_body, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { gateway_config, poll, post_fresh, samples, scrape } from './lib/gateway.mjs';

function connect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

function read_all(socket, timeout_ms = 5000) {
  return new Promise((resolve, reject) => {
    const parts = [];
    const timer = setTimeout(() => reject(new Error('no close within the bound')), timeout_ms);
    socket.on('data', (d) => parts.push(d));
    socket.on('close', () => { clearTimeout(timer); resolve(Buffer.concat(parts).toString('utf8')); });
  });
}

// One mock-vllm and a one-shard sluice in front of it (the caps are per
// shard) with the given config tables; resolves with both.
async function start_pair(mock_options, tables) {
  const mock = await start_mock_vllm(mock_options);
  const sluice = await start_sluice({
    config: gateway_config({
      tables,
      groups: [{ name: 'default', models: ['*'], backends: [mock.url] }],
      keys: [{ id: 'test', key: 'test-key', groups: ['*'] }],
    }),
    extra_args: ['--cpus', '0'],
  }).catch(async (err) => { await mock.stop(); throw err; });
  return { mock, sluice };
}

describe('overload', () => {
  let mock;
  let sluice;

  before(async () => {
    // Requests stay in flight ~1 s, so the in-flight cap is reached.
    ({ mock, sluice } = await start_pair({ ttft_ms: 1000, reply_tokens: 2 }, { server: { connections_max: 2, inflight_max: 1 } }));
  });
  after(() => stop_all(sluice, mock));

  it('over server.inflight_max a request gets 503 with retry-after and reaches no backend', async () => {
    await mock.clear_requests();
    const replies = await Promise.all([0, 1].map(() =>
      post_fresh(sluice.url, chat_body({ max_tokens: 2 }), { key: 'test-key' })));
    const statuses = replies.map((r) => r.status).sort();
    assert.deepEqual(statuses, [200, 503]);
    const shed = replies.find((r) => r.status === 503);
    assert.equal(shed.headers['retry-after'], '1');
    const body = JSON.parse(shed.text);
    assert.equal(body.error.code, 'overloaded');
    assert.equal(body.error.type, 'server_error');
    assert.equal((await mock.requests()).length, 1, 'only the admitted request reached the backend');
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.equal(samples(m, 'sluice_shed_requests_total', { reason: 'inflight' })[0].value, 1);
    assert.equal(samples(m, 'sluice_shed_requests_total', { reason: 'upstream_pool' })[0].value, 0);
    assert.equal(samples(m, 'sluice_shed_requests_total', { reason: 'memory' })[0].value, 0);
  });

  it('over server.connections_max a new connection gets 503 and is closed; the others keep working', async () => {
    const a = await connect(sluice.port);
    const b = await connect(sluice.port);
    try {
      // Both held open and idle; the third is over the cap of 2.
      const c = await connect(sluice.port);
      const reply = await read_all(c);
      assert.match(reply, /^HTTP\/1\.1 503 /);
      assert.match(reply, /\r\nretry-after: 1\r\n/);
      const body = JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4));
      assert.equal(body.error.code, 'overloaded');
    } finally {
      a.destroy();
      b.destroy();
    }
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.ok(samples(m, 'sluice_shed_connections_total')[0].value >= 1);
  });
});

describe('overload: a backend\'s connection pool at upstream.connections_max', () => {
  let mock;
  let sluice;

  before(async () => {
    ({ mock, sluice } = await start_pair({ ttft_ms: 1000, reply_tokens: 2 }, { upstream: { connections_max: 1 } }));
  });
  after(() => stop_all(sluice, mock));

  it('a request that would need one more connection gets 503 with retry-after; the pooled one serves the next', async () => {
    await mock.clear_requests();
    const replies = await Promise.all([0, 1].map(() =>
      post_fresh(sluice.url, chat_body({ max_tokens: 2 }), { key: 'test-key' })));
    assert.deepEqual(replies.map((r) => r.status).sort(), [200, 503]);
    const shed = replies.find((r) => r.status === 503);
    assert.equal(shed.headers['retry-after'], '1');
    assert.equal(JSON.parse(shed.text).error.code, 'overloaded');
    assert.equal((await mock.requests()).length, 1, 'the shed request reached no backend');
    // The one connection is back in the pool: the next request uses it.
    const next = await post_fresh(sluice.url, chat_body({ max_tokens: 2 }), { key: 'test-key' });
    assert.equal(next.status, 200);
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.equal(samples(m, 'sluice_shed_requests_total', { reason: 'upstream_pool' })[0].value, 1);
  });
});

describe('overload: connection memory over server.memory_max_bytes', () => {
  let mock;
  let sluice;

  before(async () => {
    ({ mock, sluice } = await start_pair({ reply_tokens: 2 }, { server: { memory_max_bytes: 400000 } }));
  });
  after(() => stop_all(sluice, mock));

  it('while one upload holds the memory, new requests get 503 with retry-after; once it is gone they pass', async () => {
    const first = await post_fresh(sluice.url, chat_body({ max_tokens: 2 }), { key: 'test-key' });
    assert.equal(first.status, 200, 'under the budget a request passes');
    // A 1 MiB body, 700 KB of it sent: its buffer holds ~1 MiB of the shard's budget.
    const big = await connect(sluice.port);
    const body_len = 1 << 20;
    big.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer test-key\r\ncontent-type: application/json\r\ncontent-length: ${body_len}\r\n\r\n`);
    big.write(Buffer.alloc(700 * 1024, 0x20));
    let m;
    await poll(async () => {
      m = (await scrape(sluice.admin_url)).parsed;
      return samples(m, 'sluice_connection_memory_bytes')[0].value > 400000;
    }, { what: 'the upload to fill the budget' });
    await mock.clear_requests();
    const shed = await post_fresh(sluice.url, chat_body({ max_tokens: 2 }), { key: 'test-key' });
    assert.equal(shed.status, 503);
    assert.equal(shed.headers['retry-after'], '1');
    assert.equal(JSON.parse(shed.text).error.code, 'overloaded');
    assert.equal((await mock.requests()).length, 0, 'the shed request reached no backend');
    m = (await scrape(sluice.admin_url)).parsed;
    assert.ok(samples(m, 'sluice_shed_requests_total', { reason: 'memory' })[0].value >= 1);

    big.destroy();
    const ok = await poll(async () => {
      const r = await post_fresh(sluice.url, chat_body({ max_tokens: 2 }), { key: 'test-key' });
      return r.status === 200 ? r : null;
    }, { what: 'a request to pass once the upload is gone' });
    assert.equal(ok.status, 200);
    m = (await scrape(sluice.admin_url)).parsed;
    assert.ok(samples(m, 'sluice_connection_memory_bytes')[0].value < 400000);
  });
});

describe('overload: memory a connection made on first use is uncounted when it closes', () => {
  let mock;
  let peer;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 3 });
    peer = await start_anthropic_peer();
    sluice = await start_sluice({
      config: gateway_config({
        groups: [{ name: 'claude', models: ['claude-*'], protocol: 'anthropic', backends: [peer.url] },
                 { name: 'default', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'test', key: 'test-key', groups: ['*'] }],
      }),
      extra_args: ['--cpus', '0'],
    }).catch(async (err) => { await stop_all(mock, peer); throw err; });
  });
  after(() => stop_all(sluice, mock, peer));

  const gauge = async () => samples((await scrape(sluice.admin_url)).parsed, 'sluice_connection_memory_bytes')[0].value;

  // The Anthropic translator (32 KiB of event buffers a connection) and the
  // Responses renderer are made on a connection's first such stream and
  // kept for its next ones; the memory cap counts them while they live. A
  // count that outlived its connection would, connection after connection,
  // reach server.memory_max_bytes with nothing open and shed every request.
  it('connections that streamed through the Anthropic translator and the renderer leave the count where it was', async () => {
    // The backend connections these streams pool stay counted: the idle
    // level is taken once the pools hold them (after one of each stream,
    // and once the count stands still).
    const once = async () => {
      const a = await post_fresh(sluice.url, chat_body({ model: 'claude-x', stream: true, max_tokens: 5 }), { key: 'test-key' });
      assert.equal(a.status, 200);
      assert.match(a.text, /data: \[DONE\]/);
      const r = await post_fresh(sluice.url, { model: 'mock-model', input: 'hi', stream: true, max_output_tokens: 5 },
                                 { key: 'test-key', target: '/v1/responses' });
      assert.equal(r.status, 200);
      assert.match(r.text, /response\.completed/);
    };
    await once();
    let idle = -1;
    await poll(async () => {
      const before = idle;
      idle = await gauge();
      return idle === before;
    }, { interval_ms: 200, what: 'the connection memory count to stand still' });
    for (let i = 0; i < 6; ++i) await once();
    let last;
    await poll(async () => {
      last = await gauge();
      return last <= idle;
    }, { what: 'the connection memory count back at its idle level' }).catch((err) => {
      throw new Error(`${err.message}: ${last} bytes counted with no connection open, ${idle} before`);
    });
    assert.equal(last, idle);
  });
});
