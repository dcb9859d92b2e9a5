// h2: the server session (see include/sluice/h2/session.hpp). nghttp2 does
// the framing, HPACK, flow control and most of RFC 9113's checks; this file
// adds what it leaves to the application: the header list limit, the
// duplicate-field rules sluice's HTTP/1.1 parser has, the reset window
// (rapid reset and server-provoked resets together), the memory cap, and a
// GOAWAY of our own when nghttp2 gives up with a fatal error (it sends none
// then).
#include "sluice/h2/session.hpp"

#include <nghttp2/nghttp2.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <new>

#include "sluice/core/assert.hpp"

namespace sluice::h2 {
namespace {

// Our allocations carry their size in front (nghttp2's free has no size):
// 16 bytes keep the payload aligned as malloc's is.
constexpr size_t k_alloc_header = 16;
constexpr uint8_t k_pieces_max = 8;
constexpr size_t k_response_fields_max = 64;
constexpr size_t k_goaway_frame_bytes = 17;

// An offset and length into a stream's header copy.
struct slot {
  uint32_t off = 0;
  uint32_t len = 0;
  bool set = false;
};

std::string_view sv(const uint8_t* p, size_t n) noexcept { return {reinterpret_cast<const char*>(p), n}; }

http::method method_of(std::string_view m) noexcept {
  using http::method;
  if (m == "GET") return method::get;
  if (m == "POST") return method::post;
  if (m == "HEAD") return method::head;
  if (m == "PUT") return method::put;
  if (m == "DELETE") return method::delete_;
  if (m == "OPTIONS") return method::options;
  if (m == "PATCH") return method::patch;
  if (m == "CONNECT") return method::connect;
  if (m == "TRACE") return method::trace;
  return method::other;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x + 32);
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y + 32);
    if (x != y) return false;
  }
  return true;
}

nghttp2_nv make_nv(std::string_view name, std::string_view value) noexcept {
  // nghttp2 copies names and values at submit (no NO_COPY flags) and never
  // writes through these pointers.
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

}  // namespace

// Shard-local, one per stream that sent a request HEADERS: from its first
// header until nghttp2 closes it (or the connection ends). Allocated from
// the session's counting allocator.
struct server_session::stream_state {
  int32_t id = 0;
  stream_state* next = nullptr;          // server_session::_streams
  stream_state* prev = nullptr;
  stream_state* drained_next = nullptr;  // server_session::_drained
  bool in_drained = false;
  // The request head: pseudo-header values, and the regular fields as
  // "name:value\r\n" lines, in one buffer that grows while the head is
  // decoded and never moves after it is reported.
  char* buf = nullptr;
  uint32_t buf_len = 0;
  uint32_t buf_cap = 0;
  uint32_t fields_off = 0;  // where the field lines start (pseudo-headers come first)
  bool fields_started = false;
  uint32_t list_bytes = 0;  // RFC 9113 §6.5.2 size of the decoded list
  uint32_t trailer_bytes = 0;
  uint16_t field_count = 0;
  slot method, scheme, authority, path;
  slot host, authorization, content_type, content_length, session_id, request_id, expect;
  bool too_large = false;    // answered 431 by the session
  bool malformed = false;    // reset PROTOCOL_ERROR by the session
  bool head_reported = false;
  bool abandoned = false;    // the owner never hears of it again (431, malformed)
  bool client_reset = false;
  bool server_reset = false; // RST_STREAM sent, by the owner or the session
  bool response_submitted = false;
  bool body_open = false;    // send_body() may still add pieces
  bool end_queued = false;   // the last piece is queued
  bool deferred = false;     // the data provider said NGHTTP2_ERR_DEFERRED
  bool response_ended = false;
  bool request_ended = false;
  // Body pieces in the caller's buffers, oldest first.
  uint8_t piece_first = 0;
  uint8_t piece_count = 0;
  size_t piece_off = 0;  // bytes of the first piece already copied
  iovec pieces[k_pieces_max] = {};

  std::string_view view(slot s) const noexcept { return {buf + s.off, s.len}; }
  bool owned() const noexcept { return head_reported && !abandoned; }
};

// The nghttp2 callbacks: each finds the session in user_data.
struct server_session::callbacks {
  static server_session& self(void* user_data) noexcept { return *static_cast<server_session*>(user_data); }

  // Returns: false when the copy could not grow (memory cap).
  static bool reserve(server_session& s, stream_state& st, size_t more) noexcept {
    const size_t need = size_t{st.buf_len} + more;
    if (need <= st.buf_cap) return true;
    size_t cap = st.buf_cap != 0 ? st.buf_cap * 2u : 512u;
    while (cap < need) cap *= 2;
    void* p = s.realloc_bytes(st.buf, cap);
    if (p == nullptr) return false;
    st.buf = static_cast<char*>(p);
    st.buf_cap = static_cast<uint32_t>(cap);
    return true;
  }

  static int fail(server_session& s, uint32_t code, std::string_view why) noexcept {
    s._fatal_code = code;
    s._reason = why;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }

  static int on_begin_headers(nghttp2_session* ng, const nghttp2_frame* frame, void* user_data) {
    server_session& s = self(user_data);
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    void* p = s.alloc(sizeof(stream_state));
    if (p == nullptr) return fail(s, enhance_your_calm, "memory cap: stream state");
    auto* st = new (p) stream_state();
    st->id = frame->hd.stream_id;
    st->next = s._streams;
    if (s._streams != nullptr) s._streams->prev = st;
    s._streams = st;
    ++s._streams_live;
    nghttp2_session_set_stream_user_data(ng, st->id, st);
    return 0;
  }

  static int on_header(nghttp2_session* ng, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t, void* user_data) {
    server_session& s = self(user_data);
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id));
    if (st == nullptr) return 0;
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST) {
      // Trailers: their fields are dropped, but their size is bounded too.
      const uint64_t size = uint64_t{st->trailer_bytes} + namelen + valuelen + 32;
      st->trailer_bytes = size > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(size);
      if (size > uint64_t{s._opt.header_list_bytes_max} * 4) {
        ++s._counters.hpack_bombs;
        return fail(s, enhance_your_calm, "decoded trailer list far over the limit");
      }
      return 0;
    }
    const uint64_t size = uint64_t{st->list_bytes} + namelen + valuelen + 32;
    st->list_bytes = size > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(size);
    // HPACK lets a few bytes on the wire name a big dynamic-table entry
    // again and again: past 4x the limit, decoding on is the attack.
    if (size > uint64_t{s._opt.header_list_bytes_max} * 4) {
      ++s._counters.hpack_bombs;
      return fail(s, enhance_your_calm, "decoded header list far over the limit");
    }
    if (size > s._opt.header_list_bytes_max) st->too_large = true;
    if (st->too_large || st->malformed) return 0;  // decode on (HPACK state), keep nothing
    const std::string_view n = sv(name, namelen);
    if (!n.empty() && n[0] == ':') {
      // nghttp2's HTTP messaging has checked the set (known names, no
      // repeats, none after a regular field).
      slot* dst = nullptr;
      if (n == ":method") dst = &st->method;
      else if (n == ":scheme") dst = &st->scheme;
      else if (n == ":authority") dst = &st->authority;
      else if (n == ":path") dst = &st->path;
      if (dst == nullptr) return 0;  // :protocol (extended CONNECT is not offered)
      if (!reserve(s, *st, valuelen)) return fail(s, enhance_your_calm, "memory cap: request head");
      *dst = {st->buf_len, static_cast<uint32_t>(valuelen), true};
      std::memcpy(st->buf + st->buf_len, value, valuelen);
      st->buf_len += static_cast<uint32_t>(valuelen);
      return 0;
    }
    if (!st->fields_started) {
      st->fields_started = true;
      st->fields_off = st->buf_len;
    }
    if (!reserve(s, *st, namelen + valuelen + 3)) return fail(s, enhance_your_calm, "memory cap: request head");
    char* line = st->buf + st->buf_len;
    std::memcpy(line, name, namelen);
    line[namelen] = ':';
    std::memcpy(line + namelen + 1, value, valuelen);
    line[namelen + 1 + valuelen] = '\r';
    line[namelen + 2 + valuelen] = '\n';
    const slot value_slot{static_cast<uint32_t>(st->buf_len + namelen + 1), static_cast<uint32_t>(valuelen), true};
    st->buf_len += static_cast<uint32_t>(namelen + valuelen + 3);
    ++st->field_count;
    // The fields the policy reads: one each, as http::request_parser wants.
    slot* known = nullptr;
    if (n == "authorization") known = &st->authorization;
    else if (n == "content-type") known = &st->content_type;
    else if (n == "content-length") known = &st->content_length;
    else if (n == "host") known = &st->host;
    else if (n == "x-session-id") known = &st->session_id;
    else if (n == "x-request-id") known = &st->request_id;
    else if (n == "expect") known = &st->expect;
    if (known != nullptr) {
      if (known->set) st->malformed = true;
      *known = value_slot;
    }
    return 0;
  }

  // Returns: false when the reset window overflowed (the caller fails the
  // session with ENHANCE_YOUR_CALM).
  static bool note_reset(server_session& s) noexcept {
    if (s._now_ms - s._reset_window_start_ms >= s._opt.reset_window_ms || s._now_ms < s._reset_window_start_ms) {
      s._reset_window_start_ms = s._now_ms;
      s._resets_in_window = 0;
    }
    if (++s._resets_in_window <= s._opt.resets_per_window_max) return true;
    ++s._counters.rapid_reset_goaways;
    return false;
  }

  static void build_request(const stream_state& st, bool end_stream, request& r) noexcept {
    r.stream_id = st.id;
    r.method = st.view(st.method);
    r.scheme = st.view(st.scheme);
    r.authority = st.authority.set ? st.view(st.authority) : st.view(st.host);
    r.path = st.view(st.path);
    r.expect = st.view(st.expect);
    r.end_stream = end_stream;
    http::request_head& h = r.head;
    h.meth = method_of(r.method);
    h.method_name = r.method;
    h.target = r.path;
    const size_t cut = r.path.find_first_of("?#");
    h.path = cut == std::string_view::npos ? r.path : r.path.substr(0, cut);
    h.version_major = 2;
    h.version_minor = 0;
    h.keep_alive = true;
    h.chunked = false;
    h.expect_continue = iequals(r.expect, "100-continue");
    h.authorization = st.view(st.authorization);
    h.host = r.authority;
    h.session_id = st.view(st.session_id);
    h.request_id = st.view(st.request_id);
    h.content_type = st.view(st.content_type);
    h.header_count = st.field_count;
    h.field_lines = st.fields_started ? std::string_view(st.buf + st.fields_off, st.buf_len - st.fields_off)
                                      : std::string_view();
    h.head_bytes = st.buf_len;
    if (st.content_length.set) {
      // nghttp2 has checked it is a number (and will check the DATA against it).
      const std::string_view cl = st.view(st.content_length);
      uint64_t n = 0;
      auto [end, ec] = std::from_chars(cl.data(), cl.data() + cl.size(), n);
      h.has_content_length = ec == std::errc{} && end == cl.data() + cl.size();
      h.content_length = h.has_content_length ? n : 0;
    }
  }

  // The head is whole: check what nghttp2 leaves to us, then report it.
  static int on_request_headers(server_session& s, nghttp2_session* ng, const nghttp2_frame* frame,
                                stream_state& st) {
    const bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    st.request_ended = end_stream;
    if (!st.too_large && !st.malformed && st.authority.set && st.host.set &&
        st.view(st.authority) != st.view(st.host))
      st.malformed = true;  // RFC 9113 §8.3.1: host must name what :authority does
    if (st.too_large) {
      // A 431 of our own (the owner never sees the stream); a body still
      // coming is cut with RST_STREAM NO_ERROR after it (RFC 9113 §8.1).
      ++s._counters.header_lists_too_large;
      st.abandoned = true;
      const nghttp2_nv nva[] = {make_nv(":status", "431")};
      if (nghttp2_submit_response(ng, st.id, nva, 1, nullptr) != 0)
        return fail(s, enhance_your_calm, "memory cap: 431 response");
      st.response_submitted = true;
      // A body still coming is cut with RST_STREAM NO_ERROR once the 431 is
      // out (on_frame_send): submitted now, it would make nghttp2 drop the
      // HEADERS of a stream it then sees as closing.
      return 0;
    }
    if (st.malformed) {
      // RFC 9113 §8.1.1: a malformed request is a stream error
      // PROTOCOL_ERROR. The client made the server reset: it counts in the
      // reset window (MadeYouReset).
      ++s._counters.malformed_requests;
      ++s._counters.provoked_resets;
      st.abandoned = true;
      st.server_reset = true;
      if (nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, st.id, NGHTTP2_PROTOCOL_ERROR) != 0)
        return fail(s, enhance_your_calm, "memory cap: RST_STREAM");
      if (!note_reset(s)) return fail(s, enhance_your_calm, "too many resets in the window");
      return 0;
    }
    request r;
    build_request(st, end_stream, r);
    st.head_reported = true;
    ++s._counters.streams_opened;
    s._owner.on_request_head(r);
    return 0;
  }

  static int on_frame_recv(nghttp2_session* ng, const nghttp2_frame* frame, void* user_data) {
    server_session& s = self(user_data);
    const int32_t id = frame->hd.stream_id;
    switch (frame->hd.type) {
      case NGHTTP2_HEADERS: {
        auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id));
        if (st == nullptr) return 0;
        if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) return on_request_headers(s, ng, frame, *st);
        // Trailers (their fields are dropped): they end the body.
        if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 && !st->request_ended) {
          st->request_ended = true;
          if (st->owned()) s._owner.on_request_data(id, {}, true);
        }
        return 0;
      }
      case NGHTTP2_DATA: {
        auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id));
        if (st != nullptr && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 && !st->request_ended) {
          st->request_ended = true;
          if (st->owned()) s._owner.on_request_data(id, {}, true);
        }
        return 0;
      }
      case NGHTTP2_RST_STREAM: {
        ++s._counters.client_resets;
        if (auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id)))
          st->client_reset = true;
        if (!note_reset(s)) return fail(s, enhance_your_calm, "too many resets in the window");
        return 0;
      }
      case NGHTTP2_GOAWAY:
        s._owner.on_goaway(frame->goaway.error_code, true);
        return 0;
      default:
        return 0;
    }
  }

  static int on_data_chunk(nghttp2_session* ng, uint8_t, int32_t id, const uint8_t* data, size_t len,
                           void* user_data) {
    server_session& s = self(user_data);
    auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id));
    if (st != nullptr && st->owned() && !st->server_reset) {
      s._owner.on_request_data(id, {reinterpret_cast<const char*>(data), len}, false);
    } else {
      nghttp2_session_consume(ng, id, len);  // nobody reads it: the window stays open
    }
    return 0;
  }

  static int on_stream_close(nghttp2_session* ng, int32_t id, uint32_t code, void* user_data) {
    server_session& s = self(user_data);
    auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id));
    if (st == nullptr) return 0;
    nghttp2_session_set_stream_user_data(ng, id, nullptr);
    if (st->owned()) {
      // The last pieces were taken by the frame that ended the stream: that
      // is told first (the owner's calls find the stream gone already).
      if (st->in_drained) s._owner.on_body_drained(id);
      close_cause cause = close_cause::done;
      if (st->client_reset) cause = close_cause::client_reset;
      else if (st->server_reset || code != NGHTTP2_NO_ERROR || !st->response_ended) cause = close_cause::server_reset;
      s._owner.on_stream_closed(id, cause, code);
    }
    s.free_stream(st);
    return 0;
  }

  static int on_frame_send(nghttp2_session* ng, const nghttp2_frame* frame, void* user_data) {
    server_session& s = self(user_data);
    const int32_t id = frame->hd.stream_id;
    switch (frame->hd.type) {
      case NGHTTP2_RST_STREAM: {
        s._recent_resets[s._recent_reset_next++ % std::size(s._recent_resets)] = id;
        auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id));
        if (st != nullptr && st->server_reset) return 0;  // ours: counted when made
        if (st != nullptr) st->server_reset = true;
        if (frame->rst_stream.error_code == NGHTTP2_REFUSED_STREAM) {
          ++s._counters.streams_refused;
          return 0;
        }
        // nghttp2 reset the stream for the client's error (a bad field, a
        // WINDOW_UPDATE of 0, DATA past the window...): MadeYouReset.
        ++s._counters.provoked_resets;
        if (!note_reset(s)) return fail(s, enhance_your_calm, "too many resets in the window");
        return 0;
      }
      case NGHTTP2_GOAWAY:
        s._goaway_sent = true;
        s._goaway_code = frame->goaway.error_code;
        if (frame->goaway.error_code != NGHTTP2_NO_ERROR) {
          ++s._counters.connection_errors;
          if (s._reason.empty()) s._reason = "protocol error (nghttp2)";
        }
        s._owner.on_goaway(frame->goaway.error_code, false);
        return 0;
      case NGHTTP2_HEADERS:
      case NGHTTP2_DATA:
        if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
          auto* st = static_cast<stream_state*>(nghttp2_session_get_stream_user_data(ng, id));
          if (st == nullptr) return 0;
          st->response_ended = true;
          if (st->too_large && !st->request_ended && !st->server_reset) {
            st->server_reset = true;
            nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR);
          }
        }
        return 0;
      default:
        return 0;
    }
  }

  // nghttp2 ignores a HEADERS on a lower stream id it has forgotten
  // (RFC 9113 §5.1.1 wants PROTOCOL_ERROR): a HEADERS at or below the
  // highest id seen, for a stream nghttp2 no longer knows, is that. One it
  // still knows (open: trailers; closed and retained) is left to nghttp2.
  static int on_begin_frame(nghttp2_session* ng, const nghttp2_frame_hd* hd, void* user_data) {
    server_session& s = self(user_data);
    if (hd->type == NGHTTP2_CONTINUATION) {
      // Counted here as well as by nghttp2 (where it has the backported
      // limit): each CONTINUATION costs a decode, and none is needed past a
      // few for any real header list.
      if (++s._continuations > s._opt.max_continuations) {
        ++s._counters.continuation_floods;
        return fail(s, enhance_your_calm, "CONTINUATION flood");
      }
      return 0;
    }
    if ((hd->type == NGHTTP2_PING || hd->type == NGHTTP2_SETTINGS) && (hd->flags & NGHTTP2_FLAG_ACK) == 0) {
      // nghttp2 catches ACKs piling up unread (max_outbound_acks); a client
      // that reads its ACKs is held to a rate instead.
      if (s._now_ms - s._control_window_start_ms >= s._opt.control_window_ms ||
          s._now_ms < s._control_window_start_ms) {
        s._control_window_start_ms = s._now_ms;
        s._control_in_window = 0;
      }
      if (++s._control_in_window > s._opt.control_frames_per_window_max) {
        ++s._counters.control_floods;
        return fail(s, enhance_your_calm, "SETTINGS / PING flood: over the rate");
      }
      return 0;
    }
    if (hd->type != NGHTTP2_HEADERS || hd->stream_id <= 0) return 0;
    s._continuations = 0;
    if (hd->stream_id > s._max_stream_id) {
      s._max_stream_id = hd->stream_id;
      return 0;
    }
    if (nghttp2_session_find_stream(ng, hd->stream_id) != nullptr) return 0;
    for (int32_t id : s._recent_resets)
      if (id == hd->stream_id) return 0;  // trailers racing our RST_STREAM: ignored
    return fail(s, protocol_error, "HEADERS on a stream id going backwards");
  }

  static int on_invalid_frame(nghttp2_session*, const nghttp2_frame*, int, void* user_data) {
    ++self(user_data)._counters.invalid_frames;
    return 0;
  }

  // The data provider: copies from the caller's pieces into nghttp2's frame
  // (at most `length`: what the windows and the frame size allow).
  static ssize_t read_body(nghttp2_session*, int32_t, uint8_t* out, size_t length, uint32_t* data_flags,
                           nghttp2_data_source* source, void* user_data) {
    server_session& s = self(user_data);
    auto* st = static_cast<stream_state*>(source->ptr);
    const bool had = st->piece_count != 0;
    size_t n = 0;
    while (n < length && st->piece_count != 0) {
      const iovec& piece = st->pieces[st->piece_first];
      const size_t left = piece.iov_len - st->piece_off;
      const size_t take = left < length - n ? left : length - n;
      std::memcpy(out + n, static_cast<const char*>(piece.iov_base) + st->piece_off, take);
      n += take;
      st->piece_off += take;
      if (st->piece_off == piece.iov_len) {
        st->piece_off = 0;
        st->piece_first = static_cast<uint8_t>((st->piece_first + 1) % k_pieces_max);
        --st->piece_count;
      }
    }
    if (st->piece_count == 0) {
      if (had && !st->in_drained) {
        // Told after the mem_send returns (deliver_drained): the owner may
        // then queue more without re-entering nghttp2 from its own callback.
        st->in_drained = true;
        st->drained_next = s._drained;
        s._drained = st;
      }
      if (st->end_queued) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
      } else if (n == 0) {
        st->deferred = true;
        return NGHTTP2_ERR_DEFERRED;
      }
    }
    return static_cast<ssize_t>(n);
  }
};

// --- the counting allocator ---------------------------------------------------------

void* server_session::alloc(size_t n) noexcept {
  const size_t total = n + k_alloc_header;
  if (total < n || _mem_used + total > _opt.memory_bytes_max) {
    ++_counters.memory_refusals;
    return nullptr;
  }
  void* p = std::malloc(total);
  if (p == nullptr) return nullptr;
  *static_cast<size_t*>(p) = total;
  _mem_used += total;
  if (_mem_used > _mem_peak) _mem_peak = _mem_used;
  return static_cast<char*>(p) + k_alloc_header;
}

void server_session::dealloc(void* p) noexcept {
  if (p == nullptr) return;
  char* base = static_cast<char*>(p) - k_alloc_header;
  _mem_used -= *reinterpret_cast<size_t*>(base);
  std::free(base);
}

void* server_session::realloc_bytes(void* p, size_t n) noexcept {
  if (p == nullptr) return alloc(n);
  if (n == 0) {
    dealloc(p);
    return nullptr;
  }
  char* base = static_cast<char*>(p) - k_alloc_header;
  const size_t old_total = *reinterpret_cast<size_t*>(base);
  const size_t total = n + k_alloc_header;
  if (total < n || _mem_used - old_total + total > _opt.memory_bytes_max) {
    ++_counters.memory_refusals;
    return nullptr;
  }
  void* q = std::realloc(base, total);
  if (q == nullptr) return nullptr;
  *static_cast<size_t*>(q) = total;
  _mem_used = _mem_used - old_total + total;
  if (_mem_used > _mem_peak) _mem_peak = _mem_used;
  return static_cast<char*>(q) + k_alloc_header;
}

void* server_session::mem_malloc(size_t n, void* self) { return static_cast<server_session*>(self)->alloc(n); }
void server_session::mem_free(void* p, void* self) { static_cast<server_session*>(self)->dealloc(p); }
void* server_session::mem_calloc(size_t count, size_t n, void* self) {
  if (n != 0 && count > SIZE_MAX / n) return nullptr;
  void* p = static_cast<server_session*>(self)->alloc(count * n);
  if (p != nullptr) std::memset(p, 0, count * n);
  return p;
}
void* server_session::mem_realloc(void* p, size_t n, void* self) {
  return static_cast<server_session*>(self)->realloc_bytes(p, n);
}

// --- the session ----------------------------------------------------------------

server_session::server_session(session_owner& owner, const options& o) : _owner(owner), _opt(o) {
  if (_opt.output_buffer_bytes < 64) _opt.output_buffer_bytes = 64;
  _out = static_cast<char*>(alloc(_opt.output_buffer_bytes));
  if (_out == nullptr) {
    _fatal = true;
    _fatal_goaway_written = true;  // nothing to send: done() at once
    _reason = "memory cap: output ring";
    return;
  }
  _out_cap = _opt.output_buffer_bytes;

  nghttp2_session_callbacks* cbs = nullptr;
  nghttp2_option* opt = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0 || nghttp2_option_new(&opt) != 0) {
    if (cbs != nullptr) nghttp2_session_callbacks_del(cbs);
    _fatal = true;
    _fatal_goaway_written = true;
    _reason = "out of memory";
    return;
  }
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &callbacks::on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &callbacks::on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &callbacks::on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &callbacks::on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &callbacks::on_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, &callbacks::on_frame_send);
  nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cbs, &callbacks::on_invalid_frame);
  nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, &callbacks::on_begin_frame);

  // The owner gives the receive windows back (consume) as it uses the body.
  nghttp2_option_set_no_auto_window_update(opt, 1);
#ifdef SLUICE_NGHTTP2_HAS_MAX_CONTINUATIONS
  // Backported to Debian 12's 1.52 (detected by symbol, src/h2/meson.build).
  nghttp2_option_set_max_continuations(opt, _opt.max_continuations);
#endif
  nghttp2_option_set_max_settings(opt, _opt.max_settings_entries);
  nghttp2_option_set_max_outbound_ack(opt, _opt.max_outbound_acks);
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, _opt.hpack_encoder_table_bytes);
  // nghttp2's own reset limiter answers INTERNAL_ERROR from a wall clock;
  // ours (note_reset) answers ENHANCE_YOUR_CALM from now_ms and counts the
  // server-provoked resets too. nghttp2's stays as a looser backstop.
#ifdef SLUICE_NGHTTP2_HAS_RESET_RATE_LIMIT
  nghttp2_option_set_stream_reset_rate_limit(opt, uint64_t{_opt.resets_per_window_max} * 4 + 16,
                                             uint64_t{_opt.resets_per_window_max} * 4 + 16);
#endif

  nghttp2_mem mem{this, &mem_malloc, &mem_free, &mem_calloc, &mem_realloc};
  const int rv = nghttp2_session_server_new3(&_session, cbs, this, opt, &mem);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    _session = nullptr;
    _fatal = true;
    _fatal_goaway_written = true;
    _reason = "memory cap: nghttp2 session";
    return;
  }
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, _opt.max_concurrent_streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, _opt.stream_window_bytes},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, _opt.header_list_bytes_max},
      {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, _opt.hpack_table_bytes},
  };
  if (nghttp2_submit_settings(_session, NGHTTP2_FLAG_NONE, settings, std::size(settings)) != 0 ||
      nghttp2_session_set_local_window_size(_session, NGHTTP2_FLAG_NONE, 0,
                                            static_cast<int32_t>(_opt.connection_window_bytes)) != 0) {
    fatal(internal_error, "memory cap: SETTINGS");
    return;
  }
  fill_output();
}

server_session::~server_session() {
  while (_streams != nullptr) free_stream(_streams);
  if (_session != nullptr) nghttp2_session_del(_session);
  dealloc(_out);
}

server_session::stream_state* server_session::find(int32_t stream_id) const noexcept {
  if (_session == nullptr || stream_id <= 0) return nullptr;
  return static_cast<stream_state*>(nghttp2_session_get_stream_user_data(_session, stream_id));
}

void server_session::free_stream(stream_state* st) noexcept {
  if (st->prev != nullptr) st->prev->next = st->next;
  else _streams = st->next;
  if (st->next != nullptr) st->next->prev = st->prev;
  if (st->in_drained) {
    for (stream_state** p = &_drained; *p != nullptr; p = &(*p)->drained_next) {
      if (*p == st) {
        *p = st->drained_next;
        break;
      }
    }
  }
  --_streams_live;
  dealloc(st->buf);
  st->~stream_state();
  dealloc(st);
}

bool server_session::feed(std::span<const char> bytes, uint64_t now_ms) {
  if (over()) return false;
  _now_ms = now_ms;
  ++_depth;
  const ssize_t rv =
      nghttp2_session_mem_recv(_session, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  --_depth;
  if (rv < 0) fatal_from_nghttp2(rv);
  fill_output();
  return !over();
}

bool server_session::over() const noexcept {
  // nghttp2 sent a GOAWAY with an error code (terminate_session): it reads
  // nothing more either.
  return _fatal || _session == nullptr || (_goaway_sent && _goaway_code != no_error);
}

void server_session::fatal_from_nghttp2(long rv) noexcept {
  switch (rv) {
    case NGHTTP2_ERR_CALLBACK_FAILURE:
      fatal(_fatal_code != 0 ? _fatal_code : internal_error, _reason.empty() ? "callback failure" : _reason);
      return;
    case NGHTTP2_ERR_FLOODED:
      ++_counters.ack_floods;
      fatal(enhance_your_calm, "SETTINGS / PING flood: ACKs piled up unread");
      return;
#ifdef SLUICE_NGHTTP2_HAS_MAX_CONTINUATIONS
    case NGHTTP2_ERR_TOO_MANY_CONTINUATIONS:
      ++_counters.continuation_floods;
      fatal(enhance_your_calm, "CONTINUATION flood");
      return;
#endif
    case NGHTTP2_ERR_NOMEM:
      fatal(enhance_your_calm, "memory cap");
      return;
    case NGHTTP2_ERR_BAD_CLIENT_MAGIC:
      fatal(protocol_error, "no HTTP/2 client preface");
      return;
    default:
      fatal(protocol_error, nghttp2_strerror(static_cast<int>(rv)));
      return;
  }
}

void server_session::fatal(uint32_t code, std::string_view why) noexcept {
  if (_fatal) return;
  _fatal = true;
  _goaway_code = code;
  if (_reason.empty() || _fatal_code == 0) _reason = why;
  if (code != no_error) ++_counters.connection_errors;
  // Streams still open end with the connection; then nghttp2 goes (what it
  // had queued is dropped: only our GOAWAY follows the bytes already out).
  close_all_streams(code);
  if (_session != nullptr) {
    _last_stream_id = nghttp2_session_get_last_proc_stream_id(_session);
    nghttp2_session_del(_session);
    _session = nullptr;
  }
  _owner.on_goaway(code, false);
}

void server_session::close_all_streams(uint32_t code) {
  while (_streams != nullptr) {
    stream_state* st = _streams;
    if (_session != nullptr) nghttp2_session_set_stream_user_data(_session, st->id, nullptr);
    const bool tell = st->owned();
    const int32_t id = st->id;
    free_stream(st);
    if (tell) _owner.on_stream_closed(id, close_cause::connection_closed, code);
  }
}

size_t server_session::append_output(const uint8_t* p, size_t n) noexcept {
  const size_t room = _out_cap - _out_size;
  if (n > room) n = room;
  const size_t tail = (size_t{_out_head} + _out_size) % _out_cap;
  const size_t first = n < _out_cap - tail ? n : _out_cap - tail;
  std::memcpy(_out + tail, p, first);
  std::memcpy(_out, p + first, n - first);
  _out_size += static_cast<uint32_t>(n);
  return n;
}

void server_session::pump() {
  for (;;) {
    if (_carry_len != 0) {
      const size_t n = append_output(_carry, _carry_len);
      _carry += n;
      _carry_len -= n;
      if (_carry_len != 0) return;  // the ring is full
    }
    if (_fatal) {
      if (!_fatal_goaway_written && _out_cap - _out_size >= k_goaway_frame_bytes) {
        const uint32_t last = static_cast<uint32_t>(_last_stream_id) & 0x7fffffffu;
        const uint8_t frame[k_goaway_frame_bytes] = {
            0, 0, 8, NGHTTP2_GOAWAY, 0, 0, 0, 0, 0,
            static_cast<uint8_t>(last >> 24), static_cast<uint8_t>(last >> 16), static_cast<uint8_t>(last >> 8),
            static_cast<uint8_t>(last), static_cast<uint8_t>(_goaway_code >> 24),
            static_cast<uint8_t>(_goaway_code >> 16), static_cast<uint8_t>(_goaway_code >> 8),
            static_cast<uint8_t>(_goaway_code)};
        append_output(frame, sizeof frame);
        _fatal_goaway_written = true;
        _goaway_sent = true;
      }
      return;
    }
    if (_session == nullptr || _out_size == _out_cap) return;
    const uint8_t* p = nullptr;
    ++_depth;
    const ssize_t rv = nghttp2_session_mem_send(_session, &p);
    --_depth;
    if (rv < 0) {
      fatal_from_nghttp2(rv);
      continue;
    }
    if (rv == 0) return;
    _carry = p;
    _carry_len = static_cast<size_t>(rv);
  }
}

void server_session::deliver_drained() {
  while (_drained != nullptr) {
    stream_state* st = _drained;
    _drained = st->drained_next;
    st->in_drained = false;
    st->drained_next = nullptr;
    if (st->owned()) _owner.on_body_drained(st->id);
  }
}

void server_session::fill_output() {
  if (_depth != 0 || _filling) {
    _refill = true;  // the outer call pumps again when it is back
    return;
  }
  _filling = true;
  do {
    _refill = false;
    pump();
    deliver_drained();
    // nghttp2 ended the connection with an error GOAWAY (it closes no
    // streams itself then): the open ones end with it.
    if (_goaway_sent && _goaway_code != no_error && _streams != nullptr && !_fatal) close_all_streams(_goaway_code);
  } while (_refill);
  _filling = false;
}

std::span<const char> server_session::pending_output() const noexcept {
  const size_t first = _out_size < _out_cap - _out_head ? _out_size : _out_cap - _out_head;
  return {_out + _out_head, first};
}

void server_session::consume_output(size_t n) {
  SLUICE_ASSERT(n <= pending_output().size());
  _out_head = static_cast<uint32_t>((_out_head + n) % (_out_cap != 0 ? _out_cap : 1));
  _out_size -= static_cast<uint32_t>(n);
  if (_out_size == 0) _out_head = 0;
  fill_output();
}

bool server_session::done() const noexcept {
  if (_out_size != 0 || _carry_len != 0) return false;
  if (_fatal) return _fatal_goaway_written;
  return nghttp2_session_want_read(_session) == 0 && nghttp2_session_want_write(_session) == 0;
}

bool server_session::submit_response(int32_t stream_id, uint16_t status, std::span<const field> fields,
                                     bool end_stream) {
  stream_state* st = find(stream_id);
  if (st == nullptr || !st->owned() || st->response_submitted || st->server_reset || st->client_reset) return false;
  if (fields.size() + 1 > k_response_fields_max || status < 100 || status > 999) return false;
  char status_text[3] = {static_cast<char>('0' + status / 100), static_cast<char>('0' + status / 10 % 10),
                         static_cast<char>('0' + status % 10)};
  nghttp2_nv nva[k_response_fields_max];
  nva[0] = make_nv(":status", {status_text, 3});
  for (size_t i = 0; i < fields.size(); ++i) nva[i + 1] = make_nv(fields[i].name, fields[i].value);
  nghttp2_data_provider body;
  body.source.ptr = st;
  body.read_callback = &callbacks::read_body;
  if (nghttp2_submit_response(_session, stream_id, nva, fields.size() + 1, end_stream ? nullptr : &body) != 0)
    return false;
  st->response_submitted = true;
  st->body_open = !end_stream;
  fill_output();
  return true;
}

bool server_session::send_body(int32_t stream_id, std::span<const iovec> pieces, bool end_stream) {
  stream_state* st = find(stream_id);
  if (st == nullptr || !st->owned() || !st->body_open) return false;
  size_t nonempty = 0;
  for (const iovec& piece : pieces) nonempty += piece.iov_len != 0 ? 1 : 0;
  if (st->piece_count + nonempty > k_pieces_max) return false;
  for (const iovec& v : pieces) {
    if (v.iov_len == 0) continue;
    st->pieces[(st->piece_first + st->piece_count) % k_pieces_max] = v;
    ++st->piece_count;
  }
  if (end_stream) {
    st->end_queued = true;
    st->body_open = false;
  }
  if (st->deferred) {
    st->deferred = false;
    nghttp2_session_resume_data(_session, stream_id);
  }
  fill_output();
  return true;
}

bool server_session::reset_stream(int32_t stream_id, uint32_t code) {
  stream_state* st = find(stream_id);
  if (st == nullptr || st->server_reset) return false;
  st->server_reset = true;
  if (nghttp2_submit_rst_stream(_session, NGHTTP2_FLAG_NONE, stream_id, code) != 0) return false;
  fill_output();
  return true;
}

void server_session::consume(int32_t stream_id, size_t n) {
  if (_session == nullptr || n == 0) return;
  // On a stream already closed this gives back the connection window only.
  nghttp2_session_consume(_session, stream_id, n);
  fill_output();
}

void server_session::drain() {
  if (_session == nullptr || _goaway_sent) return;
  nghttp2_submit_goaway(_session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(_session),
                        NGHTTP2_NO_ERROR, nullptr, 0);
  fill_output();
}

sniff looks_like_h2_preface(std::span<const char> bytes) noexcept {
  const size_t n = bytes.size() < k_client_preface.size() ? bytes.size() : k_client_preface.size();
  if (n == 0) return sniff::need_more;
  if (std::memcmp(bytes.data(), k_client_preface.data(), n) != 0) return sniff::no;
  return n == k_client_preface.size() ? sniff::yes : sniff::need_more;
}

}  // namespace sluice::h2
