// Upstream response heads and body framing. The head goes through the same
// pre-scan as a request head (head_scan.cpp), then llhttp in response mode.
// The body is fed to llhttp as it arrives: it strips the chunk framing for
// the sink and pauses at the end of the message, so bytes after it (there
// should be none on a backend connection) are never taken as this body.
#include "sluice/http/response.hpp"

#include <cstring>

#include "head_scan.hpp"

namespace sluice::http {

namespace {

using detail::iequals;

constexpr uint32_t k_head_bytes_max = 64u << 10;

parse_status upstream_error(std::string_view message) noexcept {
  return parse_status{errc::upstream_protocol, 502, message};
}

}  // namespace

response_parser::response_parser() noexcept { reset(); }

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
    v.on_chunk_header = on_chunk_header;
    v.on_chunk_complete = on_chunk_complete;
    return v;
  }();
  return &s;
}

void response_parser::reset(bool head_request) noexcept {
  llhttp_init(&_parser, HTTP_RESPONSE, settings());
  _parser.data = this;
  _scan = detail::head_scan_state{};
  _head = nullptr;
  _sink = nullptr;
  _pending = parse_status{errc::need_more, 0, {}};
  _head_request = head_request;
  _head_done = false;
  _message_done = false;
  _failed = false;
  _paused_at_head = false;
  _chunked = false;
  _chunk_is_last = false;
  _last_body_end = nullptr;
  _until_close = false;
  _tail_len = 0;
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
  self->_last_body_end = at + len;
  if (self->_sink != nullptr && self->_sink->on_data != nullptr) self->_sink->on_data(self->_sink->ctx, at, len);
  return 0;
}

int response_parser::on_chunk_header(llhttp_t* p) {
  auto* self = static_cast<response_parser*>(p->data);
  self->_chunk_is_last = p->content_length == 0;
  self->_last_body_end = nullptr;
  return 0;
}

int response_parser::on_chunk_complete(llhttp_t* p) {
  auto* self = static_cast<response_parser*>(p->data);
  // Where the chunk ended, without pausing the parser (a pause per chunk
  // costs a return and a re-entry): just past the CRLF after its data.
  // The data's end is known when it came in this call; otherwise only that
  // CRLF is here, at the very start (llhttp checked it: "\r\n", or "\n"
  // when the CR came last in the previous call). The terminal chunk's end
  // is the message's end, reported by feed_body() itself.
  // Clamped to this call's bytes: llhttp's two-byte match, resumed across
  // calls, can complete on a malformed "\n\r" (the next byte is then an
  // error), and chunk_end must never pass what was given.
  if (self->_chunk_is_last) return 0;
  const size_t end = self->_last_body_end != nullptr
                         ? static_cast<size_t>(self->_last_body_end - self->_feed_begin) + 2
                         : (self->_feed_begin[0] == '\r' ? 2 : 1);
  self->_chunk_end = end < self->_feed_len ? end : self->_feed_len;
  self->_last_body_end = nullptr;
  return 0;
}

int response_parser::on_message_complete(llhttp_t* p) {
  auto* self = static_cast<response_parser*>(p->data);
  self->_message_done = true;
  // Stop right here: whatever follows is not this message's.
  return HPE_PAUSED;
}

parse_status response_parser::check_fields() noexcept {
  response_head& h = *_head;
  h.status = static_cast<uint16_t>(llhttp_get_status_code(&_parser));
  h.version_minor = llhttp_get_http_minor(&_parser);
  if (llhttp_get_http_major(&_parser) != 1 || h.version_minor > 1) {
    return upstream_error("backend answered with an unsupported HTTP version");
  }
  // sluice never sends Expect or Upgrade upstream: an interim answer is a
  // protocol error here, not something to skip.
  if (h.status < 200) return upstream_error("backend sent a 1xx interim response");
  if (h.status > 599) return upstream_error("backend sent an invalid status code");
  bool seen_cl = false, seen_te = false;
  header f;
  for (header_fields it = h.fields(); it.next(f);) {
    const std::string_view n = f.name, v = f.value;
    switch (n.size()) {
      case 12:
        if (iequals(n, "content-type") && h.content_type.data() == nullptr) h.content_type = v;
        break;
      case 14:
        if (iequals(n, "content-length")) {
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
  if (h.chunked != ((_parser.flags & F_CHUNKED) != 0)) {
    return upstream_error("ambiguous backend response framing");
  }
  h.event_stream = detail::istarts_with(h.content_type, "text/event-stream");
  const bool no_body = _head_request || h.status == 204 || h.status == 304;
  _chunked = h.chunked && !no_body;
  _until_close = !no_body && !h.chunked && !h.has_content_length;
  // Reusable when the version and Connection say so and the body has an
  // end other than the close.
  const bool http11 = h.version_minor == 1;
  const bool by_fields = http11 ? (_parser.flags & F_CONNECTION_CLOSE) == 0
                                : (_parser.flags & F_CONNECTION_KEEP_ALIVE) != 0;
  h.keep_alive = by_fields && !_until_close;
  return parse_status{};
}

parse_status response_parser::parse_head(const char* data, size_t len, response_head& out) noexcept {
  if (!_pending.need_more()) return _pending;
  const detail::scan_limits sl{k_head_bytes_max, k_head_bytes_max, k_head_bytes_max,
                               k_response_headers_max, true};
  switch (detail::scan_head(_scan, data, len, sl)) {
    case detail::scan_state::need_more: return _pending;
    case detail::scan_state::failed:
      _failed = true;
      return _pending = upstream_error(detail::scan_message(detail::error_of(_scan)));
    case detail::scan_state::complete: break;
  }
  _head = &out;
  out = response_head{};
  out.head_bytes = _scan.head_bytes;
  out.header_count = _scan.fields;
  // The field lines: after the status line's CRLF, up to the empty line.
  out.field_lines = std::string_view(data + _scan.start_end + 2, _scan.head_bytes - 2 - (_scan.start_end + 2));
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

void response_parser::keep_tail(const char* data, size_t len) noexcept {
  char joined[6];
  size_t n = 0;
  for (uint8_t i = 0; i < _tail_len; ++i) joined[n++] = _tail[i];
  const size_t take = len < 3 ? len : 3;
  std::memcpy(joined + n, data + len - take, take);
  n += take;
  const size_t keep = n < 3 ? n : 3;
  std::memcpy(_tail, joined + n - keep, keep);
  _tail_len = static_cast<uint8_t>(keep);
}

bool response_parser::ends_with_crlfcrlf(const char* data, size_t consumed) const noexcept {
  // llhttp 8.1 takes "0\r\n\n" as a terminal chunk; sluice wants the CRLF.
  char last[4];
  size_t n = 0;
  for (size_t k = 4; k > 0; --k) {
    const size_t back = k;  // 4, 3, 2, 1 bytes before `consumed`
    if (back <= consumed) {
      last[n++] = data[consumed - back];
    } else if (back - consumed <= _tail_len) {
      last[n++] = _tail[_tail_len - (back - consumed)];
    }
  }
  return n == 4 && std::memcmp(last, "\r\n\r\n", 4) == 0;
}

body_status response_parser::feed_body(const char* data, size_t len, const body_sink& sink) noexcept {
  if (_failed || !_head_done) return body_status{errc::upstream_protocol, 0, false};
  if (_message_done) return body_status{errc::ok, 0, true};
  if (_paused_at_head) {
    llhttp_resume(&_parser);
    _paused_at_head = false;
  }
  _sink = &sink;
  _feed_begin = data;
  _feed_len = len;
  _last_body_end = nullptr;  // a pointer into the previous call's bytes means nothing here
  _chunk_end = 0;
  const llhttp_errno_t e = llhttp_execute(&_parser, data, len);
  _sink = nullptr;
  const size_t chunk_end = _chunk_end;
  if (e == HPE_OK) {
    if (_chunked) keep_tail(data, len);
    return body_status{errc::ok, len, false, chunk_end};
  }
  const auto at = static_cast<size_t>(llhttp_get_error_pos(&_parser) - data);
  if (e == HPE_PAUSED && _message_done) {
    if (_chunked && !ends_with_crlfcrlf(data, at)) {
      _failed = true;
      _message_done = false;
      return body_status{errc::upstream_protocol, at, false, chunk_end < at ? chunk_end : at};
    }
    return body_status{errc::ok, at, true, at};
  }
  _failed = true;
  return body_status{errc::upstream_protocol, at, false, chunk_end < at ? chunk_end : at};
}

bool response_parser::finish_at_eof() noexcept {
  if (_message_done) return true;
  if (!_head_done || _failed || !_until_close) return false;
  _message_done = true;
  return true;
}

}  // namespace sluice::http
