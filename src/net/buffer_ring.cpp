#include "sluice/net/buffer_ring.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"

namespace sluice::net {

std::unique_ptr<buffer_ring> buffer_ring::create(io_uring* ring, uint16_t group_id, uint32_t count,
                                                 uint32_t buffer_bytes) {
  SLUICE_VERIFY(count > 0 && (count & (count - 1)) == 0 && count <= 32768);
  std::unique_ptr<buffer_ring> b(new buffer_ring());
  b->_ring = ring;
  b->_group_id = group_id;
  b->_count = count;
  b->_buffer_bytes = buffer_bytes;
  b->_ring_bytes = sizeof(io_uring_buf) * count;
  void* mem = ::mmap(nullptr, b->_ring_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (mem == MAP_FAILED) {
    log::error("buffer ring mmap failed: {}", std::strerror(errno));
    return nullptr;
  }
  b->_br = static_cast<io_uring_buf_ring*>(mem);
  b->_buffers_bytes = static_cast<size_t>(count) * buffer_bytes;
  void* bufs = ::mmap(nullptr, b->_buffers_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (bufs == MAP_FAILED) {
    log::error("buffer memory mmap failed: {}", std::strerror(errno));
    return nullptr;
  }
  b->_buffers = static_cast<char*>(bufs);

  io_uring_buf_ring_init(b->_br);
  io_uring_buf_reg reg{};
  reg.ring_addr = reinterpret_cast<uint64_t>(b->_br);
  reg.ring_entries = count;
  reg.bgid = group_id;
  int rc = io_uring_register_buf_ring(ring, &reg, 0);
  if (rc != 0) {
    log::error("io_uring_register_buf_ring failed: {} (needs Linux 5.19)", std::strerror(-rc));
    return nullptr;
  }
  const int mask = io_uring_buf_ring_mask(count);
  for (uint32_t i = 0; i < count; ++i) {
    io_uring_buf_ring_add(b->_br, b->buffer(static_cast<uint16_t>(i)), buffer_bytes,
                          static_cast<unsigned short>(i), mask, static_cast<int>(i));
  }
  io_uring_buf_ring_advance(b->_br, static_cast<int>(count));
  return b;
}

buffer_ring::~buffer_ring() {
  if (_br != nullptr) {
    io_uring_unregister_buf_ring(_ring, _group_id);
    ::munmap(_br, _ring_bytes);
  }
  if (_buffers != nullptr) ::munmap(_buffers, _buffers_bytes);
}

void buffer_ring::recycle(uint16_t bid) noexcept {
  io_uring_buf_ring_add(_br, buffer(bid), _buffer_bytes, bid, io_uring_buf_ring_mask(_count), _pending);
  ++_pending;
}

void buffer_ring::publish() noexcept {
  if (_pending == 0) return;
  io_uring_buf_ring_advance(_br, _pending);
  _pending = 0;
}

}  // namespace sluice::net
