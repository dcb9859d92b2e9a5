// The HTTP/2 client codec: streams as exchanges, the session's events, the
// response as DATA frames, and the session's output through the
// connection's send (conn_transport, transport.hpp: client_transport).
#include "h2_codec.hpp"

#include "dialect_relay.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "backend_adapter.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"

namespace sluice::proxy {

downstream_conn::downstream_conn(const http::limits& l) : parser(l) {}
downstream_conn::~downstream_conn() = default;

namespace {

// Freed streams kept per shard with their buffers (beyond: freed).
constexpr uint32_t k_pool_max = 256;

// A stream answered by its head with a body still coming stays open this
// long, for this much of the body, before RST_STREAM NO_ERROR (see
// h2_stream::linger_after_answer).
constexpr uint64_t k_linger_ms = 1000;
constexpr uint32_t k_linger_bytes_max = 64u << 10;
// A stream's buffers above this go back when it is freed.
constexpr uint32_t k_keep_buffer_bytes = 256u << 10;
// Response fields a head may carry (the backend's, then sluice's own).
constexpr size_t k_fields_max = 64;

// Fields HTTP/2 forbids in a response (RFC 9113 §8.2.2), on top of the
// hop-by-hop ones every response drops (drop_response_header).
bool connection_specific(std::string_view name) noexcept {
  return iequals(name, "connection") || iequals(name, "keep-alive") || iequals(name, "proxy-connection") ||
         iequals(name, "transfer-encoding") || iequals(name, "upgrade") || iequals(name, "te");
}

// Appends "name: value\r\n" with the name in lower case (HTTP/2 field names
// are lower case; a backend may send "Content-Type").
void append_field(byte_buf& o, std::string_view name, std::string_view value) noexcept {
  char* p = o.data + o.len;
  for (char c : name) *p++ = (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
  o.len += static_cast<uint32_t>(name.size());
  append(o, ": ");
  append(o, value);
  append(o, "\r\n");
}

}  // namespace

h2::options h2_options_from(const config::server_config& s) noexcept {
  h2::options o;
  o.max_concurrent_streams = s.h2_max_concurrent_streams;
  o.stream_window_bytes = s.h2_stream_window_bytes;
  o.connection_window_bytes = s.h2_connection_window_bytes;
  o.header_list_bytes_max = s.max_head_bytes;
  o.hpack_table_bytes = s.h2_hpack_table_bytes;
  o.resets_per_window_max = s.h2_resets_per_second_max;
  o.reset_window_ms = 1000;
  o.memory_bytes_max = s.h2_memory_max_bytes;
  return o;
}

// ---------------------------------------------------------------------------
// h2_link: the session's events, to the codec

void h2_link::on_request_head(const h2::request& r) { codec.on_request_head(*this, r); }
void h2_link::on_request_data(int32_t id, std::span<const char> bytes, bool end_stream) {
  codec.on_request_data(*this, id, bytes, end_stream);
}
void h2_link::on_body_drained(int32_t id) { codec.on_body_drained(*this, id); }
void h2_link::on_stream_closed(int32_t id, h2::close_cause cause, uint32_t code) {
  codec.on_stream_closed(*this, id, cause, code);
}
void h2_link::on_goaway(uint32_t code, bool from_client) { codec.on_goaway(*this, code, from_client); }

h2_stream* h2_link::find(int32_t id) const noexcept {
  for (h2_stream* st = streams; st != nullptr; st = st->hook.next) {
    if (st->id == id && !st->closed) return st;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// The codec's life

h2_codec::h2_codec(shard_context& s, exchange_policy& x, conn_transport& transport) noexcept
    : client_codec(x, s.metrics), _s(s), _x(x), _t(transport), _timers(s.r.now_ms()) {}

h2_codec::~h2_codec() {
  while (_pool != nullptr) {
    h2_stream* st = _pool;
    _pool = st->free_next;
    delete st;
  }
}

bool h2_codec::adopt(downstream_conn* d, std::string_view first) noexcept {
  SLUICE_VERIFY(!d->h2);
  d->h2.reset(new (std::nothrow) h2_link(*this, d, h2_options_from(_cfg->server)));
  if (!d->h2 || d->h2->session.failed()) {
    d->h2.reset();
    return false;
  }
  account_connection_memory(static_cast<int64_t>(sizeof(h2_link)));
  _metrics.at(metrics::stat::h2_connections).add();
  on_bytes(d, first);
  // The preface's bytes are read; the request buffer is HTTP/1.1's, unused here.
  d->in.release();
  return true;
}

void h2_codec::on_bytes(downstream_conn* d, std::string_view bytes) noexcept {
  h2_link& l = *d->h2;
  ++d->ops;  // the session and its streams stay while it runs, whatever its events do
  if (!l.session.feed(std::span<const char>(bytes.data(), bytes.size()), now_ms())) {
    if (l.session.reason().size() != 0) {
      log::debug("shard {}: HTTP/2 connection from {}: {}", _s.index,
                 std::string_view(d->peer_ip, d->peer_ip_len), l.session.reason());
    }
  }
  flush(l, true);
  --d->ops;
  _t.after_call(d);
}

void h2_codec::on_progress(downstream_conn* d, size_t bytes) noexcept {
  _t.arm_conn_deadline(d, true, false);
  if (bytes == 0) return;  // over TLS: told only at the send's end
  h2_link& l = *d->h2;
  // As a send that ended short: what went is consumed and the session
  // refills behind it; the rest of the send still reads the bytes after
  // it, which the ring keeps where they are until they too are consumed.
  ++d->ops;
  l.session.consume_output(bytes);
  flush(l, true);
  --d->ops;
  _t.after_call(d);
}

void h2_codec::on_peer_gone(downstream_conn* d) noexcept { _t.end_conn(d, true); }

void h2_codec::on_deadline(downstream_conn* d, deadline_kind k) noexcept {
  if (k == deadline_kind::idle && !_s.draining) {
    drain(d);  // GOAWAY: its send's deadline closes a client that does not take it
    return;
  }
  if (k == deadline_kind::send) _metrics.at(metrics::stat::client_stalls).add();
  _t.close_conn(d);
}

void h2_codec::on_sent(downstream_conn* d, int res) noexcept {
  if (d->state == conn_state::closing) return;  // the session's output goes with it
  h2_link& l = *d->h2;
  if (res <= 0) {
    _t.end_conn(d, true);
    return;
  }
  ++d->ops;
  l.session.consume_output(static_cast<size_t>(res));
  flush(l, true);
  --d->ops;
  _t.after_call(d);
}

void h2_codec::drain(downstream_conn* d) noexcept {
  h2_link& l = *d->h2;
  ++d->ops;
  l.goaway = true;
  l.session.drain();
  flush(l, true);
  --d->ops;
  _t.after_call(d);
}

void h2_codec::cut(downstream_conn* d) noexcept {
  for (h2_stream* st = d->h2->streams; st != nullptr; st = st->hook.next) {
    if (st->finished) continue;
    exchange& x = st->x;
    if (x.request_open) {
      x.cancelled = true;
      x.error_code = "drain_timeout";
      if (x.status == 0) x.status = 503;
    }
    abandon(st, false);
  }
}

void h2_codec::on_close(downstream_conn* d) noexcept {
  // Every stream still in its exchange is cut: the backend request is
  // cancelled (release), the audit says 499.
  h2_link& l = *d->h2;
  for (h2_stream* st = l.streams; st != nullptr; st = st->hook.next) {
    if (!st->finished) abandon(st);
    st->closed = true;
    _timers.cancel(st->timer);
    st->deadline = deadline_kind::none;
    give_back_pin(st);
  }
  publish_counters(l);
}

void h2_codec::on_free(downstream_conn* d) noexcept {
  h2_link& l = *d->h2;
  while (l.streams != nullptr) {
    h2_stream* st = l.streams;
    SLUICE_VERIFY(st->ops == 0 && st->pin == nullptr);
    free_stream(st);
  }
  account_connection_memory(-static_cast<int64_t>(sizeof(h2_link)));
  d->h2.reset();
}

void h2_codec::on_iteration(uint64_t now) noexcept {
  _timers.expire(now, [this](shard::timer& t) { on_deadline(static_cast<h2_stream*>(t.owner)); });
}

// ---------------------------------------------------------------------------
// Streams

h2_stream* h2_codec::new_stream(h2_link& l, int32_t id) noexcept {
  h2_stream* st = _pool;
  if (st != nullptr) {
    _pool = st->free_next;
    --_pooled;
  } else {
    st = new (std::nothrow) h2_stream();
    if (st == nullptr) return nullptr;
    account_connection_memory(static_cast<int64_t>(sizeof(h2_stream)));
  }
  st->free_next = nullptr;
  st->link = &l;
  st->id = id;
  st->timer.owner = st;
  st->hook.prev = nullptr;
  st->hook.next = l.streams;
  if (l.streams != nullptr) l.streams->hook.prev = st;
  l.streams = st;
  ++l.stream_count;
  exchange& x = st->x;
  x.codec = this;
  x.h2 = st;
  x.adapter = _x.adapter();
  x.mem = &st->mem;
  return st;
}

void h2_codec::free_stream(h2_stream* st) noexcept {
  h2_link& l = *st->link;
  SLUICE_VERIFY(st->ops == 0 && st->pin == nullptr && !st->x.up_send_inflight && !st->timer.armed());
  SLUICE_VERIFY(!st->x.request_open && !st->x.inflight_counted && st->x.up == nullptr);
  if (st->hook.prev != nullptr) {
    st->hook.prev->hook.next = st->hook.next;
  } else {
    l.streams = st->hook.next;
  }
  if (st->hook.next != nullptr) st->hook.next->hook.prev = st->hook.prev;
  --l.stream_count;
  // A fresh exchange and fresh flags for the next stream; the buffers stay.
  std::destroy_at(&st->x);
  std::construct_at(&st->x);
  st->state = conn_state::head;
  st->deadline = deadline_kind::none;
  st->closed = st->finished = st->body_done = st->dispatched = st->sending = st->drained = false;
  st->end_queued = st->answered = st->reset_after_answer = st->in_ready = false;
  st->linger_after_answer = st->lingering = false;
  st->linger_bytes = 0;
  st->head_status = 0;
  st->ready_next = nullptr;
  st->hook = {};
  st->link = nullptr;
  l.body_bytes -= st->body_counted;
  st->body_counted = 0;
  st->body.len = st->head.len = st->answer.len = 0;
  st->mem.body.len = st->mem.frame.len = st->mem.up_head.len = 0;
  if (st->body.cap > k_keep_buffer_bytes) st->body.release();
  st->mem.trim(k_keep_buffer_bytes);
  if (_pooled < k_pool_max) {
    st->free_next = _pool;
    _pool = st;
    ++_pooled;
    return;
  }
  account_connection_memory(-static_cast<int64_t>(sizeof(h2_stream) + (st->mem.sse ? k_sse_scanner_bytes : 0)));
  delete st;
}

void h2_codec::give_back_pin(h2_stream* st) noexcept {
  buffer_lender* p = st->pin;
  if (p == nullptr) return;
  st->pin = nullptr;
  p->give_back(p);
}

void h2_codec::mark_ready(h2_stream* st) noexcept {
  if (st->in_ready) return;
  st->in_ready = true;
  st->ready_next = st->link->ready;
  st->link->ready = st;
}

void h2_codec::set_deadline(h2_stream* st, deadline_kind k, uint64_t ms) noexcept {
  const uint64_t now = now_ms();
  uint64_t at = deadline_at(k, now, ms, st->x.total_deadline_ms);
  if (k == deadline_kind::upstream_idle) at = idle_or_ping_at(st->x.pings, now, at);
  if (at == 0) {
    st->deadline = deadline_kind::none;
    _timers.cancel(st->timer);
    return;
  }
  st->deadline = k;
  _timers.arm(st->timer, at);
}

// ---------------------------------------------------------------------------
// The session's events (inside its calls: mark, do not free)

void h2_codec::on_request_head(h2_link& l, const h2::request& r) noexcept {
  _metrics.at(metrics::stat::h2_streams).add();
  h2_stream* st = l.goaway ? nullptr : new_stream(l, r.stream_id);
  if (st == nullptr) {
    l.session.reset_stream(r.stream_id, l.goaway ? h2::refused_stream : h2::internal_error);
    return;
  }
  exchange& x = st->x;
  x.head = r.head;
  x.head_ok = true;
  x.request_start_ms = now_ms();
  st->state = conn_state::head;
  _x.make_request_id(x);
  _x.open_request(x);
  st->body_done = r.end_stream;
  const bool has_body = !r.end_stream;
  if (!_x.accept_head(x, has_body)) {
    if (has_body) st->reset_after_answer = st->linger_after_answer = true;
    return;
  }
  if (!has_body) {
    st->dispatched = true;
    _x.dispatch(x);
    return;
  }
  st->state = conn_state::body;
  x.body_start_ms = now_ms();
  set_deadline(st, deadline_kind::body, _cfg->server.body_timeout_ms);
  // The request passed what its head can be refused for (auth, limits):
  // a client that waits for it may send the body.
  if (iequals(r.expect, "100-continue") && l.session.submit_continue(r.stream_id)) {
    x.expect_sent = true;
    flush(l);
  }
}

void h2_codec::on_request_data(h2_link& l, int32_t id, std::span<const char> bytes, bool end_stream) noexcept {
  // The window opens again whatever the bytes' fate: a stream answered
  // early must not stall the connection's window for the others.
  if (!bytes.empty()) l.session.consume(id, bytes.size());
  h2_stream* st = l.find(id);
  if (st != nullptr && st->lingering && !st->closed) {
    // Answered early: dropped, up to a bound.
    st->linger_bytes += static_cast<uint32_t>(std::min<size_t>(bytes.size(), k_linger_bytes_max));
    if (!end_stream && st->linger_bytes >= k_linger_bytes_max) {
      st->lingering = false;
      l.session.reset_stream(id, h2::no_error);
    }
    return;
  }
  if (st == nullptr || st->dispatched || st->answered || st->finished) return;
  exchange& x = st->x;
  const uint64_t total = uint64_t{st->body.len} + bytes.size();
  if (total > _cfg->server.max_body_bytes) {
    st->reset_after_answer = !end_stream;
    answer_error(x, 413, "Request body too large.", "invalid_request_error", {}, "request_too_large", false);
    return;
  }
  if (!bytes.empty()) {
    // The bodies one connection holds share its memory cap (one body of
    // max_body_bytes always fits), and the shard's cap is kept as they
    // come, not only at dispatch: a connection of many slow streams must
    // not commit what it is refused for later. Refused streams are reset
    // once answered, so their windows stop with them.
    const config::server_config& sc = _cfg->server;
    const uint64_t link_max = std::max<uint64_t>(sc.h2_memory_max_bytes, sc.max_body_bytes);
    const bool over_link = l.body_bytes + bytes.size() > link_max;
    const bool over_shard = sc.memory_max_bytes != 0 &&
                            connection_memory_bytes() + static_cast<int64_t>(bytes.size()) >
                                static_cast<int64_t>(sc.memory_max_bytes);
    if (over_link || over_shard) {
      _metrics.at(metrics::stat::shed_memory).add();
      st->reset_after_answer = !end_stream;
      answer_error(x, 503, over_link ? "This connection's request bodies are over its memory cap. Please try again."
                                     : "The server is overloaded. Please try again.",
                   "server_error", {}, "overloaded", false, "retry-after: 1\r\n");
      return;
    }
    l.body_bytes += bytes.size();
    st->body_counted += static_cast<uint32_t>(bytes.size());
    if (!st->body.reserve(static_cast<size_t>(total) + simdjson::SIMDJSON_PADDING)) {
      fail(x);
      return;
    }
    std::memcpy(st->body.data + st->body.len, bytes.data(), bytes.size());
    st->body.len = static_cast<uint32_t>(total);
  }
  if (!end_stream) return;
  st->body_done = true;
  if (!st->body.reserve(static_cast<size_t>(st->body.len) + simdjson::SIMDJSON_PADDING)) {
    fail(x);
    return;
  }
  st->dispatched = true;
  _x.dispatch(x);
}

void h2_codec::on_body_drained(h2_link& l, int32_t id) noexcept {
  h2_stream* st = l.find(id);
  if (st == nullptr) return;
  st->drained = true;
  mark_ready(st);
}

void h2_codec::on_stream_closed(h2_link& l, int32_t id, h2::close_cause cause, uint32_t code) noexcept {
  h2_stream* st = l.find(id);
  if (st == nullptr) return;
  (void)code;
  if (cause == h2::close_cause::client_reset) _metrics.at(metrics::stat::h2_client_resets).add();
  // The request's views are valid until this returns: the exchange is
  // accounted now, the object freed later (flush).
  if (!st->finished) {
    if (cause == h2::close_cause::done && (st->end_queued || st->answered)) {
      finish(st);
    } else {
      abandon(st);
    }
  }
  st->closed = true;
  _timers.cancel(st->timer);
  st->deadline = deadline_kind::none;
  give_back_pin(st);  // pieces the session had queued are dropped with the stream
  st->sending = false;
  mark_ready(st);
}

void h2_codec::on_goaway(h2_link& l, uint32_t code, bool from_client) noexcept {
  (void)code;
  (void)from_client;
  l.goaway = true;
}

// ---------------------------------------------------------------------------
// After the session's calls

void h2_codec::flush(h2_link& l, bool may_free) noexcept {
  if (l.flushing) return;  // the outer flush goes on with what this call marked
  l.flushing = true;
  while (l.ready != nullptr) {
    h2_stream* st = l.ready;
    l.ready = st->ready_next;
    st->ready_next = nullptr;
    st->in_ready = false;
    if (st->drained && !st->closed) {
      st->drained = false;
      const bool sent = st->sending;  // false: a ping's bytes alone (send_ping), no send of the adapter's
      st->sending = false;
      give_back_pin(st);
      if (st->answered) {
        if (!st->finished) finish(st);
        if (st->reset_after_answer && !st->closed) {
          st->reset_after_answer = false;
          if (st->linger_after_answer) {
            st->lingering = true;  // see h2_stream::linger_after_answer
            set_deadline(st, deadline_kind::linger, k_linger_ms);
          } else {
            l.session.reset_stream(st->id, h2::no_error);
          }
        }
      } else if (st->state == conn_state::streaming && !st->finished && sent) {
        // The client took the bytes: a stream's idle time starts again
        // (not the short wait for the backend's end after [DONE]).
        if (st->deadline == deadline_kind::upstream_idle && !st->x.rsp.client_done) {
          set_deadline(st, deadline_kind::upstream_idle,
                       _cfg->groups[st->x.group].upstream.stream_idle_timeout_ms);
        }
        st->x.adapter->on_sent(st->x);
      }
    }
    if (st->closed) l.closed_pending = true;
  }
  if (may_free && l.closed_pending) {
    // Closed streams go only here, from a call of the connection's own (a
    // receive, a send, a deadline): never under a call of an exchange's
    // adapter or policy, which may still read its exchange after it.
    l.closed_pending = false;
    for (h2_stream* st = l.streams; st != nullptr;) {
      h2_stream* next = st->hook.next;
      if (st->closed && st->ops == 0 && st->pin == nullptr && !st->x.up_send_inflight) {
        free_stream(st);
      } else if (st->closed) {
        l.closed_pending = true;
      }
      st = next;
    }
  }
  publish_counters(l);
  l.flushing = false;
  submit_output(l);
}

void h2_codec::submit_output(h2_link& l) noexcept {
  downstream_conn* d = l.d;
  if (d->send_busy || d->state == conn_state::closing || d->state == conn_state::lingering) return;
  if (l.session.has_output()) {
    const std::span<const char> out = l.session.pending_output();
    d->send_iov[0] = {const_cast<char*>(out.data()), out.size()};
    d->send_iov_count = 1;
    _t.send_output(d);
    _t.arm_conn_deadline(d, true, false);  // the client must take these bytes within idle_timeout_ms
    return;
  }
  if (l.session.done()) {
    _t.end_conn(d, false);
    return;
  }
  _t.arm_conn_deadline(d, false, l.stream_count == 0 && !l.goaway);
}

void h2_codec::publish_counters(h2_link& l) noexcept {
  const h2::counters& c = l.session.stats();
  h2::counters& was = l.counted;
  auto add = [this](metrics::stat s, uint64_t now, uint64_t& before) {
    if (now > before) _metrics.at(s).add(now - before);
    before = now;
  };
  add(metrics::stat::h2_refused_streams, c.streams_refused, was.streams_refused);
  add(metrics::stat::h2_rapid_resets, c.rapid_reset_goaways, was.rapid_reset_goaways);
  add(metrics::stat::h2_continuation_floods, c.continuation_floods, was.continuation_floods);
  uint64_t floods = c.ack_floods + c.control_floods, floods_was = was.ack_floods + was.control_floods;
  if (floods > floods_was) _metrics.at(metrics::stat::h2_control_floods).add(floods - floods_was);
  was.ack_floods = c.ack_floods;
  was.control_floods = c.control_floods;
  add(metrics::stat::h2_hpack_bombs, c.hpack_bombs, was.hpack_bombs);
  add(metrics::stat::h2_memory_refusals, c.memory_refusals, was.memory_refusals);
  add(metrics::stat::h2_header_lists_too_large, c.header_lists_too_large, was.header_lists_too_large);
  // Error GOAWAYs not told by a defence above: protocol errors.
  const uint64_t defences = c.rapid_reset_goaways + c.continuation_floods + c.ack_floods + c.control_floods +
                            c.hpack_bombs + c.memory_refusals;
  const uint64_t other = c.connection_errors > defences ? c.connection_errors - defences : 0;
  add(metrics::stat::h2_protocol_errors, other, was.connection_errors);
}

// ---------------------------------------------------------------------------
// Accounting

void h2_codec::finish(h2_stream* st) noexcept {
  exchange& x = st->x;
  st->finished = true;
  _timers.cancel(st->timer);
  st->deadline = deadline_kind::none;
  if (st->state == conn_state::quota_wait || x.waiting != exchange::waiting_in::none) _x.unpark(x);
  _x.end_request(x);
  if (x.inflight_counted) {
    _metrics.at(metrics::stat::requests_inflight).sub();
    x.inflight_counted = false;
  }
  if (x.status < 300) {
    _metrics.at(metrics::stat::responses_2xx).add();
  } else if (x.status < 500) {
    _metrics.at(metrics::stat::responses_4xx).add();
  } else {
    _metrics.at(metrics::stat::responses_5xx).add();
  }
  st->state = conn_state::local;
}

void h2_codec::abandon(h2_stream* st, bool client_went) noexcept {
  exchange& x = st->x;
  st->finished = true;
  _timers.cancel(st->timer);
  st->deadline = deadline_kind::none;
  const conn_state s = st->state;
  if (!client_went) {
    // Cut by sluice (a stalled client): the audit keeps its status and code.
  } else if (s == conn_state::upstream || s == conn_state::streaming || s == conn_state::quota_wait) {
    _x.cancel(x);
  } else if (x.request_open && x.status == 0) {
    x.cancelled = true;
    x.status = 499;
    x.error_code = "client_closed";
  }
  if (s == conn_state::quota_wait || x.waiting != exchange::waiting_in::none) _x.unpark(x);
  if (x.request_open) _x.end_request(x);
  if (x.inflight_counted) {
    _metrics.at(metrics::stat::requests_inflight).sub();
    x.inflight_counted = false;
  }
  if (x.adapter != nullptr) x.adapter->release(x);
  st->state = conn_state::closing;
}

// ---------------------------------------------------------------------------
// client_codec

std::string_view h2_codec::request_body(const exchange& x) const noexcept {
  const h2_stream& st = stream_of(x);
  return {st.body.data, st.body.len};
}

std::string_view h2_codec::peer_ip(const exchange& x) const noexcept {
  const downstream_conn* d = stream_of(x).link->d;
  return {d->peer_ip, d->peer_ip_len};
}

void h2_codec::wait_for_quota(exchange& x) noexcept {
  h2_stream& st = stream_of(x);
  st.state = conn_state::quota_wait;
  set_deadline(&st, deadline_kind::none, 0);
}

void h2_codec::wait_for_backend(exchange& x, deadline_kind k, uint64_t ms) noexcept {
  h2_stream& st = stream_of(x);
  st.state = conn_state::upstream;
  set_deadline(&st, k, ms);
}

void h2_codec::stream_wait(exchange& x, uint64_t idle_ms) noexcept {
  h2_stream& st = stream_of(x);
  st.state = conn_state::streaming;
  set_deadline(&st, deadline_kind::upstream_idle, idle_ms);
}

void h2_codec::answer(exchange& x, uint16_t status, std::string_view body, bool close,
                      std::string_view extra_headers, std::string_view error_code) noexcept {
  (void)close;  // one stream's answer never closes the others' connection
  h2_stream* st = &stream_of(x);
  h2_link& l = *st->link;
  if (st->closed) return;
  if (x.request_id_len == 0) _x.make_request_id(x);
  char reshaped[1024];  // an error in a Messages client's shape
  body = in_client_dialect(x, status, body, reshaped, sizeof reshaped);
  x.status = status;
  x.error_code = error_code;
  if (!x.inflight_counted) {
    _metrics.at(metrics::stat::requests_total).add();
    _metrics.at(metrics::stat::requests_inflight).add();
    x.inflight_counted = true;
  }
  // The body goes as the client's window allows: a client that never opens
  // it does not hold the exchange (and its place in flight) for ever.
  set_deadline(st, deadline_kind::send, _cfg->server.idle_timeout_ms);
  char rate[1024];
  const size_t rl = _x.write_response_headers(x, rate, sizeof rate);
  byte_buf& h = st->head;
  if (!h.reserve(rl + extra_headers.size() + 256) || !st->answer.reserve(body.size() + 1)) {
    fail(x);
    return;
  }
  h.len = 0;
  char num[24];
  text_writer w(num, sizeof num);
  w.put_int(body.size());
  append_field(h, "content-type", "application/json");
  append_field(h, "content-length", std::string_view(num, static_cast<size_t>(w.p - num)));
  append(h, std::string_view(rate, rl));
  append(h, extra_headers);
  std::memcpy(st->answer.data, body.data(), body.size());
  st->answer.len = static_cast<uint32_t>(body.size());
  st->head_status = status;
  st->answered = true;
  st->state = conn_state::local;
  if (!submit_head(st, false)) {
    fail(x);
    return;
  }
  const iovec piece{st->answer.data, st->answer.len};
  st->sending = true;
  st->end_queued = true;
  if (!l.session.send_body(st->id, std::span<const iovec>(&piece, 1), true)) {
    fail(x);
    return;
  }
  flush(l);
}

void h2_codec::fail(exchange& x) noexcept {
  // This stream cannot go on (out of memory): it ends, the others do not.
  h2_stream* st = &stream_of(x);
  if (st->closed) return;
  if (!st->finished) abandon(st, false);  // sluice's failure (or the backend's): not the client's
  st->link->session.reset_stream(st->id, h2::internal_error);
  flush(*st->link);
}

void h2_codec::lend_request_bytes(exchange& x) noexcept {
  SLUICE_VERIFY(!x.up_send_inflight);
  h2_stream& st = stream_of(x);
  x.up_send_inflight = true;
  ++st.ops;
  ++st.link->d->ops;  // the connection (and so the link) stays until the send completes
}

bool h2_codec::return_request_bytes(exchange& x) noexcept {
  SLUICE_VERIFY(x.up_send_inflight);
  h2_stream* st = &stream_of(x);
  downstream_conn* d = st->link->d;
  x.up_send_inflight = false;
  --st->ops;
  --d->ops;
  const bool goes_on = !st->finished;
  if (st->closed && st->ops == 0 && st->pin == nullptr) {
    h2_link& l = *st->link;
    free_stream(st);  // x is gone with it
    if (d->state != conn_state::closing && !d->send_busy) _t.arm_conn_deadline(d, false, l.stream_count == 0 && !l.goaway);
  }
  _t.after_call(d);
  return goes_on;
}

void h2_codec::request_bytes_free(exchange& x) noexcept { (void)x; }

bool h2_codec::stage_response_head(exchange& x, const http::response_head& rh, bool dechunked) noexcept {
  (void)dechunked;  // the relay sends the payload alone: DATA frames carry no chunk framing
  h2_stream* st = &stream_of(x);
  byte_buf& o = st->head;
  if (!o.reserve(rh.head_bytes + 1024)) return false;
  o.len = 0;
  http::header hd;
  for (http::header_fields it = rh.fields(); it.next(hd);) {
    if (drop_response_header(hd.name) || connection_specific(hd.name)) continue;
    if (rh.chunked && iequals(hd.name, "content-length")) continue;
    append_field(o, hd.name, hd.value);
  }
  char rate[1024];
  const size_t rl = _x.write_response_headers(x, rate, sizeof rate);
  if (!o.reserve(static_cast<size_t>(o.len) + rl + 256)) return false;
  char line[32];
  text_writer w(line, sizeof line);
  w.put_int(now_ms() - x.request_start_ms);
  append_field(o, "openai-processing-ms", std::string_view(line, static_cast<size_t>(w.p - line)));
  append(o, std::string_view(rate, rl));
  st->head_status = rh.status;
  return true;
}

bool h2_codec::submit_head(h2_stream* st, bool end_stream) noexcept {
  exchange& x = st->x;
  h2::field fields[k_fields_max];
  size_t n = 0;
  fields[n++] = {"x-request-id", std::string_view(x.request_id, x.request_id_len)};
  http::header hd;
  // The session takes k_fields_max fields with :status; fields past that
  // are left out (a backend head of 60+ fields is no LLM server's).
  for (http::header_fields it(std::string_view(st->head.data, st->head.len)); n + 1 < k_fields_max && it.next(hd);) {
    fields[n++] = {hd.name, hd.value};
  }
  return st->link->session.submit_response(st->id, st->head_status, std::span<const h2::field>(fields, n),
                                           end_stream);
}

void h2_codec::send_response(exchange& x, bool with_head, const iovec* body, uint8_t n, buffer_lender* lender,
                             uint8_t chunked) noexcept {
  h2_stream* st = &stream_of(x);
  h2_link& l = *st->link;
  SLUICE_VERIFY(!st->sending && st->pin == nullptr && n <= 3 && (with_head || n != 0));
  if (st->closed) {
    // Reset meanwhile: nothing goes out; the lender has its buffer back.
    if (lender != nullptr) lender->give_back(lender);
    return;
  }
  if (with_head && !submit_head(st, false)) {
    if (lender != nullptr) lender->give_back(lender);
    fail(x);
    return;
  }
  st->sending = true;
  st->pin = lender;  // given back once the session copied the pieces (on_body_drained)
  size_t bytes = 0;  // what goes out: a chunked piece's data alone
  if (n != 0 && !l.session.send_body(st->id, std::span<const iovec>(body, n), false, chunked, &bytes)) {
    st->pin = nullptr;
    st->sending = false;
    if (lender != nullptr) lender->give_back(lender);
    fail(x);
    return;
  }
  if (bytes == 0) {
    // A head alone (or chunks without data): "sent" once it is queued.
    st->drained = true;
    mark_ready(st);
  }
  flush(l);
}

void h2_codec::response_done(exchange& x) noexcept {
  h2_stream* st = &stream_of(x);
  h2_link& l = *st->link;
  // Accounted first: the END_STREAM below may close the stream at once.
  finish(st);
  if (!st->closed) {
    if (st->head_status != 0 && !st->end_queued) {
      st->end_queued = true;
      if (!l.session.send_body(st->id, std::span<const iovec>(), true)) l.session.reset_stream(st->id, h2::no_error);
    }
  }
  flush(l);
}

// ---------------------------------------------------------------------------
// Deadlines

void h2_codec::on_deadline(h2_stream* st) noexcept {
  const deadline_kind k = st->deadline;
  st->deadline = deadline_kind::none;
  h2_link& l = *st->link;
  downstream_conn* d = l.d;
  ++d->ops;
  switch (k) {
    case deadline_kind::body:
      if (!st->finished) {
        const uint64_t elapsed_ms = now_ms() - st->x.body_start_ms;
        const uint64_t owed = _cfg->server.body_min_rate_bytes_per_s * elapsed_ms / 1000;
        if (_cfg->server.body_min_rate_bytes_per_s != 0 && st->body.len >= owed) {
          set_deadline(st, deadline_kind::body, 1000);
          break;
        }
        st->reset_after_answer = true;
        answer_error(st->x, 408, "Request body timeout.", "invalid_request_error", {}, "request_timeout", false);
      }
      break;
    case deadline_kind::send:
      // An answer of sluice's own that the client's window never let out.
      if (!st->finished) {
        _metrics.at(metrics::stat::client_stalls).add();
        st->x.error_code = "client_timeout";
        abandon(st, false);
        if (!st->closed) l.session.reset_stream(st->id, h2::cancel);
      }
      break;
    case deadline_kind::upstream_idle:
      if (st->state == conn_state::streaming && ping_tick(st->x.pings, now_ms())) {
        // The backend is quiet, not yet idle too long: the client hears a
        // ping, queued as DATA of the stream (static bytes: nothing to
        // keep), unless the adapter's bytes are on their way anyway. A
        // send the adapter makes meanwhile queues behind it.
        set_deadline(st, deadline_kind::upstream_idle, idle_rest_ms(st->x.pings, now_ms()));
        if (!st->sending && !st->closed && !st->finished && !st->end_queued && st->x.response_started &&
            !st->x.rsp.client_done) {
          const iovec ping{const_cast<char*>(k_ping_event.data()), k_ping_event.size()};
          (void)l.session.send_body(st->id, std::span<const iovec>(&ping, 1), false);  // false: no head out yet
        }
        break;
      }
      if (st->state == conn_state::streaming && st->timer.deadline_ms != st->x.total_deadline_ms && st->sending &&
          d->send_busy) {
        // The connection's own send has not come back for the whole idle
        // time: the client reads nothing at all, and a reset could not go
        // out either. The connection closes (its streams are cut).
        _metrics.at(metrics::stat::client_stalls).add();
        st->x.error_code = "client_timeout";
        abandon(st, false);
        _t.end_conn(d, false);
        break;
      }
      if (st->state == conn_state::streaming && st->timer.deadline_ms != st->x.total_deadline_ms && st->sending) {
        // The client's window stayed shut for the whole idle time (a stream
        // goes at its slower side's pace): the stream ends as stalled.
        _metrics.at(metrics::stat::client_stalls).add();
        st->x.error_code = "client_timeout";
        abandon(st, false);  // audited with the status its head carried, as HTTP/1.1's stalled reader
        l.session.reset_stream(st->id, h2::cancel);
        break;
      }
      [[fallthrough]];
    case deadline_kind::upstream_connect:
    case deadline_kind::upstream_first_byte:
      if (!st->finished) st->x.adapter->on_timeout(st->x);
      break;
    case deadline_kind::linger:
      // An early answer's client still sends: the rest is cut.
      if (st->lingering && !st->closed) {
        st->lingering = false;
        l.session.reset_stream(st->id, h2::no_error);
      }
      break;
    default:
      break;
  }
  flush(l, true);
  --d->ops;
  _t.after_call(d);
}

}  // namespace sluice::proxy
