// Shard placement (issue 19 §3): each shard pinned to its CPU of the list
// (the default), or, with [server] pin_shards = false, free to run on any
// CPU of the list (for cores shared with other busy processes), read back
// from the shard threads' own affinity. --numa-node on this machine's node 0
// starts and serves as without it (one node: the memory policy is left as
// it is, and said so), and SO_REUSEPORT steering sends a connection to the
// shard pinned to the CPU that received it when [server] reuseport_steering
// is on (it is off by default). On loopback the CPU that
// receives a SYN is the one the connecting process runs on, so a client
// pinned with taskset to shard i's CPU must land on shard i; a request id
// sluice makes starts with its shard's index in two hex digits.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, it } from 'node:test';

import { start_mock_vllm, start_sluice, sluice_config, test_key } from './lib/harness.mjs';
import { run_program } from './lib/h2_gateway.mjs';

// This process's allowed CPUs ("pid 7's current affinity list: 0,1").
async function affinity_cpus() {
  const r = await run_program('taskset', ['-cp', String(process.pid)]);
  if (r.code !== 0) return [];
  const list = r.stdout.toString().split(':').at(-1).trim();
  const cpus = [];
  for (const part of list.split(',')) {
    const [a, b] = part.split('-').map(Number);
    for (let c = a; c <= (b ?? a); ++c) cpus.push(c);
  }
  return cpus;
}

// One request on a fresh connection from a curl pinned to `cpu`: its
// status and the shard named by the request id.
async function request_from(cpu, url) {
  const r = await run_program('taskset', ['-c', String(cpu), 'curl', '-sS', '-o', '/dev/null', '-D', '-',
    '--max-time', '10', '-H', `authorization: Bearer ${test_key}`, `${url}/v1/models`]);
  assert.equal(r.code, 0, `curl on cpu ${cpu}: ${r.stderr}`);
  const head = r.stdout.toString();
  const status = Number(head.match(/^HTTP\/1\.1 (\d+)/)?.[1]);
  const id = head.match(/^x-request-id: ([0-9a-f]{2})/im)?.[1];
  return { status, shard: id === undefined ? -1 : parseInt(id, 16) };
}

const per_cpu = 12;
let backend;
let cpus;
before(async () => {
  backend = await start_mock_vllm();
  cpus = (await affinity_cpus()).slice(0, 2);
});
after(async () => { await backend?.stop(); });

// The CPUs of a kernel cpu list ("0-2,5" -> [0, 1, 2, 5]).
function cpu_list(list) {
  return list.split(',').flatMap((part) => {
    const [a, b = a] = part.split('-').map(Number);
    return Array.from({ length: b - a + 1 }, (_, i) => a + i);
  });
}

// The CPUs each shard thread of `pid` may run on, by shard index
// ("sluice-shard1" -> index 1), from /proc/PID/task/*/status.
function shard_affinity(pid) {
  const out = [];
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    let status;
    try {
      status = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
    } catch {
      continue;  // a thread that ended since the listing (an io_uring worker)
    }
    const name = status.match(/^Name:\s*(\S+)/m)[1];
    const index = name.match(/^sluice-shard(\d+)$/)?.[1];
    if (index === undefined) continue;
    out[Number(index)] = cpu_list(status.match(/^Cpus_allowed_list:\s*(\S+)/m)[1]);
  }
  return out;
}

describe('pin_shards', () => {
  // sluice starts under a mask of the first CPU only, so a shard that set
  // no affinity of its own would show that one CPU.
  it('pins each shard to its own cpu of the list by default, and lets each run on the whole list when false', async (t) => {
    if (cpus.length < 2) {
      t.skip('fewer than 2 cpus in this process\'s affinity mask');
      return;
    }
    const list = cpus.join(',');
    const pinned = cpus.map((c) => [c]);
    for (const [pin_shards, want] of [[undefined, pinned], [true, pinned], [false, [cpus, cpus]]]) {
      const server = { cpus: list, ...(pin_shards === undefined ? {} : { pin_shards }) };
      const sluice = await start_sluice({ config: sluice_config({ backends: [backend.url], server }),
        launcher: ['/usr/bin/taskset', '-c', String(cpus[0])] });
      try {
        // Each shard has set its affinity before its listener serves.
        assert.deepEqual(shard_affinity(sluice.proc.child.pid), want, `pin_shards = ${pin_shards}`);
        for (const cpu of cpus) {
          const r = await request_from(cpu, sluice.url);
          assert.equal(r.status, 200);
          assert.ok(r.shard === 0 || r.shard === 1, `shard ${r.shard}`);
        }
      } finally {
        await sluice.stop();
      }
    }
  });
});

describe('--numa-node', () => {
  it('on node 0 of this machine starts, logs what it did with memory, and serves', async (t) => {
    if (!fs.existsSync('/sys/devices/system/node/node0/cpulist')) {
      t.skip('a kernel without NUMA (tests/integration/deploy.test.mjs checks the refusal)');
      return;
    }
    const sluice = await start_sluice({ config: sluice_config({ backends: [backend.url] }), extra_args: ['--numa-node', '0'] });
    try {
      await sluice.proc.wait_for_line(/--numa-node 0: (memory is allocated on node 0 first|one NUMA node; memory policy unchanged)/);
      const r = await request_from(cpus[0], sluice.url);
      assert.equal(r.status, 200);
    } finally {
      await sluice.stop();
    }
  });
});

describe('SO_REUSEPORT steering', () => {
  it('with 2 shards on 2 cpus, every connection is answered by the shard of the cpu that sent it', async (t) => {
    if (cpus.length < 2) {
      t.skip('fewer than 2 cpus in this process\'s affinity mask');
      return;
    }
    const server = { cpus: cpus.join(','), reuseport_steering: true };
    const sluice = await start_sluice({ config: sluice_config({ backends: [backend.url], server }) });
    try {
      await sluice.proc.wait_for_line(/127\.0\.0\.1:0: a connection goes to the shard of the cpu that received it \(cpus /);
      for (const [shard, cpu] of cpus.entries()) {
        const seen = [];
        for (let i = 0; i < per_cpu; ++i) seen.push(await request_from(cpu, sluice.url));
        assert.deepEqual(seen, Array(per_cpu).fill({ status: 200, shard }), `client on cpu ${cpu}`);
      }
    } finally {
      await sluice.stop();
    }
  });

  it('off (the default), the kernel hashes and every connection is still answered', async (t) => {
    if (cpus.length < 2) {
      t.skip('fewer than 2 cpus in this process\'s affinity mask');
      return;
    }
    const sluice = await start_sluice({ config: sluice_config({ backends: [backend.url], server: { cpus: cpus.join(',') } }) });
    try {
      assert.ok(!sluice.proc.output().includes('a connection goes to the shard'), sluice.proc.output());
      for (const cpu of cpus) {
        for (let i = 0; i < per_cpu; ++i) {
          const r = await request_from(cpu, sluice.url);
          assert.equal(r.status, 200);
          assert.ok(r.shard === 0 || r.shard === 1, `shard ${r.shard}`);
        }
      }
    } finally {
      await sluice.stop();
    }
  });
});
