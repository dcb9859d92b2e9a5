// Process and socket helpers for the integration tests.
//
// Every server a test needs (mock-vllm, sluice) is a child process started on
// port 0; its "listening" line tells us the port. Nothing here sleeps and
// hopes: every wait is on an event (a line, a response, an exit) and every
// wait is bounded, so a broken server fails a test with its output instead of
// hanging the suite.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const repo_root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

export function build_dir() {
  return path.resolve(process.env.SLUICE_BUILD_DIR ?? path.join(repo_root, 'build'));
}

// A built program: <build>/NAME, else where meson puts a program built in a
// subfolder (<build>/tools/NAME/NAME).
export function program(name) {
  const top = path.join(build_dir(), name);
  const nested = path.join(build_dir(), 'tools', name, name);
  return !fs.existsSync(top) && fs.existsSync(nested) ? nested : top;
}

// Slower builds (ASan) get proportionally longer bounds; latency asserts that
// the issue fixes (100 ms) stay as they are.
export const slow_factor = Number(process.env.SLUICE_SLOW_FACTOR ?? '1') || 1;
export const bound_ms = (ms) => Math.ceil(ms * slow_factor);

export function with_timeout(promise, timeout_ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeout_ms} ms waiting for ${what}`)), timeout_ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// ---------------------------------------------------------------------------
// Child processes

const live = new Set();

// Last-resort cleanup: whatever a test forgot (or a crash skipped) is killed
// when this test process ends, so no server outlives the run.
function kill_all_now() {
  for (const p of live) {
    try { p.child.kill('SIGKILL'); } catch { /* already gone */ }
  }
  live.clear();
}
process.on('exit', kill_all_now);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => { kill_all_now(); process.exit(128 + os.constants.signals[sig]); });
}

export class managed_process {
  // `stdio`: spawn's, for a child that gets more fds (its first three
  // must stay 'ignore', 'pipe', 'pipe': the output is collected).
  constructor(name, file, args, { cwd, env, stdio = ['ignore', 'pipe', 'pipe'] } = {}) {
    this.name = name;
    this.file = file;
    this.args = args;
    this.lines = [];          // {stream, text, at_ms} in arrival order
    this._waiters = [];
    this.exit = null;         // {code, signal} once exited
    if (!fs.existsSync(file)) {
      throw new Error(`${name}: ${file} does not exist (build first: meson setup build && meson compile -C build; or set SLUICE_BUILD_DIR)`);
    }
    this.child = spawn(file, args, { cwd, env: { ...process.env, ...env }, stdio });
    live.add(this);
    this.exited = new Promise((resolve) => {
      // 'close' comes after the output pipes are drained, so the output
      // shown with an exit is complete.
      this.child.on('close', (code, signal) => {
        this.exit = { code, signal };
        live.delete(this);
        resolve(this.exit);
        this._notify();
      });
      this.child.on('error', (err) => {
        this.exit = { code: null, signal: null, error: err };
        live.delete(this);
        resolve(this.exit);
        this._notify();
      });
    });
    this._collect(this.child.stdout, 'stdout');
    this._collect(this.child.stderr, 'stderr');
  }

  _collect(stream, which) {
    let partial = '';
    stream.setEncoding('utf8');
    stream.on('data', (text) => {
      const at_ms = performance.now();
      partial += text;
      let nl;
      while ((nl = partial.indexOf('\n')) >= 0) {
        this.lines.push({ stream: which, text: partial.slice(0, nl).replace(/\r$/, ''), at_ms });
        partial = partial.slice(nl + 1);
      }
      this._notify();
    });
    stream.on('end', () => {
      if (partial) this.lines.push({ stream: which, text: partial, at_ms: performance.now() });
      partial = '';
      this._notify();
    });
  }

  _notify() {
    for (const w of [...this._waiters]) w();
  }

  // The index of the next line to arrive: pass it as `from` to wait only for
  // lines printed after this point.
  mark() {
    return this.lines.length;
  }

  output() {
    return this.lines.map((l) => `[${this.name} ${l.stream}] ${l.text}`).join('\n');
  }

  // Resolves with {line, match} for the first line (index >= from) matching
  // `pattern`; rejects with the process's output if it exits first or the
  // bound passes.
  wait_for_line(pattern, { from = 0, timeout_ms = bound_ms(5000), stream } = {}) {
    return new Promise((resolve, reject) => {
      let next = from;
      let timer = null;
      const finish = (fn, value) => {
        clearTimeout(timer);
        this._waiters = this._waiters.filter((w) => w !== check);
        fn(value);
      };
      const check = () => {
        for (; next < this.lines.length; ++next) {
          const line = this.lines[next];
          if (stream && line.stream !== stream) continue;
          const match = line.text.match(pattern);
          if (match) return finish(resolve, { line, match, index: next });
        }
        if (this.exit) {
          finish(reject, new Error(`${this.name} exited (${JSON.stringify(this.exit)}) before printing ${pattern}; its output:\n${this.output()}`));
        }
      };
      timer = setTimeout(() => finish(reject, new Error(
        `${this.name} did not print ${pattern} within ${timeout_ms} ms; its output:\n${this.output()}`)), timeout_ms);
      this._waiters.push(check);
      check();
    });
  }

  // SIGTERM (or `signal`), then SIGKILL after kill_after_ms. Resolves with
  // the exit {code, signal}.
  async stop({ signal = 'SIGTERM', kill_after_ms = bound_ms(5000) } = {}) {
    if (this.exit) return this.exit;
    try { this.child.kill(signal); } catch { /* already gone */ }
    const timer = setTimeout(() => { try { this.child.kill('SIGKILL'); } catch { /* gone */ } }, kill_after_ms);
    const result = await this.exited;
    clearTimeout(timer);
    return result;
  }
}

// ---------------------------------------------------------------------------
// mock-vllm

export const mock_model = 'mock-model';
export const fixed_created = 1700000000;

export async function start_mock_vllm({
  port = 0, ttft_ms, tokens_per_sec, reply_tokens, fail_after_tokens,
  created = fixed_created, model = mock_model, api_key, extra_args = [],
} = {}) {
  const args = ['--port', String(port)];
  const opt = (flag, value) => { if (value !== undefined && value !== null) args.push(flag, String(value)); };
  opt('--ttft-ms', ttft_ms);
  opt('--tokens-per-sec', tokens_per_sec);
  opt('--reply-tokens', reply_tokens);
  opt('--fail-after-tokens', fail_after_tokens);
  opt('--created', created);
  opt('--model', model);
  opt('--api-key', api_key);
  args.push(...extra_args);
  const proc = new managed_process('mock-vllm', program('mock-vllm'), args);
  let listening;
  try {
    listening = await proc.wait_for_line(/mock-vllm listening on (http:\/\/127\.0\.0\.1:(\d+))/, { timeout_ms: bound_ms(10000) });
  } catch (err) {
    await proc.stop({ signal: 'SIGKILL' });
    throw err;
  }
  const url = listening.match[1];
  return {
    proc,
    url,
    port: Number(listening.match[2]),
    model,
    // What reached the backend from clients: sluice's own health probes
    // and /metrics scrapes are left out; all_requests() keeps them.
    async requests() {
      return (await this.all_requests()).filter((r) => !(r.method === 'GET' && (r.target === '/health' || r.target === '/metrics')));
    },
    async all_requests() {
      const res = await fetch(`${url}/debug/requests`);
      if (res.status !== 200) throw new Error(`GET /debug/requests: ${res.status}`);
      return res.json();
    },
    async clear_requests() {
      const res = await fetch(`${url}/debug/requests`, { method: 'DELETE' });
      await res.arrayBuffer();
      if (res.status >= 300) throw new Error(`DELETE /debug/requests: ${res.status}`);
    },
    stop(opts) { return proc.stop(opts); },
  };
}

// A mock-vllm again on the port a stopped one had. The port may be briefly
// taken meanwhile (another process's outgoing socket can get it as its
// local port): retried for a bounded time.
export async function restart_mock_vllm_on(port, options = {}) {
  const deadline = performance.now() + bound_ms(5000);
  for (;;) {
    try {
      return await start_mock_vllm({ ...options, port });
    } catch (err) {
      if (performance.now() > deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

// ---------------------------------------------------------------------------
// mock-triton

// Starts build/mock-triton (KServe v2 over gRPC) on an ephemeral port and
// waits for its listening line. `address` is "127.0.0.1:PORT", for
// @grpc/grpc-js clients.
export async function start_mock_triton({
  port = 0, ttft_ms, tokens_per_sec, reply_tokens, fail_after_tokens, fail_mode, fail_status,
  model = mock_model, not_ready = false, extra_args = [],
} = {}) {
  const args = ['--port', String(port)];
  const opt = (flag, value) => { if (value !== undefined && value !== null) args.push(flag, String(value)); };
  opt('--ttft-ms', ttft_ms);
  opt('--tokens-per-sec', tokens_per_sec);
  opt('--reply-tokens', reply_tokens);
  opt('--fail-after-tokens', fail_after_tokens);
  opt('--fail-mode', fail_mode);
  opt('--fail-status', fail_status);
  opt('--model', model);
  if (not_ready) args.push('--not-ready');
  args.push(...extra_args);
  const proc = new managed_process('mock-triton', program('mock-triton'), args);
  let listening;
  try {
    listening = await proc.wait_for_line(/mock-triton listening on grpc:\/\/(127\.0\.0\.1:(\d+))/, { timeout_ms: bound_ms(10000) });
  } catch (err) {
    await proc.stop({ signal: 'SIGKILL' });
    throw err;
  }
  return {
    proc,
    address: listening.match[1],
    url: `grpc://${listening.match[1]}`,
    port: Number(listening.match[2]),
    model,
    stop(opts) { return proc.stop(opts); },
  };
}

// ---------------------------------------------------------------------------
// sluice

// A complete TOML config for tests: one group "default" accepting any model
// on the given backends, key `test-key`. `server` adds [server] entries.
export function sluice_config({ backends, server = {}, upstream = {}, quota = {}, health = {}, audit_path = 'sluice-audit.jsonl' }) {
  const value = (v) => (typeof v === 'string' ? JSON.stringify(v) : String(v));
  const table = (obj) => Object.entries(obj).map(([k, v]) => `${k} = ${value(v)}`).join('\n');
  return [
    '[server]', table(server), '',
    '[upstream]', table(upstream), '',
    '[quota]', table(quota), '',
    // [health] only when asked for: callers may append their own table.
    ...(Object.keys(health).length > 0 ? ['[health]', table(health), ''] : []),
    '[audit]', `path = ${JSON.stringify(audit_path)}`, '',
    '[[group]]', 'name = "default"', 'models = ["*"]', 'balance = "round-robin"',
    `backends = [${backends.map((b) => JSON.stringify(b)).join(', ')}]`, '',
    '[[key]]', 'id = "test"', 'key = "test-key"', 'groups = ["*"]', '',
  ].join('\n');
}

export const test_key = 'test-key';

// Starts sluice in a fresh temp dir (its cwd: the audit file lands there).
// `config` is TOML text written to sluice.toml there; without it sluice runs
// on its embedded default plus --backend. `launcher`: a command that execs
// sluice in its own process, e.g. ['taskset', '-c', '0'] (the pid stays
// sluice's).
export async function start_sluice({ backends = [], config, extra_args = [], env, launcher = [] } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-it-'));
  const args = ['--listen', '127.0.0.1:0', '--admin', '127.0.0.1:0'];
  for (const b of backends) args.push('--backend', b);
  if (config !== undefined) {
    fs.writeFileSync(path.join(dir, 'sluice.toml'), config);
    args.push('--config', path.join(dir, 'sluice.toml'));
  }
  args.push(...extra_args);
  const proc = launcher.length === 0
    ? new managed_process('sluice', program('sluice'), args, { cwd: dir, env })
    : new managed_process('sluice', launcher[0], [...launcher.slice(1), program('sluice'), ...args], { cwd: dir, env });
  let listen, admin;
  try {
    listen = await proc.wait_for_line(/sluice listening on (http:\/\/127\.0\.0\.1:(\d+))/, { timeout_ms: bound_ms(10000) });
    admin = await proc.wait_for_line(/sluice admin on (http:\/\/127\.0\.0\.1:(\d+))/, { timeout_ms: bound_ms(10000) });
  } catch (err) {
    await proc.stop({ signal: 'SIGKILL' });
    fs.rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    proc,
    dir,
    url: listen.match[1],
    port: Number(listen.match[2]),
    admin_url: admin.match[1],
    admin_port: Number(admin.match[2]),
    async stop(opts) {
      const result = await proc.stop(opts);
      if (!process.env.SLUICE_KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true });
      return result;
    },
  };
}

// Stops every given server (null/undefined skipped); for after() hooks.
export async function stop_all(...servers) {
  await Promise.all(servers.filter(Boolean).map((s) => s.stop().catch(() => {})));
}

// ---------------------------------------------------------------------------
// Requests

export function chat_body({ model = mock_model, content = 'Say hello to the gateway.', max_tokens = 16, stream, include_usage, extra = {} } = {}) {
  const body = { model, messages: [{ role: 'user', content }], max_tokens, ...extra };
  if (stream !== undefined) body.stream = stream;
  if (include_usage !== undefined) body.stream_options = { include_usage };
  return body;
}

// Splits a decoded SSE body into its `data:` payloads.
export function sse_events(text) {
  return text.split('\n\n').filter((e) => e.length > 0).map((e) => e.replace(/^data: /, ''));
}

// The concatenated content of an SSE chat stream.
export function sse_content(text) {
  let out = '';
  for (const e of sse_events(text)) {
    if (e === '[DONE]') continue;
    const json = JSON.parse(e);
    for (const c of json.choices ?? []) out += c.delta?.content ?? c.text ?? '';
  }
  return out;
}

export function is_openai_error(json) {
  return json !== null && typeof json === 'object' && json.error !== null && typeof json.error === 'object' &&
    typeof json.error.message === 'string' && json.error.message.length > 0 &&
    typeof json.error.type === 'string' && 'param' in json.error && 'code' in json.error;
}

// POSTs JSON with node:http and reads the whole reply. `on_response` sees
// the response as soon as its head arrives; `on_data` each body piece (for
// tests that act mid-stream). Resolves {status, headers, text, complete}:
// complete=false when the body ended early (connection lost mid-body).
export function http_post(base_url, target, body, { headers = {}, agent, timeout_ms = bound_ms(10000), on_response, on_data, on_request } = {}) {
  const url = new URL(target, base_url);
  const payload = Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      method: 'POST',
      agent,
      headers: { 'content-type': 'application/json', 'content-length': payload.length, ...headers },
    });
    const timer = setTimeout(() => { req.destroy(new Error(`no complete reply to POST ${url} within ${timeout_ms} ms`)); }, timeout_ms);
    req.on('error', (err) => { clearTimeout(timer); reject(err); });
    req.on('response', (res) => {
      on_response?.(res, req);
      const parts = [];
      res.on('data', (d) => { parts.push(d); on_data?.(d, req, res); });
      const finish = (complete) => {
        clearTimeout(timer);
        resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(parts).toString('utf8'), complete });
      };
      res.on('error', () => {});  // reported through complete=false
      res.on('close', () => finish(res.complete));
    });
    on_request?.(req);
    req.end(payload);
  });
}

// Starts `count` chat POSTs of body(i) (streams, for tests that act while
// they run) with headers(i). Returns {replies, until_started}: the replies'
// promises (http_post's results) and a bounded wait until every stream has
// body bytes flowing.
export function start_streams(base_url, count, body, { agent, headers = () => ({}), timeout_ms = bound_ms(30000) } = {}) {
  let started = 0;
  let all_started;
  const all_started_promise = new Promise((resolve) => { all_started = resolve; });
  const replies = Array.from({ length: count }, (_, i) => {
    let counted = false;
    return http_post(base_url, '/v1/chat/completions', body(i), {
      agent,
      headers: headers(i),
      timeout_ms,
      on_data: () => {
        if (counted) return;
        counted = true;
        if (++started === count) all_started();
      },
    });
  });
  const until_started = (ms = bound_ms(10000)) => with_timeout(all_started_promise, ms, `all ${count} streams to start`)
    .catch((err) => { throw new Error(`${err.message} (${started} did)`); });
  return { replies, until_started };
}

export { raw_connection, raw_exchange, parse_response, build_request } from './raw_http.mjs';
