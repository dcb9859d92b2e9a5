// A group with protocol = "triton": the stock OpenAI SDK through sluice in
// front of a KServe v2 gRPC backend (ModelStreamInfer). The backend here is
// lib/triton_peer.mjs, written on @grpc/grpc-js over the service's proto
// (checked in peers.test.mjs), so sluice's HTTP/2 client, framing, encoder
// and decoder are tested against an implementation they share nothing
// with. The client sees OpenAI's API: vLLM's chunk sequence, ids
// chatcmpl-<request id>, the model it asked for, usage from the backend's
// counts.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll, read_audit } from './lib/gateway.mjs';
import { bound_ms, start_mock_triton, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { start_triton_peer } from './lib/triton_peer.mjs';

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

function config(groups) {
  return gateway_config({
    tables: { upstream: { max_retries: 1 }, health: { interval_ms: 0 } },
    groups,
    keys: [{ id: 'test', key: test_key }],
  });
}

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hello.' }];

describe('protocol = "triton"', () => {
  let vllm, trt, sluice, sdk;
  before(async () => {
    vllm = await start_triton_peer({ model: 'tri-vllm' });
    trt = await start_triton_peer({ model: 'tri-trt' });
    sluice = await start_sluice({
      config: config([
        { name: 'tri', models: ['tri-*', 'tri'], protocol: 'triton', triton_flavor: 'vllm', backend_model: 'tri-vllm',
          default_max_tokens: 64, backends: [vllm.url] },
        { name: 'trt', models: ['trt'], protocol: 'triton', triton_flavor: 'trtllm', chat_template: 'llama3',
          backend_model: 'tri-trt', backends: [trt.url] },
      ]),
    });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, vllm, trt));

  it('a non-stream chat completion: OpenAI shape, the backend\'s text and counts; a ModelInferRequest upstream', async () => {
    vllm.set({ model: 'tri-vllm', tokens: ['Hello', ' from', ' Triton', '.'], input_tokens: 17 });
    const r = await sdk.chat.completions.create({ model: 'tri-a', messages, temperature: 0.25, max_tokens: 20, seed: 7 },
                                                { headers: { 'x-request-id': 'tri-plain-1' } });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.id, 'chatcmpl-tri-plain-1');
    assert.equal(r.model, 'tri-a');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, 'Hello from Triton.');
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.usage.prompt_tokens, 17);
    assert.equal(r.usage.completion_tokens, 4);
    const sent = vllm.requests.at(-1);
    assert.equal(sent.model_name, 'tri-vllm');
    assert.equal(sent.id, 'tri-plain-1');
    assert.equal(sent.flavour, 'vllm');
    assert.equal(sent.inputs.text_input.datatype, 'BYTES');
    assert.equal(sent.inputs.text_input.value,
                 '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n');
    assert.equal(sent.inputs.exclude_input_in_output.value, true);
    const sp = sent.inputs.sampling_parameters.value;
    assert.equal(sp.max_tokens, 20);
    assert.equal(sp.temperature, 0.25);
    assert.equal(sp.seed, 7);
    assert.equal(sent.parameters.triton_enable_empty_final_response, true);
  });

  it('streams with the common chunk.choices[0] loop, and the usage chunk when asked', async () => {
    vllm.set({ model: 'tri-vllm', tokens: ['One', ' two', ' three', '.'], input_tokens: 9 });
    for (const include_usage of [false, true]) {
      const chunks = await collect(await sdk.chat.completions.create({
        model: 'tri', messages, stream: true, ...(include_usage ? { stream_options: { include_usage: true } } : {}),
      }, { headers: { 'x-request-id': `tri-stream-${include_usage}` } }));
      let text = '';
      for (const chunk of chunks) {
        if (chunk.choices[0]?.delta?.content) text += chunk.choices[0].delta.content;
      }
      assert.equal(text, 'One two three.');
      for (const c of chunks) {
        assert.equal(c.id, `chatcmpl-tri-stream-${include_usage}`);
        assert.equal(c.object, 'chat.completion.chunk');
        assert.equal(c.model, 'tri');
      }
      assert.equal(chunks[0].choices[0].delta.role, 'assistant');
      const finish = chunks.filter((c) => c.choices[0]?.finish_reason);
      assert.equal(finish.length, 1);
      assert.equal(finish[0].choices[0].finish_reason, 'stop');
      const usage = chunks.filter((c) => c.usage);
      if (include_usage) {
        assert.equal(usage.length, 1);
        assert.deepEqual([usage[0].usage.prompt_tokens, usage[0].usage.completion_tokens], [9, 4]);
      } else {
        assert.equal(usage.length, 0);
      }
    }
  });

  it('legacy completions pass the prompt as it is', async () => {
    vllm.set({ model: 'tri-vllm', tokens: ['A', 'B'] });
    const r = await sdk.completions.create({ model: 'tri', prompt: 'Once upon', max_tokens: 5 });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices[0].text, 'AB');
    assert.equal(vllm.requests.at(-1).inputs.text_input.value, 'Once upon');
    const chunks = await collect(await sdk.completions.create({ model: 'tri', prompt: 'Once upon', stream: true }));
    assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), 'AB');
  });

  it('the TensorRT-LLM flavour: its inputs and the llama3 template', async () => {
    trt.set({ model: 'tri-trt', tokens: ['Hi', '!'] });
    const r = await sdk.chat.completions.create({ model: 'trt', messages, max_tokens: 11, temperature: 0.5, stop: ['END'] });
    assert.equal(r.choices[0].message.content, 'Hi!');
    const sent = trt.requests.at(-1);
    assert.equal(sent.flavour, 'trtllm');
    assert.equal(sent.inputs.max_tokens.datatype, 'INT32');
    assert.equal(sent.inputs.max_tokens.value, 11);
    assert.equal(sent.inputs.stream.value, true);
    assert.ok(Math.abs(sent.inputs.temperature.value - 0.5) < 1e-6);
    assert.match(sent.inputs.text_input.value, /<\|start_header_id\|>user<\|end_header_id\|>\n\nSay hello\.<\|eot_id\|>/);
  });

  it('what a text prompt cannot carry is refused with a 400 before anything is sent', async () => {
    const seen = vllm.requests.length;
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
    await assert.rejects(sdk.chat.completions.create({ model: 'tri', messages, tools }), (err) => {
      assert.equal(err.status, 400);
      assert.match(err.message, /tools/);
      return true;
    });
    await assert.rejects(sdk.embeddings.create({ model: 'tri', input: 'x' }), (err) => err.status === 400);
    assert.equal(vllm.requests.length, seen);
  });

  it('gRPC statuses reach the SDK as OpenAI errors', async () => {
    const cases = [[8, 429, OpenAI.RateLimitError], [3, 400, OpenAI.BadRequestError], [4, 504, null], [13, 502, null]];
    for (const [code, status, type] of cases) {
      vllm.set({ model: 'tri-vllm', status: code, details: `status ${code} here` });
      await assert.rejects(sdk.chat.completions.create({ model: 'tri', messages }), (err) => {
        assert.equal(err.status, status, `grpc ${code}`);
        if (type) assert.ok(err instanceof type, String(err));
        return true;
      });
    }
  });

  it('an error after the first token ends the stream as vLLM\'s does: the SDK raises after the tokens', async () => {
    vllm.set({ model: 'tri-vllm', tokens: ['a', 'b', 'c', 'd'], fail_after: 2, fail_status: 13, details: 'boom' });
    const seen = [];
    await assert.rejects((async () => {
      for await (const c of await sdk.chat.completions.create({ model: 'tri', messages, stream: true })) {
        seen.push(c.choices[0]?.delta?.content ?? '');
      }
    })());
    assert.equal(seen.join(''), 'ab');
    vllm.set({ model: 'tri-vllm', tokens: ['a', 'b', 'c'], error_message_after: 1, error_text: 'model failed' });
    const seen2 = [];
    await assert.rejects((async () => {
      for await (const c of await sdk.chat.completions.create({ model: 'tri', messages, stream: true })) {
        seen2.push(c.choices[0]?.delta?.content ?? '');
      }
    })(), /model failed/);
    assert.equal(seen2.join(''), 'a');
  });

  it('bills and audits the backend\'s counts', async () => {
    vllm.set({ model: 'tri-vllm', tokens: ['x', 'y', 'z'], input_tokens: 31 });
    await sdk.chat.completions.create({ model: 'tri', messages }, { headers: { 'x-request-id': 'tri-audit-1' } });
    await collect(await sdk.chat.completions.create({ model: 'tri', messages, stream: true },
                                                    { headers: { 'x-request-id': 'tri-audit-2' } }));
    const file = path.join(sluice.dir, 'sluice-audit.jsonl');
    const lines = await poll(() => {
      const l = read_audit(file).filter((r) => r.request_id === 'tri-audit-1' || r.request_id === 'tri-audit-2');
      return l.length === 2 ? l : null;
    }, { what: 'both audit lines' });
    for (const l of lines) {
      assert.equal(l.status, 200);
      assert.equal(l.prompt_tokens, 31);
      assert.equal(l.completion_tokens, 3);
      assert.equal(l.group, 'tri');
      assert.equal(l.finish_reason, 'stop');
    }
  });

  it('a client that goes away mid-stream cancels the gRPC call at once (RST_STREAM)', async () => {
    vllm.set({ model: 'tri-vllm', tokens: Array.from({ length: 200 }, (_, i) => `t${i} `), delay_ms: 20 });
    const cancels = vllm.cancels.length;
    const controller = new AbortController();
    const stream = await sdk.chat.completions.create({ model: 'tri', messages, stream: true }, { signal: controller.signal });
    let n = 0;
    try {
      for await (const c of stream) {
        if (c.choices[0]?.delta?.content && ++n === 3) controller.abort();
      }
    } catch (err) {
      assert.ok(err instanceof OpenAI.APIUserAbortError || err.name === 'AbortError', String(err));
    }
    assert.equal(n, 3);
    await vllm.wait_for('cancels', cancels + 1, bound_ms(2000));
  });

  it('many concurrent streams share the backend connection, each with its own answer', async () => {
    vllm.set((req) => ({ model: 'tri-vllm', tokens: [`${req.id}-a`, `-${req.id}-b`] }));
    const ids = Array.from({ length: 40 }, (_, i) => `tri-many-${i}`);
    const texts = await Promise.all(ids.map(async (id) => {
      const chunks = await collect(await sdk.chat.completions.create({ model: 'tri', messages, stream: true },
                                                                     { headers: { 'x-request-id': id } }));
      return chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    }));
    assert.deepEqual(texts, ids.map((id) => `${id}-a-${id}-b`));
  });
});

describe('protocol = "triton": retries and a backend that is away', () => {
  let down, up, sluice, sdk;
  before(async () => {
    down = await start_triton_peer({ model: 'm', status: 14, details: 'warming up' });
    up = await start_triton_peer({ model: 'm', tokens: ['ok'] });
    sluice = await start_sluice({
      config: config([{ name: 'tri', models: ['tri'], protocol: 'triton', backend_model: 'm', balance: 'round-robin',
                        backends: [down.url, up.url] }]),
    });
    sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, down, up));

  it('UNAVAILABLE before any token is retried on the next backend; with none left the client gets 503', async () => {
    for (let i = 0; i < 4; ++i) {
      const r = await sdk.chat.completions.create({ model: 'tri', messages: [{ role: 'user', content: `hi ${i}` }] });
      assert.equal(r.choices[0].message.content, 'ok');
    }
    await up.stop();
    await assert.rejects(sdk.chat.completions.create({ model: 'tri', messages }), (err) => err.status === 503);
  });
});

describe('protocol = "triton": a client that stops reading', () => {
  let mock, sluice;
  const token_pad = 2048;
  before(async () => {
    mock = await start_mock_triton({ reply_tokens: 30000, extra_args: ['--token-pad', String(token_pad)] });
    sluice = await start_sluice({
      config: config([{ name: 'tri', models: ['tri'], protocol: 'triton', backend_model: 'mock-model', backends: [mock.url] }]),
    });
  });
  after(() => stop_all(sluice, mock));

  it('a non-stream reply larger than the stream window comes whole (its window opens as sluice gathers it)', async () => {
    const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
    const r = await sdk.chat.completions.create({ model: 'tri', messages: [{ role: 'user', content: 'a long one' }], max_tokens: 300 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 300);
    assert.ok(r.choices[0].message.content.length > 300 * token_pad, `${r.choices[0].message.content.length} bytes`);
  });

  it('slows its own stream down to what it takes: the backend is held by the window, sluice buffers nothing', async () => {
    const rss = (pid) => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB$/m)[1]) * 1024;
    const rss_before = rss(sluice.proc.child.pid);
    const body = JSON.stringify({ model: 'tri', messages: [{ role: 'user', content: 'a lot' }], stream: true, max_tokens: 30000 });
    const socket = net.connect({ port: sluice.port, host: '127.0.0.1' });
    await once(socket, 'connect');
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${test_key}\r\n` +
                 `content-type: application/json\r\nx-request-id: tri-slow-1\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    // The head and the first events, then the socket is not read at all.
    const [first] = await once(socket, 'data');
    assert.match(first.toString('latin1'), /^HTTP\/1\.1 200 /);
    socket.pause();
    // While it is not read: sluice's memory stays where it was, whatever
    // the backend could make (mock-triton makes its reply at once; only the
    // stream's window, opened as the client takes bytes, lets it out).
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const growth = rss(sluice.proc.child.pid) - rss_before;
    assert.ok(growth < 8 * 1024 * 1024, `sluice's RSS grew ${growth} bytes`);
    socket.destroy();
    const file = path.join(sluice.dir, 'sluice-audit.jsonl');
    const [audit] = await poll(() => {
      const l = read_audit(file).filter((r) => r.request_id === 'tri-slow-1');
      return l.length === 1 ? l : null;
    }, { what: 'the audit line' });
    assert.equal(audit.status, 499);
    assert.equal(audit.cancelled, true);
    // What reached sluice before the window closed: what the client's and
    // sluice's socket buffers took, a few MB -- not the 60 MB asked for.
    const streamed = audit.completion_tokens * token_pad;
    assert.ok(audit.completion_tokens > 0 && streamed < 24 * 1024 * 1024,
              `${audit.completion_tokens} tokens streamed to a client that read one piece`);
  });
});
