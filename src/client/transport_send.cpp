// The client transport's send: the protocol's output (d->send_iov) goes
// out as one send at a time, plain or through the TLS session; a short send
// goes on with the rest; the protocol hears of the send once all of it went
// (or failed).
#include <sys/socket.h>

#include <cerrno>

#include "client_transport.hpp"

#include "wire.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::proxy {

void client_transport::send_output(downstream_conn* d) noexcept {
  SLUICE_VERIFY(!d->send_busy);  // one send at a time: send_iov is the kernel's until its completion
  d->send_busy = true;
  ++d->ops;
  if (d->tls) {
    // Encrypted into the session's ring, sent from there (transport_tls.cpp).
    d->tls_iov_count = d->send_iov_count;
    d->tls_plain_bytes = 0;
    for (uint8_t i = 0; i < d->send_iov_count; ++i) {
      d->tls_iov[i] = d->send_iov[i];
      d->tls_plain_bytes += static_cast<uint32_t>(d->send_iov[i].iov_len);
    }
    tls_pump(d);
    return;
  }
  // One piece (an SSE batch, an answer with its body in `out`) is a plain send.
  io_uring_sqe* s = _r.sqe(&d->send_op);
  prep_send_iov(s, d->fd, d->send_iov, d->send_iov_count, d->down_msg);
  shard::aim(s, d->slot);
}

void client_transport::on_send(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->transport->on_send_cqe(d, cqe);
}

void client_transport::on_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept {
  const int res = cqe->res;
  if (res > 0 && d->state != conn_state::closing &&
      advance_iov(d->send_iov, d->send_iov_count, static_cast<size_t>(res))) {
    // Short: the rest goes on from where it stopped (it still reads what
    // the protocol lent). The client took bytes: its protocol hears it.
    io_uring_sqe* s = _r.sqe(&d->send_op);
    prep_send_iov(s, d->fd, d->send_iov, d->send_iov_count, d->down_msg);
    shard::aim(s, d->slot);
    d->proto->on_progress(d, static_cast<size_t>(res));  // (the send's op holds d)
    return;
  }
  --d->ops;
  d->send_busy = false;
  // (A send of bytes that took none: the socket is gone.)
  send_done(d, res != 0 ? res : -EPIPE);
}

void client_transport::send_done(downstream_conn* d, int res) noexcept {
  // The protocol hears of every send, closing or not (it lets go of what
  // the send read).
  ++d->ops;
  d->proto->on_sent(d, res);
  --d->ops;
  maybe_free(d);
}

}  // namespace sluice::proxy
