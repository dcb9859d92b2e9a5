// mock-triton on its own, driven by @grpc/grpc-js over the published KServe
// v2 service (lib/proto/grpc_service.proto): readiness, the vLLM-backend and
// TensorRT-LLM-ensemble flavours of ModelStreamInfer, failures, cancels and
// many streams on one connection. Self-contained: it starts its own processes.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import proto_loader from '@grpc/proto-loader';
import { start_mock_triton, bound_ms } from './lib/harness.mjs';

const proto_path = path.join(path.dirname(fileURLToPath(import.meta.url)), 'lib/proto/grpc_service.proto');
const definition = proto_loader.loadSync(proto_path, { keepCase: true, longs: Number, defaults: true, oneofs: true });
const { inference } = grpc.loadPackageDefinition(definition);

const mocks = [];
const clients = [];
after(async () => {
  for (const c of clients) c.close();
  await Promise.all(mocks.map((m) => m.stop()));
});

async function start(options = {}) {
  const mock = await start_mock_triton(options);
  mocks.push(mock);
  const client = new inference.GRPCInferenceService(mock.address, grpc.credentials.createInsecure());
  clients.push(client);
  return { mock, client };
}

const unary = (client, method, request) => new Promise((resolve, reject) => {
  client[method](request, { deadline: Date.now() + bound_ms(5000) }, (err, res) => (err ? reject(err) : resolve(res)));
});

// KServe raw contents: BYTES elements are a 4-byte little-endian length and the bytes.
const bytes_element = (s) => {
  const b = Buffer.from(s);
  const n = Buffer.alloc(4);
  n.writeUInt32LE(b.length);
  return Buffer.concat([n, b]);
};
const bool_element = (v) => Buffer.from([v ? 1 : 0]);
const int32_element = (v) => { const b = Buffer.alloc(4); b.writeInt32LE(v); return b; };
const fp32_element = (v) => { const b = Buffer.alloc(4); b.writeFloatLE(v); return b; };

function request_of(id, tensors, { empty_final = false, model = 'mock-model' } = {}) {
  return {
    model_name: model, id,
    parameters: empty_final ? { triton_enable_empty_final_response: { bool_param: true } } : {},
    inputs: tensors.map(([name, datatype, shape]) => ({ name, datatype, shape })),
    raw_input_contents: tensors.map((t) => t[3]),
  };
}

// The vLLM backend's inputs.
function vllm_request(id, { text = 'one two three', stream = true, max_tokens, extras = true, exclude, empty_final } = {}) {
  const sampling = max_tokens === undefined ? {} : { max_tokens };
  const tensors = [
    ['text_input', 'BYTES', [1], bytes_element(text)],
    ['stream', 'BOOL', [1], bool_element(stream)],
    ['sampling_parameters', 'BYTES', [1], bytes_element(JSON.stringify(sampling))],
  ];
  if (exclude !== undefined) tensors.push(['exclude_input_in_output', 'BOOL', [1], bool_element(exclude)]);
  if (extras) {
    for (const name of ['return_finish_reason', 'return_num_input_tokens', 'return_num_output_tokens']) {
      tensors.push([name, 'BOOL', [1], bool_element(true)]);
    }
  }
  return request_of(id, tensors, { empty_final });
}

// The TensorRT-LLM ensemble's inputs.
function trtllm_request(id, { text = 'alpha beta', stream = true, max_tokens = 100, empty_final } = {}) {
  return request_of(id, [
    ['text_input', 'BYTES', [1, 1], bytes_element(text)],
    ['max_tokens', 'INT32', [1, 1], int32_element(max_tokens)],
    ['stream', 'BOOL', [1, 1], bool_element(stream)],
    ['temperature', 'FP32', [1, 1], fp32_element(0.5)],
    ['top_p', 'FP32', [1, 1], fp32_element(0.9)],
    ['stop_words', 'BYTES', [1, 1], bytes_element('</s>')],
  ], { empty_final });
}

// One ModelStreamInferResponse, its outputs decoded by datatype.
function read_response(r) {
  const out = { error_message: r.error_message, outputs: {}, shapes: {} };
  const infer = r.infer_response;
  if (!infer) return out;
  out.id = infer.id;
  out.model_name = infer.model_name;
  const final = infer.parameters?.triton_final_response;
  out.final = final === undefined ? undefined : final.bool_param;
  infer.outputs.forEach((o, i) => {
    const raw = infer.raw_output_contents[i];
    out.shapes[o.name] = o.shape;
    out.outputs[o.name] = o.datatype === 'BYTES' ? raw.subarray(4, 4 + raw.readUInt32LE(0)).toString()
      : o.datatype === 'UINT32' ? raw.readUInt32LE(0) : raw;
  });
  return out;
}

// Sends one request on a new stream, ends our side, and collects every
// response until the call's status.
function infer(client, request, { on_response } = {}) {
  return new Promise((resolve) => {
    const call = client.ModelStreamInfer({ deadline: Date.now() + bound_ms(10000) });
    const responses = [];
    let error = null;
    call.on('data', (r) => { responses.push(read_response(r)); on_response?.(call, responses); });
    call.on('error', (err) => { error = err; });
    call.on('status', (status) => resolve({ responses, status, error }));
    call.write(request);
    call.end();
  });
}

test('ServerReady and ModelReady answer true, ModelReady only for --model, and --not-ready makes both false', async () => {
  const { client } = await start();
  assert.deepEqual(await unary(client, 'ServerReady', {}), { ready: true });
  assert.deepEqual(await unary(client, 'ModelReady', { name: 'mock-model', version: '' }), { ready: true });
  assert.deepEqual(await unary(client, 'ModelReady', { name: 'other', version: '1' }), { ready: false });
  const down = await start({ not_ready: true });
  assert.deepEqual(await unary(down.client, 'ServerReady', {}), { ready: false });
  assert.deepEqual(await unary(down.client, 'ModelReady', { name: 'mock-model' }), { ready: false });
  assert.deepEqual(await unary(down.client, 'ServerLive', {}), { live: true });
  await assert.rejects(unary(client, 'ModelInfer', {}), (err) => err.code === grpc.status.UNIMPLEMENTED);
});

test('a vLLM-flavour stream: one token per response, finish reason and counts on the last, then the empty final response', async () => {
  const { mock, client } = await start({ reply_tokens: 5 });
  const mark = mock.proc.mark();
  const { responses, status } = await infer(client, vllm_request('v1', { max_tokens: 3, empty_final: true }));
  assert.equal(status.code, grpc.status.OK);
  assert.deepEqual(responses.map((r) => r.outputs.text_output), ['tok0', ' tok1', ' tok2', undefined]);
  assert.deepEqual(responses.map((r) => r.final), [false, false, false, true]);
  assert.ok(responses.every((r) => r.id === 'v1' && r.model_name === 'mock-model' && r.error_message === ''));
  assert.deepEqual(Object.keys(responses[0].outputs), ['text_output']);
  assert.deepEqual(responses[2].outputs, { text_output: ' tok2', finish_reason: 'length', num_input_tokens: 3, num_output_tokens: 3 });
  assert.deepEqual(responses[0].shapes.text_output, [1]);
  assert.deepEqual(responses[3].outputs, {});
  const { line } = await mock.proc.wait_for_line(/^request id=v1 /, { from: mark });
  assert.equal(line.text, 'request id=v1 model=mock-model flavour=vllm prompt_tokens=3');

  // Without the empty final response and with max_tokens above the reply:
  // "stop", no flag, on the EOS step's response, which has no text (as
  // vLLM's stream ends a reply stopped by EOS).
  const plain = await infer(client, vllm_request('v2', { max_tokens: 100 }));
  assert.equal(plain.responses.length, 6);
  assert.ok(plain.responses.every((r) => r.final === undefined));
  assert.equal(plain.responses[4].outputs.finish_reason, undefined);
  assert.deepEqual(plain.responses[5].outputs, { text_output: '', finish_reason: 'stop', num_input_tokens: 3, num_output_tokens: 5 });
});

test('a vLLM-flavour request without streaming gets the whole text in one response, the prompt first unless excluded', async () => {
  const { client } = await start({ reply_tokens: 3 });
  const whole = await infer(client, vllm_request('n1', { stream: false, text: 'Hi ' }));
  assert.equal(whole.status.code, grpc.status.OK);
  assert.equal(whole.responses.length, 1);
  assert.deepEqual(whole.responses[0].outputs, { text_output: 'Hi tok0 tok1 tok2', finish_reason: 'stop', num_input_tokens: 1, num_output_tokens: 3 });
  const excluded = await infer(client, vllm_request('n2', { stream: false, exclude: true, extras: false }));
  assert.deepEqual(excluded.responses[0].outputs, { text_output: 'tok0 tok1 tok2' });
});

test('a TensorRT-LLM-flavour stream: text_output alone, max_tokens from its INT32 input', async () => {
  const { mock, client } = await start({ reply_tokens: 4 });
  const mark = mock.proc.mark();
  const { responses, status } = await infer(client, trtllm_request('t1', { max_tokens: 2, empty_final: true }));
  assert.equal(status.code, grpc.status.OK);
  assert.deepEqual(responses.map((r) => r.outputs), [{ text_output: 'tok0' }, { text_output: ' tok1' }, {}]);
  assert.deepEqual(responses.map((r) => r.final), [false, false, true]);
  assert.deepEqual(responses[0].shapes.text_output, [1, 1]);
  const { line } = await mock.proc.wait_for_line(/^request id=t1 /, { from: mark });
  assert.equal(line.text, 'request id=t1 model=mock-model flavour=trtllm prompt_tokens=2');
});

test('a request the model cannot take is answered in error_message with status OK, as Triton does', async () => {
  const { client } = await start();
  const unknown = await infer(client, request_of('u1', [['text_input', 'BYTES', [1], bytes_element('x')]], { model: 'nope' }));
  assert.equal(unknown.status.code, grpc.status.OK);
  assert.match(unknown.responses[0].error_message, /unknown model: 'nope'/);
  const missing = await infer(client, request_of('u2', [['stream', 'BOOL', [1], bool_element(true)]]));
  assert.match(missing.responses[0].error_message, /text_input/);
});

test('--fail-status 14 answers every stream Trailers-Only with UNAVAILABLE', async () => {
  const { client } = await start({ fail_status: 14 });
  const { responses, status, error } = await infer(client, vllm_request('f1'));
  assert.equal(responses.length, 0);
  assert.equal(status.code, grpc.status.UNAVAILABLE);
  assert.equal(error.code, grpc.status.UNAVAILABLE);
  assert.match(status.details, /--fail-status/);
  assert.deepEqual(await unary(client, 'ServerReady', {}), { ready: true });  // readiness is not failed
});

test('--fail-after-tokens: an error_message response and status OK (message mode), or INTERNAL (status mode)', async () => {
  const message = await start({ fail_after_tokens: 2, fail_mode: 'message' });
  const a = await infer(message.client, vllm_request('m1'));
  assert.equal(a.status.code, grpc.status.OK);
  assert.deepEqual(a.responses.map((r) => r.outputs.text_output ?? r.error_message.slice(0, 11)), ['tok0', ' tok1', 'mock-triton']);
  const status = await start({ fail_after_tokens: 2, fail_mode: 'status' });
  const b = await infer(status.client, trtllm_request('s1'));
  assert.equal(b.status.code, grpc.status.INTERNAL);
  assert.equal(b.error.code, grpc.status.INTERNAL);
  assert.match(b.status.details, /fail-after-tokens/);
  assert.deepEqual(b.responses.map((r) => r.outputs.text_output), ['tok0', ' tok1']);
});

test('a client that cancels a stream mid-reply is logged as an abort', async () => {
  const { mock, client } = await start({ tokens_per_sec: 100, reply_tokens: 1000 });
  const mark = mock.proc.mark();
  const { status } = await infer(client, vllm_request('c1'), { on_response: (call) => call.cancel() });
  assert.equal(status.code, grpc.status.CANCELLED);
  const { line } = await mock.proc.wait_for_line(/^abort id=c1 /, { from: mark });
  assert.match(line.text, /^abort id=c1 tokens=\d+$/);
  assert.ok(Number(line.text.split('=').at(-1)) < 1000);
});

test('200 paced streams on one connection all complete, each with its own tokens', async () => {
  const { mock, client } = await start({ tokens_per_sec: 200, reply_tokens: 10, ttft_ms: 20 });
  const results = await Promise.all(Array.from({ length: 200 }, (_, i) => infer(client,
    i % 2 ? vllm_request(`p${i}`, { empty_final: true }) : trtllm_request(`p${i}`))));
  for (const [i, { responses, status }] of results.entries()) {
    assert.equal(status.code, grpc.status.OK, `stream ${i}`);
    assert.equal(responses.filter((r) => r.outputs.text_output !== undefined).map((r) => r.outputs.text_output).join(''),
      'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 tok8 tok9');
    assert.ok(responses.every((r) => r.id === `p${i}`));
  }
  assert.equal(mock.proc.lines.filter((l) => l.text.startsWith('abort')).length, 0);
});

test('a reply larger than the flow-control windows arrives whole', async () => {
  // 2000 tokens of ~1 KiB: about 2 MiB on one stream, past the 64 KiB
  // default stream window, so the server must wait for WINDOW_UPDATEs.
  const { client } = await start({ reply_tokens: 2000, extra_args: ['--token-pad', '1000'] });
  const { responses, status } = await infer(client, trtllm_request('big', { max_tokens: 5000 }));
  assert.equal(status.code, grpc.status.OK);
  assert.equal(responses.length, 2000);
  assert.equal(responses[1999].outputs.text_output, ` tok1999${'x'.repeat(1000)}`);
});
