// The key as `x-api-key` (how Anthropic's SDK sends it, and what Claude Code
// sends to ANTHROPIC_BASE_URL) beside `Authorization: Bearer`, on every
// client endpoint and both framings; it never reaches a backend.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import { after, before, describe, it } from 'node:test';

import { gateway_config } from './lib/gateway.mjs';
import { bound_ms, start_sluice, stop_all, test_key, with_timeout } from './lib/harness.mjs';
import { chat_stream_reply, start_scripted_backend } from './lib/scripted_backend.mjs';

describe('x-api-key', () => {
  let be, sluice;
  before(async () => {
    be = await start_scripted_backend(async (socket) => {
      socket.write(chat_stream_reply({ tokens: 1 }));
    });
    sluice = await start_sluice({
      config: gateway_config({
        tables: { health: { interval_ms: 0 } },
        groups: [{ name: 'g', models: ['*'], backends: [be.url] }],
        keys: [{ id: 'test', key: test_key }],
      }),
    });
  });
  after(() => stop_all(sluice, be));

  const body = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi' }] });
  const post = (headers) => fetch(`${sluice.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });

  it('HTTP/1.1: a right key as x-api-key is served, and the backend never sees it', async () => {
    const before_count = be.requests.length;
    const r = await post({ 'x-api-key': test_key });
    assert.equal(r.status, 200);
    assert.match(await r.text(), /data: \[DONE\]/);
    const head = be.requests[before_count].head;
    assert.ok(!/x-api-key/i.test(head), head);
    assert.ok(!head.includes(test_key));
    const models = await fetch(`${sluice.url}/v1/models`, { headers: { 'x-api-key': test_key } });
    assert.equal(models.status, 200);
  });

  it('a wrong key, none, or two x-api-key fields: 401, 401, 400; nothing forwarded', async () => {
    const before_count = be.requests.length;
    const wrong = await post({ 'x-api-key': 'sk-wrong' });
    assert.equal(wrong.status, 401);
    assert.equal((await wrong.json()).error.code, 'invalid_api_key');
    const none = await post({});
    assert.equal(none.status, 401);
    assert.match((await none.json()).error.message, /didn't provide an API key/);
    // fetch joins repeated fields; a raw request sends two.
    const net = await import('node:net');
    const twice = await new Promise((resolve) => {
      const s = net.connect({ port: sluice.port, host: '127.0.0.1' });
      let got = '';
      s.on('data', (d) => { got += d; });
      s.on('close', () => resolve(got));
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-api-key: ${test_key}\r\nx-api-key: ${test_key}\r\n` +
              `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
    });
    assert.match(twice, /^HTTP\/1\.1 400 /);
    assert.equal(be.requests.length, before_count);
  });

  it('Authorization: Bearer wins over x-api-key when both come', async () => {
    assert.equal((await post({ authorization: `Bearer ${test_key}`, 'x-api-key': 'sk-other' })).status, 200);
    assert.equal((await post({ authorization: 'Bearer sk-other', 'x-api-key': test_key })).status, 401);
  });

  it('HTTP/2: x-api-key is read as well', async () => {
    const client = http2.connect(sluice.url);
    client.on('error', () => {});
    const req = client.request({ ':method': 'POST', ':path': '/v1/chat/completions', 'x-api-key': test_key,
                                 'content-type': 'application/json' });
    req.end(body);
    let status = 0;
    req.on('response', (h) => { status = h[':status']; });
    req.resume();
    await with_timeout(new Promise((resolve) => req.on('close', resolve)), bound_ms(5000), 'the HTTP/2 answer');
    client.close();
    assert.equal(status, 200);
  });
});
