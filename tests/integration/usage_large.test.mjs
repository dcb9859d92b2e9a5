// A usage event larger than any buffer (issue: "A usage event larger than
// the receive buffer reaches the client"). A backend writes vLLM's stream
// with a usage event of 70 KB or 4 MB (a large extra member after the
// counts), or a content event of 3 MB; the client did not ask for usage.
// Through HTTP/1.1 (the stock SDK) and HTTP/2, the client must never see a
// chunk with empty choices (the SDKs' `chunk.choices[0]` loop raises on
// it), must get every content event whole, and the audit record must carry
// the counts the usage event gave.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll, read_audit } from './lib/gateway.mjs';
import { bound_ms, start_sluice, stop_all, test_key, with_timeout } from './lib/harness.mjs';
import { chunk, sse_head, start_scripted_backend } from './lib/scripted_backend.mjs';

const base = { id: 'chatcmpl-big', object: 'chat.completion.chunk', created: 1700000000, model: 'm' };
const content = (text, finish = null) =>
  `data: ${JSON.stringify({ ...base, choices: [{ index: 0, delta: { content: text }, logprobs: null, finish_reason: finish }] })}\n\n`;
const usage = (extra) =>
  `data: ${JSON.stringify({ ...base, choices: [], usage: { prompt_tokens: 7, total_tokens: 10, completion_tokens: 3 }, extra })}\n\n`;

// The stream for a request's `scenario` (the last message's content), one
// event per chunk as vLLM writes, the big one in chunks of at most 1 MiB + 1
// (so no chunk end falls between events for the relay's largest buffer).
function stream_for(scenario) {
  const events = [content('', null).replace('"content":""', '"role":"assistant","content":""'), content('a')];
  if (scenario === 'content3m') events.push(content('C'.repeat(3 << 20)));
  events.push(content('b', 'stop'));
  if (scenario === 'usage70k') events.push(usage('x'.repeat(70000)));
  if (scenario === 'usage4m') events.push(usage('x'.repeat(4 << 20)));
  if (scenario === 'content3m') events.push(usage(''));
  events.push('data: [DONE]\n\n');
  const parts = [Buffer.from(sse_head)];
  for (const e of events) {
    for (let at = 0; at < e.length; at += (1 << 20) + 1) parts.push(chunk(e.slice(at, at + (1 << 20) + 1)));
  }
  parts.push(Buffer.from('0\r\n\r\n'));
  return Buffer.concat(parts);
}

describe('a usage event or a content event larger than any buffer', () => {
  let be, sluice;
  before(async () => {
    be = await start_scripted_backend(async (socket, req) => {
      socket.write(stream_for(req.body.messages[0].content));
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { cpus: '0' }, health: { interval_ms: 0 } },
        groups: [{ name: 'g', models: ['*'], backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  async function audited(id) {
    return poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === id),
                { what: `the audit record of ${id}` });
  }

  for (const scenario of ['usage70k', 'usage4m', 'content3m']) {
    const want = scenario === 'content3m' ? `a${'C'.repeat(3 << 20)}b` : 'ab';

    it(`${scenario}, HTTP/1.1, the stock SDK: every chunk has a choice, the text whole, the usage audited`, async () => {
      const sdk = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(30000) });
      const id = `h1-${scenario}`;
      let text = '';
      const stream = await sdk.chat.completions.create({ model: 'm', stream: true, messages: [{ role: 'user', content: scenario }] },
                                                       { headers: { 'x-request-id': id } });
      for await (const c of stream) {
        assert.ok(c.choices.length > 0, `a chunk with empty choices reached the client: ${JSON.stringify(c).slice(0, 200)}`);
        text += c.choices[0].delta.content ?? '';
      }
      assert.equal(text.length, want.length);
      assert.ok(text === want);
      const rec = await audited(id);
      assert.equal(rec.prompt_tokens, 7);
      assert.equal(rec.completion_tokens, 3);
    });

    it(`${scenario}, HTTP/2: the same events, no empty choices`, async () => {
      const client = http2.connect(sluice.url);
      client.on('error', () => {});
      const req = client.request({ ':method': 'POST', ':path': '/v1/chat/completions', authorization: `Bearer ${test_key}`,
                                   'content-type': 'application/json', 'x-request-id': `h2-${scenario}` });
      req.end(JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: scenario }] }));
      const pieces = [];
      req.on('data', (d) => pieces.push(d));
      await with_timeout(new Promise((resolve, reject) => { req.on('end', resolve); req.on('error', reject); }),
                         bound_ms(30000), 'the HTTP/2 stream');
      client.close();
      const body = Buffer.concat(pieces).toString('utf8');
      const events = body.split('\n\n').filter((e) => e.startsWith('data: '));
      assert.equal(events.at(-1), 'data: [DONE]');
      let text = '';
      for (const e of events.slice(0, -1)) {
        const j = JSON.parse(e.slice(6));
        assert.ok(j.choices.length > 0, 'no usage-only chunk');
        text += j.choices[0].delta.content ?? '';
      }
      assert.ok(text === want);
    });
  }

  it('no usage chunk reached a client uncut', async () => {
    const m = await (await fetch(`${sluice.admin_url}/metrics`)).text();
    assert.match(m, /^sluice_usage_cut_failed_total 0$/m);
    assert.equal(sluice.proc.exit, null);
  });
});
