#pragma once
// net: a bounded per-shard pool of pipes for splice. A pipe never travels
// across shards (HAProxy's pipe pool rule), and only empty pipes go back to
// the pool: a pipe with bytes still in it is closed instead.
#include <cstdint>
#include <vector>

namespace sluice::net {

struct pipe_fds {
  int read_fd = -1;
  int write_fd = -1;
  bool valid() const noexcept { return read_fd >= 0; }
};

// Shard-local.
class pipe_pool {
 public:
  explicit pipe_pool(uint32_t max_pipes, uint32_t pipe_bytes = 0) noexcept;
  ~pipe_pool();
  pipe_pool(const pipe_pool&) = delete;
  pipe_pool& operator=(const pipe_pool&) = delete;

  // Returns: a pipe, or an invalid one when max_pipes are in use (callers
  // fall back to the copy path) or pipe2 failed.
  pipe_fds acquire() noexcept;
  // `empty`: the caller knows no bytes are left in the pipe.
  void release(pipe_fds p, bool empty) noexcept;

  uint32_t in_use() const noexcept { return _in_use; }
  uint32_t idle() const noexcept { return static_cast<uint32_t>(_idle.size()); }

 private:
  std::vector<pipe_fds> _idle;
  uint32_t _max = 0;
  uint32_t _in_use = 0;
  uint32_t _pipe_bytes = 0;
};

}  // namespace sluice::net
