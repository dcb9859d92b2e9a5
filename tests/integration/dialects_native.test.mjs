// Pass-through of a natively spoken dialect (group.native_dialects,
// docs/architecture.md §2b): a Messages client of a group whose backends serve
// /v1/messages themselves (mock-vllm's own Messages endpoint, and an
// Anthropic backend, whose group speaks Messages natively by default) gets
// the backend's bytes unchanged -- the same bytes as asked directly -- and
// is billed from the usage read in place. The backend gets the client's
// bytes with at most the model token rewritten; a body that could be read
// two ways (a member given twice) is refused before anything is forwarded.
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { start_anthropic_peer } from './lib/anthropic_peer.mjs';
import { gateway_config, poll, read_audit } from './lib/gateway.mjs';
import { bound_ms, http_post, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';

describe('native dialects: Messages and Responses passed through', () => {
  let mock, peer, sluice, sdk, openai;
  const audit = () => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl'));
  async function audited(id) {
    let rec;
    await poll(() => (rec = audit().find((r) => r.request_id === id)) !== undefined, { what: `the audit record of ${id}` });
    return rec;
  }

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 7 });
    peer = await start_anthropic_peer();
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 } },
        groups: [
          { name: 'vllm', models: ['mock-model'], native_dialects: ['chat', 'messages', 'responses'], backends: [mock.url] },
          { name: 'renamed', models: ['alias'], native_dialects: ['chat', 'messages'], backend_model: 'mock-model', backends: [mock.url] },
          { name: 'claude', models: ['claude-*'], protocol: 'anthropic', backend_model: 'claude-backend',
            api_key_env: 'SLUICE_TEST_ANTHROPIC_KEY', backends: [peer.url] },
        ],
        keys: [{ id: 'test', key: test_key }],
      }),
      env: { ...process.env, SLUICE_TEST_ANTHROPIC_KEY: 'sk-ant-backend' },
    });
    sdk = new Anthropic({ apiKey: test_key, baseURL: sluice.url, maxRetries: 0, timeout: bound_ms(10000) });
    openai = new OpenAI({ apiKey: test_key, baseURL: `${sluice.url}/v1`, maxRetries: 0, timeout: bound_ms(10000) });
  });
  after(() => stop_all(sluice, mock, peer));

  const body = (extra = {}) => ({ model: 'mock-model', max_tokens: 30, messages: [{ role: 'user', content: 'Say hello natively.' }], ...extra });
  const headers = (id) => ({ 'anthropic-version': '2023-06-01', 'x-request-id': id });

  for (const stream of [false, true]) {
    it(`${stream ? 'a stream' : 'a message'}: the bytes equal the backend's own, and the usage in them is billed`, async () => {
      const id = `native-${stream}`;
      const direct = await http_post(mock.url, '/v1/messages', body({ stream }), { headers: headers(id) });
      const via = await http_post(sluice.url, '/v1/messages', body({ stream }), { headers: { ...headers(id), 'x-api-key': test_key } });
      assert.equal(direct.status, 200, direct.text);
      assert.equal(via.status, 200, via.text);
      assert.equal(via.text, direct.text);
      assert.equal(via.headers['content-type'], direct.headers['content-type']);
      const rec = await audited(id);
      assert.equal(rec.dialect, 'messages');
      assert.equal(rec.group, 'vllm');
      // The counts the bytes carry: mock-vllm's input_tokens, 7 out.
      const counts = stream
        ? [JSON.parse(direct.text.split('\n').find((l) => l.includes('"message_start"')).slice(6)).message.usage.input_tokens, 7]
        : [JSON.parse(direct.text).usage.input_tokens, JSON.parse(direct.text).usage.output_tokens];
      assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], counts);
    });
  }

  for (const stream of [false, true]) {
    it(`Responses, ${stream ? 'a stream' : 'a response'}: the bytes equal mock-vllm's own /v1/responses, usage billed from them`, async () => {
      const id = `native-resp-${stream}`;
      const req = { model: 'mock-model', instructions: 'Be brief.', input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hello there.' }] }], stream };
      const direct = await http_post(mock.url, '/v1/responses', req, { headers: { 'x-request-id': id } });
      const via = await http_post(sluice.url, '/v1/responses', req, { headers: { 'x-request-id': id, authorization: `Bearer ${test_key}` } });
      assert.equal(direct.status, 200, direct.text);
      assert.equal(via.status, 200, via.text);
      // The same bytes but for created_at (mock-vllm's clock, per request).
      const unclocked = (t) => t.replace(/"created_at":\d+/g, '"created_at":0');
      assert.equal(unclocked(via.text), unclocked(direct.text));
      const rec = await audited(id);
      assert.equal(rec.dialect, 'responses');
      const last = stream ? JSON.parse(direct.text.trim().split('\n').at(-1).slice(6)).response : JSON.parse(direct.text);
      assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], [last.usage.input_tokens, last.usage.output_tokens]);
    });
  }

  it('previous_response_id on a native Responses group goes to the backend, which holds the conversation', async () => {
    const r = await openai.responses.create({ model: 'mock-model', input: 'And then?', previous_response_id: 'resp_earlier' },
                                            { headers: { 'x-request-id': 'native-continue', 'x-session-id': 'conv-1' } });
    assert.equal(r.status, 'completed');
    const seen = await (await fetch(`${mock.url}/debug/requests`)).json();
    const up = seen.filter((q) => q.target === '/v1/responses').map((q) => JSON.parse(q.body)).at(-1);
    assert.equal(up.previous_response_id, 'resp_earlier');
  });

  it('the OpenAI SDK over a native Responses group: create, stream().finalResponse()', async () => {
    const r = await openai.responses.create({ model: 'mock-model', input: 'Say hi.' });
    assert.equal(r.output_text.split(' ').length, 7);
    const s = await openai.responses.stream({ model: 'mock-model', input: 'Say hi.' }).finalResponse();
    assert.equal(s.status, 'completed');
    assert.equal(s.usage.output_tokens, 7);
    const cut = await openai.responses.create({ model: 'mock-model', input: 'Say hi.', max_output_tokens: 3 });
    assert.equal(cut.status, 'incomplete');
    assert.equal(cut.usage.output_tokens, 3);
  });

  it('the SDK over a native group: create, stream().finalMessage(), the usage the client saw is audited', async () => {
    const m = await sdk.messages.create(body(), { headers: { 'x-request-id': 'native-sdk' } });
    assert.equal(m.content[0].text.split(' ').length, 7);
    const s = await sdk.messages.stream(body(), { headers: { 'x-request-id': 'native-sdk-stream' } }).finalMessage();
    assert.equal(s.content[0].text, m.content[0].text);
    for (const [id, msg] of [['native-sdk', m], ['native-sdk-stream', s]]) {
      const rec = await audited(id);
      assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], [msg.usage.input_tokens, msg.usage.output_tokens]);
    }
  });

  it('the model token is rewritten for the group\'s backend model, and only it', async () => {
    const text = '{"model" : "alias", "max_tokens":5,\n "messages":[{"role":"user","content":"hi"}]}';
    const r = await http_post(sluice.url, '/v1/messages', text, { headers: { ...headers('native-alias'), 'x-api-key': test_key } });
    assert.equal(r.status, 200, r.text);
    assert.equal(JSON.parse(r.text).model, 'mock-model');
  });

  it('a body that could be read two ways is refused in Anthropic\'s shape, before anything is forwarded', async () => {
    for (const text of ['{"model":"mock-model","max_tokens":5,"max_tokens":5000,"messages":[{"role":"user","content":"x"}]}',
                        '{"model":"mock-model","m\\u0061x_tokens":5000,"max_tokens":5,"messages":[{"role":"user","content":"x"}]}']) {
      const r = await http_post(sluice.url, '/v1/messages', text, { headers: { ...headers('native-dup'), 'x-api-key': test_key } });
      assert.equal(r.status, 400, r.text);
      const e = JSON.parse(r.text);
      assert.equal(e.type, 'error');
      assert.equal(e.error.type, 'invalid_request_error');
    }
  });

  it('an Anthropic backend: the client\'s own request goes up (its model rewritten, sluice\'s key), its reply comes back as sent', async () => {
    peer.set({ text: 'Native Claude.', input_tokens: 13, output_tokens: 3 });
    const seen = peer.requests.length;
    const req = { model: 'claude-x', max_tokens: 40, system: [{ type: 'text', text: 'terse' }], metadata: { user_id: 'u1' },
                  messages: [{ role: 'user', content: 'Hi' }] };
    const m = await sdk.messages.create(req, { headers: { 'x-request-id': 'native-claude' } });
    assert.equal(m.content[0].text, 'Native Claude.');
    assert.deepEqual([m.usage.input_tokens, m.usage.output_tokens], [13, 3]);
    assert.deepEqual(peer.requests[seen], { ...req, model: 'claude-backend' }, 'every member carried, metadata included');
    assert.equal(peer.headers[seen]['x-api-key'], 'sk-ant-backend');
    const s = await sdk.messages.stream(req, { headers: { 'x-request-id': 'native-claude-stream' } }).finalMessage();
    assert.equal(s.content[0].text, 'Native Claude.');
    for (const id of ['native-claude', 'native-claude-stream']) {
      const rec = await audited(id);
      assert.deepEqual([rec.prompt_tokens, rec.completion_tokens], [13, 3]);
    }
  });
});
