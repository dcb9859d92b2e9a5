// The deployment files (issue 19 §3): docs/operations.md names every metric
// family a running gateway serves; deploy/sluice@.service passes
// `systemd-analyze verify` with the built binary in place of
// /usr/local/bin/sluice, its command lines use flags sluice has, and
// --check-config (its ExecStartPre) accepts a good config and refuses a bad
// one, or a NUMA node the machine lacks, with exit status 1 and the reason.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { program, repo_root, sluice_config, start_sluice } from './lib/harness.mjs';
import { run_program } from './lib/h2_gateway.mjs';

const unit_file = path.join(repo_root, 'deploy', 'sluice@.service');
const unit_text = fs.readFileSync(unit_file, 'utf8');
const systemd_analyze = ['/usr/bin/systemd-analyze', '/bin/systemd-analyze'].find((f) => fs.existsSync(f));

// The unit's value for `key` (its last assignment, as systemd reads it).
function unit_value(key) {
  const lines = unit_text.split('\n').filter((l) => l.startsWith(`${key}=`));
  return lines.length ? lines.at(-1).slice(key.length + 1) : undefined;
}

// The arguments of a command line of the unit (the program left out), for
// instance `instance` and with the config path replaced; $SLUICE_FLAGS
// (unset) drops out, as systemd drops an empty variable.
function args_of(key, { instance, config }) {
  const words = unit_value(key).replaceAll('%i', instance).replace('/etc/sluice/sluice.toml', config)
    .split(/\s+/).filter((w) => w && w !== '$SLUICE_FLAGS');
  assert.equal(words[0], '/usr/local/bin/sluice');
  return words.slice(1);
}

let dir;
before(() => { dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-deploy-')); });
after(() => { if (!process.env.SLUICE_KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true }); });

// Writes the unit to a fresh folder with /usr/local/bin/sluice replaced
// by the built binary (verify checks that ExecStart's program exists), plus
// an instance link, and runs systemd-analyze verify on the instance.
async function verify(text) {
  const units = fs.mkdtempSync(path.join(dir, 'units-'));
  fs.writeFileSync(path.join(units, 'sluice@.service'), text.replaceAll('/usr/local/bin/sluice', program('sluice')));
  fs.symlinkSync('sluice@.service', path.join(units, 'sluice@0.service'));
  return run_program(systemd_analyze, ['verify', '--man=no', path.join(units, 'sluice@0.service')]);
}

describe('deploy/sluice@.service', () => {
  it('passes systemd-analyze verify without a warning', { skip: systemd_analyze ? false : 'no systemd-analyze on this machine' }, async () => {
    const r = await verify(unit_text);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr.trim(), '', 'systemd-analyze warned');
  });

  it('a broken copy of it does not pass (the check above can fail)', { skip: systemd_analyze ? false : 'no systemd-analyze on this machine' }, async () => {
    const r = await verify(unit_text.replace('ProtectHome=yes', 'ProtectHome=sometimes'));
    assert.match(r.stderr, /ProtectHome|protect home/i);
  });

  it('runs one instance per NUMA node, checks its config first, reloads with SIGHUP and is hardened', () => {
    assert.match(unit_value('ExecStart'), /^\/usr\/local\/bin\/sluice --config \/etc\/sluice\/sluice\.toml --numa-node %i\b/);
    assert.match(unit_value('ExecStartPre'), /--numa-node %i .*--check-config|--check-config.*--numa-node %i/);
    assert.equal(unit_value('ExecReload'), '/bin/kill -HUP $MAINPID');
    // Readiness and the binary upgrade's new main pid come by sd_notify.
    assert.equal(unit_value('Type'), 'notify');
    assert.equal(unit_value('NotifyAccess'), 'main');
    assert.equal(unit_value('Restart'), 'on-failure');
    assert.ok(Number(unit_value('LimitNOFILE')) >= 65536);
    for (const [key, want] of [['ProtectSystem', 'strict'], ['NoNewPrivileges', 'yes'], ['CapabilityBoundingSet', ''],
      ['DynamicUser', 'yes'], ['PrivateTmp', 'yes'], ['ProtectHome', 'yes']]) {
      assert.equal(unit_value(key), want, key);
    }
    assert.match(unit_value('StateDirectory'), /^sluice\b/);
    assert.match(unit_text, /^#CapabilityBoundingSet=CAP_NET_BIND_SERVICE$/m);
  });

  it('uses only flags that sluice --help lists', async () => {
    const help = (await run_program(program('sluice'), ['--help'])).stdout.toString();
    for (const key of ['ExecStart', 'ExecStartPre']) {
      for (const flag of unit_value(key).match(/--[a-z-]+/g)) assert.ok(help.includes(`  ${flag} `), `${key}: ${flag} is not in --help`);
    }
  });
});

describe('--check-config, as ExecStartPre runs it', () => {
  const good = () => {
    const file = path.join(dir, 'good.toml');
    fs.writeFileSync(file, sluice_config({ backends: ['http://127.0.0.1:8000'], audit_path: path.join(dir, 'audit.jsonl') }));
    return file;
  };

  it('accepts a good config on node 0 with exit 0 and says where the shards run', async () => {
    const r = await run_program(program('sluice'), args_of('ExecStartPre', { instance: '0', config: good() }));
    if (r.code === 1 && /--numa-node 0: no such NUMA node/.test(r.stderr)) return;  // a kernel without NUMA: refused, as it must be
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout.toString(), /good\.toml: ok \(1 groups, 1 backends, 1 keys; \d+ shards? on cpus [0-9,-]+\)/);
  });

  it('refuses a config that does not validate with exit 1 and the reason', async () => {
    const file = path.join(dir, 'bad.toml');
    fs.writeFileSync(file, sluice_config({ backends: ['http://127.0.0.1:8000'], server: { idle_timeout_ms: 'soon' } }));
    const r = await run_program(program('sluice'), ['--config', file, '--check-config']);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^sluice: .*idle_timeout_ms/m);
    assert.equal(r.stdout.toString(), '');
  });

  it('refuses a config that does not parse with exit 1 and the line', async () => {
    const file = path.join(dir, 'broken.toml');
    fs.writeFileSync(file, '[server\nlisten = "127.0.0.1:8080"\n');
    const r = await run_program(program('sluice'), ['--config', file, '--check-config']);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^sluice: .*broken\.toml.*1/m);
  });

  it('refuses a NUMA node the machine lacks with exit 1', async () => {
    const r = await run_program(program('sluice'), args_of('ExecStartPre', { instance: '1023', config: good() }));
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^sluice: --numa-node 1023: no such NUMA node/m);
  });

  it('refuses a node whose cpus are all outside --cpus with exit 1, naming both lists', async (t) => {
    if (!fs.existsSync('/sys/devices/system/node/node0/cpulist')) {
      t.skip('a kernel without NUMA: the node-1023 case covers the refusal');
      return;
    }
    const r = await run_program(program('sluice'), ['--config', good(), '--numa-node', '0', '--cpus', '1023', '--check-config']);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /--numa-node 0: none of its CPUs \([0-9,-]+\) is in --cpus \/ server\.cpus \(1023\)/);
  });
});

describe('docs/operations.md', () => {
  it('describes every metric family that /metrics serves', async () => {
    const doc = fs.readFileSync(path.join(repo_root, 'docs', 'operations.md'), 'utf8');
    const sluice = await start_sluice({ config: sluice_config({ backends: ['http://127.0.0.1:9'] }) });
    try {
      const text = await (await fetch(`${sluice.admin_url}/metrics`)).text();
      const families = [...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]);
      assert.ok(families.length > 30, text);
      const missing = families.filter((f) => !doc.includes(`| \`${f}\` |`));
      assert.deepEqual(missing, [], 'metric families without a row in docs/operations.md');
    } finally {
      await sluice.stop();
    }
  });
});
