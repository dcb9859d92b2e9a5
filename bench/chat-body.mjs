// The chat request bench clients send: the same bytes as wrk/chat.lua's
// (a system prompt and a user turn, ~600 B, as a chat UI sends), so that
// every workload makes the gateway parse and validate the same body.
//
//   node bench/chat-body.mjs [--stream] [--max-tokens N] > body.json
//     (h2load -d reads the body from a file)

export function chat_body({ stream = false, max_tokens = 16, model = 'mock-model' } = {}) {
  let body =
    `{"model":"${model}",` +
    '"messages":[' +
    '{"role":"system","content":"You are a concise assistant. Answer in plain ' +
    'English, cite no sources, and keep every answer under a hundred words ' +
    'unless the user asks for more detail."},' +
    '{"role":"user","content":"Explain in two or three sentences why a ' +
    'reverse proxy in front of an inference server should stream tokens to ' +
    'the client as soon as they arrive instead of buffering the whole reply, ' +
    'and what a client sees when it does buffer."}' +
    '],' +
    `"max_tokens":${max_tokens},` +
    '"temperature":0.7';
  if (stream) body += ',"stream":true';
  return body + '}';
}

// The request head and body as raw HTTP/1.1 bytes (for clients on node:net).
export function chat_request(host_port, { key = 'test-key', ...opts } = {}) {
  const body = chat_body(opts);
  return (
    'POST /v1/chat/completions HTTP/1.1\r\n' +
    `Host: ${host_port}\r\n` +
    `Authorization: Bearer ${key}\r\n` +
    'Content-Type: application/json\r\n' +
    'Accept: application/json\r\n' +
    `Content-Length: ${Buffer.byteLength(body)}\r\n` +
    '\r\n' +
    body
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const at = args.indexOf('--max-tokens');
  process.stdout.write(chat_body({
    stream: args.includes('--stream'),
    max_tokens: at >= 0 ? Number(args[at + 1]) : 16,
  }));
}
