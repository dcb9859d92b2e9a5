// The client cannot tell the protocols apart: the scenarios of
// openai_sdk.test.mjs -- non-stream, stream, stream with usage, legacy
// completions, errors, client abort -- through a group of each protocol
// give what the OpenAI adapter gives for the same reply. One sluice, three
// groups: "mock-model" (protocol openai, passed through to mock-vllm),
// "an-model" (protocol anthropic, mock-vllm's /v1/messages) and "tr-model"
// (protocol triton, mock-triton), the mocks sharing one token generator and
// one word count. What differs by nature is normalized, and only that:
// `created` (the mock's fixed clock against sluice's), `model` (each answer
// names the model its client asked for) and, through Triton, the prompt
// token count (Triton counts the prompt sluice rendered from the messages;
// a legacy prompt reaches the Messages API as a user message).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config } from './lib/gateway.mjs';
import { bound_ms, start_mock_triton, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';

const reply_tokens = 12;

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// What differs by nature (see the top), set to fixed values; everything
// else is compared as it came.
function normalize(value, { prompt_tokens } = {}) {
  const fix = (o) => {
    if (o === null || typeof o !== 'object') return o;
    if (Array.isArray(o)) return o.map(fix);
    const out = {};
    for (const [k, v] of Object.entries(o)) {
      if (k === 'created') out[k] = 0;
      else if (k === 'model') out[k] = 'M';
      else if (k === 'usage' && v && prompt_tokens === 'any') {
        assert.ok(v.prompt_tokens > 0, 'the backend counted the prompt');
        out[k] = { ...v, prompt_tokens: 0, total_tokens: v.completion_tokens };
      } else out[k] = fix(v);
    }
    return out;
  };
  return fix(value);
}

describe('the same answers through every protocol', () => {
  let vllm, triton, sluice, sdk;
  const models = { openai: 'mock-model', anthropic: 'an-model', triton: 'tr-model' };
  before(async () => {
    vllm = await start_mock_vllm({ reply_tokens, tokens_per_sec: 4000 });
    triton = await start_mock_triton({ reply_tokens, tokens_per_sec: 4000 });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 } },
        groups: [
          { name: 'oa', models: [models.openai], backends: [vllm.url] },
          { name: 'an', models: [models.anthropic], protocol: 'anthropic', backend_model: 'mock-model', backends: [vllm.url] },
          { name: 'tr', models: [models.triton], protocol: 'triton', backend_model: 'mock-model', backends: [triton.url] },
        ],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, vllm, triton));

  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello to the gateway.' }];

  // The same call through each group, with the same X-Request-Id (the
  // reply id is chatcmpl-<it> in every case).
  async function through_each(call, id) {
    const out = {};
    for (const [protocol, model] of Object.entries(models)) {
      out[protocol] = await call(model, { headers: { 'x-request-id': id } });
    }
    return out;
  }

  function assert_same(out, what, { anthropic_cut = false, anthropic_prompt = false } = {}) {
    const expected = normalize(out.openai);
    if (anthropic_cut) {
      // The Messages API says why a reply stopped only after its last delta
      // (message_delta): cut by max_tokens, the finish goes out in a chunk of
      // its own instead of on the last token's, as vLLM puts it. The text,
      // the finish reason, the ids and every other chunk are the same.
      const a = normalize(out.anthropic);
      const last_text = expected.at(-1);
      assert.equal(last_text.choices[0].finish_reason, 'length');
      assert.deepStrictEqual(a.slice(0, expected.length - 1), expected.slice(0, -1), `${what}: anthropic`);
      const merged = structuredClone(a.at(-2));
      merged.choices[0].finish_reason = a.at(-1).choices[0].finish_reason;
      merged.choices[0].stop_reason = null;
      assert.deepStrictEqual(merged, last_text, `${what}: anthropic's last two chunks hold vLLM's last one`);
      assert.equal(a.length, expected.length + 1);
    } else if (anthropic_prompt) {
      // A legacy prompt reaches the Messages API as a user message, and the
      // backend counts that message's framing with it.
      assert.deepStrictEqual(normalize(out.anthropic, { prompt_tokens: 'any' }), normalize(out.openai, { prompt_tokens: 'any' }),
                             `${what}: anthropic`);
    } else {
      assert.deepStrictEqual(normalize(out.anthropic), expected, `${what}: anthropic`);
    }
    assert.deepStrictEqual(normalize(out.triton, { prompt_tokens: 'any' }), normalize(out.openai, { prompt_tokens: 'any' }),
                           `${what}: triton`);
  }

  it('a non-stream chat completion', async () => {
    for (const max_tokens of [50, 5]) {  // ends by stop, and by length
      const out = await through_each((model, o) => sdk.chat.completions.create({ model, messages, max_tokens }, o), `par-plain-${max_tokens}`);
      assert.equal(out.openai.choices[0].finish_reason, max_tokens === 5 ? 'length' : 'stop');
      assert_same(out, `max_tokens ${max_tokens}`);
    }
  });

  it('a stream, chunk for chunk', async () => {
    for (const max_tokens of [50, 5]) {
      const out = await through_each(async (model, o) => collect(await sdk.chat.completions.create({ model, messages, max_tokens, stream: true }, o)),
                                     `par-stream-${max_tokens}`);
      assert.ok(out.openai.length >= 3);
      assert_same(out, `stream, max_tokens ${max_tokens}`, { anthropic_cut: max_tokens === 5 });
    }
  });

  it('a stream with include_usage, the usage chunk last', async () => {
    const out = await through_each(async (model, o) => collect(await sdk.chat.completions.create(
      { model, messages, max_tokens: 50, stream: true, stream_options: { include_usage: true } }, o)), 'par-usage');
    assert.deepStrictEqual(out.openai.at(-1).choices, []);
    assert_same(out, 'stream with usage');
  });

  it('a legacy completion, stream and not', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 50 };
    const plain = await through_each((model, o) => sdk.completions.create({ model, ...body }, o), 'par-legacy');
    assert_same(plain, 'completion', { anthropic_prompt: true });
    const streamed = await through_each(async (model, o) => collect(await sdk.completions.create({ model, ...body, stream: true }, o)),
                                        'par-legacy-stream');
    assert_same(streamed, 'completion stream', { anthropic_prompt: true });
  });

  it('errors: the same SDK error class and status', async () => {
    const seen = {};
    for (const [protocol, model] of Object.entries(models)) {
      try {
        await sdk.chat.completions.create({ model, messages, max_tokens: 5000000 });
        seen[protocol] = 'no error';
      } catch (err) {
        seen[protocol] = `${err.constructor.name} ${err.status} ${err.code ?? ''}`;
      }
    }
    assert.match(seen.openai, /^BadRequestError 400/);
    assert.equal(seen.anthropic, seen.openai);
    assert.equal(seen.triton, seen.openai);
  });

});

describe('a client that goes away, through every protocol', () => {
  let vllm, triton, sluice, sdk;
  const models = { openai: 'mock-model', anthropic: 'an-model', triton: 'tr-model' };
  before(async () => {
    vllm = await start_mock_vllm({ reply_tokens: 5000, tokens_per_sec: 200 });
    triton = await start_mock_triton({ reply_tokens: 5000, tokens_per_sec: 200 });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 } },
        groups: [
          { name: 'oa', models: [models.openai], backends: [vllm.url] },
          { name: 'an', models: [models.anthropic], protocol: 'anthropic', backend_model: 'mock-model', backends: [vllm.url] },
          { name: 'tr', models: [models.triton], protocol: 'triton', backend_model: 'mock-model', backends: [triton.url] },
        ],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, vllm, triton));
  const messages = [{ role: 'user', content: 'Go on.' }];

  it('ends the backend\'s work at once for each protocol (its abort line)', async () => {
    for (const [protocol, model] of Object.entries(models)) {
      const proc = protocol === 'triton' ? triton.proc : vllm.proc;
      const controller = new AbortController();
      const aborted = proc.wait_for_line(new RegExp(`abort .*par-abort-${protocol}`), { timeout_ms: bound_ms(5000) });
      const stream = await sdk.chat.completions.create({ model, messages, max_tokens: 4000, stream: true },
                                                       { signal: controller.signal, headers: { 'x-request-id': `par-abort-${protocol}` } });
      let n = 0;
      try {
        for await (const c of stream) {
          if (c.choices[0]?.delta?.content && ++n === 2) controller.abort();
        }
      } catch (err) {
        assert.ok(err instanceof OpenAI.APIUserAbortError || err.name === 'AbortError', String(err));
      }
      // Chunks the SDK had already read when the abort came may still be
      // handed out (several arrive in one read on a loaded machine); the
      // stream still stops far short of its 4000 tokens.
      assert.ok(n >= 2 && n < 100, `${protocol}: ${n} content chunks after the abort at 2`);
      await aborted;
    }
  });
});
