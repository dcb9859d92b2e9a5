// The status page in a real browser: Debian's chromium, headless, driven by
// playwright-core. The page loads with no console error, shows the running
// gateway's backends and keys, its numbers move as load is sent (its script
// polls /status.json), and its drain button drains a backend. Screenshots
// (light and dark) go to tests/integration/artifacts/. Without a chromium
// that starts, the tests skip themselves with the reason.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

import { gateway_config, poll, post_fresh, run_pool, start_backends } from './lib/gateway.mjs';
import { bound_ms, chat_body, start_sluice, stop_all } from './lib/harness.mjs';

const chromium_path = process.env.SLUICE_CHROMIUM ?? '/usr/bin/chromium';
const artifacts = path.join(path.dirname(fileURLToPath(import.meta.url)), 'artifacts');
const key_secret = 'sk-browser-secret-77e0';

async function launch() {
  if (!fs.existsSync(chromium_path)) return { why: `no chromium at ${chromium_path} (apt-get install chromium)` };
  try {
    const { chromium } = await import('playwright-core');
    const browser = await chromium.launch({ executablePath: chromium_path, args: ['--no-sandbox'], timeout: bound_ms(30000) });
    return { browser };
  } catch (err) {
    return { why: `chromium does not start: ${err.message.split('\n')[0]}` };
  }
}

describe('status page in a browser', () => {
  let backends, sluice, browser, why_not;

  before(async () => {
    ({ browser, why: why_not } = await launch());
    if (!browser) return;
    backends = await start_backends(2, { ttft_ms: 20, tokens_per_sec: 400 });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 200 } },
        groups: [{ name: 'chat', models: ['*'], backends: backends.map((b) => b.url) }],
        keys: [
          { id: 'alice', key: key_secret, groups: ['*'], tokens_per_minute: 500000, requests_per_minute: 6000 },
          { id: 'batch-jobs', key: `${key_secret}-2`, groups: ['*'], daily_tokens: 10000000 },
        ],
      }),
    });
  });
  after(async () => {
    await browser?.close();
    await stop_all(sluice, ...(backends ?? []));
  });

  it('shows the gateway, moves with load and drains a backend from its button', async (t) => {
    if (!browser) {
      t.skip(why_not);
      return;
    }
    const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
    const problems = [];
    page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`); });
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()}`));

    await page.goto(`${sluice.admin_url}/`);
    for (const b of backends) await page.locator('#backends td', { hasText: b.url }).first().waitFor();
    await page.locator('#keys td', { hasText: 'alice' }).first().waitFor();
    await page.locator('#keys td', { hasText: 'batch-jobs' }).first().waitFor();
    assert.ok(!(await page.content()).includes(key_secret), 'the key secret is in the page');

    // Load: the script's next polls show it in the cards, tables and charts.
    const sent = 60;
    const results = await run_pool(sent, 4, (i) => post_fresh(sluice.url, chat_body({
      stream: i % 3 !== 0, content: `browser load ${i} ${'words '.repeat(i % 7)}`, max_tokens: 24,
    }), { key: i % 4 === 0 ? `${key_secret}-2` : key_secret }));
    for (const r of results) assert.equal(r.status, 200, r.text);
    await poll(async () => Number(await page.locator('#c-total').textContent()) >= sent,
      { timeout_ms: bound_ms(10000), interval_ms: 200, what: 'the page to count the requests' });
    await poll(async () => Number(await page.locator('#c-req').textContent()) > 0,
      { timeout_ms: bound_ms(10000), interval_ms: 200, what: 'the page to show a request rate' });
    // A line needs two steps of the sampler (2 s each) with the load in them.
    await poll(async () => {
      const points = (await page.locator('#g-req polyline').getAttribute('points')) ?? '';
      const ys = points.split(' ').filter(Boolean).map((p) => Number(p.split(',')[1]));
      return ys.length >= 2 && ys.some((y) => y < 50);  // a point above the baseline (58 of 60)
    }, { timeout_ms: bound_ms(10000), interval_ms: 200, what: 'the request chart to draw a line with the load' });
    const chat_row = page.locator('#groups tr', { hasText: 'chat' });
    assert.ok(Number((await chat_row.locator('td').last().textContent())) >= sent);

    fs.mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: path.join(artifacts, 'status-page.png'), fullPage: true });

    // Drain backend 1 with its button (the script posts it with fetch).
    const target = backends[1].url;
    const row = page.locator('#backends tr', { hasText: target });
    await row.locator('button', { hasText: 'Drain' }).click();
    await poll(async () => {
      const listed = await (await fetch(`${sluice.admin_url}/backends`)).json();
      return listed.backends.find((b) => b.url === target).draining;
    }, { timeout_ms: bound_ms(5000), interval_ms: 50, what: 'GET /backends to show the backend draining' });
    await row.locator('td.draining').waitFor();
    await row.locator('button', { hasText: 'Undrain' }).waitFor();
    const other = await (await fetch(`${sluice.admin_url}/backends`)).json();
    assert.equal(other.backends.find((b) => b.url === backends[0].url).draining, false);

    await page.emulateMedia({ colorScheme: 'dark' });
    await page.screenshot({ path: path.join(artifacts, 'status-page-dark.png'), fullPage: true });
    assert.deepEqual(problems, []);
    await page.close();
  });

  it('works with JavaScript disabled: the tables are there and the drain form posts', async (t) => {
    if (!browser) {
      t.skip(why_not);
      return;
    }
    const context = await browser.newContext({ javaScriptEnabled: false });
    const page = await context.newPage();
    await page.goto(`${sluice.admin_url}/`);
    const target = backends[0].url;
    const row = page.locator('#backends tr', { hasText: target });
    await row.waitFor();
    assert.ok(await page.locator('#keys td', { hasText: 'alice' }).count() >= 1);
    await Promise.all([page.waitForURL(`${sluice.admin_url}/`), row.locator('button', { hasText: 'Drain' }).click()]);
    const listed = await (await fetch(`${sluice.admin_url}/backends`)).json();
    assert.equal(listed.backends.find((b) => b.url === target).draining, true);
    await page.locator('#backends tr', { hasText: target }).locator('button', { hasText: 'Undrain' }).waitFor();
    await context.close();
  });
});

describe('status page in a browser, with an admin token', () => {
  let backends, sluice, browser, why_not;
  const admin_token = 'browser-admin-token-5b2a';

  before(async () => {
    ({ browser, why: why_not } = await launch());
    if (!browser) return;
    backends = await start_backends(2);
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { admin_token_env: 'SLUICE_TEST_ADMIN_TOKEN' } },
        groups: [{ name: 'g', models: ['*'], backends: backends.map((b) => b.url) }],
        keys: [{ id: 'carol', key: key_secret, groups: ['*'] }],
      }),
      env: { SLUICE_TEST_ADMIN_TOKEN: admin_token },
    });
  });
  after(async () => {
    await browser?.close();
    await stop_all(sluice, ...(backends ?? []));
  });

  it('asks for the token, then shows the data and drains with it', async (t) => {
    if (!browser) {
      t.skip(why_not);
      return;
    }
    const page = await browser.newPage();
    const problems = [];
    page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`); });
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    await page.goto(`${sluice.admin_url}/`);
    await page.locator('#note', { hasText: 'admin token' }).waitFor();
    assert.equal(await page.locator('#backends tr').count(), 0);
    await page.locator('#token').fill(admin_token);
    await page.locator('#token').dispatchEvent('change');
    await page.locator('#keys td', { hasText: 'carol' }).waitFor({ timeout: bound_ms(5000) });
    const target = backends[0].url;
    const row = page.locator('#backends tr', { hasText: target });
    await row.locator('button', { hasText: 'Drain' }).click();
    const auth = { authorization: `Bearer ${admin_token}` };
    await poll(async () => {
      const listed = await (await fetch(`${sluice.admin_url}/backends`, { headers: auth })).json();
      return listed.backends.find((b) => b.url === target).draining;
    }, { timeout_ms: bound_ms(5000), interval_ms: 50, what: 'the drain sent with the token' });
    await row.locator('button', { hasText: 'Undrain' }).waitFor();
    // The token stays in the tab (sessionStorage), never in the page's markup.
    assert.equal(await page.evaluate(() => sessionStorage.getItem('sluice-admin-token')), admin_token);
    assert.ok(!(await page.content()).includes(key_secret));
    assert.ok(!sluice.proc.output().includes(admin_token), 'the admin token reached the log');
    assert.deepEqual(problems, []);
    await page.close();
  });
});
