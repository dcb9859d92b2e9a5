// A Triton-like KServe v2 gRPC backend built on @grpc/grpc-js and
// @grpc/proto-loader over lib/proto/grpc_service.proto: the HTTP/2 framing,
// gRPC message framing, protobuf coding, headers and trailers are those
// libraries', not ours, so sluice's hand-written gRPC client is checked
// against an implementation it shares nothing with.
//
// It serves ServerLive, ServerReady, ModelReady and ModelStreamInfer. A
// ModelStreamInfer request is decoded the way Triton decodes one (inputs
// paired by index with raw_input_contents; BYTES elements as 4-byte
// little-endian length + bytes) and answered the way Triton's vLLM backend or
// the TensorRT-LLM ensemble answers, as the request's inputs say, bent by a
// script (see start_triton_peer).
import { EventEmitter } from 'node:events';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import proto_loader from '@grpc/proto-loader';

import { bound_ms, with_timeout } from './harness.mjs';

export const proto_path = path.join(path.dirname(fileURLToPath(import.meta.url)), 'proto', 'grpc_service.proto');
export const proto_options = { keepCase: true, longs: Number, defaults: true, oneofs: true };
export const grpc_status = grpc.status;

// The `inference` package (GRPCInferenceService client constructor and
// message types), for peers and for test clients alike.
export function inference_package() {
  const definition = proto_loader.loadSync(proto_path, proto_options);
  return grpc.loadPackageDefinition(definition).inference;
}

// ---------------------------------------------------------------------------
// Tensor coding (Triton's raw layout)

const fixed_sizes = {
  BOOL: 1, UINT8: 1, INT8: 1, UINT16: 2, INT16: 2, UINT32: 4, INT32: 4,
  UINT64: 8, INT64: 8, FP16: 2, BF16: 2, FP32: 4, FP64: 8,
};

export function element_count(shape) {
  return shape.reduce((n, d) => n * Number(d), 1);
}

function read_fixed(datatype, buf, at) {
  switch (datatype) {
    case 'BOOL': return buf[at] !== 0;
    case 'UINT8': return buf.readUInt8(at);
    case 'INT8': return buf.readInt8(at);
    case 'UINT16': return buf.readUInt16LE(at);
    case 'INT16': return buf.readInt16LE(at);
    case 'UINT32': return buf.readUInt32LE(at);
    case 'INT32': return buf.readInt32LE(at);
    case 'UINT64': return Number(buf.readBigUInt64LE(at));
    case 'INT64': return Number(buf.readBigInt64LE(at));
    case 'FP32': return buf.readFloatLE(at);
    case 'FP64': return buf.readDoubleLE(at);
    default: return buf.subarray(at, at + fixed_sizes[datatype]);  // FP16/BF16 left raw
  }
}

// The elements of one raw tensor; throws (with Triton's kind of message) when
// the bytes do not match the shape.
export function decode_raw_tensor(name, datatype, shape, raw) {
  const count = element_count(shape);
  if (datatype === 'BYTES') {
    const out = [];
    let at = 0;
    while (at < raw.length) {
      if (at + 4 > raw.length) throw new Error(`input '${name}': truncated BYTES element length at offset ${at}`);
      const len = raw.readUInt32LE(at);
      at += 4;
      if (at + len > raw.length) throw new Error(`input '${name}': BYTES element of ${len} bytes runs past the end of the tensor`);
      out.push(raw.subarray(at, at + len));
      at += len;
    }
    if (out.length !== count) throw new Error(`input '${name}': expected ${count} string elements for shape [${shape.join(',')}], got ${out.length}`);
    return out;
  }
  const size = fixed_sizes[datatype];
  if (size === undefined) throw new Error(`input '${name}': unsupported datatype '${datatype}'`);
  if (raw.length !== count * size) {
    throw new Error(`unexpected total byte size ${raw.length} for input '${name}', expecting ${count * size}`);
  }
  const out = [];
  for (let i = 0; i < count; ++i) out.push(read_fixed(datatype, raw, i * size));
  return out;
}

// The elements of a tensor sent in InferTensorContents instead.
function decode_contents_tensor(name, datatype, shape, contents) {
  const field = {
    BOOL: 'bool_contents', UINT8: 'uint_contents', UINT16: 'uint_contents', UINT32: 'uint_contents', UINT64: 'uint64_contents',
    INT8: 'int_contents', INT16: 'int_contents', INT32: 'int_contents', INT64: 'int64_contents',
    FP32: 'fp32_contents', FP64: 'fp64_contents', BYTES: 'bytes_contents',
  }[datatype];
  if (!field) throw new Error(`input '${name}': unsupported datatype '${datatype}' in contents`);
  const values = contents?.[field] ?? [];
  const count = element_count(shape);
  if (values.length !== count) throw new Error(`input '${name}': expected ${count} elements in ${field}, got ${values.length}`);
  return values.map((v) => (datatype === 'BYTES' ? Buffer.from(v) : v));
}

export function encode_bytes_elements(strings) {
  return Buffer.concat(strings.flatMap((s) => {
    const b = Buffer.from(s);
    const len = Buffer.alloc(4);
    len.writeUInt32LE(b.length);
    return [len, b];
  }));
}

export function encode_fixed_elements(datatype, values) {
  const size = fixed_sizes[datatype];
  const buf = Buffer.alloc(size * values.length);
  values.forEach((v, i) => {
    const at = i * size;
    switch (datatype) {
      case 'BOOL': buf[at] = v ? 1 : 0; break;
      case 'UINT8': buf.writeUInt8(v, at); break;
      case 'INT8': buf.writeInt8(v, at); break;
      case 'UINT16': buf.writeUInt16LE(v, at); break;
      case 'INT16': buf.writeInt16LE(v, at); break;
      case 'UINT32': buf.writeUInt32LE(v, at); break;
      case 'INT32': buf.writeInt32LE(v, at); break;
      case 'UINT64': buf.writeBigUInt64LE(BigInt(v), at); break;
      case 'INT64': buf.writeBigInt64LE(BigInt(v), at); break;
      case 'FP32': buf.writeFloatLE(v, at); break;
      case 'FP64': buf.writeDoubleLE(v, at); break;
      default: throw new Error(`cannot encode ${datatype}`);
    }
  });
  return buf;
}

// An InferParameter map as a plain {name: value} object.
export function plain_parameters(map) {
  const out = {};
  for (const [k, p] of Object.entries(map ?? {})) out[k] = p.parameter_choice ? p[p.parameter_choice] : undefined;
  return out;
}

// A decoded ModelInferRequest: {id, model_name, model_version, parameters,
// inputs: {name: {datatype, shape, value, values}}, raw (whether
// raw_input_contents carried the data), flavour, decode_error}. BYTES
// elements become strings; `value` is the single element when there is one,
// else the array; the sampling_parameters input is parsed as JSON.
export function decode_infer_request(req) {
  const out = {
    id: req.id, model_name: req.model_name, model_version: req.model_version,
    parameters: plain_parameters(req.parameters), inputs: {},
    outputs: (req.outputs ?? []).map((o) => o.name),
    raw: req.raw_input_contents.length > 0, flavour: null, decode_error: null,
  };
  try {
    if (out.raw && req.raw_input_contents.length !== req.inputs.length) {
      throw new Error(`expected ${req.inputs.length} inputs in raw_input_contents, got ${req.raw_input_contents.length}`);
    }
    req.inputs.forEach((t, i) => {
      const shape = t.shape.map(Number);
      let values = out.raw
        ? decode_raw_tensor(t.name, t.datatype, shape, req.raw_input_contents[i])
        : decode_contents_tensor(t.name, t.datatype, shape, t.contents);
      if (t.datatype === 'BYTES') values = values.map((b) => b.toString('utf8'));
      let value = values.length === 1 ? values[0] : values;
      if (t.name === 'sampling_parameters' && typeof value === 'string') value = JSON.parse(value);
      out.inputs[t.name] = { datatype: t.datatype, shape, value, values };
    });
  } catch (err) {
    out.decode_error = err.message;
  }
  out.flavour = flavour_of(out.inputs);
  return out;
}

// vLLM backend: sampling_parameters, exclude_input_in_output, return_*;
// TensorRT-LLM ensemble: max_tokens (INT32) and none of those.
export function flavour_of(inputs) {
  const names = Object.keys(inputs);
  if (names.some((n) => n === 'sampling_parameters' || n === 'exclude_input_in_output' || n.startsWith('return_'))) return 'vllm';
  if ('max_tokens' in inputs) return 'trtllm';
  return 'vllm';
}

// ---------------------------------------------------------------------------
// The server

const text_tensor = (name, strings, shape) => ({ output: { name, datatype: 'BYTES', shape, parameters: {} }, raw: encode_bytes_elements(strings) });
const uint32_tensor = (name, value, shape) => ({ output: { name, datatype: 'UINT32', shape, parameters: {} }, raw: encode_fixed_elements('UINT32', [value]) });

// Starts the peer on 127.0.0.1:<free port>. `script` is an object of knobs,
// or a function of the decoded request returning one (set() replaces it):
//
//   model         the one model served and ready (default 'mock-model');
//                 a request for another gets an error_message response
//                 ("Request for unknown model ...") as Triton sends
//   ready         false: ServerReady and ModelReady answer false
//   tokens        the text pieces streamed (default Hello/ from/ Triton/.),
//                 cut to max_tokens (sampling_parameters.max_tokens or the
//                 max_tokens input) with finish reason 'length'
//   finish_reason default 'stop' ('length' when cut)
//   input_tokens  num_input_tokens (default: the prompt's word count)
//   output_tokens num_output_tokens in total (default: tokens sent)
//   delay_ms      between responses
//   extras        'every' (default, as the vLLM backend does: each requested
//                 return_* output on every response: finish_reason "None"
//                 until the last, num_output_tokens the tokens of that
//                 response, num_input_tokens a shape [] scalar) or 'last'
//                 (only the last response carries them, with totals)
//   final         with triton_enable_empty_final_response: 'with_last' (the
//                 last data response has triton_final_response true, as the
//                 vLLM backend sends it; default for vLLM) or 'empty' (an
//                 extra empty response carries it; default for TRT-LLM);
//                 every other response has it false
//   status        a grpc status code: the call fails with it before any
//                 message (a Trailers-Only answer); `details` its message
//   fail_after    after this many messages the call fails with fail_status
//                 (default UNAVAILABLE) and `details`
//   error_message_after  after this many token responses a response with
//                 error_message (`error_text`) ends the request; the call then
//                 ends OK
//   hang          never answer (for cancellation tests)
//   end_on        'half_close' (default, as Triton: the call ends OK once the
//                 client has half-closed and every request on it is answered)
//                 or 'responses' (end OK as soon as the requests so far are
//                 answered, half-closed or not)
//
// Resolves {url: 'grpc://127.0.0.1:PORT', port, requests, cancels, probes,
// calls, set(script), wait_for(list, count, timeout_ms), stop()} (stop():
// a forced shutdown, open calls reset as when a backend dies):
//   requests  decoded requests (decode_infer_request) plus metadata (the
//             call's request metadata as a plain object) and call (index
//             into calls)
//   cancels   {id, model_name, call} for each request in flight when its
//             call was cancelled by the client ({id: null} when none was)
//   probes    {method, name} for each ServerLive/ServerReady/ModelReady
//   calls     {method, metadata, status: {code, details} once ended}
export async function start_triton_peer(script = {}) {
  const inference = inference_package();
  const events = new EventEmitter();
  const requests = [];
  const cancels = [];
  const probes = [];
  const calls = [];
  const live_calls = new Set();
  let stopping = false;

  const knobs_object = () => (typeof script === 'function' ? {} : script ?? {});
  const model_of = () => knobs_object().model ?? 'mock-model';
  const record = (list, item) => { list.push(item); events.emit('recorded'); };

  const probe = (method, answer) => (call, callback) => {
    record(probes, { method, name: call.request?.name ?? null });
    callback(null, answer(call.request));
  };

  function model_stream_infer(call) {
    const call_index = calls.length;
    const call_record = { method: 'ModelStreamInfer', metadata: call.metadata.getMap(), status: null };
    record(calls, call_record);
    live_calls.add(call);
    const in_flight = new Map();   // request record -> {timers}
    let half_closed = false;
    let ended = false;
    let messages_sent = 0;

    const finish = (status) => {
      if (ended) return;
      ended = true;
      for (const st of in_flight.values()) st.timers.forEach(clearTimeout);
      in_flight.clear();
      call_record.status = status;
      live_calls.delete(call);
      if (status.code === grpc.status.OK) call.end();
      else call.emit('error', { code: status.code, details: status.details ?? '' });
      events.emit('recorded');
    };
    const maybe_end = (knobs) => {
      if (ended || in_flight.size > 0) return;
      if (half_closed || (knobs?.end_on === 'responses')) finish({ code: grpc.status.OK, details: 'OK' });
    };

    call.on('cancelled', () => {
      if (ended) return;
      ended = true;
      live_calls.delete(call);
      if (!stopping) {
        if (in_flight.size === 0) record(cancels, { id: null, model_name: null, call: call_index });
        for (const r of in_flight.keys()) record(cancels, { id: r.id, model_name: r.model_name, call: call_index });
      }
      for (const st of in_flight.values()) st.timers.forEach(clearTimeout);
      in_flight.clear();
      call_record.status = { code: grpc.status.CANCELLED, details: 'cancelled by the client' };
    });
    call.on('error', () => {});
    call.on('end', () => { half_closed = true; maybe_end(knobs_object()); });

    call.on('data', (raw_request) => {
      if (ended) return;
      const r = decode_infer_request(raw_request);
      r.metadata = call_record.metadata;
      r.call = call_index;
      record(requests, r);
      const knobs = (typeof script === 'function' ? script(r) : script) ?? {};
      const state = { timers: [] };
      in_flight.set(r, state);

      if (knobs.status !== undefined && knobs.status !== null) {
        return finish({ code: knobs.status, details: knobs.details ?? `scripted status ${knobs.status}` });
      }
      if (knobs.hang) return;

      const plan = answer_plan(r, knobs, knobs.model ?? model_of());
      let step = 0;
      const send_next = () => {
        if (ended) return;
        if (step >= plan.length) {
          in_flight.delete(r);
          return maybe_end(knobs);
        }
        if (knobs.fail_after !== undefined && messages_sent >= knobs.fail_after) {
          return finish({ code: knobs.fail_status ?? grpc.status.UNAVAILABLE, details: knobs.details ?? 'scripted failure' });
        }
        const message = plan[step++];
        call.write(message);
        ++messages_sent;
        if (knobs.delay_ms && step < plan.length) state.timers.push(setTimeout(send_next, knobs.delay_ms));
        else setImmediate(send_next);
      };
      send_next();
    });
  }

  const server = new grpc.Server();
  server.addService(inference.GRPCInferenceService.service, {
    ServerLive: probe('ServerLive', () => ({ live: true })),
    ServerReady: probe('ServerReady', () => ({ ready: knobs_object().ready !== false })),
    ModelReady: probe('ModelReady', (req) => ({ ready: knobs_object().ready !== false && req.name === model_of() })),
    ModelInfer: (call, callback) => callback({ code: grpc.status.UNIMPLEMENTED, details: 'this peer serves ModelStreamInfer only' }),
    ModelStreamInfer: model_stream_infer,
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
  });

  const lists = { requests, cancels, probes, calls };
  return {
    url: `grpc://127.0.0.1:${port}`,
    port,
    requests,
    cancels,
    probes,
    calls,
    set(next) { script = next; },
    // Resolves once lists[name] has `count` entries (rejects after the bound).
    wait_for(name, count = 1, timeout_ms = bound_ms(5000)) {
      const list = lists[name];
      if (list.length >= count) return Promise.resolve(list);
      let on;
      const reached = new Promise((resolve) => {
        on = () => { if (list.length >= count) resolve(list); };
        events.on('recorded', on);
      });
      return with_timeout(reached, timeout_ms, `${count} ${name} at the triton peer (have ${list.length})`)
        .finally(() => events.off('recorded', on));
    },
    // Abrupt, as a backend that dies: open calls are reset, not ended.
    async stop() {
      stopping = true;
      live_calls.clear();
      server.forceShutdown();
    },
  };
}

// The ModelStreamInferResponse messages one request gets, in order.
function answer_plan(r, knobs, model) {
  const base = { model_name: r.model_name, model_version: r.model_version || '1', id: r.id };
  const error_response = (message) => ({ error_message: message, infer_response: { ...base, parameters: {}, outputs: [], raw_output_contents: [] } });
  if (r.decode_error) return [error_response(r.decode_error)];
  if (r.model_name !== model) return [error_response(`Request for unknown model: '${r.model_name}' is not found`)];
  const text = r.inputs.text_input;
  if (!text) return [error_response("input 'text_input' is missing")];

  const flavour = r.flavour;
  const bool_input = (name) => (r.inputs[name] ? Boolean(r.inputs[name].values[0]) : undefined);
  const stream = bool_input('stream') ?? false;
  const prompt = String(Array.isArray(text.value) ? text.value[0] : text.value);

  let prepend = false;
  if (flavour === 'vllm') {
    const exclude = bool_input('exclude_input_in_output');
    prepend = exclude === undefined ? !stream : !exclude;
    if (prepend && stream) return [error_response('Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed.')];
  }

  let tokens = [...(knobs.tokens ?? ['Hello', ' from', ' Triton', '.'])];
  let finish_reason = knobs.finish_reason ?? 'stop';
  const max_tokens = flavour === 'vllm'
    ? (r.inputs.sampling_parameters?.value?.max_tokens ?? r.parameters.max_tokens ?? 16)
    : r.inputs.max_tokens?.values[0];
  if (max_tokens !== undefined && tokens.length > max_tokens) {
    tokens = tokens.slice(0, max_tokens);
    if (knobs.finish_reason === undefined) finish_reason = 'length';
  }
  const input_tokens = knobs.input_tokens ?? (prompt.match(/\S+/g) ?? []).length;
  const output_total = knobs.output_tokens ?? tokens.length;

  // The text of each data response: one per token streamed, else one.
  const pieces = stream ? tokens : [tokens.join('')];
  if (prepend) pieces[0] = prompt + pieces[0];
  // Output token counts per response (sum = output_total).
  const counts = stream
    ? pieces.map((_, i) => (i === pieces.length - 1 ? output_total - Math.min(output_total, pieces.length - 1) : (i < output_total ? 1 : 0)))
    : [output_total];

  const want = flavour === 'vllm'
    ? { finish_reason: bool_input('return_finish_reason'), num_input_tokens: bool_input('return_num_input_tokens'), num_output_tokens: bool_input('return_num_output_tokens') }
    : {};
  const extras = knobs.extras ?? 'every';
  const text_shape = text.shape.length >= 2 ? [1, 1] : [1];
  const empty_final = r.parameters.triton_enable_empty_final_response === true;
  const final_mode = knobs.final ?? (flavour === 'vllm' ? 'with_last' : 'empty');

  const data = pieces.map((piece, i) => {
    const last = i === pieces.length - 1;
    const tensors = [text_tensor('text_output', [piece], text_shape)];
    if (extras === 'every' || last) {
      if (want.finish_reason) tensors.push(text_tensor('finish_reason', [last ? finish_reason : 'None'], [1]));
      if (want.num_input_tokens) tensors.push(uint32_tensor('num_input_tokens', input_tokens, extras === 'every' ? [] : [1]));
      if (want.num_output_tokens) tensors.push(uint32_tensor('num_output_tokens', extras === 'every' ? counts[i] : output_total, [1]));
    }
    const parameters = {};
    if (empty_final) parameters.triton_final_response = { bool_param: last && final_mode === 'with_last' };
    return {
      error_message: '',
      infer_response: { ...base, parameters, outputs: tensors.map((t) => t.output), raw_output_contents: tensors.map((t) => t.raw) },
    };
  });

  if (knobs.error_message_after !== undefined) {
    const kept = data.slice(0, knobs.error_message_after);
    kept.push(error_response(knobs.error_text ?? 'Error generating stream: scripted engine failure'));
    return kept;
  }
  if (empty_final && final_mode === 'empty') {
    data.push({ error_message: '', infer_response: { ...base, parameters: { triton_final_response: { bool_param: true } }, outputs: [], raw_output_contents: [] } });
  }
  return data;
}
