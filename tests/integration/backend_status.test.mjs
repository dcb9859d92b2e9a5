// A backend that answers 500, 502, 503 or 429: the stock OpenAI SDK through
// sluice gets the error it gets from that backend directly -- the same
// class, status and code, the same number of attempts (its own retries, with
// the backend's retry-after) -- with one backend and with three, and health
// does not turn those application errors into sluice's own "no backend".
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config } from './lib/gateway.mjs';
import { start_sluice, stop_all } from './lib/harness.mjs';
import { start_scripted_backend } from './lib/scripted_backend.mjs';

function error_answer(status) {
  const body = JSON.stringify({ error: { message: `backend says ${status}`, type: 'server_error', param: null, code: `e${status}` } });
  const extra = status === 429 || status === 503 ? 'retry-after: 0\r\n' : '';
  return `HTTP/1.1 ${status} X\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;
}

async function attempt(base_url, key) {
  let attempts = 0;
  const client = new OpenAI({
    apiKey: key, baseURL: base_url, maxRetries: 2, timeout: 10000,
    fetch: (url, init) => { ++attempts; return fetch(url, init); },
  });
  try {
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    return { ok: true, attempts };
  } catch (err) {
    return {
      class: err.constructor.name, status: err.status, code: err.code, type: err.type, message: err.message,
      attempts, retry_after: err.headers?.get?.('retry-after') ?? null,
    };
  }
}

for (const count of [1, 3]) {
  describe(`${count} backend${count > 1 ? 's' : ''} answering an error`, () => {
    let backends, sluice;
    let status = 500;

    before(async () => {
      backends = await Promise.all(Array.from({ length: count }, () =>
        start_scripted_backend(async (socket) => { socket.write(error_answer(status)); })));
      sluice = await start_sluice({
        config: gateway_config({
          tables: { health: { interval_ms: 0 } },
          groups: [{ name: 'g', models: ['*'], backends: backends.map((b) => b.url) }],
          keys: [{ id: 'k', key: 'key-k', groups: ['*'] }],
        }),
      });
    });
    after(() => stop_all(sluice, ...(backends ?? [])));

    for (const s of [500, 502, 503, 429]) {
      it(`${s}: the same error class, status and attempts as directly, every time`, async () => {
        status = s;
        const direct = await attempt(`${backends[0].url}/v1`, 'unused');
        assert.equal(direct.status, s);
        // Enough rounds to pass the old passive ejection (5 in a row).
        for (let round = 0; round < 4; ++round) {
          const via = await attempt(`${sluice.url}/v1`, 'key-k');
          assert.deepEqual(via, direct, `round ${round}`);
          if (s === 429 || s === 503) assert.equal(via.retry_after, '0', 'the backend\'s retry-after reaches the client');
        }
      });
    }
  });
}
