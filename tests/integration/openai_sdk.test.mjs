// The stock OpenAI Node SDK through sluice returns exactly what it returns
// directly from mock-vllm: the same objects, the same stream chunks (with and
// without stream_options.include_usage).
// mock-vllm runs with a fixed --created and echoes X-Request-Id as the
// response id, so two identical requests give identical answers.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { chat_body, mock_model, sluice_config, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';

const modes = [['copy', false]];

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

describe('OpenAI SDK', () => {
  let mock;
  let direct;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 24 });
    direct = new OpenAI({ apiKey: 'unused-by-mock', baseURL: `${mock.url}/v1`, maxRetries: 0, timeout: 10000 });
  });
  after(() => stop_all(mock));

  for (const [mode, splice] of modes) {
    describe(`through sluice on the ${mode} path`, () => {
      let sluice;
      let via;

      before(async () => {
        sluice = await start_sluice({ backends: [mock.url], config: sluice_config({ backends: [mock.url], server: { splice } }) });
        via = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: 10000 });
      });
      after(() => stop_all(sluice));

      // Same request both ways, same X-Request-Id: the answers must be equal.
      async function both(call, id) {
        const opts = { headers: { 'X-Request-Id': id } };
        const expected = await call(direct, opts);
        const actual = await call(via, opts);
        return { expected, actual };
      }

      it('answers a non-stream chat completion exactly as the backend does', async () => {
        const body = chat_body({ max_tokens: 12 });
        const { expected, actual } = await both((c, o) => c.chat.completions.create(body, o), `sdk-${mode}-plain`);
        assert.equal(typeof expected.id, 'string');
        assert.ok(expected.usage && expected.usage.completion_tokens > 0, 'the backend reports usage');
        assert.deepStrictEqual(actual, expected);
      });

      it('streams a chat completion without stream_options chunk for chunk as the backend does', async () => {
        const body = chat_body({ max_tokens: 12, stream: true });
        const { expected, actual } = await both(async (c, o) => collect(await c.chat.completions.create(body, o)), `sdk-${mode}-stream`);
        assert.ok(expected.length >= 3, `the backend streamed ${expected.length} chunks`);
        assert.ok(expected.every((c) => c.usage === undefined || c.usage === null), 'no usage chunk without include_usage');
        assert.deepStrictEqual(actual, expected);
      });

      it('streams a chat completion with include_usage, usage chunk included, as the backend does', async () => {
        const body = chat_body({ max_tokens: 12, stream: true, include_usage: true });
        const { expected, actual } = await both(async (c, o) => collect(await c.chat.completions.create(body, o)), `sdk-${mode}-usage`);
        const last = expected.at(-1);
        assert.deepStrictEqual(last.choices, [], 'the last chunk is the usage-only chunk');
        assert.ok(last.usage.total_tokens > 0);
        assert.deepStrictEqual(actual, expected);
      });

      it('answers a legacy completion, stream and not, as the backend does', async () => {
        const body = { model: mock_model, prompt: 'Once upon a time', max_tokens: 8 };
        const plain = await both((c, o) => c.completions.create(body, o), `sdk-${mode}-legacy`);
        assert.deepStrictEqual(plain.actual, plain.expected);
        const streamed = await both(async (c, o) => collect(await c.completions.create({ ...body, stream: true }, o)), `sdk-${mode}-legacy-stream`);
        assert.ok(streamed.expected.length >= 2);
        assert.deepStrictEqual(streamed.actual, streamed.expected);
      });

      it('lists models with client.models.list()', async () => {
        const page = await via.models.list();
        assert.ok(Array.isArray(page.data) && page.data.length >= 1, `models: ${JSON.stringify(page.data)}`);
        for (const model of page.data) {
          assert.equal(typeof model.id, 'string');
          assert.equal(model.object, 'model');
        }
      });

      it('rejects a wrong key with the SDK\'s AuthenticationError', async () => {
        const wrong = new OpenAI({ apiKey: 'not-the-key', baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: 10000 });
        await assert.rejects(wrong.chat.completions.create(chat_body()), (err) => {
          assert.ok(err instanceof OpenAI.AuthenticationError, `got ${err?.constructor?.name}: ${err?.message}`);
          assert.equal(err.status, 401);
          assert.equal(err.code, 'invalid_api_key');
          return true;
        });
      });
    });
  }
});
