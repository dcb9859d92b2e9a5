// h2: the server session (see include/sluice/h2/session.hpp): the counting
// allocator, the output ring that nghttp2_session_mem_send fills, the API
// the owner calls, and a GOAWAY of our own when nghttp2 gives up with a
// fatal error (it sends none then). The nghttp2 callbacks are in
// callbacks.cpp.
#include <nghttp2/nghttp2.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "sluice/core/assert.hpp"
#include "sluice/http/chunked.hpp"
#include "stream_state.hpp"

namespace sluice::h2 {
namespace {

using detail::make_nv;

// Our allocations carry their size in front (nghttp2's free has no size):
// 16 bytes keep the payload aligned as malloc's is.
constexpr size_t k_alloc_header = 16;
constexpr size_t k_response_fields_max = 64;
constexpr size_t k_goaway_frame_bytes = 17;

}  // namespace

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
  detail::set_callbacks(cbs);

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

bool unique_per_response(std::string_view name) noexcept {
  // Indexed, each such value would take a slot of the 4 KiB encoder table
  // and push out the fields that do repeat (content-type, server), which
  // then go as literals and are indexed again: churn with no hit.
  switch (name.size()) {
    case 12: return name == "x-request-id";
    case 20: return name == "openai-processing-ms";
    default:
      return name.starts_with("x-ratelimit-remaining-") || name.starts_with("x-ratelimit-reset-");
  }
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
  for (size_t i = 0; i < fields.size(); ++i) {
    nva[i + 1] = make_nv(fields[i].name, fields[i].value);
    if (unique_per_response(fields[i].name)) nva[i + 1].flags = NGHTTP2_NV_FLAG_NO_INDEX;
  }
  const nghttp2_data_provider body = detail::body_provider(st);
  if (nghttp2_submit_response(_session, stream_id, nva, fields.size() + 1, end_stream ? nullptr : &body) != 0)
    return false;
  st->response_submitted = true;
  st->body_open = !end_stream;
  fill_output();
  return true;
}

bool server_session::submit_continue(int32_t stream_id) {
  stream_state* st = find(stream_id);
  if (st == nullptr || !st->owned() || st->response_submitted || st->server_reset || st->client_reset) return false;
  const nghttp2_nv nv = make_nv(":status", "100");
  if (nghttp2_submit_headers(_session, NGHTTP2_FLAG_NONE, stream_id, nullptr, &nv, 1, nullptr) < 0) return false;
  fill_output();
  return true;
}

size_t chunked_payload_bytes(const char* p, size_t n) noexcept {
  return static_cast<size_t>(http::scan_whole_chunks(p, n).payload);
}

bool server_session::send_body(int32_t stream_id, std::span<const iovec> pieces, bool end_stream, uint8_t chunked,
                               size_t* queued) {
  stream_state* st = find(stream_id);
  if (st == nullptr || !st->owned() || !st->body_open) return false;
  size_t payload[k_pieces_max] = {};
  size_t nonempty = 0;
  for (size_t i = 0; i < pieces.size() && i < 8; ++i) {
    const iovec& v = pieces[i];
    if ((chunked >> i & 1u) != 0) {
      // Whole chunks or nothing: a piece that starts or ends inside a chunk
      // would have take_pieces read a size line out of payload bytes.
      const http::whole_chunks w = http::scan_whole_chunks(static_cast<const char*>(v.iov_base), v.iov_len);
      if (!w.last && w.end != v.iov_len) return false;
      payload[i] = static_cast<size_t>(w.payload);
    } else {
      payload[i] = v.iov_len;
    }
    nonempty += payload[i] != 0 ? 1 : 0;
  }
  if (pieces.size() > 8 || st->piece_count + nonempty > k_pieces_max) return false;
  if (queued != nullptr) {
    *queued = 0;
    for (size_t i = 0; i < pieces.size(); ++i) *queued += payload[i];
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (payload[i] == 0) continue;
    const auto slot = static_cast<uint8_t>((st->piece_first + st->piece_count) % k_pieces_max);
    st->pieces[slot] = pieces[i];
    st->payloads[slot] = payload[i];
    const auto bit = static_cast<uint8_t>(1u << slot);
    st->chunked_slots = static_cast<uint8_t>((chunked >> i & 1u) != 0 ? st->chunked_slots | bit : st->chunked_slots & ~bit);
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
