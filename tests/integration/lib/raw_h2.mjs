// A raw HTTP/2 client (RFC 9113) over node:net or node:tls: it writes exactly
// the frames a test builds -- valid or not -- and parses every frame the
// server sends back, so hostile HTTP/2 can be sent byte for byte and the
// server's GOAWAY / RST_STREAM codes read. No HTTP/2 library sits in the way.
//
//   const c = await h2_connection.connect({ port });          // h2c
//   const c = await h2_connection.connect({ port, tls: { ca } }); // ALPN h2
//   await c.handshake();                     // preface + SETTINGS, server's SETTINGS acked
//   const id = c.request({ method: 'POST', path: '/v1/chat/completions', headers, body });
//   const r = await c.response(id);          // {status, headers, body, rst_code, ...}
//   const g = await c.wait_goaway();         // {last_stream_id, error_code, debug}
//
// Frame builders (frame(), headers_frame(), ...) return Buffers, to be sent
// with c.send(...) in any order and any number; hpack_encode() writes a
// header block (literals without indexing, no Huffman), and the hpack_*
// pieces craft any other block (a bomb: one big entry inserted into the
// dynamic table, then indexed many times). hpack_decoder is a full decoder
// (static and dynamic tables, Huffman), so real servers' answers can be read.
import net from 'node:net';
import tls from 'node:tls';

import { bound_ms } from './harness.mjs';

// ---------------------------------------------------------------------------
// Constants

export const client_preface = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

export const frame_type = {
  DATA: 0x0, HEADERS: 0x1, PRIORITY: 0x2, RST_STREAM: 0x3, SETTINGS: 0x4,
  PUSH_PROMISE: 0x5, PING: 0x6, GOAWAY: 0x7, WINDOW_UPDATE: 0x8, CONTINUATION: 0x9,
};
const type_names = Object.fromEntries(Object.entries(frame_type).map(([k, v]) => [v, k]));

export const flag = { END_STREAM: 0x1, ACK: 0x1, END_HEADERS: 0x4, PADDED: 0x8, PRIORITY: 0x20 };

export const error_code = {
  NO_ERROR: 0x0, PROTOCOL_ERROR: 0x1, INTERNAL_ERROR: 0x2, FLOW_CONTROL_ERROR: 0x3,
  SETTINGS_TIMEOUT: 0x4, STREAM_CLOSED: 0x5, FRAME_SIZE_ERROR: 0x6, REFUSED_STREAM: 0x7,
  CANCEL: 0x8, COMPRESSION_ERROR: 0x9, CONNECT_ERROR: 0xa, ENHANCE_YOUR_CALM: 0xb,
  INADEQUATE_SECURITY: 0xc, HTTP_1_1_REQUIRED: 0xd,
};
const error_names = Object.fromEntries(Object.entries(error_code).map(([k, v]) => [v, k]));
export const error_name = (code) => error_names[code] ?? `0x${Number(code).toString(16)}`;

export const setting = {
  HEADER_TABLE_SIZE: 0x1, ENABLE_PUSH: 0x2, MAX_CONCURRENT_STREAMS: 0x3,
  INITIAL_WINDOW_SIZE: 0x4, MAX_FRAME_SIZE: 0x5, MAX_HEADER_LIST_SIZE: 0x6,
};

// ---------------------------------------------------------------------------
// Frame builders

// A frame: 9-byte header (24-bit length, type, flags, R + 31-bit stream id)
// and the payload as given. `length` overrides the length field (to lie).
export function frame(type, flags, stream_id, payload = Buffer.alloc(0), { length } = {}) {
  const body = Buffer.isBuffer(payload) ? payload : Buffer.from(payload);
  const head = Buffer.alloc(9);
  const len = length ?? body.length;
  head.writeUIntBE(len, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream_id >>> 0, 5);
  return Buffer.concat([head, body]);
}

// entries: [[id, value], ...] or {id: value}.
export function settings_frame(entries = [], { ack = false } = {}) {
  const list = Array.isArray(entries) ? entries : Object.entries(entries).map(([k, v]) => [Number(k), v]);
  const payload = Buffer.alloc(6 * list.length);
  list.forEach(([id, value], i) => { payload.writeUInt16BE(id, 6 * i); payload.writeUInt32BE(value >>> 0, 6 * i + 2); });
  return frame(frame_type.SETTINGS, ack ? flag.ACK : 0, 0, ack ? Buffer.alloc(0) : payload);
}
export const settings_ack = () => settings_frame([], { ack: true });

// HEADERS with a ready header block (Buffer). priority: {depends_on, weight, exclusive}.
export function headers_frame(stream_id, block, { end_stream = false, end_headers = true, priority, pad } = {}) {
  let flags = (end_stream ? flag.END_STREAM : 0) | (end_headers ? flag.END_HEADERS : 0);
  const parts = [];
  if (pad !== undefined) { flags |= flag.PADDED; parts.push(Buffer.from([pad])); }
  if (priority) {
    flags |= flag.PRIORITY;
    const p = Buffer.alloc(5);
    p.writeUInt32BE(((priority.exclusive ? 0x80000000 : 0) | (priority.depends_on ?? 0)) >>> 0, 0);
    p[4] = (priority.weight ?? 16) - 1;
    parts.push(p);
  }
  parts.push(block);
  if (pad !== undefined) parts.push(Buffer.alloc(pad));
  return frame(frame_type.HEADERS, flags, stream_id, Buffer.concat(parts));
}

export function continuation_frame(stream_id, block, { end_headers = true } = {}) {
  return frame(frame_type.CONTINUATION, end_headers ? flag.END_HEADERS : 0, stream_id, block);
}

export function data_frame(stream_id, data, { end_stream = false } = {}) {
  return frame(frame_type.DATA, end_stream ? flag.END_STREAM : 0, stream_id,
    Buffer.isBuffer(data) ? data : Buffer.from(String(data), 'utf8'));
}

export function rst_stream_frame(stream_id, code = error_code.CANCEL) {
  const p = Buffer.alloc(4);
  p.writeUInt32BE(code >>> 0, 0);
  return frame(frame_type.RST_STREAM, 0, stream_id, p);
}

export function ping_frame(opaque = Buffer.alloc(8), { ack = false } = {}) {
  const p = Buffer.alloc(8);
  (Buffer.isBuffer(opaque) ? opaque : Buffer.from(opaque)).copy(p, 0, 0, 8);
  return frame(frame_type.PING, ack ? flag.ACK : 0, 0, p);
}

export function window_update_frame(stream_id, increment) {
  const p = Buffer.alloc(4);
  p.writeUInt32BE(increment & 0x7fffffff, 0);
  return frame(frame_type.WINDOW_UPDATE, 0, stream_id, p);
}

export function priority_frame(stream_id, { depends_on = 0, weight = 16, exclusive = false } = {}) {
  const p = Buffer.alloc(5);
  p.writeUInt32BE(((exclusive ? 0x80000000 : 0) | depends_on) >>> 0, 0);
  p[4] = weight - 1;
  return frame(frame_type.PRIORITY, 0, stream_id, p);
}

export function goaway_frame(last_stream_id, code = error_code.NO_ERROR, debug = '') {
  const d = Buffer.from(debug);
  const p = Buffer.alloc(8 + d.length);
  p.writeUInt32BE(last_stream_id & 0x7fffffff, 0);
  p.writeUInt32BE(code >>> 0, 4);
  d.copy(p, 8);
  return frame(frame_type.GOAWAY, 0, 0, p);
}

// ---------------------------------------------------------------------------
// HPACK (RFC 7541): tables

export const static_table = [
  null,
  [':authority', ''], [':method', 'GET'], [':method', 'POST'], [':path', '/'], [':path', '/index.html'],
  [':scheme', 'http'], [':scheme', 'https'], [':status', '200'], [':status', '204'], [':status', '206'],
  [':status', '304'], [':status', '400'], [':status', '404'], [':status', '500'], ['accept-charset', ''],
  ['accept-encoding', 'gzip, deflate'], ['accept-language', ''], ['accept-ranges', ''], ['accept', ''],
  ['access-control-allow-origin', ''], ['age', ''], ['allow', ''], ['authorization', ''], ['cache-control', ''],
  ['content-disposition', ''], ['content-encoding', ''], ['content-language', ''], ['content-length', ''],
  ['content-location', ''], ['content-range', ''], ['content-type', ''], ['cookie', ''], ['date', ''],
  ['etag', ''], ['expect', ''], ['expires', ''], ['from', ''], ['host', ''], ['if-match', ''],
  ['if-modified-since', ''], ['if-none-match', ''], ['if-range', ''], ['if-unmodified-since', ''],
  ['last-modified', ''], ['link', ''], ['location', ''], ['max-forwards', ''], ['proxy-authenticate', ''],
  ['proxy-authorization', ''], ['range', ''], ['referer', ''], ['refresh', ''], ['retry-after', ''],
  ['server', ''], ['set-cookie', ''], ['strict-transport-security', ''], ['transfer-encoding', ''],
  ['user-agent', ''], ['vary', ''], ['via', ''], ['www-authenticate', ''],
];
const static_name_index = new Map();
for (let i = static_table.length - 1; i >= 1; --i) static_name_index.set(static_table[i][0], i);

// The Huffman code of RFC 7541 Appendix B is canonical: codes are handed
// out in order of (length, symbol). So the table is fully given by each
// symbol's code length; the codes are rebuilt from those below, and the
// build checks that the last code (EOS) is thirty 1 bits.
function huffman_lengths() {
  const len = new Array(257).fill(0);
  const set = (n, syms) => { for (const s of syms) len[typeof s === 'string' ? s.charCodeAt(0) : s] = n; };
  const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);
  set(5, ['0', '1', '2', 'a', 'c', 'e', 'i', 'o', 's', 't']);
  set(6, [' ', '%', '-', '.', '/', ...'3456789', '=', 'A', '_', 'b', 'd', 'f', 'g', 'h', 'l', 'm', 'n', 'p', 'r', 'u']);
  set(7, [':', ...'BCDEFGHIJKLMNOPQRSTUVW', 'Y', 'j', 'k', 'q', 'v', 'w', 'x', 'y', 'z']);
  set(8, ['&', '*', ',', ';', 'X', 'Z']);
  set(10, ['!', '"', '(', ')', '?']);
  set(11, ["'", '+', '|']);
  set(12, ['#', '>']);
  set(13, [0, '$', '@', '[', ']', '~']);
  set(14, ['^', '}']);
  set(15, ['<', '`', '{']);
  set(19, ['\\', 195, 208]);
  set(20, [128, 130, 131, 162, 184, 194, 224, 226]);
  set(21, [153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230]);
  set(22, [129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185, 186, 187, 189,
    190, 196, 198, 228, 232, 233]);
  set(23, [1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166, 168, 174,
    175, 180, 182, 183, 188, 191, 197, 231, 239]);
  set(24, [9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237]);
  set(25, [199, 207, 234, 235]);
  set(26, [192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255]);
  set(27, [203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252, 253, 254]);
  set(28, [...range(2, 8), 11, 12, ...range(14, 21), ...range(23, 31), 127, 220, 249]);
  set(30, [10, 13, 22, 256]);
  return len;
}

// {codes: [{code, bits}] by symbol, decode: Map(bits -> Map(code -> symbol))}
export const huffman = (() => {
  const len = huffman_lengths();
  if (len.some((n) => n === 0)) throw new Error(`huffman table: symbol ${len.indexOf(0)} has no length`);
  const order = len.map((bits, sym) => ({ bits, sym })).sort((a, b) => a.bits - b.bits || a.sym - b.sym);
  const codes = new Array(257);
  const decode = new Map();
  let code = 0;
  let prev = order[0].bits;
  for (const { bits, sym } of order) {
    code <<= bits - prev;
    prev = bits;
    codes[sym] = { code, bits };
    if (!decode.has(bits)) decode.set(bits, new Map());
    decode.get(bits).set(code, sym);
    ++code;
  }
  if (codes[256].bits !== 30 || codes[256].code !== 0x3fffffff) throw new Error('huffman table: EOS is not thirty 1 bits');
  return { codes, decode };
})();

export function huffman_encode(bytes) {
  const out = [];
  let acc = 0n;
  let n = 0;
  for (const b of bytes) {
    const { code, bits } = huffman.codes[b];
    acc = (acc << BigInt(bits)) | BigInt(code);
    n += bits;
    while (n >= 8) { n -= 8; out.push(Number((acc >> BigInt(n)) & 0xffn)); }
    acc &= (1n << BigInt(n)) - 1n;
  }
  if (n > 0) out.push(Number(((acc << BigInt(8 - n)) | ((1n << BigInt(8 - n)) - 1n)) & 0xffn));
  return Buffer.from(out);
}

export function huffman_decode(buf) {
  const out = [];
  let code = 0;
  let bits = 0;
  for (const byte of buf) {
    for (let i = 7; i >= 0; --i) {
      code = (code << 1) | ((byte >> i) & 1);
      ++bits;
      const sym = huffman.decode.get(bits)?.get(code);
      if (sym !== undefined) {
        if (sym === 256) throw new Error('hpack: EOS inside a Huffman string');
        out.push(sym);
        code = 0;
        bits = 0;
      } else if (bits > 30) {
        throw new Error('hpack: invalid Huffman code');
      }
    }
  }
  // What is left must be padding: fewer than 8 bits, all ones (an EOS prefix).
  if (bits >= 8 || code !== (1 << bits) - 1) throw new Error('hpack: bad Huffman padding');
  return Buffer.from(out);
}

// ---------------------------------------------------------------------------
// HPACK: primitives and encoder

// An integer with an N-bit prefix; `first` holds the pattern bits above it.
export function hpack_int(value, prefix_bits, first = 0) {
  const max = (1 << prefix_bits) - 1;
  if (value < max) return Buffer.from([first | value]);
  const out = [first | max];
  let v = value - max;
  while (v >= 128) { out.push((v % 128) + 128); v = Math.floor(v / 128); }
  out.push(v);
  return Buffer.from(out);
}

export function hpack_string(s, { huffman: use_huffman = false } = {}) {
  const raw = Buffer.isBuffer(s) ? s : Buffer.from(String(s), 'latin1');
  const bytes = use_huffman ? huffman_encode(raw) : raw;
  return Buffer.concat([hpack_int(bytes.length, 7, use_huffman ? 0x80 : 0), bytes]);
}

// One field, indexed (static 1..61, dynamic 62..).
export const hpack_indexed = (index) => hpack_int(index, 7, 0x80);

// A literal. kind: 'without' (0000), 'never' (0001), 'incremental' (01: the
// entry goes into the dynamic table). The name is referenced from the
// static table when it is there (name_index: false writes it literally).
export function hpack_literal(name, value, { kind = 'without', name_index, huffman: h = false } = {}) {
  const [prefix, first] = kind === 'incremental' ? [6, 0x40] : kind === 'never' ? [4, 0x10] : [4, 0x00];
  const idx = name_index === false ? 0 : (name_index ?? static_name_index.get(name) ?? 0);
  const parts = [hpack_int(idx, prefix, first)];
  if (idx === 0) parts.push(hpack_string(name, { huffman: h }));
  parts.push(hpack_string(value, { huffman: h }));
  return Buffer.concat(parts);
}

export const hpack_table_size_update = (size) => hpack_int(size, 5, 0x20);

// A whole header block: [[name, value], ...] as literals without indexing.
export function hpack_encode(fields, options = {}) {
  return Buffer.concat(fields.map(([n, v]) => hpack_literal(n, v, options)));
}

// ---------------------------------------------------------------------------
// HPACK: decoder

export class hpack_decoder {
  constructor({ max_table_size = 4096 } = {}) {
    this.max_table_size = max_table_size;  // what we allowed (SETTINGS_HEADER_TABLE_SIZE)
    this.table_size_limit = max_table_size;
    this.dynamic = [];  // newest first
    this.size = 0;
  }

  _evict() {
    while (this.size > this.table_size_limit && this.dynamic.length > 0) {
      const [n, v] = this.dynamic.pop();
      this.size -= n.length + v.length + 32;
    }
  }

  _insert(name, value) {
    this.dynamic.unshift([name, value]);
    this.size += name.length + value.length + 32;
    this._evict();
  }

  entry(index) {
    if (index >= 1 && index < static_table.length) return static_table[index];
    const d = this.dynamic[index - static_table.length];
    if (!d) throw new Error(`hpack: index ${index} is not in the tables`);
    return d;
  }

  // A block -> [[name, value], ...] (latin1 strings).
  decode(block) {
    const out = [];
    let pos = 0;
    const int = (prefix_bits) => {
      const max = (1 << prefix_bits) - 1;
      if (pos >= block.length) throw new Error('hpack: truncated integer');
      let v = block[pos++] & max;
      if (v < max) return v;
      let m = 0;
      for (;;) {
        if (pos >= block.length) throw new Error('hpack: truncated integer');
        const b = block[pos++];
        v += (b & 0x7f) * 2 ** m;
        m += 7;
        if ((b & 0x80) === 0) return v;
        if (m > 35) throw new Error('hpack: integer too long');
      }
    };
    const str = () => {
      if (pos >= block.length) throw new Error('hpack: truncated string');
      const h = (block[pos] & 0x80) !== 0;
      const n = int(7);
      if (pos + n > block.length) throw new Error('hpack: string past the block');
      const raw = block.subarray(pos, pos + n);
      pos += n;
      return (h ? huffman_decode(raw) : raw).toString('latin1');
    };
    while (pos < block.length) {
      const b = block[pos];
      if (b & 0x80) {
        const i = int(7);
        if (i === 0) throw new Error('hpack: index 0');
        out.push([...this.entry(i)]);
      } else if (b & 0x40) {
        const i = int(6);
        const name = i === 0 ? str() : this.entry(i)[0];
        const value = str();
        this._insert(name, value);
        out.push([name, value]);
      } else if (b & 0x20) {
        const size = int(5);
        if (size > this.max_table_size) throw new Error(`hpack: table size update ${size} over ${this.max_table_size}`);
        this.table_size_limit = size;
        this._evict();
      } else {
        const i = int(4);
        const name = i === 0 ? str() : this.entry(i)[0];
        out.push([name, str()]);
      }
    }
    return out;
  }
}

// ---------------------------------------------------------------------------
// Frame parsing

// Parses the frames at the front of `buf`: {frames, rest}.
export function parse_frames(buf) {
  const frames = [];
  let pos = 0;
  while (buf.length - pos >= 9) {
    const length = buf.readUIntBE(pos, 3);
    if (buf.length - pos < 9 + length) break;
    const type = buf[pos + 3];
    const flags = buf[pos + 4];
    const stream_id = buf.readUInt32BE(pos + 5) & 0x7fffffff;
    const payload = Buffer.from(buf.subarray(pos + 9, pos + 9 + length));
    frames.push(describe_frame({ type, type_name: type_names[type] ?? `UNKNOWN(${type})`, flags, stream_id, length, payload }));
    pos += 9 + length;
  }
  return { frames, rest: buf.subarray(pos) };
}

// Adds the fields a test reads to a parsed frame.
function describe_frame(f) {
  const p = f.payload;
  const unpad = () => {
    if (!(f.flags & flag.PADDED)) return p;
    const pad = p[0];
    return p.subarray(1, p.length - pad);
  };
  switch (f.type) {
    case frame_type.DATA:
      f.data = unpad();
      f.end_stream = (f.flags & flag.END_STREAM) !== 0;
      break;
    case frame_type.HEADERS: {
      let b = unpad();
      if (f.flags & flag.PRIORITY) b = b.subarray(5);
      f.block = b;
      f.end_stream = (f.flags & flag.END_STREAM) !== 0;
      f.end_headers = (f.flags & flag.END_HEADERS) !== 0;
      break;
    }
    case frame_type.CONTINUATION:
      f.block = p;
      f.end_headers = (f.flags & flag.END_HEADERS) !== 0;
      break;
    case frame_type.RST_STREAM:
      f.error_code = p.length >= 4 ? p.readUInt32BE(0) : null;
      f.error_name = error_name(f.error_code);
      break;
    case frame_type.SETTINGS:
      f.ack = (f.flags & flag.ACK) !== 0;
      f.settings = [];
      for (let i = 0; i + 6 <= p.length; i += 6) f.settings.push([p.readUInt16BE(i), p.readUInt32BE(i + 2)]);
      break;
    case frame_type.PING:
      f.ack = (f.flags & flag.ACK) !== 0;
      f.opaque = p;
      break;
    case frame_type.GOAWAY:
      f.last_stream_id = p.length >= 4 ? p.readUInt32BE(0) & 0x7fffffff : null;
      f.error_code = p.length >= 8 ? p.readUInt32BE(4) : null;
      f.error_name = error_name(f.error_code);
      f.debug = p.subarray(8).toString('latin1');
      break;
    case frame_type.WINDOW_UPDATE:
      f.increment = p.length >= 4 ? p.readUInt32BE(0) & 0x7fffffff : null;
      break;
    default:
      break;
  }
  return f;
}

// ---------------------------------------------------------------------------
// The connection

// Per stream, what came back: {status, headers: [[n, v]], trailers, body
// (Buffer), data_frames, ended (END_STREAM seen), rst_code (null or the
// server's RST_STREAM code), header_blocks}.
function new_stream_record(id) {
  return { id, status: null, headers: null, trailers: null, informational: [], body_parts: [], data_frames: 0,
    ended: false, rst_code: null, get body() { return Buffer.concat(this.body_parts); } };
}

export class h2_connection {
  // Options: auto_settings_ack (ACK the server's SETTINGS), auto_ping_ack
  // (answer the server's PINGs), auto_window_update (give back the window
  // of each DATA frame received, stream and connection), all true by
  // default; a test that wants to stall turns them off.
  constructor(socket, { auto_settings_ack = true, auto_ping_ack = true, auto_window_update = true } = {}) {
    this.socket = socket;
    this.auto_settings_ack = auto_settings_ack;
    this.auto_ping_ack = auto_ping_ack;
    this.auto_window_update = auto_window_update;
    this.frames = [];          // every frame received, in order, with at_ms
    this.streams = new Map();  // id -> stream record
    this.decoder = new hpack_decoder();
    this.decode_error = null;  // a block our decoder could not read
    this.next_stream_id = 1;
    this.closed = false;
    this.closed_at_ms = null;
    this.error = null;         // the socket's error (ECONNRESET, EPIPE), if any
    this.ended = false;        // the server's FIN came (an orderly close, not a reset)
    this.bytes_received = 0;
    this._buf = Buffer.alloc(0);
    this._pending_block = null;  // {stream_id, parts, end_stream} across CONTINUATIONs
    this._waiters = new Set();
    socket.on('data', (d) => this._on_data(d));
    socket.on('error', (err) => { this.error = err; });
    socket.on('end', () => { this.ended = true; });
    socket.on('close', () => {
      this.closed = true;
      this.closed_at_ms = performance.now();
      this._notify();
    });
  }

  // {port, host, tls: null | tls.connect options (ca, servername, ...),
  //  timeout_ms}. With tls, ALPN offers only h2 (unless tls.ALPNProtocols
  //  says otherwise) and `alpn` on the result tells what the server chose.
  static async connect({ port, host = '127.0.0.1', tls: tls_options = null, timeout_ms = bound_ms(5000), ...options } = {}) {
    const socket = tls_options
      ? tls.connect({ port, host, servername: 'localhost', ALPNProtocols: ['h2'], ...tls_options })
      : net.connect({ port, host });
    const ready_event = tls_options ? 'secureConnect' : 'connect';
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => { socket.destroy(); reject(new Error(`no ${ready_event} to ${host}:${port} within ${timeout_ms} ms`)); }, timeout_ms);
      socket.once(ready_event, () => { clearTimeout(timer); resolve(); });
      socket.once('error', (err) => { clearTimeout(timer); reject(err); });
    });
    socket.setNoDelay(true);
    const c = new h2_connection(socket, options);
    c.alpn = tls_options ? socket.alpnProtocol : null;
    return c;
  }

  _notify() {
    for (const w of [...this._waiters]) w();
  }

  _stream(id) {
    if (!this.streams.has(id)) this.streams.set(id, new_stream_record(id));
    return this.streams.get(id);
  }

  _on_data(d) {
    this.bytes_received += d.length;
    this._buf = this._buf.length ? Buffer.concat([this._buf, d]) : d;
    const { frames, rest } = parse_frames(this._buf);
    this._buf = Buffer.from(rest);
    const now = performance.now();
    for (const f of frames) {
      f.at_ms = now;
      this.frames.push(f);
      this._on_frame(f);
    }
    if (frames.length) this._notify();
  }

  _on_frame(f) {
    switch (f.type) {
      case frame_type.SETTINGS:
        if (!f.ack && this.auto_settings_ack) this.write(settings_ack());
        break;
      case frame_type.PING:
        if (!f.ack && this.auto_ping_ack) this.write(ping_frame(f.opaque, { ack: true }));
        break;
      case frame_type.HEADERS:
      case frame_type.PUSH_PROMISE:
        this._pending_block = { stream_id: f.stream_id, parts: [f.block ?? Buffer.alloc(0)], end_stream: f.end_stream, frame: f };
        if (f.type === frame_type.PUSH_PROMISE) this._pending_block.parts = [f.payload.subarray(4)];
        if (f.flags & flag.END_HEADERS) this._finish_block();
        break;
      case frame_type.CONTINUATION:
        if (this._pending_block) {
          this._pending_block.parts.push(f.block);
          if (f.end_headers) this._finish_block();
        }
        break;
      case frame_type.DATA: {
        const s = this._stream(f.stream_id);
        s.body_parts.push(f.data);
        s.data_frames += 1;
        if (f.end_stream) s.ended = true;
        if (this.auto_window_update && f.length > 0 && !this.closed) {
          const updates = [window_update_frame(0, f.length)];
          if (!f.end_stream) updates.push(window_update_frame(f.stream_id, f.length));
          this.write(Buffer.concat(updates));
        }
        break;
      }
      case frame_type.RST_STREAM:
        this._stream(f.stream_id).rst_code = f.error_code;
        break;
      default:
        break;
    }
  }

  _finish_block() {
    const { stream_id, parts, end_stream, frame: f } = this._pending_block;
    this._pending_block = null;
    let fields;
    try {
      fields = this.decoder.decode(Buffer.concat(parts));
    } catch (err) {
      this.decode_error = err;
      return;
    }
    f.fields = fields;
    if (f.type === frame_type.PUSH_PROMISE) return;
    const s = this._stream(stream_id);
    const status = fields.find(([n]) => n === ':status');
    if (status && Number(status[1]) >= 100 && Number(status[1]) < 200) {
      s.informational.push(fields);
    } else if (status && s.status === null) {
      s.status = Number(status[1]);
      s.headers = fields;
      f.status = s.status;
    } else {
      s.trailers = fields;
    }
    if (end_stream) s.ended = true;
  }

  // Writes raw bytes (frames, or anything); resolves when the socket took
  // them. Never rejects: a write to a socket the server closed is what many
  // tests expect; `this.error` says so.
  write(bytes) {
    return new Promise((resolve) => {
      if (this.socket.destroyed) return resolve(false);
      this.socket.write(bytes, (err) => resolve(!err));
    });
  }

  // Writes `bytes` again and again, yielding to the event loop between
  // writes (so the client reads meanwhile), until the server's FIN, the
  // close, a failed write or `max` writes. Resolves with the count.
  async write_while_open(bytes, { max = 4000 } = {}) {
    let writes = 0;
    while (!this.ended && !this.closed && writes < max) {
      if (!await this.write(bytes)) break;
      ++writes;
      await new Promise((resolve) => setImmediate(resolve));
    }
    return writes;
  }

  send(...buffers) {
    return this.write(Buffer.concat(buffers.flat()));
  }

  // The client preface and our SETTINGS (entries as settings_frame takes).
  preface(settings = []) {
    return this.send(client_preface, settings_frame(settings));
  }

  // Preface + SETTINGS, then waits for the server's SETTINGS (acked by
  // auto_settings_ack). Resolves with the server's settings {id: value}.
  async handshake({ settings = [], timeout_ms = bound_ms(5000) } = {}) {
    await this.preface(settings);
    const f = await this.wait_frame((x) => x.type === frame_type.SETTINGS && !x.ack, { timeout_ms, what: "the server's SETTINGS" });
    this.server_settings = Object.fromEntries(f.settings);
    return this.server_settings;
  }

  // The header block of a request (literal, no indexing, no Huffman).
  // headers: [[name, value], ...] or {name: value}.
  request_block({ method = 'GET', path = '/', scheme = 'http', authority = '127.0.0.1', headers = [] } = {}) {
    const regular = Array.isArray(headers) ? headers : Object.entries(headers);
    return hpack_encode([[':method', method], [':scheme', scheme], [':authority', authority], [':path', path], ...regular]);
  }

  // Sends a request on a new stream (or `stream_id`): HEADERS (END_STREAM
  // when there is no body; CONTINUATIONs after it when the block is over
  // the frame size), then the body as DATA frames of at most 16 KiB.
  // Returns the stream id at once; the frames are being written.
  request({ stream_id, body, end_stream, ...rest } = {}) {
    const id = stream_id ?? this.next_stream_id;
    if (id >= this.next_stream_id) this.next_stream_id = id + 2;
    const payload = body === undefined ? null : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    // A block over the frame size limit (16 KiB unless the server said
    // more) goes out as HEADERS + CONTINUATIONs.
    const max = this.server_settings?.[setting.MAX_FRAME_SIZE] ?? 16384;
    const block = this.request_block(rest);
    const pieces = [];
    for (let off = 0; off < block.length || off === 0; off += max) {
      pieces.push(block.subarray(off, off + max));
      if (off + max >= block.length) break;
    }
    const out = [headers_frame(id, pieces[0], { end_stream: end_stream ?? payload === null, end_headers: pieces.length === 1 }),
      ...pieces.slice(1).map((p, i) => continuation_frame(id, p, { end_headers: i === pieces.length - 2 }))];
    if (payload !== null) {
      for (let off = 0; off < payload.length || off === 0; off += 16384) {
        const piece = payload.subarray(off, off + 16384);
        const last = off + 16384 >= payload.length;
        out.push(data_frame(id, piece, { end_stream: last && end_stream !== false }));
        if (last) break;
      }
    }
    this._stream(id);
    this.write(Buffer.concat(out));
    return id;
  }

  stream(id) {
    return this._stream(id);
  }

  // Resolves with the first frame (index >= from) matching `pred`; rejects
  // after the bound, or when the connection closes first (unless
  // allow_close, which then resolves null).
  wait_frame(pred, { from = 0, timeout_ms = bound_ms(5000), what = 'a frame', allow_close = false } = {}) {
    return new Promise((resolve, reject) => {
      let next = from;
      const finish = (fn, v) => { clearTimeout(timer); this._waiters.delete(check); fn(v); };
      const check = () => {
        for (; next < this.frames.length; ++next) if (pred(this.frames[next])) return finish(resolve, this.frames[next]);
        if (this.closed) {
          if (allow_close) return finish(resolve, null);
          return finish(reject, new Error(`connection closed before ${what}; frames: ${this.summary()}`));
        }
      };
      const timer = setTimeout(() => finish(reject, new Error(`no ${what} within ${timeout_ms} ms; frames: ${this.summary()}`)), timeout_ms);
      this._waiters.add(check);
      check();
    });
  }

  // Resolves once `cond()` holds (checked at every frame and at close).
  wait_until(cond, { timeout_ms = bound_ms(5000), what = 'a condition' } = {}) {
    return new Promise((resolve, reject) => {
      const finish = (fn, v) => { clearTimeout(timer); this._waiters.delete(check); fn(v); };
      const check = () => {
        let v;
        try { v = cond(); } catch (err) { return finish(reject, err); }
        if (v) return finish(resolve, v);
        if (this.closed) return finish(reject, new Error(`connection closed before ${what}; frames: ${this.summary()}`));
      };
      const timer = setTimeout(() => finish(reject, new Error(`no ${what} within ${timeout_ms} ms; frames: ${this.summary()}`)), timeout_ms);
      this._waiters.add(check);
      check();
    });
  }

  // The server's GOAWAY: {last_stream_id, error_code, error_name, debug}.
  wait_goaway(options = {}) {
    return this.wait_frame((f) => f.type === frame_type.GOAWAY, { what: 'a GOAWAY', ...options });
  }

  goaways() {
    return this.frames.filter((f) => f.type === frame_type.GOAWAY);
  }

  // Resolves true when the server closed the connection within the bound,
  // false otherwise (no rejection: the caller asserts).
  wait_closed({ timeout_ms = bound_ms(5000) } = {}) {
    return new Promise((resolve) => {
      const finish = (v) => { clearTimeout(timer); this._waiters.delete(check); resolve(v); };
      const check = () => { if (this.closed) finish(true); };
      const timer = setTimeout(() => finish(false), timeout_ms);
      this._waiters.add(check);
      check();
    });
  }

  // Waits until stream `id` is over: END_STREAM received, or RST_STREAM, or
  // the connection closed or sent GOAWAY not covering it. Resolves with the
  // record ({status, headers, body, rst_code, ended, ...}).
  async response(id, { timeout_ms = bound_ms(10000) } = {}) {
    const s = this._stream(id);
    await this.wait_until(() => s.ended || s.rst_code !== null || this.closed ||
      this.goaways().some((g) => g.last_stream_id < id || g.error_code !== error_code.NO_ERROR), { timeout_ms, what: `the end of stream ${id}` })
      .catch((err) => { if (!this.closed) throw err; });
    return s;
  }

  // Frames received, one short word each, for failure messages.
  summary() {
    const words = this.frames.slice(-40).map((f) => {
      const extra = f.type === frame_type.GOAWAY ? `(last=${f.last_stream_id},${f.error_name})`
        : f.type === frame_type.RST_STREAM ? `(${f.error_name})`
          : f.status !== undefined ? `(:status ${f.status})` : '';
      return `${f.type_name}[${f.stream_id}${f.flags ? `,0x${f.flags.toString(16)}` : ''}]${extra}`;
    });
    const skipped = this.frames.length > 40 ? `(${this.frames.length - 40} earlier) ` : '';
    return `${skipped}${words.join(' ') || '(none)'}${this.closed ? ' <closed>' : ''}${this.error ? ` <${this.error.code ?? this.error.message}>` : ''}`;
  }

  pause() { this.socket.pause(); }
  resume() { this.socket.resume(); }

  destroy() {
    this.socket.destroy();
  }
}

// One request on a fresh connection, answered whole: {status, headers,
// body (Buffer), text, rst_code, conn}. The connection is closed after
// unless keep_open.
export async function h2_request({ port, tls: tls_options, timeout_ms = bound_ms(10000), keep_open = false, ...request }) {
  const conn = await h2_connection.connect({ port, tls: tls_options });
  try {
    await conn.handshake();
    const id = conn.request(request);
    const s = await conn.response(id, { timeout_ms });
    return { status: s.status, headers: s.headers, body: s.body, text: s.body.toString('utf8'), rst_code: s.rst_code, ended: s.ended, conn };
  } finally {
    if (!keep_open) conn.destroy();
  }
}

// The value of a field in a decoded list.
export function field(fields, name) {
  return fields?.find(([n]) => n === name)?.[1];
}
