// bench/compare's check of a reply through a protocol adapter (sluice in
// front of an Anthropic or Triton backend writes the client's SSE bytes
// itself, so its bytes need not equal the pass-through's): reads one chat
// completion body on stdin, streamed (SSE) or not, and prints one line
//
//   REPLY events=N content_bytes=N content=SHA256 finish=REASON done=0|1 ok=0|1
//
// events: "data: " lines ([DONE] included); content: the text of
// choices[0].delta.content concatenated (non-stream: choices[0].message.content);
// done: the last event is "data: [DONE]"; ok: the reply parsed, its content
// is not empty and, when streamed, it ends in [DONE]. Two replies with the
// same events, content_bytes, content and finish hold the same tokens in as
// many events.
import { createHash } from 'node:crypto';

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const body = Buffer.concat(chunks).toString('utf8');

let events = 0;
let content = '';
let finish = '-';
let done = 0;
let parsed = true;
const lines = body.split('\n').map((l) => l.replace(/\r$/, ''));
const data = lines.filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
const stream = data.length > 0;
if (stream) {
  for (const d of data) {
    ++events;
    done = 0;
    if (d === '[DONE]') { done = 1; continue; }
    let j;
    try { j = JSON.parse(d); } catch { parsed = false; continue; }
    const choice = j.choices?.[0];
    if (!choice) continue;           // a usage-only chunk
    if (typeof choice.delta?.content === 'string') content += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
} else {
  try {
    const j = JSON.parse(body);
    const choice = j.choices?.[0];
    if (typeof choice?.message?.content === 'string') content = choice.message.content;
    if (choice?.finish_reason) finish = choice.finish_reason;
  } catch { parsed = false; }
}
const ok = parsed && content.length > 0 && (!stream || done === 1) ? 1 : 0;
const sha = createHash('sha256').update(content).digest('hex').slice(0, 16);
process.stdout.write(`REPLY events=${events} content_bytes=${Buffer.byteLength(content)} content=${sha} ` +
                     `finish=${finish} done=${done} ok=${ok}\n`);
