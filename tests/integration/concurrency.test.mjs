// 500 concurrent streams through sluice all complete with the right content:
// each one's bytes equal those of the same request (same X-Request-Id) sent
// to mock-vllm directly. The mock trickles tokens so the streams overlap.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';

import { bound_ms, chat_body, http_post, sse_events, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';

const streams = 500;

describe(`${streams} concurrent streams`, () => {
  let mock;
  let sluice;
  const agents = [];

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 40, reply_tokens: 20 });
    sluice = await start_sluice({ backends: [mock.url] });
  });
  after(async () => {
    agents.forEach((a) => a.destroy());
    await stop_all(sluice, mock);
  });

  async function run_all(base_url, headers) {
    const agent = new http.Agent({ keepAlive: true, maxSockets: streams });
    agents.push(agent);
    let open = 0;
    let max_open = 0;
    const results = await Promise.all(Array.from({ length: streams }, (_, i) => http_post(
      base_url, '/v1/chat/completions', chat_body({ stream: true, max_tokens: 20, content: `stream ${i}` }), {
        agent,
        headers: { 'x-request-id': `conc-${i}`, ...headers },
        timeout_ms: bound_ms(60000),
        on_response: (res) => {
          max_open = Math.max(max_open, ++open);
          res.on('close', () => --open);
        },
      })));
    return { results, max_open };
  }

  it('all complete through sluice, each equal to the direct stream', async () => {
    const direct = await run_all(mock.url, {});
    const via = await run_all(sluice.url, { authorization: `Bearer ${test_key}` });
    let failed = 0;
    for (let i = 0; i < streams; ++i) {
      const d = direct.results[i];
      const v = via.results[i];
      assert.equal(d.status, 200, `direct ${i}`);
      assert.equal(sse_events(d.text).at(-1), '[DONE]', `direct ${i} ends with [DONE]`);
      if (v.status !== 200 || !v.complete || v.text !== d.text) {
        if (++failed <= 3) console.log(`stream ${i}: status ${v.status} complete ${v.complete}\n got: ${v.text.slice(-300)}\n want: ${d.text.slice(-300)}`);
      }
    }
    console.log(`concurrent streams through sluice: ${streams - failed}/${streams} correct, at most ${via.max_open} open at once`);
    assert.equal(failed, 0, `${failed} of ${streams} streams were wrong`);
    assert.ok(via.max_open >= streams / 2, `streams overlapped (${via.max_open} open at once)`);
  });
});
