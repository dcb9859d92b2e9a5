// Helpers for the TLS and HTTP/2 tests (h2.test.mjs, h2_hostile.test.mjs,
// tls.test.mjs): sluice started with a TLS listener beside its plaintext one
// (docs/architecture.md §6a: [server] listen_tls, tls_cert, tls_key, tls_min_version,
// h2c), curl / h2load / openssl runs with bounds, sluice's RSS, the audit
// file.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import path from 'node:path';

import { poll, read_audit } from './gateway.mjs';
import { bound_ms, sluice_config, start_sluice, test_key } from './harness.mjs';

// A port free right now on 127.0.0.1 (bound, read, closed). The TLS
// listener is configured on it: sluice's plaintext `listening` line is the
// only one the harness knows to read, and connecting to this port tells
// when the TLS one is up whatever sluice prints about it.
export function free_port() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Resolves once a TCP connect to port succeeds (closed at once); bounded.
export async function until_listening(port, { timeout_ms = bound_ms(10000), proc } = {}) {
  await poll(() => new Promise((resolve) => {
    if (proc?.exit) throw new Error(`sluice exited: ${proc.output()}`);
    const s = net.connect({ port, host: '127.0.0.1' });
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
  }), { timeout_ms, interval_ms: 20, what: `a listener on 127.0.0.1:${port}` });
}

// sluice with its plaintext listener (h2c on) and, when `ca` is given
// (lib/test_ca.mjs), a TLS listener with the CA's server certificate chain.
// `server`, `upstream` add [server] / [upstream] entries. The result is
// start_sluice's plus tls_port and tls_url, audit() (the audit records) and
// rss_kb().
export async function start_sluice_edge({ backends, ca, server = {}, upstream = {}, quota = {}, env } = {}) {
  const tls_port = ca ? await free_port() : null;
  const tls_entries = ca ? { listen_tls: `127.0.0.1:${tls_port}`, tls_cert: ca.chain, tls_key: ca.key } : {};
  const config = sluice_config({ backends, server: { h2c: true, ...tls_entries, ...server }, upstream, quota });
  const sluice = await start_sluice({ backends, config, env });
  try {
    if (ca) await until_listening(tls_port, { proc: sluice.proc });
  } catch (err) {
    await sluice.stop({ signal: 'SIGKILL' });
    throw err;
  }
  return Object.assign(sluice, {
    tls_port,
    tls_url: ca ? `https://127.0.0.1:${tls_port}` : null,
    audit_file: path.join(sluice.dir, 'sluice-audit.jsonl'),
    audit() { return read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')); },
    rss_kb() { return rss_kb(sluice.proc.child.pid); },
  });
}

// The audit record of request id `id`, once it is written.
export function audit_of(sluice, id, { timeout_ms = bound_ms(5000) } = {}) {
  return poll(() => sluice.audit().find((r) => r.request_id === id), { timeout_ms, what: `the audit record of ${id}` });
}

export function rss_kb(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB$/m);
  if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(m[1]);
}

// Runs a program with a bound; resolves {code, signal, stdout (Buffer),
// stderr (string), ms}. Never rejects for a non-zero exit: the caller
// asserts. `input` is written to stdin (then closed, unless keep_stdin).
export function run_program(file, args, { timeout_ms = bound_ms(30000), input, env, cwd, on_spawn } = {}) {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(file, args, { cwd, env: { ...process.env, ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
    const out = [];
    const err = [];
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => err.push(d));
    child.stdin.on('error', () => {});
    const timer = setTimeout(() => child.kill('SIGKILL'), timeout_ms);
    child.on('error', (e) => { clearTimeout(timer); reject(e); });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString(), ms: performance.now() - started,
        timed_out: signal === 'SIGKILL' });
    });
    on_spawn?.(child);
    if (input !== undefined) child.stdin.end(input);
    else if (!on_spawn) child.stdin.end();
  });
}

// curl with a JSON POST body; -w puts status, http version and content
// type on stderr's last line. Resolves {status, http_version, content_type,
// body (Buffer, de-chunked by curl), stderr}; rejects on a curl failure.
export async function curl_post(url, body, { args = [], headers = [], timeout_ms = bound_ms(25000) } = {}) {
  const a = ['-sS', '-N', '--max-time', String(Math.ceil(timeout_ms / 1000)), '-X', 'POST', '-H', 'Content-Type: application/json',
    ...args];
  for (const h of headers) a.push('-H', h);
  a.push('--data-binary', typeof body === 'string' ? body : JSON.stringify(body),
    '-w', '%{stderr}\n%{http_code} %{http_version} %{content_type}', url);
  const r = await run_program('curl', a, { timeout_ms: timeout_ms + bound_ms(5000) });
  if (r.code !== 0) throw new Error(`curl ${a.join(' ')} exited ${r.code}: ${r.stderr}`);
  const last = r.stderr.trim().split('\n').at(-1);
  const [status, http_version, ...ct] = last.split(' ');
  return { status: Number(status), http_version, content_type: ct.join(' '), body: r.stdout, stderr: r.stderr };
}

// One request over HTTP/2 (h2c prior knowledge): {status, text}. `path`
// and `headers` (instead of the bearer key's) for another endpoint.
export async function post_h2(base_url, body, key = test_key, { path = '/v1/chat/completions', headers } = {}) {
  const session = http2.connect(base_url);
  session.on('error', () => {});
  try {
    const req = session.request({ ':method': 'POST', ':path': path, ...(headers ?? { authorization: `Bearer ${key}` }),
      'content-type': 'application/json' });
    req.end(JSON.stringify(body));
    const [head] = await once(req, 'response');
    const parts = [];
    req.on('data', (d) => parts.push(d));
    await once(req, 'end');
    return { status: head[':status'], text: Buffer.concat(parts).toString('utf8') };
  } finally {
    session.close();
  }
}
