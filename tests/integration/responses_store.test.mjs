// Responses state on a translated group ([responses] store = "local"): the
// official OpenAI SDK continues a conversation with previous_response_id,
// retrieves and deletes responses, over a chat backend (a scripted one that
// records what it is sent, in vLLM's shapes) on 2 shards. What the backend
// receives is the stored conversation before the new input: the earlier
// input items and the rendered output items, tool calls included. Each key
// sees its own responses only; `store: false` keeps nothing; the store is
// bounded by bytes (oldest first) and by time. With store = "redis" two
// instances share the conversations (a real redis-server), and a Redis
// that is away is a 503, never a wrong "not found".
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll, samples, scrape } from './lib/gateway.mjs';
import { bound_ms, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { start_redis } from './lib/redis.mjs';
import { chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

const other_key = 'sk-responses-other-0001';

// A chat backend whose reply says which request it is ("reply N"), as a
// body or as vLLM's stream; a request offering tools gets a call of
// get_weather instead.
function chat_backend() {
  let n = 0;
  return start_scripted_backend(async (socket, request) => {
    const body = request.body ?? {};
    const text = `reply ${++n}`;
    const base = { id: `chatcmpl-${n}`, created: 1700000000, model: body.model ?? 'm' };
    const call = body.tools ? [{ id: `call_${n}`, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] : undefined;
    if (body.stream && !call) {
      const ev = (choices, extra = {}) => `data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', choices, ...extra })}\n\n`;
      const events = [ev([{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]),
        ev([{ index: 0, delta: { content: 'reply' }, logprobs: null, finish_reason: null }]),
        ev([{ index: 0, delta: { content: ` ${n}` }, logprobs: null, finish_reason: null }]),
        ev([{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }]),
        ev([], { usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 } }), 'data: [DONE]\n\n'];
      socket.write(sse_head + events.map((e) => chunk(e).toString('latin1')).join('') + '0\r\n\r\n', 'latin1');
      return;
    }
    const message = call ? { role: 'assistant', content: null, tool_calls: call } : { role: 'assistant', content: text };
    const reply = JSON.stringify({ ...base, object: 'chat.completion',
      choices: [{ index: 0, message, logprobs: null, finish_reason: call ? 'tool_calls' : 'stop' }],
      usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 } });
    socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(reply)}\r\n\r\n${reply}`);
  });
}

const text_of = (r) => r.output.filter((o) => o.type === 'message').flatMap((o) => o.content)
  .filter((c) => c.type === 'output_text').map((c) => c.text).join('');
// The messages the backend was sent for its last request, as role: text.
const sent = (backend) => backend.requests.at(-1).body.messages.map((m) =>
  m.tool_calls ? `${m.role}: call ${m.tool_calls.map((c) => `${c.id} ${c.function.name}`).join(',')}`
  : m.role === 'tool' ? `tool ${m.tool_call_id}: ${m.content}`
  : `${m.role}: ${typeof m.content === 'string' ? m.content : m.content.map((p) => p.text).join('')}`);

describe('Responses state: [responses] store = "local"', () => {
  let backend, sluice, openai, other;
  before(async () => {
    backend = await chat_backend();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0-1' }, health: { interval_ms: 0 }, responses: { store: 'local', store_max_bytes: 65536 } },
        groups: [{ name: 'chat', models: ['mock-model'], backends: [backend.url] }],
        keys: [{ id: 'test', key: test_key }, { id: 'other', key: other_key }],
      }),
    });
    const opts = { maxRetries: 0, timeout: bound_ms(10000) };
    openai = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, ...opts });
    other = new OpenAI({ apiKey: other_key, baseURL: `${sluice.url}/v1`, ...opts });
  });
  after(() => stop_all(sluice, backend));

  it('previous_response_id: the backend is sent the earlier input and output before the new input', async () => {
    const first = await openai.responses.create({ model: 'mock-model', instructions: 'Be brief.', input: 'My name is Ada.' });
    const reply1 = text_of(first);
    assert.match(reply1, /^reply \d+$/);
    const second = await openai.responses.create({ model: 'mock-model', input: 'What is my name?', previous_response_id: first.id });
    // Instructions are not carried over (as OpenAI documents): only this request's.
    assert.deepEqual(sent(backend), ['user: My name is Ada.', `assistant: ${reply1}`, 'user: What is my name?']);
    // A third turn continues the second, which holds the first.
    const third = await openai.responses.create({ model: 'mock-model', instructions: 'Answer in French.',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'And again?' }] }], previous_response_id: second.id });
    assert.deepEqual(sent(backend), ['system: Answer in French.', 'user: My name is Ada.', `assistant: ${reply1}`,
      'user: What is my name?', `assistant: ${text_of(second)}`, 'user: And again?']);
    assert.equal(third.status, 'completed');
  });

  it('a streamed response is kept as its response.completed said; the stream helper continues from it', async () => {
    const stream = openai.responses.stream({ model: 'mock-model', input: 'Count to two.' });
    const done = await stream.finalResponse();
    assert.equal(done.status, 'completed');
    const kept = await openai.responses.retrieve(done.id);
    // (The stream helper adds `parsed` to its own copy's parts.)
    assert.equal(kept.id, done.id);
    assert.deepEqual(kept.output.map((o) => [o.id, o.type, o.status]), done.output.map((o) => [o.id, o.type, o.status]));
    assert.equal(text_of(kept), text_of(done));
    assert.deepEqual(kept.usage, done.usage);
    await openai.responses.create({ model: 'mock-model', input: 'Go on.', previous_response_id: done.id });
    assert.deepEqual(sent(backend), ['user: Count to two.', `assistant: ${text_of(done)}`, 'user: Go on.']);
  });

  it('tool calls both ways: a function_call_output answers the call the stored response made', async () => {
    const tools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
    const asked = await openai.responses.create({ model: 'mock-model', input: 'Weather in Paris?', tools });
    const call = asked.output.find((o) => o.type === 'function_call');
    assert.ok(call, JSON.stringify(asked.output));
    assert.equal(call.name, 'get_weather');
    // Without the store's conversation the output would answer no call (a 400).
    await openai.responses.create({ model: 'mock-model', previous_response_id: asked.id,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny' }] });
    assert.deepEqual(sent(backend), ['user: Weather in Paris?', `assistant: call ${call.call_id} get_weather`,
      `tool ${call.call_id}: sunny`]);
  });

  it('GET and DELETE /v1/responses/{id}: its key only; deleted, it is gone, and cannot be continued', async () => {
    const r = await openai.responses.create({ model: 'mock-model', input: 'Keep me.' });
    const kept = await openai.responses.retrieve(r.id);
    assert.equal(kept.id, r.id);
    assert.equal(text_of(kept), text_of(r));
    assert.deepEqual(kept.usage, r.usage);
    await assert.rejects(other.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(other.responses.delete(r.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(other.responses.create({ model: 'mock-model', input: 'x', previous_response_id: r.id }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
    await openai.responses.delete(r.id);
    await assert.rejects(openai.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError && /not found/.test(e.message));
    await assert.rejects(openai.responses.delete(r.id), (e) => e instanceof OpenAI.NotFoundError);
    const before = backend.requests.length;
    await assert.rejects(openai.responses.create({ model: 'mock-model', input: 'x', previous_response_id: r.id }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id' && e.code === 'previous_response_not_found');
    assert.equal(backend.requests.length, before, 'nothing was forwarded');
  });

  it('store: false keeps nothing; an unknown id is a 400 naming previous_response_id', async () => {
    const r = await openai.responses.create({ model: 'mock-model', input: 'Forget me.', store: false });
    await assert.rejects(openai.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(openai.responses.create({ model: 'mock-model', input: 'x', previous_response_id: 'resp_never' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id' && /resp_never/.test(e.message));
    const m = samples((await scrape(sluice.admin_url)).parsed, 'sluice_responses_stored_total');
    assert.ok(m.some((s) => s.labels.result === 'kept' && s.value >= 1), JSON.stringify(m));
  });

  it('bounded by bytes: past store_max_bytes the oldest responses go first', async () => {
    const oldest = await openai.responses.create({ model: 'mock-model', input: 'the oldest' });
    const filler = 'x'.repeat(8000);
    let newest;
    for (let i = 0; i < 12; ++i) newest = await openai.responses.create({ model: 'mock-model', input: `${i} ${filler}` });
    // The puts are applied in order on the control thread: once the newest
    // is there, the oldest was dropped to make room (96 KiB of puts, 64 KiB kept).
    await poll(async () => (await openai.responses.retrieve(newest.id)).id === newest.id, { what: 'the newest response' });
    await assert.rejects(openai.responses.retrieve(oldest.id), (e) => e instanceof OpenAI.NotFoundError);
  });
});

describe('Responses state: store_ttl_s', () => {
  let backend, sluice, openai;
  before(async () => {
    backend = await chat_backend();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 }, responses: { store: 'local', store_ttl_s: 1 } },
        groups: [{ name: 'chat', models: ['mock-model'], backends: [backend.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    openai = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, backend));

  it('a response is kept until its time is up, then gone', async () => {
    const started = Date.now();
    const r = await openai.responses.create({ model: 'mock-model', input: 'brief' });
    assert.equal((await openai.responses.retrieve(r.id)).id, r.id);
    await poll(async () => {
      try {
        await openai.responses.retrieve(r.id);
        return false;
      } catch (e) {
        if (!(e instanceof OpenAI.NotFoundError)) throw e;
        return true;
      }
    }, { what: 'the response to expire', timeout_ms: bound_ms(5000) });
    assert.ok(Date.now() - started >= 900, 'not before its second');
  });
});

describe('Responses state: store = "redis", two instances', () => {
  let backend, redis, a, b, via_a, via_b;
  before(async () => {
    backend = await chat_backend();
    redis = await start_redis();
    const config = gateway_config({
      tables: { health: { interval_ms: 0 }, cluster: { redis: redis.url }, responses: { store: 'redis', store_ttl_s: 60 } },
      groups: [{ name: 'chat', models: ['mock-model'], backends: [backend.url] }],
      keys: [{ id: 'test', key: test_key }, { id: 'other', key: other_key }],
    });
    a = await start_sluice({ config });
    b = await start_sluice({ config });
    const opts = { maxRetries: 0, timeout: bound_ms(10000) };
    via_a = new OpenAI({ apiKey: test_key, baseURL: `${a.url}/v1`, ...opts });
    via_b = new OpenAI({ apiKey: test_key, baseURL: `${b.url}/v1`, ...opts });
    await Promise.all([a, b].map((s) => s.proc.wait_for_line(/cluster: redis .* connected/, { timeout_ms: bound_ms(5000) })));
  });
  after(() => stop_all(a, b, redis, backend));

  it('a response kept by one instance is read, continued and deleted through the other', async () => {
    const first = await via_a.responses.create({ model: 'mock-model', input: 'Remember 42.' });
    // The put reaches Redis as the reply goes out: poll the other instance for it.
    const kept = await poll(async () => (await via_b.responses.retrieve(first.id)).id === first.id,
      { what: 'the response through the other instance' });
    assert.ok(kept);
    await via_b.responses.create({ model: 'mock-model', input: 'Which number?', previous_response_id: first.id });
    assert.deepEqual(sent(backend), ['user: Remember 42.', `assistant: ${text_of(first)}`, 'user: Which number?']);
    const other = new OpenAI({ apiKey: other_key, baseURL: `${b.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
    await assert.rejects(other.responses.retrieve(first.id), (e) => e instanceof OpenAI.NotFoundError);
    await via_b.responses.delete(first.id);
    await assert.rejects(via_a.responses.retrieve(first.id), (e) => e instanceof OpenAI.NotFoundError);
  });

  it('Redis away: asking the store is a 503 saying so, not a 404; nothing is forwarded', async () => {
    const r = await via_a.responses.create({ model: 'mock-model', input: 'x' });
    await redis.stop();
    const before = backend.requests.length;
    await poll(async () => {
      try {
        await via_a.responses.retrieve(r.id);
        return false;
      } catch (e) {
        return e.status === 503 && /response store/.test(e.message);
      }
    }, { what: 'a 503 from the store' });
    await assert.rejects(via_a.responses.create({ model: 'mock-model', input: 'y', previous_response_id: r.id }),
      (e) => e.status === 503);
    assert.equal(backend.requests.length, before);
  });
});
