#pragma once
// wire (private): what every connection object is built from -- its
// growable buffers, counted against the shard's connection memory, the
// io_uring operations it embeds, and intrusive list hooks.
#include <cstddef>
#include <cstdint>

#include "sluice/http/sse.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::proxy {

// Connection memory of the calling shard thread: connection objects and
// their buffers (server.memory_max_bytes). Thread-local: each shard counts
// its own, with no atomics; the shard publishes it to its stats per tick.
int64_t connection_memory_bytes() noexcept;
void account_connection_memory(int64_t delta) noexcept;
// A connection's SSE scanner, counted with the event buffer it may make.
inline constexpr int64_t k_sse_scanner_bytes =
    static_cast<int64_t>(sizeof(http::sse_scanner) + http::sse_scanner::k_event_bytes_max);

// Shard-local. A growable byte buffer owned by one connection. Grows
// (rarely: bodies larger than the first size) and is kept across keep-alive
// requests. While an SQE reads or writes it, its owner must neither grow,
// move nor free it (the owner's in-flight flags say when).
struct byte_buf {
  char* data = nullptr;
  uint32_t len = 0;
  uint32_t cap = 0;
  byte_buf() = default;
  byte_buf(const byte_buf&) = delete;
  byte_buf& operator=(const byte_buf&) = delete;
  ~byte_buf();
  // Returns: false when `n` exceeds what may be allocated.
  bool reserve(size_t n) noexcept;
  void release() noexcept;
};

// An io_uring operation embedded in the object that owns it; its CQE names
// the owner. The owner counts it in its `ops` from submit to completion.
template <class Owner>
struct op : shard::completion {
  Owner* owner = nullptr;
};

// A connection's receive buffer that a client send reads: its
// owner keeps the buffer, unmoved, until the send's completion gives it
// back (give_back). The lender is the first base of the owner's
// connection object, which give_back recovers.
struct buffer_lender {
  void (*give_back)(buffer_lender* self) noexcept = nullptr;
};

// Intrusive doubly linked list hook.
template <class T>
struct list_hook {
  T* prev = nullptr;
  T* next = nullptr;
  bool linked_alone() const noexcept { return prev == nullptr && next == nullptr; }
};

}  // namespace sluice::proxy
