// The HTTP/1.1 client codec: parse the head and the body (Content-Length
// or chunked), keep-alive, pipelining, the request's deadlines, and what
// the exchange asks of its client side (client_codec). The socket is the
// transport's (client_transport); what a request means is the policy's
// (exchange_policy; src/proxy/policy.cpp).
#include <algorithm>
#include <cstring>
#include <memory>

#include "h1_codec.hpp"

#include "backend_adapter.hpp"
#include "exchange_policy.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::proxy {

namespace {

// Bytes of pipelined input held while a response is in flight before the
// connection stops reading (and so stops the client) until it catches up.
constexpr uint32_t k_pipeline_bytes_max = 64u << 10;

bool busy(conn_state s) noexcept {
  return s == conn_state::upstream || s == conn_state::streaming || s == conn_state::local ||
         s == conn_state::quota_wait;
}

}  // namespace

h1_codec::h1_codec(shard_context& s, exchange_policy& x, conn_transport& t) noexcept
    : client_codec(x, s.metrics), _s(s), _x(x), _t(t) {}

// ---------------------------------------------------------------------------
// conn_protocol: as the transport drives a connection

bool h1_codec::adopt(downstream_conn* d, std::string_view first) noexcept {
  // `first` is d->in's (the transport gathered it there): read from there.
  SLUICE_VERIFY(first.data() == d->in.data && first.size() == d->in.len && d->req_start == 0);
  bind_exchange(d);
  process_input(d);
  return true;
}

void h1_codec::on_bytes(downstream_conn* d, std::string_view bytes) noexcept {
  // While a response is in flight the request buffer may be referenced by
  // an upstream send: it must not move. Pipelined bytes wait in the stash
  // until the exchange ends.
  const bool held = busy(d->state);
  byte_buf& dst = held ? d->stash : d->in;
  const char* old = dst.data;
  if (!dst.reserve(static_cast<size_t>(dst.len) + bytes.size() + simdjson::SIMDJSON_PADDING)) {
    _t.close_conn(d);
    return;
  }
  std::memcpy(dst.data + dst.len, bytes.data(), bytes.size());
  dst.len += static_cast<uint32_t>(bytes.size());
  if (&dst == &d->in && old != nullptr && old != d->in.data && d->state == conn_state::body) {
    d->x.head.rebase(old, d->in.data);
  }
  if (held) {
    // Too much pipelined input held while a response is in flight: stop
    // reading (and so the client) until the exchange ends.
    if (d->stash.len > k_pipeline_bytes_max) _t.pause_receive(d);
    return;
  }
  process_input(d);
}

void h1_codec::on_peer_gone(downstream_conn* d) noexcept {
  if (d->state == conn_state::upstream || d->state == conn_state::streaming || d->state == conn_state::quota_wait) {
    _x.cancel(d->x);
    _t.close_conn(d);  // the backend request is cancelled with the connection
    return;
  }
  if (d->x.request_open && d->x.status == 0) {
    // Gone mid-body: nothing was answered, and the audit says why.
    d->x.cancelled = true;
    d->x.status = 499;
    d->x.error_code = "client_closed";
  }
  _t.close_conn(d);
}

void h1_codec::on_close(downstream_conn* d) noexcept {
  if (d->state == conn_state::quota_wait || d->x.waiting != exchange::waiting_in::none) _x.unpark(d->x);
  if (d->x.request_open) _x.end_request(d->x);
  if (d->x.inflight_counted) {
    _metrics.at(metrics::stat::requests_inflight).sub();
    d->x.inflight_counted = false;
  }
  // The backend request is cancelled with the connection.
  if (d->x.adapter != nullptr) d->x.adapter->release(d->x);
}

void h1_codec::on_free(downstream_conn* d) noexcept {
  // Nothing reads the connection's memory: no upstream send of its
  // request bytes, no send of a lender's buffer.
  SLUICE_VERIFY(!d->x.up_send_inflight && d->send_pin == nullptr && !d->held.live);
}

void h1_codec::drain(downstream_conn* d) noexcept {
  if (d->state != conn_state::idle || d->in.len != d->req_start) return;  // busy: closes after its response
  if (!_t.handing_over()) {
    _t.close_conn(d);
    return;
  }
  set_deadline(d, deadline_kind::idle, std::min(conn_transport::k_handover_idle_grace_ms, _cfg->server.idle_timeout_ms));
}

void h1_codec::cut(downstream_conn* d) noexcept {
  if (!d->x.request_open) return;
  d->x.cancelled = true;
  d->x.error_code = "drain_timeout";
  if (d->x.status == 0) d->x.status = 503;
}

void h1_codec::set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept {
  const uint64_t now = now_ms();
  uint64_t at = deadline_at(k, now, ms, d->x.total_deadline_ms);
  if (k == deadline_kind::upstream_idle) at = idle_or_ping_at(d->x.pings, now, at);
  _t.set_deadline(d, k, at);
}

// ---------------------------------------------------------------------------
// client_codec: what the exchange and the adapter ask of this side

std::string_view h1_codec::request_body(const exchange& x) const noexcept {
  // Decoded in place, with simdjson's padding reserved after it (on_recv_cqe).
  const downstream_conn* d = x.conn;
  return {d->in.data + d->body_begin, d->body_len};
}

std::string_view h1_codec::peer_ip(const exchange& x) const noexcept {
  return {x.conn->peer_ip, x.conn->peer_ip_len};
}

void h1_codec::wait_for_quota(exchange& x) noexcept { x.conn->state = conn_state::quota_wait; }

void h1_codec::wait_for_backend(exchange& x, deadline_kind k, uint64_t ms) noexcept {
  x.conn->state = conn_state::upstream;
  set_deadline(x.conn, k, ms);
}

void h1_codec::fail(exchange& x) noexcept { _t.close_conn(x.conn); }

void h1_codec::lend_request_bytes(exchange& x) noexcept {
  SLUICE_VERIFY(!x.up_send_inflight);
  x.up_send_inflight = true;
  ++x.conn->ops;
}

bool h1_codec::return_request_bytes(exchange& x) noexcept {
  SLUICE_VERIFY(x.up_send_inflight);
  downstream_conn* d = x.conn;
  x.up_send_inflight = false;
  --d->ops;
  if (d->state != conn_state::closing) return true;
  _t.after_call(d);  // may free d, and x with it
  return false;
}

void h1_codec::request_bytes_free(exchange& x) noexcept { next_request(x.conn); }

void h1_codec::start_request(downstream_conn* d) noexcept {
  d->state = conn_state::head;
  d->x.request_start_ms = now_ms();
  // The exchange is fresh (reset_exchange): nothing of the previous
  // request's head, whose views point at bytes compaction moved or freed,
  // can answer for this one.
  d->parser.reset();
  set_deadline(d, deadline_kind::header, _cfg->server.header_timeout_ms);
}

void h1_codec::process_input(downstream_conn* d) noexcept {
  for (;;) {
    switch (d->state) {
      case conn_state::idle:
        if (d->in.len <= d->req_start) return;
        start_request(d);
        [[fallthrough]];
      case conn_state::head: {
        http::parse_status st = d->parser.parse_head(d->in.data + d->req_start, d->in.len - d->req_start, d->x.head);
        if (st.need_more()) return;
        if (!st.ok()) {
          _x.open_request(d->x);
          answer_error(d->x, st.status, st.message, "invalid_request_error", {}, {}, true);
          return;
        }
        d->x.head_ok = true;
        _x.make_request_id(d->x);
        _x.open_request(d->x);
        d->body_begin = d->req_start + d->x.head.head_bytes;
        // Where this request's bytes end: here when it has no body (an early
        // answer below then moves on to the next request, not to this one
        // again); the body's end once it is read.
        d->raw_end = d->body_begin;
        d->body_len = 0;
        d->chunk_raw_pos = d->body_begin;
        const bool has_body = d->x.head.chunked || d->x.head.content_length > 0;
        if (!_x.accept_head(d->x, has_body)) return;
        if (!has_body) {
          _x.dispatch(d->x);
          return;
        }
        d->state = conn_state::body;
        d->x.body_start_ms = now_ms();
        set_deadline(d, deadline_kind::body, _cfg->server.body_timeout_ms);
        if (d->x.head.expect_continue && d->in.len < d->body_begin + 1 && !d->send_busy) {
          static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
          d->send_iov[0] = {const_cast<char*>(k_continue.data()), k_continue.size()};
          d->send_iov_count = 1;
          d->x.expect_sent = true;
          _t.send_output(d);
        }
        [[fallthrough]];
      }
      case conn_state::body: {
        if (d->send_busy) return;  // 100 Continue still going out
        if (!d->x.head.chunked) {
          const uint64_t have = d->in.len - d->body_begin;
          if (have < d->x.head.content_length) return;
          d->body_len = static_cast<uint32_t>(d->x.head.content_length);
          d->raw_end = d->body_begin + d->body_len;
        } else {
          size_t consumed = 0, produced = 0;
          http::parse_status st =
              d->parser.decode_chunked(d->in.data + d->chunk_raw_pos, d->in.len - d->chunk_raw_pos,
                                       d->in.data + d->body_begin + d->body_len, consumed, produced);
          d->chunk_raw_pos += static_cast<uint32_t>(consumed);
          d->body_len += static_cast<uint32_t>(produced);
          if (st.need_more()) return;
          if (!st.ok()) {
            answer_error(d->x, st.status, st.message, "invalid_request_error", {}, {}, true);
            return;
          }
          d->raw_end = d->chunk_raw_pos;
        }
        _x.dispatch(d->x);
        return;
      }
      default:
        return;  // a response is in flight: pipelined bytes wait
    }
  }
}

void h1_codec::next_request(downstream_conn* d) noexcept {
  if (d->x.up_send_inflight) {
    // The backend answered before it read the whole request; the rest of
    // the request bytes are still the kernel's until that send completes
    // (its connection is shut down, so soon).
    d->x.after_up_send = after_upstream_send::next_request;
    return;
  }
  d->req_start = d->raw_end;
  compact_input(d);
  if (d->stash.len != 0) {
    if (!d->in.reserve(static_cast<size_t>(d->in.len) + d->stash.len + simdjson::SIMDJSON_PADDING)) {
      _t.close_conn(d);
      return;
    }
    std::memcpy(d->in.data + d->in.len, d->stash.data, d->stash.len);
    d->in.len += d->stash.len;
    d->stash.len = 0;
  }
  d->state = conn_state::idle;
  // The next request starts from a fresh exchange: nothing of this one can
  // answer for it.
  reset_exchange(d);
  d->mem.body.len = 0;
  d->mem.trim();
  d->raw_end = d->body_begin = d->body_len = 0;
  if (_draining && d->in.len == 0 && !_t.handing_over()) {
    _t.close_conn(d);
    return;
  }
  // In a handover the response just sent began before the drain and said
  // keep-alive: the client's next request may be on its way, and is
  // answered (saying close) if it comes within the grace.
  set_deadline(d, deadline_kind::idle,
               _draining && _t.handing_over()
                   ? std::min(conn_transport::k_handover_idle_grace_ms, _cfg->server.idle_timeout_ms)
                   : _cfg->server.idle_timeout_ms);
  _t.resume_receive(d);
  if (d->in.len > 0) process_input(d);
}

void h1_codec::reset_exchange(downstream_conn* d) noexcept {
  exchange& x = d->x;
  // Only between exchanges: the last one is accounted, has let go of its
  // backend connection and of its request bytes, and waits for no quota.
  SLUICE_VERIFY(!x.request_open && x.up == nullptr && !x.inflight_counted && !x.held.live);
  SLUICE_VERIFY(!x.up_send_inflight && x.wait_hook.linked_alone() && x.waiting == exchange::waiting_in::none);
  std::destroy_at(&x);
  std::construct_at(&x);
  bind_exchange(d);
}

void h1_codec::bind_exchange(downstream_conn* d) noexcept {
  exchange& x = d->x;
  x.codec = this;
  x.conn = d;
  x.adapter = _x.adapter();
  x.mem = &d->mem;
}

void h1_codec::compact_input(downstream_conn* d) noexcept {
  if (d->req_start == 0) return;
  const uint32_t left = d->in.len - d->req_start;
  if (left != 0) std::memmove(d->in.data, d->in.data + d->req_start, left);
  d->in.len = left;
  d->req_start = 0;
  // A connection that once carried a large body gives the memory back.
  if (left == 0 && d->in.cap > (256u << 10)) d->in.release();
}

void h1_codec::on_deadline(downstream_conn* d, deadline_kind k) noexcept {
  switch (k) {
    case deadline_kind::header:
      if (d->state == conn_state::idle && d->in.len == d->req_start) {
        _t.close_conn(d);  // connected, said nothing
      } else {
        _x.open_request(d->x);
        answer_error(d->x, 408, "Request header timeout.", "invalid_request_error", {}, "request_timeout", true);
      }
      return;
    case deadline_kind::body: {
      // After body_timeout_ms a body may go on as long as it keeps a minimum
      // rate: a large upload on a slow link is fine, a trickle is not.
      const uint64_t elapsed_ms = now_ms() - d->x.body_start_ms;
      const uint64_t received = d->in.len - d->body_begin;
      const uint64_t owed = _cfg->server.body_min_rate_bytes_per_s * elapsed_ms / 1000;
      if (_cfg->server.body_min_rate_bytes_per_s != 0 && received >= owed) {
        set_deadline(d, deadline_kind::body, 1000);
        return;
      }
      answer_error(d->x, 408, "Request body timeout.", "invalid_request_error", {}, "request_timeout", true);
      return;
    }
    case deadline_kind::idle:
    case deadline_kind::send:
    case deadline_kind::linger:
      _t.close_conn(d);
      return;
    case deadline_kind::upstream_idle:
      if (d->state == conn_state::streaming && ping_tick(d->x.pings, now_ms())) {
        // The backend is quiet, not yet idle too long: the client hears a
        // ping (unless bytes are on their way to it anyway).
        set_deadline(d, deadline_kind::upstream_idle, idle_rest_ms(d->x.pings, now_ms()));
        if (!d->send_busy && d->x.response_started && !d->x.rsp.client_done) send_ping(d);
        return;
      }
      if (d->state == conn_state::streaming && d->timer.deadline_ms != d->x.total_deadline_ms &&
          d->send_busy) {
        // The backend is not read while bytes wait for the client (a
        // stream goes at its slower side's pace): the client took none for
        // the whole idle time. It is closed as stalled; the backend, which
        // did nothing wrong, is not blamed.
        _metrics.at(metrics::stat::client_stalls).add();
        d->x.error_code = "client_timeout";
        _t.close_conn(d);
        return;
      }
      [[fallthrough]];
    case deadline_kind::upstream_connect:
    case deadline_kind::upstream_first_byte:
      d->x.adapter->on_timeout(d->x);
      return;
    case deadline_kind::none:
      return;
  }
}

}  // namespace sluice::proxy
