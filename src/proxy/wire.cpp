// The pure parts of the HTTP/1.1 wire work (wire.hpp).
#include "wire.hpp"

#include "sluice/openai/error.hpp"

#include <cctype>
#include <cstring>

#include "sluice/core/text.hpp"
#include "sluice/http/chunked.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::proxy {

bool drop_request_header(std::string_view name) noexcept {
  static constexpr std::string_view k_drop[] = {
      "host",          "authorization",   "content-length", "transfer-encoding", "expect",
      "connection",    "keep-alive",      "proxy-connection", "te",              "trailer",
      "upgrade",       "proxy-authorization", "http2-settings", "x-request-id",  "x-forwarded-for",
  };
  for (std::string_view d : k_drop) {
    if (iequals(name, d)) return true;
  }
  return false;
}

bool drop_response_header(std::string_view name) noexcept {
  static constexpr std::string_view k_drop[] = {
      "connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "x-request-id",
  };
  for (std::string_view d : k_drop) {
    if (iequals(name, d)) return true;
  }
  return false;
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
  // memmem, not string_view::find: the latter calls memchr once per '"'
  // of the JSON before it (thousands in a 40 KB batch).
  auto next = [&](size_t at) -> size_t {
    if (at >= n) return std::string_view::npos;
    const void* hit = ::memmem(p + at, n - at, k_usage.data(), k_usage.size());
    return hit == nullptr ? std::string_view::npos : static_cast<size_t>(static_cast<const char*>(hit) - p);
  };
  for (size_t u = next(from); u != std::string_view::npos; u = next(u + 1)) {
    const size_t ev = all.rfind("data:", u);
    if (ev == std::string_view::npos || ev < 2 || all[ev - 1] != '\n' || all[ev - 2] != '\r') continue;
    size_t h = ev - 2;  // the size line ends here: at most 16 digits before it
    while (h > 0 && ev - 2 - h < 17 && std::isxdigit(static_cast<unsigned char>(all[h - 1])) != 0) --h;
    if (h == ev - 2 || (h != 0 && all[h - 1] != '\n')) continue;
    const size_t ev_end = all.find("\n\n", u);
    if (ev_end == std::string_view::npos || ev_end + 4 > n || all.substr(ev_end + 2, 2) != "\r\n") continue;
    const size_t payload = ev_end + 2 - ev;
    size_t line = h;
    uint64_t size = 0;
    if (!http::read_chunk_size_line(p, n, line, size) || line != ev || size != payload) continue;
    if (all.substr(ev, ev_end - ev).find("\"choices\":[]") == std::string_view::npos) continue;
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
