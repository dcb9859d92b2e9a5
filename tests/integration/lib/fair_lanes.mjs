// Closed-loop chat lanes for one key, run as its own process (so a test can
// pin it to a CPU with taskset, and with [server] reuseport_steering its
// connections reach that CPU's shard):
//
//   node fair_lanes.mjs PORT KEY LANES DURATION_MS
//
// Each lane keeps one keep-alive connection and sends its next request when
// its last answer ends, until DURATION_MS. Prints one JSON line:
// {"answers":N,"failed":N}.
import http from 'node:http';

const [port, key, lanes, duration_ms] = process.argv.slice(2);
const end = performance.now() + Number(duration_ms);
const body = JSON.stringify({ model: 'm', max_tokens: 32, messages: [{ role: 'user', content: 'Summarise the report.' }] });
let answers = 0, failed = 0;

function one(agent) {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port: Number(port), method: 'POST', path: '/v1/chat/completions', agent,
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
    req.on('error', () => { ++failed; resolve(); });
    req.on('response', (res) => {
      res.resume();
      res.on('end', () => { if (res.statusCode === 200) ++answers; else ++failed; resolve(); });
    });
    req.end(body);
  });
}

await Promise.all(Array.from({ length: Number(lanes) }, async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  while (performance.now() < end) await one(agent);
  agent.destroy();
}));
console.log(JSON.stringify({ answers, failed }));
