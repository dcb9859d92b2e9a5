// Downstream request heads and chunked request bodies. Two passes over a
// head: the pre-scan (head_scan.cpp) finds its end while enforcing the limits
// and the line grammar llhttp 8.1 is lenient about, then llhttp (strict)
// parses the one complete head and pauses at headers-complete so no body
// byte is touched. A head whose every part is one llhttp is known to take
// the same way (a common method, token names, no Upgrade, Connection absent
// or one plain option) skips llhttp: its facts are read from the lines the
// pre-scan found, and anything else, errors included, is llhttp's. Chunked bodies use a hand-written decoder: it must be
// resumable at any byte, stricter than llhttp about bare LF, and it writes
// the payload in place.
#include "sluice/http/request.hpp"

#include <algorithm>
#include <cstring>

#include "head_scan.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::http {

namespace {

using detail::iequals;

// The least framing a chunked body may carry, whatever body_bytes_max is.
constexpr uint64_t k_chunk_framing_floor_bytes = 64u << 10;

parse_status error_status(uint16_t status, std::string_view message) noexcept {
  errc e = errc::bad_request;  // also 417 and 501: errc has no code for those
  switch (status) {
    case 413: e = errc::body_too_large; break;
    case 414: e = errc::uri_too_long; break;
    case 431: e = errc::header_too_large; break;
    case 505: e = errc::version_not_supported; break;
    default: break;
  }
  return parse_status{e, status, message};
}

parse_status scan_failure(detail::scan_error e) noexcept {
  using detail::scan_error;
  switch (e) {
    case scan_error::start_line_too_long: return error_status(414, "request line too long");
    case scan_error::head_too_large:
    case scan_error::field_line_too_long:
    case scan_error::too_many_fields: return error_status(431, detail::scan_message(e));
    default: return error_status(400, detail::scan_message(e));
  }
}

method method_of(uint8_t m) noexcept {
  switch (m) {
    case HTTP_GET: return method::get;
    case HTTP_HEAD: return method::head;
    case HTTP_POST: return method::post;
    case HTTP_PUT: return method::put;
    case HTTP_DELETE: return method::delete_;
    case HTTP_OPTIONS: return method::options;
    case HTTP_PATCH: return method::patch;
    case HTTP_CONNECT: return method::connect;
    case HTTP_TRACE: return method::trace;
    default: return method::other;
  }
}

void clear_head(request_head& h) noexcept {
  h.meth = method::other;
  h.method_name = h.target = h.path = {};
  h.version_major = 1;
  h.version_minor = 1;
  h.keep_alive = true;
  h.chunked = false;
  h.has_content_length = false;
  h.content_length = 0;
  h.expect_continue = false;
  h.head_bytes = 0;
  h.authorization = h.api_key = h.host = h.session_id = h.request_id = {};
  h.content_type = h.connection = h.upgrade = {};
  h.header_count = 0;
  h.field_lines = {};
  h.field_refs.n = 0;
}

// The methods a head may have without asking llhttp: llhttp knows each (so
// it would not answer 501), and none has a form of its own (CONNECT's
// authority target). Any other method goes through llhttp.
method known_method(std::string_view m) noexcept {
  switch (m.size()) {
    case 3:
      if (m == "GET") return method::get;
      if (m == "PUT") return method::put;
      break;
    case 4:
      if (m == "POST") return method::post;
      if (m == "HEAD") return method::head;
      break;
    case 5:
      if (m == "PATCH") return method::patch;
      break;
    case 6:
      if (m == "DELETE") return method::delete_;
      break;
    case 7:
      if (m == "OPTIONS") return method::options;
      break;
    default: break;
  }
  return method::other;
}

// One well-known field: remembers the first value, rejects a second.
bool take_once(std::string_view& slot, bool& seen, std::string_view value) noexcept {
  if (seen) return false;
  seen = true;
  slot = value;
  return true;
}

}  // namespace

void request_head::rebase(const char* old_base, const char* new_base) noexcept {
  const auto move = [old_base, new_base](std::string_view& v) noexcept {
    if (v.data() == nullptr) return;
    v = std::string_view(new_base + (v.data() - old_base), v.size());
  };
  move(method_name);
  move(target);
  move(path);
  move(authorization);
  move(api_key);
  move(host);
  move(session_id);
  move(request_id);
  move(content_type);
  move(connection);
  move(upgrade);
  move(field_lines);
}

bool header_fields::next_walked(header& out, std::string_view& whole) noexcept {
  const char* p = _rest.data();
  const auto* lf = static_cast<const char*>(std::memchr(p, '\n', _rest.size()));
  if (lf == nullptr || lf == p) return false;  // not a parsed head: cannot happen
  const size_t line = static_cast<size_t>(lf - p) - 1;  // without the CR
  const auto* colon = static_cast<const char*>(std::memchr(p, ':', line));
  if (colon == nullptr) return false;
  out.name = std::string_view(p, static_cast<size_t>(colon - p));
  out.value = detail::trim_ows(std::string_view(colon + 1, static_cast<size_t>(p + line - colon - 1)));
  whole = std::string_view(p, static_cast<size_t>(lf + 1 - p));
  _rest.remove_prefix(whole.size());
  return true;
}

request_parser::request_parser(const limits& l) noexcept : _limits(l) {
  _limits.header_count_max = std::min(_limits.header_count_max, k_headers_max);
  // The raw bytes are held until the body is complete, so tiny chunks with
  // long extensions must not make a connection hold many times the body
  // limit: the framing is bounded too.
  chunk_limits cl;
  cl.body_bytes_max = _limits.body_bytes_max;
  cl.framing_bytes_max = std::max(_limits.body_bytes_max, k_chunk_framing_floor_bytes);
  cl.trailer_bytes_max = _limits.head_bytes_max;
  cl.trailer_fields_max = _limits.header_count_max;
  _chunk.set_limits(cl);
  reset();
}

const llhttp_settings_t* request_parser::settings() noexcept {
  // One for every parser: llhttp only reads it. The fields themselves are
  // not taken from llhttp's callbacks (see header_fields).
  static const llhttp_settings_t s = [] {
    llhttp_settings_t v;
    llhttp_settings_init(&v);
    v.on_headers_complete = on_headers_complete;
    return v;
  }();
  return &s;
}

void request_parser::reset() noexcept {
  // A head read without llhttp leaves its state as init left it.
  if (_llhttp_used) {
    llhttp_init(&_parser, HTTP_REQUEST, settings());
    _parser.data = this;
    _llhttp_used = false;
  }
  _scan = detail::head_scan_state{};
  _index.n = 0;
  _head = nullptr;
  _pending = parse_status{errc::need_more, 0, {}};
  _chunk.reset();
  _body_status = parse_status{errc::need_more, 0, {}};
}

int request_parser::on_headers_complete(llhttp_t* p) {
  auto* self = static_cast<request_parser*>(p->data);
  self->_pending = self->check_fields();
  // Pausing leaves the body alone: parse_head() must not consume it.
  return self->_pending.ok() ? HPE_PAUSED : -1;
}

parse_status request_parser::parse_request_line(const char* data) noexcept {
  request_head& h = *_head;
  const std::string_view line(data + _scan.start_begin, _scan.start_end - _scan.start_begin);
  constexpr std::string_view k_malformed = "malformed request line";
  // request-line = method SP request-target SP HTTP-version, single spaces.
  const size_t sp1 = line.find(' ');
  if (sp1 == 0 || sp1 == std::string_view::npos) return error_status(400, k_malformed);
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == sp1 + 1 || sp2 == std::string_view::npos) return error_status(400, k_malformed);
  // The pre-scan proved the method a token of at most k_method_bytes_max.
  h.method_name = line.substr(0, sp1);
  h.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' ||
      version[5] < '0' || version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return error_status(400, "malformed HTTP version");
  }
  h.version_major = static_cast<uint8_t>(version[5] - '0');
  h.version_minor = static_cast<uint8_t>(version[7] - '0');
  if (h.version_major != 1 || h.version_minor > 1) {
    return error_status(505, "HTTP version not supported (HTTP/1.1 and HTTP/1.0 are)");
  }
  // Only origin-form: sluice is the origin for its clients, not a forward
  // proxy, and a second authority in the target is a routing ambiguity.
  if (h.target.front() != '/') {
    return error_status(400, "request target must be a path starting with '/'");
  }
  if (h.target.find('#') != std::string_view::npos) {
    return error_status(400, "fragment ('#') in the request target");
  }
  h.path = h.target.substr(0, h.target.find('?'));
  return parse_status{};
}

parse_status request_parser::check_fields(own_facts* own) noexcept {
  request_head& h = *_head;
  bool seen_host = false, seen_auth = false, seen_cl = false, seen_te = false;
  bool seen_sid = false, seen_rid = false, seen_ctype = false, seen_api_key = false;
  bool http10 = h.version_minor == 0;
  std::string_view te;
  header f;
  std::string_view raw;
  for (header_fields it = h.fields(); it.next(f, raw);) {
    const std::string_view n = f.name, v = f.value;
    // Dispatch on the length first: most fields are not well-known.
    switch (n.size()) {
      case 4:
        if (iequals(n, "host")) {
          if (!take_once(h.host, seen_host, v)) return error_status(400, "duplicate Host header");
          // Routing, logs and the backend may each read a malformed
          // authority differently (userinfo, a second port): refuse it.
          if (!detail::valid_host(v)) return error_status(400, "invalid Host header");
        }
        break;
      case 6:
        if (iequals(n, "expect")) {
          if (!iequals(v, "100-continue")) return error_status(417, "unsupported Expect value");
          // RFC 9110 §10.1.1: an HTTP/1.0 client cannot take a 100; ignore it.
          h.expect_continue = !http10;
        }
        break;
      case 7:
        if (iequals(n, "upgrade")) {
          if (h.upgrade.data() == nullptr) h.upgrade = v;
          if (own != nullptr) own->ask_llhttp = true;
        }
        break;
      case 9:
        if (iequals(n, "x-api-key") && !take_once(h.api_key, seen_api_key, v)) {
          return error_status(400, "duplicate x-api-key header");
        }
        break;
      case 10:
        if (iequals(n, "connection")) {
          if (h.connection.data() == nullptr) h.connection = v;
          if (own != nullptr) {
            ++own->connections;
            own->ask_llhttp |= detail::llhttp_reads_value_apart(raw);
          }
        }
        break;
      case 12:
        if (iequals(n, "content-type")) {
          if (!take_once(h.content_type, seen_ctype, v)) {
            return error_status(400, "duplicate Content-Type header");
          }
        } else if (iequals(n, "x-session-id")) {
          if (!take_once(h.session_id, seen_sid, v)) {
            return error_status(400, "duplicate X-Session-ID header");
          }
        } else if (iequals(n, "x-request-id")) {
          if (!take_once(h.request_id, seen_rid, v)) {
            return error_status(400, "duplicate X-Request-ID header");
          }
        }
        break;
      case 13:
        if (iequals(n, "authorization") && !take_once(h.authorization, seen_auth, v)) {
          return error_status(400, "duplicate Authorization header");
        }
        break;
      case 14:
        if (iequals(n, "content-length")) {
          if (own != nullptr) own->ask_llhttp |= detail::llhttp_reads_value_apart(raw);
          if (seen_cl) return error_status(400, "duplicate Content-Length header");
          seen_cl = true;
          if (!detail::parse_content_length(v, h.content_length)) {
            return error_status(400, "invalid Content-Length");
          }
          h.has_content_length = true;
        }
        break;
      case 16:
        // llhttp reads Proxy-Connection as it reads Connection.
        if (own != nullptr && iequals(n, "proxy-connection")) own->ask_llhttp = true;
        break;
      case 17:
        if (iequals(n, "transfer-encoding")) {
          if (own != nullptr) own->ask_llhttp |= detail::llhttp_reads_value_apart(raw);
          if (seen_te) return error_status(400, "duplicate Transfer-Encoding header");
          seen_te = true;
          te = v;
        }
        break;
      default: break;
    }
  }
  if (seen_te) {
    // RFC 9112 §6.1/§6.3: TE in HTTP/1.0 means faulty framing; chunked not
    // last means the length cannot be known (400); another coding before
    // chunked is valid but not implemented here (501). Never forwarded.
    if (http10) return error_status(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (seen_cl) return error_status(400, "both Content-Length and Transfer-Encoding");
    if (!iequals(te, "chunked")) {
      // A list: chunked must come last, once.
      bool chunked_last = false;
      for (std::string_view rest = te; !rest.empty();) {
        const size_t comma = rest.find(',');
        const std::string_view coding = detail::trim_ows(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        chunked_last = iequals(coding, "chunked");
        if (chunked_last && comma != std::string_view::npos) {
          return error_status(400, "invalid Transfer-Encoding (chunked must be the final coding)");
        }
      }
      if (!chunked_last) {
        return error_status(400, "invalid Transfer-Encoding (chunked must be the final coding)");
      }
      return error_status(501, "transfer coding not implemented (only chunked is)");
    }
    h.chunked = true;
  }
  // llhttp framed the message the same way, or something is off.
  if (own == nullptr && h.chunked != ((_parser.flags & F_CHUNKED) != 0)) {
    return error_status(400, "ambiguous message framing");
  }
  if (!http10 && !seen_host) return error_status(400, "missing Host header");
  if (h.has_content_length && h.content_length > _limits.body_bytes_max) {
    return error_status(413, "request body too large");
  }
  if (own == nullptr) {
    h.meth = method_of(llhttp_get_method(&_parser));
    h.keep_alive = llhttp_should_keep_alive(&_parser) != 0;
    return parse_status{};
  }
  // What llhttp_should_keep_alive() says for a request, where Connection is
  // one field of exactly one of the two options: HTTP/1.1 stays open unless
  // it says close, HTTP/1.0 closes unless it says keep-alive. A list, an
  // unknown option or a second field: llhttp's reading.
  bool close = false, keep = false;
  if (own->connections == 1) {
    close = iequals(h.connection, "close");
    keep = iequals(h.connection, "keep-alive");
    if (!close && !keep) own->ask_llhttp = true;
  } else if (own->connections > 1) {
    own->ask_llhttp = true;
  }
  h.keep_alive = http10 ? keep : !close;
  return parse_status{};
}

void request_parser::start_head(const char* data, request_head& out) noexcept {
  _head = &out;
  clear_head(out);
  out.head_bytes = _scan.head_bytes;
  out.header_count = _scan.fields;
  // The field lines: after the request line's CRLF, up to the empty line.
  out.field_lines = std::string_view(data + _scan.start_end + 2, _scan.head_bytes - 2 - (_scan.start_end + 2));
  copy_index(_index, out.field_lines, out.field_refs);
}

parse_status request_parser::parse_head(const char* data, size_t len, request_head& out) noexcept {
  if (!_pending.need_more()) return _pending;
  const detail::scan_limits sl{_limits.head_bytes_max, _limits.line_bytes_max, _limits.line_bytes_max,
                               _limits.header_count_max, false, detail::k_method_bytes_max};
  switch (detail::scan_head(_scan, data, len, sl, &_index)) {
    case detail::scan_state::need_more: return _pending;
    case detail::scan_state::failed: return _pending = scan_failure(detail::error_of(_scan));
    case detail::scan_state::complete: break;
  }
  start_head(data, out);
  if (parse_status s = parse_request_line(data); !s.ok()) return _pending = s;

  // Without llhttp where it is known to agree: every byte the pre-scan let
  // through is one llhttp's strict mode takes in a value and a target, so
  // what is left to it is the method, the names' token bytes and the
  // Connection flags (tests/unit/http/request_test.cpp holds the two
  // readings side by side). An error here, or anything outside those, goes
  // to llhttp from the start, so the answer is always the one it gives.
  if (!_llhttp_only && !_scan.name_not_token) {
    const method m = known_method(out.method_name);
    if (m != method::other) {
      own_facts own;
      if (check_fields(&own).ok() && !own.ask_llhttp) {
        out.meth = m;
        return _pending = parse_status{};
      }
      start_head(data, out);
      (void)parse_request_line(data);  // it passed above
    }
  }

  // llhttp sees exactly the head, from the request line on.
  _llhttp_used = true;
  const char* begin = data + _scan.start_begin;
  const llhttp_errno_t e = llhttp_execute(&_parser, begin, _scan.head_bytes - _scan.start_begin);
  if (e == HPE_PAUSED && _pending.ok()) return _pending;
  if (!_pending.need_more()) return _pending;  // set by check_fields()
  switch (e) {
    case HPE_INVALID_METHOD: return _pending = error_status(501, "unknown request method");
    case HPE_INVALID_VERSION: return _pending = error_status(505, "HTTP version not supported");
    case HPE_OK: return _pending = error_status(400, "incomplete request head");
    default: {
      // llhttp's reasons are string literals, so the view stays valid.
      const char* reason = llhttp_get_error_reason(&_parser);
      return _pending = error_status(400, reason != nullptr ? reason : "malformed request head");
    }
  }
}

parse_status request_parser::chunk_fail(uint16_t status, std::string_view message) noexcept {
  return _body_status = error_status(status, message);
}

parse_status request_parser::decode_chunked(char* in, size_t len, char* out, size_t& consumed,
                                            size_t& produced) noexcept {
  consumed = 0;
  produced = 0;
  if (!_body_status.need_more()) return _body_status;
  // out <= in, and every byte written lies before the next byte read: the
  // payload is compacted in place with memmove.
  const chunk_step st = _chunk.walk(in, len, [&](size_t at, size_t n) noexcept {
    std::memmove(out + produced, in + at, n);
    produced += n;
  });
  consumed = st.consumed;
  switch (st.error) {
    case chunk_error::none: break;
    case chunk_error::body_too_large: return chunk_fail(413, "request body too large");
    case chunk_error::framing_too_large: return chunk_fail(413, "request body too large (chunk framing)");
    case chunk_error::trailer_too_large:
    case chunk_error::too_many_trailer_fields: return chunk_fail(431, chunk_message(st.error));
    default: return chunk_fail(400, chunk_message(st.error));
  }
  if (st.done) _body_status = parse_status{};
  return _body_status;
}

}  // namespace sluice::http
