// HTTP/1.1 on the client side: keep-alive, pipelining answered in order,
// `Expect: 100-continue`, and what sluice forwards to the backend (never the
// Authorization header; always X-Request-Id and X-Forwarded-For; no
// hop-by-hop headers) and returns (x-request-id).
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';

import { bound_ms, build_request, chat_body, raw_connection, start_mock_vllm, start_sluice, stop_all, test_key } from './lib/harness.mjs';

const auth = ['Authorization', `Bearer ${test_key}`];
const host = ['Host', '127.0.0.1'];
const json = ['Content-Type', 'application/json'];

function chat_request(id, { stream = false, extra_headers = [] } = {}) {
  const headers = [host, auth, json, ...extra_headers];
  if (id !== undefined) headers.push(['X-Request-Id', id]);
  return build_request({ headers, body: JSON.stringify(chat_body({ stream, max_tokens: 6 })) });
}

function header_of(recorded, name) {
  const hits = recorded.headers.filter(([n]) => n.toLowerCase() === name.toLowerCase());
  return hits.length === 0 ? undefined : hits.map(([, v]) => v).join(', ');
}

describe('keep-alive, pipelining and forwarded headers', () => {
  let mock;
  let sluice;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 1000, reply_tokens: 6 });
    sluice = await start_sluice({ backends: [mock.url] });
  });
  after(() => stop_all(sluice, mock));
  beforeEach(() => mock.clear_requests());

  it('an early answer to a bodiless request (401, 404, 405) goes out once; the next request is read', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      const cases = [
        [build_request({ method: 'GET', target: '/v1/models', headers: [host, ['Authorization', 'Bearer wrong-key']], content_length: false }), 401],
        [build_request({ method: 'GET', target: '/', headers: [host], content_length: false }), 404],
        [build_request({ method: 'GET', target: '/v1/chat/completions', headers: [host, auth], content_length: false }), 405],
        [build_request({ method: 'POST', target: '/v1/chat/completions', headers: [host, ['Authorization', 'Bearer wrong-key']], body: '' }), 401],
      ];
      for (const [bytes, status] of cases) {
        await conn.write(bytes);
        const r = await conn.read_response({ timeout_ms: bound_ms(5000) });
        assert.equal(r.status, status);
        assert.equal(conn.closed, false, 'the connection stays open');
      }
      await conn.write(build_request({ method: 'GET', target: '/v1/models', headers: [host, auth], content_length: false }));
      const last = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(last.status, 200);
      assert.equal(JSON.parse(last.text()).object, 'list');
      // One answer per request: nothing more came (an answer repeated for
      // the same bytes would have queued behind these).
      assert.equal(conn.responses.length, 0, `${conn.responses.length} more responses: ${conn.responses.map((x) => x.status)}`);
    } finally {
      conn.destroy();
    }
  });

  it('an answer before the next head parses never echoes the previous request\'s X-Request-ID view', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      // The first request's X-Request-ID value lies at byte 47 of the
      // connection's buffer; the second, malformed head (a space before a
      // colon) has its key there. A stale view would answer with the key.
      const first = Buffer.from(`GET /v1/models?1234567 HTTP/1.1\r\nX-Request-ID: abcdefgh\r\nHost: x\r\nAuthorization: Bearer ${test_key}\r\n\r\n`);
      assert.equal(first.indexOf('abcdefgh'), 47);
      await conn.write(first);
      const r1 = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(r1.status, 200);
      assert.equal(r1.header('x-request-id'), 'abcdefgh');
      const second = Buffer.from(`GET /v1/models HTTP/1.1\r\nAuthorization: Bearer ${test_key}\r\nHost : x\r\n\r\n`);
      assert.equal(second.indexOf(test_key), 47);
      await conn.write(second);
      const r2 = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(r2.status, 400);
      const id = r2.header('x-request-id');
      assert.ok(id && id !== 'abcdefgh' && !id.includes(test_key), `x-request-id: ${id}`);
      assert.ok(!r2.text().includes(test_key));
    } finally {
      conn.destroy();
    }
  });

  it('answers two pipelined requests in order, then a third on the same connection', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      await conn.write(Buffer.concat([chat_request('pipe-1', { stream: true }), chat_request('pipe-2')]));
      const first = await conn.read_response({ timeout_ms: bound_ms(5000) });
      const second = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(first.status, 200);
      assert.equal(first.header('x-request-id'), 'pipe-1');
      assert.equal(first.terminal_chunk, true);
      assert.match(first.text(), /pipe-1/);
      assert.match(first.text(), /data: \[DONE\]\n\n$/);
      assert.equal(second.status, 200);
      assert.equal(second.header('x-request-id'), 'pipe-2');
      assert.match(JSON.parse(second.text()).id, /pipe-2/);
      assert.equal(conn.closed, false, 'the connection stays open');

      await conn.write(build_request({ method: 'GET', target: '/v1/models', headers: [host, auth], content_length: false }));
      const third = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(third.status, 200);
      assert.equal(JSON.parse(third.text()).object, 'list');
    } finally {
      conn.destroy();
    }
  });

  it('sends 100 Continue before reading the body, then the answer', async () => {
    const body = JSON.stringify(chat_body({ max_tokens: 4 }));
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${test_key}\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nExpect: 100-continue\r\nX-Request-Id: cont-1\r\n\r\n`;
    const conn = await raw_connection.connect(sluice.port);
    try {
      await conn.write(head);
      const interim = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(interim.status, 100);
      await conn.write(body);
      const final = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(final.status, 200);
      assert.match(JSON.parse(final.text()).id, /cont-1/);
    } finally {
      conn.destroy();
    }
  });

  it('never forwards Authorization; forwards X-Request-Id, X-Forwarded-For and end-to-end headers, drops hop-by-hop ones', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      await conn.write(chat_request('fwd-1', {
        extra_headers: [['X-Custom', 'kept'], ['Connection', 'keep-alive, X-Hop'], ['X-Hop', 'dropped'], ['Keep-Alive', 'timeout=5'], ['TE', 'trailers']],
      }));
      const response = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(response.status, 200);
      assert.equal(response.header('x-request-id'), 'fwd-1');
    } finally {
      conn.destroy();
    }
    const recorded = await mock.requests();
    assert.equal(recorded.length, 1, JSON.stringify(recorded));
    const [r] = recorded;
    assert.equal(r.method, 'POST');
    assert.equal(r.target, '/v1/chat/completions');
    assert.equal(header_of(r, 'authorization'), undefined, 'Authorization is not forwarded');
    assert.ok(!JSON.stringify(recorded).includes(test_key), 'the key appears nowhere in what the backend got');
    assert.equal(header_of(r, 'x-request-id'), 'fwd-1');
    assert.match(header_of(r, 'x-forwarded-for') ?? '', /127\.0\.0\.1/);
    assert.equal(header_of(r, 'x-custom'), 'kept');
    for (const hop of ['x-hop', 'keep-alive', 'te']) assert.equal(header_of(r, hop), undefined, `${hop} is hop-by-hop`);
    assert.equal(JSON.parse(r.body).model, chat_body().model);
  });

  it('generates an x-request-id when the client sends none, the same one for the backend', async () => {
    const conn = await raw_connection.connect(sluice.port);
    let response;
    try {
      await conn.write(chat_request(undefined));
      response = await conn.read_response({ timeout_ms: bound_ms(5000) });
    } finally {
      conn.destroy();
    }
    assert.equal(response.status, 200);
    const id = response.header('x-request-id');
    assert.ok(id && id.length >= 8, `generated id ${id}`);
    const recorded = await mock.requests();
    assert.equal(header_of(recorded[0], 'x-request-id'), id);
  });

  it('closes after answering an HTTP/1.1 request with Connection: close', async () => {
    const conn = await raw_connection.connect(sluice.port);
    try {
      await conn.write(chat_request('close-1', { extra_headers: [['Connection', 'close']] }));
      const response = await conn.read_response({ timeout_ms: bound_ms(5000) });
      assert.equal(response.status, 200);
      assert.equal(await conn.wait_close({ timeout_ms: bound_ms(2000) }), true);
    } finally {
      conn.destroy();
    }
  });

  it('answers the admin /healthz', async () => {
    const res = await fetch(`${sluice.admin_url}/healthz`);
    await res.arrayBuffer();
    assert.equal(res.status, 200);
  });
});
