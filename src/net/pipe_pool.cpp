#include "sluice/net/pipe_pool.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace sluice::net {

pipe_pool::pipe_pool(uint32_t max_pipes, uint32_t pipe_bytes) noexcept : _max(max_pipes), _pipe_bytes(pipe_bytes) {
  _idle.reserve(max_pipes < 1024 ? max_pipes : 1024);
}

pipe_pool::~pipe_pool() {
  for (pipe_fds& p : _idle) {
    ::close(p.read_fd);
    ::close(p.write_fd);
  }
}

pipe_fds pipe_pool::acquire() noexcept {
  if (!_idle.empty()) {
    pipe_fds p = _idle.back();
    _idle.pop_back();
    ++_in_use;
    return p;
  }
  if (_in_use >= _max) return {};
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return {};
  if (_pipe_bytes != 0) ::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(_pipe_bytes));
  ++_in_use;
  return {fds[0], fds[1]};
}

void pipe_pool::release(pipe_fds p, bool empty) noexcept {
  if (!p.valid()) return;
  --_in_use;
  // Keep at most a quarter of the cap idle: enough to absorb bursts without
  // pinning fds a quiet shard does not need.
  if (empty && _idle.size() < _max / 4 + 1) {
    _idle.push_back(p);
    return;
  }
  ::close(p.read_fd);
  ::close(p.write_fd);
}

}  // namespace sluice::net
