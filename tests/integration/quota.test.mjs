// Quota (issue 4): reserve at admission (input estimate x input_weight +
// max_tokens x output_weight), settle on the backend's real usage, 429 with
// OpenAI's body and headers, x-ratelimit-* on success too.
//
// Numbers: tokens_per_minute = 3000, weights 1 and 2, max_tokens = 1000, so a
// request reserves a bit over 2000 and settles at prompt + 2 x 10 (the mock
// answers 10 tokens). Requests go on fresh connections, so they land on
// different shards: the limits are the key's, not a shard's.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { chat_body, http_post, is_openai_error, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';
import { gateway_config, header_of, poll, post_fresh, read_audit, recorded_requests, samples, scrape } from './lib/gateway.mjs';

const keys = {
  seq: 'sk-quota-seq-1111',
  conc: 'sk-quota-conc-2222',
  huge: 'sk-quota-huge-3333',
  rpm: 'sk-quota-rpm-4444',
  hdr: 'sk-quota-hdr-5555',
  rpm2: 'sk-quota-rpm2-6666',
};

// OpenAI-style durations: "1.2s", "40ms", "6m0s", "1h2m3s".
const duration_re = /^(?=\d)(\d+h)?(\d+m(?!s))?(\d+(\.\d+)?s)?(\d+ms)?$/;
const uint_re = /^\d+$/;

function assert_ratelimit_headers(headers, { tokens_limit, requests_limit }, what) {
  if (tokens_limit !== undefined) {
    assert.equal(headers['x-ratelimit-limit-tokens'], String(tokens_limit), `${what}: x-ratelimit-limit-tokens`);
    assert.match(headers['x-ratelimit-remaining-tokens'] ?? '', uint_re, `${what}: x-ratelimit-remaining-tokens`);
    assert.ok(Number(headers['x-ratelimit-remaining-tokens']) <= tokens_limit, `${what}: remaining <= limit`);
    assert.match(headers['x-ratelimit-reset-tokens'] ?? '', duration_re, `${what}: x-ratelimit-reset-tokens`);
  }
  if (requests_limit !== undefined) {
    assert.equal(headers['x-ratelimit-limit-requests'], String(requests_limit), `${what}: x-ratelimit-limit-requests`);
    assert.match(headers['x-ratelimit-remaining-requests'] ?? '', uint_re, `${what}: x-ratelimit-remaining-requests`);
    assert.ok(Number(headers['x-ratelimit-remaining-requests']) <= requests_limit, `${what}: remaining <= limit`);
    assert.match(headers['x-ratelimit-reset-requests'] ?? '', duration_re, `${what}: x-ratelimit-reset-requests`);
  }
}

// A 429 as OpenAI sends it. Returns the parsed error. A retryable one says
// when ("Please try again in 1.2s." / "20ms" / "1m12.16s") and carries
// retry-after and retry-after-ms, which agree; a request that can never fit
// says so instead and carries x-should-retry: false.
function assert_rate_limited(r, type, what, { retryable = true } = {}) {
  assert.equal(r.status, 429, `${what}: ${r.text}`);
  const json = JSON.parse(r.text);
  assert.ok(is_openai_error(json), `${what}: ${r.text}`);
  assert.equal(json.error.type, type, `${what}: type`);
  assert.equal(json.error.code, 'rate_limit_exceeded', `${what}: code`);
  assert.ok(r.headers['content-type']?.startsWith('application/json'), `${what}: content-type`);
  if (!retryable) return json.error;
  const when = json.error.message.match(/Please try again in (\S+)\.$/);
  assert.ok(when && duration_re.test(when[1]), `${what}: message ${JSON.stringify(json.error.message)}`);
  assert.match(r.headers['retry-after'] ?? '', uint_re, `${what}: retry-after`);
  assert.match(r.headers['retry-after-ms'] ?? '', uint_re, `${what}: retry-after-ms`);
  const ms = Number(r.headers['retry-after-ms']);
  const s = Number(r.headers['retry-after']);
  // A request that fits the bucket fits after at most one full refill.
  assert.ok(ms > 0 && ms <= 60000, `${what}: retry-after-ms ${ms} within a minute`);
  assert.ok(s >= Math.floor(ms / 1000) && s <= Math.ceil(ms / 1000), `${what}: retry-after ${s} s agrees with retry-after-ms ${ms}`);
  return json.error;
}

describe('token and request buckets', () => {
  let fast;
  let slow;
  let sluice;

  before(async () => {
    fast = await start_mock_vllm({ model: 'backend-0', reply_tokens: 10 });
    // Holds each request ~1.5 s before the first token: the first of five
    // concurrent requests is still in flight (reserved, not settled) when the
    // others are admitted or refused.
    slow = await start_mock_vllm({ model: 'backend-1', reply_tokens: 10, ttft_ms: 1500 });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { quota: { input_weight: 1, output_weight: 2, default_max_tokens: 4096 } },
        groups: [
          { name: 'fast', models: ['fast'], backends: [fast.url] },
          { name: 'slow', models: ['slow'], backends: [slow.url] },
        ],
        keys: [
          { id: 'seq', key: keys.seq, tokens_per_minute: 3000, groups: ['*'] },
          { id: 'conc', key: keys.conc, tokens_per_minute: 3000, groups: ['*'] },
          { id: 'huge', key: keys.huge, tokens_per_minute: 3000, groups: ['*'] },
          { id: 'rpm', key: keys.rpm, requests_per_minute: 5, groups: ['*'] },
          { id: 'hdr', key: keys.hdr, tokens_per_minute: 3000, requests_per_minute: 100, groups: ['*'] },
          { id: 'rpm2', key: keys.rpm2, requests_per_minute: 5, groups: ['*'] },
        ],
      }),
    });
  });
  after(() => stop_all(sluice, fast, slow));

  it('20 sequential requests with max_tokens = 1000 all succeed (each reserves > 2000 of 3000, settles ~30)', async () => {
    const statuses = [];
    for (let i = 0; i < 20; ++i) {
      const r = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 1000, content: `sequential ${i}` }), { key: keys.seq });
      statuses.push(r.status);
      if (r.status !== 200) {
        assert.fail(`request ${i}: ${r.status} ${r.text} ${JSON.stringify(r.headers)} (earlier: ${statuses.slice(0, -1)})`);
      }
      assert_ratelimit_headers(r.headers, { tokens_limit: 3000 }, `request ${i}`);
    }
  });

  it('5 concurrent requests: one is admitted, four get 429 type "tokens" with retry headers', async () => {
    const replies = await Promise.all(Array.from({ length: 5 }, (_, i) =>
      post_fresh(sluice.url, chat_body({ model: 'slow', max_tokens: 1000, content: `concurrent ${i}` }), { key: keys.conc })));
    const ok = replies.filter((r) => r.status === 200);
    const limited = replies.filter((r) => r.status === 429);
    assert.equal(ok.length, 1, `admitted: ${replies.map((r) => r.status)}`);
    assert.equal(limited.length, 4, `statuses: ${replies.map((r) => r.status)}`);
    for (const [i, r] of limited.entries()) {
      assert_rate_limited(r, 'tokens', `429 #${i}`);
      assert_ratelimit_headers(r.headers, { tokens_limit: 3000 }, `429 #${i}`);
      // The one in flight holds > 2000 of 3000: what is left is less than
      // one request's reservation.
      assert.ok(Number(r.headers['x-ratelimit-remaining-tokens']) < 2000, `remaining ${r.headers['x-ratelimit-remaining-tokens']}`);
      assert.notEqual(r.headers['x-should-retry'], 'false', 'it will fit later: retrying is right');
    }
    assert.equal((await recorded_requests([slow])).length, 1, 'only the admitted request reached the backend');
  });

  it('a request larger than the whole bucket gets 429 with x-should-retry: false and reaches no backend', async () => {
    await fast.clear_requests();
    // 2000 output tokens x 2 = 4000 > 3000: it can never fit.
    const r = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 2000 }), { key: keys.huge });
    assert_rate_limited(r, 'tokens', 'too large', { retryable: false });
    assert.equal(r.headers['x-should-retry'], 'false');
    assert.deepEqual(await recorded_requests([fast]), []);
    // A request that fits is still served: the refusal took nothing.
    const ok = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 1000 }), { key: keys.huge });
    assert.equal(ok.status, 200, ok.text);
  });

  it('each of n answers is reserved: n x max_tokens past the bucket is refused; n past 128 is a 400', async () => {
    await fast.clear_requests();
    // 10 x 200 output tokens x 2 = 4000 > 3000, though one answer's 400 fits.
    const r = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 200, extra: { n: 10 } }), { key: keys.huge });
    assert_rate_limited(r, 'tokens', 'n x max_tokens too large', { retryable: false });
    const b = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 200, extra: { n: 2, best_of: 10 } }), { key: keys.huge });
    assert_rate_limited(b, 'tokens', 'best_of x max_tokens too large', { retryable: false });
    const bad = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 10, extra: { n: 129 } }), { key: keys.huge });
    assert.equal(bad.status, 400, bad.text);
    const err = JSON.parse(bad.text).error;
    assert.equal(err.param, 'n');
    assert.deepEqual(await recorded_requests([fast]), []);
    const ok = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 200, extra: { n: 2 } }), { key: keys.huge });
    assert.equal(ok.status, 200, ok.text);
  });

  it('a 200 carries x-ratelimit-* for tokens and requests, and openai-processing-ms', async () => {
    const r = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 100 }), { key: keys.hdr });
    assert.equal(r.status, 200, r.text);
    assert_ratelimit_headers(r.headers, { tokens_limit: 3000, requests_limit: 100 }, '200');
    // One request taken from a full bucket of 100 (refill may have added a fraction).
    assert.equal(r.headers['x-ratelimit-remaining-requests'], '99');
    // Whether it shows the reservation or the settled cost, something was taken.
    assert.ok(Number(r.headers['x-ratelimit-remaining-tokens']) < 3000, `remaining tokens ${r.headers['x-ratelimit-remaining-tokens']}`);
    assert.match(r.headers['openai-processing-ms'] ?? '', uint_re);
  });

  it('requests_per_minute = 5: the 6th request gets 429 type "requests"', async () => {
    const replies = [];
    for (let i = 0; i < 6; ++i) replies.push(await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 5 }), { key: keys.rpm }));
    assert.deepEqual(replies.map((r) => r.status), [200, 200, 200, 200, 200, 429], replies[5].text);
    for (const [i, r] of replies.slice(0, 5).entries()) {
      assert_ratelimit_headers(r.headers, { requests_limit: 5 }, `request ${i}`);
      assert.ok(Number(r.headers['x-ratelimit-remaining-requests']) <= 4, `request ${i}: its own request is taken`);
    }
    const error = assert_rate_limited(replies[5], 'requests', '6th');
    assert.ok(error.message.length > 0);
    assert_ratelimit_headers(replies[5].headers, { requests_limit: 5 }, '6th');
    assert.equal(replies[5].headers['x-ratelimit-remaining-requests'], '0');
    // One request per 12 s refills: the wait is at most that.
    assert.ok(Number(replies[5].headers['retry-after-ms']) <= 12000, `retry-after-ms ${replies[5].headers['retry-after-ms']}`);
  });

  it('x-ratelimit-remaining-requests is the key\'s, not a shard\'s: 4, 3, 2, 1, 0 over fresh connections', async () => {
    const remaining = [];
    for (let i = 0; i < 5; ++i) {
      const r = await post_fresh(sluice.url, chat_body({ model: 'fast', max_tokens: 5 }), { key: keys.rpm2 });
      assert.equal(r.status, 200, r.text);
      remaining.push(r.headers['x-ratelimit-remaining-requests']);
    }
    assert.deepEqual(remaining, ['4', '3', '2', '1', '0']);
  });
});

describe('a request parked for quota', () => {
  let mock;
  let sluice;
  const key = 'sk-quota-park-7777';

  before(async () => {
    // Each stream lasts ~2 s (20 tokens at 10 per second).
    mock = await start_mock_vllm({ reply_tokens: 20, tokens_per_sec: 10 });
    // One shard (no borrow rounds: the wait is the refill's) and a cost of
    // max_tokens alone: 250 tokens per minute refill one token in 240 ms,
    // just within the 250 ms a request waits for quota before its 429.
    sluice = await start_sluice({
      config: gateway_config({
        tables: { quota: { input_weight: 0, output_weight: 1 } },
        groups: [{ name: 'g', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'park', key, tokens_per_minute: 250, groups: ['*'] }],
      }),
      extra_args: ['--cpus', '0'],
    });
  });
  after(() => stop_all(sluice, mock));

  it('whose client leaves is audited 499 client_closed and never reaches the backend', async () => {
    // A takes the whole bucket and holds it while its stream runs.
    let admitted;
    const streaming = new Promise((resolve) => { admitted = resolve; });
    const a = http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 250, stream: true }), {
      headers: { authorization: `Bearer ${key}`, 'x-request-id': 'holds-the-bucket' },
      on_data: () => admitted(),
    });
    await streaming;
    // B needs one token: it parks until the refill brings it.
    let b_req;
    const b = http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 1 }), {
      headers: { authorization: `Bearer ${key}`, 'x-request-id': 'left-while-parked' },
      on_request: (req) => { b_req = req; },
    }).catch((err) => ({ error: err }));
    await poll(async () => {
      const { parsed } = await scrape(sluice.admin_url);
      return samples(parsed, 'sluice_inflight_requests')[0]?.value >= 2;
    }, { interval_ms: 5, what: 'both requests to be open' });
    b_req.destroy();
    assert.ok((await b).error !== undefined, 'the client left before an answer');

    const rec = await poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((r) => r.request_id === 'left-while-parked'),
      { what: 'the audit record of the parked request' });
    assert.equal(rec.status, 499);
    assert.equal(rec.error, 'client_closed');
    assert.equal(rec.cancelled, true);
    // Its body was read and its group chosen (it did not leave mid-body),
    // and no backend was picked: it left in admission.
    assert.equal(rec.group, 'g');
    assert.equal(rec.backend, null);
    const seen = (await recorded_requests([mock])).map((r) => header_of(r, 'x-request-id'));
    assert.equal(seen.length, 1, `only A reached the backend (B was still parked when it left): ${JSON.stringify(seen)}`);
    assert.equal((await a).status, 200);
  });
});
