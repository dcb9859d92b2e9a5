// A redis-server for a test, on a free loopback port, in its own directory
// (so that a restart on the same port and directory finds the data an
// append-only file kept). Always stop it (after() hooks).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

import { bound_ms, managed_process } from './harness.mjs';

export async function free_port() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const port = srv.address().port;
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

// Starts redis-server. `persist`: an append-only file fsynced on every write
// (a kill -9 loses nothing: the restarted server has the buckets as they
// were). Returns {port, url, proc, dir, restart(), kill(), stop(), cli(...args)}.
export async function start_redis({ persist = false, port, dir } = {}) {
  const d = dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-redis-'));
  const p = port ?? (await free_port());
  const args = ['--port', String(p), '--bind', '127.0.0.1', '--save', '', '--dir', d, '--daemonize', 'no'];
  args.push(...(persist ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no']));
  const proc = new managed_process('redis', '/usr/bin/redis-server', args);
  await proc.wait_for_line(/Ready to accept connections/, { timeout_ms: bound_ms(10000) });
  const r = {
    port: p,
    url: `redis://127.0.0.1:${p}`,
    proc,
    dir: d,
    // redis-cli against this server: its output, trimmed.
    cli(...cmd) {
      return execFileSync('/usr/bin/redis-cli', ['-p', String(p), '--raw', ...cmd], { encoding: 'utf8' }).trim();
    },
    // SIGKILL: no shutdown, no save.
    async kill() {
      await proc.stop({ signal: 'SIGKILL' });
    },
    // A new server on the same port and directory.
    async restart() {
      const next = await start_redis({ persist, port: p, dir: d });
      r.proc = next.proc;
      return r;
    },
    async stop() {
      await r.proc.stop();
      if (!dir && !process.env.SLUICE_KEEP_TMP) fs.rmSync(d, { recursive: true, force: true });
    },
  };
  return r;
}
