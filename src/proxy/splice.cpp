// The splice path for response bodies: backend socket -> pipe -> client
// socket, with no copy through user space for the client's bytes. A tee of
// each batch into a second pipe is read back to scan the chunk framing (to
// end the response exactly at the backend's terminal chunk) and the SSE
// events (usage, finish_reason, [DONE]).
//
// io_uring runs IORING_OP_SPLICE/TEE in its worker threads (they have no
// non-blocking fast path), so each splice from the socket is linked behind
// a POLLIN poll and uses SPLICE_F_NONBLOCK: a worker never sleeps on an
// empty socket or a full client buffer; EAGAIN re-polls instead.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "shard_server.hpp"

namespace sluice::proxy {

namespace {
constexpr unsigned k_splice_flags = SPLICE_F_NONBLOCK | SPLICE_F_MOVE;
constexpr uint32_t k_splice_batch_bytes = 64u << 10;

void on_poll_done(shard::completion* c, const io_uring_cqe*) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  --d->ops;
  // The linked splice reports the outcome; a closing connection is freed
  // by whichever of its operations comes back last.
  if (d->state == conn_state::closing && d->ops == 0) d->srv->free_if_closing(d);
}
}  // namespace

void shard_server::free_if_closing(downstream_conn* d) noexcept { maybe_free(d); }

bool shard_server::start_splice(downstream_conn* d) noexcept {
  if (!d->pipe.valid()) {
    d->pipe = _pipes.acquire();
    if (!d->pipe.valid()) return false;
    d->tee_pipe = _pipes.acquire();
    if (!d->tee_pipe.valid()) {
      _pipes.release(d->pipe, true);
      d->pipe = {};
      return false;
    }
    d->pipe_bytes = 0;
    d->poll_op.fn = &on_poll_done;
    d->tee_op.owner = d->read_op.owner = d;
    d->tee_op.fn = &on_poll_done;  // the linked read reports the outcome
    d->read_op.fn = &shard_server::on_tee_read;
    if (!d->counted_stream) {
      _stats.streams_spliced.add();
      d->counted_stream = true;
    }
  }
  splice_step(d);
  return true;
}

void shard_server::splice_step(downstream_conn* d) noexcept {
  upstream_conn* u = d->up;
  io_uring_sqe* p = _r.sqe(&d->poll_op);
  io_uring_prep_poll_add(p, u->fd, POLLIN | POLLRDHUP);
  p->flags |= IOSQE_IO_LINK;
  ++d->ops;
  d->splice_op.fn = &shard_server::on_splice_in;
  io_uring_sqe* s = _r.sqe(&d->splice_op);
  io_uring_prep_splice(s, u->fd, -1, d->pipe.write_fd, -1, k_splice_batch_bytes, k_splice_flags);
  ++d->ops;
}

void shard_server::on_splice_in(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->srv->on_splice_in_cqe(d, cqe->res);
}

void shard_server::on_splice_in_cqe(downstream_conn* d, int res) noexcept {
  --d->ops;
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res == -EAGAIN || res == -ECANCELED) {
    // Woken without data (or the poll was cut short): wait again.
    if (d->up != nullptr) splice_step(d);
    return;
  }
  if (res <= 0) {
    if (res == 0 && d->rparser.finish_at_eof()) {
      d->response_complete = true;
      d->up_reusable = false;
      finish_exchange(d);
      return;
    }
    upstream_failed(d, errc::upstream_closed);
    return;
  }
  const auto n = static_cast<uint32_t>(res);
  d->pipe_bytes += n;
  // The scan buffer is made when the first bytes come (an idle stream holds
  // none) and kept; one splice moves at most k_splice_batch_bytes.
  if (!d->tee_buf.reserve(k_splice_batch_bytes)) {
    upstream_failed(d, errc::internal);
    return;
  }
  io_uring_sqe* t = _r.sqe(&d->tee_op);
  io_uring_prep_tee(t, d->pipe.read_fd, d->tee_pipe.write_fd, n, SPLICE_F_NONBLOCK);
  t->flags |= IOSQE_IO_LINK;
  ++d->ops;
  io_uring_sqe* r = _r.sqe(&d->read_op);
  io_uring_prep_read(r, d->tee_pipe.read_fd, d->tee_buf.data, n, 0);
  ++d->ops;
  d->tee_expected = n;
}

void shard_server::on_tee_read(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->srv->on_tee_read_cqe(d, cqe->res);
}

void shard_server::on_tee_read_cqe(downstream_conn* d, int res) noexcept {
  --d->ops;
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res < 0 || static_cast<uint32_t>(res) != d->tee_expected) {
    upstream_failed(d, errc::upstream_closed);
    return;
  }
  http::body_sink sink{&shard_server::on_body_data, d};
  http::body_status bs = d->rparser.feed_body(d->tee_buf.data, static_cast<size_t>(res), sink);
  if (bs.error != errc::ok) {
    upstream_failed(d, errc::upstream_protocol);
    return;
  }
  set_deadline(d, deadline_kind::upstream_idle, _cfg->groups[d->group].upstream.stream_idle_timeout_ms);
  d->response_complete = bs.complete;
  if (bs.complete && bs.consumed != static_cast<size_t>(res)) d->up_reusable = false;
  d->pipe_forward = static_cast<uint32_t>(bs.consumed);
  d->splice_out_wait = false;
  if (d->pipe_forward == 0) {
    if (d->response_complete) {
      finish_exchange(d);
    } else {
      splice_step(d);
    }
    return;
  }
  submit_splice_out(d);
}

void shard_server::submit_splice_out(downstream_conn* d) noexcept {
  if (d->splice_out_wait) {
    io_uring_sqe* p = _r.sqe(&d->poll_op);
    io_uring_prep_poll_add(p, d->fd, POLLOUT);
    p->flags |= IOSQE_IO_LINK;
    ++d->ops;
  }
  d->splice_op.fn = &shard_server::on_splice_out;
  io_uring_sqe* s = _r.sqe(&d->splice_op);
  io_uring_prep_splice(s, d->pipe.read_fd, -1, d->fd, -1, d->pipe_forward, k_splice_flags);
  ++d->ops;
}

void shard_server::on_splice_out(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->srv->on_splice_out_cqe(d, cqe->res);
}

void shard_server::on_splice_out_cqe(downstream_conn* d, int res) noexcept {
  --d->ops;
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res == -EAGAIN || res == -ECANCELED) {
    // The client's socket buffer is full (a slow reader): wait for room.
    // The backend is not read meanwhile, so memory stays bounded.
    d->splice_out_wait = true;
    submit_splice_out(d);
    return;
  }
  if (res <= 0) {
    d->peer_eof = true;
    abort_exchange(d);
    return;
  }
  d->pipe_forward -= static_cast<uint32_t>(res);
  d->pipe_bytes -= static_cast<uint32_t>(res);
  if (d->pipe_forward > 0) {
    // The client took bytes: the idle time starts again (see on_send_cqe).
    if (d->deadline == deadline_kind::upstream_idle) {
      set_deadline(d, deadline_kind::upstream_idle, _cfg->groups[d->group].upstream.stream_idle_timeout_ms);
    }
    d->splice_out_wait = false;
    submit_splice_out(d);
    return;
  }
  if (d->response_complete) {
    finish_exchange(d);
    return;
  }
  splice_step(d);
}

void shard_server::end_splice(downstream_conn* d, bool pipe_empty) noexcept {
  _pipes.release(d->pipe, pipe_empty);
  _pipes.release(d->tee_pipe, pipe_empty);
  d->pipe = {};
  d->tee_pipe = {};
  d->pipe_bytes = 0;
  d->pipe_forward = 0;
}

}  // namespace sluice::proxy
