// A backend whose every answer the test writes itself, byte by byte and in
// steps it controls: for framing mock-vllm never produces (a read that ends
// between an event's blank line and its chunk's CRLF, a chunked 204, a body
// of several MiB). Requests on one connection are answered in order.
//
// sluice's own health probes (GET /health, user-agent sluice-health, every
// [health] interval_ms) are answered here with a bodiless 200 and counted in
// `probes`, never handed to `answer` nor kept in `requests`: a script that
// holds its answer until the client has seen part of it must not have that
// hold taken over by a probe arriving meanwhile, and a count of the
// requests clients caused must not move with the probe clock.
import net from 'node:net';

// `answer(socket, request)`: writes the reply (async; the next request on
// the connection waits for it). request: {head (text), body (parsed JSON or
// null)}. Resolves {url, port, requests, probes, stop()}.
export async function start_scripted_backend(answer) {
  const sockets = new Set();
  const requests = [];
  const probes = [];
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let buf = Buffer.alloc(0);
    let busy = false;
    socket.on('data', async (data) => {
      buf = Buffer.concat([buf, data]);
      while (!busy) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buf.subarray(0, end).toString('latin1');
        const m = /\r\ncontent-length:[ \t]*(\d+)/i.exec(head);
        const length = m ? Number(m[1]) : 0;
        if (buf.length < end + 4 + length) return;
        const text = buf.subarray(end + 4, end + 4 + length).toString('utf8');
        buf = buf.subarray(end + 4 + length);
        const request = { head, body: text.length > 0 ? JSON.parse(text) : null };
        if (/^GET \/health HTTP\/1\.1\r\n/.test(head) && /\r\nuser-agent: sluice-health\r\n/i.test(`${head}\r\n`)) {
          probes.push(request);
          socket.end('HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
          return;
        }
        requests.push(request);
        busy = true;
        try {
          await answer(socket, request);
        } catch {
          socket.destroy();
          return;
        } finally {
          busy = false;
        }
      }
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    probes,
    async stop() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

// The bytes of one HTTP chunk holding `payload`.
export function chunk(payload) {
  const b = Buffer.from(payload);
  return Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from('\r\n')]);
}

// vLLM's streaming head, chunked, keep-alive.
export const sse_head = 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n';

// vLLM's chat.completion.chunk events for `tokens` content deltas, the
// finish chunk, the usage-only chunk and [DONE], as SSE payloads.
export function chat_stream_events({ model = 'mock-model', tokens = 3, prompt_tokens = 7 } = {}) {
  const base = { id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 1700000000, model };
  const events = [JSON.stringify({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] })];
  for (let i = 0; i < tokens; ++i) {
    events.push(JSON.stringify({ ...base, choices: [{ index: 0, delta: { content: `${i ? ' ' : ''}tok${i}` }, logprobs: null, finish_reason: null }] }));
  }
  events.push(JSON.stringify({ ...base, choices: [{ index: 0, delta: { content: '' }, logprobs: null, finish_reason: 'stop', stop_reason: null }] }));
  events.push(JSON.stringify({ ...base, choices: [], usage: { prompt_tokens, total_tokens: prompt_tokens + tokens, completion_tokens: tokens } }));
  events.push('[DONE]');
  return events.map((e) => `data: ${e}\n\n`);
}

// vLLM's whole streamed answer (chat_stream_events), head to terminal
// chunk, one event per chunk: what a well-behaved backend writes.
export function chat_stream_reply(options = {}) {
  return sse_head + chat_stream_events(options).map((e) => chunk(e).toString('latin1')).join('') + '0\r\n\r\n';
}
