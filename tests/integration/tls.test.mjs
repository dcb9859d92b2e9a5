// TLS at the edge (issue 16): what a broken or hostile TLS client gets.
//
// - A plaintext HTTP request (and the h2 preface) on the TLS port: at once
//   (well before the header timeout) a 400 that says so, or a close; never
//   a hang.
// - A ClientHello on the plaintext port: at once a TLS alert
//   (handshake_failure) or a close; node's TLS client fails fast.
// - A truncated ClientHello, a client that stops mid-handshake (after a
//   whole ClientHello) and a connection that sends nothing: closed at the
//   header deadline (server.header_timeout_ms), not before 0.8 of it and
//   not after it plus a bound.
// - Garbage after the handshake (bytes that are no TLS record, and a
//   record whose MAC cannot check): closed at once.
// - A TLS 1.2 renegotiation (openssl s_client -tls1_2, then "R"): refused,
//   the connection closed within the header timeout.
// - The private key's bytes never appear in sluice's output or audit file,
//   nor when sluice refuses a key that does not match its certificate.
// The ClientHello the raw tests send is node's own, recorded by a plain TCP
// server, so the bytes are a real client's.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { after, before, describe, it } from 'node:test';

import { run_program, start_sluice_edge } from './lib/h2_gateway.mjs';
import { bound_ms, chat_body, managed_process, program, sluice_config, start_mock_vllm, stop_all, test_key } from './lib/harness.mjs';
import { make_test_ca } from './lib/test_ca.mjs';
import { samples, scrape } from './lib/gateway.mjs';

const header_timeout_ms = 2000;
// "At once": well inside the header timeout.
const at_once_ms = 1000;

// node's ClientHello (one whole TLS record), as a server sees it.
function capture_client_hello() {
  return new Promise((resolve, reject) => {
    const server = net.createServer((s) => {
      let buf = Buffer.alloc(0);
      s.on('data', (d) => {
        buf = Buffer.concat([buf, d]);
        if (buf.length >= 5 && buf.length >= 5 + buf.readUInt16BE(3)) {
          resolve(buf.subarray(0, 5 + buf.readUInt16BE(3)));
          s.destroy();
          server.close();
        }
      });
    });
    server.listen(0, '127.0.0.1', () => {
      const c = tls.connect({ port: server.address().port, host: '127.0.0.1', servername: 'localhost', ALPNProtocols: ['h2', 'http/1.1'], rejectUnauthorized: false });
      c.on('error', () => {});
      c.on('close', () => {});
    });
    server.on('error', reject);
  });
}

// Connects, writes `bytes` (if any), reads until the server closes or the
// bound passes. Resolves {data (Buffer), closed, ms (connect to close)}.
function until_close(port, bytes, { timeout_ms }) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    const parts = [];
    let started;
    let timer;
    s.on('error', () => {});
    s.once('connect', () => {
      started = performance.now();
      if (bytes && bytes.length) s.write(bytes);
      timer = setTimeout(() => { s.destroy(); resolve({ data: Buffer.concat(parts), closed: false, ms: performance.now() - started }); }, timeout_ms);
    });
    s.once('error', (err) => { if (started === undefined) reject(err); });
    s.on('data', (d) => parts.push(d));
    s.on('close', () => {
      clearTimeout(timer);
      resolve({ data: Buffer.concat(parts), closed: true, ms: performance.now() - (started ?? performance.now()) });
    });
  });
}

const is_tls_alert = (buf) => buf.length >= 7 && buf[0] === 0x15 && buf[1] === 0x03 && buf[5] === 0x02;

// Base64 lines of a PEM's body (what would show if key bytes leaked).
function pem_body_pieces(file) {
  return fs.readFileSync(file, 'latin1').split('\n').filter((l) => l && !l.startsWith('-----')).flatMap((l) => {
    const out = [];
    for (let i = 0; i + 16 <= l.length; i += 16) out.push(l.slice(i, i + 16));
    return out;
  });
}

describe('TLS edge cases', () => {
  // `plain`: sluice with no TLS listener (the plaintext-port cases); the
  // TLS cases use a second sluice with one, started by the first of them
  // (tls_sluice()), so that a TLS listener that cannot start fails the TLS
  // cases only.
  let ca, mock, plain, hello, tls_started;
  const tls_sluice = () => {
    tls_started ??= start_sluice_edge({ backends: [mock.url], ca, server: { header_timeout_ms } });
    return tls_started;
  };

  before(async () => {
    ca = make_test_ca();
    hello = await capture_client_hello();
    assert.equal(hello[0], 0x16, 'a handshake record');
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 50 });
    plain = await start_sluice_edge({ backends: [mock.url], server: { header_timeout_ms } });
  });
  after(async () => {
    const tls_s = tls_started ? await tls_started.catch(() => null) : null;
    await stop_all(plain, tls_s, mock);
    ca?.remove();
  });

  it('a sane TLS client is served (ALPN http/1.1), the certificate verified by the test CA', async () => {
    const sluice = await tls_sluice();
    const res = await new Promise((resolve, reject) => {
      const s = tls.connect({ port: sluice.tls_port, host: '127.0.0.1', servername: 'localhost', ca: ca.ca_pem, ALPNProtocols: ['http/1.1'] });
      const parts = [];
      s.on('secureConnect', () => {
        const body = JSON.stringify(chat_body({ max_tokens: 4 }));
        s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${test_key}\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      });
      s.on('data', (d) => parts.push(d));
      s.on('error', reject);
      s.on('close', () => resolve({ text: Buffer.concat(parts).toString(), authorized: s.authorized, alpn: s.alpnProtocol }));
    });
    assert.equal(res.authorized, true);
    assert.equal(res.alpn, 'http/1.1');
    assert.match(res.text, /^HTTP\/1\.1 200 /);
  });

  for (const [name, bytes] of [
    ['a plaintext HTTP/1.1 request', Buffer.from(`GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${test_key}\r\n\r\n`)],
    ['the HTTP/2 client preface', Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n')],
  ]) {
    it(`${name} on the TLS port: a clear 400 or a close, at once`, async () => {
      const sluice = await tls_sluice();
      const r = await until_close(sluice.tls_port, bytes, { timeout_ms: header_timeout_ms + bound_ms(3000) });
      assert.ok(r.closed, `closed (${r.ms.toFixed(0)} ms; got ${JSON.stringify(r.data.toString('latin1').slice(0, 80))})`);
      assert.ok(r.ms < at_once_ms, `closed after ${r.ms.toFixed(0)} ms (at once: < ${at_once_ms} ms)`);
      if (r.data.length > 0) {
        const text = r.data.toString('latin1');
        assert.ok(/^HTTP\/1\.[01] 400 /.test(text) || is_tls_alert(r.data), `a 400 or an alert: ${JSON.stringify(text.slice(0, 80))}`);
        if (text.startsWith('HTTP/')) assert.match(text, /TLS|HTTPS|https|plain/i, 'the 400 says why');
      }
    });
  }

  // tls.hpp: k_tls_on_plain_port_alert, so the client's TLS stack reports
  // an alert rather than "wrong version number" (an HTTP 400 here).
  it('a ClientHello on the plaintext port: an alert or a close, at once', async () => {
    const r = await until_close(plain.port, hello, { timeout_ms: header_timeout_ms + bound_ms(3000) });
    assert.ok(r.closed, 'closed');
    assert.ok(r.ms < at_once_ms, `closed after ${r.ms.toFixed(0)} ms`);
    if (r.data.length > 0) assert.ok(is_tls_alert(r.data), `a TLS alert, not ${JSON.stringify(r.data.toString('latin1').slice(0, 60))}`);
  });

  it("node's TLS client on the plaintext port fails fast (no hang)", async () => {
    const started = performance.now();
    const err = await new Promise((resolve) => {
      const s = tls.connect({ port: plain.port, host: '127.0.0.1', servername: 'localhost', ca: ca.ca_pem });
      s.on('secureConnect', () => { s.destroy(); resolve(null); });
      s.on('error', (e) => resolve(e));
      s.setTimeout(header_timeout_ms + bound_ms(3000), () => { s.destroy(); resolve(new Error('timeout')); });
    });
    assert.ok(err && err.message !== 'timeout', `failed: ${err?.message}`);
    assert.ok(performance.now() - started < at_once_ms, `after ${(performance.now() - started).toFixed(0)} ms`);
  });

  for (const [name, bytes_of] of [
    ['a truncated ClientHello (its first 40 bytes)', () => hello.subarray(0, 40)],
    ['a client that stops mid-handshake (a whole ClientHello, then nothing)', () => hello],
    ['a connection that sends nothing', () => Buffer.alloc(0)],
  ]) {
    it(`${name} on the TLS port: closed at the header timeout`, async () => {
      const sluice = await tls_sluice();
      const r = await until_close(sluice.tls_port, bytes_of(), { timeout_ms: header_timeout_ms + bound_ms(3000) });
      assert.ok(r.closed, `closed within ${header_timeout_ms} ms + the bound (waited ${r.ms.toFixed(0)} ms)`);
      assert.ok(r.ms >= header_timeout_ms * 0.8, `closed after ${r.ms.toFixed(0)} ms, before the header timeout`);
    });
  }

  for (const [name, garbage] of [
    ['bytes that are no TLS record', Buffer.from('this is not a TLS record\r\n\r\n')],
    ['an application-data record whose MAC cannot check', Buffer.concat([Buffer.from([0x17, 0x03, 0x03, 0x00, 0x40]), Buffer.alloc(0x40, 0xab)])],
  ]) {
    it(`garbage after the handshake (${name}): closed at once`, async () => {
      const sluice = await tls_sluice();
      const r = await new Promise((resolve, reject) => {
        const raw = net.connect({ port: sluice.tls_port, host: '127.0.0.1' });
        raw.on('error', () => {});
        const s = tls.connect({ socket: raw, servername: 'localhost', ca: ca.ca_pem, ALPNProtocols: ['http/1.1'] });
        s.on('error', () => {});
        let started;
        const timer = setTimeout(() => { raw.destroy(); resolve({ closed: false, ms: performance.now() - started }); }, header_timeout_ms + bound_ms(3000));
        s.once('secureConnect', () => {
          started = performance.now();
          // Past node's TLS layer, straight onto the TCP stream.
          raw.write(garbage);
        });
        raw.once('close', () => { clearTimeout(timer); resolve({ closed: true, ms: performance.now() - (started ?? performance.now()) }); });
        s.once('error', (e) => { if (started === undefined) { clearTimeout(timer); reject(e); } });
      });
      assert.ok(r.closed, 'closed');
      assert.ok(r.ms < at_once_ms, `closed after ${r.ms.toFixed(0)} ms`);
    });
  }

  it('a TLS 1.2 renegotiation (openssl s_client -tls1_2, then R) is refused and the connection closed', async () => {
    const sluice = await tls_sluice();
    let child;
    let renegotiate_at = null;
    const run = run_program('openssl', ['s_client', '-connect', `127.0.0.1:${sluice.tls_port}`, '-tls1_2', '-servername', 'localhost',
      '-CAfile', ca.ca_cert, '-alpn', 'http/1.1'], {
      timeout_ms: header_timeout_ms + bound_ms(10000),
      on_spawn: (c) => {
        child = c;
        let out = '';
        c.stdout.on('data', (d) => {
          out += d.toString();
          // The session summary ends the handshake's output; then the command.
          if (renegotiate_at === null && /Verify return code/.test(out)) {
            renegotiate_at = performance.now();
            c.stdin.write('R\n');
          }
        });
      },
    });
    const r = await run;
    const closed_after_ms = renegotiate_at === null ? null : performance.now() - renegotiate_at;
    child?.stdin.end();
    const text = `${r.stdout}\n${r.stderr}`;
    assert.ok(!r.timed_out, `s_client was still connected after the bound:\n${text}`);
    assert.notEqual(renegotiate_at, null, `the handshake completed:\n${text}`);
    assert.match(text, /Protocol\s*:\s*TLSv1\.2/, text);
    assert.match(text, /RENEGOTIATING/, text);
    assert.ok(closed_after_ms < header_timeout_ms + bound_ms(1000), `closed ${closed_after_ms.toFixed(0)} ms after the renegotiation request`);
    // One handshake only: s_client prints the leaf's verification (depth=0)
    // on stderr once per handshake; a renegotiation that went through
    // prints it again.
    assert.equal((r.stderr.match(/^depth=0 /gm) ?? []).length, 1, `no second handshake completed:\n${r.stderr}`);
  });

  it('the private key never appears in sluice\'s output or audit file', async () => {
    const sluice = await tls_sluice();
    // The cases above made this sluice log TLS failures and a good exchange.
    const pieces = pem_body_pieces(ca.key);
    assert.ok(pieces.length >= 4);
    const out = sluice.proc.output();
    const audit = fs.existsSync(sluice.audit_file) ? fs.readFileSync(sluice.audit_file, 'latin1') : '';
    for (const p of pieces) {
      assert.ok(!out.includes(p), `sluice's output holds key bytes ${p}`);
      assert.ok(!audit.includes(p), `the audit file holds key bytes ${p}`);
    }
    assert.ok(!out.includes('PRIVATE KEY'), 'no PEM key header in the output');
  });

  it('a key that does not match the certificate: sluice refuses it, naming the file, without its bytes', async () => {
    const other = make_test_ca();
    try {
      const dir = fs.mkdtempSync(path.join(ca.dir, 'bad-'));
      const config = sluice_config({ backends: [mock.url], server: { listen_tls: '127.0.0.1:0', tls_cert: ca.chain, tls_key: other.key } });
      fs.writeFileSync(path.join(dir, 'sluice.toml'), config);
      const proc = new managed_process('sluice-badkey', program('sluice'), ['--listen', '127.0.0.1:0', '--admin', '127.0.0.1:0', '--config', path.join(dir, 'sluice.toml')], { cwd: dir });
      let exit;
      try {
        exit = await Promise.race([proc.exited, new Promise((r) => setTimeout(() => r(null), bound_ms(10000)))]);
      } finally {
        await proc.stop({ signal: 'SIGKILL' });
      }
      assert.notEqual(exit, null, 'sluice did not exit on a mismatched key');
      assert.notEqual(exit.code, 0, 'a non-zero exit');
      const out = proc.output();
      assert.ok(out.includes(other.key) || /tls_key/.test(out), `the message names the key file or tls_key: ${out}`);
      for (const p of pem_body_pieces(other.key)) assert.ok(!out.includes(p), `key bytes ${p} in: ${out}`);
    } finally {
      other.remove();
    }
  });
  // Runs last in this suite (node:test keeps the order).
  it('handshakes, failures, the encryption path and wrong-port protocols are counted in /metrics', async () => {
    const count = async (s, name, labels = {}) =>
      samples((await scrape(s.admin_url)).parsed, name, labels).reduce((t, x) => t + x.value, 0);
    const sluice = await tls_sluice();
    assert.ok(await count(sluice, 'sluice_tls_handshakes_total', { result: 'ok' }) >= 1);
    assert.ok(await count(sluice, 'sluice_tls_handshakes_total', { result: 'failed' }) >= 1, 'the truncated and garbage handshakes');
    // This build encrypts in user space on every kernel (README, "TLS and HTTP/2").
    assert.equal(await count(sluice, 'sluice_tls_ktls_connections_total', { path: 'ktls' }), 0);
    assert.ok(await count(sluice, 'sluice_tls_ktls_connections_total', { path: 'copy' }) >= 1);
    assert.ok(await count(sluice, 'sluice_edge_protocol_mismatches_total') >= 2, 'plaintext on the TLS port');
    assert.ok(await count(plain, 'sluice_edge_protocol_mismatches_total') >= 1, 'a ClientHello on the plaintext port');
  });
});

describe('TLS certificate reload on SIGHUP', () => {
  // The pair sits in files of the test's own; SIGHUP makes sluice read them
  // again. Two CAs: a connection verified by one CA cannot be the other's
  // certificate, so who signed what a new connection got is what it verifies.
  let ca1, ca2, mock, sluice, dir;
  const files = () => ({ chain: path.join(dir, 'chain.pem'), key: path.join(dir, 'key.pem') });
  const install = (ca) => {
    fs.copyFileSync(ca.chain, files().chain);
    fs.copyFileSync(ca.key, files().key);
  };
  const sighup = async () => {
    const from = sluice.proc.mark();
    sluice.proc.child.kill('SIGHUP');
    const said = await sluice.proc.wait_for_line(/SIGHUP: (reloaded|.*the running config stays)/, { from, timeout_ms: bound_ms(5000) });
    return { line: said.line.text, from };
  };
  // A keep-alive TLS connection, verified against `ca`; request() sends one
  // request on it and resolves with the status line.
  const connect = (ca) => new Promise((resolve, reject) => {
    const s = tls.connect({ port: sluice.tls_port, host: '127.0.0.1', servername: 'localhost', ca: ca.ca_pem, ALPNProtocols: ['http/1.1'] });
    s.once('secureConnect', () => resolve(s));
    s.once('error', reject);
  });
  const request = (s) => new Promise((resolve, reject) => {
    const body = JSON.stringify(chat_body({ max_tokens: 2 }));
    let text = '';
    const on_data = (d) => {
      text += d.toString('latin1');
      const head_end = text.indexOf('\r\n\r\n');
      const m = /content-length: (\d+)/i.exec(text);
      if (head_end >= 0 && m && text.length >= head_end + 4 + Number(m[1])) {
        s.off('data', on_data);
        resolve(text.slice(0, text.indexOf('\r\n')));
      }
    };
    s.on('data', on_data);
    s.once('error', reject);
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${test_key}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  });

  before(async () => {
    ca1 = make_test_ca();
    ca2 = make_test_ca();
    dir = fs.mkdtempSync(path.join(ca1.dir, 'live-'));
    install(ca1);
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 2 });
    sluice = await start_sluice_edge({ backends: [mock.url], ca: files() });
  });
  after(async () => {
    await stop_all(sluice, mock);
    ca1?.remove();
    ca2?.remove();
  });

  it('new connections get the new pair; a connection made before keeps working', async () => {
    const before_reload = await connect(ca1);
    try {
      assert.match(await request(before_reload), /^HTTP\/1\.1 200 /);
      await assert.rejects(connect(ca2), /certificate|self.signed|unable to verify/i, 'still the first pair');
      install(ca2);
      const { line } = await sighup();
      assert.match(line, /reloaded/);
      const fresh = await connect(ca2);  // verified by the second CA: the new pair
      try {
        assert.match(await request(fresh), /^HTTP\/1\.1 200 /);
      } finally {
        fresh.destroy();
      }
      await assert.rejects(connect(ca1), /certificate|self.signed|unable to verify/i, 'the first pair is gone for new connections');
      assert.match(await request(before_reload), /^HTTP\/1\.1 200 /, 'the old connection was not dropped');
    } finally {
      before_reload.destroy();
    }
  });

  it('a pair that does not load is logged, and the running one stays', async () => {
    fs.writeFileSync(files().key, '-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n');
    const from = sluice.proc.mark();
    await sighup();
    await sluice.proc.wait_for_line(/tls_cert \/ tls_key: .*keep the running certificate/, { from, timeout_ms: bound_ms(5000) });
    const s = await connect(ca2);  // still the pair of the last good load
    try {
      assert.match(await request(s), /^HTTP\/1\.1 200 /);
    } finally {
      s.destroy();
    }
    const out = sluice.proc.output();
    assert.ok(!out.includes('not a key'), 'the key file\'s bytes never reach the log');
  });
});
