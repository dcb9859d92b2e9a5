// The admin listener: an optional bearer token on every endpoint but
// /healthz, and connections that cannot hold it hostage (idle ones are cut,
// so 64 of them do not lock out /metrics).
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import { gateway_config } from './lib/gateway.mjs';
import { bound_ms, start_mock_vllm, start_sluice, stop_all, with_timeout } from './lib/harness.mjs';

describe('admin listener', () => {
  let mock, sluice;

  before(async () => {
    mock = await start_mock_vllm({});
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { admin_token_env: 'SLUICE_TEST_ADMIN_TOKEN' } },
        groups: [{ name: 'g', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'k', key: 'key-k', groups: ['*'] }],
      }),
      env: { SLUICE_TEST_ADMIN_TOKEN: 'admin-secret' },
    });
  });
  after(() => stop_all(sluice, mock));

  it('wants the token on /metrics, /backends and the drain API, not on /healthz; the token never shows', async () => {
    for (const p of ['/metrics', '/backends']) {
      const none = await fetch(`${sluice.admin_url}${p}`);
      assert.equal(none.status, 401, p);
      const body = await none.text();
      assert.ok(!body.includes('admin-secret'));
      const wrong = await fetch(`${sluice.admin_url}${p}`, { headers: { authorization: 'Bearer admin-secreT' } });
      assert.equal(wrong.status, 401, p);
      await wrong.arrayBuffer();
      const right = await fetch(`${sluice.admin_url}${p}`, { headers: { authorization: 'Bearer admin-secret' } });
      assert.equal(right.status, 200, p);
      assert.ok(!(await right.text()).includes('admin-secret'));
    }
    const drain = await fetch(`${sluice.admin_url}/backends/drain?url=${encodeURIComponent(mock.url)}`, { method: 'POST' });
    assert.equal(drain.status, 401);
    await drain.arrayBuffer();
    const health = await fetch(`${sluice.admin_url}/healthz`);
    assert.equal(health.status, 200);
    await health.arrayBuffer();
    assert.ok(!sluice.proc.output().includes('admin-secret'), 'the token reached the log');
  });

  it('64 idle connections are cut, and /metrics answers again', async () => {
    const idle = await Promise.all(Array.from({ length: 64 }, () => new Promise((resolve, reject) => {
      const s = net.connect(sluice.admin_port, '127.0.0.1', () => resolve(s));
      s.on('error', reject);
    })));
    try {
      const closed = idle.map((s) => new Promise((resolve) => s.on('close', resolve)));
      await with_timeout(Promise.all(closed), bound_ms(10000), 'sluice to cut the idle admin connections');
      const m = await fetch(`${sluice.admin_url}/metrics`, { headers: { authorization: 'Bearer admin-secret' } });
      assert.equal(m.status, 200);
      await m.arrayBuffer();
    } finally {
      for (const s of idle) s.destroy();
    }
  });
});
