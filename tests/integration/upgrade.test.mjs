// Restart without dropping (issue 19, docs/architecture.md §6a): SIGUSR2 re-executes
// the program file -- a file replaced since the start is what runs -- with
// the listening sockets inherited; once the new process serves, the old one
// stops accepting, drains its streams and exits 0. A new binary that fails
// leaves the old one serving. And systemd's socket activation: a listening
// socket passed as fd 3 with LISTEN_FDS / LISTEN_PID is served on.
//
// sluice runs from a copy of build/sluice in a temp folder, so the test can
// replace that file. The new process is a child of the old one, not of this
// test: its pid comes from the old one's log line and the test stops it.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import http2 from 'node:http2';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { after, afterEach, before, describe, it } from 'node:test';

import {
  bound_ms, chat_body, http_post, managed_process, mock_model, program, repo_root, sse_events, start_mock_vllm, start_streams, stop_all,
  test_key, with_timeout,
} from './lib/harness.mjs';
import { make_test_ca } from './lib/test_ca.mjs';

// Processes started by an upgrade: not this test's children, so stopped here.
const adopted = new Set();
function stop_adopted() {
  for (const pid of adopted) {
    try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
  }
  adopted.clear();
}
process.on('exit', stop_adopted);

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// Waits (bounded) for a pid that is not this test's child to go away.
async function until_gone(pid, what) {
  await with_timeout(new Promise((resolve) => {
    const look = () => (alive(pid) ? setTimeout(look, 20) : resolve());
    look();
  }), bound_ms(15000), what);
}

// Copies build/sluice to `file` through a temp name and a rename, as a
// package upgrade does: the running process keeps the old inode.
function install_binary(file, source = program('sluice')) {
  const next = `${file}.next`;
  fs.copyFileSync(source, next);
  fs.chmodSync(next, 0o755);
  fs.renameSync(next, file);
  return fs.statSync(file).ino;
}

function install_script(file, text) {
  const next = `${file}.next`;
  fs.writeFileSync(next, text, { mode: 0o755 });
  fs.renameSync(next, file);
}

// Replaces `dir`/sluice with a script that waits for a line on a FIFO (the
// test writes it when it wants the new process to go on), then execs a copy
// of build/sluice with its arguments. Returns the FIFO's path.
function install_gated_binary(dir) {
  const fifo = path.join(dir, 'go');
  const real = path.join(dir, 'sluice-real');
  execFileSync('mkfifo', [fifo]);
  fs.copyFileSync(program('sluice'), real);
  fs.chmodSync(real, 0o755);
  install_script(path.join(dir, 'sluice'), `#!/bin/sh\nread go < '${fifo}'\nexec '${real}' "$@"\n`);
  return fifo;
}

// sluice from `dir`/sluice on `config`. Resolves with the process, its
// port, its admin port and `exited_pid`: a promise of the old process's own
// exit (the output pipes stay open while the new one runs, so the harness's
// `exited`, which waits for them, is not that).
async function start_from(dir, config, { stdio, env } = {}) {
  fs.writeFileSync(path.join(dir, 'sluice.toml'), config);
  const proc = new managed_process('sluice', path.join(dir, 'sluice'), ['--config', path.join(dir, 'sluice.toml')], { cwd: dir, env, stdio });
  const exited_pid = new Promise((resolve) => proc.child.on('exit', (code, signal) => resolve({ code, signal })));
  const listen = await proc.wait_for_line(/sluice listening on http:\/\/127\.0\.0\.1:(\d+)/, { timeout_ms: bound_ms(10000) });
  const admin = await proc.wait_for_line(/sluice admin on http:\/\/127\.0\.0\.1:(\d+)/, { timeout_ms: bound_ms(10000) });
  return { proc, exited_pid, url: `http://127.0.0.1:${listen.match[1]}`, admin_url: `http://127.0.0.1:${admin.match[1]}` };
}

// Two groups: slow streams (model mock-model: the ones the upgrade must not
// cut, compared byte for byte with the same request sent to the backend
// directly) and fast answers (model "fast") for the steady load.
function two_group_config(slow, fast, { listen = '127.0.0.1:0', server = [] } = {}) {
  return [
    '[server]', `listen = "${listen}"`, 'admin = "127.0.0.1:0"', 'drain_timeout_ms = 30000', ...server, '',
    '[audit]', 'path = "sluice-audit.jsonl"', '',
    '[[group]]', 'name = "slow"', `models = ["${mock_model}"]`, `backend_model = "${mock_model}"`, `backends = ["${slow}"]`, '',
    '[[group]]', 'name = "fast"', 'models = ["fast"]', `backend_model = "${mock_model}"`, `backends = ["${fast}"]`, '',
    '[[key]]', 'id = "test"', `key = "${test_key}"`, 'groups = ["*"]', '',
  ].join('\n');
}

const auth = { authorization: `Bearer ${test_key}` };

async function get_status(url) {
  const res = await fetch(url, { headers: auth });
  await res.arrayBuffer();
  return res.status;
}

// `loops` keep-alive clients sending requests back to back until stop();
// every failure (status, reset, hang-up) is kept.
function steady_load(base_url, loops) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: loops });
  const state = { ok: 0, failures: [], stopped: false };
  const body = chat_body({ model: 'fast', max_tokens: 4, content: 'load' });
  const runs = Array.from({ length: loops }, async (_, l) => {
    for (let i = 0; !state.stopped; ++i) {
      try {
        const r = await http_post(base_url, '/v1/chat/completions', body, { agent, headers: auth, timeout_ms: bound_ms(15000) });
        if (r.status === 200 && r.complete && JSON.parse(r.text).choices?.length === 1) {
          ++state.ok;
        } else {
          state.failures.push(`loop ${l} #${i}: status ${r.status} complete ${r.complete}: ${r.text.slice(0, 200)}`);
        }
      } catch (err) {
        state.failures.push(`loop ${l} #${i}: ${err.code ?? ''} ${err.message}`);
      }
    }
  });
  return {
    state,
    until_ok: (n) => with_timeout(new Promise((resolve) => {
      const look = () => (state.ok >= n ? resolve() : setTimeout(look, 10));
      look();
    }), bound_ms(20000), `${n} load requests to succeed (${state.ok} did; failures: ${state.failures.slice(0, 3)})`),
    async stop() {
      state.stopped = true;
      await Promise.all(runs);
      agent.destroy();
      return state;
    },
  };
}

// The hooks of a describe whose tests run one sluice from a copy of the
// binary (with `server` lines added to its config) on one mock-vllm.
// Returns the object its before() fills: {mock, dir, sluice}.
function gateway_from_copy(server = [], mock_options = {}) {
  const g = {};
  before(async () => {
    g.mock = await start_mock_vllm(mock_options);
    g.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-upgrade-'));
    install_binary(path.join(g.dir, 'sluice'));
    g.sluice = await start_from(g.dir, two_group_config(g.mock.url, g.mock.url, { server }));
  });
  afterEach(() => stop_adopted());
  after(async () => {
    await stop_all(g.sluice?.proc, g.mock);
    if (g.dir) fs.rmSync(g.dir, { recursive: true, force: true });
  });
  return g;
}

// wrk (Debian's) as a second, independent load: keep-alive connections
// back to back for `seconds`; resolves with its WRK_RESULT counts
// (bench/wrk/report.lua). A connection reset, a read or write error, a
// timeout or a status >= 400 is counted in `errors`.
const wrk_script = path.join(repo_root, 'bench', 'wrk', 'chat.lua');
const wrk_children = new Set();
function start_wrk(base_url, seconds, connections = 8) {
  const child = spawn('wrk', ['-t', '1', '-c', String(connections), '-d', `${seconds}s`, '--timeout', '10s', '-s', wrk_script,
    `${base_url}/v1/chat/completions`, '--', 'model=fast', 'max_tokens=4', `key=${test_key}`], { stdio: ['ignore', 'pipe', 'pipe'] });
  wrk_children.add(child);
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { out += d; });
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => {
      wrk_children.delete(child);
      const line = out.split('\n').find((l) => l.startsWith('WRK_RESULT'));
      if (code !== 0 || !line) return reject(new Error(`wrk exited ${code}: ${out}`));
      resolve(Object.fromEntries(line.split(' ').slice(1).map((kv) => kv.split('=')).map(([k, v]) => [k, Number(v)])));
    });
  });
}

describe('SIGUSR2 under load', () => {
  let slow, fast, sluice, dir;
  const streams = 200;

  before(async () => {
    // 30 tokens at 15/s: each stream runs about two seconds, well past the
    // moment the upgrade hands over.
    slow = await start_mock_vllm({ tokens_per_sec: 15, reply_tokens: 30 });
    fast = await start_mock_vllm({});
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-upgrade-'));
    install_binary(path.join(dir, 'sluice'));
    sluice = await start_from(dir, two_group_config(slow.url, fast.url));
  });
  after(async () => {
    for (const c of wrk_children) c.kill('SIGKILL');
    stop_adopted();
    await stop_all(sluice?.proc, slow, fast);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it(`a replaced binary takes over: ${streams} streams complete, no request fails`, async () => {
    const old_pid = sluice.proc.child.pid;
    const body = (i) => chat_body({ stream: true, max_tokens: 30, content: `upgrade ${i}` });
    const expected = Promise.all(Array.from({ length: streams }, (_, i) => http_post(
      slow.url, '/v1/chat/completions', body(i), { headers: { 'x-request-id': `upg-${i}` }, timeout_ms: bound_ms(30000) })));

    const agent = new http.Agent({ keepAlive: true, maxSockets: streams });
    const { replies, until_started } = start_streams(sluice.url, streams, body, {
      agent, headers: (i) => ({ ...auth, 'x-request-id': `upg-${i}` }),
    });
    await until_started();
    const load = steady_load(sluice.url, 8);
    await load.until_ok(50);
    // wrk runs across the whole handover (it is 1-3 s here).
    const wrk_done = start_wrk(sluice.url, Math.ceil(bound_ms(6000) / 1000));
    await load.until_ok(load.state.ok + 50);

    const ino = install_binary(path.join(dir, 'sluice'));
    const from = sluice.proc.mark();
    process.kill(old_pid, 'SIGUSR2');
    const serving = await sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    const new_pid = Number(serving.match[1]);
    adopted.add(new_pid);
    assert.notEqual(new_pid, old_pid);
    // The new process runs the new file; the old one the file it replaced.
    assert.equal(fs.readlinkSync(`/proc/${new_pid}/exe`), path.join(dir, 'sluice'));
    assert.equal(fs.statSync(`/proc/${new_pid}/exe`).ino, ino);

    const old_exit = await with_timeout(sluice.exited_pid, bound_ms(20000), 'the old process to exit');
    assert.deepEqual(old_exit, { code: 0, signal: null }, sluice.proc.output());
    // Load goes on against the new process alone.
    const ok_at_exit = load.state.ok;
    await load.until_ok(ok_at_exit + 100);
    const { ok, failures } = await load.stop();
    agent.destroy();

    const results = await Promise.all(replies);
    const want = await expected;
    for (let i = 0; i < streams; ++i) {
      const r = results[i];
      assert.equal(r.status, 200, `stream ${i}`);
      assert.equal(r.complete, true, `stream ${i} completed`);
      assert.equal(sse_events(r.text).at(-1), '[DONE]', `stream ${i} ends with [DONE]`);
      assert.equal(r.text, want[i].text, `stream ${i} has the full content`);
    }
    const wrk = await with_timeout(wrk_done, bound_ms(30000), 'wrk to finish');
    console.log(`upgrade under load: ${ok} load requests, ${failures.length} failed; wrk ${wrk.requests} requests, ` +
      `${wrk.errors} errors; old pid ${old_pid} -> new pid ${new_pid}`);
    assert.deepEqual(failures, [], 'no load request failed or was reset');
    assert.ok(wrk.requests > 100, `wrk sent ${wrk.requests} requests`);
    assert.equal(wrk.errors, 0, `wrk: connect ${wrk.err_connect}, read ${wrk.err_read}, write ${wrk.err_write}, ` +
      `status ${wrk.err_status}, timeout ${wrk.err_timeout}`);
    assert.ok(alive(new_pid), 'the new process runs on');
    assert.equal(await get_status(`${sluice.admin_url}/healthz`), 200, 'the admin listener was handed over too');

    // The new process drains and exits on SIGTERM as any other.
    process.kill(new_pid, 'SIGTERM');
    await until_gone(new_pid, 'the new process to exit on SIGTERM');
    adopted.delete(new_pid);
  });
});

describe('SIGUSR2 with a new binary that fails', () => {
  const g = gateway_from_copy();
  let sluice, dir;
  before(() => ({ sluice, dir } = g));

  const chat = () => http_post(sluice.url, '/v1/chat/completions', chat_body({ model: 'fast' }), { headers: auth });

  it('a binary that exits 1: logged, the old process serves on', async () => {
    install_script(path.join(dir, 'sluice'), '#!/bin/sh\necho "not a gateway" >&2\nexit 1\n');
    const from = sluice.proc.mark();
    process.kill(sluice.proc.child.pid, 'SIGUSR2');
    await sluice.proc.wait_for_line(/SIGUSR2: the new process \(pid \d+\) exited before it served; this process serves on/, { from });
    await sluice.proc.wait_for_line(/SIGUSR2: pid \d+ exited with status 1/, { from });
    assert.equal(sluice.proc.exit, null, 'the old process runs on');
    assert.equal((await chat()).status, 200);
  });

  it('a missing binary: the exec error is logged, the old process serves on', async () => {
    fs.rmSync(path.join(dir, 'sluice'));
    const from = sluice.proc.mark();
    process.kill(sluice.proc.child.pid, 'SIGUSR2');
    await sluice.proc.wait_for_line(/SIGUSR2: the new process \(pid \d+\) could not be started: exec .*: No such file or directory/, { from });
    assert.equal((await chat()).status, 200);
  });

  it('a second SIGUSR2 while one is in progress is ignored; the first then completes', async () => {
    // The new "binary" waits for this test (on a FIFO), then runs sluice.
    const fifo = install_gated_binary(dir);
    const old_pid = sluice.proc.child.pid;
    const from = sluice.proc.mark();
    process.kill(old_pid, 'SIGUSR2');
    await sluice.proc.wait_for_line(/SIGUSR2: started .* as pid \d+/, { from });
    process.kill(old_pid, 'SIGUSR2');
    await sluice.proc.wait_for_line(/SIGUSR2: an upgrade is in progress \(pid \d+\); ignored/, { from });
    assert.equal((await chat()).status, 200, 'the old process serves while it waits');
    await fs.promises.writeFile(fifo, 'go\n');
    const serving = await sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    adopted.add(Number(serving.match[1]));
    const starts = sluice.proc.lines.slice(from).filter((l) => /SIGUSR2: started/.test(l.text));
    assert.equal(starts.length, 1, 'one new process was started');
    assert.deepEqual(await with_timeout(sluice.exited_pid, bound_ms(10000), 'the old process to exit'), { code: 0, signal: null });
    assert.equal((await chat()).status, 200, 'the new process serves');
  });
});

describe('SIGUSR2 with a TLS listener', () => {
  const ca = make_test_ca();
  after(() => ca.remove());
  const g = gateway_from_copy(['listen_tls = "127.0.0.1:0"', `tls_cert = "${ca.chain}"`, `tls_key = "${ca.key}"`]);
  let sluice, dir;
  before(() => ({ sluice, dir } = g));

  // One request over TLS on a fresh connection. Resolves the response text.
  function tls_chat(port) {
    return new Promise((resolve, reject) => {
      const s = tls.connect({ port, host: '127.0.0.1', servername: 'localhost', ca: ca.ca_pem, ALPNProtocols: ['http/1.1'] });
      const parts = [];
      s.on('secureConnect', () => {
        const body = JSON.stringify(chat_body({ model: 'fast', max_tokens: 4 }));
        s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${test_key}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      });
      s.on('data', (d) => parts.push(d));
      s.on('error', reject);
      s.on('close', () => resolve(Buffer.concat(parts).toString()));
    });
  }

  it('the TLS listener is handed over too', async () => {
    const line = await sluice.proc.wait_for_line(/sluice listening on https:\/\/127\.0\.0\.1:(\d+)/);
    const tls_port = Number(line.match[1]);
    assert.match(await tls_chat(tls_port), /^HTTP\/1\.1 200 /);
    install_binary(path.join(dir, 'sluice'));
    const from = sluice.proc.mark();
    process.kill(sluice.proc.child.pid, 'SIGUSR2');
    const serving = await sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    adopted.add(Number(serving.match[1]));
    const again = await sluice.proc.wait_for_line(/sluice listening on https:\/\/127\.0\.0\.1:(\d+)/, { from });
    assert.equal(Number(again.match[1]), tls_port, 'the new process took the same TLS socket');
    assert.deepEqual(await with_timeout(sluice.exited_pid, bound_ms(10000), 'the old process to exit'), { code: 0, signal: null });
    assert.match(await tls_chat(tls_port), /^HTTP\/1\.1 200 /, 'the new process serves TLS');
  });
});

describe('SIGUSR2 with an HTTP/2 stream open', () => {
  // 20 tokens at 20/s: the stream runs a second, across the handover.
  const g = gateway_from_copy([], { tokens_per_sec: 20, reply_tokens: 20 });

  // One chat stream on `session`. Resolves {status, text}; `first` once its
  // first body bytes came.
  function h2_stream(session) {
    let first;
    const flowing = new Promise((resolve) => { first = resolve; });
    const done = new Promise((resolve, reject) => {
      const req = session.request({ ':method': 'POST', ':path': '/v1/chat/completions', ...auth, 'content-type': 'application/json' });
      let status = 0;
      let text = '';
      req.on('response', (h) => { status = h[':status']; });
      req.setEncoding('utf8');
      req.on('data', (d) => { text += d; first(); });
      req.on('end', () => resolve({ status, text }));
      req.on('error', reject);
      req.end(JSON.stringify(chat_body({ stream: true, max_tokens: 20, content: 'h2 upgrade' })));
    });
    return { flowing, done };
  }

  it('the stream completes on the old process, which sends GOAWAY; a new session reaches the new one', async () => {
    const session = http2.connect(g.sluice.url);
    const goaway = new Promise((resolve) => session.on('goaway', resolve));
    const s = h2_stream(session);
    await with_timeout(s.flowing, bound_ms(10000), 'the stream to start');
    install_binary(path.join(g.dir, 'sluice'));
    const from = g.sluice.proc.mark();
    process.kill(g.sluice.proc.child.pid, 'SIGUSR2');
    const serving = await g.sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    adopted.add(Number(serving.match[1]));
    await with_timeout(goaway, bound_ms(10000), 'GOAWAY from the old process');
    const r = await with_timeout(s.done, bound_ms(10000), 'the stream to end');
    session.close();
    assert.equal(r.status, 200);
    assert.equal(sse_events(r.text).at(-1), '[DONE]');
    assert.match(r.text, /tok19/, 'the whole reply came');
    assert.deepEqual(await with_timeout(g.sluice.exited_pid, bound_ms(10000), 'the old process to exit'), { code: 0, signal: null });
    const next = http2.connect(g.sluice.url);
    const again = await with_timeout(h2_stream(next).done, bound_ms(10000), 'a stream on the new process');
    next.close();
    assert.equal(again.status, 200);
    assert.equal(sse_events(again.text).at(-1), '[DONE]');
  });
});

// The CPUs this test may run on (its affinity), as sluice's cpu lists name them.
function allowed_cpus() {
  const list = fs.readFileSync('/proc/self/status', 'utf8').match(/^Cpus_allowed_list:\s*(\S+)/m)[1];
  return list.split(',').flatMap((part) => {
    const [a, b = a] = part.split('-').map(Number);
    return Array.from({ length: b - a + 1 }, (_, i) => a + i);
  });
}

describe('SIGUSR2 with a different shard count', () => {
  const cpus = allowed_cpus();
  const g = gateway_from_copy([`cpus = "${cpus[0]}"`]);
  const skip = cpus.length < 2 && 'needs two CPUs to change the shard count';

  // Rewrites the config's cpu list, upgrades, and waits until the old
  // process has exited. Returns the new process's shard count.
  async function upgrade_to(proc_pid, cpu_list) {
    const file = path.join(g.dir, 'sluice.toml');
    fs.writeFileSync(file, fs.readFileSync(file, 'utf8').replace(/^cpus = .*$/m, `cpus = "${cpu_list}"`));
    const from = g.sluice.proc.mark();
    process.kill(proc_pid, 'SIGUSR2');
    const serving = await g.sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    const pid = Number(serving.match[1]);
    adopted.add(pid);
    const line = await g.sluice.proc.wait_for_line(/sluice listening on http:\/\/127\.0\.0\.1:\d+ \((\d+) shards?\)/, { from });
    await until_gone(proc_pid, `pid ${proc_pid} to exit`);
    return { pid, shards: Number(line.match[1]) };
  }

  // Fresh connections, so that the kernel spreads them over every socket
  // of the group: each one is answered.
  async function all_served(n) {
    for (let i = 0; i < n; ++i) {
      const r = await http_post(g.sluice.url, '/v1/chat/completions', chat_body({ model: 'fast' }),
        { headers: { ...auth, connection: 'close' } });
      assert.equal(r.status, 200, `request ${i}`);
    }
  }

  it('one shard to two binds a socket into the group; two to one closes the extra', { skip }, async () => {
    const one_to_two = await upgrade_to(g.sluice.proc.child.pid, `${cpus[0]},${cpus[1]}`);
    assert.equal(one_to_two.shards, 2);
    await all_served(40);
    const from = g.sluice.proc.mark();
    const two_to_one = await upgrade_to(one_to_two.pid, `${cpus[0]}`);
    assert.equal(two_to_one.shards, 1);
    await g.sluice.proc.wait_for_line(/inherited fd \d+ \(listen\.1\): no listener of this config takes it; closed/, { from });
    await all_served(40);
  });
});

describe('SIGTERM while an upgrade is under way', () => {
  const g = gateway_from_copy();
  let sluice, dir;
  before(() => ({ sluice, dir } = g));

  it('the old process drains without shutting the sockets the new one inherits', async () => {
    const fifo = install_gated_binary(dir);
    const from = sluice.proc.mark();
    process.kill(sluice.proc.child.pid, 'SIGUSR2');
    const started = await sluice.proc.wait_for_line(/SIGUSR2: started .* as pid (\d+)/, { from });
    adopted.add(Number(started.match[1]));
    sluice.proc.child.kill('SIGTERM');
    assert.deepEqual(await with_timeout(sluice.exited_pid, bound_ms(10000), 'the old process to exit'), { code: 0, signal: null });
    await fs.promises.writeFile(fifo, 'go\n');
    const listening = await sluice.proc.wait_for_line(/sluice listening on (http:\/\/127\.0\.0\.1:\d+)/, { from, timeout_ms: bound_ms(10000) });
    assert.equal(listening.match[1], sluice.url);
    const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ model: 'fast' }), { headers: auth });
    assert.equal(r.status, 200, 'the new process serves on the inherited socket');
  });
});

describe('socket activation (LISTEN_FDS)', () => {
  let mock, dir;
  const procs = [];

  before(async () => {
    mock = await start_mock_vllm({});
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-activation-'));
    install_binary(path.join(dir, 'sluice'));
  });
  after(async () => {
    await stop_all(...procs, mock);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  // A listening socket made here, as systemd would: its fd, then the
  // server closed here once the child has its copy (so this process never
  // accepts on it).
  async function listening_socket() {
    const server = net.createServer();
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    return { server, fd: server._handle.fd, port: server.address().port };
  }

  // sluice started through sh, so that LISTEN_PID can be its own pid
  // (sh's, kept by exec), with the socket as fd 3.
  function spawn_activated(sock, { pid_expr = '$$' } = {}) {
    fs.writeFileSync(path.join(dir, 'sluice.toml'), two_group_config(mock.url, mock.url, { listen: `127.0.0.1:${sock.port}` }));
    const proc = new managed_process('sluice', '/bin/sh', ['-c', `LISTEN_FDS=1 LISTEN_PID=${pid_expr} exec ./sluice --config sluice.toml`],
      { cwd: dir, stdio: ['ignore', 'pipe', 'pipe', sock.fd] });
    procs.push(proc);
    sock.server.close();
    return proc;
  }

  it('requests on the socket systemd passed are served, on every shard', async () => {
    const sock = await listening_socket();
    const proc = spawn_activated(sock);
    const listening = await proc.wait_for_line(/sluice listening on http:\/\/127\.0\.0\.1:(\d+) \((\d+) shards?\)/, { timeout_ms: bound_ms(10000) });
    assert.equal(Number(listening.match[1]), sock.port);
    // The admin listener (port 0 in the config) binds its own: a passed
    // socket matches a listener by its exact address only.
    const admin = await proc.wait_for_line(/sluice admin on (http:\/\/127\.0\.0\.1:(\d+))/);
    assert.notEqual(Number(admin.match[2]), sock.port);
    assert.equal(await get_status(`${admin.match[1]}/healthz`), 200);
    // Fresh connections: whichever shard takes each, it is answered.
    for (let i = 0; i < 20; ++i) {
      const r = await http_post(`http://127.0.0.1:${sock.port}`, '/v1/chat/completions', chat_body({ model: 'fast' }),
        { headers: { ...auth, connection: 'close' } });
      assert.equal(r.status, 200, `request ${i}`);
    }
    const exit = await proc.stop();
    assert.deepEqual(exit, { code: 0, signal: null }, proc.output());
  });

  it('LISTEN_FDS meant for another pid is not taken', async () => {
    const sock = await listening_socket();
    // The socket is open in sluice (fd 3) but not its to take: it binds
    // its own and finds the port in use.
    const proc = spawn_activated(sock, { pid_expr: '1' });
    const exit = await with_timeout(proc.exited, bound_ms(10000), 'sluice to refuse the port');
    assert.notEqual(exit.code, 0);
    assert.match(proc.output(), /cannot listen on 127\.0\.0\.1:\d+: Address already in use/);
  });
});

// systemd's notify socket, played by a datagram socket that prints each
// line it gets with the sender's pid (SCM_CREDENTIALS): "PID LINE".
const notify_listener_script = `
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
s.bind(sys.argv[1])
print("listening", flush=True)
while True:
    msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
    pid = -1
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", data[:12])[0]
    for line in msg.decode().split("\\n"):
        print(pid, line, flush=True)
`;

describe('SIGUSR2 under systemd (NOTIFY_SOCKET)', () => {
  let mock, dir, listener, sluice;

  before(async () => {
    mock = await start_mock_vllm();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-notify-'));
    install_binary(path.join(dir, 'sluice'));
    listener = new managed_process('notify', '/usr/bin/python3', ['-c', notify_listener_script, path.join(dir, 'notify')]);
    await listener.wait_for_line(/^listening$/, { timeout_ms: bound_ms(10000) });
  });
  afterEach(() => stop_adopted());
  after(async () => {
    await stop_all(sluice?.proc, listener, mock);
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  const notified = (pid, what) => new RegExp(`^${pid} ${what}$`);

  it('READY=1 once serving; the old process names the new one (MAINPID=) when it serves; STOPPING=1 at SIGTERM', async () => {
    sluice = await start_from(dir, two_group_config(mock.url, mock.url), { env: { NOTIFY_SOCKET: path.join(dir, 'notify') } });
    const old_pid = sluice.proc.child.pid;
    await listener.wait_for_line(notified(old_pid, 'READY=1'), { timeout_ms: bound_ms(10000) });
    assert.equal(await get_status(`${sluice.url}/v1/models`), 200, 'it serves once it said so');

    install_binary(path.join(dir, 'sluice'));
    const from = sluice.proc.mark();
    const heard = listener.mark();
    process.kill(old_pid, 'SIGUSR2');
    const serving = await sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    const new_pid = Number(serving.match[1]);
    adopted.add(new_pid);
    await listener.wait_for_line(notified(old_pid, `MAINPID=${new_pid}`), { from: heard, timeout_ms: bound_ms(10000) });
    assert.deepEqual(await with_timeout(sluice.exited_pid, bound_ms(15000), 'the old process to exit'), { code: 0, signal: null });
    // The new process was not the main one when it became ready: the old
    // one spoke for it, and it sent nothing itself.
    assert.deepEqual(listener.lines.slice(heard).map((l) => l.text).filter((t) => t.startsWith(`${new_pid} `)), []);
    assert.equal(await get_status(`${sluice.url}/v1/models`), 200, 'the new process serves');

    const stop_from = listener.mark();
    process.kill(new_pid, 'SIGTERM');
    await listener.wait_for_line(notified(new_pid, 'STOPPING=1'), { from: stop_from, timeout_ms: bound_ms(10000) });
    await until_gone(new_pid, 'the new process to stop');
    adopted.delete(new_pid);
  });
});

describe('SIGUSR2 with budgets kept in the state file', () => {
  let slow, sluice, dir;
  before(async () => {
    // 30 tokens at 15/s: the streams run on in the old process well after it handed over.
    slow = await start_mock_vllm({ tokens_per_sec: 15, reply_tokens: 30 });
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-upgrade-budget-'));
    install_binary(path.join(dir, 'sluice'));
    const config = two_group_config(slow.url, slow.url)
      .replace('[[key]]', '[quota]\nbudget_state_file = "budgets.json"\n\n[[key]]') + 'daily_tokens = 1000000\n';
    sluice = await start_from(dir, config);
  });
  after(async () => {
    stop_adopted();
    await stop_all(sluice?.proc, slow);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('the tokens the old process settles during its drain are in the new one\'s budget (= the audit log)', async () => {
    const old_pid = sluice.proc.child.pid;
    // Some use before the upgrade (in the file by the time the new one loads it) ...
    for (let i = 0; i < 3; ++i) {
      const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ model: 'fast', max_tokens: 4 }), { headers: auth });
      assert.equal(r.status, 200);
    }
    // ... and 8 streams that end only after the hand-over.
    const body = (i) => chat_body({ stream: true, max_tokens: 30, content: `budget ${i}` });
    const agent = new http.Agent({ keepAlive: false });
    const { replies, until_started } = start_streams(sluice.url, 8, body, { agent, headers: () => auth });
    await until_started();
    const from = sluice.proc.mark();
    process.kill(old_pid, 'SIGUSR2');
    const serving = await sluice.proc.wait_for_line(/SIGUSR2: pid (\d+) serves/, { from, timeout_ms: bound_ms(10000) });
    const new_pid = Number(serving.match[1]);
    adopted.add(new_pid);
    const results = await Promise.all(replies);
    for (const r of results) assert.equal(sse_events(r.text).at(-1), '[DONE]');
    assert.deepEqual(await with_timeout(sluice.exited_pid, bound_ms(20000), 'the old process to exit'), { code: 0, signal: null });
    agent.destroy();
    // Every request's tokens, as the audit log of both processes has them.
    const lines = fs.readFileSync(path.join(dir, 'sluice-audit.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    assert.equal(lines.length, 11);
    const audited = lines.reduce((n, l) => n + l.total_tokens, 0);
    const shown = () => fetch(`${sluice.admin_url}/keys/test`).then((r) => r.json()).then((j) => j.budgets.daily_tokens.used);
    let used = 0;
    await with_timeout((async () => {
      while ((used = await shown()) !== audited) await new Promise((resolve) => setTimeout(resolve, 50));
    })(), bound_ms(10000), `the new process's budget to show the audit's ${audited} tokens (it shows ${used})`);
    assert.ok(!fs.existsSync(path.join(dir, 'budgets.json.handover')), 'the hand-over was taken');
    process.kill(new_pid, 'SIGTERM');
    await until_gone(new_pid, 'the new process to exit on SIGTERM');
    adopted.delete(new_pid);
  });
});
