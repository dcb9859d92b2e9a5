// The pure parts of the HTTP/1.1 wire work (wire.hpp).
#include "wire.hpp"

#include "sluice/openai/error.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "sluice/core/text.hpp"
#include "sluice/http/chunked.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::proxy {

// Both switch on the length first: a request's dozen fields each cost one
// compare or two, not one per name in the list (the list walk was ~0.1 µs
// a request).
bool drop_request_header(std::string_view n) noexcept {
  switch (n.size()) {
    case 2: return iequals(n, "te");
    case 4: return iequals(n, "host");
    case 6: return iequals(n, "expect");
    case 7: return iequals(n, "trailer") || iequals(n, "upgrade");
    case 9: return iequals(n, "x-api-key");  // the client's key (Anthropic's SDK): never a backend's
    case 10: return iequals(n, "connection") || iequals(n, "keep-alive");
    case 12: return iequals(n, "x-request-id");
    case 13: return iequals(n, "authorization");
    case 14: return iequals(n, "content-length") || iequals(n, "http2-settings");
    case 15: return iequals(n, "x-forwarded-for");
    case 16: return iequals(n, "proxy-connection");
    case 17: return iequals(n, "transfer-encoding");
    case 19: return iequals(n, "proxy-authorization");
    default: return false;
  }
}

bool drop_response_header(std::string_view n) noexcept {
  switch (n.size()) {
    case 2: return iequals(n, "te");
    case 7: return iequals(n, "trailer") || iequals(n, "upgrade");
    case 10: return iequals(n, "connection") || iequals(n, "keep-alive");
    case 12: return iequals(n, "x-request-id");
    case 16: return iequals(n, "proxy-connection");
    default: return false;
  }
}

bool named_in_connection(std::string_view connection, std::string_view name) noexcept {
  while (!connection.empty()) {
    size_t comma = connection.find(',');
    std::string_view tok = connection.substr(0, comma);
    while (!tok.empty() && (tok.front() == ' ' || tok.front() == '\t')) tok.remove_prefix(1);
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t')) tok.remove_suffix(1);
    if (iequals(tok, name)) return true;
    if (comma == std::string_view::npos) break;
    connection.remove_prefix(comma + 1);
  }
  return false;
}

// Finds the HTTP chunk that carries the usage-only SSE event sluice asked
// for, in whole chunks [p, p + n): "<hex>\r\ndata: {...\"choices\":[]...
// \"usage\":{...}}\n\n\r\n" (vLLM writes one event per chunk). Every part
// is checked -- the size line against the event's length -- so a shape it
// does not know is left alone rather than cut wrong.
// Returns: whether [begin, end) is that chunk.
// `from`: where to start looking (the usage event's own offset when the
// scan saw it in place: the search is then a few hundred bytes, not the
// whole batch).
bool find_usage_chunk(const char* p, size_t n, size_t from, size_t& begin, size_t& end) noexcept {
  const std::string_view all(p, n);
  constexpr std::string_view k_usage = "\"usage\":{";
  // find_bytes, not string_view::find: the latter calls memchr once per
  // '"' of the JSON before it (thousands in a 40 KB batch).
  auto next = [&](size_t at) -> size_t {
    if (at >= n) return std::string_view::npos;
    const char* hit = find_bytes(p + at, n - at, k_usage);
    return hit == nullptr ? std::string_view::npos : static_cast<size_t>(hit - p);
  };
  // rfind_bytes and find_bytes, not string_view's rfind and find: those
  // compare at every place (a call each) or call memchr per '"'.
  constexpr std::string_view k_data = "data:";
  for (size_t u = next(from); u != std::string_view::npos; u = next(u + 1)) {
    const char* ev_at = rfind_bytes(p, std::min(u + k_data.size(), n), k_data);  // the last one starting at or before u
    if (ev_at == nullptr) continue;
    const auto ev = static_cast<size_t>(ev_at - p);
    if (ev < 2 || all[ev - 1] != '\n' || all[ev - 2] != '\r') continue;
    size_t h = ev - 2;  // the size line ends here: at most 16 digits before it
    while (h > 0 && ev - 2 - h < 17 && std::isxdigit(static_cast<unsigned char>(all[h - 1])) != 0) --h;
    if (h == ev - 2 || (h != 0 && all[h - 1] != '\n')) continue;
    const char* ev_end_at = find_bytes(p + u, n - u, "\n\n");
    if (ev_end_at == nullptr) continue;
    const auto ev_end = static_cast<size_t>(ev_end_at - p);
    if (ev_end + 4 > n || all.substr(ev_end + 2, 2) != "\r\n") continue;
    const size_t payload = ev_end + 2 - ev;
    size_t line = h;
    uint64_t size = 0;
    if (!http::read_chunk_size_line(p, n, line, size) || line != ev || size != payload) continue;
    if (find_bytes(p + ev, ev_end - ev, "\"choices\":[]") == nullptr) continue;
    begin = h;
    end = ev_end + 4;
    return true;
  }
  return false;
}

size_t dechunk(const char* p, size_t n, char* out, bool& last) noexcept {
  last = false;
  // The size-line reader the h2 session counts with: bounded whatever the
  // bytes are (a malformed line ends the copy; a cut chunk gives its data
  // so far).
  size_t w = 0;
  size_t i = 0;
  uint64_t size = 0;
  while (i < n && http::read_chunk_size_line(p, n, i, size)) {
    if (size == 0) {
      last = true;
      break;
    }
    if (size > n - i) size = n - i;  // a cut chunk: its data so far (n - i never wraps)
    std::memcpy(out + w, p + i, static_cast<size_t>(size));
    w += static_cast<size_t>(size);
    if (n - i - size < 2) break;
    i += static_cast<size_t>(size) + 2;  // the data's CRLF
  }
  return w;
}

namespace {

// The end of the line starting at i (the index of its CR or LF), or n.
size_t line_end(const char* p, size_t n, size_t i) noexcept {
  while (i < n && p[i] != '\n' && p[i] != '\r') ++i;
  return i;
}

// Past the line end at i: CRLF, LF or CR.
size_t after_eol(const char* p, size_t n, size_t i) noexcept {
  if (i < n && p[i] == '\r') return i + 1 < n && p[i + 1] == '\n' ? i + 2 : i + 1;
  return i + 1;
}

}  // namespace

size_t drop_usage_events(const char* p, size_t n, char* out, uint32_t& cut) noexcept {
  size_t w = 0, event = 0, i = 0;
  uint32_t data_lines = 0;
  std::string_view data;
  while (i < n) {
    const size_t e = line_end(p, n, i);
    if (e == n) break;  // an unfinished line: the tail
    if (e == i) {
      // A blank line ends the event [event, past it).
      const size_t end = after_eol(p, n, e);
      const bool usage_only = data_lines == 1 && openai::scan_stream_event(data).usage_only;
      if (usage_only) {
        ++cut;
      } else {
        std::memcpy(out + w, p + event, end - event);
        w += end - event;
      }
      event = i = end;
      data_lines = 0;
      data = {};
      continue;
    }
    const std::string_view line(p + i, e - i);
    if (line.starts_with("data:")) {
      ++data_lines;
      data = line.substr(5);
      if (!data.empty() && data.front() == ' ') data.remove_prefix(1);
    }
    i = after_eol(p, n, e);
  }
  std::memcpy(out + w, p + event, n - event);
  return w + (n - event);
}

namespace {

// The value of the top-level member `name` of the JSON object that `d`
// begins (maybe cut short): walks members, skipping values structurally.
// Returns: the offset of its value's first byte; npos when the object has
// no such member; `cut` when the prefix ends before that is known.
constexpr size_t k_cut = std::string_view::npos - 1;
size_t find_top_member(std::string_view d, std::string_view name) noexcept {
  size_t i = 0;
  const size_t n = d.size();
  auto ws = [&] {
    while (i < n && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r')) ++i;
  };
  auto skip_string = [&]() -> bool {  // past the string whose quote is at i; false if cut
    for (++i; i < n; ++i) {
      if (d[i] == '\\') {
        ++i;
      } else if (d[i] == '"') {
        ++i;
        return true;
      }
    }
    return false;
  };
  ws();
  if (i == n) return k_cut;
  if (d[i] != '{') return std::string_view::npos;
  ++i;
  for (;;) {
    ws();
    if (i == n) return k_cut;
    if (d[i] != '"') return std::string_view::npos;  // '}' (no such member) or not JSON
    const size_t key_at = i + 1;
    if (!skip_string()) return k_cut;
    const std::string_view key = d.substr(key_at, i - 1 - key_at);
    ws();
    if (i == n) return k_cut;
    if (d[i] != ':') return std::string_view::npos;
    ++i;
    ws();
    if (i == n) return k_cut;
    if (key == name) return i;
    uint32_t depth = 0;
    for (;;) {
      if (i == n) return k_cut;
      const char c = d[i];
      if (c == '"') {
        if (!skip_string()) return k_cut;
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (depth == 0) return std::string_view::npos;  // the object ended
        --depth;
      } else if (c == ',' && depth == 0) {
        ++i;
        break;
      }
      ++i;
    }
  }
}

}  // namespace

prefix_verdict classify_event_prefix(std::string_view d) noexcept {
  size_t i = find_top_member(d, "choices");
  if (i == k_cut) return prefix_verdict::unknown;
  if (i == std::string_view::npos || d[i] != '[') return prefix_verdict::other;
  ++i;
  while (i < d.size() && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r')) ++i;
  if (i == d.size()) return prefix_verdict::unknown;
  return d[i] == ']' ? prefix_verdict::usage_only : prefix_verdict::other;
}

std::string_view usage_object_in_prefix(std::string_view d) noexcept {
  const size_t at = find_top_member(d, "usage");
  if (at >= k_cut || d[at] != '{') return {};
  // Its end: the brace that closes it, strings walked.
  uint32_t depth = 0;
  for (size_t i = at; i < d.size(); ++i) {
    const char c = d[i];
    if (c == '"') {
      for (++i; i < d.size() && d[i] != '"'; ++i) {
        if (d[i] == '\\') ++i;
      }
      continue;
    }
    if (c == '{' || c == '[') ++depth;
    if ((c == '}' || c == ']') && --depth == 0) return d.substr(at, i + 1 - at);
  }
  return {};
}

size_t dechunk_cursor::feed(const char* p, size_t n, char* out, bool& last) noexcept {
  size_t i = 0, w = 0;
  last = _at == at::done;
  while (i < n && _at != at::done) {
    switch (_at) {
      case at::size: {
        const uint8_t v = k_hex_value[static_cast<unsigned char>(p[i])];
        if (v < 16 && _digits < 16) {
          _size = _size << 4 | v;
          ++_digits;
          ++i;
        } else {
          _at = at::ext;  // extensions, the CR: to the LF
        }
        break;
      }
      case at::ext:
        if (p[i++] == '\n') {
          _digits = 0;
          if (_size == 0) {
            _at = at::done;
            last = true;
          } else {
            _at = at::data;
          }
        }
        break;
      case at::data: {
        const size_t k = _size < n - i ? static_cast<size_t>(_size) : n - i;
        std::memcpy(out + w, p + i, k);
        w += k;
        i += k;
        _size -= k;
        if (_size == 0) {
          _at = at::data_end;
          _end_left = 2;
        }
        break;
      }
      case at::data_end:
        ++i;
        if (--_end_left == 0) _at = at::size;
        break;
      case at::done:
        break;
    }
  }
  return w;
}

size_t usage_event_filter::decide(char* out, bool ended) noexcept {
  // The first data line's value, as far as it is held.
  const std::string_view held(_hold, _held);
  prefix_verdict v = prefix_verdict::unknown;
  size_t at = 0;
  while (at < held.size()) {
    size_t e = at;
    while (e < held.size() && held[e] != '\n' && held[e] != '\r') ++e;
    const std::string_view line = held.substr(at, e - at);
    if (line.starts_with("data:")) {
      std::string_view value = line.substr(5);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      const bool line_ended = e < held.size();
      constexpr std::string_view k_done = "[DONE]";
      v = classify_event_prefix(value);
      if (!line_ended && k_done.starts_with(value)) v = prefix_verdict::unknown;  // maybe [DONE]: wait
      // A value cut by its line's end is all there is of it.
      if (v == prefix_verdict::unknown && line_ended) v = prefix_verdict::other;
      _is_done = line_ended && value == k_done;
      break;
    }
    if (e == held.size()) break;
    at = e + 1;
  }
  if (v == prefix_verdict::unknown && !ended && _held < k_hold_bytes_max) return 0;  // not yet
  size_t w = 0;
  if (v == prefix_verdict::usage_only && _drop_usage) {
    ++_dropped;
    _mode = mode::drop;
  } else {
    std::memcpy(out, _hold, _held);
    w = _held;
    _mode = mode::keep;
  }
  _held = 0;
  return w;
}

size_t usage_event_filter::feed(const char* p, size_t n, char* out) noexcept {
  size_t w = 0;
  if (_closed) return 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = p[i];
    // Line ends are CR, LF or CRLF; a line end right after another (an
    // empty line) ends the event.
    const bool crlf_tail = c == '\n' && _after_cr;
    if (_mode == mode::between) {
      if (crlf_tail) {  // the LF of the CRLF that ended the last event: its byte
        _after_cr = false;
        if (_last_kept) out[w++] = c;
        continue;
      }
      if (_done) {  // after [DONE] (and its CRLF's LF): nothing more, however the rest is cut
        _closed = true;
        return w;
      }
      _mode = mode::holding;
      _is_done = false;
    }
    bool event_end = false;
    if (crlf_tail) {
      _after_cr = false;
    } else if (c == '\n' || c == '\r') {
      event_end = _line_empty;
      _line_empty = true;
      _after_cr = c == '\r';
    } else {
      _line_empty = false;
      _after_cr = false;
    }
    switch (_mode) {
      case mode::holding:
        _hold[_held++] = c;
        // Looked at again at each line end and every 1 KiB (a decision
        // needs the first data line's value up to "choices").
        if (event_end || _held == k_hold_bytes_max || c == '\n' || c == '\r' || _held % 1024 == 0) {
          w += decide(out + w, event_end);
        }
        break;
      case mode::keep:
        out[w++] = c;
        break;
      case mode::drop:
      case mode::between:
        break;
    }
    if (event_end) {
      _last_kept = _mode == mode::keep;
      _done = _done || (_last_kept && _is_done);
      _mode = mode::between;
    }
  }
  return w;
}

namespace {
constexpr std::string_view k_translated_stream_fields =
    "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n";
}  // namespace

http::response_head translated_stream_head() noexcept {
  http::response_head h;
  h.status = 200;
  h.reason = "OK";
  h.keep_alive = true;
  h.chunked = true;
  h.event_stream = true;
  h.content_type = "text/event-stream; charset=utf-8";
  h.header_count = 2;
  h.field_lines = k_translated_stream_fields;
  h.head_bytes = static_cast<uint32_t>(k_translated_stream_fields.size() + 32);
  return h;
}

iovec frame_translated_batch(byte_buf& f, bool dechunk, bool end_client) noexcept {
  const uint32_t payload = f.len - k_batch_room;
  if (dechunk) return {f.data + k_batch_room, payload};
  char size_line[32];  // 16 hex digits and CRLF fit the room (8 do for a 32-bit length)
  text_writer w(size_line, k_batch_room);
  w.put_hex_min(payload);
  w.put("\r\n");
  const size_t sl = static_cast<size_t>(w.p - size_line);
  char* const chunk = f.data + k_batch_room - sl;
  size_t len = 0;
  if (payload != 0) {
    std::memcpy(chunk, size_line, sl);
    std::memcpy(f.data + f.len, "\r\n", 2);
    len = sl + payload + 2;
  }
  char* const begin = payload != 0 ? chunk : f.data + k_batch_room;
  if (end_client) {
    std::memcpy(begin + len, "0\r\n\r\n", 5);
    len += 5;
  }
  return {begin, len};
}

size_t write_local_error(char* out, size_t cap, std::string_view message, std::string_view type,
                         std::string_view param, std::string_view code) noexcept {
  openai::error_fields e;
  e.message = message;
  e.type = type;
  e.param = param;
  e.code = code;
  return openai::write_error_body(out, cap, e);
}

}  // namespace sluice::proxy
