// A group with protocol = "anthropic": the stock OpenAI SDK through sluice
// in front of an Anthropic Messages API backend (lib/anthropic_peer.mjs,
// whose wire format peers.test.mjs checks with the official
// @anthropic-ai/sdk). The client sees OpenAI's API: vLLM's chunk sequence,
// ids chatcmpl-<request id> (cmpl-<request id> for legacy completions,
// whose prompt goes upstream as one user message), the model it asked for,
// usage from the backend's counts; the backend sees a Messages request with
// sluice's own credential, never the client's key.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { start_anthropic_peer, shapes } from './lib/anthropic_peer.mjs';
import { gateway_config, poll, read_audit } from './lib/gateway.mjs';
import { bound_ms, http_post, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';

import path from 'node:path';

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// A stream's end as vLLM writes it: one chunk with the finish reason, then
// (only when asked) the usage chunk, last and with no choices.
function check_stream_end(chunks, finish_reason, usage) {
  assert.deepEqual(chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].finish_reason), [finish_reason]);
  const counted = chunks.filter((c) => c.usage).map((c) => [c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens]);
  assert.deepEqual(counted, usage ? [[usage[0], usage[1], usage[0] + usage[1]]] : [], 'a usage chunk only when asked');
  if (usage) assert.deepEqual(chunks.at(-1).choices, [], 'the usage chunk is last, with no choices');
}

const backend_key = 'sk-ant-backend-credential';

function config(backends, extra = {}) {
  return gateway_config({
    tables: { upstream: { max_retries: 1 }, health: { interval_ms: 0 } },
    groups: [{ name: 'claude', models: ['claude-*'], protocol: 'anthropic', backend_model: 'claude-backend',
               api_key_env: 'SLUICE_TEST_ANTHROPIC_KEY', default_max_tokens: 333, backends, ...extra }],
    keys: [{ id: 'test', key: test_key }],
  });
}

describe('protocol = "anthropic"', () => {
  let peer, sluice, sdk;
  before(async () => {
    peer = await start_anthropic_peer();
    sluice = await start_sluice({ config: config([peer.url]), env: { ...process.env, SLUICE_TEST_ANTHROPIC_KEY: backend_key } });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, peer));

  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hello.' }];

  it('a non-stream chat completion: OpenAI shape, the backend\'s text and counts, a Messages request upstream', async () => {
    peer.set({ text: 'Hello from Claude.', input_tokens: 21, output_tokens: 5 });
    const seen = peer.requests.length;
    const r = await sdk.chat.completions.create({ model: 'claude-x', messages, temperature: 0.5, stop: ['END'] },
                                                { headers: { 'x-request-id': 'anth-plain-1' } });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.id, 'chatcmpl-anth-plain-1');
    assert.equal(r.model, 'claude-x');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, 'Hello from Claude.');
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens], [21, 5, 26]);
    assert.equal(peer.requests.length, seen + 1);
    const sent = peer.requests.at(-1);
    const headers = peer.headers.at(-1);
    assert.equal(sent.model, 'claude-backend');
    assert.deepEqual(sent.system, [{ type: 'text', text: 'Be brief.' }], 'system messages become the system blocks');
    assert.deepEqual(sent.messages, [{ role: 'user', content: [{ type: 'text', text: 'Say hello.' }] }]);
    assert.equal(sent.max_tokens, 333, 'the group\'s default max_tokens (required by the Messages API)');
    assert.equal(sent.temperature, 0.5);
    assert.deepEqual(sent.stop_sequences, ['END']);
    assert.equal(headers['x-api-key'], backend_key);
    assert.equal(headers['anthropic-version'], '2023-06-01');
    assert.equal(headers.authorization, undefined, 'the client\'s key never reaches the backend');
    assert.ok(!JSON.stringify(headers).includes(test_key));
  });

  it('streams with the common chunk.choices[0] loop, and the usage chunk when asked', async () => {
    peer.set({ text: 'One two three four.', input_tokens: 9, output_tokens: 4 });
    for (const include_usage of [false, true]) {
      const stream = await sdk.chat.completions.create({
        model: 'claude-x', messages, stream: true, max_tokens: 50,
        ...(include_usage ? { stream_options: { include_usage: true } } : {}),
      }, { headers: { 'x-request-id': `anth-stream-${include_usage}` } });
      const chunks = await collect(stream);
      let text = '';
      for (const chunk of chunks) {
        if (chunk.choices[0]?.delta?.content) text += chunk.choices[0].delta.content;
      }
      assert.equal(text, 'One two three four.');
      for (const c of chunks) {
        assert.equal(c.id, `chatcmpl-anth-stream-${include_usage}`);
        assert.equal(c.object, 'chat.completion.chunk');
        assert.equal(c.model, 'claude-x');
      }
      assert.equal(chunks[0].choices[0].delta.role, 'assistant', 'the role chunk first, as vLLM sends it');
      check_stream_end(chunks, 'stop', include_usage && [9, 4]);
    }
  });

  for (const shape of shapes.filter((s) => s !== 'malformed')) {
    it(`reads the backend's stream on its structure: shape ${shape}`, async () => {
      peer.set({ text: 'Alpha beta gamma.', shape, input_tokens: 3, output_tokens: 3 });
      const chunks = await collect(await sdk.chat.completions.create({ model: 'claude-x', messages, stream: true,
                                                                       stream_options: { include_usage: true } }));
      const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
      // (no_event_lines too: the data's "type" names each event.)
      assert.equal(text, 'Alpha beta gamma.');
      assert.deepEqual([chunks.at(-1).usage.prompt_tokens, chunks.at(-1).usage.completion_tokens], [3, 3]);
    });
  }

  it('an event that is not JSON ends the stream with an error event the SDK raises; the shard serves on', async () => {
    peer.set({ text: 'Alpha beta gamma.', shape: 'malformed' });
    const stream = await sdk.chat.completions.create({ model: 'claude-x', messages, stream: true });
    await assert.rejects(collect(stream), (err) => /cannot read/.test(String(err.message ?? err)));
    peer.set({ text: 'Still here.' });
    const r = await sdk.chat.completions.create({ model: 'claude-x', messages });
    assert.equal(r.choices[0].message.content, 'Still here.');
  });

  it('tool_use becomes tool_calls, non-stream and streamed; tool results go back as tool_result', async () => {
    peer.set({ text: '', tool_use: { id: 'toolu_1', name: 'get_weather', input: { city: 'Paris', days: 2 } } });
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const r = await sdk.chat.completions.create({ model: 'claude-x', messages, tools });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const call = r.choices[0].message.tool_calls[0];
    assert.equal(call.id, 'toolu_1');
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 2 });
    assert.equal(peer.requests.at(-1).tools[0].name, 'get_weather');
    assert.deepEqual(peer.requests.at(-1).tools[0].input_schema, tools[0].function.parameters);

    const chunks = await collect(await sdk.chat.completions.create({ model: 'claude-x', messages, tools, stream: true }));
    let args = '';
    let name = '';
    for (const c of chunks) {
      for (const t of c.choices[0]?.delta?.tool_calls ?? []) {
        if (t.function?.name) name = t.function.name;
        args += t.function?.arguments ?? '';
      }
    }
    assert.equal(name, 'get_weather');
    assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 2 });
    assert.equal(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0].finish_reason, 'tool_calls');

    peer.set({ text: 'It is sunny.' });
    await sdk.chat.completions.create({ model: 'claude-x', tools, messages: [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'toolu_1', content: 'sunny' },
    ] });
    const sent = peer.requests.at(-1).messages;
    assert.equal(sent[1].role, 'assistant');
    assert.equal(sent[1].content[0].type, 'tool_use');
    assert.deepEqual(sent[1].content[0].input, { city: 'Paris' });
    assert.equal(sent[2].role, 'user');
    assert.equal(sent[2].content[0].type, 'tool_result');
    assert.equal(sent[2].content[0].tool_use_id, 'toolu_1');
  });

  it('max_tokens ends as length', async () => {
    peer.set({ text: 'Cut here.', stop_reason: 'max_tokens' });
    const r = await sdk.chat.completions.create({ model: 'claude-x', messages, max_tokens: 2 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(peer.requests.at(-1).max_tokens, 2);
  });

  it('the backend\'s errors reach the SDK as its typed errors in OpenAI\'s shape', async () => {
    peer.set({ status: 429, error_type: 'rate_limit_error', error_message: 'slow down', retry_after: 7 });
    await assert.rejects(sdk.chat.completions.create({ model: 'claude-x', messages }), (err) => {
      assert.ok(err instanceof OpenAI.RateLimitError, String(err));
      assert.equal(err.status, 429);
      assert.match(err.message, /slow down/);
      assert.equal(err.headers.get('retry-after'), '7');
      return true;
    });
    peer.set({ status: 400, error_type: 'invalid_request_error', error_message: 'messages: bad turn order' });
    await assert.rejects(sdk.chat.completions.create({ model: 'claude-x', messages }), (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, String(err));
      assert.match(err.message, /bad turn order/);
      return true;
    });
    peer.set({ status: 401, error_type: 'authentication_error', error_message: 'invalid x-api-key' });
    await assert.rejects(sdk.chat.completions.create({ model: 'claude-x', messages }), (err) => {
      assert.equal(err.status, 502, 'sluice\'s own credential was refused: not the client\'s fault');
      return true;
    });
  });

  it('an error event mid-stream ends the stream as a vLLM error does: the SDK raises', async () => {
    peer.set({ text: 'a b c d e f', stream_error_after: 2 });
    const seen = [];
    await assert.rejects((async () => {
      for await (const c of await sdk.chat.completions.create({ model: 'claude-x', messages, stream: true })) {
        seen.push(c.choices[0]?.delta?.content ?? '');
      }
    })());
    assert.equal(seen.join(''), 'a b', 'the deltas before the error reached the client');
  });

  it('a legacy completion: a text_completion with the backend\'s text and counts; upstream, one user message', async () => {
    for (const [stop_reason, finish] of [['end_turn', 'stop'], ['max_tokens', 'length']]) {
      peer.set({ text: 'Once upon a time.', input_tokens: 7, output_tokens: 4, stop_reason });
      const seen = peer.requests.length;
      const r = await sdk.completions.create({ model: 'claude-x', prompt: 'Tell a story.', max_tokens: 40, temperature: 0.25,
                                               top_p: 0.5, stop: ['END'] },
                                             { headers: { 'x-request-id': `anth-cmpl-${finish}` } });
      assert.equal(r.object, 'text_completion');
      assert.equal(r.id, `cmpl-anth-cmpl-${finish}`);
      assert.equal(r.model, 'claude-x');
      assert.equal(r.choices.length, 1);
      assert.equal(r.choices[0].index, 0);
      assert.equal(r.choices[0].text, 'Once upon a time.');
      assert.equal(r.choices[0].finish_reason, finish);
      assert.equal(r.choices[0].logprobs, null);
      assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens], [7, 4, 11]);
      assert.equal(peer.requests.length, seen + 1);
      const sent = peer.requests.at(-1);
      assert.equal(sent.model, 'claude-backend');
      assert.deepEqual(sent.messages, [{ role: 'user', content: [{ type: 'text', text: 'Tell a story.' }] }],
                       'the prompt is one user message');
      assert.equal(sent.system, undefined);
      assert.equal(sent.max_tokens, 40);
      assert.equal(sent.temperature, 0.25);
      assert.equal(sent.top_p, 0.5);
      assert.deepEqual(sent.stop_sequences, ['END']);
      assert.equal(sent.stream, undefined);
      assert.equal(peer.headers.at(-1)['x-api-key'], backend_key);
    }
  });

  it('a streamed legacy completion: text chunks (no role chunk), one finish, the usage chunk when asked', async () => {
    peer.set({ text: 'One two three four.', input_tokens: 9, output_tokens: 4 });
    for (const include_usage of [false, true]) {
      const seen = peer.requests.length;
      const stream = await sdk.completions.create({
        model: 'claude-x', prompt: ['Count to four.'], stream: true,
        ...(include_usage ? { stream_options: { include_usage: true } } : {}),
      }, { headers: { 'x-request-id': `anth-cmpl-stream-${include_usage}` } });
      const chunks = await collect(stream);
      assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), 'One two three four.');
      for (const c of chunks) {
        assert.equal(c.id, `cmpl-anth-cmpl-stream-${include_usage}`);
        assert.equal(c.object, 'text_completion');
        assert.equal(c.model, 'claude-x');
      }
      const texts = chunks.filter((c) => c.choices.length > 0);
      assert.ok(texts.length >= 4);
      for (const c of texts) {
        assert.deepEqual(Object.keys(c.choices[0]), ['index', 'text', 'logprobs', 'finish_reason', 'stop_reason']);
        assert.equal(c.choices[0].delta, undefined, 'no chat deltas, no role chunk');
        assert.equal(c.usage, null, 'completion chunks carry usage: null, as vLLM\'s do');
      }
      check_stream_end(chunks, 'stop', include_usage && [9, 4]);
      assert.equal(peer.requests.length, seen + 1);
      const sent = peer.requests.at(-1);
      assert.deepEqual(sent.messages, [{ role: 'user', content: [{ type: 'text', text: 'Count to four.' }] }]);
      assert.equal(sent.stream, true);
      assert.equal(sent.max_tokens, 333, 'the group\'s default max_tokens');
    }
  });

  it('what the OpenAI API has and the Messages API lacks is refused with a 400 before anything is sent', async () => {
    const seen = peer.requests.length;
    await assert.rejects(sdk.chat.completions.create({ model: 'claude-x', messages, n: 3 }), (err) => err.status === 400);
    const refused = [{ prompt: [1, 2, 3] }, { prompt: ['a', 'b'] }, { prompt: 'hi', n: 2 }, { prompt: 'hi', best_of: 2 },
                     { prompt: 'hi', echo: true }, { prompt: 'hi', logprobs: 1 }, { prompt: 'hi', suffix: ' the end' }];
    for (const body of refused) {
      await assert.rejects(sdk.completions.create({ model: 'claude-x', ...body }), (err) => {
        assert.equal(err.status, 400, JSON.stringify(body));
        assert.match(err.message, /Anthropic Messages API/, JSON.stringify(body));
        return true;
      });
    }
    await assert.rejects(sdk.embeddings.create({ model: 'claude-x', input: 'hi' }), (err) => {
      assert.equal(err.status, 400);
      assert.match(err.message, /no embeddings/);
      return true;
    });
    assert.equal(peer.requests.length, seen, 'nothing reached the backend');
  });

  it('bills and audits the backend\'s counts (cache reads count as input)', async () => {
    peer.set({ text: 'Counted.', input_tokens: 40, cache_read_input_tokens: 60, output_tokens: 2 });
    await sdk.chat.completions.create({ model: 'claude-x', messages }, { headers: { 'x-request-id': 'anth-audit-1' } });
    const chunks = await collect(await sdk.chat.completions.create({ model: 'claude-x', messages, stream: true },
                                                                   { headers: { 'x-request-id': 'anth-audit-2' } }));
    assert.ok(chunks.length > 0);
    const file = path.join(sluice.dir, 'sluice-audit.jsonl');
    const lines = await poll(() => {
      const l = read_audit(file).filter((r) => r.request_id === 'anth-audit-1' || r.request_id === 'anth-audit-2');
      return l.length === 2 ? l : null;
    }, { what: 'both audit lines' });
    for (const l of lines) {
      assert.equal(l.status, 200);
      assert.equal(l.prompt_tokens, 100);
      assert.equal(l.completion_tokens, 2);
      assert.equal(l.group, 'claude');
      assert.equal(l.finish_reason, 'stop');
    }
  });

  it('a client that goes away mid-stream closes the backend request at once', async () => {
    peer.set({ text: 'w '.repeat(200), delay_ms: 20 });
    const cancels = peer.cancels.length;
    const controller = new AbortController();
    const stream = await sdk.chat.completions.create({ model: 'claude-x', messages, stream: true }, { signal: controller.signal });
    let n = 0;
    try {
      for await (const c of stream) {
        if (c.choices[0]?.delta?.content && ++n === 3) controller.abort();
      }
    } catch (err) {
      assert.ok(err instanceof OpenAI.APIUserAbortError || err.name === 'AbortError', String(err));
    }
    assert.equal(n, 3, 'the stream stopped at the abort');
    await peer.wait_for('cancels', cancels + 1, bound_ms(2000));
  });
});

// The OpenAI SDK's legacy completions scenario (openai_sdk.test.mjs) through
// an anthropic group on mock-vllm's /v1/messages, against mock-vllm's own
// /v1/completions (the OpenAI adapter passes those bytes on): the same
// objects and chunks, but for `created` (sluice's clock, not the mock's
// fixed one) and the prompt count (the Messages prompt is a chat turn).
describe('protocol = "anthropic": legacy completions as the OpenAI adapter gives them', () => {
  let mock, sluice, via, direct;
  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 24, model: 'claude-mock' });
    sluice = await start_sluice({ config: config([mock.url]), env: { ...process.env, SLUICE_TEST_ANTHROPIC_KEY: backend_key } });
    via = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
    direct = new OpenAI({ apiKey: 'unused-by-mock', baseURL: `${mock.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, mock));

  const comparable = (o) => ({
    ...o, created: 0,
    ...(o.usage ? { usage: { ...o.usage, prompt_tokens: 0, total_tokens: o.usage.completion_tokens } } : {}),
  });

  async function both(call, id) {
    const opts = { headers: { 'X-Request-Id': id } };
    return { expected: await call(direct, opts), actual: await call(via, opts) };
  }

  it('answers a legacy completion, stream and not, with and without the usage chunk, as the backend does', async () => {
    const body = { model: 'claude-mock', prompt: 'Once upon a time', max_tokens: 64 };
    const plain = await both((c, o) => c.completions.create(body, o), 'anth-sdk-legacy');
    assert.equal(plain.actual.id, 'cmpl-anth-sdk-legacy');
    assert.ok(plain.actual.usage.prompt_tokens > 0);
    assert.deepStrictEqual(comparable(plain.actual), comparable(plain.expected));
    for (const extra of [{}, { stream_options: { include_usage: true } }]) {
      const streamed = await both(async (c, o) => collect(await c.completions.create({ ...body, stream: true, ...extra }, o)),
                                  `anth-sdk-legacy-stream-${Boolean(extra.stream_options)}`);
      assert.ok(streamed.expected.length >= 25);
      assert.deepStrictEqual(streamed.actual.map(comparable), streamed.expected.map(comparable));
    }
    const sent = (await mock.requests()).filter((r) => r.target === '/v1/messages');
    assert.equal(sent.length, 3);
  });
});

describe('protocol = "anthropic": retries before the first byte', () => {
  let busy, ok, sluice, sdk;
  before(async () => {
    busy = await start_anthropic_peer({ status: 529, error_type: 'overloaded_error', error_message: 'overloaded' });
    ok = await start_anthropic_peer({ text: 'From the second.' });
    sluice = await start_sluice({ config: config([busy.url, ok.url], { balance: 'round-robin' }),
                                  env: { ...process.env, SLUICE_TEST_ANTHROPIC_KEY: backend_key } });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, busy, ok));

  it('an overloaded backend (529) is retried on the next one; with none left the client gets 503', async () => {
    for (let i = 0; i < 4; ++i) {
      const r = await sdk.chat.completions.create({ model: 'claude-x', messages: [{ role: 'user', content: `hi ${i}` }] });
      assert.equal(r.choices[0].message.content, 'From the second.');
    }
    await ok.stop();
    await assert.rejects(sdk.chat.completions.create({ model: 'claude-x', messages: [{ role: 'user', content: 'x' }] }),
                         (err) => err.status === 503 || err.status === 502);
  });
});
