// The SSE scan's skip (README "How a request flows", 6): a whole chunk of one
// plain content event is counted at its boundaries instead of going through
// the event scan. A differential test: two gateways in front of the same
// backend, one with `[upstream] sse_scan = "full"` (every byte through the
// scan), one with the default, are given the same recorded streams -- vLLM's
// own bytes recorded from mock-vllm, and the shapes other servers write --
// and must give each client the same bytes and write the same audit facts
// (tokens, finish reason, a first token or none), also for streams cut short
// without their usage, where the count of content events is what is billed.
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { poll, read_audit, samples, scrape } from './lib/gateway.mjs';
import { post_h2 } from './lib/h2_gateway.mjs';
import { bound_ms, sluice_config, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';
import { chat_stream_events, chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

// The raw body (chunk framing and all) of one streaming answer of mock-vllm.
async function record_mock_vllm(port, max_tokens) {
  const body = JSON.stringify({
    model: 'mock-model', stream: true, stream_options: { include_usage: true }, max_tokens,
    messages: [{ role: 'user', content: 'Record a stream of vLLM bytes.' }],
  });
  const socket = net.connect(port, '127.0.0.1');
  const parts = [];
  socket.on('data', (d) => parts.push(d));
  await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); });
  socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
    `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  await new Promise((resolve) => socket.once('close', resolve));
  const raw = Buffer.concat(parts);
  const head_end = raw.indexOf('\r\n\r\n');
  assert.match(raw.subarray(0, head_end).toString('latin1'), /transfer-encoding: chunked/i);
  return raw.subarray(head_end + 4);
}

// The chunks of a chunked body: [{payload, bytes}] (the terminal chunk left out).
function split_chunks(body) {
  const out = [];
  let at = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', at);
    const size = parseInt(body.subarray(at, eol).toString('latin1'), 16);
    if (size === 0) return out;
    const end = eol + 2 + size + 2;
    out.push({ payload: body.subarray(eol + 2, eol + 2 + size), bytes: body.subarray(at, end) });
    at = end;
  }
}

const terminal = Buffer.from('0\r\n\r\n');
const base = { id: 'chatcmpl-skip', object: 'chat.completion.chunk', created: 1700000000, model: 'skip-model' };
const content_event = (text) =>
  `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: { content: text }, logprobs: null, finish_reason: null }] })}\n\n`;
const role_event = `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] })}\n\n`;
const finish_event = `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: { content: '' }, logprobs: null, finish_reason: 'length' }] })}\n\n`;
const usage_event = (p, c) => `data: ${JSON.stringify({ ...base, choices: [], usage: { prompt_tokens: p, total_tokens: p + c, completion_tokens: c } })}\n\n`;
const done_event = 'data: [DONE]\n\n';

// Each recording by name (node:test needs its `it`s at load time; `before`
// fills the bytes in), and whether the skip must count some of its chunks,
// none, or either (a plain chunk alone after a comment's chunk may be).
const skips_of = {
  'vLLM (mock-vllm), the whole stream in one write': 'some',
  'vLLM (mock-vllm), one write per chunk': 'some',
  'vLLM (mock-vllm), cut short after 120 chunks': 'some',
  'escapes and framing bytes inside the content': 'some',
  'two events per chunk, cut short': 'none',
  'two events per chunk': 'none',
  'CRLF event ends, cut short': 'none',
  'a comment between events, cut short': 'any',
  'an event of two data lines in each chunk, cut short': 'none',
  'scripted vLLM stream, a read per event': 'some',
  'a first event with content beside the role, cut short': 'any',
  'two choices in the first event, content in the first, cut short': 'any',
};

describe('the SSE skip against the full scan, over recorded streams', () => {
  let mock, backend, full, skip, recorded;
  // Each recording: {writes: [Buffer], cut: bool (the backend drops the
  // connection after the last write, no terminal chunk), content: the
  // number of content events in it (the test's own count)}.
  const recordings = {};
  let playing = null;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 200 });
    recorded = await record_mock_vllm(mock.port, 200);
    const chunks = split_chunks(recorded);
    const events = chunks.map((c) => c.payload.toString('utf8'));
    // mock-vllm: one event per chunk, the role chunk first.
    const is_content = (e) => e.startsWith('data: {') && JSON.parse(e.slice(6)).choices[0]?.finish_reason === null;
    const content_after_role = (list) => list.slice(1).filter(is_content).length;
    recordings['vLLM (mock-vllm), the whole stream in one write'] = { writes: [recorded], content: content_after_role(events) };
    recordings['vLLM (mock-vllm), one write per chunk'] = { writes: chunks.map((c) => c.bytes).concat([terminal]), content: content_after_role(events) };
    // Cut short: the first 120 chunks, then the connection drops -- no
    // finish, no usage: the count of content events is what is billed.
    recordings['vLLM (mock-vllm), cut short after 120 chunks'] = {
      writes: [Buffer.concat(chunks.slice(0, 120).map((c) => c.bytes))], cut: true, content: content_after_role(events.slice(0, 120)),
    };
    // Content with escapes (newlines, quotes, backslashes), non-ASCII and
    // the bytes of an event's own framing inside the JSON string.
    const texts = Array.from({ length: 40 }, (_, i) => [`line\n${i}`, '"quoted"', 'back\\slash', ' é 😀', 'data: {x}\r\n\r\n', `t${i}`][i % 6]);
    const tricky = [role_event, ...texts.map(content_event), finish_event, usage_event(9, 40), done_event];
    recordings['escapes and framing bytes inside the content'] = { writes: [Buffer.concat([...tricky.map(chunk), terminal])], content: 40 };
    // Other servers' shapes: two events per chunk (a proxy that coalesces
    // reads), CRLF event ends, comments between events, several data lines.
    const plain = Array.from({ length: 30 }, (_, i) => content_event(` w${i}`));
    const pairs = [];
    for (let i = 0; i < plain.length; i += 2) pairs.push(plain[i] + plain[i + 1]);
    recordings['two events per chunk, cut short'] = { writes: [Buffer.concat([chunk(role_event), ...pairs.map(chunk)])], cut: true, content: 30 };
    recordings['two events per chunk'] = {
      writes: [Buffer.concat([chunk(role_event), ...pairs.map(chunk), chunk(finish_event), chunk(usage_event(9, 30)), chunk(done_event), terminal])],
      content: 30,
    };
    recordings['CRLF event ends, cut short'] = {
      writes: [Buffer.concat([role_event, ...plain].map((e) => chunk(e.replace(/\n\n$/, '\r\n\r\n'))))], cut: true, content: 30,
    };
    recordings['a comment between events, cut short'] = {
      writes: [Buffer.concat([role_event, ...plain].map((e, i) => chunk(i % 3 === 0 ? e : `: keep-alive\n\n${e}`)))], cut: true, content: 30,
    };
    recordings['an event of two data lines in each chunk, cut short'] = {
      writes: [Buffer.concat([role_event, ...plain].map((e) => chunk(e.replace(/,"logprobs"/, '\ndata: ,"logprobs"'))))], cut: true,
      content: 30,
    };
    // First events the role chunk's tail must not be taken for: its role
    // with content, and a role choice after a choice with content.
    const role_with = (text) => `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: text }, logprobs: null, finish_reason: null }] })}\n\n`;
    recordings['a first event with content beside the role, cut short'] = {
      writes: [Buffer.concat([role_with('Hi'), ...plain].map(chunk))], cut: true, content: 31,
    };
    const two_choices = `data: ${JSON.stringify({ ...base, choices: [
      { index: 0, delta: { role: 'assistant', content: 'Hi' }, logprobs: null, finish_reason: null },
      { index: 1, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] })}\n\n`;
    recordings['two choices in the first event, content in the first, cut short'] = {
      writes: [Buffer.concat([two_choices, ...plain].map(chunk))], cut: true, content: 31,
    };
    // The usual stream of the scripted backend, for the SDK loop below.
    recordings['scripted vLLM stream, a read per event'] = {
      writes: chat_stream_events({ tokens: 25 }).map(chunk).concat([terminal]), content: 25,
    };

    backend = await start_scripted_backend(async (socket) => {
      const r = recordings[playing];
      socket.write(sse_head);
      for (const w of r.writes) {
        socket.write(w);
        if (r.writes.length > 1) await new Promise((resolve) => setTimeout(resolve, 1));
      }
      if (r.cut) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        socket.destroy();
      }
    });
    const config = (upstream) => sluice_config({ backends: [backend.url], upstream: { max_retries: 0, ...upstream } });
    full = await start_sluice({ config: config({ sse_scan: 'full' }) });
    skip = await start_sluice({ config: config({}) });
  });
  after(() => stop_all(full, skip, backend, mock));

  const skipped = async (gw) => samples((await scrape(gw.admin_url)).parsed, 'sluice_sse_chunks_skipped_total').reduce((a, s) => a + s.value, 0);

  // The body a client gets (an HTTP/1.1 client: fetch; de-chunked), and the
  // audit record of the request.
  async function exchange(gw, id) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${test_key}`, 'content-type': 'application/json', 'x-request-id': id },
      body: JSON.stringify({ model: 'skip-model', stream: true, max_tokens: 512, messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(res.status, 200);
    let text = '';
    try {
      text = await res.text();
    } catch {
      // A stream cut short: the body ends without its terminal chunk.
    }
    const rec = await poll(() => read_audit(path.join(gw.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === id),
      { what: `the audit record of ${id}` });
    return { text, rec };
  }

  for (const [n, name] of Object.keys(skips_of).entries()) {
    it(`${name}: the same bytes and the same audit facts from both gateways`, async () => {
      playing = name;
      const r = recordings[name];
      // Twice on each: the second stream runs on a pooled connection.
      for (const round of [0, 1]) {
        const id = `skip-${n}-${round}`;
        const before_full = await skipped(full), before_skip = await skipped(skip);
        const a = await exchange(full, `${id}-full`);
        const b = await exchange(skip, `${id}-skip`);
        if (!r.cut) assert.equal(b.text, a.text, 'the client bytes differ');
        for (const field of ['status', 'prompt_tokens', 'completion_tokens', 'total_tokens', 'finish_reason', 'error']) {
          assert.deepEqual(b.rec[field], a.rec[field], `audit ${field}`);
        }
        assert.equal(b.rec.ttft_ms === null, a.rec.ttft_ms === null, 'a first token in one and not the other');
        // Where the usage is missing, the content events are billed: the
        // count is the test's own.
        if (r.cut) assert.equal(a.rec.completion_tokens, r.content, 'completion tokens billed from the content events');
        assert.equal(await skipped(full), before_full, 'sse_scan = "full" skipped a chunk');
        const did = (await skipped(skip)) - before_skip;
        assert.ok(did <= r.content, `${did} chunks skipped, more than the ${r.content} content events`);
        if (skips_of[name] === 'some') assert.ok(did > 0, 'no chunk was skipped: the path under test did not run');
        if (skips_of[name] === 'none') assert.equal(did, 0, 'a chunk of another shape was skipped');
      }
      // And an HTTP/2 client (the chunks' data as DATA frames, read from
      // the backend's buffer): the same bytes from both.
      if (!r.cut) {
        const body = { model: 'skip-model', stream: true, messages: [{ role: 'user', content: 'hi' }] };
        const a = await post_h2(full.url, body);
        const b = await post_h2(skip.url, body);
        assert.equal(a.status, 200);
        assert.equal(b.text, a.text, 'the HTTP/2 client bytes differ');
      }
    });
  }

  // An HTTP/1.0 client has no chunked coding: it gets the payload, ended by
  // the close, cut at the same event boundaries whichever way they were found.
  it('an HTTP/1.0 client gets the same de-chunked bytes from both', async () => {
    const raw10 = async (gw) => {
      const body = JSON.stringify({ model: 'skip-model', stream: true, messages: [{ role: 'user', content: 'hi' }] });
      const socket = net.connect(gw.port, '127.0.0.1');
      const parts = [];
      socket.on('data', (d) => parts.push(d));
      await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); });
      socket.write(`POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\nauthorization: Bearer ${test_key}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      await new Promise((resolve) => socket.once('close', resolve));
      const raw = Buffer.concat(parts).toString('utf8');
      return raw.slice(raw.indexOf('\r\n\r\n') + 4);
    };
    for (const name of ['vLLM (mock-vllm), one write per chunk', 'vLLM (mock-vllm), the whole stream in one write']) {
      playing = name;
      const before_skip = await skipped(skip);
      const a = await raw10(full);
      const b = await raw10(skip);
      assert.ok(a.endsWith('data: [DONE]\n\n'), a.slice(-60));
      assert.ok(!a.includes('"usage"'), 'the usage chunk sluice asked for reached the client');
      assert.equal(b, a, name);
      assert.ok((await skipped(skip)) > before_skip, 'no chunk was skipped');
    }
  });

  it('the stock SDK\'s choices[0] loop sees the same tokens through both', async () => {
    playing = 'scripted vLLM stream, a read per event';
    const texts = [];
    for (const gw of [full, skip]) {
      const client = new OpenAI({ apiKey: test_key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: bound_ms(15000) });
      const stream = await client.chat.completions.create({ model: 'skip-model', stream: true, messages: [{ role: 'user', content: 'hi' }] });
      let text = '';
      for await (const c of stream) {
        assert.ok(c.choices.length > 0);
        text += c.choices[0].delta?.content ?? '';
      }
      texts.push(text);
    }
    assert.equal(texts[1], texts[0]);
    assert.equal(texts[0], Array.from({ length: 25 }, (_, i) => `${i ? ' ' : ''}tok${i}`).join(''));
  });

  it('sse_scan takes "boundaries" or "full" and nothing else', async () => {
    await assert.rejects(start_sluice({ config: sluice_config({ backends: [backend.url], upstream: { sse_scan: 'some' } }) }));
  });
});
