#pragma once
// net: a provided-buffer ring (IORING_REGISTER_PBUF_RING: Linux 5.19) for
// multishot recv. liburing 2.3 has no io_uring_setup_buf_ring, so the ring
// memory is mmap'd and registered by hand.
//
// Shard-local. A buffer handed out by a CQE belongs to the caller until it
// calls recycle(); recycled buffers go back to the kernel at the next
// publish() (once per loop iteration: one store instead of one per CQE).
#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace sluice::net {

class buffer_ring {
 public:
  // `count` must be a power of two (<= 32768).
  static std::unique_ptr<buffer_ring> create(io_uring* ring, uint16_t group_id, uint32_t count,
                                             uint32_t buffer_bytes);
  ~buffer_ring();
  buffer_ring(const buffer_ring&) = delete;
  buffer_ring& operator=(const buffer_ring&) = delete;

  uint16_t group_id() const noexcept { return _group_id; }
  uint32_t buffer_bytes() const noexcept { return _buffer_bytes; }
  char* buffer(uint16_t bid) noexcept { return _buffers + static_cast<size_t>(bid) * _buffer_bytes; }

  void recycle(uint16_t bid) noexcept;
  void publish() noexcept;

 private:
  buffer_ring() = default;
  io_uring* _ring = nullptr;
  io_uring_buf_ring* _br = nullptr;
  size_t _ring_bytes = 0;
  char* _buffers = nullptr;
  size_t _buffers_bytes = 0;
  uint32_t _count = 0;
  uint32_t _buffer_bytes = 0;
  uint16_t _group_id = 0;
  int _pending = 0;
};

}  // namespace sluice::net
