// Events larger than a receive buffer on the dialects' streams. A chat
// backend may put a whole tool call's arguments, or a long run of text, in
// one delta (some backends' tool parsers write the arguments at the end, at
// once), and a native Responses stream ends with response.completed, which
// holds the whole response: every word of its output. Such events reach
// sluice over many reads. A Responses or Messages client must get them
// rendered whole (the SDKs see the text and the arguments exactly), and a
// native stream's usage must be read from its last event however long the
// output was (billing, the audit record).
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { gateway_config, poll, read_audit, samples, scrape } from './lib/gateway.mjs';
import { bound_ms, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const big_text = Array.from({ length: 9000 }, (_, i) => `w${i}`).join(' ');  // ~60 kB
const big_args = JSON.stringify({ path: 'src/main.c', content: 'int x;\n'.repeat(40000) });  // ~280 kB
// A text_delta whose event is just under the 4 MiB sluice reads whole: its
// chat chunk (the translation, with an id and the model) is just over.
const most_text = 'm'.repeat(4 * 1024 * 1024 - 200);

// Writes `bytes` in pieces of `size` with a pause between them, so that the
// reads on the other side end inside the events.
async function trickle(socket, bytes, size = 7000) {
  const b = Buffer.from(bytes, 'latin1');
  for (let at = 0; at < b.length; at += size) {
    socket.write(b.subarray(at, at + size));
    await sleep(1);
  }
}

// A chat backend: a long text delta, or (when the request offers tools) one
// tool call whose arguments come whole in a single delta; one event per
// chunk, each written in small pieces.
function chat_backend() {
  return start_scripted_backend(async (socket, request) => {
    const body = request.body ?? {};
    const base = { id: 'chatcmpl-large', object: 'chat.completion.chunk', created: 1700000000, model: body.model };
    const ev = (choices, extra = {}) => chunk(`data: ${JSON.stringify({ ...base, choices, ...extra })}\n\n`).toString('latin1');
    const tools = Array.isArray(body.tools) && body.tools.length > 0;
    const delta = tools
      ? { tool_calls: [{ index: 0, id: 'call_big', type: 'function', function: { name: 'write_file', arguments: big_args } }] }
      : { content: big_text };
    await trickle(socket, sse_head + ev([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]) +
      ev([{ index: 0, delta, finish_reason: null }]) + ev([{ index: 0, delta: {}, finish_reason: tools ? 'tool_calls' : 'stop' }]) +
      ev([], { usage: { prompt_tokens: 11, completion_tokens: 4000, total_tokens: 4011 } }) + chunk('data: [DONE]\n\n').toString('latin1') +
      '0\r\n\r\n');
  });
}

// A native Responses backend whose response.completed carries the whole
// long output (as vLLM's does), written in small pieces.
function native_backend() {
  return start_scripted_backend(async (socket, request) => {
    const body = request.body ?? {};
    const message = { type: 'message', id: 'msg_large', role: 'assistant', status: 'completed',
      content: [{ type: 'output_text', text: big_text, annotations: [] }] };
    const response = (status, output, usage) => ({ id: 'resp_large', object: 'response', created_at: 1700000000, model: body.model,
      status, output, usage });
    let seq = 0;
    const ev = (type, extra) => chunk(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...extra })}\n\n`).toString('latin1');
    await trickle(socket, 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n' +
      ev('response.created', { response: response('in_progress', [], null) }) +
      ev('response.output_text.delta', { item_id: 'msg_large', output_index: 0, content_index: 0, delta: big_text }) +
      ev('response.completed', { response: response('completed', [message], { input_tokens: 13, output_tokens: 9000, total_tokens: 9013 }) }) +
      '0\r\n\r\n');
  });
}

// An Anthropic Messages backend: the same long text in one text_delta, or
// one tool_use block whose whole input comes in a single input_json_delta,
// each event written in small pieces.
function anthropic_backend() {
  return start_scripted_backend(async (socket, request) => {
    const body = request.body ?? {};
    const tools = Array.isArray(body.tools) && body.tools.length > 0;
    const most = JSON.stringify(body.messages ?? []).includes('Write the most.');
    const ev = (type, extra) => chunk(`event: ${type}\ndata: ${JSON.stringify({ type, ...extra })}\n\n`).toString('latin1');
    const block = tools ? { type: 'tool_use', id: 'toolu_big', name: 'write_file', input: {} } : { type: 'text', text: '' };
    const delta = tools ? { type: 'input_json_delta', partial_json: big_args }
      : { type: 'text_delta', text: most ? most_text : big_text };
    await trickle(socket, sse_head +
      ev('message_start', { message: { id: 'msg_big', type: 'message', role: 'assistant', model: body.model, content: [],
        stop_reason: null, usage: { input_tokens: 12, output_tokens: 1 } } }) +
      ev('content_block_start', { index: 0, content_block: block }) +
      ev('content_block_delta', { index: 0, delta }) +
      ev('content_block_stop', { index: 0 }) +
      ev('message_delta', { delta: { stop_reason: tools ? 'tool_use' : 'end_turn' }, usage: { output_tokens: 4000 } }) +
      ev('message_stop', {}) + '0\r\n\r\n');
  });
}

describe('events larger than a receive buffer on the dialects\' streams', () => {
  let chat, native, messages, sluice, openai, anthropic;
  const audit = () => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
  before(async () => {
    chat = await chat_backend();
    native = await native_backend();
    messages = await anthropic_backend();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 } },
        groups: [{ name: 'chat', models: ['chat-model'], backends: [chat.url] },
          { name: 'native', models: ['native-model'], native_dialects: ['chat', 'responses'], backends: [native.url] },
          { name: 'anthropic', models: ['claude-model'], protocol: 'anthropic', backends: [messages.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
    const opts = { apiKey: test_key, maxRetries: 0, timeout: bound_ms(20000) };
    openai = new OpenAI({ ...opts, baseURL: `${sluice.url}/v1` });
    anthropic = new Anthropic({ ...opts, baseURL: sluice.url });
  });
  after(() => stop_all(sluice, chat, native, messages));

  const tool = { type: 'function', name: 'write_file', parameters: { type: 'object', properties: { path: { type: 'string' } } } };

  it('Responses: a 60 kB text delta and a 280 kB tool call come whole through the SDK\'s stream', async () => {
    const text = await openai.responses.stream({ model: 'chat-model', input: 'Write.' }).finalResponse();
    assert.equal(text.status, 'completed');
    const got = text.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join('');
    assert.equal(got.length, big_text.length, got.slice(0, 200));
    assert.ok(got === big_text, 'the text exactly');
    const call = await openai.responses.stream({ model: 'chat-model', input: 'Write the file.', tools: [tool] }).finalResponse();
    const fc = call.output.find((o) => o.type === 'function_call');
    assert.ok(fc, JSON.stringify(call.output).slice(0, 300));
    assert.equal(fc.name, 'write_file');
    assert.equal(fc.arguments, big_args);
  });

  it('Messages: the same, through the Anthropic SDK\'s stream().finalMessage()', async () => {
    const text = await anthropic.messages.stream({ model: 'chat-model', max_tokens: 8000, messages: [{ role: 'user', content: 'Write.' }] })
      .finalMessage();
    assert.equal(text.content[0].text, big_text);
    const call = await anthropic.messages.stream({ model: 'chat-model', max_tokens: 8000, messages: [{ role: 'user', content: 'Write the file.' }],
      tools: [{ name: 'write_file', input_schema: { type: 'object' } }] }).finalMessage();
    const use = call.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(call.content).slice(0, 300));
    assert.deepEqual(use.input, JSON.parse(big_args));
    assert.equal(call.stop_reason, 'tool_use');
  });

  it('an Anthropic backend: a 60 kB text_delta and a 280 kB input_json_delta reach a chat and a Responses client whole', async () => {
    let text = '';
    for await (const c of await openai.chat.completions.create({ model: 'claude-model', stream: true,
      messages: [{ role: 'user', content: 'Write.' }] })) {
      text += c.choices[0]?.delta?.content ?? '';
    }
    assert.ok(text === big_text, `the text exactly (${text.length} of ${big_text.length} bytes)`);
    const calls = await openai.chat.completions.stream({ model: 'claude-model', messages: [{ role: 'user', content: 'Write the file.' }],
      tools: [{ type: 'function', function: { name: 'write_file', parameters: { type: 'object' } } }] }).finalChatCompletion();
    const call = calls.choices[0].message.tool_calls?.[0];
    assert.ok(call, JSON.stringify(calls.choices[0].message).slice(0, 300));
    assert.equal(call.function.name, 'write_file');
    assert.equal(call.function.arguments, big_args);
    assert.equal(calls.choices[0].finish_reason, 'tool_calls');
    const r = await openai.responses.stream({ model: 'claude-model', input: 'Write the file.', tools: [tool] }).finalResponse();
    const fc = r.output.find((o) => o.type === 'function_call');
    assert.ok(fc, JSON.stringify(r.output).slice(0, 300));
    assert.equal(fc.arguments, big_args);
  });

  it('an Anthropic text_delta just under 4 MiB reaches a Responses client whole, though its chat chunk is just over', async () => {
    const r = await openai.responses.stream({ model: 'claude-model', input: 'Write the most.' }).finalResponse();
    assert.equal(r.status, 'completed');
    const text = r.output.find((o) => o.type === 'message')?.content?.[0]?.text ?? '';
    assert.ok(text === most_text, `the text exactly (${text.length} of ${most_text.length} bytes)`);
  });

  it('the buffers a large event grew go back when its answer is done, the keep-alive connection still open', async () => {
    // A Responses stream of the 280 kB tool call over one connection held
    // open: the translator's and the renderer's room (megabytes) must not
    // stay with the connection for its next requests.
    const gauge = async () => samples((await scrape(sluice.admin_url)).parsed, 'sluice_connection_memory_bytes')[0].value;
    const body = JSON.stringify({ model: 'claude-model', input: 'Write the file.', stream: true, tools: [tool] });
    const socket = net.connect(Number(new URL(sluice.url).port), '127.0.0.1');
    try {
      let got = '';
      const ended = new Promise((resolve, reject) => {
        socket.on('data', (d) => { got += d.toString('latin1'); if (got.endsWith('0\r\n\r\n')) resolve(); });
        socket.on('error', reject);
        socket.on('close', () => reject(new Error(`closed early: ${got.slice(0, 300)}`)));
      });
      socket.write(`POST /v1/responses HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer ${test_key}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      await ended;
      assert.ok(got.includes('response.completed'), got.slice(0, 300));
      await poll(async () => (await gauge()) < 1_500_000, { what: 'the connection memory back under 1.5 MB, the connection open' });
      assert.ok(!socket.destroyed, 'the connection is still open');
    } finally {
      socket.destroy();
    }
  });

  it('a native Responses stream: the usage of a response.completed of 130 kB over many reads is billed', async () => {
    let done;
    const stream = await openai.responses.create({ model: 'native-model', input: 'Write.', stream: true },
      { headers: { 'x-request-id': 'native-large' } });
    for await (const e of stream) if (e.type === 'response.completed') done = e.response;
    assert.equal(done.output[0].content[0].text, big_text);
    let rec;
    await poll(() => (rec = audit().find((r) => r.request_id === 'native-large')) !== undefined, { what: 'the audit record' });
    assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], [13, 9000]);
  });
});
