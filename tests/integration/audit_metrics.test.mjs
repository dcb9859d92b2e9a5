// Audit log and metrics (issue 4): one JSON line per request with the right
// fields, usage read from a stream the client did not ask usage for (and cut
// from its bytes), nothing lost or torn on SIGTERM or SIGUSR1 rotation, and
// /metrics that parses strictly as Prometheus text with counters equal to
// the requests sent.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { bound_ms, chat_body, http_post, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import {
  backend_of, gateway_config, mock_completion_tokens, mock_prompt_tokens, poll, post_fresh, read_audit, samples,
  scrape,
} from './lib/gateway.mjs';

const alice = 'sk-audit-alice-0a0a0a';
const rpm_key = 'sk-audit-rpm-1b1b1b';
const reply_tokens = 10;
const audit_name = 'sluice-audit.jsonl';

// The fields of docs/architecture.md §5 every line has (null where not known).
const audit_fields = ['time_ms', 'request_id', 'key_id', 'model', 'group', 'backend', 'session_id', 'status',
  'prompt_tokens', 'completion_tokens', 'total_tokens', 'quota_charged', 'ttft_ms', 'duration_ms', 'stream',
  'finish_reason', 'cancelled'];

async function start_gateway(backends, { extra_groups = [] } = {}) {
  return start_sluice({
    config: gateway_config({
      audit_path: audit_name,
      tables: { quota: { input_weight: 1, output_weight: 2, default_max_tokens: 4096 } },
      groups: [
        { name: 'fast', models: ['fast'], balance: 'round-robin', backends: [backends[0].url] },
        { name: 'slow', models: ['slow'], backends: [backends[1].url] },
        ...extra_groups,
      ],
      keys: [
        // A limit far above what the tests use, so that charges are settled.
        { id: 'alice', key: alice, tokens_per_minute: 10000000, groups: ['*'] },
        { id: 'rpm', key: rpm_key, requests_per_minute: 1, groups: ['*'] },
      ],
    }),
  });
}

const audit_path = (sluice) => path.join(sluice.dir, audit_name);

// Waits (bounded) until the audit file has a line for each id; returns the
// lines by id.
async function audit_lines_for(sluice, ids) {
  let by_id;
  await poll(() => {
    by_id = new Map(read_audit(audit_path(sluice)).map((l) => [l.request_id, l]));
    return ids.every((id) => by_id.has(id));
  }, { timeout_ms: bound_ms(5000), what: `audit lines for ${ids.join(', ')}` });
  return by_id;
}

// Streams, and destroys the request at the first body bytes; resolves once
// mock-vllm printed its abort line for it.
async function cancelled_stream(sluice, mock, id, body) {
  const from = mock.proc.mark();
  const reply = http_post(sluice.url, '/v1/chat/completions', body, {
    headers: { authorization: `Bearer ${alice}`, 'x-request-id': id },
    on_data: (_, req) => req.destroy(),
  }).catch(() => null);
  await mock.proc.wait_for_line(new RegExp(`abort request_id=\\S*${id}\\b`), { from, timeout_ms: bound_ms(5000) });
  await reply;
}

// Request loops for the shutdown and rotation tests: `lanes` loops of fresh-
// connection requests with ids `${prefix}-N`, until stop() or a transport
// error (sluice gone). completed: ids answered 200 with a complete body.
function load(sluice, prefix, { lanes = 16 } = {}) {
  const state = { completed: [], sent: 0, stopped: false };
  let n = 0;
  const lane = async () => {
    while (!state.stopped) {
      const i = n++;
      const id = `${prefix}-${i}`;
      const stream = i % 4 === 0;
      state.sent += 1;
      const r = await post_fresh(sluice.url, chat_body({ model: 'fast', stream, content: `load ${i}` }), { key: alice, headers: { 'x-request-id': id } });
      if (r.status === 0) return;  // sluice has stopped listening
      if (r.status === 200 && r.complete && (!stream || r.text.endsWith('data: [DONE]\n\n'))) state.completed.push(id);
    }
  };
  const running = Promise.all(Array.from({ length: lanes }, lane));
  state.stop = async () => { state.stopped = true; await running; };
  state.running = running;
  return state;
}

describe('audit log', () => {
  let backends;

  before(async () => {
    backends = [
      await start_mock_vllm({ model: 'backend-0', reply_tokens }),
      await start_mock_vllm({ model: 'backend-1', reply_tokens: 2000, tokens_per_sec: 50 }),
    ];
  });
  after(() => stop_all(...(backends ?? [])));

  it('a stream without stream_options: the client gets exactly the backend\'s bytes, the audit line the exact usage', async () => {
    const sluice = await start_gateway(backends);
    try {
      const id = 'usage-cut-1';
      const body = chat_body({ model: 'fast', stream: true, max_tokens: 16, content: 'count my words please' });
      const through = await post_fresh(sluice.url, body, { key: alice, headers: { 'x-request-id': id } });
      const direct = await post_fresh(backends[0].url, body, { headers: { 'x-request-id': id } });
      assert.equal(through.status, 200, through.text);
      assert.equal(direct.status, 200);
      assert.ok(!/"usage":\{/.test(direct.text), 'control: the backend sends no usage chunk unasked');
      assert.equal(through.text, direct.text, 'client bytes equal the direct stream (no usage chunk)');
      const line = (await audit_lines_for(sluice, [id])).get(id);
      const prompt = mock_prompt_tokens(body);
      const completion = mock_completion_tokens(body, reply_tokens);
      assert.deepEqual(
        { status: line.status, stream: line.stream, prompt: line.prompt_tokens, completion: line.completion_tokens, total: line.total_tokens, charged: line.quota_charged, finish: line.finish_reason, cancelled: line.cancelled },
        { status: 200, stream: true, prompt, completion, total: prompt + completion, charged: prompt + 2 * completion, finish: 'stop', cancelled: false });
    } finally {
      await sluice.stop();
    }
  });

  it('N mixed requests (ok, stream, cancelled, 401, 429, 400, 404) give exactly N lines with the right fields', async () => {
    const sluice = await start_gateway(backends);
    const sent = new Map();  // id -> {body, expect}
    try {
      const send = async (id, body, { key = alice, headers = {} } = {}) => {
        const r = await post_fresh(sluice.url, body, { key, headers: { 'x-request-id': id, ...headers } });
        sent.set(id, { body, status: r.status });
        return r;
      };
      for (let i = 0; i < 3; ++i) await send(`mix-ok-${i}`, chat_body({ model: 'fast', content: `ok number ${i}`, max_tokens: 4 + i * 10 }), { headers: { 'x-session-id': `sess-${i}` } });
      await send('mix-stream-0', chat_body({ model: 'fast', stream: true, content: 'a stream' }));
      await send('mix-stream-1', chat_body({ model: 'fast', stream: true, include_usage: true, content: 'a stream with usage' }));
      const cancel_body = chat_body({ model: 'slow', stream: true, max_tokens: 2000, content: 'cancel me soon' });
      await cancelled_stream(sluice, backends[1], 'mix-cancel-0', cancel_body);
      sent.set('mix-cancel-0', { body: cancel_body, status: 200 });
      await send('mix-401-0', chat_body({ model: 'fast' }), { key: 'sk-not-a-key' });
      await send('mix-401-1', chat_body({ model: 'fast' }), { key: null });
      await send('mix-rpm-ok', chat_body({ model: 'fast' }), { key: rpm_key });
      await send('mix-429-0', chat_body({ model: 'fast' }), { key: rpm_key });
      await send('mix-400-0', '{"model":"fast","messages":[', {});
      await send('mix-400-1', chat_body({ model: 'fast', max_tokens: -1 }));
      await send('mix-404-0', chat_body({ model: 'no-such-model' }));
      const ids = [...sent.keys()];
      const statuses = Object.fromEntries(ids.map((id) => [id, sent.get(id).status]));
      assert.deepEqual(statuses, {
        'mix-ok-0': 200, 'mix-ok-1': 200, 'mix-ok-2': 200, 'mix-stream-0': 200, 'mix-stream-1': 200, 'mix-cancel-0': 200,
        'mix-401-0': 401, 'mix-401-1': 401, 'mix-rpm-ok': 200, 'mix-429-0': 429, 'mix-400-0': 400, 'mix-400-1': 400, 'mix-404-0': 404,
      });

      // The writer's own count: every line on disk, none dropped or lost
      // (the batch timer writes within 100 ms).
      await poll(async () => {
        const m = (await scrape(sluice.admin_url)).parsed;
        return samples(m, 'sluice_audit_lines_total', { result: 'written' })[0]?.value === ids.length;
      }, { what: `sluice_audit_lines_total{result="written"} to reach ${ids.length}` });
      const m = (await scrape(sluice.admin_url)).parsed;
      assert.equal(samples(m, 'sluice_audit_lines_total', { result: 'dropped' })[0].value, 0);
      assert.equal(samples(m, 'sluice_audit_lines_total', { result: 'lost' })[0].value, 0);

      // SIGTERM flushes; then the file holds exactly these lines.
      const exit = await sluice.proc.stop();
      assert.equal(exit.code, 0, sluice.proc.output());
      const lines = read_audit(audit_path(sluice));
      assert.equal(lines.length, ids.length, `lines: ${lines.map((l) => l.request_id)}`);
      const by_id = new Map(lines.map((l) => [l.request_id, l]));
      assert.deepEqual([...by_id.keys()].sort(), [...ids].sort());
      for (const l of lines) {
        for (const f of audit_fields) assert.ok(f in l, `${l.request_id}: field ${f}`);
        assert.ok(Number.isInteger(l.time_ms) && Math.abs(l.time_ms - Date.now()) < 600000, `${l.request_id}: time_ms ${l.time_ms}`);
        assert.ok(Number.isInteger(l.duration_ms) && l.duration_ms >= 0, `${l.request_id}: duration_ms`);
        assert.equal(l.total_tokens, l.prompt_tokens + l.completion_tokens, `${l.request_id}: total`);
      }
      // Each group of checks runs even when an earlier one fails: one run
      // shows every wrong field.
      const problems = [];
      const check = (what, fn) => {
        try {
          fn();
        } catch (err) {
          const { actual: a, expected: e } = err;
          if (a && e && typeof a === 'object' && typeof e === 'object') {
            for (const k of Object.keys(e)) {
              if (JSON.stringify(a[k]) !== JSON.stringify(e[k])) problems.push(`${what}.${k}: ${JSON.stringify(a[k])}, want ${JSON.stringify(e[k])}`);
            }
          } else {
            problems.push(`${what}: ${err.message.split('\n')[0]} (${JSON.stringify(a)}, want ${JSON.stringify(e)})`);
          }
        }
      };
      const ok = (id, { stream = false, key_id = 'alice', charged = true } = {}) => {
        const l = by_id.get(id);
        const { body } = sent.get(id);
        const prompt = mock_prompt_tokens(body);
        const completion = mock_completion_tokens(body, reply_tokens);
        assert.deepEqual(
          { status: l.status, key_id: l.key_id, model: l.model, group: l.group, backend: l.backend, stream: l.stream, cancelled: l.cancelled,
            prompt: l.prompt_tokens, completion: l.completion_tokens, finish: l.finish_reason },
          { status: 200, key_id, model: 'fast', group: 'fast', backend: backends[0].url, stream, cancelled: false,
            prompt, completion, finish: completion < reply_tokens ? 'length' : 'stop' }, id);
        if (charged) assert.equal(l.quota_charged, prompt + 2 * completion, `${id}: quota_charged`);
        if (stream) assert.ok(Number.isInteger(l.ttft_ms) && l.ttft_ms >= 0, `${id}: ttft_ms ${l.ttft_ms}`);
      };
      for (let i = 0; i < 3; ++i) {
        check(`mix-ok-${i}`, () => ok(`mix-ok-${i}`));
        check(`mix-ok-${i} session`, () => assert.equal(by_id.get(`mix-ok-${i}`).session_id, `sess-${i}`));
      }
      check('mix-stream-0', () => ok('mix-stream-0', { stream: true }));
      check('mix-stream-1', () => ok('mix-stream-1', { stream: true }));
      check('mix-rpm-ok', () => ok('mix-rpm-ok', { key_id: 'rpm', charged: false }));

      const c = by_id.get('mix-cancel-0');
      check('mix-cancel-0', () => assert.deepEqual(
        { cancelled: c.cancelled, status_ok: [200, 499].includes(c.status), key_id: c.key_id, stream: c.stream, group: c.group },
        { cancelled: true, status_ok: true, key_id: 'alice', stream: true, group: 'slow' }));
      // Charged for the prompt and what was streamed before the client left.
      // No usage chunk came, so the prompt count is sluice's estimate: not
      // exact, but not nothing, and the charge follows the recorded counts.
      check('mix-cancel-0 prompt_tokens >= 1', () => assert.ok(c.prompt_tokens >= 1, `${c.prompt_tokens}`));
      check('mix-cancel-0 completion_tokens in [1, 2000)', () => assert.ok(c.completion_tokens >= 1 && c.completion_tokens < 2000));
      check('mix-cancel-0 quota_charged = prompt_tokens + 2 x completion_tokens', () => assert.equal(c.quota_charged, c.prompt_tokens + 2 * c.completion_tokens));

      for (const id of ['mix-401-0', 'mix-401-1']) {
        const l = by_id.get(id);
        check(id, () => assert.deepEqual({ status: l.status, key_id: l.key_id, error: l.error, tokens: l.total_tokens, charged: l.quota_charged, backend: l.backend },
          { status: 401, key_id: null, error: 'invalid_api_key', tokens: 0, charged: 0, backend: null }, id));
      }
      const r429 = by_id.get('mix-429-0');
      check('mix-429-0', () => assert.deepEqual({ status: r429.status, key_id: r429.key_id, error: r429.error, tokens: r429.total_tokens, charged: r429.quota_charged, backend: r429.backend },
        { status: 429, key_id: 'rpm', error: 'rate_limit_exceeded', tokens: 0, charged: 0, backend: null }));
      for (const id of ['mix-400-0', 'mix-400-1']) {
        const l = by_id.get(id);
        check(id, () => assert.deepEqual({ status: l.status, key_id: l.key_id, tokens: l.total_tokens, charged: l.quota_charged, backend: l.backend },
          { status: 400, key_id: 'alice', tokens: 0, charged: 0, backend: null }, id));
      }
      const r404 = by_id.get('mix-404-0');
      check('mix-404-0', () => assert.deepEqual({ status: r404.status, key_id: r404.key_id, error: r404.error, model: r404.model, backend: r404.backend },
        { status: 404, key_id: 'alice', error: 'model_not_found', model: 'no-such-model', backend: null }));
      assert.deepEqual(problems, []);
    } finally {
      await sluice.stop();
    }
  });

  it('SIGTERM under load: every completed request has its line, no line is torn or doubled', async () => {
    const sluice = await start_gateway(backends);
    let traffic;
    try {
      traffic = load(sluice, 'term');
      await poll(() => traffic.completed.length >= 300, { timeout_ms: bound_ms(20000), what: '300 completed requests' });
      const exit = await sluice.proc.stop();
      await traffic.stop();
      assert.equal(exit.code, 0, sluice.proc.output());
      const lines = read_audit(audit_path(sluice));   // throws on a torn line
      const ids = lines.map((l) => l.request_id);
      assert.equal(new Set(ids).size, ids.length, 'no request id twice');
      const have = new Set(ids);
      const missing = traffic.completed.filter((id) => !have.has(id));
      console.log(`SIGTERM: ${traffic.sent} sent, ${traffic.completed.length} completed, ${lines.length} audit lines`);
      assert.deepEqual(missing, [], 'completed requests without an audit line');
      assert.ok(lines.length <= traffic.sent);
    } finally {
      await traffic?.stop();
      await sluice.stop();
    }
  });

  it('SIGUSR1 after renaming the file: lines continue in a new file, none lost, none doubled', async () => {
    const sluice = await start_gateway(backends);
    let traffic;
    try {
      traffic = load(sluice, 'rot');
      // Some lines on disk before the rename (a batch waits up to 100 ms),
      // so the rotated file is not empty whatever the speed.
      await poll(() => traffic.completed.length >= 200 && read_audit(audit_path(sluice)).length >= 1,
        { timeout_ms: bound_ms(20000), what: '200 completed requests and a first batch on disk' });
      const rotated = `${audit_path(sluice)}.1`;
      fs.renameSync(audit_path(sluice), rotated);
      sluice.proc.child.kill('SIGUSR1');
      const at_signal = traffic.completed.length;
      await poll(() => read_audit(audit_path(sluice)).length >= 50 && traffic.completed.length >= at_signal + 200,
        { timeout_ms: bound_ms(20000), what: 'a new audit file with 50 lines and 200 more completed requests' });
      await traffic.stop();
      const exit = await sluice.proc.stop();
      assert.equal(exit.code, 0, sluice.proc.output());
      const old_lines = read_audit(rotated);
      const new_lines = read_audit(audit_path(sluice));
      const ids = [...old_lines, ...new_lines].map((l) => l.request_id);
      console.log(`SIGUSR1: ${old_lines.length} lines in the rotated file, ${new_lines.length} in the new one; ${traffic.completed.length} completed`);
      // Lines of requests completed just before the rename may still have
      // been in a batch: they belong in the new file, which is fine.
      assert.ok(old_lines.length >= 1 && new_lines.length >= 50, `${old_lines.length} / ${new_lines.length}`);
      assert.equal(new Set(ids).size, ids.length, 'no request id twice');
      const have = new Set(ids);
      assert.deepEqual(traffic.completed.filter((id) => !have.has(id)), [], 'completed requests without an audit line');
    } finally {
      await traffic?.stop();
      await sluice.stop();
    }
  });
});

// ---------------------------------------------------------------------------

describe('/metrics', () => {
  let backends;
  let sluice;

  before(async () => {
    backends = [
      await start_mock_vllm({ model: 'backend-0', reply_tokens }),
      await start_mock_vllm({ model: 'backend-1', reply_tokens }),
      await start_mock_vllm({ model: 'backend-2', reply_tokens }),
    ];
    sluice = await start_sluice({
      config: gateway_config({
        groups: [
          { name: 'g1', models: ['m1'], balance: 'round-robin', backends: [backends[0].url, backends[1].url] },
          { name: 'g2', models: ['m2'], backends: [backends[2].url] },
        ],
        keys: [
          { id: 'alice', key: alice, groups: ['*'] },
          { id: 'rpm', key: rpm_key, requests_per_minute: 1, groups: ['*'] },
        ],
      }),
    });
  });
  after(() => stop_all(sluice, ...(backends ?? [])));

  const expected = new Map();   // "group|backend|code" -> count; "*|*|code" for errors
  const tokens = new Map();     // "group|kind" -> count
  const add = (map, k, n = 1) => map.set(k, (map.get(k) ?? 0) + n);
  const sorted = (map) => [...map].sort();

  const send = async (model, body_extra, key, { stream = false } = {}) => {
    const body = typeof body_extra === 'string' ? body_extra : chat_body({ model, stream, ...body_extra });
    const r = await post_fresh(sluice.url, body, { key });
    if (r.status === 200) {
      const b = backend_of(r.text);
      const group = model === 'm1' ? 'g1' : 'g2';
      add(expected, `${group}|${backends[b].url}|200`);
      add(tokens, `${group}|prompt`, mock_prompt_tokens(body));
      add(tokens, `${group}|completion`, mock_completion_tokens(body, reply_tokens));
    } else {
      add(expected, `*|*|${r.status}`);
    }
    return r.status;
  };

  const actual_of = (m) => {
    const got = new Map();
    for (const s of samples(m.parsed, 'sluice_requests_total')) {
      if (s.value === 0) continue;
      const k = s.labels.code === '200' ? `${s.labels.group}|${s.labels.backend}|200` : `*|*|${s.labels.code}`;
      add(got, k, s.value);
    }
    return got;
  };

  // Scrapes until sluice_requests_total equals what was sent (counters are
  // bumped as requests end), then asserts it; returns the last scrape.
  async function scrape_matching() {
    let last;
    try {
      await poll(async () => {
        last = await scrape(sluice.admin_url);
        return JSON.stringify(sorted(actual_of(last))) === JSON.stringify(sorted(expected));
      }, { timeout_ms: bound_ms(3000), what: 'sluice_requests_total to match' });
    } catch { /* the deepEqual below shows the difference */ }
    assert.deepEqual(sorted(actual_of(last)), sorted(expected));
    for (const s of samples(last.parsed, 'sluice_requests_total')) {
      assert.deepEqual(Object.keys(s.labels).sort(), ['backend', 'code', 'group', 'protocol']);
      // A backend's series name its protocol; one no backend answered, none.
      assert.equal(s.labels.protocol, s.labels.backend === '' ? '' : 'openai', JSON.stringify(s.labels));
    }
    return last;
  }

  it('parses as Prometheus text and sluice_requests_total{group,backend,code} matches the requests sent', async () => {
    const first = await scrape(sluice.admin_url);
    assert.match(first.content_type ?? '', /^text\/plain; version=0\.0\.4/);
    const statuses = [];
    for (let i = 0; i < 7; ++i) statuses.push(await send('m1', { content: `g1 request ${i}`, max_tokens: 3 + i }, alice));
    for (let i = 0; i < 4; ++i) statuses.push(await send('m2', { content: `g2 request ${i}` }, alice, { stream: i % 2 === 1 }));
    for (let i = 0; i < 3; ++i) statuses.push(await send('m1', {}, `sk-wrong-${i}`));
    for (let i = 0; i < 2; ++i) statuses.push(await send('m1', '{"model":"m1","messages":', alice));
    statuses.push(await send('nope', {}, alice));
    assert.equal(statuses.join(','), [...Array(11).fill(200), 401, 401, 401, 400, 400, 404].join(','));
    const last = await scrape_matching();

    // Tokens by group and kind, from the backends' usage.
    for (const [k, n] of tokens) {
      const [group, kind] = k.split('|');
      const got = samples(last.parsed, 'sluice_tokens_total', { group, kind }).reduce((a, s) => a + s.value, 0);
      assert.equal(got, n, `sluice_tokens_total{group="${group}",kind="${kind}"}`);
    }
    // Health and histograms.
    for (const b of backends) {
      assert.deepEqual(samples(last.parsed, 'sluice_backend_up', { backend: b.url, protocol: 'openai' }).map((s) => s.value), [1], `sluice_backend_up ${b.url}`);
    }
    for (const h of ['sluice_ttft_seconds', 'sluice_request_duration_seconds']) {
      assert.equal(last.parsed.families.get(h)?.type, 'histogram', h);
    }
    const durations = samples(last.parsed, 'sluice_request_duration_seconds_count').reduce((a, s) => a + s.value, 0);
    assert.ok(durations >= 11, `sluice_request_duration_seconds_count ${durations} covers the 11 answered by backends`);
    assert.equal(samples(last.parsed, 'sluice_inflight_requests').length, 1);
  });

  it('quota rejections: code="429" in sluice_requests_total and sluice_quota_rejected_total{key}', async () => {
    const statuses = [];
    for (let i = 0; i < 3; ++i) statuses.push(await send('m2', { content: `limited ${i}` }, rpm_key));
    assert.deepEqual(statuses, [200, 429, 429]);
    const last = await scrape_matching();
    const rejected = samples(last.parsed, 'sluice_quota_rejected_total', { key: 'rpm' }).reduce((a, s) => a + s.value, 0);
    assert.equal(rejected, 2, 'sluice_quota_rejected_total{key="rpm"}');
  });

  it('the strict parser rejects what Prometheus would (so the test above can fail)', async () => {
    const { parse_prometheus } = await import('./lib/gateway.mjs');
    const good = '# HELP a_total A.\n# TYPE a_total counter\na_total{x="1"} 2\n';
    assert.doesNotThrow(() => parse_prometheus(good));
    for (const bad of [
      'a_total 1\n',                                                    // no TYPE
      '# TYPE a_total counter\na_total{x="1"} 2\na_total{x="1"} 3\n',   // duplicate series
      '# TYPE a_total counter\na_total{x=1} 2\n',                       // unquoted label
      '# TYPE a_total counter\na_total{x="\\q"} 2\n',                   // bad escape
      '# TYPE a_total counter\na_total two\n',                          // bad value
      '# TYPE a_total counter\na_total 1',                              // no final newline
      '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',  // not cumulative
      '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n',  // +Inf != count
    ]) {
      assert.throws(() => parse_prometheus(bad), undefined, JSON.stringify(bad));
    }
  });
});

const sum_of = (m, name, labels) => samples(m, name, labels).reduce((a, x) => a + x.value, 0);

// `n` streams open at once on one shard, tokens 0.5 ms apart for 1.5 s.
// Returns the loop counters over 10+ iterations while all are open, and
// whether each stream ended whole.
async function open_streams(n, server_table) {
  const slow = await start_mock_vllm({ model: 'slow', reply_tokens: 3000, tokens_per_sec: 2000 });
  const sluice = await start_sluice({
    config: gateway_config({
      tables: server_table ? { server: server_table } : {},
      groups: [{ name: 'g', models: ['m'], backends: [slow.url] }],
      keys: [{ id: 'alice', key: alice, groups: ['*'] }],
    }),
    extra_args: ['--cpus', '0'],  // one shard: every request is its
  });
  try {
    const loop = async () => {
      const m = (await scrape(sluice.admin_url)).parsed;
      return {
        iterations: sum_of(m, 'sluice_loop_iterations_total'),
        polls: sum_of(m, 'sluice_loop_polls_total'),
        batched: sum_of(m, 'sluice_loop_batched_waits_total'),
      };
    };
    const streams = Array.from({ length: n }, (_, i) => {
      let first;
      const started = new Promise((resolve) => { first = resolve; });
      const result = post_fresh(sluice.url, chat_body({ model: 'm', stream: true, content: `open ${i}`, max_tokens: 3000 }),
        { key: alice, on_data: () => first() });
      const x = { started, result, ended: false };
      result.then(() => { x.ended = true; first(); });
      return x;
    });
    await Promise.all(streams.map((x) => x.started));
    // The loop reads the open count once per iteration: two more, and
    // what it did before the last request opened is published.
    const opened = await loop();
    let before;
    await poll(async () => (before = await loop()).iterations >= opened.iterations + 2,
      { timeout_ms: bound_ms(5000), what: '2 loop iterations' });
    let after;
    await poll(async () => (after = await loop()).iterations >= before.iterations + 10,
      { timeout_ms: bound_ms(5000), what: `10 loop iterations with ${n} streams open` });
    const all_open = streams.every((x) => !x.ended);
    const whole = [];
    for (const x of streams) {
      const r = await x.result;
      whole.push(r.status === 200 && r.text.endsWith('data: [DONE]\n\n'));
    }
    return { before, after, all_open, whole };
  } finally {
    await stop_all(sluice, slow);
  }
}

describe('idle polling (server.idle_poll_us)', () => {
  let backend;
  before(async () => { backend = await start_mock_vllm({ model: 'backend-0', reply_tokens }); });
  after(() => stop_all(backend));

  // One request after another, each on its own connection: at most one
  // request is open, so a shard may poll before it sleeps. Returns the
  // scrape after the last request and the bodies' completion counts.
  async function sequential(server_table) {
    const sluice = await start_sluice({
      config: gateway_config({
        tables: server_table ? { server: server_table } : {},
        groups: [{ name: 'g', models: ['m'], backends: [backend.url] }],
        keys: [{ id: 'alice', key: alice, groups: ['*'] }],
      }),
    });
    try {
      const completions = [];
      const served = new Set();  // the shards that answered: a request id sluice makes starts with its shard
      for (let i = 0; i < 20; ++i) {
        const r = await post_fresh(sluice.url, chat_body({ model: 'm', content: `poll ${i}`, max_tokens: 4 }), { key: alice });
        assert.equal(r.status, 200, r.text);
        completions.push(JSON.parse(r.text).usage.completion_tokens);
        served.add(String(parseInt(r.headers['x-request-id'].slice(0, 2), 16)));
      }
      return { m: (await scrape(sluice.admin_url)).parsed, completions, served };
    } finally {
      await sluice.stop();
    }
  }
  const sum = (m, name, labels) => samples(m, name, labels).reduce((a, s) => a + s.value, 0);

  it('by default every shard polls before it sleeps while few requests are open, and says how long', async () => {
    const { m, completions, served } = await sequential(null);
    assert.deepEqual(completions, Array(20).fill(4));
    // The window starts at its largest, so a shard's first wait with
    // nothing open starts with a poll, whatever it then catches (later
    // waits adapt the window to the traffic: see poll_window.hpp). Only the
    // shards that served: the kernel may put every connection on one
    // (with [server] reuseport_steering, all of a loopback client's land on
    // the shard of its CPU), and a shard without traffic sleeps in one wait.
    const shards = new Set(samples(m, 'sluice_loop_polls_total').map((s) => s.labels.shard));
    assert.ok(served.size >= 1);
    for (const shard of served) assert.ok(shards.has(shard), `shard ${shard} has no poll series`);
    for (const shard of served) {
      const polls = sum(m, 'sluice_loop_polls_total', { shard });
      assert.ok(polls >= 1, `shard ${shard}: ${polls} polls`);
      assert.ok(sum(m, 'sluice_loop_poll_seconds_total', { shard }) > 0, `shard ${shard}: poll seconds`);
    }
  });

  it('a shard with 3 requests open never polls: over 10+ loop iterations the poll counters stand still', async () => {
    // Tokens 0.5 ms apart for 1.5 s: waits a 1 ms window would catch, so a
    // shard allowed to poll would poll on most iterations.
    const { before, after, all_open, whole } = await open_streams(3, { idle_poll_us: 1000 });
    // What is measured holds only while all three are open (1.5 s each).
    assert.ok(all_open, 'the streams were still open when the counters were read');
    assert.equal(after.polls, before.polls, `polls over ${after.iterations - before.iterations} iterations`);
    assert.deepEqual(whole, [true, true, true], 'each stream ends whole');
  });

  it('a shard with 3 quiet client connections open never polls, though one request at a time is open', async () => {
    // Three clients connected and quiet, a fourth sending one request after
    // another, each on a new connection (so at least 3 are open between
    // them): with many clients a wake-up serves several, so the shard
    // sleeps rather than polls. The same requests alone poll (above).
    const sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { idle_poll_us: 1000 } },
        groups: [{ name: 'g', models: ['m'], backends: [backend.url] }],
        keys: [{ id: 'alice', key: alice, groups: ['*'] }],
      }),
      extra_args: ['--cpus', '0'],  // one shard: all three connections are its
    });
    const quiet = [];
    try {
      const { port } = new URL(sluice.url);
      for (let i = 0; i < 3; ++i) {
        const c = net.connect(Number(port), '127.0.0.1');
        c.on('error', () => {});
        c.on('close', () => { c.closed_early = true; });
        quiet.push(c);
        await once(c, 'connect');
      }
      const gauge = async () => sum((await scrape(sluice.admin_url)).parsed, 'sluice_connections_open');
      await poll(async () => (await gauge()) === 3, { timeout_ms: bound_ms(5000), what: 'the 3 quiet connections accepted' });
      const polls = async () => sum((await scrape(sluice.admin_url)).parsed, 'sluice_loop_polls_total');
      const before = await polls();
      for (let i = 0; i < 10; ++i) {
        const r = await post_fresh(sluice.url, chat_body({ model: 'm', content: `quiet ${i}`, max_tokens: 4 }), { key: alice });
        assert.equal(r.status, 200, r.text);
        assert.equal(JSON.parse(r.text).usage.completion_tokens, 4);
      }
      // The last fresh connection is closed by its client once the answer is
      // read; the shard sees that close a moment later, so the gauge is
      // polled back to 3 while the quiet sockets themselves must never close.
      assert.deepEqual(quiet.map((c) => c.closed_early === true), [false, false, false], 'the quiet connections stayed open throughout');
      await poll(async () => (await gauge()) === 3, { timeout_ms: bound_ms(5000), what: 'only the 3 quiet connections open' });
      assert.equal(await polls(), before, 'no poll while 3 or more client connections were open');
    } finally {
      for (const c of quiet) c.destroy();
      await sluice.stop();
    }
  });

  it('idle_poll_us = 0: the same requests, answered the same, and never a poll', async () => {
    const { m, completions } = await sequential({ idle_poll_us: 0 });
    assert.deepEqual(completions, Array(20).fill(4));
    assert.equal(sum(m, 'sluice_loop_polls_total'), 0);
    assert.equal(sum(m, 'sluice_loop_poll_seconds_total'), 0);
    assert.ok(samples(m, 'sluice_loop_polls_total').length > 0, 'the family is there, at 0');
  });
});

describe('batched waits (server.batch_wait_us)', () => {
  it('batch_wait_us = 50 with 10 streams open: the shard asks for batches, and every stream ends whole', async () => {
    const { before, after, all_open, whole } = await open_streams(10, { batch_wait_us: 50 });
    assert.ok(all_open, 'the streams were still open when the counters were read');
    assert.deepEqual(whole, Array(10).fill(true));
    // Linux 6.12 has the batched wait; an older kernel waits as before.
    const [major, minor] = os.release().split('.').map(Number);
    if (major > 6 || (major === 6 && minor >= 12)) {
      assert.ok(after.batched > before.batched, `batched waits over ${after.iterations - before.iterations} iterations: ${after.batched - before.batched}`);
    } else {
      assert.equal(after.batched, 0);
    }
  });

  it('by default (off), or with only 3 streams open, no wait asks for a batch', async () => {
    const few = await open_streams(3, { batch_wait_us: 50 });
    assert.ok(few.all_open);
    assert.deepEqual(few.whole, Array(3).fill(true));
    assert.equal(few.after.batched, 0);
    const off = await open_streams(10, null);
    assert.ok(off.all_open);
    assert.deepEqual(off.whole, Array(10).fill(true));
    assert.equal(off.after.batched, 0);
  });
});

describe('audit durability on /metrics', () => {
  let mock, sluice;

  before(async () => {
    mock = await start_mock_vllm({});
    sluice = await start_sluice({ backends: [mock.url] });
  });
  after(() => stop_all(sluice, mock));

  it('written audit lines are fdatasync\'ed (sluice_audit_fsyncs_total) with no write errors', async () => {
    const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({}), { headers: { authorization: `Bearer ${test_key}` } });
    assert.equal(r.status, 200);
    const value = (m, name, labels) => samples(m, name, labels).reduce((a, s) => a + s.value, 0);
    await poll(async () => value((await scrape(sluice.admin_url)).parsed, 'sluice_audit_fsyncs_total', { result: 'ok' }) >= 1,
      { what: 'an audit fdatasync within fsync_interval_ms (1 s)' });
    const m = (await scrape(sluice.admin_url)).parsed;
    assert.equal(value(m, 'sluice_audit_write_errors_total'), 0);
    assert.equal(value(m, 'sluice_audit_fsyncs_total', { result: 'failed' }), 0);
  });
});
