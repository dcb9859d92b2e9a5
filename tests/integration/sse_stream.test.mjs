// Raw streaming: the SSE bytes a client receives through sluice equal the
// ones it receives from mock-vllm directly, read with `curl -N` and with a
// raw socket (which also sees the chunked framing and the keep-alive after
// the terminal chunk).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, it } from 'node:test';

import {
  bound_ms, build_request, chat_body, raw_connection, sluice_config, sse_events,
  start_mock_vllm, start_sluice, stop_all, test_key, with_timeout,
} from './lib/harness.mjs';

const modes = [['copy', false]];

// Runs curl -N and resolves {status, content_type, body: Buffer}.
function curl_stream(url, body, headers) {
  const args = ['-sS', '-N', '--max-time', '20', '-X', 'POST', '-H', 'Content-Type: application/json'];
  for (const h of headers) args.push('-H', h);
  args.push('--data-binary', JSON.stringify(body), '-w', '%{stderr}%{http_code} %{content_type}', url);
  const child = spawn('curl', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const out = [];
  const err = [];
  child.stdout.on('data', (d) => out.push(d));
  child.stderr.on('data', (d) => err.push(d));
  const done = new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => {
      const tail = Buffer.concat(err).toString();
      if (code !== 0) return reject(new Error(`curl exited ${code}: ${tail}`));
      const [status, ...ct] = tail.trim().split(' ');
      resolve({ status: Number(status), content_type: ct.join(' '), body: Buffer.concat(out) });
    });
  });
  return with_timeout(done, bound_ms(25000), 'curl');
}

// One request on a raw socket; the stream must end with the terminal chunk
// and leave the connection open for the next request.
async function raw_stream(port, body, headers) {
  const conn = await raw_connection.connect(port);
  try {
    await conn.write(build_request({ headers: [['Host', '127.0.0.1'], ['Content-Type', 'application/json'], ...headers], body: JSON.stringify(body) }));
    const response = await conn.read_response({ timeout_ms: bound_ms(15000) });
    return { response, still_open: !conn.closed };
  } finally {
    conn.destroy();
  }
}

describe('SSE streaming bytes', () => {
  let mock;

  before(async () => {
    mock = await start_mock_vllm({ tokens_per_sec: 2000, reply_tokens: 400 });
  });
  after(() => stop_all(mock));

  for (const [mode, splice] of modes) {
    describe(`through sluice on the ${mode} path`, () => {
      let sluice;

      before(async () => {
        sluice = await start_sluice({ backends: [mock.url], config: sluice_config({ backends: [mock.url], server: { splice } }) });
      });
      after(() => stop_all(sluice));

      for (const include_usage of [undefined, true]) {
        const label = include_usage ? 'with include_usage' : 'without stream_options';
        it(`curl -N receives the same SSE events as directly (${label})`, async () => {
          const body = chat_body({ stream: true, include_usage, max_tokens: 30 });
          const id = `curl-${mode}-${include_usage ? 'usage' : 'plain'}`;
          const expected = await curl_stream(`${mock.url}/v1/chat/completions`, body, [`X-Request-Id: ${id}`]);
          const actual = await curl_stream(`${sluice.url}/v1/chat/completions`, body, [`X-Request-Id: ${id}`, `Authorization: Bearer ${test_key}`]);
          assert.equal(expected.status, 200);
          assert.equal(actual.status, 200);
          assert.equal(actual.content_type, expected.content_type);
          const events = sse_events(expected.body.toString());
          assert.equal(events.at(-1), '[DONE]');
          assert.ok(events.length >= 4, `direct stream has ${events.length} events`);
          assert.equal(actual.body.toString(), expected.body.toString());
          assert.ok(actual.body.equals(expected.body), 'byte-identical bodies');
        });
      }

      it('a raw client gets the same de-chunked bytes, the terminal chunk, and a reusable connection', async () => {
        const body = chat_body({ stream: true, include_usage: true, max_tokens: 30 });
        const id = `raw-${mode}`;
        const expected = await raw_stream(mock.port, body, [['X-Request-Id', id]]);
        const actual = await raw_stream(sluice.port, body, [['X-Request-Id', id], ['Authorization', `Bearer ${test_key}`]]);
        assert.equal(expected.response.terminal_chunk, true);
        assert.equal(actual.response.status, 200);
        assert.equal(actual.response.chunked, true, 'the stream is chunked');
        assert.equal(actual.response.terminal_chunk, true, 'the stream ends with the terminal chunk');
        assert.equal(actual.response.header('x-request-id'), id);
        assert.equal(actual.response.header('content-type'), expected.response.header('content-type'));
        assert.equal(actual.response.text(), expected.response.text());
        assert.equal(actual.still_open, true, 'keep-alive after the stream');
      });

      it('a long stream (many events) arrives intact', async () => {
        const body = chat_body({ stream: true, max_tokens: 400 });
        const id = `long-${mode}`;
        const expected = await curl_stream(`${mock.url}/v1/chat/completions`, body, [`X-Request-Id: ${id}`]);
        const actual = await curl_stream(`${sluice.url}/v1/chat/completions`, body, [`X-Request-Id: ${id}`, `Authorization: Bearer ${test_key}`]);
        assert.ok(expected.body.length > 1000);
        assert.ok(actual.body.equals(expected.body), 'byte-identical bodies');
      });
    });
  }
});
