// A raw HTTP/1.1 client over node:net: sends exactly the bytes a test gives
// and parses what comes back by hand, so that malformed requests, pipelining
// and `100 Continue` can be tested byte for byte. No HTTP library sits in the
// way to fix or refuse anything.
import net from 'node:net';

const CRLF_CRLF = Buffer.from('\r\n\r\n');

function header_value(headers, name) {
  const lower = name.toLowerCase();
  const hit = headers.find(([n]) => n.toLowerCase() === lower);
  return hit ? hit[1] : undefined;
}

// Parses one response from the front of `buf`. Returns null when more bytes
// are needed; with at_eof, a partial response is returned with complete=false
// (that is how a truncated stream looks). Returns {response, consumed}.
//   response: {version, status, reason, headers: [[name, value]...],
//              header(name), body: Buffer (de-chunked), raw: Buffer,
//              chunked, terminal_chunk, complete}
export function parse_response(buf, { at_eof = false, head_request = false } = {}) {
  const head_end = buf.indexOf(CRLF_CRLF);
  if (head_end < 0) {
    if (at_eof && buf.length > 0) {
      return { response: { raw: buf, complete: false, status: null, headers: [], header: () => undefined, body: Buffer.alloc(0) }, consumed: buf.length };
    }
    return null;
  }
  const head = buf.subarray(0, head_end).toString('latin1');
  const [status_line, ...header_lines] = head.split('\r\n');
  const m = status_line.match(/^(HTTP\/\d\.\d) (\d{3})(?: (.*))?$/);
  if (!m) throw new Error(`malformed status line: ${JSON.stringify(status_line)}`);
  const headers = header_lines.map((l) => {
    const colon = l.indexOf(':');
    if (colon <= 0) throw new Error(`malformed response header line: ${JSON.stringify(l)}`);
    return [l.slice(0, colon), l.slice(colon + 1).trim()];
  });
  const status = Number(m[2]);
  const response = {
    version: m[1], status, reason: m[3] ?? '', headers,
    header: (name) => header_value(headers, name),
    body: Buffer.alloc(0), chunked: false, terminal_chunk: false, complete: false,
  };
  let pos = head_end + 4;
  const te = response.header('transfer-encoding');
  const cl = response.header('content-length');
  const no_body = head_request || (status >= 100 && status < 200) || status === 204 || status === 304;
  if (no_body) {
    response.complete = true;
  } else if (te !== undefined && /(^|,)\s*chunked\s*$/i.test(te)) {
    response.chunked = true;
    const parts = [];
    for (;;) {
      const line_end = buf.indexOf('\r\n', pos, 'latin1');
      if (line_end < 0) break;
      const size_text = buf.subarray(pos, line_end).toString('latin1').split(';')[0].trim();
      if (!/^[0-9a-fA-F]+$/.test(size_text)) throw new Error(`malformed chunk size: ${JSON.stringify(size_text)}`);
      const size = parseInt(size_text, 16);
      if (size === 0) {
        // Last chunk, then optional trailers, then the empty line.
        const trailer_end = buf.indexOf('\r\n', line_end + 2, 'latin1');
        if (trailer_end < 0) break;
        if (trailer_end === line_end + 2) {
          pos = trailer_end + 2;
        } else {
          const end = buf.indexOf(CRLF_CRLF, line_end + 2);
          if (end < 0) break;
          pos = end + 4;
        }
        response.terminal_chunk = true;
        response.complete = true;
        break;
      }
      if (buf.length < line_end + 2 + size + 2) break;
      parts.push(buf.subarray(line_end + 2, line_end + 2 + size));
      pos = line_end + 2 + size + 2;
    }
    response.body = Buffer.concat(parts);
    if (!response.complete && !at_eof) return null;
    if (!response.complete) pos = buf.length;
  } else if (cl !== undefined) {
    const length = Number(cl);
    if (buf.length - pos < length) {
      if (!at_eof) return null;
      response.body = buf.subarray(pos);
      pos = buf.length;
    } else {
      response.body = buf.subarray(pos, pos + length);
      pos += length;
      response.complete = true;
    }
  } else {
    // Close-delimited body.
    if (!at_eof) return null;
    response.body = buf.subarray(pos);
    pos = buf.length;
    response.complete = true;
  }
  response.raw = buf.subarray(0, pos);
  response.text = () => response.body.toString('utf8');
  response.json = () => JSON.parse(response.body.toString('utf8'));
  return { response, consumed: pos };
}

// One client connection. Responses are parsed as bytes arrive; read_response
// hands them out in order (1xx interim responses included).
export class raw_connection {
  static connect(port, { host = '127.0.0.1', timeout_ms = 5000 } = {}) {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ port, host });
      const timer = setTimeout(() => { socket.destroy(); reject(new Error(`connect to ${host}:${port} timed out`)); }, timeout_ms);
      socket.once('connect', () => { clearTimeout(timer); socket.setNoDelay(true); resolve(new raw_connection(socket)); });
      socket.once('error', (err) => { clearTimeout(timer); reject(err); });
    });
  }

  constructor(socket) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.received = Buffer.alloc(0);   // every byte the server sent
    this.responses = [];               // parsed, not yet handed out
    this.closed = false;               // the server closed (FIN or RST)
    this.reset = false;                // it was an RST
    this.closed_at_ms = null;
    this._waiters = [];
    this._head_requests = 0;
    socket.on('data', (data) => {
      this.received = Buffer.concat([this.received, data]);
      this.buffer = Buffer.concat([this.buffer, data]);
      this._parse(false);
      this._notify();
    });
    socket.on('error', (err) => {
      if (err.code === 'ECONNRESET' || err.code === 'EPIPE') this.reset = true;
      else this.error = err;
    });
    socket.on('close', () => {
      this.closed = true;
      this.closed_at_ms = performance.now();
      this._parse(true);
      this._notify();
    });
    // A half-close from the server must not end our side silently.
    socket.on('end', () => {});
  }

  _parse(at_eof) {
    for (;;) {
      if (this.buffer.length === 0) return;
      let parsed;
      try {
        parsed = parse_response(this.buffer, { at_eof });
      } catch (err) {
        this.error = err;
        return;
      }
      if (!parsed) return;
      this.responses.push(parsed.response);
      this.buffer = this.buffer.subarray(parsed.consumed);
      if (!parsed.response.complete) return;
    }
  }

  _notify() {
    for (const w of [...this._waiters]) w();
  }

  _wait(predicate, timeout_ms, what) {
    return new Promise((resolve, reject) => {
      let timer = null;
      const check = () => {
        if (this.error) return done(reject, this.error);
        let value;
        try {
          value = predicate();
        } catch (err) {
          return done(reject, err);
        }
        if (value !== undefined) return done(resolve, value);
      };
      const done = (fn, v) => {
        clearTimeout(timer);
        this._waiters = this._waiters.filter((w) => w !== check);
        fn(v);
      };
      timer = setTimeout(() => done(reject, new Error(
        `timed out after ${timeout_ms} ms waiting for ${what}; received so far: ${JSON.stringify(this.received.toString('latin1').slice(0, 2000))}`)), timeout_ms);
      this._waiters.push(check);
      check();
    });
  }

  write(bytes) {
    return new Promise((resolve) => {
      if (this.socket.destroyed) return resolve(false);
      // A server that answers and closes early may reset before we finish
      // writing; that is reported through `reset`, not as a throw.
      this.socket.write(typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes, () => resolve(true));
    });
  }

  // The next response (interim 1xx included). On close, a partial response
  // comes back with complete=false; with nothing at all, rejects.
  read_response({ timeout_ms = 5000 } = {}) {
    return this._wait(() => {
      if (this.responses.length > 0) return this.responses.shift();
      if (this.closed) throw new Error(`connection closed with no (further) response; received: ${JSON.stringify(this.received.toString('latin1').slice(0, 2000))}`);
      return undefined;
    }, timeout_ms, 'a response');
  }

  // Resolves true when the server closes within the bound, false otherwise.
  wait_close({ timeout_ms = 2000 } = {}) {
    return this._wait(() => (this.closed ? true : undefined), timeout_ms, 'close').catch(() => this.closed);
  }

  destroy() {
    this.socket.destroy();
  }
}

// Sends `bytes` on a fresh connection and reads `responses` final (non-1xx)
// responses. With until_close, then waits (bounded) for the server to close.
// Returns {responses: [...all, 1xx included], closed, reset, received}.
export async function raw_exchange(port, bytes, { responses = 1, until_close = false, timeout_ms = 5000, close_timeout_ms = 2000 } = {}) {
  const conn = await raw_connection.connect(port);
  try {
    await conn.write(bytes);
    const got = [];
    let finals = 0;
    while (finals < responses) {
      let r;
      try {
        r = await conn.read_response({ timeout_ms });
      } catch (err) {
        if (got.length > 0 && conn.closed) break;
        throw err;
      }
      got.push(r);
      if (!(r.status >= 100 && r.status < 200)) ++finals;
      if (!r.complete) break;
    }
    if (until_close) await conn.wait_close({ timeout_ms: close_timeout_ms });
    return { responses: got, closed: conn.closed, reset: conn.reset, received: conn.received };
  } finally {
    conn.destroy();
  }
}

// Builds request bytes: a request line, headers in order ([name, value] or
// raw strings), and a body. Content-Length is added only when asked
// (content_length: true); everything is sent exactly as given.
export function build_request({ method = 'POST', target = '/v1/chat/completions', version = 'HTTP/1.1', headers = [], body = '', content_length = true }) {
  const lines = [`${method} ${target} ${version}`];
  for (const h of headers) lines.push(Array.isArray(h) ? `${h[0]}: ${h[1]}` : h);
  const body_buf = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  if (content_length) lines.push(`Content-Length: ${body_buf.length}`);
  return Buffer.concat([Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1'), body_buf]);
}
