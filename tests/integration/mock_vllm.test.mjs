// Smoke test of mock-vllm on its own: the vLLM wire format it speaks (byte
// for byte, with a fixed `created` and X-Request-Id), its deterministic token
// counts, aborts, deliberate failures and the test hooks the other
// integration tests rely on. Self-contained: it starts its own processes.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Anthropic from '@anthropic-ai/sdk';

const repo_root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const build_dir = path.resolve(process.env.SLUICE_BUILD_DIR ?? path.join(repo_root, 'build'));
const binary = [path.join(build_dir, 'mock-vllm'), path.join(build_dir, 'tools/mock-vllm/mock-vllm')]
  .find((p) => fs.existsSync(p)) ?? path.join(build_dir, 'mock-vllm');

const CREATED = 1700000000;
const started = [];

// Starts mock-vllm on an ephemeral port; resolves once it printed its line.
function start_mock(args = []) {
  const child = spawn(binary, ['--port', '0', '--created', String(CREATED), ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  started.push(child);
  const mock = { child, lines: [], waiters: [] };
  let partial = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (text) => {
    partial += text;
    let nl;
    while ((nl = partial.indexOf('\n')) >= 0) {
      mock.lines.push(partial.slice(0, nl));
      partial = partial.slice(nl + 1);
    }
    for (const w of [...mock.waiters]) w();
  });
  mock.wait_line = (re, timeout_ms = 5000) => new Promise((resolve, reject) => {
    const check = () => {
      const line = mock.lines.find((l) => re.test(l));
      if (line === undefined) return false;
      clearTimeout(timer);
      mock.waiters = mock.waiters.filter((w) => w !== check);
      resolve(line);
      return true;
    };
    const timer = setTimeout(() => reject(new Error(`no line ${re} in ${JSON.stringify(mock.lines)}`)), timeout_ms);
    if (!check()) mock.waiters.push(check);
  });
  return mock.wait_line(/^mock-vllm listening on /).then((line) => {
    assert.match(line, /^mock-vllm listening on http:\/\/127\.0\.0\.1:\d+$/);
    mock.port = Number(line.split(':').at(-1));
    mock.url = `http://127.0.0.1:${mock.port}`;
    return mock;
  });
}

after(() => { for (const c of started) c.kill('SIGKILL'); });

// A raw HTTP/1.1 exchange: returns everything the server sent until it
// closed, or until `until(bytes)` holds.
function exchange(port, request, { until, close_after_ms } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    const timer = setTimeout(() => { socket.destroy(); reject(new Error(`timeout; got ${data}`)); }, 5000);
    socket.on('data', (d) => {
      data = Buffer.concat([data, d]);
      if (until && until(data.toString('latin1'))) { clearTimeout(timer); socket.destroy(); resolve(data.toString('latin1')); }
    });
    socket.on('close', () => { clearTimeout(timer); resolve(data.toString('latin1')); });
    socket.on('error', () => {});
    socket.write(request);
    if (close_after_ms !== undefined) setTimeout(() => socket.destroy(), close_after_ms);
  });
}

function post(target, body, headers = {}) {
  const text = JSON.stringify(body);
  const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  return `POST ${target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${extra}Content-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`;
}

// Splits a chunked body into its chunks; checks the framing on the way.
function dechunk(body) {
  const chunks = [];
  let at = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', at);
    assert.ok(eol > at, `chunk size line at ${at}`);
    const size = parseInt(body.slice(at, eol), 16);
    const start = eol + 2;
    if (size === 0) { assert.equal(body.slice(start), '\r\n'); return chunks; }
    chunks.push(body.slice(start, start + size));
    assert.equal(body.slice(start + size, start + size + 2), '\r\n');
    at = start + size + 2;
  }
}

const chunk_head = (id, object) => `{"id":"${id}","object":"${object}","created":${CREATED},"model":"mock-model","choices":[`;
const ended = (s) => s.endsWith('\r\n0\r\n\r\n');

test('a chat stream is vLLM\'s: head, role chunk, tokens, finish, usage chunk, [DONE], terminal chunk', async () => {
  const mock = await start_mock(['--reply-tokens', '3']);
  const raw = await exchange(mock.port, post('/v1/chat/completions', {
    model: 'anything', stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello  there\nworld' }],
  }, { 'X-Request-Id': 'req-1' }), { until: ended });
  const [head, body] = [raw.slice(0, raw.indexOf('\r\n\r\n')), raw.slice(raw.indexOf('\r\n\r\n') + 4)];
  assert.match(head, /^HTTP\/1\.1 200 OK\r\ndate: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT\r\nserver: uvicorn\r\ncontent-type: text\/event-stream; charset=utf-8\r\ntransfer-encoding: chunked$/);
  const h = chunk_head('chatcmpl-req-1', 'chat.completion.chunk');
  assert.deepEqual(dechunk(body), [
    `data: ${h}{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`,
    `data: ${h}{"index":0,"delta":{"content":"tok0"},"logprobs":null,"finish_reason":null}]}\n\n`,
    `data: ${h}{"index":0,"delta":{"content":" tok1"},"logprobs":null,"finish_reason":null}]}\n\n`,
    `data: ${h}{"index":0,"delta":{"content":" tok2"},"logprobs":null,"finish_reason":null}]}\n\n`,
    `data: ${h}{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}\n\n`,
    // 2 messages × 4 + 2 + 3 words
    `data: ${h}],"usage":{"prompt_tokens":13,"total_tokens":16,"completion_tokens":3}}\n\n`,
    'data: [DONE]\n\n',
  ]);
});

test('without include_usage there is no usage chunk, and max_tokens cuts the reply with "length" on the last token', async () => {
  const mock = await start_mock();
  const raw = await exchange(mock.port, post('/v1/chat/completions', {
    stream: true, max_completion_tokens: 2, messages: [{ role: 'user', content: [{ type: 'text', text: 'a b' }] }],
  }, { 'X-Request-Id': 'r2' }), { until: ended });
  const events = dechunk(raw.slice(raw.indexOf('\r\n\r\n') + 4));
  const h = chunk_head('chatcmpl-r2', 'chat.completion.chunk');
  assert.equal(events.length, 4);
  assert.equal(events[2], `data: ${h}{"index":0,"delta":{"content":" tok1"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n`);
  assert.equal(events[3], 'data: [DONE]\n\n');
});

test('a non-stream chat answer is byte-identical for the same X-Request-Id and carries usage', async () => {
  const mock = await start_mock(['--reply-tokens', '4']);
  const request = { messages: [{ role: 'user', content: 'one two three' }], max_tokens: 100 };
  const fetch_body = () => fetch(`${mock.url}/v1/chat/completions`, {
    method: 'POST', body: JSON.stringify(request), headers: { 'content-type': 'application/json', 'x-request-id': 'same' },
  }).then(async (r) => {
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('content-type'), 'application/json');
    assert.equal(r.headers.get('server'), 'uvicorn');
    return r.text();
  });
  const [a, b] = [await fetch_body(), await fetch_body()];
  assert.equal(a, b);
  assert.equal(a, `{"id":"chatcmpl-same","object":"chat.completion","created":${CREATED},"model":"mock-model","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 tok3","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":7,"total_tokens":11,"completion_tokens":4,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`);
});

test('completions, embeddings, models, health and metrics answer in vLLM\'s shapes', async () => {
  const mock = await start_mock();
  const cmpl = await (await fetch(`${mock.url}/v1/completions`, {
    method: 'POST', body: JSON.stringify({ prompt: 'x y', max_tokens: 1 }), headers: { 'x-request-id': 'c1' },
  })).text();
  assert.equal(cmpl, `{"id":"cmpl-c1","object":"text_completion","created":${CREATED},"model":"mock-model","choices":[{"index":0,"text":"tok0","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1,"prompt_tokens_details":null},"kv_transfer_params":null}`);

  const emb = await (await fetch(`${mock.url}/v1/embeddings`, { method: 'POST', body: JSON.stringify({ input: ['a b', 'c'] }) })).json();
  assert.equal(emb.object, 'list');
  assert.match(emb.id, /^embd-[0-9a-f]{32}$/);
  assert.deepEqual(emb.data.map((d) => [d.index, d.object, d.embedding.length]), [[0, 'embedding', 8], [1, 'embedding', 8]]);
  assert.deepEqual(emb.usage, { prompt_tokens: 3, total_tokens: 3, completion_tokens: 0, prompt_tokens_details: null });

  const models = await (await fetch(`${mock.url}/v1/models`)).json();
  assert.equal(models.data[0].id, 'mock-model');
  assert.equal(models.data[0].owned_by, 'vllm');

  const health = await fetch(`${mock.url}/health`);
  assert.equal(health.status, 200);
  assert.equal(await health.text(), '');

  const metrics = await (await fetch(`${mock.url}/metrics`)).text();
  for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc']) {
    assert.match(metrics, new RegExp(`^${name}\\{model_name="mock-model"\\} 0\\.0$`, 'm'));
  }
  assert.match(metrics, /^mock_requests_total 5\.0$/m);
});

test('bad input gets vLLM\'s and FastAPI\'s errors', async () => {
  const mock = await start_mock();
  const bad = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', body: '{"messages": [' });
  assert.equal(bad.status, 400);
  const err = await bad.json();
  assert.deepEqual([err.object, err.type, err.param, err.code], ['error', 'BadRequestError', null, 400]);
  const zero = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', body: '{"messages":[],"max_tokens":0}' });
  assert.equal(zero.status, 400);
  await zero.arrayBuffer();
  const missing = await fetch(`${mock.url}/v1/nothing`);
  assert.equal(missing.status, 404);
  assert.equal(await missing.text(), '{"detail":"Not Found"}');
  const garbage = await exchange(mock.port, 'NOT HTTP\r\n\r\n');
  assert.match(garbage, /^HTTP\/1\.1 400 Bad Request\r\n/);
});

test('--api-key guards /v1 like vLLM and leaves /health open', async () => {
  const mock = await start_mock(['--api-key', 'sk-test']);
  const denied = await fetch(`${mock.url}/v1/models`, { headers: { authorization: 'Bearer wrong' } });
  assert.equal(denied.status, 401);
  assert.equal(await denied.text(), '{"error":"Unauthorized"}');
  const ok = await fetch(`${mock.url}/v1/models`, { headers: { authorization: 'Bearer sk-test' } });
  assert.equal(ok.status, 200);
  await ok.arrayBuffer();
  assert.equal((await fetch(`${mock.url}/health`)).status, 200);
});

test('pipelined requests are answered in order on one connection', async () => {
  const mock = await start_mock(['--reply-tokens', '1']);
  const raw = await exchange(mock.port,
    'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' +
    post('/v1/completions', { prompt: 'p', stream: true }, { 'X-Request-Id': 'p1' }) +
    'GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  const statuses = [...raw.matchAll(/HTTP\/1\.1 (\d+)/g)].map((m) => m[1]);
  assert.deepEqual(statuses, ['200', '200', '404']);
  assert.ok(raw.indexOf('cmpl-p1') < raw.indexOf('{"detail":"Not Found"}'));
  assert.match(raw, /connection: close\r\n\r\n\{"detail":"Not Found"\}$/);
});

test('the request record shows what arrived, and DELETE clears it', async () => {
  const mock = await start_mock();
  await (await fetch(`${mock.url}/v1/completions`, { method: 'POST', body: '{"prompt":"r"}', headers: { 'x-custom': 'yes' } })).arrayBuffer();
  const log = await (await fetch(`${mock.url}/debug/requests`)).json();
  assert.equal(log.length, 1);
  assert.equal(log[0].method, 'POST');
  assert.equal(log[0].target, '/v1/completions');
  assert.equal(log[0].body, '{"prompt":"r"}');
  assert.ok(log[0].headers.some(([k, v]) => k.toLowerCase() === 'x-custom' && v === 'yes'));
  assert.equal((await fetch(`${mock.url}/debug/requests`, { method: 'DELETE' })).status, 200);
  assert.deepEqual(await (await fetch(`${mock.url}/debug/requests`)).json(), []);
  assert.match(await (await fetch(`${mock.url}/metrics`)).text(), /^mock_requests_total 1\.0$/m);
});

test('a client that leaves mid-stream is logged as an abort with the tokens sent', async () => {
  // 1000 tokens at 200/s: the client leaves after the first data chunk,
  // long before the reply could be complete.
  const mock = await start_mock(['--tokens-per-sec', '200', '--reply-tokens', '1000']);
  await exchange(mock.port, post('/v1/chat/completions', { stream: true, messages: [] }, { 'X-Request-Id': 'gone' }),
    { until: (s) => s.includes('tok0') });
  const line = await mock.wait_line(/^abort request_id=chatcmpl-gone /);
  assert.match(line, /^abort request_id=chatcmpl-gone tokens=\d+$/);
  assert.ok(Number(line.split('=').at(-1)) < 1000);
  assert.match(await (await fetch(`${mock.url}/metrics`)).text(), /^mock_aborts_total 1\.0$/m);
});

test('a client that leaves during the time to first token is logged with zero tokens', async () => {
  const mock = await start_mock(['--ttft-ms', '60000']);
  const raw = await exchange(mock.port, post('/v1/chat/completions', { stream: true, messages: [] }, { 'X-Request-Id': 'early' }),
    { until: (s) => s.includes('\r\n\r\n') });
  assert.match(raw, /^HTTP\/1\.1 200 OK/);  // the head goes out before prefill, as vLLM's
  assert.equal(await mock.wait_line(/^abort /), 'abort request_id=chatcmpl-early tokens=0');
});

test('--fail-after-tokens drops the connection with no terminal chunk', async () => {
  const mock = await start_mock(['--fail-after-tokens', '2']);
  const raw = await exchange(mock.port, post('/v1/chat/completions', { stream: true, messages: [] }));
  assert.ok(raw.includes('" tok1"'));
  assert.ok(!raw.includes('tok2'));
  assert.ok(!raw.includes('[DONE]'));
  assert.ok(!ended(raw));
  assert.equal(mock.lines.filter((l) => l.startsWith('abort')).length, 0);
});

test('x-mock-fail-after-tokens fails that request alone', async () => {
  const mock = await start_mock();
  const raw = await exchange(mock.port, post('/v1/chat/completions', { stream: true, messages: [] }, { 'x-mock-fail-after-tokens': '3' }));
  assert.ok(raw.includes('" tok2"'));
  assert.ok(!raw.includes('tok3'));
  assert.ok(!ended(raw));
  const next = await exchange(mock.port, post('/v1/chat/completions', { stream: true, messages: [] }), { until: ended });
  assert.ok(next.includes('" tok15"'));
  assert.ok(next.includes('data: [DONE]\n\n'));
});

test('--token-pad pads every token; a long unpaced reply is made as fast as it is read', async () => {
  const mock = await start_mock(['--token-pad', '5', '--reply-tokens', '3']);
  const raw = await exchange(mock.port, post('/v1/chat/completions', { messages: [] }), { until: (t) => t.endsWith('}') });
  assert.match(raw, /"content":"tok0xxxxx tok1xxxxx tok2xxxxx"/);
  assert.match(raw, /"completion_tokens":3/);

  // ~200 MB of events to a client that reads nothing for a while: the mock
  // keeps about 1 MiB queued instead of the whole reply, and is still
  // generating (running = 1) until the client reads on.
  const big = await start_mock(['--token-pad', '2000', '--reply-tokens', '100000']);
  const socket = net.connect(big.port, '127.0.0.1');
  await new Promise((resolve) => socket.once('connect', resolve));
  socket.pause();
  socket.write(post('/v1/chat/completions', { stream: true, messages: [] }));
  // Generating (running = 1), then stalled by the full socket: its RSS
  // holds still over three reads. Without backpressure it would grow by
  // ~200 MB instead, and the bound below fails.
  const running = async () => /^vllm:num_requests_running\{[^}]*\} 1\.0$/m.test(await (await fetch(`${big.url}/metrics`)).text());
  const rss = () => Number(fs.readFileSync(`/proc/${big.child.pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+)/m)[1]);
  const deadline = performance.now() + 10000;
  while (!(await running())) {
    assert.ok(performance.now() < deadline, 'the stream never started');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  let rss_kb = rss();
  for (let still = 0; still < 3 && performance.now() < deadline;) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const now = rss();
    still = now === rss_kb ? still + 1 : 0;
    rss_kb = now;
  }
  assert.ok(rss_kb < 64 * 1024, `mock-vllm RSS ${rss_kb} kB with a paused reader`);
  assert.ok(await running(), 'still generating, paced by the reader');
  let bytes = 0;
  let tail = '';
  await new Promise((resolve) => {
    socket.on('data', (d) => {
      bytes += d.length;
      tail = (tail + d.toString('latin1')).slice(-32);
      if (tail.endsWith('0\r\n\r\n')) resolve();
    });
    socket.resume();
  });
  socket.destroy();
  assert.ok(bytes > 200e6, `${bytes} bytes`);
  assert.ok(tail.includes('data: [DONE]'));
});

test('500 concurrent streams on two loops all complete', async () => {
  const mock = await start_mock(['--threads', '2', '--tokens-per-sec', '100', '--reply-tokens', '5']);
  const results = await Promise.all(Array.from({ length: 500 }, (_, i) =>
    exchange(mock.port, post('/v1/chat/completions', { stream: true, messages: [] }, { 'X-Request-Id': `c${i}` }), { until: ended })));
  results.forEach((raw, i) => {
    assert.ok(raw.includes(`chatcmpl-c${i}"`));
    assert.ok(raw.includes('" tok4"'));
    assert.ok(raw.includes('data: [DONE]\n\n'));
  });
});

test('SIGTERM ends it with exit code 0', async () => {
  const mock = await start_mock();
  const exited = new Promise((resolve) => mock.child.on('exit', (code, signal) => resolve({ code, signal })));
  mock.child.kill('SIGTERM');
  assert.deepEqual(await exited, { code: 0, signal: null });
});

// ---------------------------------------------------------------------------
// Anthropic's Messages API on /v1/messages, read by the official SDK.

const anthropic_client = (mock, apiKey = 'ak') => new Anthropic({ apiKey, baseURL: mock.url, maxRetries: 0 });
const conversation = {
  model: 'claude-any', max_tokens: 100, system: 'be brief',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'hello there world' }] }],
};
const weather_tools = [{ name: 'get_weather', description: 'weather of a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];

// What the OpenAI chat path answers for the same conversation.
async function chat_twin(mock, max_tokens) {
  const res = await fetch(`${mock.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer ak' },
    body: JSON.stringify({ max_tokens, messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there world' }] }),
  });
  return res.json();
}

test('the Anthropic SDK reads a non-stream message: the chat reply\'s text and counts, id from X-Request-Id', async () => {
  const mock = await start_mock(['--reply-tokens', '4', '--api-key', 'ak']);
  const client = anthropic_client(mock);
  const message = await client.messages.create(conversation, { headers: { 'X-Request-Id': 'm1' } });
  const twin = await chat_twin(mock, 100);
  assert.equal(message.id, 'msg_m1');
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.equal(message.model, 'mock-model');
  assert.deepEqual(message.content, [{ type: 'text', text: twin.choices[0].message.content }]);
  assert.equal(message.stop_reason, 'end_turn');
  assert.equal(message.stop_sequence, null);
  assert.deepEqual(message.usage, { input_tokens: twin.usage.prompt_tokens, output_tokens: twin.usage.completion_tokens });
  assert.deepEqual(message.usage, { input_tokens: 4 + 2 + 4 + 3, output_tokens: 4 });
  const cut = await client.messages.create({ ...conversation, max_tokens: 2 });
  assert.equal(cut.content[0].text, 'tok0 tok1');
  assert.equal(cut.stop_reason, 'max_tokens');
  assert.equal(cut.usage.output_tokens, 2);
});

test('the Anthropic SDK reads a stream: text deltas, final message and usage', async () => {
  const mock = await start_mock(['--reply-tokens', '5']);
  const client = anthropic_client(mock);
  const stream = client.messages.stream({ ...conversation, max_tokens: 3 }, { headers: { 'X-Request-Id': 's1' } });
  const deltas = [];
  const types = [];
  stream.on('text', (delta) => deltas.push(delta));
  stream.on('streamEvent', (event) => types.push(event.type));
  const message = await stream.finalMessage();
  assert.deepEqual(deltas, ['tok0', ' tok1', ' tok2']);
  assert.deepEqual(types, ['message_start', 'content_block_start', 'content_block_delta', 'content_block_delta',
    'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(message.id, 'msg_s1');
  assert.deepEqual(message.content, [{ type: 'text', text: 'tok0 tok1 tok2' }]);
  assert.equal(message.stop_reason, 'max_tokens');
  assert.deepEqual(message.usage, { input_tokens: 13, output_tokens: 3 });
});

test('a stream\'s raw events are Anthropic\'s, ping included, and end with the terminal chunk', async () => {
  const mock = await start_mock(['--reply-tokens', '1']);
  const raw = await exchange(mock.port, post('/v1/messages', { ...conversation, stream: true },
    { 'anthropic-version': '2023-06-01', 'X-Request-Id': 'r' }), { until: ended });
  const head = raw.slice(0, raw.indexOf('\r\n\r\n'));
  assert.match(head, /content-type: text\/event-stream; charset=utf-8\r\ntransfer-encoding: chunked$/);
  assert.deepEqual(dechunk(raw.slice(raw.indexOf('\r\n\r\n') + 4)).map((e) => e.split('\n')[0]), [
    'event: message_start', 'event: content_block_start', 'event: ping', 'event: content_block_delta',
    'event: content_block_stop', 'event: message_delta', 'event: message_stop']);
});

test('the Anthropic SDK reads a tool_use answer, whole and streamed', async () => {
  const mock = await start_mock();
  const client = anthropic_client(mock);
  const request = { ...conversation, tools: weather_tools, messages: [{ role: 'user', content: 'What is the weather in Paris?' }] };
  const message = await client.messages.create(request, { headers: { 'X-Request-Id': 't1' } });
  assert.deepEqual(message.content, [{ type: 'tool_use', id: 'toolu_t1', name: 'get_weather', input: { city: 'Paris' } }]);
  assert.equal(message.stop_reason, 'tool_use');
  const stream = client.messages.stream(request, { headers: { 'X-Request-Id': 't2' } });
  const pieces = [];
  stream.on('inputJson', (partial) => pieces.push(partial));
  const streamed = await stream.finalMessage();
  assert.equal(pieces.length, 3);
  assert.equal(pieces.join(''), '{"city":"Paris"}');
  assert.deepEqual(streamed.content, [{ type: 'tool_use', id: 'toolu_t2', name: 'get_weather', input: { city: 'Paris' } }]);
  assert.equal(streamed.stop_reason, 'tool_use');
  assert.equal(streamed.usage.output_tokens, 3);
  // Without tools the same words get text.
  const plain = await client.messages.create({ ...request, tools: undefined });
  assert.equal(plain.content[0].type, 'text');
});

test('--fail-after-tokens on a messages stream sends an error event the SDK raises', async () => {
  const mock = await start_mock(['--fail-after-tokens', '2']);
  const client = anthropic_client(mock);
  const stream = client.messages.stream(conversation);
  const deltas = [];
  stream.on('text', (delta) => deltas.push(delta));
  await assert.rejects(stream.finalMessage(), (err) => {
    assert.ok(err instanceof Anthropic.APIError, `${err}`);
    assert.equal(err.error?.error?.type ?? err.error?.type, 'overloaded_error');
    return true;
  });
  assert.deepEqual(deltas, ['tok0', ' tok1']);
});

test('Anthropic\'s errors: key, version header, max_tokens, --fail-status', async () => {
  const mock = await start_mock(['--api-key', 'ak']);
  await assert.rejects(anthropic_client(mock, 'wrong').messages.create(conversation), Anthropic.AuthenticationError);
  const bare = (body, headers) => fetch(`${mock.url}/v1/messages`, { method: 'POST', body: JSON.stringify(body), headers: { 'x-api-key': 'ak', ...headers } })
    .then(async (r) => [r.status, await r.json()]);
  const [status, body] = await bare(conversation, {});
  assert.equal(status, 400);
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /anthropic-version/);
  await assert.rejects(anthropic_client(mock).messages.create({ ...conversation, max_tokens: undefined }), Anthropic.BadRequestError);
  for (const [code, type, cls] of [[529, 'overloaded_error', Anthropic.InternalServerError], [503, 'overloaded_error', Anthropic.InternalServerError],
    [429, 'rate_limit_error', Anthropic.RateLimitError], [500, 'api_error', Anthropic.InternalServerError]]) {
    const failing = await start_mock(['--fail-status', String(code)]);
    await assert.rejects(anthropic_client(failing).messages.create(conversation), (err) => {
      assert.ok(err instanceof cls, `${code}: ${err}`);
      assert.equal(err.status, code);
      assert.deepEqual(err.error.error.type, type);
      return true;
    });
    failing.child.kill('SIGTERM');
  }
});

test('a client that leaves a messages stream is logged as an abort', async () => {
  const mock = await start_mock(['--tokens-per-sec', '200', '--reply-tokens', '1000']);
  await exchange(mock.port, post('/v1/messages', { ...conversation, stream: true, max_tokens: 1000 },
    { 'anthropic-version': '2023-06-01', 'X-Request-Id': 'left' }), { until: (s) => s.includes('tok0') });
  const line = await mock.wait_line(/^abort request_id=msg_left /);
  assert.match(line, /^abort request_id=msg_left tokens=\d+$/);
  assert.ok(Number(line.split('=').at(-1)) < 1000);
});

test('--max-running 2: two requests generate at once, the rest wait first come first served (vLLM\'s scheduler)', async () => {
  // 10 tokens at 20/s: 0.5 s each, long past the 0.1 s the requests take to arrive.
  const mock = await start_mock(['--max-running', '2', '--tokens-per-sec', '20', '--reply-tokens', '10']);
  const order = [];
  const replies = [];
  for (let i = 0; i < 5; ++i) {
    replies.push(fetch(`${mock.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': `cap-${i}` },
      body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x' }] }),
    }).then(async (r) => { const j = await r.json(); order.push(j.id); return j; }));
    // Arrival order is the order sent: each request reaches the loop before the next is sent.
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const gauges = async () => {
    const text = await (await fetch(`${mock.url}/metrics`)).text();
    const value = (name) => Number(new RegExp(`^vllm:${name}\\{[^}]*\\} ([0-9.]+)$`, 'm').exec(text)[1]);
    return [value('num_requests_running'), value('num_requests_waiting')];
  };
  const [running, waiting] = await gauges();
  assert.equal(running, 2, 'two generate');
  assert.equal(waiting, 3, 'three wait for a slot');
  const all = await Promise.all(replies);
  for (const r of all) assert.equal(r.usage.completion_tokens, 10);
  // Released in arrival order, two at a time.
  assert.deepEqual(order.slice(2).sort(), ['chatcmpl-cap-2', 'chatcmpl-cap-3', 'chatcmpl-cap-4']);
  assert.equal(order.at(-1), 'chatcmpl-cap-4');
  assert.deepEqual(await gauges(), [0, 0]);
});
