// The client transport's TLS: a connection accepted on the TLS listener
// keeps a tls::session between its socket and its codec. Ciphertext from
// the receive is fed to the session; the handshake runs on the shard (no
// blocking call: the session has no socket); ALPN picks HTTP/1.1 or HTTP/2;
// plaintext goes on as a plaintext connection's receive would.
// A send's plaintext is encrypted into the session's output ring and its
// ciphertext sent on the connection's TLS send op; the send completes once
// its plaintext is all encrypted and the ring has drained to the socket.
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "client_transport.hpp"

#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"

namespace sluice::proxy {

namespace {

// Plaintext read from the session per call (a TLS record is at most 16 KiB).
constexpr size_t k_plain_chunk = 16u << 10;

}  // namespace

void client_transport::fail_tls(downstream_conn* d) noexcept {
  // The session's alert, best effort on the socket's own buffer, then the
  // close (no ciphertext send is waited for: the connection is over).
  d->tls_failed = true;
  const std::span<const char> alert = d->tls->pending_output();
  if (!alert.empty() && !d->tls_out_busy) {
    ssize_t sent = ::send(d->fd, alert.data(), alert.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)sent;
  }
  close_conn(d);
}

void client_transport::tls_input(downstream_conn* d, const char* src, size_t n) noexcept {
  tls::session& t = *d->tls;
  if (n != 0 && d->proto == nullptr && !t.handshake_done()) {
    // Plaintext HTTP on the TLS port: nginx's clear 400, then the close
    // (no TLS client sends a letter first).
    const tls::sniff sn = tls::looks_like_plain_http(std::span<const char>(src, n));
    if (sn == tls::sniff::yes) {
      _metrics.at(metrics::stat::edge_protocol_mismatches).add();
      ssize_t sent = ::send(d->fd, tls::k_plain_http_on_tls_port_response.data(),
                            tls::k_plain_http_on_tls_port_response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)sent;  // best effort on a fresh socket: the close says the rest
      close_conn(d);
      return;
    }
  }
  if (n != 0 && t.feed(std::span<const char>(src, n)) != tls::status::ok) {
    // More ciphertext than the ring holds: the client sends records faster
    // than they are read, which no well-behaved client does.
    log::debug("shard {}: TLS input from {} overflows its ring", _s.index,
               std::string_view(d->peer_ip, d->peer_ip_len));
    close_conn(d);
    return;
  }
  d->tls_resume = false;
  if (!t.handshake_done()) {
    const tls::status st = t.handshake();
    if (st == tls::status::want_write) d->tls_resume = true;  // the ring is full: on after its send (on_tls_send_cqe)
    if (st == tls::status::error) {
      _metrics.at(metrics::stat::tls_handshake_errors).add();
      log::debug("shard {}: TLS handshake with {} failed: {}", _s.index,
                 std::string_view(d->peer_ip, d->peer_ip_len), t.reason());
      fail_tls(d);
      return;
    }
    if (st == tls::status::ok) {
      _metrics.at(metrics::stat::tls_handshakes).add();
      _metrics.at(metrics::stat::tls_copy_connections).add();  // records are encrypted here, not by the kernel
      if (t.alpn() == tls::application_protocol::h2 && _h2 != nullptr) {
        hand_to(d, _h2, {});
        if (d->state == conn_state::closing) return;
      }
    }
  }
  if (t.handshake_done()) {
    char plain[k_plain_chunk];
    while (d->state != conn_state::closing) {
      const tls::io_result r = t.read(std::span<char>(plain, sizeof plain));
      if (r.st == tls::status::ok) {
        if (!take_plaintext(d, plain, r.bytes)) return;
        // The record was the last of what came in (nearly always): no
        // second call only to hear want_read.
        if (!t.may_read_more()) break;
        continue;
      }
      if (r.st == tls::status::want_read) break;
      if (r.st == tls::status::want_write) {
        // OpenSSL must write first (a KeyUpdate's answer) and the ring is
        // full: reading goes on once the ciphertext send has made room.
        d->tls_resume = true;
        break;
      }
      if (r.st == tls::status::closed) {
        // close_notify: the client is done sending, as an EOF.
        d->peer_eof = true;
        peer_gone(d);
        return;
      }
      // Bad records, garbage after the handshake, a renegotiation attempt:
      // the alert goes out, then the close.
      log::debug("shard {}: TLS from {}: {}", _s.index, std::string_view(d->peer_ip, d->peer_ip_len), t.reason());
      fail_tls(d);
      return;
    }
  }
  if (d->state != conn_state::closing && !d->tls_out_busy && t.has_output()) submit_tls_send(d);
}

void client_transport::tls_pump(downstream_conn* d) noexcept {
  tls::session& t = *d->tls;
  while (d->send_busy && d->tls_iov_count > 0 && !d->tls_failed) {
    const iovec& v = d->tls_iov[0];
    const tls::io_result r = t.write(std::span<const char>(static_cast<const char*>(v.iov_base), v.iov_len));
    if (r.bytes != 0) advance_iov(d->tls_iov, d->tls_iov_count, r.bytes);
    if (r.st == tls::status::want_write) break;
    if (r.st == tls::status::error) {
      d->tls_failed = true;
      ::shutdown(d->fd, SHUT_RDWR);  // the receive ends, and closes the connection
      break;
    }
  }
  if (!d->tls_out_busy && t.has_output()) submit_tls_send(d);
}

void client_transport::submit_tls_send(downstream_conn* d) noexcept {
  SLUICE_VERIFY(!d->tls_out_busy);  // one ciphertext send at a time: its bytes stay in the ring until consumed
  const std::span<const char> out = d->tls->pending_output();
  io_uring_sqe* s = _r.sqe(&d->tls_send_op);
  io_uring_prep_send(s, d->fd, out.data(), out.size(), MSG_NOSIGNAL);
  shard::aim(s, d->slot);
  d->tls_out_busy = true;
  ++d->ops;
}

void client_transport::on_tls_send(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->transport->on_tls_send_cqe(d, cqe);
}

void client_transport::on_tls_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept {
  --d->ops;
  d->tls_out_busy = false;
  const int res = cqe->res;
  if (d->state == conn_state::closing) {
    if (d->send_busy) {
      d->send_busy = false;
      --d->ops;
      send_done(d, -ECANCELED);  // its protocol lets go of what it read
      return;
    }
    maybe_free(d);
    return;
  }
  if (res <= 0) {
    // EPIPE / ECONNRESET: the client is gone.
    if (d->send_busy) {
      d->send_busy = false;
      --d->ops;
      send_done(d, res < 0 ? res : -EPIPE);
      return;
    }
    d->peer_eof = true;
    peer_gone(d);
    return;
  }
  d->tls->consume_output(static_cast<size_t>(res));
  if (d->tls_resume) {
    // A handshake or a read that waited for room in the ring goes on.
    ++d->ops;
    tls_input(d, nullptr, 0);
    --d->ops;
    if (d->state == conn_state::closing) {
      maybe_free(d);
      return;
    }
  }
  tls_pump(d);
  if (d->send_busy && d->tls_iov_count == 0 && !d->tls_out_busy) {
    // Every byte of the send's plaintext is encrypted and on the socket.
    d->send_busy = false;
    --d->ops;
    send_done(d, static_cast<int>(d->tls_plain_bytes));
  } else if (d->send_busy) {
    d->proto->on_progress(d, 0);  // the client took ciphertext: the rest goes on
  }
}

}  // namespace sluice::proxy
