// Active health probes of a grpc:// (KServe v2 / Triton) backend: each
// probe is ServerReady then ModelReady for the group's backend_model over
// a fresh h2c connection, and the backend is up only while both answer OK
// with ready = true. The server is @grpc/grpc-js on the published proto,
// an implementation independent of sluice's. An http:// backend in the
// same config is still probed with GET /health.
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import grpc from '@grpc/grpc-js';
import proto_loader from '@grpc/proto-loader';

import { gateway_config, poll, samples, scrape } from './lib/gateway.mjs';
import { bound_ms, repo_root, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';

const proto_path = path.join(repo_root, 'tests/integration/lib/proto/grpc_service.proto');
const service = grpc.loadPackageDefinition(
  proto_loader.loadSync(proto_path, { keepCase: true, defaults: true })).inference.GRPCInferenceService;

// The switches the probes see, and every probe call the server answered.
const state = { server_ready: true, model_ready: true, unavailable: false };
const calls = [];

function answer(method, call, callback) {
  calls.push({ method, name: call.request?.name, deadline: call.getDeadline(), at_wall_ms: Date.now() });
  if (state.unavailable) {
    callback({ code: grpc.status.UNAVAILABLE, details: 'switched to UNAVAILABLE' });
    return;
  }
  callback(null, { ready: method === 'ServerReady' ? state.server_ready : state.model_ready });
}

// A gRPC server on `port` (0 = any); resolves with {server, port}. A port
// just freed may briefly be taken by another process's outgoing socket:
// retried for a bounded time.
async function start_grpc(port = 0) {
  const deadline = performance.now() + bound_ms(5000);
  for (;;) {
    const server = new grpc.Server();
    server.addService(service.service, {
      ServerReady: (call, cb) => answer('ServerReady', call, cb),
      ModelReady: (call, cb) => answer('ModelReady', call, cb),
    });
    try {
      const bound = await new Promise((resolve, reject) => {
        server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(),
          (err, p) => (err ? reject(err) : resolve(p)));
      });
      return { server, port: bound };
    } catch (err) {
      server.forceShutdown();
      if (port === 0 || performance.now() > deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

// A TCP server that accepts and never answers: what each connection got
// first, and whether the peer closed it.
async function start_silent() {
  const conns = [];
  const server = net.createServer((socket) => {
    const c = { socket, first: Buffer.alloc(0), closed: false };
    conns.push(c);
    socket.on('data', (d) => { if (c.first.length < 24) c.first = Buffer.concat([c.first, d]); });
    socket.on('end', () => { c.closed = true; socket.end(); });
    socket.on('error', () => { c.closed = true; });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, conns, port: server.address().port };
}

describe('health probes of a grpc:// backend', () => {
  let grpc_server, grpc_port, grpc_url, silent, silent_url, mock, sluice;

  before(async () => {
    ({ server: grpc_server, port: grpc_port } = await start_grpc());
    grpc_url = `grpc://127.0.0.1:${grpc_port}`;
    silent = await start_silent();
    silent_url = `grpc://127.0.0.1:${silent.port}`;
    mock = await start_mock_vllm();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 100, timeout_ms: 1000, rise: 1, fall: 1 } },
        groups: [
          { name: 'triton', protocol: 'triton', models: ['tri-*'], backend_model: 'mock-model', backends: [grpc_url] },
          { name: 'silent', protocol: 'triton', models: ['quiet-*'], backend_model: 'quiet', backends: [silent_url],
            health: { timeout_ms: 300 } },
          { name: 'http', models: ['*'], backends: [mock.url] },
        ],
        keys: [{ id: 'k', key: 'key-k', groups: ['*'] }],
      }),
    });
  });
  after(async () => {
    grpc_server?.forceShutdown();
    silent?.server.close();
    for (const c of silent?.conns ?? []) c.socket?.destroy();
    await stop_all(sluice, mock);
  });

  const backend = async (url) => {
    const res = await fetch(`${sluice.admin_url}/backends`);
    assert.equal(res.status, 200);
    const entry = (await res.json()).backends.find((b) => b.url === url);
    assert.ok(entry, `GET /backends lists ${url}`);
    return entry;
  };
  const until_up = (url, up, what) =>
    poll(async () => (await backend(url)).up === up, { what: `${url} ${up ? 'up' : 'down'} (${what})` });
  // Calls answered from now on: what the next probes ask.
  const calls_from = (mark) => calls.slice(mark);
  const until_calls = (mark, test, what) => poll(() => test(calls_from(mark)), { what });

  it('is up while both calls say ready; ModelReady names the group\'s backend_model', async () => {
    await until_up(grpc_url, true, 'both ready');
    const mark = calls.length;
    await until_calls(mark, (c) => c.filter((x) => x.method === 'ModelReady').length >= 3, 'three probes');
    const seen = calls_from(mark);
    for (const c of seen.filter((x) => x.method === 'ModelReady')) assert.equal(c.name, 'mock-model');
    // Each probe is ServerReady then ModelReady.
    assert.ok(seen.some((x) => x.method === 'ServerReady'));
    for (let i = 1; i < seen.length; ++i) {
      if (seen[i].method === 'ModelReady') assert.equal(seen[i - 1].method, 'ServerReady', `call ${i}`);
    }
    // grpc-timeout carries the probe's timeout (1000 ms): grpc-js sets the
    // call's deadline that far after the call arrived (no header: Infinity).
    for (const c of seen) {
      const deadline_ms = c.deadline instanceof Date ? c.deadline.getTime() : Number(c.deadline);
      const left_ms = deadline_ms - c.at_wall_ms;
      assert.ok(left_ms > 500 && left_ms <= 1000, `${c.method}: deadline ${left_ms} ms after arrival`);
    }
    const up = samples((await scrape(sluice.admin_url)).parsed, 'sluice_backend_up', { backend: grpc_url });
    assert.equal(up[0]?.value, 1);
  });

  it('goes down when ModelReady says false, and comes back when it says true', async () => {
    state.model_ready = false;
    await until_up(grpc_url, false, 'ModelReady false');
    await poll(async () => samples((await scrape(sluice.admin_url)).parsed, 'sluice_backend_up', { backend: grpc_url })[0]?.value === 0,
      { what: 'sluice_backend_up 0' });
    state.model_ready = true;
    await until_up(grpc_url, true, 'ModelReady true again');
  });

  it('goes down when ServerReady says false, and then asks no ModelReady', async () => {
    state.server_ready = false;
    await until_up(grpc_url, false, 'ServerReady false');
    const mark = calls.length;
    await until_calls(mark, (c) => c.length >= 3, 'three more probes');
    assert.deepEqual([...new Set(calls_from(mark).map((c) => c.method))], ['ServerReady']);
    state.server_ready = true;
    await until_up(grpc_url, true, 'ServerReady true again');
  });

  it('goes down while the server answers UNAVAILABLE', async () => {
    state.unavailable = true;
    await until_up(grpc_url, false, 'UNAVAILABLE');
    state.unavailable = false;
    await until_up(grpc_url, true, 'answering again');
  });

  it('goes down when the server stops, and up when it is back on its port', async () => {
    grpc_server.forceShutdown();
    grpc_server = null;
    await until_up(grpc_url, false, 'server stopped');
    ({ server: grpc_server } = await start_grpc(grpc_port));
    await until_up(grpc_url, true, 'server back');
  });

  it('probes the http:// backend with GET /health as before, and it stays up', async () => {
    await mock.clear_requests();
    await poll(async () => (await mock.all_requests()).filter((r) => r.method === 'GET' && r.target === '/health').length >= 3,
      { what: 'three GET /health probes' });
    const seen = await mock.all_requests();
    // Only probes and scrapes: no gRPC bytes went to the HTTP backend.
    for (const r of seen) assert.ok(r.method === 'GET' && ['/health', '/metrics'].includes(r.target), `${r.method} ${r.target}`);
    assert.equal((await backend(mock.url)).up, true);
  });

  it('a backend that accepts and never answers is down after the probe timeout; each probe has its own connection, closed after it', async () => {
    await until_up(silent_url, false, 'no answer within 300 ms');
    await poll(() => silent.conns.filter((c) => c.closed).length >= 3, { what: 'three probe connections closed by sluice' });
    // Prior knowledge: every connection opens with the HTTP/2 client preface.
    for (const c of silent.conns.filter((x) => x.closed)) {
      assert.equal(c.first.subarray(0, 24).toString('latin1'), 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
    }
  });
});
