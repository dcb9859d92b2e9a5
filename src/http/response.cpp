// Upstream response heads and body framing. The head goes through the same
// pre-scan as a request head (head_scan.cpp), then llhttp in response mode,
// except for a plain head whose facts llhttp is known to read the same way
// (as in request.cpp). A chunked body goes through the chunk walker; any
// other body is fed to llhttp as it arrives (or, after a head read without
// it, counted here), which pauses at the end of the message, so bytes
// after it (there should be none on a backend connection) are never taken
// as this body.
#include "sluice/http/response.hpp"

#include <cstring>

#include "head_scan.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/http/sse.hpp"

namespace sluice::http {

namespace {

// Whether the n bytes at a and b are equal: for the few bytes of a skipped
// chunk's head and tail, the first and the last word of the widest size
// that fits (overlapping), in place of a call to memcmp.
template <class W>
inline bool same_ends(const char* a, const char* b, size_t n) noexcept {
  W x, y, u, v;
  std::memcpy(&x, a, sizeof x);
  std::memcpy(&y, b, sizeof y);
  std::memcpy(&u, a + n - sizeof u, sizeof u);
  std::memcpy(&v, b + n - sizeof v, sizeof v);
  return ((x ^ y) | (u ^ v)) == 0;
}

// Every size a skip's head or tail has stays off memcmp: chat's 7-byte head
// and 25-byte tail, and the native dialects' 34- and 41-byte heads and
// 3-byte tail "}\n\n", which called it once per chunk each.
inline bool same_bytes(const char* a, const char* b, size_t n) noexcept {
  if (n > 32 && n <= 64) {
    return same_ends<uint64_t>(a, b, 16) && same_ends<uint64_t>(a + 16, b + 16, 16) &&
           same_ends<uint64_t>(a + n - 32, b + n - 32, 16) && same_ends<uint64_t>(a + n - 16, b + n - 16, 16);
  }
  if (n >= 16 && n <= 32) {
    return same_ends<uint64_t>(a, b, 16) && same_ends<uint64_t>(a + n - 16, b + n - 16, 16);
  }
  if (n >= 8 && n < 16) return same_ends<uint64_t>(a, b, n);
  if (n >= 4 && n < 8) return same_ends<uint32_t>(a, b, n);
  if (n >= 2 && n < 4) return same_ends<uint16_t>(a, b, n);
  if (n == 1) return a[0] == b[0];
  if (n == 0) return true;
  return std::memcmp(a, b, n) == 0;
}

using detail::iequals;

constexpr uint32_t k_head_bytes_max = 64u << 10;

parse_status upstream_error(std::string_view message) noexcept {
  return parse_status{errc::upstream_protocol, 502, message};
}

}  // namespace

response_parser::response_parser() noexcept {
  // A backend's body is not held (its bytes go on as they come), so neither
  // the payload nor the framing has a bound here; the trailers do.
  chunk_limits cl;
  cl.trailer_bytes_max = k_head_bytes_max;
  cl.trailer_fields_max = k_response_headers_max;
  _chunk.set_limits(cl);
  reset();
}

const llhttp_settings_t* response_parser::settings() noexcept {
  // One for every parser: llhttp only reads it. The fields themselves are
  // not taken from llhttp's callbacks (see header_fields).
  static const llhttp_settings_t s = [] {
    llhttp_settings_t v;
    llhttp_settings_init(&v);
    v.on_status = on_status;
    v.on_headers_complete = on_headers_complete;
    v.on_body = on_body;
    v.on_message_complete = on_message_complete;
    return v;
  }();
  return &s;
}

void response_parser::reset(bool head_request) noexcept {
  // A head read without llhttp leaves its state as init left it.
  if (_llhttp_used) {
    llhttp_init(&_parser, HTTP_RESPONSE, settings());
    _parser.data = this;
    _llhttp_used = false;
  }
  _own_framing = false;
  _remaining = 0;
  _scan = detail::head_scan_state{};
  _index.n = 0;
  _head = nullptr;
  _sink = nullptr;
  _pending = parse_status{errc::need_more, 0, {}};
  _head_request = head_request;
  _head_done = false;
  _message_done = false;
  _failed = false;
  _paused_at_head = false;
  _chunked = false;
  _chunk.reset();
  _until_close = false;
}

int response_parser::on_status(llhttp_t* p, const char* at, size_t len) {
  auto* self = static_cast<response_parser*>(p->data);
  self->_head->reason = detail::extend_span(self->_head->reason, at, len);
  return 0;
}

int response_parser::on_headers_complete(llhttp_t* p) {
  auto* self = static_cast<response_parser*>(p->data);
  self->_pending = self->check_fields();
  if (!self->_pending.ok()) return -1;
  const response_head& h = *self->_head;
  // No body follows: tell llhttp (it cannot know about HEAD), and the
  // message completes at once, pausing in on_message_complete.
  if (self->_head_request || h.status == 204 || h.status == 304 ||
      (h.has_content_length && h.content_length == 0)) {
    return 1;
  }
  self->_paused_at_head = true;
  return HPE_PAUSED;
}

int response_parser::on_body(llhttp_t* p, const char* at, size_t len) {
  auto* self = static_cast<response_parser*>(p->data);
  if (self->_sink != nullptr && self->_sink->on_data != nullptr) self->_sink->on_data(self->_sink->ctx, at, len);
  return 0;
}

int response_parser::on_message_complete(llhttp_t* p) {
  auto* self = static_cast<response_parser*>(p->data);
  self->_message_done = true;
  // Stop right here: whatever follows is not this message's.
  return HPE_PAUSED;
}

bool response_parser::read_status_line(const char* data) noexcept {
  response_head& h = *_head;
  // "HTTP/1.x DDD" and the end, or a space and a reason that does not start
  // with whitespace: the forms whose reading by llhttp is known. The
  // pre-scan let through no byte of the reason that llhttp refuses.
  const std::string_view line(data + _scan.start_begin, _scan.start_end - _scan.start_begin);
  if (line.size() < 12 || !line.starts_with("HTTP/1.") || (line[7] != '0' && line[7] != '1') ||
      line[8] != ' ') {
    return false;
  }
  if (line[9] < '2' || line[9] > '5' || line[10] < '0' || line[10] > '9' || line[11] < '0' || line[11] > '9') {
    return false;
  }
  if (line.size() > 12 && (line.size() == 13 || line[12] != ' ' || line[13] == ' ' || line[13] == '\t')) {
    return false;
  }
  h.version_minor = static_cast<uint8_t>(line[7] - '0');
  h.status = static_cast<uint16_t>((line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0'));
  if (line.size() > 12) h.reason = line.substr(13);
  return true;
}

parse_status response_parser::check_fields(own_facts* own) noexcept {
  response_head& h = *_head;
  if (own == nullptr) {
    h.status = static_cast<uint16_t>(llhttp_get_status_code(&_parser));
    h.version_minor = llhttp_get_http_minor(&_parser);
    if (llhttp_get_http_major(&_parser) != 1 || h.version_minor > 1) {
      return upstream_error("backend answered with an unsupported HTTP version");
    }
  }  // else read_status_line() set both, HTTP/1.0 or 1.1
  // sluice never sends Expect or Upgrade upstream: an interim answer is a
  // protocol error here, not something to skip.
  if (h.status < 200) return upstream_error("backend sent a 1xx interim response");
  if (h.status > 599) return upstream_error("backend sent an invalid status code");
  bool seen_cl = false, seen_te = false;
  header f;
  std::string_view raw;
  for (header_fields it = h.fields(); it.next(f, raw);) {
    const std::string_view n = f.name, v = f.value;
    switch (n.size()) {
      case 7:
        if (own != nullptr && iequals(n, "upgrade")) own->ask_llhttp = true;
        break;
      case 10:
        if (own != nullptr && iequals(n, "connection")) {
          if (own->connections++ == 0) own->connection = v;
          own->ask_llhttp |= detail::llhttp_reads_value_apart(raw);
        }
        break;
      case 16:
        // llhttp reads Proxy-Connection as it reads Connection.
        if (own != nullptr && iequals(n, "proxy-connection")) own->ask_llhttp = true;
        break;
      case 12:
        if (iequals(n, "content-type") && h.content_type.data() == nullptr) h.content_type = v;
        break;
      case 14:
        if (iequals(n, "content-length")) {
          if (own != nullptr) own->ask_llhttp |= detail::llhttp_reads_value_apart(raw);
          if (seen_cl) return upstream_error("duplicate Content-Length in backend response");
          seen_cl = true;
          if (!detail::parse_content_length(v, h.content_length)) {
            return upstream_error("invalid Content-Length in backend response");
          }
          h.has_content_length = true;
        }
        break;
      case 17:
        if (iequals(n, "transfer-encoding")) {
          if (own != nullptr) own->ask_llhttp |= detail::llhttp_reads_value_apart(raw);
          if (seen_te || !iequals(v, "chunked")) {
            return upstream_error("unsupported Transfer-Encoding in backend response");
          }
          seen_te = true;
          h.chunked = true;
        }
        break;
      default: break;
    }
  }
  if (h.chunked && h.has_content_length) {
    return upstream_error("backend response has both Content-Length and Transfer-Encoding");
  }
  if (own == nullptr && h.chunked != ((_parser.flags & F_CHUNKED) != 0)) {
    return upstream_error("ambiguous backend response framing");
  }
  h.event_stream = detail::istarts_with(h.content_type, "text/event-stream");
  const bool no_body = _head_request || h.status == 204 || h.status == 304;
  _chunked = h.chunked && !no_body;
  _until_close = !no_body && !h.chunked && !h.has_content_length;
  // Reusable when the version and Connection say so and the body has an
  // end other than the close.
  const bool http11 = h.version_minor == 1;
  bool close = false, keep = false;
  if (own == nullptr) {
    close = (_parser.flags & F_CONNECTION_CLOSE) != 0;
    keep = (_parser.flags & F_CONNECTION_KEEP_ALIVE) != 0;
  } else if (own->connections == 1) {
    // One field of exactly one option, as llhttp would flag it; a list, an
    // unknown option or a second field is llhttp's to read.
    close = iequals(own->connection, "close");
    keep = iequals(own->connection, "keep-alive");
    if (!close && !keep) own->ask_llhttp = true;
  } else if (own->connections > 1) {
    own->ask_llhttp = true;
  }
  const bool by_fields = http11 ? !close : keep;
  h.keep_alive = by_fields && !_until_close;
  return parse_status{};
}

parse_status response_parser::parse_head(const char* data, size_t len, response_head& out) noexcept {
  if (!_pending.need_more()) return _pending;
  // A status line is not checked as a request line (method_bytes_max 0).
  const detail::scan_limits sl{k_head_bytes_max, k_head_bytes_max, k_head_bytes_max,
                               k_response_headers_max, true, 0};
  switch (detail::scan_head(_scan, data, len, sl, &_index)) {
    case detail::scan_state::need_more: return _pending;
    case detail::scan_state::failed:
      _failed = true;
      return _pending = upstream_error(detail::scan_message(detail::error_of(_scan)));
    case detail::scan_state::complete: break;
  }
  start_head(data, out);
  // Without llhttp where it is known to agree (as for a request head, see
  // request.cpp): a plain status line, token names, no Upgrade, Connection
  // absent or one plain option. The body is then framed here too (a
  // Content-Length count, or the close); anything else, errors included,
  // is llhttp's from the start.
  if (!_llhttp_only && !_scan.name_not_token && read_status_line(data)) {
    own_facts own;
    if (check_fields(&own).ok() && !own.ask_llhttp) {
      _own_framing = true;
      _head_done = true;
      if (_head_request || out.status == 204 || out.status == 304 ||
          (out.has_content_length && out.content_length == 0)) {
        _message_done = true;
      } else if (!_chunked && !_until_close) {
        _remaining = out.content_length;
      }
      return _pending = parse_status{};
    }
    start_head(data, out);
  }
  _llhttp_used = true;
  const char* begin = data + _scan.start_begin;
  const llhttp_errno_t e = llhttp_execute(&_parser, begin, _scan.head_bytes - _scan.start_begin);
  if (e == HPE_PAUSED && _pending.ok()) {
    _head_done = true;
    return _pending;
  }
  _failed = true;
  if (!_pending.need_more()) return _pending;  // set by check_fields()
  if (e == HPE_OK) return _pending = upstream_error("incomplete backend response head");
  const char* reason = llhttp_get_error_reason(&_parser);  // a string literal
  return _pending = upstream_error(reason != nullptr ? reason : "malformed backend response head");
}

body_status response_parser::feed_body(const char* data, size_t len, const body_sink& sink) noexcept {
  if (_failed || !_head_done) return body_status{errc::upstream_protocol, 0, false};
  if (_message_done) return body_status{errc::ok, 0, true};
  if (_chunked) {
    // The chunk walker, not llhttp: one pass over the framing, the payload
    // handed on in spans, no callback per chunk.
    // A run of skipped chunks: counted here, told once (before the next
    // call, which may depend on what they were, and at the end).
    uint32_t skipped = 0;
    size_t skipped_end = 0;
    const auto flush = [&]() noexcept {
      if (skipped == 0) return;
      sink.on_skipped(sink.ctx, skipped, data + skipped_end);
      skipped = 0;
    };
    const size_t head_n = sink.skip_head.size(), tail_n = sink.skip_tail.size();
    const detail::line_end_fn line_end = detail::line_end_impl();
    // The tail's last two bytes are the event's line ends (body_sink): the
    // test below reads the payload before them.
    SLUICE_ASSERT(sink.skip_ok == nullptr || tail_n >= 2);
    // The same test as vector compares, for the payloads long enough for
    // its loads (nearly all of them): the sink's, or prepared for this call.
    detail::skip_pattern made;
    const detail::skip_pattern* pattern = sink.skip_pattern;
    if (pattern == nullptr && sink.skip_ok != nullptr && detail::make_skip_pattern(sink.skip_head, sink.skip_tail, made)) {
      pattern = &made;
    }
    const bool by_pattern = sink.skip_ok != nullptr && pattern != nullptr;
    const detail::skip_fn skip = detail::skip_impl();
    // Runs of such chunks in one call (AVX2): the walk hands on only what
    // the run stops at.
    const detail::skip_run_fn skip_run = by_pattern ? detail::skip_run_impl() : nullptr;
    const auto run = [&](size_t i, uint64_t& body_left, uint64_t& framing_left) noexcept {
      if (skip_run == nullptr || !*sink.skip_ok) return i;
      const size_t end = skip_run(*pattern, data, len, i, body_left, framing_left, skipped);
      if (end != i) skipped_end = end;
      return end;
    };
    const chunk_step st = _chunk.walk(
        data, len,
        [&](size_t at, size_t n) noexcept {
          flush();
          if (sink.on_data != nullptr) sink.on_data(sink.ctx, data + at, n);
        },
        [&](size_t at) noexcept {
          flush();
          if (sink.on_chunk_end != nullptr) sink.on_chunk_end(sink.ctx, data + at);
        },
        [&](size_t at, size_t n, size_t end) noexcept {
          if (sink.skip_ok != nullptr && *sink.skip_ok &&
              (by_pattern && n >= detail::k_skip_pattern_min
                   ? skip(*pattern, data + at, n)
                   : n >= head_n + tail_n && same_bytes(data + at, sink.skip_head.data(), head_n) &&
                         same_bytes(data + at + n - tail_n, sink.skip_tail.data(), tail_n) &&
                         !line_end(data + at + head_n, n - head_n - 2))) {
            ++skipped;
            skipped_end = end;
            return;
          }
          flush();
          if (sink.on_chunk != nullptr) {
            sink.on_chunk(sink.ctx, data + at, n, data + end);
            return;
          }
          if (sink.on_data != nullptr) sink.on_data(sink.ctx, data + at, n);
          if (sink.on_chunk_end != nullptr) sink.on_chunk_end(sink.ctx, data + end);
        },
        run);
    flush();
    if (st.error != chunk_error::none) {
      _failed = true;
      return body_status{errc::upstream_protocol, st.consumed, false, st.chunk_end};
    }
    if (st.done) {
      _message_done = true;
      return body_status{errc::ok, st.consumed, true, st.consumed};
    }
    return body_status{errc::ok, len, false, st.chunk_end};
  }
  if (_own_framing) {
    // Content-Length: the count; else the body runs to the close.
    if (_until_close) {
      if (len != 0 && sink.on_data != nullptr) sink.on_data(sink.ctx, data, len);
      return body_status{errc::ok, len, false};
    }
    const size_t n = len < _remaining ? len : static_cast<size_t>(_remaining);
    if (n != 0 && sink.on_data != nullptr) sink.on_data(sink.ctx, data, n);
    _remaining -= n;
    if (_remaining != 0) return body_status{errc::ok, len, false};
    _message_done = true;
    return body_status{errc::ok, n, true, n};
  }
  if (_paused_at_head) {
    llhttp_resume(&_parser);
    _paused_at_head = false;
  }
  _sink = &sink;
  const llhttp_errno_t e = llhttp_execute(&_parser, data, len);
  _sink = nullptr;
  if (e == HPE_OK) return body_status{errc::ok, len, false};
  const auto at = static_cast<size_t>(llhttp_get_error_pos(&_parser) - data);
  if (e == HPE_PAUSED && _message_done) return body_status{errc::ok, at, true, at};
  _failed = true;
  return body_status{errc::upstream_protocol, at, false};
}

void response_parser::start_head(const char* data, response_head& out) noexcept {
  _head = &out;
  out = response_head{};
  out.head_bytes = _scan.head_bytes;
  out.header_count = _scan.fields;
  // The field lines: after the status line's CRLF, up to the empty line.
  out.field_lines = std::string_view(data + _scan.start_end + 2, _scan.head_bytes - 2 - (_scan.start_end + 2));
  copy_index(_index, out.field_lines, out.field_refs);
}

bool response_parser::finish_at_eof() noexcept {
  if (_message_done) return true;
  if (!_head_done || _failed || !_until_close) return false;
  _message_done = true;
  return true;
}

}  // namespace sluice::http
