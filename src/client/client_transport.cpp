// The client transport: accept, receive, the sniff that picks a
// connection's protocol, close and free, the connection's deadlines,
// lingering close, drain.
#include "client_transport.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/h2/session.hpp"
#include "sluice/net/socket.hpp"

namespace sluice::proxy {

namespace {

// Lingering (end_conn, linger): how much input is read and dropped before
// the close, and for how long.
constexpr uint64_t k_linger_bytes_max = 64u << 20;
constexpr uint64_t k_linger_ms = 5000;

// Over a per-shard cap, or out of memory before a connection object exists:
// shed at once rather than degrade everyone, with an answer the client can
// act on. One non-blocking send on a fresh socket (its buffer is empty).
// Every client's first request is HTTP/1.1 or the HTTP/2 preface, and an
// HTTP/2 client reads this as the server's failed preface and reports it.
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

// Holds `d` for the length of a call into its protocol (transport.hpp:
// lifetime); the connection is freed after if it closed meanwhile.
template <class F>
void holding(client_transport& t, downstream_conn* d, F&& call) noexcept {
  ++d->ops;
  call();
  --d->ops;
  t.after_call(d);
}

}  // namespace

client_transport::client_transport(shard_context& s, int listen_fd, int tls_listen_fd) noexcept
    : _s(s), _limits(limits_from(s.cfg->server)), _listen_fd(listen_fd), _tls_listen_fd(tls_listen_fd) {
  _accept_op.owner = this;
  _accept_op.fn = &client_transport::on_accept;
  _tls_accept_op.owner = this;
  _tls_accept_op.fn = &client_transport::on_tls_accept;
}

client_transport::~client_transport() {
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

bool client_transport::init() noexcept {
  SLUICE_VERIFY(_first != nullptr);
  // 512 x 16 KiB provided buffers per shard: a receive lands in one buffer
  // and is taken by the protocol at once (HTTP/1.1 copies it into the
  // request buffer, HTTP/2's session reads it where it lies), so buffers
  // turn over quickly; 8 MiB per shard bounds what the kernel may fill.
  _bufs = net::buffer_ring::create(_r.ring(), 0, 512, 16 * 1024);
  if (!_bufs) return false;
  submit_accept();
  if (_tls_listen_fd >= 0) submit_tls_accept();
  return true;
}

void client_transport::on_iteration(uint64_t now) noexcept {
  _bufs->publish();
  if (!_accept_armed && !_draining) submit_accept();
  if (_tls_listen_fd >= 0 && !_tls_accept_armed && !_draining) submit_tls_accept();
  if (_handover) close_handed_over_listeners();
  // Deadlines whose time has come (timeouts are seconds long: a loop
  // turn's precision is plenty). on_deadline may close and free any
  // connection, whose timer then leaves the wheel with it.
  _timers.expire(now, [this](shard::timer& t) { on_deadline(static_cast<downstream_conn*>(t.owner)); });
}

// ---------------------------------------------------------------------------
// Accept

void client_transport::submit_accept() noexcept {
  io_uring_sqe* s = _r.sqe(&_accept_op);
  io_uring_prep_multishot_accept(s, _listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  _accept_armed = true;
}

void client_transport::submit_tls_accept() noexcept {
  io_uring_sqe* s = _r.sqe(&_tls_accept_op);
  io_uring_prep_multishot_accept(s, _tls_listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  _tls_accept_armed = true;
}

void client_transport::close_handed_over_listeners() noexcept {
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

void client_transport::on_accept(shard::completion* c, const io_uring_cqe* cqe) {
  static_cast<op<client_transport>*>(c)->owner->on_accept_cqe(cqe, false);
}

void client_transport::on_tls_accept(shard::completion* c, const io_uring_cqe* cqe) {
  static_cast<op<client_transport>*>(c)->owner->on_accept_cqe(cqe, true);
}

void client_transport::on_accept_cqe(const io_uring_cqe* cqe, bool tls_port) noexcept {
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

void client_transport::accept_connection(int fd, bool tls_port) noexcept {
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
  d->tls_send_op.fn = &client_transport::on_tls_send;
  d->transport = this;
  d->fd = fd;
  d->recv_op.owner = d->send_op.owner = d;
  d->timer.owner = d;
  d->recv_op.fn = &client_transport::on_recv;
  d->send_op.fn = &client_transport::on_send;
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
  // Until its protocol takes it: a client that says nothing, or not
  // enough to tell, is closed after the header timeout.
  arm_in(d, deadline_kind::header, _cfg->server.header_timeout_ms);
  d->slot = _r.register_file(fd);
  submit_recv(d);
}

// ---------------------------------------------------------------------------
// Receive, and the sniff

void client_transport::submit_recv(downstream_conn* d) noexcept {
  io_uring_sqe* s = _r.sqe(&d->recv_op);
  io_uring_prep_recv_multishot(s, d->fd, nullptr, 0, 0);
  shard::aim(s, d->slot);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = _bufs->group_id();
  d->recv.on_armed();
  ++d->ops;
}

void client_transport::pause_receive(downstream_conn* d) noexcept {
  if (d->recv.pause()) {
    io_uring_sqe* s = _r.sqe_untracked();
    io_uring_prep_cancel(s, &d->recv_op, 0);
  }
}

void client_transport::resume_receive(downstream_conn* d) noexcept {
  d->recv.resume();
  if (d->recv.wants_arm() && d->state != conn_state::closing) submit_recv(d);
}

void client_transport::on_recv(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->transport->on_recv_cqe(d, cqe);
}

void client_transport::on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept {
  const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
  const int res = cqe->res;
  if (!more) {
    d->recv.on_ended();
    --d->ops;
  }
  if (res > 0 && (cqe->flags & IORING_CQE_F_BUFFER) != 0) {
    const auto bid = static_cast<uint16_t>(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
    const char* src = _bufs->buffer(bid);
    const auto n = static_cast<size_t>(res);
    if (d->state == conn_state::lingering) {
      d->linger_bytes += n;  // read only to be dropped
      if (d->linger_bytes > k_linger_bytes_max) close_conn(d);
    } else if (d->state != conn_state::closing) {
      // Ciphertext goes to the TLS session (the plaintext on from there);
      // plaintext to the protocol, which takes it before the buffer goes
      // back to the ring.
      ++d->ops;
      if (d->tls) {
        tls_input(d, src, n);
      } else {
        take_plaintext(d, src, n);
      }
      --d->ops;
    }
    _bufs->recycle(bid);
  }
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res == 0 || (res < 0 && res != -ENOBUFS && res != -ECANCELED)) {
    // The client closed (or reset). Mid-exchange this cancels the backend
    // request at once: vLLM stops generating when its socket closes.
    d->peer_eof = true;
    peer_gone(d);
    return;
  }
  // A multishot receive ends on its own when the buffer ring runs dry
  // (-ENOBUFS) or the kernel decides so, and with -ECANCELED after a
  // pause's cancel: re-armed unless paused (a cancel whose completion comes
  // after the resume re-arms here; the resume found it still armed).
  if (d->recv.wants_arm()) submit_recv(d);
}

bool client_transport::take_plaintext(downstream_conn* d, const char* src, size_t n) noexcept {
  if (d->state == conn_state::lingering) {
    d->linger_bytes += n;
    return true;
  }
  if (d->proto != nullptr) {
    holding(*this, d, [&] { d->proto->on_bytes(d, std::string_view(src, n)); });
    return d->state != conn_state::closing;
  }
  // Not yet known: the bytes gather in d->in (where HTTP/1.1 reads them).
  if (!d->in.reserve(static_cast<size_t>(d->in.len) + n + simdjson::SIMDJSON_PADDING)) {
    close_conn(d);
    return false;
  }
  std::memcpy(d->in.data + d->in.len, src, n);
  d->in.len += static_cast<uint32_t>(n);
  sniff(d);
  return d->state != conn_state::closing;
}

void client_transport::sniff(downstream_conn* d) noexcept {
  const std::span<const char> first(d->in.data, d->in.len);
  if (!d->tls_port && static_cast<unsigned char>(first[0]) == 0x16) {
    // A ClientHello on the plaintext port: the client's TLS stack gets an
    // alert at once (not a 400 it cannot read, nor a hang).
    const tls::sniff sn = tls::looks_like_tls_client_hello(first);
    if (sn == tls::sniff::need_more) return;
    if (sn == tls::sniff::yes) {
      _metrics.at(metrics::stat::edge_protocol_mismatches).add();
      ssize_t sent = ::send(d->fd, tls::k_tls_on_plain_port_alert.data(), tls::k_tls_on_plain_port_alert.size(),
                            MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)sent;  // best effort: the close says the rest
      close_conn(d);
      return;
    }
  }
  if (_h2 != nullptr && (_cfg->server.h2c || d->tls_port)) {
    // h2c with prior knowledge (RFC 9113 §3.3): the connection's first
    // bytes are the client preface.
    const h2::sniff sn = h2::looks_like_h2_preface(first);
    if (sn == h2::sniff::need_more) return;
    if (sn == h2::sniff::yes) {
      hand_to(d, _h2, std::string_view(first.data(), first.size()));
      return;
    }
  }
  hand_to(d, _first, std::string_view(first.data(), first.size()));
}

void client_transport::hand_to(downstream_conn* d, conn_protocol* p, std::string_view first) noexcept {
  SLUICE_VERIFY(d->proto == nullptr);
  d->proto = p;
  arm_in(d, deadline_kind::none, 0);  // the protocol's deadlines from now on
  bool ok = true;
  holding(*this, d, [&] {
    ok = p->adopt(d, first);
    if (!ok) {
      _metrics.at(metrics::stat::shed_memory).add();
      d->proto = nullptr;  // it took nothing
      close_conn(d);
    }
  });
}

void client_transport::peer_gone(downstream_conn* d) noexcept {
  if (d->proto == nullptr || d->state == conn_state::lingering) {
    // Nothing said yet; or the protocol is done with it (end_conn, linger).
    close_conn(d);
    return;
  }
  holding(*this, d, [&] { d->proto->on_peer_gone(d); });
}

// ---------------------------------------------------------------------------
// Close and free

void client_transport::close_conn(downstream_conn* d) noexcept {
  if (d->state == conn_state::closing) return;
  if (d->proto != nullptr) d->proto->on_close(d);  // what is open ends (audited)
  d->state = conn_state::closing;
  d->deadline = deadline_kind::none;
  _timers.cancel(d->timer);
  if (d->tls && d->send_busy && !d->tls_out_busy) {
    // A send whose plaintext waits for ring room no kernel send will make:
    // it ends here, and its protocol lets go of what it read.
    // (Its own op holds d until the protocol let go: no free in between.)
    d->send_busy = false;
    if (d->proto != nullptr) d->proto->on_sent(d, -ECANCELED);
    --d->ops;
  }
  // shutdown() completes the pending receive (and any send) at once; the
  // fd is closed when the last operation has come back.
  ::shutdown(d->fd, SHUT_RDWR);
  maybe_free(d);
}

void client_transport::maybe_free(downstream_conn* d) noexcept {
  if (d->state != conn_state::closing || d->ops > 0) return;
  SLUICE_VERIFY(!d->recv.armed() && !d->send_busy && !d->tls_out_busy);
  SLUICE_VERIFY(!d->timer.armed());
  if (d->proto != nullptr) d->proto->on_free(d);
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

void client_transport::end_conn(downstream_conn* d, bool peer_gone) noexcept {
  if (peer_gone) d->peer_eof = true;
  if (!d->peer_eof && d->state != conn_state::closing && d->state != conn_state::lingering) {
    // The protocol is done (an HTTP/2 session's GOAWAY is on the socket)
    // but the client may still be sending -- WINDOW_UPDATEs for what it
    // was reading, frames it wrote before the GOAWAY came. A close with
    // those unread would be an RST, which can overtake what was sent: its
    // requests end first, then the connection lingers.
    if (d->proto != nullptr) d->proto->on_close(d);
    linger(d);
    return;
  }
  close_conn(d);
}

void client_transport::linger(downstream_conn* d) noexcept {
  // What nginx's lingering_close does: a client that sent its whole body
  // with its head (every SDK does) would turn a close with unread input
  // into an RST, which destroys the answer before the client reads it. So
  // the write side is shut (the client sees the answer, then EOF) and what
  // it still sends is read and dropped, for a bounded time and size.
  ::shutdown(d->fd, SHUT_WR);
  d->state = conn_state::lingering;
  d->linger_bytes = 0;
  arm_in(d, deadline_kind::linger, k_linger_ms);
  // A receive the protocol paused (too much pipelined input) reads again:
  // lingering is reading, to the client's EOF.
  resume_receive(d);
}

// ---------------------------------------------------------------------------
// Deadlines

void client_transport::set_deadline(downstream_conn* d, deadline_kind k, uint64_t at_ms) noexcept {
  if (k == deadline_kind::none || at_ms == 0) {
    d->deadline = deadline_kind::none;
    _timers.cancel(d->timer);
    return;
  }
  d->deadline = k;
  _timers.arm(d->timer, at_ms);
}

void client_transport::arm_in(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept {
  set_deadline(d, k, ms == 0 ? 0 : now_ms() + ms);
}

void client_transport::arm_conn_deadline(downstream_conn* d, bool sending, bool idle) noexcept {
  if (d->state == conn_state::closing || d->state == conn_state::lingering) return;
  if (sending) {
    arm_in(d, deadline_kind::send, _cfg->server.idle_timeout_ms);
  } else if (idle) {
    if (d->deadline != deadline_kind::idle) arm_in(d, deadline_kind::idle, _cfg->server.idle_timeout_ms);
  } else if (d->deadline != deadline_kind::none) {
    arm_in(d, deadline_kind::none, 0);
  }
}

void client_transport::on_deadline(downstream_conn* d) noexcept {
  const deadline_kind k = d->deadline;
  d->deadline = deadline_kind::none;
  if (k == deadline_kind::none) return;
  if (d->state == conn_state::lingering || d->proto == nullptr) {
    // Lingered long enough; or connected and said nothing, or not enough
    // to tell which protocol.
    close_conn(d);
    return;
  }
  holding(*this, d, [&] { d->proto->on_deadline(d, k); });
}

// ---------------------------------------------------------------------------
// Drain

void client_transport::begin_drain(bool handover) noexcept {
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
  // Each protocol drains its connections: idle keep-alive ones close now,
  // busy ones after their response (HTTP/2: GOAWAY).
  downstream_conn* d = _conns;
  while (d != nullptr) {
    downstream_conn* next = d->all_hook.next;
    if (d->state != conn_state::closing && d->state != conn_state::lingering) {
      if (d->proto != nullptr) {
        holding(*this, d, [&] { d->proto->drain(d); });
      } else if (d->in.len == 0) {
        // Connected, nothing said yet.
        if (!handover) {
          close_conn(d);
        } else {
          arm_in(d, deadline_kind::idle, std::min(k_handover_idle_grace_ms, _cfg->server.idle_timeout_ms));
        }
      }
    }
    d = next;
  }
}

void client_transport::cut_drain() noexcept {
  // A request cut here is audited as cancelled, with what it had generated
  // so far.
  downstream_conn* d = _conns;
  while (d != nullptr) {
    downstream_conn* next = d->all_hook.next;
    if (d->state != conn_state::closing) {
      ++d->ops;
      if (d->proto != nullptr) d->proto->cut(d);
      close_conn(d);
      --d->ops;
      maybe_free(d);
    }
    d = next;
  }
}

}  // namespace sluice::proxy
