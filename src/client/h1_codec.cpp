// The HTTP/1.1 client codec: accept, receive, parse the head and the body
// (Content-Length or chunked), answers sluice writes itself, send,
// keep-alive, pipelining, close, and the connection's deadlines; and what
// the exchange asks of its client side (client_codec). What a request
// means is the policy's (exchange_policy; src/proxy/policy.cpp).
#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <xxhash.h>

#include "h1_codec.hpp"

#include "backend_adapter.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/h2/session.hpp"
#include "sluice/net/socket.hpp"

namespace sluice::proxy {

namespace {

// Bytes of pipelined input held while a response is in flight before the
// connection stops reading (and so stops the client) until it catches up.
constexpr uint32_t k_pipeline_bytes_max = 64u << 10;

// Lingering after an error answer that closes (h1_send.cpp): how much input
// is read and dropped before the close.
constexpr uint64_t k_linger_bytes_max = 64u << 20;



bool busy(conn_state s) noexcept {
  return s == conn_state::upstream || s == conn_state::streaming || s == conn_state::local ||
         s == conn_state::quota_wait;
}

// Over a per-shard cap, or out of memory before a connection object exists:
// shed at once rather than degrade everyone, with an answer the client can
// act on. One non-blocking send on a fresh socket (its buffer is empty).
constexpr std::string_view k_shed =
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 122\r\n"
    "retry-after: 1\r\nconnection: close\r\n\r\n"
    "{\"error\":{\"message\":\"The server is overloaded. Please try again.\",\"type\":\"server_error\","
    "\"param\":null,\"code\":\"overloaded\"}}";
static_assert(k_shed.size() - k_shed.find("\r\n\r\n") - 4 == 122, "content-length of the shed answer");

http::limits limits_from(const config::server_config& s) {
  http::limits l;
  l.head_bytes_max = s.max_head_bytes;
  l.line_bytes_max = s.max_line_bytes;
  l.header_count_max = static_cast<uint16_t>(s.max_header_count);
  l.body_bytes_max = s.max_body_bytes;
  return l;
}

void shed(int fd) noexcept {
  ssize_t sent = ::send(fd, k_shed.data(), k_shed.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)sent;  // best effort: the close says the rest
  ::close(fd);
}

}  // namespace

h1_codec::h1_codec(shard_context& s, exchange_policy& x, int listen_fd, int tls_listen_fd) noexcept
    : client_codec(x, s.metrics), _s(s), _x(x), _listen_fd(listen_fd), _limits(limits_from(s.cfg->server)), _tls_listen_fd(tls_listen_fd) {
  _accept_op.owner = this;
  _accept_op.fn = &h1_codec::on_accept;
  _tls_accept_op.owner = this;
  _tls_accept_op.fn = &h1_codec::on_tls_accept;
}

h1_codec::~h1_codec() {
  while (_conns != nullptr) {
    downstream_conn* d = _conns;
    _conns = d->all_hook.next;
    _timers.cancel(d->timer);
    _r.unregister_file(d->slot);
    if (d->fd >= 0) ::close(d->fd);
    delete d;
  }
  if (_listen_fd >= 0) ::close(_listen_fd);
  if (_tls_listen_fd >= 0) ::close(_tls_listen_fd);
}

bool h1_codec::init() noexcept {
  // 512 x 16 KiB provided buffers per shard: a receive lands in one buffer
  // and is copied into the connection's request buffer at once, so buffers
  // turn over quickly; 8 MiB per shard bounds what the kernel may fill.
  _bufs = net::buffer_ring::create(_r.ring(), 0, 512, 16 * 1024);
  if (!_bufs) return false;
  submit_accept();
  if (_tls_listen_fd >= 0) submit_tls_accept();
  return true;
}

void h1_codec::on_iteration(uint64_t now) noexcept {
  _bufs->publish();
  if (!_accept_armed && !_draining) submit_accept();
  if (_tls_listen_fd >= 0 && !_tls_accept_armed && !_draining) submit_tls_accept();
  if (_handover) close_handed_over_listeners();
  // Deadlines whose time has come (timeouts are seconds long: a loop
  // turn's precision is plenty). on_deadline may close and free any
  // connection, whose timer then leaves the wheel with it.
  _timers.expire(now, [this](shard::timer& t) { on_deadline(static_cast<downstream_conn*>(t.owner)); });
}

void h1_codec::submit_accept() noexcept {
  io_uring_sqe* s = _r.sqe(&_accept_op);
  io_uring_prep_multishot_accept(s, _listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  _accept_armed = true;
}

void h1_codec::submit_tls_accept() noexcept {
  io_uring_sqe* s = _r.sqe(&_tls_accept_op);
  io_uring_prep_multishot_accept(s, _tls_listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  _tls_accept_armed = true;
}

void h1_codec::close_handed_over_listeners() noexcept {
  // Only this process's fd goes: the socket lives on in the other one.
  if (!_accept_armed && _listen_fd >= 0) {
    ::close(_listen_fd);
    _listen_fd = -1;
  }
  if (!_tls_accept_armed && _tls_listen_fd >= 0) {
    ::close(_tls_listen_fd);
    _tls_listen_fd = -1;
  }
}

void h1_codec::on_accept(shard::completion* c, const io_uring_cqe* cqe) {
  static_cast<op<h1_codec>*>(c)->owner->on_accept_cqe(cqe, false);
}

void h1_codec::on_tls_accept(shard::completion* c, const io_uring_cqe* cqe) {
  static_cast<op<h1_codec>*>(c)->owner->on_accept_cqe(cqe, true);
}

void h1_codec::on_accept_cqe(const io_uring_cqe* cqe, bool tls_port) noexcept {
  // A multishot accept that ended is re-armed from on_iteration (a loop
  // turn later), which keeps EMFILE from spinning.
  if ((cqe->flags & IORING_CQE_F_MORE) == 0) (tls_port ? _tls_accept_armed : _accept_armed) = false;
  if (cqe->res >= 0) {
    const int fd = cqe->res;
    // A handover serves what its cancelled accept still brought: the
    // kernel took that connection off the shared queue for this process.
    if ((_draining && !_handover) || (tls_port && !_tls_ctx)) {
      ::close(fd);
    } else if (_conn_count >= _cfg->server.connections_max) {
      _metrics.at(metrics::stat::shed_connections).add();
      if (tls_port) {
        ::close(fd);  // a plaintext 503 would be garbage to a TLS client
      } else {
        shed(fd);
      }
    } else {
      accept_connection(fd, tls_port);
    }
  } else if (cqe->res != -ECANCELED) {
    // EMFILE/ENFILE/ENOMEM: out of resources; the multishot ends.
    log::warn("shard {}: accept: {}", _s.index, std::strerror(-cqe->res));
  }
}

void h1_codec::accept_connection(int fd, bool tls_port) noexcept {
  auto* d = new (std::nothrow) downstream_conn(_limits);
  if (d != nullptr && tls_port) {
    try {
      d->tls = std::make_unique<tls::session>(*_tls_ctx);
    } catch (...) {
      delete d;
      d = nullptr;
    }
  }
  if (d == nullptr) {
    _metrics.at(metrics::stat::shed_memory).add();
    if (tls_port) {
      ::close(fd);
    } else {
      shed(fd);
    }
    return;
  }
  account_connection_memory(sizeof(downstream_conn));
  d->tls_port = tls_port;
  d->tls_send_op.owner = d;
  d->tls_send_op.fn = &h1_codec::on_tls_send;
  d->codec = this;
  d->fd = fd;
  d->recv_op.owner = d->send_op.owner = d;
  d->timer.owner = d;
  d->recv_op.fn = &h1_codec::on_recv;
  d->send_op.fn = &h1_codec::on_send;
  bind_exchange(d);
  net::set_nodelay(fd);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    d->peer_ip_len = static_cast<uint8_t>(net::format_ip(ss, d->peer_ip, sizeof d->peer_ip));
  }
  d->all_hook.next = _conns;
  if (_conns != nullptr) _conns->all_hook.prev = d;
  _conns = d;
  ++_conn_count;
  _metrics.at(metrics::stat::connections_accepted).add();
  _metrics.at(metrics::stat::connections_open).add();
  d->state = conn_state::idle;
  set_deadline(d, deadline_kind::header, _cfg->server.header_timeout_ms);
  d->slot = _r.register_file(fd);
  submit_recv(d);
}

void h1_codec::set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept {
  const uint64_t now = now_ms();
  uint64_t at = deadline_at(k, now, ms, d->x.total_deadline_ms);
  if (k == deadline_kind::upstream_idle) at = idle_or_ping_at(d->x.pings, now, at);
  if (at == 0) {
    d->deadline = deadline_kind::none;
    _timers.cancel(d->timer);
    return;
  }
  d->deadline = k;
  _timers.arm(d->timer, at);
}

void h1_codec::begin_drain(bool handover) noexcept {
  _handover = handover;
  if (_accept_armed) {
    io_uring_sqe* s = _r.sqe_untracked();
    io_uring_prep_cancel(s, &_accept_op, 0);
  }
  if (_tls_accept_armed) {
    io_uring_sqe* s = _r.sqe_untracked();
    io_uring_prep_cancel(s, &_tls_accept_op, 0);
  }
  if (_listen_fd >= 0 && !handover) {
    // Connections still in this listener's queue are reset; with
    // SO_REUSEPORT the kernel stops routing new ones here at once.
    ::shutdown(_listen_fd, SHUT_RDWR);
  }
  if (_tls_listen_fd >= 0 && !handover) ::shutdown(_tls_listen_fd, SHUT_RDWR);
  // Idle keep-alive connections close now; busy ones after their response.
  downstream_conn* d = _conns;
  while (d != nullptr) {
    downstream_conn* next = d->all_hook.next;
    if (d->h2) {
      if (d->state != conn_state::closing && d->state != conn_state::lingering) {
        _h2->drain(d);  // GOAWAY: streams in flight finish
      }
    } else if (d->state == conn_state::idle && d->in.len == d->req_start) {
      if (!handover) {
        close_downstream(d);
      } else {
        set_deadline(d, deadline_kind::idle, std::min(k_handover_idle_grace_ms, _cfg->server.idle_timeout_ms));
      }
    }
    d = next;
  }
}

void h1_codec::cut_drain() noexcept {
  // A request cut here is audited as cancelled, with what it had generated
  // so far.
  downstream_conn* d = _conns;
  while (d != nullptr) {
    downstream_conn* next = d->all_hook.next;
    if (d->state != conn_state::closing) {
      if (d->h2) {
        _h2->cut(d);  // its streams' exchanges, audited as the drain's cut
      } else if (d->x.request_open) {
        d->x.cancelled = true;
        d->x.error_code = "drain_timeout";
        if (d->x.status == 0) d->x.status = 503;
      }
      close_downstream(d);
    }
    d = next;
  }
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

void h1_codec::fail(exchange& x) noexcept { close_downstream(x.conn); }

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
  maybe_free(d);  // may free d, and x with it
  return false;
}

void h1_codec::request_bytes_free(exchange& x) noexcept { next_request(x.conn); }

void h1_codec::submit_recv(downstream_conn* d) noexcept {
  io_uring_sqe* s = _r.sqe(&d->recv_op);
  io_uring_prep_recv_multishot(s, d->fd, nullptr, 0, 0);
  shard::aim(s, d->slot);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = _bufs->group_id();
  d->recv.on_armed();
  ++d->ops;
}

void h1_codec::on_recv(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->codec->on_recv_cqe(d, cqe);
}

void h1_codec::on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept {
  const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
  const int res = cqe->res;
  if (!more) {
    d->recv.on_ended();
    --d->ops;
  }
  if (res > 0 && (cqe->flags & IORING_CQE_F_BUFFER) != 0) {
    const auto bid = static_cast<uint16_t>(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
    const char* src = _bufs->buffer(bid);
    bool ok = true;
    const bool tls_bytes = d->tls && d->state != conn_state::lingering;
    if ((tls_bytes || d->h2) && d->state != conn_state::closing && d->state != conn_state::lingering) {
      // Ciphertext goes to the TLS session (the plaintext on from there);
      // HTTP/2 plaintext to its session, read where it lies.
      ++d->ops;
      if (tls_bytes) {
        tls_input(d, src, static_cast<size_t>(res));
      } else {
        _h2->on_bytes(d, std::string_view(src, static_cast<size_t>(res)));
      }
      --d->ops;
      _bufs->recycle(bid);
      if (d->state == conn_state::closing) {
        maybe_free(d);
        return;
      }
      if (d->recv.wants_arm()) submit_recv(d);
      return;
    }
    if (d->state == conn_state::lingering) {
      d->linger_bytes += static_cast<uint64_t>(res);  // read only to be dropped
      ok = d->linger_bytes <= k_linger_bytes_max;
    } else if (d->state != conn_state::closing) {
      // While a response is in flight the request buffer may be referenced
      // by an upstream send: it must not move. Pipelined bytes wait in the
      // stash until the exchange ends.
      byte_buf& dst = busy(d->state) ? d->stash : d->in;
      const char* old = dst.data;
      ok = dst.reserve(static_cast<size_t>(dst.len) + static_cast<size_t>(res) + simdjson::SIMDJSON_PADDING);
      if (ok) {
        std::memcpy(dst.data + dst.len, src, static_cast<size_t>(res));
        dst.len += static_cast<uint32_t>(res);
        if (&dst == &d->in && old != nullptr && old != d->in.data &&
            (d->state == conn_state::body)) {
          d->x.head.rebase(old, d->in.data);
        }
      }
    }
    _bufs->recycle(bid);
    if (!ok) {
      close_downstream(d);
      return;
    }
  }
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res == 0 || (res < 0 && res != -ENOBUFS && res != -ECANCELED)) {
    // The client closed (or reset). Mid-exchange this cancels the backend
    // request at once: vLLM stops generating when its socket closes.
    d->peer_eof = true;
    client_gone(d);
    return;
  }
  // Too much pipelined input held while a response is in flight: stop
  // reading (and so the client) until the exchange ends.
  if (busy(d->state) && d->stash.len > k_pipeline_bytes_max && d->recv.pause()) {
    io_uring_sqe* s = _r.sqe_untracked();
    io_uring_prep_cancel(s, &d->recv_op, 0);
  }
  // A multishot receive ends on its own when the buffer ring runs dry
  // (-ENOBUFS) or the kernel decides so, and with -ECANCELED after our
  // cancel: re-armed unless paused (a cancel whose completion comes after
  // the resume re-arms here; the resume found it still armed).
  if (d->recv.wants_arm()) submit_recv(d);
  if (res > 0) process_input(d);
}

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
        if (!d->spoke && !d->tls_port && static_cast<unsigned char>(d->in.data[d->req_start]) == 0x16) {
          // A ClientHello on the plaintext port: the client's TLS stack
          // gets an alert at once (not a 400 it cannot read, nor a hang).
          const std::span<const char> first(d->in.data + d->req_start, d->in.len - d->req_start);
          const tls::sniff sn = tls::looks_like_tls_client_hello(first);
          if (sn == tls::sniff::need_more) return;
          if (sn == tls::sniff::yes) {
            _metrics.at(metrics::stat::edge_protocol_mismatches).add();
            ssize_t sent = ::send(d->fd, tls::k_tls_on_plain_port_alert.data(), tls::k_tls_on_plain_port_alert.size(),
                                  MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)sent;  // best effort: the close says the rest
            close_downstream(d);
            return;
          }
        }
        if (!d->spoke && _h2 != nullptr && (_cfg->server.h2c || d->tls_port)) {
          // h2c with prior knowledge (RFC 9113 §3.3): the connection's
          // first bytes are the client preface.
          const std::span<const char> first(d->in.data + d->req_start, d->in.len - d->req_start);
          const h2::sniff sn = h2::looks_like_h2_preface(first);
          if (sn == h2::sniff::need_more) return;
          if (sn == h2::sniff::yes) {
            start_h2(d);
            return;
          }
        }
        d->spoke = true;
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
          submit_send(d);
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
      close_downstream(d);
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
  if (_draining && d->in.len == 0 && !_handover) {
    close_downstream(d);
    return;
  }
  // In a handover the response just sent began before the drain and said
  // keep-alive: the client's next request may be on its way, and is
  // answered (saying close) if it comes within the grace.
  set_deadline(d, deadline_kind::idle,
               _draining && _handover ? std::min(k_handover_idle_grace_ms, _cfg->server.idle_timeout_ms)
                                      : _cfg->server.idle_timeout_ms);
  d->recv.resume();
  if (d->recv.wants_arm()) submit_recv(d);
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

void h1_codec::client_gone(downstream_conn* d) noexcept {
  if (d->h2) {
    // Its streams end with the connection (audited there); `x` is unused.
    end_conn(d, true);
    return;
  }
  if (d->state == conn_state::upstream || d->state == conn_state::streaming || d->state == conn_state::quota_wait) {
    _x.cancel(d->x);
    close_downstream(d);  // the backend request is cancelled with the connection
    return;
  }
  if (d->x.request_open && d->x.status == 0) {
    // Gone mid-body: nothing was answered, and the audit says why.
    d->x.cancelled = true;
    d->x.status = 499;
    d->x.error_code = "client_closed";
  }
  close_downstream(d);
}

void h1_codec::close_downstream(downstream_conn* d) noexcept {
  if (d->state == conn_state::closing) return;
  if (d->h2) _h2->on_close(d);  // every stream still open is cut (audited 499)
  if (d->state == conn_state::quota_wait || d->x.waiting != exchange::waiting_in::none) _x.unpark(d->x);
  if (d->x.request_open) _x.end_request(d->x);
  if (d->x.inflight_counted) {
    _metrics.at(metrics::stat::requests_inflight).sub();
    d->x.inflight_counted = false;
  }
  d->state = conn_state::closing;
  d->deadline = deadline_kind::none;
  _timers.cancel(d->timer);
  if (d->x.adapter != nullptr) d->x.adapter->release(d->x);
  if (d->tls && d->send_busy && !d->tls_out_busy) {
    // A send whose plaintext waits for ring room no kernel send will make:
    // it ends here (its lender gets its buffer back).
    d->send_busy = false;
    --d->ops;
    give_back_lent_buffer(d);
  }
  // shutdown() completes the pending receive (and any send) at once; the
  // fd is closed when the last operation has come back.
  ::shutdown(d->fd, SHUT_RDWR);
  maybe_free(d);
}

void h1_codec::maybe_free(downstream_conn* d) noexcept {
  if (d->state != conn_state::closing || d->ops > 0) return;
  SLUICE_VERIFY(!d->x.up_send_inflight && d->send_pin == nullptr && !d->recv.armed() && !d->send_busy);
  SLUICE_VERIFY(!d->tls_out_busy);
  SLUICE_VERIFY(!d->timer.armed());
  if (d->h2) _h2->on_free(d);
  _r.unregister_file(d->slot);  // no operation is left on it (ops is 0)
  ::close(d->fd);
  d->fd = -1;
  if (d->all_hook.prev != nullptr) {
    d->all_hook.prev->all_hook.next = d->all_hook.next;
  } else {
    _conns = d->all_hook.next;
  }
  if (d->all_hook.next != nullptr) d->all_hook.next->all_hook.prev = d->all_hook.prev;
  --_conn_count;
  _metrics.at(metrics::stat::connections_open).sub();
  account_connection_memory(-static_cast<int64_t>(sizeof(downstream_conn) + (d->mem.sse ? k_sse_scanner_bytes : 0)));
  delete d;
}

void h1_codec::start_h2(downstream_conn* d) noexcept {
  d->spoke = true;
  d->state = conn_state::streaming;  // the streams' states are the HTTP/2 codec's
  set_deadline(d, deadline_kind::none, 0);
  const std::string_view first(d->in.data + d->req_start, d->in.len - d->req_start);
  ++d->ops;
  const bool ok = _h2->adopt(d, first);
  --d->ops;
  d->in.len = d->req_start = 0;
  if (d->in.cap > (64u << 10)) d->in.release();
  if (!ok) {
    _metrics.at(metrics::stat::shed_memory).add();
    close_downstream(d);
    return;
  }
  maybe_free(d);
}

void h1_codec::end_conn(downstream_conn* d, bool peer_gone) noexcept {
  if (peer_gone) d->peer_eof = true;
  if (!d->peer_eof && d->state != conn_state::closing && d->state != conn_state::lingering) {
    // The session is done (its GOAWAY is on the socket) but the client may
    // still be sending -- WINDOW_UPDATEs for what it was reading, frames
    // it wrote before the GOAWAY came. A close with those unread would be
    // an RST, which can overtake the GOAWAY: its streams end first, then
    // the connection lingers as an HTTP/1.1 one does after an error answer.
    _h2->on_close(d);
    linger(d);
    return;
  }
  close_downstream(d);
}

void h1_codec::arm_conn_deadline(downstream_conn* d, bool sending, bool idle) noexcept {
  if (d->state == conn_state::closing || d->state == conn_state::lingering) return;
  if (sending) {
    set_deadline(d, deadline_kind::send, _cfg->server.idle_timeout_ms);
  } else if (idle) {
    if (d->deadline != deadline_kind::idle) set_deadline(d, deadline_kind::idle, _cfg->server.idle_timeout_ms);
  } else if (d->deadline != deadline_kind::none) {
    set_deadline(d, deadline_kind::none, 0);
  }
}

void h1_codec::on_deadline(downstream_conn* d) noexcept {
  const deadline_kind k = d->deadline;
  d->deadline = deadline_kind::none;
  if (d->h2) {
    // An HTTP/2 connection's own deadline: idle with no stream (GOAWAY,
    // then the close), or its GOAWAY did not go out in time.
    if (k == deadline_kind::idle && !_draining) {
      _h2->drain(d);  // GOAWAY: its send's deadline closes a client that does not take it
      return;
    }
    if (k == deadline_kind::send) _metrics.at(metrics::stat::client_stalls).add();
    close_downstream(d);
    return;
  }
  switch (k) {
    case deadline_kind::header:
      if (d->state == conn_state::idle && d->in.len == d->req_start) {
        close_downstream(d);  // connected, said nothing
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
      close_downstream(d);
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
        close_downstream(d);
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
