// previous_response_id on a group whose backends speak Responses natively
// (vLLM's own /v1/responses): the backends hold the conversations, each its
// own, so a continuation must reach the backend that made the response it
// continues. The backends here are scripted ones that keep their responses
// and answer 404 for an id they did not make (as vLLM does), writing their
// events in a shape mock-vllm does not (spaces after every colon, CRLF
// lines, several events per chunk, the id after other members). Two of them
// behind prefix hashing: a continuation with a new input would land on
// either one by its prompt alone.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll } from './lib/gateway.mjs';
import { bound_ms, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { start_redis } from './lib/redis.mjs';
import { chunk, start_scripted_backend } from './lib/scripted_backend.mjs';

const other_key = 'sk-sticky-other-0001';

// JSON with a space after every colon and comma (no string here holds a newline).
const spaced = (o) => JSON.stringify(o, null, 1).replace(/\n\s*/g, ' ');

// A native Responses backend named `name`: its response ids are
// resp_<name>_<n>; a request continuing an id it did not make gets 404;
// its answer's text says who answered and the conversation's turn.
function responses_backend(name) {
  const made = new Map();  // id -> turn
  let n = 0;
  return start_scripted_backend(async (socket, request) => {
    const body = request.body ?? {};
    const prev = body.previous_response_id;
    if (prev !== undefined && !made.has(prev)) {
      const err = JSON.stringify({ error: { message: `Response with id '${prev}' not found.`, type: 'invalid_request_error',
        param: 'previous_response_id', code: 'previous_response_not_found' } });
      socket.write(`HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(err)}\r\n\r\n${err}`);
      return;
    }
    const turn = prev === undefined ? 1 : made.get(prev) + 1;
    const id = `resp_${name}_${++n}`;
    made.set(id, turn);
    const text = `${name} turn ${turn}`;
    const message = { type: 'message', id: `msg_${name}_${n}`, role: 'assistant', status: 'completed',
      content: [{ type: 'output_text', text, annotations: [] }] };
    const response = (status, output, usage) => ({ object: 'response', created_at: 1700000000, id, model: body.model,
      status, output, previous_response_id: prev ?? null, usage });
    const usage = { input_tokens: 5, output_tokens: 3, total_tokens: 8 };
    if (!body.stream) {
      const reply = spaced(response('completed', [message], usage));
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(reply)}\r\n\r\n${reply}`);
      return;
    }
    let seq = 0;
    const ev = (type, extra) => `event: ${type}\r\ndata: ${spaced({ type, sequence_number: seq++, ...extra })}\r\n\r\n`;
    const head = ev('response.created', { response: response('in_progress', [], null) }) +
      ev('response.in_progress', { response: response('in_progress', [], null) });
    const deltas = text.split(' ').map((w, i) => ev('response.output_text.delta',
      { item_id: message.id, output_index: 0, content_index: 0, delta: i ? ` ${w}` : w })).join('');
    const tail = ev('response.output_text.done', { item_id: message.id, output_index: 0, content_index: 0, text }) +
      ev('response.completed', { response: response('completed', [message], usage) });
    socket.write('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n');
    socket.write(Buffer.concat([chunk(head), chunk(deltas), chunk(tail), Buffer.from('0\r\n\r\n')]));
  });
}

// The answer's text, stream or not (a stream's from its response.completed).
async function ask(client, input, { stream = false, previous } = {}) {
  const req = { model: 'native', input, ...(previous ? { previous_response_id: previous } : {}) };
  if (!stream) {
    const r = await client.responses.create(req);
    return { id: r.id, text: r.output_text };
  }
  let done;
  for await (const e of await client.responses.create({ ...req, stream: true })) {
    if (e.type === 'response.completed') done = e.response;
  }
  assert.ok(done, 'the stream ended with response.completed');
  return { id: done.id, text: done.output.flatMap((o) => o.content).map((c) => c.text).join('') };
}

// Opens conversations (distinct inputs) until each backend made at least
// two of them; returns them as {id, text, maker}.
async function conversations(client, names) {
  const open = [];
  for (let i = 0; i < 64 && !names.every((n) => open.filter((c) => c.maker === n).length >= 2); ++i) {
    const r = await ask(client, `Topic ${i}: tell me about the number ${i * 7919}.`, { stream: i % 2 === 1 });
    open.push({ ...r, maker: r.text.split(' ')[0] });
  }
  for (const n of names) assert.ok(open.filter((c) => c.maker === n).length >= 2, `backend ${n} made two conversations`);
  return open;
}

const group = (backends) => ({ name: 'native', models: ['native'], balance: 'prefix', native_dialects: ['chat', 'responses'],
  backends: backends.map((b) => b.url) });

describe('previous_response_id on a native Responses group: back to the backend that made it', () => {
  let a, b, sluice, openai, other;
  before(async () => {
    a = await responses_backend('a');
    b = await responses_backend('b');
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0-1' }, health: { interval_ms: 0 } },
        groups: [group([a, b])],
        keys: [{ id: 'test', key: test_key }, { id: 'other', key: other_key }],
      }),
    });
    const opts = { maxRetries: 0, timeout: bound_ms(10000) };
    openai = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, ...opts });
    other = new OpenAI({ apiKey: other_key, baseURL: `${sluice.url}/v1`, ...opts });
  });
  after(() => stop_all(sluice, a, b));

  it('each continuation, stream or not, with a new input, reaches the maker, turn after turn', async () => {
    const open = await conversations(openai, ['a', 'b']);
    for (const [i, c] of open.entries()) {
      let last = c;
      for (const turn of [2, 3]) {
        const r = await ask(openai, `And what follows from ${i}-${turn}?`, { stream: (i + turn) % 2 === 0, previous: last.id });
        assert.equal(r.text, `${c.maker} turn ${turn}`, `conversation ${i} (made by ${c.maker}), turn ${turn}`);
        last = r;
      }
    }
  });

  it('another key\'s response id routes nothing: its request goes where its prompt hashes', async () => {
    const open = await conversations(openai, ['a', 'b']);
    const c = open[0];
    // An input that, on its own, lands on the backend that did not make c.
    let input;
    for (let i = 0; i < 64 && input === undefined; ++i) {
      const probe = `Unrelated question number ${i}.`;
      if ((await ask(openai, probe)).text.split(' ')[0] !== c.maker) input = probe;
    }
    assert.ok(input, 'an input that hashes to the other backend');
    const mine = await ask(openai, input, { previous: c.id });
    assert.equal(mine.text, `${c.maker} turn 2`);
    await assert.rejects(ask(other, input, { previous: c.id }), (e) => e instanceof OpenAI.NotFoundError && /not found/.test(e.message));
  });

  it('the maker drained: the continuation goes on to another backend, which says whether it holds it', async () => {
    const open = await conversations(openai, ['a', 'b']);
    const c = open.find((x) => x.maker === 'a');
    const drain = (value) => fetch(`${sluice.admin_url}/backends/drain?url=${encodeURIComponent(a.url)}${value}`, { method: 'POST' });
    const r = await drain('');
    assert.equal(r.status, 200, await r.text());
    try {
      await assert.rejects(ask(openai, 'Go on.', { previous: c.id }), (e) => e instanceof OpenAI.NotFoundError);
      assert.match(b.requests.at(-1).body.previous_response_id, /^resp_a_/);
    } finally {
      const u = await fetch(`${sluice.admin_url}/backends/undrain?url=${encodeURIComponent(a.url)}`, { method: 'POST' });
      await u.arrayBuffer();
    }
  });
});

describe('previous_response_id on a native group, store = "redis": every instance routes it alike', () => {
  let a, b, redis, one, two;
  before(async () => {
    a = await responses_backend('a');
    b = await responses_backend('b');
    redis = await start_redis();
    const config = gateway_config({
      tables: { health: { interval_ms: 0 }, cluster: { redis: redis.url }, responses: { store: 'redis', store_ttl_s: 60 } },
      groups: [group([a, b])],
      keys: [{ id: 'test', key: test_key }],
    });
    one = await start_sluice({ config });
    two = await start_sluice({ config });
    await Promise.all([one, two].map((s) => s.proc.wait_for_line(/cluster: redis .* connected/, { timeout_ms: bound_ms(5000) })));
  });
  after(() => stop_all(one, two, redis, a, b));

  it('a conversation made through one instance is continued through the other at its maker', async () => {
    const opts = { apiKey: test_key, maxRetries: 0, timeout: bound_ms(10000) };
    const via_one = new OpenAI({ ...opts, baseURL: `${one.url}/v1` });
    const via_two = new OpenAI({ ...opts, baseURL: `${two.url}/v1` });
    const open = await conversations(via_one, ['a', 'b']);
    for (const [i, c] of open.entries()) {
      // The route is written to Redis as the reply goes out: wait for the
      // key (its name holds the key id and the response id), not for luck.
      const name = `sluice:route:4:test:${c.id}`;
      await poll(() => redis.cli('EXISTS', name) === '1', { what: `the route of ${c.id} in Redis` });
      assert.equal(redis.cli('GET', name), c.maker === 'a' ? a.url : b.url);
      const r = await ask(via_two, `Continue ${i} elsewhere.`, { stream: i % 2 === 0, previous: c.id });
      assert.equal(r.text, `${c.maker} turn 2`);
    }
  });
});
