// The harness checks itself: the raw HTTP parser against canned server bytes,
// and process supervision against a shell. These need no sluice build.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';

import { managed_process, parse_response, raw_connection, raw_exchange, sse_content, sse_events } from './lib/harness.mjs';

// A server that answers each connection with canned bytes, then does what
// `after` says: 'close', 'keep' (stay open) or 'reset'.
function canned_server(reply, after_reply = 'close') {
  const server = net.createServer((socket) => {
    socket.once('data', () => {
      socket.write(reply, () => {
        if (after_reply === 'close') socket.end();
        else if (after_reply === 'reset') socket.resetAndDestroy();
      });
    });
    socket.on('error', () => {});
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

describe('harness: parse_response', () => {
  it('parses a Content-Length response and leaves the rest', () => {
    const buf = Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhelloHTTP/1.1 204 No Content\r\n\r\n');
    const first = parse_response(buf);
    assert.equal(first.response.status, 200);
    assert.equal(first.response.header('x-a'), 'b');
    assert.equal(first.response.text(), 'hello');
    const second = parse_response(buf.subarray(first.consumed));
    assert.equal(second.response.status, 204);
    assert.equal(second.consumed, buf.length - first.consumed);
  });

  it('de-chunks a chunked body and sees the terminal chunk', () => {
    const buf = Buffer.from('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n');
    const { response, consumed } = parse_response(buf);
    assert.equal(response.text(), 'hello world');
    assert.equal(response.terminal_chunk, true);
    assert.equal(consumed, buf.length);
  });

  it('waits for more bytes on an incomplete response, and reports it truncated at eof', () => {
    const buf = Buffer.from('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n');
    assert.equal(parse_response(buf), null);
    const { response } = parse_response(buf, { at_eof: true });
    assert.equal(response.complete, false);
    assert.equal(response.terminal_chunk, false);
    assert.equal(response.text(), 'hello');
  });

  it('treats 100 Continue as a response without a body', () => {
    const buf = Buffer.from('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    const first = parse_response(buf);
    assert.equal(first.response.status, 100);
    assert.equal(parse_response(buf.subarray(first.consumed)).response.text(), 'ok');
  });
});

describe('harness: raw_exchange', () => {
  const servers = [];
  after(() => servers.forEach((s) => s.close()));

  it('reads pipelined responses in order and sees the close', async () => {
    const server = await canned_server('HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb');
    servers.push(server);
    const result = await raw_exchange(server.address().port, 'GET / HTTP/1.1\r\n\r\n', { responses: 2, until_close: true });
    assert.deepEqual(result.responses.map((r) => r.text()), ['a', 'b']);
    assert.equal(result.closed, true);
  });

  it('reports a connection the server keeps open as not closed', async () => {
    const server = await canned_server('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n', 'keep');
    servers.push(server);
    const result = await raw_exchange(server.address().port, 'GET / HTTP/1.1\r\n\r\n', { until_close: true, close_timeout_ms: 200 });
    assert.equal(result.responses[0].status, 200);
    assert.equal(result.closed, false);
  });

  it('keeps a response that arrived before a reset', async () => {
    const server = await canned_server('HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno', 'reset');
    servers.push(server);
    const result = await raw_exchange(server.address().port, 'GET / HTTP/1.1\r\n\r\n', { until_close: true });
    assert.equal(result.responses[0].status, 400);
    assert.equal(result.closed, true);
  });

  it('returns a truncated chunked response when the server closes mid-body', async () => {
    const server = await canned_server('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n');
    servers.push(server);
    const conn = await raw_connection.connect(server.address().port);
    await conn.write('GET / HTTP/1.1\r\n\r\n');
    const response = await conn.read_response();
    assert.equal(response.complete, false);
    assert.equal(response.text(), 'data: ');
    assert.equal(conn.closed, true);
    conn.destroy();
  });
});

describe('harness: sse helpers', () => {
  it('splits events and joins delta content', () => {
    const text = 'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n' +
      'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: {"choices":[]}\n\ndata: [DONE]\n\n';
    assert.equal(sse_events(text).length, 4);
    assert.equal(sse_events(text).at(-1), '[DONE]');
    assert.equal(sse_content(text), 'Hi');
  });
});

describe('harness: managed_process', () => {
  let proc;
  before(() => {
    proc = new managed_process('sh', '/bin/sh', ['-c', 'echo starting; echo "ready on 1234" >&2; exec sleep 60']);
  });
  after(() => proc.stop());

  it('waits for a line on either stream', async () => {
    const { match } = await proc.wait_for_line(/ready on (\d+)/);
    assert.equal(match[1], '1234');
  });

  it('fails with the output when a process exits without the line', async () => {
    const quitter = new managed_process('quitter', '/bin/sh', ['-c', 'echo some output; exit 3']);
    await assert.rejects(quitter.wait_for_line(/never/), /exited .*"code":3[\s\S]*some output/);
  });

  it('fails within the bound when the line never comes', async () => {
    await assert.rejects(proc.wait_for_line(/never/, { timeout_ms: 100 }), /did not print/);
  });

  it('stops with SIGKILL when SIGTERM is ignored', async () => {
    const stubborn = new managed_process('stubborn', '/bin/sh', ['-c', 'trap "" TERM; echo up; while :; do sleep 1; done']);
    await stubborn.wait_for_line(/up/);
    const exit = await stubborn.stop({ kill_after_ms: 200 });
    assert.equal(exit.signal, 'SIGKILL');
  });
});
