#include "sluice/net/http_call.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cassert>
#include <cstring>

#include "sluice/net/socket.hpp"

namespace sluice::net {

http_call::~http_call() {
  // The kernel may still write into _reply or read _request: see the header.
  assert(_ops == 0 && "an http_call is destroyed only when no operation of it is in flight");
  if (_fd >= 0) ::close(_fd);
}

std::string_view http_call::to_string(outcome o) noexcept {
  switch (o) {
    case outcome::ok: return "ok";
    case outcome::connect_failed: return "connect failed";
    case outcome::io_error: return "connection failed";
    case outcome::timeout: return "timed out";
    case outcome::too_large: return "reply too large";
  }
  return "failed";
}

bool http_call::start(shard::reactor& r, const config::socket_address& to, uint64_t deadline_ms, done_fn done,
                      void* ctx, whole_fn whole) noexcept {
  assert(idle() && "an http_call starts again only once its last operation completed");
  const int fd = upstream_socket(to.family());
  if (fd < 0) return false;
  set_nodelay(fd);
  if (_reply.size() != _reply_max) _reply.resize(_reply_max);
  _r = &r;
  _fd = fd;
  _reply_len = 0;
  _sent = 0;
  _deadline_ms = deadline_ms;
  _done = done;
  _ctx = ctx;
  _whole = whole;
  std::memcpy(&_peer, &to.storage, sizeof _peer);
  _peer_len = to.length;
  _op.fn = &on_cqe;
  _op.self = this;
  _step = step::connect;
  io_uring_prep_connect(_r->sqe(&_op), _fd, reinterpret_cast<const sockaddr*>(&_peer), _peer_len);
  ++_ops;
  return true;
}

void http_call::on_cqe(shard::completion* c, const io_uring_cqe* cqe) {
  http_call* self = static_cast<io*>(c)->self;
  assert(self->_ops == 1);
  --self->_ops;
  self->advance(cqe->res);
}

void http_call::advance(int res) noexcept {
  if (!running()) {  // ended (timeout, cancel, a finished reply): the socket is shut down
    settle();
    return;
  }
  switch (_step) {
    case step::connect:
      if (res < 0) return finish(outcome::connect_failed);
      _step = step::send;
      submit_send();
      return;
    case step::send:
      if (res <= 0) return finish(outcome::io_error);
      _sent += static_cast<size_t>(res);
      if (_sent < _request.size()) {
        submit_send();
        return;
      }
      _step = step::recv;
      submit_recv();
      return;
    case step::recv:
      if (res < 0) return finish(outcome::io_error);
      if (res == 0) return finish(outcome::ok);  // the peer closed: the reply is whole or the owner says not
      _reply_len += static_cast<size_t>(res);
      if (_whole != nullptr && _whole(reply())) return finish(outcome::ok);
      if (_reply_len == _reply.size()) return finish(outcome::too_large);
      submit_recv();
      return;
  }
}

void http_call::submit_send() noexcept {
  io_uring_prep_send(_r->sqe(&_op), _fd, _request.data() + _sent, _request.size() - _sent, MSG_NOSIGNAL);
  ++_ops;
}

void http_call::submit_recv() noexcept {
  io_uring_prep_recv(_r->sqe(&_op), _fd, _reply.data() + _reply_len, _reply.size() - _reply_len, 0);
  ++_ops;
}

void http_call::finish(outcome o) noexcept {
  done_fn done = _done;
  _done = nullptr;
  abort_pending();
  settle();
  if (done != nullptr) done(_ctx, *this, o);
}

void http_call::settle() noexcept {
  if (_ops == 0 && _fd >= 0) {
    ::close(_fd);
    _fd = -1;
  }
}

void http_call::expire(uint64_t now_ms) noexcept {
  if (running() && now_ms >= _deadline_ms) finish(outcome::timeout);
}

void http_call::cancel() noexcept {
  if (!running()) return;
  _done = nullptr;
  abort_pending();
  settle();
}

void http_call::abort_pending() noexcept {
  if (_ops == 0) return;
  // Either ends the operation at once (a shut-down socket completes a
  // receive with 0, a connect with an error); the CQE still comes.
  ::shutdown(_fd, SHUT_RDWR);
  io_uring_prep_cancel(_r->sqe_untracked(), &_op, 0);
}

}  // namespace sluice::net
