// The client dialects (docs/architecture.md §2b): the official OpenAI SDK's Responses
// API and the official Anthropic SDK's Messages API through sluice, over an
// OpenAI-chat backend (mock-vllm, and a scripted backend that writes tool
// calls in vLLM's shape but with CRLF events, several to a chunk), an
// Anthropic backend (lib/anthropic_peer.mjs) and a Triton one
// (lib/triton_peer.mjs). What the client sees is the SDK's own reading of
// sluice's bytes: create, stream, the stream helpers, tool calls both ways,
// count_tokens, and the SDK's error classes; each request is audited with
// the usage the client saw, under its dialect.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { start_anthropic_peer } from './lib/anthropic_peer.mjs';
import { gateway_config, poll, read_audit, samples, scrape } from './lib/gateway.mjs';
import { bound_ms, http_post, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';
import { start_triton_peer } from './lib/triton_peer.mjs';

const poor_key = 'sk-dialects-poor-0001';

// A chat backend that calls get_weather({"city":"Paris"}): vLLM's chunk
// shapes, written with CRLF line ends and two events to a chunk.
const tool_base = { id: 'chatcmpl-tool', object: 'chat.completion.chunk', created: 1700000000, model: 'tool-model' };
function tool_events() {
  const ev = (choices, extra = {}) => JSON.stringify({ ...tool_base, choices, ...extra });
  return [
    ev([{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]),
    ev([{ index: 0, delta: { content: 'Checking.' }, logprobs: null, finish_reason: null }]),
    ev([{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call_w1', type: 'function', function: { name: 'get_weather', arguments: '' } }] }, logprobs: null, finish_reason: null }]),
    ev([{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }, logprobs: null, finish_reason: null }]),
    ev([{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }, logprobs: null, finish_reason: null }]),
    ev([{ index: 0, delta: {}, logprobs: null, finish_reason: 'tool_calls', stop_reason: null }]),
    ev([], { usage: { prompt_tokens: 11, total_tokens: 18, completion_tokens: 7 } }),
    '[DONE]',
  ].map((e) => `data: ${e}\r\n\r\n`);
}
// A reasoning model's stream (vLLM's reasoning parser): reasoning_content
// deltas, then the answer.
function reasoning_events() {
  const base = { id: 'chatcmpl-r', object: 'chat.completion.chunk', created: 1700000000, model: 'reasoner' };
  const ev = (delta, extra = {}) => JSON.stringify({ ...base, choices: delta ? [{ index: 0, delta, logprobs: null, finish_reason: extra.finish ?? null }] : [], ...extra.top });
  return [ev({ role: 'assistant', content: '' }), ev({ reasoning_content: 'Two and ' }), ev({ reasoning_content: 'two.' }),
          ev({ content: 'Four.' }), ev({}, { finish: 'stop' }), ev(null, { top: { usage: { prompt_tokens: 5, completion_tokens: 4, total_tokens: 9 } } }),
          '[DONE]'].map((e) => `data: ${e}\n\n`);
}

const tool_reply = JSON.stringify({
  id: 'chatcmpl-tool', object: 'chat.completion', created: 1700000000, model: 'tool-model',
  choices: [{ index: 0, message: { role: 'assistant', content: 'Checking.', tool_calls: [{ id: 'call_w1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] }, logprobs: null, finish_reason: 'tool_calls' }],
  usage: { prompt_tokens: 11, total_tokens: 18, completion_tokens: 7 },
});

async function answer_tools(socket, request) {
  if (request.body?.stream) {
    const events = tool_events();
    let out = sse_head;
    for (let i = 0; i < events.length; i += 2) out += chunk(events.slice(i, i + 2).join('')).toString('latin1');
    socket.write(out + '0\r\n\r\n', 'latin1');
    return;
  }
  socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(tool_reply)}\r\n\r\n${tool_reply}`);
}

// A response's text, from its output items (the SDK's stream helper gives
// no output_text convenience, whoever the server is).
const text_of = (r) => r.output.filter((o) => o.type === 'message').flatMap((o) => o.content)
  .filter((c) => c.type === 'output_text').map((c) => c.text).join('');

const weather_tool_anthropic = { name: 'get_weather', description: 'The weather in a city.', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const weather_tool_openai = { type: 'function', name: 'get_weather', description: 'The weather in a city.', parameters: weather_tool_anthropic.input_schema };

describe('client dialects: Responses and Messages', () => {
  let mock, tools, reasoner, peer, triton, failing, slow, sluice, anthropic, openai, poor_anthropic, poor_openai;
  const audit = () => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
  async function audited(id) {
    let rec;
    await poll(() => (rec = audit().find((r) => r.request_id === id)) !== undefined, { what: `the audit record of ${id}` });
    return rec;
  }

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 6 });
    tools = await start_scripted_backend(answer_tools);
    peer = await start_anthropic_peer();
    triton = await start_triton_peer({ model: 'tri-vllm' });
    failing = await start_mock_vllm({ reply_tokens: 8, fail_after_tokens: 3 });
    slow = await start_mock_vllm({ reply_tokens: 200, tokens_per_sec: 50 });
    reasoner = await start_scripted_backend(async (socket) => {
      socket.write(sse_head + reasoning_events().map((e) => chunk(e).toString('latin1')).join('') + '0\r\n\r\n', 'latin1');
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { h2c: true }, health: { interval_ms: 0 } },
        groups: [
          { name: 'chat', models: ['mock-model'], backends: [mock.url] },
          { name: 'tools', models: ['tool-model'], backends: [tools.url] },
          { name: 'reasoner', models: ['reasoner'], backends: [reasoner.url] },
          { name: 'slow', models: ['slow-model'], backends: [slow.url] },
          { name: 'failing', models: ['failing-model'], backends: [failing.url], upstream: { max_retries: 0 } },
          { name: 'claude', models: ['claude-*'], protocol: 'anthropic', backend_model: 'claude-backend',
            api_key_env: 'SLUICE_TEST_ANTHROPIC_KEY', backends: [peer.url] },
          { name: 'tri', models: ['tri-*'], protocol: 'triton', triton_flavor: 'vllm', backend_model: 'tri-vllm',
            backends: [triton.url] },
        ],
        keys: [{ id: 'test', key: test_key }, { id: 'poor', key: poor_key, tokens_per_minute: 100 }],
      }),
      env: { ...process.env, SLUICE_TEST_ANTHROPIC_KEY: 'sk-ant-backend' },
    });
    const opts = { maxRetries: 0, timeout: bound_ms(10000) };
    anthropic = new Anthropic({ apiKey: test_key, baseURL: sluice.url, ...opts });
    openai = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, ...opts });
    poor_anthropic = new Anthropic({ apiKey: poor_key, baseURL: sluice.url, ...opts });
    poor_openai = new OpenAI({ apiKey: poor_key, baseURL: `${sluice.url}/v1`, ...opts });
  });
  after(() => stop_all(sluice, mock, tools, reasoner, peer, triton, failing, slow));

  describe('Anthropic SDK, Messages', () => {
    it('messages.create over a chat backend: the text, a message shape, the usage audited', async () => {
      const r = await anthropic.messages.create({ model: 'mock-model', max_tokens: 50, system: 'Be brief.',
        messages: [{ role: 'user', content: 'Say hello.' }] }, { headers: { 'x-request-id': 'msg-plain' } });
      assert.equal(r.type, 'message');
      assert.equal(r.id, 'msg_msg-plain');
      assert.equal(r.role, 'assistant');
      assert.equal(r.model, 'mock-model');
      assert.equal(r.stop_reason, 'end_turn');
      assert.equal(r.content.length, 1);
      assert.equal(r.content[0].type, 'text');
      assert.equal(r.content[0].text.split(' ').length, 6);
      assert.equal(r.usage.output_tokens, 6);
      assert.ok(r.usage.input_tokens > 0);
      const rec = await audited('msg-plain');
      assert.equal(rec.dialect, 'messages');
      assert.equal(rec.endpoint, '/v1/messages');
      assert.equal(rec.status, 200);
      assert.equal(rec.prompt_tokens, r.usage.input_tokens + (r.usage.cache_read_input_tokens ?? 0));
      assert.equal(rec.completion_tokens, r.usage.output_tokens);
    });

    it('messages.stream().finalMessage() over a chat backend: the events the SDK accumulates', async () => {
      const stream = anthropic.messages.stream({ model: 'mock-model', max_tokens: 50,
        messages: [{ role: 'user', content: 'Stream please.' }] }, { headers: { 'x-request-id': 'msg-stream' } });
      const types = [];
      stream.on('streamEvent', (e) => types.push(e.type));
      let text = '';
      stream.on('text', (t) => { text += t; });
      const m = await stream.finalMessage();
      assert.equal(m.content[0].text, text);
      assert.equal(text.split(' ').length, 6);
      assert.equal(m.stop_reason, 'end_turn');
      assert.equal(m.usage.output_tokens, 6);
      assert.deepEqual([types[0], types[1], types.at(-2), types.at(-1)],
                       ['message_start', 'content_block_start', 'message_delta', 'message_stop']);
      const rec = await audited('msg-stream');
      assert.equal(rec.dialect, 'messages');
      assert.equal(rec.stream, true);
      assert.equal(rec.completion_tokens, 6);
      assert.equal(rec.prompt_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
    });

    it('tool calls both ways: tools and a tool_result go up as chat, a tool_use comes back (create and stream)', async () => {
      const messages = [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'call_0', name: 'get_weather', input: { city: 'Rome' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_0', content: 'sunny' }, { type: 'text', text: 'And Paris?' }] },
      ];
      const seen = tools.requests.length;
      const r = await anthropic.messages.create({ model: 'tool-model', max_tokens: 64, tools: [weather_tool_anthropic],
        tool_choice: { type: 'auto' }, messages });
      const sent = tools.requests[seen].body;
      assert.deepEqual(sent.tools, [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city.', parameters: weather_tool_anthropic.input_schema } }]);
      assert.deepEqual(sent.messages.slice(1), [
        { role: 'assistant', content: '', tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Rome"}' } }] },
        { role: 'tool', tool_call_id: 'call_0', content: 'sunny' },
        { role: 'user', content: [{ type: 'text', text: 'And Paris?' }] },
      ]);
      assert.equal(r.stop_reason, 'tool_use');
      assert.deepEqual(r.content, [{ type: 'text', text: 'Checking.' }, { type: 'tool_use', id: 'call_w1', name: 'get_weather', input: { city: 'Paris' } }]);
      assert.deepEqual([r.usage.input_tokens, r.usage.output_tokens], [11, 7]);
      const m = await anthropic.messages.stream({ model: 'tool-model', max_tokens: 64, tools: [weather_tool_anthropic], messages }).finalMessage();
      assert.equal(m.stop_reason, 'tool_use');
      assert.deepEqual(m.content, [{ type: 'text', text: 'Checking.' }, { type: 'tool_use', id: 'call_w1', name: 'get_weather', input: { city: 'Paris' } }]);
      assert.deepEqual([m.usage.input_tokens, m.usage.output_tokens], [11, 7]);
    });

    it('count_tokens answers with sluice\'s estimate and reaches no backend', async () => {
      const before_count = tools.requests.length;
      const r = await anthropic.messages.countTokens({ model: 'tool-model', messages: [{ role: 'user', content: 'How many tokens is this sentence?' }] });
      assert.equal(typeof r.input_tokens, 'number');
      assert.ok(r.input_tokens > 0 && r.input_tokens < 64, String(r.input_tokens));
      assert.equal(tools.requests.length, before_count);
    });

    it('errors are Anthropic\'s, as the SDK\'s classes: a wrong key, a bad request, over quota, an unknown model', async () => {
      const bad = new Anthropic({ apiKey: 'sk-wrong', baseURL: sluice.url, maxRetries: 0 });
      await assert.rejects(bad.messages.create({ model: 'mock-model', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
        (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error.type === 'error' && e.error.error.type === 'authentication_error');
      const seen = tools.requests.length;
      await assert.rejects(anthropic.messages.create({ model: 'tool-model', messages: [{ role: 'user', content: 'x' }] }),
        (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === 'invalid_request_error' && /max_tokens/.test(e.error.error.message));
      await assert.rejects(anthropic.messages.create({ model: 'tool-model', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'document', source: {} }] }] }),
        (e) => e instanceof Anthropic.BadRequestError && /content\[0\]\.type|cannot be carried/.test(e.error.error.message + JSON.stringify(e.error)));
      assert.equal(tools.requests.length, seen, 'nothing refused is forwarded');
      await assert.rejects(poor_anthropic.messages.create({ model: 'mock-model', max_tokens: 1000, messages: [{ role: 'user', content: 'x' }] }),
        (e) => e instanceof Anthropic.RateLimitError && e.status === 429 && e.error.error.type === 'rate_limit_error');
      await assert.rejects(anthropic.messages.create({ model: 'no-such-model', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
        (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
    });

    it('over an Anthropic backend and a Triton backend: create and stream', async () => {
      peer.set({ text: 'Hello from Claude.', input_tokens: 21, output_tokens: 5 });
      const r = await anthropic.messages.create({ model: 'claude-x', max_tokens: 40, messages: [{ role: 'user', content: 'Hi' }] });
      assert.equal(r.content[0].text, 'Hello from Claude.');
      assert.deepEqual([r.usage.input_tokens, r.usage.output_tokens], [21, 5]);
      assert.equal(peer.headers.at(-1)['x-api-key'], 'sk-ant-backend', 'the backend gets its own key, never the client\'s');
      const m = await anthropic.messages.stream({ model: 'claude-x', max_tokens: 40, messages: [{ role: 'user', content: 'Hi' }] }).finalMessage();
      assert.equal(m.content[0].text, 'Hello from Claude.');
      assert.deepEqual([m.usage.input_tokens, m.usage.output_tokens], [21, 5]);
      const t = await anthropic.messages.create({ model: 'tri-x', max_tokens: 40, messages: [{ role: 'user', content: 'Hi there' }] });
      assert.equal(t.content[0].type, 'text');
      assert.ok(t.content[0].text.length > 0);
      assert.ok(t.usage.output_tokens > 0);
      const ts = await anthropic.messages.stream({ model: 'tri-x', max_tokens: 40, messages: [{ role: 'user', content: 'Hi there' }] }).finalMessage();
      assert.equal(ts.content[0].text, t.content[0].text);
      assert.equal(ts.usage.output_tokens, t.usage.output_tokens);
    });
  });

  it('metrics count requests by dialect: sluice_dialect_requests_total{group,dialect}', async () => {
    await anthropic.messages.create({ model: 'mock-model', max_tokens: 5, messages: [{ role: 'user', content: 'm' }] });
    await openai.responses.create({ model: 'mock-model', input: 'r' });
    await openai.chat.completions.create({ model: 'mock-model', messages: [{ role: 'user', content: 'c' }] });
    const m = (await scrape(sluice.admin_url)).parsed;
    const count = (dialect) => samples(m, 'sluice_dialect_requests_total', { group: 'chat', dialect }).reduce((a, s) => a + s.value, 0);
    assert.ok(count('messages') >= 1);
    assert.ok(count('responses') >= 1);
    assert.ok(count('chat') >= 1);
    const refused = samples(m, 'sluice_dialect_requests_total', { group: '', dialect: 'messages' });
    assert.ok(refused.length === 1 && refused[0].value >= 1, 'refused before a group: group ""');
    // The status page's JSON: the same counts, every group together.
    const status = await (await fetch(`${sluice.admin_url}/status.json`)).json();
    assert.deepEqual(Object.keys(status.dialects), ['chat', 'completions', 'embeddings', 'responses', 'messages']);
    assert.ok(status.dialects.messages >= count('messages') + 1);
    assert.ok(status.dialects.responses >= 1);
  });

  it('over HTTP/2 (h2c): a Messages stream and a Responses body, rendered as over HTTP/1.1', async () => {
    const session = http2.connect(sluice.url);
    session.on('error', () => {});
    const post = (path, body, headers) => new Promise((resolve, reject) => {
      const req = session.request({ ':method': 'POST', ':path': path, 'content-type': 'application/json', ...headers });
      let status, type;
      const parts = [];
      req.on('response', (h) => { status = h[':status']; type = h['content-type']; });
      req.on('data', (d) => parts.push(d));
      req.on('end', () => resolve({ status, type, text: Buffer.concat(parts).toString('utf8') }));
      req.on('error', reject);
      req.end(JSON.stringify(body));
    });
    try {
      const m = await post('/v1/messages', { model: 'mock-model', max_tokens: 20, stream: true, messages: [{ role: 'user', content: 'h2' }] },
                           { 'x-api-key': test_key });
      assert.equal(m.status, 200, m.text);
      assert.match(m.type, /^text\/event-stream/);
      const events = m.text.split('\n\n').filter(Boolean).map((e) => e.split('\n')[0].slice(7));
      assert.deepEqual([events[0], events[1], events.at(-2), events.at(-1)], ['message_start', 'ping', 'message_delta', 'message_stop'],
                       'opened as soon as the backend answered (message_start, a ping), as Anthropic opens its streams');
      const text = m.text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)))
        .filter((e) => e.type === 'content_block_delta').map((e) => e.delta.text).join('');
      assert.equal(text.split(' ').length, 6);
      const r = await post('/v1/responses', { model: 'mock-model', input: 'h2' }, { authorization: `Bearer ${test_key}` });
      assert.equal(r.status, 200, r.text);
      const resp = JSON.parse(r.text);
      assert.equal(resp.object, 'response');
      assert.equal(resp.output[0].content[0].text.split(' ').length, 6);
      const e = await post('/v1/messages', { model: 'mock-model', messages: [] }, { 'x-api-key': test_key });
      assert.equal(e.status, 400);
      assert.equal(JSON.parse(e.text).error.type, 'invalid_request_error');
    } finally {
      session.close();
    }
  });

  it('a backend that fails mid-stream: response.failed, or Messages\' error event -- a failed answer, never a cut one', async () => {
    const events = [];
    const s = openai.responses.stream({ model: 'failing-model', input: 'x' }, { headers: { 'x-request-id': 'fail-resp' } });
    for await (const e of s) events.push(e);
    const last = events.at(-1);
    assert.equal(last.type, 'response.failed');
    assert.equal(last.response.status, 'failed');
    assert.equal(last.response.error.code, 'server_error');
    assert.equal(events.filter((e) => e.type === 'response.output_text.delta').length, 3, 'what came before the failure');
    await assert.rejects(anthropic.messages.stream({ model: 'failing-model', max_tokens: 20, messages: [{ role: 'user', content: 'x' }] }).finalMessage(),
      (e) => e instanceof Anthropic.APIError && /stream ended before its answer/.test(e.message));
    const rec = await audited('fail-resp');
    assert.equal(rec.error, 'upstream_truncated');
    assert.equal(rec.completion_tokens, 3, 'billed the deltas it got');
  });

  for (const [dialect, path, body, headers] of [
    ['responses', '/v1/responses', { model: 'slow-model', input: 'long', stream: true }, { authorization: `Bearer ${test_key}` }],
    ['messages', '/v1/messages', { model: 'slow-model', max_tokens: 500, stream: true, messages: [{ role: 'user', content: 'long' }] },
     { 'x-api-key': test_key }],
  ]) {
    it(`a ${dialect} client that leaves mid-stream: the backend is cut, and it is billed what it was sent`, async () => {
      const id = `cut-${dialect}`;
      const from = slow.proc.mark();
      let deltas = 0;
      let text = '';
      await http_post(sluice.url, path, body, {
        headers: { ...headers, 'x-request-id': id },
        on_data: (d, req) => {
          text += d.toString('utf8');
          deltas = (text.match(/^event: \S*delta$/gm) ?? []).length;
          if (deltas >= 5) req.destroy();
        },
      }).catch(() => null);
      await slow.proc.wait_for_line(new RegExp(`abort request_id=\\S*${id}\\b`), { from, timeout_ms: bound_ms(5000) });
      const rec = await audited(id);
      assert.equal(rec.cancelled, true);
      assert.equal(rec.dialect, dialect);
      // Each delta is a token: billed at least what the client read, and
      // never the whole reply.
      assert.ok(rec.completion_tokens >= deltas && rec.completion_tokens < 200, `billed ${rec.completion_tokens}, the client read ${deltas}`);
      assert.ok(rec.prompt_tokens > 0);
    });
  }

  it('a reasoning model: a reasoning item for Responses, a thinking block for Messages, then the answer', async () => {
    const r = await openai.responses.stream({ model: 'reasoner', input: '2+2?' }).finalResponse();
    assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(r.output[0].content[0].text, 'Two and two.');
    assert.equal(text_of(r), 'Four.');
    const m = await anthropic.messages.stream({ model: 'reasoner', max_tokens: 50, messages: [{ role: 'user', content: '2+2?' }] }).finalMessage();
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(m.content[0].thinking, 'Two and two.');
    assert.equal(m.content[1].text, 'Four.');
  });

  it('an image for a text-prompt (Triton) group: a 400 in each client\'s dialect, nothing forwarded', async () => {
    const calls = triton.calls.length;
    const png = 'iVBORw0KGgo=';
    await assert.rejects(anthropic.messages.create({ model: 'tri-x', max_tokens: 5, messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }, { type: 'text', text: 'what?' }] }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.error.error.type === 'invalid_request_error' && /image/.test(e.error.error.message));
    await assert.rejects(openai.responses.create({ model: 'tri-x', input: [{ role: 'user', content: [
      { type: 'input_image', image_url: `data:image/png;base64,${png}` }, { type: 'input_text', text: 'what?' }] }] }),
      (e) => e instanceof OpenAI.BadRequestError && /image/.test(e.message));
    assert.equal(triton.calls.length, calls);
  });

  describe('OpenAI SDK, Responses', () => {
    it('responses.create over a chat backend: output_text, a response shape, the usage audited', async () => {
      const r = await openai.responses.create({ model: 'mock-model', input: 'Say hello.', instructions: 'Be brief.',
        max_output_tokens: 50 }, { headers: { 'x-request-id': 'resp-plain' } });
      assert.equal(r.object, 'response');
      assert.equal(r.id, 'resp_resp-plain');
      assert.equal(r.status, 'completed');
      assert.equal(r.output_text.split(' ').length, 6);
      assert.equal(r.usage.output_tokens, 6);
      assert.equal(r.usage.total_tokens, r.usage.input_tokens + 6);
      const rec = await audited('resp-plain');
      assert.equal(rec.dialect, 'responses');
      assert.equal(rec.endpoint, '/v1/responses');
      assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], [r.usage.input_tokens, r.usage.output_tokens]);
    });

    it('responses.stream(): increasing sequence numbers, deltas that add up, finalResponse', async () => {
      const stream = openai.responses.stream({ model: 'mock-model', input: [{ role: 'user', content: [{ type: 'input_text', text: 'Stream.' }] }] },
                                             { headers: { 'x-request-id': 'resp-stream' } });
      const seqs = [];
      let deltas = '';
      for await (const e of stream) {
        seqs.push(e.sequence_number);
        if (e.type === 'response.output_text.delta') deltas += e.delta;
      }
      const r = await stream.finalResponse();
      assert.deepEqual(seqs, seqs.map((_, i) => i));
      assert.equal(r.status, 'completed');
      assert.equal(text_of(r), deltas);
      assert.equal(deltas.split(' ').length, 6);
      const rec = await audited('resp-stream');
      assert.equal(rec.dialect, 'responses');
      assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], [r.usage.input_tokens, r.usage.output_tokens]);
    });

    it('max_output_tokens reached: status incomplete', async () => {
      const r = await openai.responses.create({ model: 'mock-model', input: 'Long.', max_output_tokens: 3 });
      assert.equal(r.status, 'incomplete');
      assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
      assert.equal(r.usage.output_tokens, 3);
    });

    it('function calls both ways: a function_call item comes back; its output goes up as a tool message', async () => {
      const seen = tools.requests.length;
      const r = await openai.responses.create({ model: 'tool-model', input: 'Weather in Paris?', tools: [weather_tool_openai] });
      const call = r.output.find((o) => o.type === 'function_call');
      assert.deepEqual([call.call_id, call.name, JSON.parse(call.arguments)], ['call_w1', 'get_weather', { city: 'Paris' }]);
      assert.equal(r.output_text, 'Checking.');
      const sent = tools.requests[seen].body;
      assert.deepEqual(sent.tools, [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city.', parameters: weather_tool_openai.parameters } }]);
      const s = openai.responses.stream({ model: 'tool-model', tools: [weather_tool_openai], input: [
        { role: 'user', content: 'Weather in Paris?' },
        { type: 'function_call', call_id: 'call_w1', name: 'get_weather', arguments: '{"city":"Paris"}' },
        { type: 'function_call_output', call_id: 'call_w1', output: '21C' },
      ] });
      const fin = await s.finalResponse();
      const streamed = fin.output.find((o) => o.type === 'function_call');
      assert.equal(streamed.arguments, '{"city":"Paris"}');
      const up = tools.requests.at(-1).body;
      assert.deepEqual(up.messages.slice(1), [
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_w1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_w1', content: '21C' },
      ]);
    });

    it('errors are OpenAI\'s, as the SDK\'s classes; nothing refused is forwarded', async () => {
      const bad = new OpenAI({ apiKey: 'sk-wrong', baseURL: `${sluice.url}/v1`, maxRetries: 0 });
      await assert.rejects(bad.responses.create({ model: 'mock-model', input: 'x' }), (e) => e instanceof OpenAI.AuthenticationError);
      const seen = tools.requests.length;
      await assert.rejects(openai.responses.create({ model: 'tool-model', input: [{ type: 'function_call_output', call_id: 'nope', output: 'x' }] }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].call_id');
      await assert.rejects(openai.responses.create({ model: 'tool-model', input: [{ type: 'web_search_call', id: 'w' }] }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].type');
      await assert.rejects(openai.responses.create({ model: 'tool-model', input: 'x', previous_response_id: 'resp_1' }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id' && /\[responses\] store/.test(e.message));
      assert.equal(tools.requests.length, seen);
      await assert.rejects(poor_openai.responses.create({ model: 'mock-model', input: 'x', max_output_tokens: 1000 }),
        (e) => e instanceof OpenAI.RateLimitError);
    });

    it('responses.retrieve and .delete: 404 NotFoundError, no store kept', async () => {
      await assert.rejects(openai.responses.retrieve('resp_x'), (e) => e instanceof OpenAI.NotFoundError && /store/.test(e.message));
      await assert.rejects(openai.responses.delete('resp_x'), (e) => e instanceof OpenAI.NotFoundError);
    });

    it('over an Anthropic backend and a Triton backend: create and stream', async () => {
      peer.set({ text: 'Hello from Claude.', input_tokens: 21, output_tokens: 5 });
      const r = await openai.responses.create({ model: 'claude-x', input: 'Hi' });
      assert.equal(r.output_text, 'Hello from Claude.');
      assert.deepEqual([r.usage.input_tokens, r.usage.output_tokens], [21, 5]);
      const s = await openai.responses.stream({ model: 'claude-x', input: 'Hi' }).finalResponse();
      assert.equal(text_of(s), 'Hello from Claude.');
      assert.deepEqual([s.usage.input_tokens, s.usage.output_tokens], [21, 5]);
      const t = await openai.responses.create({ model: 'tri-x', input: 'Hi there' });
      assert.ok(t.output_text.length > 0);
      const ts = await openai.responses.stream({ model: 'tri-x', input: 'Hi there' }).finalResponse();
      assert.equal(text_of(ts), t.output_text);
      assert.equal(ts.usage.output_tokens, t.usage.output_tokens);
    });
  });
});
