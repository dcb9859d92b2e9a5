// h2: the nghttp2 callbacks of the server session. nghttp2 does the
// framing, HPACK, flow control and most of RFC 9113's checks; these add what
// it leaves to the application: the header list limit, the duplicate-field
// rules sluice's HTTP/1.1 parser has, stream ids going backwards, the
// CONTINUATION count, the PING / SETTINGS rate, the reset window (rapid
// reset and server-provoked resets together), and the events to the owner.
#include <charconv>
#include <cstring>
#include <new>

#include "stream_state.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/text.hpp"
#include "sluice/http/chunked.hpp"

namespace sluice::h2 {

namespace {
constexpr size_t k_frame_header_bytes = 9;  // RFC 9113 §4.1
}  // namespace
namespace {

using detail::make_nv;

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

}  // namespace

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
    else if (n == "x-api-key") known = &st->api_key;
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
    h.api_key = st.view(st.api_key);
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
  // Queues the stream for on_body_drained (told after the mem_send returns,
  // by deliver_drained: the owner may then queue more without re-entering
  // nghttp2 from its own callback).
  static void note_drained(server_session& s, stream_state* st) noexcept {
    if (st->in_drained) return;
    st->in_drained = true;
    st->drained_next = s._drained;
    s._drained = st;
  }

  // Copies n payload bytes from the front of the stream's pieces to `out`
  // (or, out null, into the session's output ring), consuming them. A
  // chunked piece's size lines and CRLFs are stepped over, never copied.
  static void take_pieces(server_session& s, stream_state* st, uint8_t* out, size_t n) noexcept {
    size_t done = 0;
    while (done < n && st->piece_count != 0) {
      const uint8_t slot = st->piece_first;
      const iovec& piece = st->pieces[slot];
      const char* base = static_cast<const char*>(piece.iov_base);
      size_t take = st->payloads[slot] - st->payload_off;
      if ((st->chunked_slots >> slot & 1u) != 0 && st->chunk_left == 0) {
        // send_body counted this piece's whole chunks with the same reader
        // (scan_whole_chunks), so each size line read here is one it read.
        uint64_t size = 0;
        const bool line = http::read_chunk_size_line(base, piece.iov_len, st->piece_off, size);
        SLUICE_VERIFY(line && size != 0 && size <= piece.iov_len - st->piece_off);
        st->chunk_left = static_cast<size_t>(size);
      }
      if ((st->chunked_slots >> slot & 1u) != 0) take = st->chunk_left;
      if (take > n - done) take = n - done;
      const char* from = base + st->piece_off;
      if (out != nullptr) {
        std::memcpy(out + done, from, take);
      } else {
        s.append_output(reinterpret_cast<const uint8_t*>(from), take);
      }
      done += take;
      st->piece_off += take;
      st->payload_off += take;
      if ((st->chunked_slots >> slot & 1u) != 0) {
        st->chunk_left -= take;
        if (st->chunk_left == 0) st->piece_off += 2;  // the data's CRLF
      }
      if (st->payload_off == st->payloads[slot]) {
        st->piece_off = st->payload_off = st->chunk_left = 0;
        st->piece_first = static_cast<uint8_t>((st->piece_first + 1) % k_pieces_max);
        --st->piece_count;
      }
    }
  }

  static ssize_t read_body(nghttp2_session*, int32_t, uint8_t* out, size_t length, uint32_t* data_flags,
                           nghttp2_data_source* source, void* user_data) {
    server_session& s = self(user_data);
    auto* st = static_cast<stream_state*>(source->ptr);
    size_t queued = 0;  // payload bytes waiting in the pieces
    for (uint8_t i = 0; i < st->piece_count; ++i) queued += st->payloads[(st->piece_first + i) % k_pieces_max];
    queued -= st->payload_off;
    const size_t n = queued < length ? queued : length;
    const bool all = n == queued;
    if (n == 0) {
      if (st->end_queued) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        return 0;
      }
      st->deferred = true;
      return NGHTTP2_ERR_DEFERRED;
    }
    if (all && st->end_queued) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    if (s._out_cap - s._out_size >= n + k_frame_header_bytes) {
      // The ring has room for the whole frame: send_data writes the header
      // and copies the pieces straight into it (one copy, not two).
      *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
      return static_cast<ssize_t>(n);
    }
    take_pieces(s, st, out, n);
    if (st->piece_count == 0) note_drained(s, st);
    return static_cast<ssize_t>(n);
  }

  // A DATA frame whose bytes read_body left in the pieces (NO_COPY): its
  // header, then the bytes, into the output ring (room checked there; the
  // ring takes nothing else between the two calls).
  static int send_data(nghttp2_session*, nghttp2_frame* frame, const uint8_t* framehd, size_t length,
                       nghttp2_data_source* source, void* user_data) {
    server_session& s = self(user_data);
    auto* st = static_cast<stream_state*>(source->ptr);
    if (frame->data.padlen != 0) return NGHTTP2_ERR_CALLBACK_FAILURE;  // sluice never pads
    if (s._out_cap - s._out_size < length + k_frame_header_bytes) return NGHTTP2_ERR_WOULDBLOCK;
    s.append_output(framehd, k_frame_header_bytes);
    take_pieces(s, st, nullptr, length);
    if (st->piece_count == 0) note_drained(s, st);
    return 0;
  }
};

namespace detail {

void set_callbacks(nghttp2_session_callbacks* cbs) noexcept {
  using cb = server_session::callbacks;
  nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, &cb::on_begin_frame);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &cb::on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &cb::on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &cb::on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &cb::on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &cb::on_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, &cb::on_frame_send);
  nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cbs, &cb::on_invalid_frame);
  nghttp2_session_callbacks_set_send_data_callback(cbs, &cb::send_data);
}

nghttp2_data_provider body_provider(server_session::stream_state* st) noexcept {
  nghttp2_data_provider p;
  p.source.ptr = st;
  p.read_callback = &server_session::callbacks::read_body;
  return p;
}

}  // namespace detail
}  // namespace sluice::h2
