// What a client at the edge should get, seen with the stock OpenAI SDK and
// raw sockets: models.retrieve answered from the groups a key may use, a
// max_tokens above its group's cap refused, the admission estimate from the
// text of the messages (an image's base64 does not make it a 429), a 413
// that reaches a client which sent its whole body, a client gone before its
// answer audited as 499.
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import OpenAI from 'openai';

import { gateway_config, poll, read_audit } from './lib/gateway.mjs';
import { bound_ms, chat_body, http_post, start_mock_vllm, start_sluice, stop_all } from './lib/harness.mjs';

describe('models', () => {
  let mock, sluice;

  before(async () => {
    mock = await start_mock_vllm({});
    sluice = await start_sluice({
      config: gateway_config({
        groups: [
          { name: 'chat', models: ['chat-a', 'chat-*'], backends: [mock.url] },
          { name: 'secret', models: ['secret-model'], backends: [mock.url] },
        ],
        keys: [
          { id: 'all', key: 'key-all', groups: ['*'] },
          { id: 'chat-only', key: 'key-chat', groups: ['chat'] },
        ],
      }),
    });
  });
  after(() => stop_all(sluice, mock));

  const client = (key) => new OpenAI({ apiKey: key, baseURL: `${sluice.url}/v1`, maxRetries: 0 });

  it('models.list shows the groups the key may use, and only those', async () => {
    const all = (await client('key-all').models.list()).data.map((m) => m.id).sort();
    assert.deepEqual(all, ['chat', 'chat-a', 'secret', 'secret-model']);
    const chat = (await client('key-chat').models.list()).data.map((m) => m.id).sort();
    assert.deepEqual(chat, ['chat', 'chat-a']);
  });

  it('models.retrieve answers a model the key may use, by name or pattern, with OpenAI\'s model object', async () => {
    const m = await client('key-chat').models.retrieve('chat-a');
    assert.deepEqual({ id: m.id, object: m.object, owned_by: m.owned_by }, { id: 'chat-a', object: 'model', owned_by: 'sluice' });
    const p = await client('key-chat').models.retrieve('chat-7b');
    assert.equal(p.id, 'chat-7b');
    const slash = await fetch(`${sluice.url}/v1/models/chat-org%2Fmodel`, { headers: { authorization: 'Bearer key-chat' } });
    assert.equal(slash.status, 200);
    assert.equal((await slash.json()).id, 'chat-org/model');
  });

  it('models.retrieve of a model the key may not use, or of none, is a 404 model_not_found', async () => {
    for (const id of ['secret-model', 'nothing-here']) {
      await assert.rejects(client('key-chat').models.retrieve(id), (err) => {
        assert.equal(err.status, 404);
        assert.equal(err.code, 'model_not_found');
        return true;
      }, id);
    }
    assert.equal((await client('key-all').models.retrieve('secret-model')).id, 'secret-model');
  });
});

describe('max_tokens and the admission estimate', () => {
  let mock, sluice;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 8 });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { quota: { default_max_tokens: 4096 }, server: { max_body_bytes: 8 << 20 } },
        groups: [{ name: 'small', models: ['*'], backends: [mock.url], max_tokens_cap: 100 }],
        // 5000 tokens a minute: a reservation of the uncapped default
        // (4096 x 2) would be refused as too large.
        keys: [{ id: 'k', key: 'key-k', groups: ['*'], tokens_per_minute: 5000 }],
      }),
    });
  });
  after(() => stop_all(sluice, mock));

  const client = () => new OpenAI({ apiKey: 'key-k', baseURL: `${sluice.url}/v1`, maxRetries: 0 });

  it('above the group\'s max_tokens_cap is a 400 naming the field; nothing reaches the backend', async () => {
    await mock.clear_requests();
    for (const field of ['max_tokens', 'max_completion_tokens']) {
      await assert.rejects(
        client().chat.completions.create({ model: 'm', [field]: 101, messages: [{ role: 'user', content: 'hi' }] }),
        (err) => {
          assert.equal(err.status, 400);
          assert.equal(err.param, field);
          assert.match(err.message, /at most 100/);
          return true;
        }, field);
    }
    assert.equal((await mock.requests()).length, 0);
    const ok = await client().chat.completions.create({ model: 'm', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(ok.object, 'chat.completion');
  });

  it('a request without max_tokens reserves the capped default, not the group default', async () => {
    const r = await client().chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.object, 'chat.completion');
  });

  it('a vision request is estimated from its text plus the image cost, not from its base64 bytes', async () => {
    // 3 MB of base64 would be ~1M tokens estimated from the raw body.
    const url = `data:image/png;base64,${'iVBORw0KGgo'.repeat(300000)}`;
    const r = await client().chat.completions.create({
      model: 'm', max_tokens: 16,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, { type: 'image_url', image_url: { url } }] }],
    });
    assert.equal(r.object, 'chat.completion');
  });
});

describe('clients that leave', () => {
  let mock, sluice;

  before(async () => {
    // A long non-stream answer (~20 MB): the client can leave after its head
    // while sluice still relays the body, before its usage.
    mock = await start_mock_vllm({ reply_tokens: 200000, extra_args: ['--token-pad', '100'] });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { quota: { max_tokens_cap: 1 << 20 } },
        groups: [{ name: 'g', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'k', key: 'key-k', groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, mock));

  const audit_of = (id) => poll(() => read_audit(path.join(sluice.dir, 'sluice-audit.jsonl')).find((a) => a.request_id === id),
    { what: `the audit record of ${id}` });

  it('a non-stream answer cut short by the client bills the reservation\'s output part', async () => {
    const r = await http_post(sluice.url, '/v1/chat/completions', chat_body({ max_tokens: 200000 }), {
      headers: { authorization: 'Bearer key-k', 'x-request-id': 'left-after-head' },
      on_response: (res, req) => { res.once('data', () => req.destroy()); },
    }).catch((err) => ({ error: err }));
    assert.ok(r.error !== undefined || r.complete === false, 'the client left mid-body');
    const rec = await audit_of('left-after-head');
    assert.equal(rec.cancelled, true);
    assert.equal(rec.completion_tokens, 200000);
  });

  it('a client gone mid-body is audited 499 client_closed', async () => {
    const socket = net.connect(sluice.port, '127.0.0.1');
    await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); });
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-k\r\n' +
      'x-request-id: left-mid-body\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":');
    // The head reached sluice (its 100 Continue is not asked for): wait for
    // the request to be open, then leave.
    await poll(async () => {
      const m = await fetch(`${sluice.admin_url}/metrics`).then((x) => x.text());
      return /^sluice_inflight_requests\S* [1-9]/m.test(m);
    }, { what: 'the request to be open' });
    socket.destroy();
    const rec = await audit_of('left-mid-body');
    assert.equal(rec.status, 499);
    assert.equal(rec.error, 'client_closed');
    assert.equal(rec.cancelled, true);
  });
});

describe('a body over max_body_bytes, sent whole with its head', () => {
  let mock, sluice;

  before(async () => {
    mock = await start_mock_vllm({});
    sluice = await start_sluice({
      config: gateway_config({
        tables: { server: { max_body_bytes: 1 << 20 } },
        groups: [{ name: 'g', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'k', key: 'key-k', groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, mock));

  it('the OpenAI SDK gets the 413 (not a reset), does not retry it, and nothing reaches the backend', async () => {
    await mock.clear_requests();
    let attempts = 0;
    const client = new OpenAI({
      apiKey: 'key-k', baseURL: `${sluice.url}/v1`, maxRetries: 2,
      fetch: (url, init) => { ++attempts; return fetch(url, init); },
    });
    const big = 'x'.repeat(8 << 20);
    for (let i = 0; i < 3; ++i) {
      await assert.rejects(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: big }] }), (err) => {
        assert.equal(err.status, 413, `${err.constructor.name}: ${err.message}`);
        assert.equal(err.type, 'invalid_request_error');
        return true;
      });
    }
    assert.equal(attempts, 3, 'a 413 is not retried');
    assert.equal((await mock.requests()).length, 0);
  });
});

describe('an HTTP/1.0 client', () => {
  let mock, sluice;

  before(async () => {
    mock = await start_mock_vllm({ reply_tokens: 6 });
    sluice = await start_sluice({
      config: gateway_config({
        groups: [{ name: 'g', models: ['*'], backends: [mock.url] }],
        keys: [{ id: 'k', key: 'key-k', groups: ['*'] }],
      }),
    });
  });
  after(() => stop_all(sluice, mock));

  // Sends one HTTP/1.0 request; resolves the whole reply, read to the close.
  function http10(body) {
    return new Promise((resolve, reject) => {
      const socket = net.connect(sluice.port, '127.0.0.1');
      const parts = [];
      socket.on('data', (d) => parts.push(d));
      socket.on('error', reject);
      socket.on('close', () => resolve(Buffer.concat(parts).toString('utf8')));
      const payload = JSON.stringify(body);
      socket.write(`POST /v1/chat/completions HTTP/1.0\r\nauthorization: Bearer key-k\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`);
      setTimeout(() => { socket.destroy(); reject(new Error('no close within the bound')); }, bound_ms(10000)).unref();
    });
  }

  it('gets a stream without chunked framing, ended by the close, without the usage chunk sluice asked for', async () => {
    const reply = await http10(chat_body({ stream: true, max_tokens: 6 }));
    const [head, ...rest] = reply.split('\r\n\r\n');
    const body = rest.join('\r\n\r\n');
    assert.match(head, /^HTTP\/1\.1 200 /);
    assert.doesNotMatch(head, /transfer-encoding/i);
    assert.match(head, /connection: close/i);
    const events = body.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
    assert.equal(events.at(-1), '[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    assert.ok(chunks.every((c) => c.choices.length > 0), body);
    assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), 'tok0 tok1 tok2 tok3 tok4 tok5');
    assert.doesNotMatch(body, /^[0-9a-f]+\r$/m, 'no chunk size lines');
  });

  it('gets a non-stream answer as it is', async () => {
    const reply = await http10(chat_body({ max_tokens: 6 }));
    const body = reply.slice(reply.indexOf('\r\n\r\n') + 4);
    assert.equal(JSON.parse(body).choices[0].message.content, 'tok0 tok1 tok2 tok3 tok4 tok5');
  });
});
