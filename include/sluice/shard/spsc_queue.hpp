#pragma once
// shard: bounded single-producer/single-consumer queue between two threads
// (shard <-> shard, control <-> shard). Lock-free; push and pop are wait-free.
// T must be trivially copyable: messages are small values, never pointers to
// memory the receiver would free (nothing allocated on shard A is freed on B).
// Lives as long as both of its threads; one per (sender, receiver) pair.
//
// Layout: three groups of cache lines.
//
//   line A (producer-owned): _head         next slot the producer writes
//                            _tail_cached  producer's last view of _tail
//   line B (consumer-owned): _tail         next slot the consumer reads
//                            _head_cached  consumer's last view of _head
//   lines C...:              the slots
//
// Each side writes only its own line. It reads the other side's index only
// when its cached copy says "full" (producer) or "empty" (consumer), so in
// the steady state a batch costs one cache-line transfer for the index
// instead of one per message (Seastar's smp_message_queue keeps its two
// sides apart for the same reason: false sharing would bounce a line per
// message). The slots start on their own line so that writing slot 0 does
// not invalidate either index line.
//
// Indices are free-running (never wrapped); the slot is index & (Capacity-1)
// and head - tail is the fill level, correct across size_t overflow because
// Capacity is a power of two.
//
// Ordering:
// - The producer writes slots, then publishes them with a release store to
//   _head; the consumer's acquire load of _head therefore sees the slot
//   contents.
// - The consumer reads slots, then frees them with a release store to
//   _tail; the producer's acquire load of _tail therefore orders the
//   consumer's reads before the producer overwrites the slots.
// - A side's loads of its own index are relaxed: only it writes that index.
// - The batched calls move many slots with one release store, which is the
//   point of batching: one index line transfer per batch.
//
// Waking the receiving thread (an eventfd or a ring message) is not part of
// the queue: the reactor decides when a wake-up is needed.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sluice::shard {

template <class T, size_t Capacity>
class spsc_queue {
  static_assert(std::is_trivially_copyable_v<T>, "spsc_queue messages are small trivially copyable values");
  static_assert(Capacity >= 2 && (Capacity & (Capacity - 1)) == 0, "spsc_queue Capacity must be a power of two");

 public:
  static constexpr size_t capacity() { return Capacity; }

  spsc_queue() = default;
  spsc_queue(const spsc_queue&) = delete;
  spsc_queue& operator=(const spsc_queue&) = delete;

  // Producer side. Returns: false when the queue is full (nothing written).
  bool try_push(const T& item) noexcept {
    const size_t head = _head.load(std::memory_order_relaxed);
    if (head - _tail_cached == Capacity) {
      _tail_cached = _tail.load(std::memory_order_acquire);
      if (head - _tail_cached == Capacity) return false;
    }
    write_slots(head, &item, 1);
    _head.store(head + 1, std::memory_order_release);
    return true;
  }

  // Producer side. Pushes up to n items in order with one release store.
  // Returns: how many were pushed (the first k of items), 0 when full.
  size_t try_push_n(const T* items, size_t n) noexcept {
    const size_t head = _head.load(std::memory_order_relaxed);
    size_t free_slots = Capacity - (head - _tail_cached);
    if (free_slots < n) {
      _tail_cached = _tail.load(std::memory_order_acquire);
      free_slots = Capacity - (head - _tail_cached);
    }
    const size_t count = std::min(n, free_slots);
    if (count == 0) return 0;
    write_slots(head, items, count);
    _head.store(head + count, std::memory_order_release);
    return count;
  }

  // Consumer side. Returns: false when the queue is empty (out untouched).
  bool try_pop(T& out) noexcept {
    const size_t tail = _tail.load(std::memory_order_relaxed);
    if (tail == _head_cached) {
      _head_cached = _head.load(std::memory_order_acquire);
      if (tail == _head_cached) return false;
    }
    read_slots(tail, &out, 1);
    _tail.store(tail + 1, std::memory_order_release);
    return true;
  }

  // Consumer side. Pops up to max items in order with one release store.
  // Returns: how many were written to out, 0 when empty.
  size_t try_pop_n(T* out, size_t max) noexcept {
    const size_t tail = _tail.load(std::memory_order_relaxed);
    size_t available = _head_cached - tail;
    if (available < max) {
      _head_cached = _head.load(std::memory_order_acquire);
      available = _head_cached - tail;
    }
    const size_t count = std::min(max, available);
    if (count == 0) return 0;
    read_slots(tail, out, count);
    _tail.store(tail + count, std::memory_order_release);
    return count;
  }

  // Consumer side; approximate: the producer may push right after.
  bool empty() const noexcept {
    return _head.load(std::memory_order_acquire) == _tail.load(std::memory_order_relaxed);
  }

  // Either side; a snapshot that may be stale by the time it returns.
  // Reads _tail first: _head only grows and never falls below a _tail value
  // already published, so the difference cannot go negative.
  size_t size_approx() const noexcept {
    const size_t tail = _tail.load(std::memory_order_acquire);
    const size_t head = _head.load(std::memory_order_acquire);
    return std::min(head - tail, Capacity);
  }

 private:
  static constexpr size_t k_line_bytes = 64;
  static constexpr size_t k_mask = Capacity - 1;

  // Copies count items into the slots from index `first`, in at most two
  // pieces (before and after the wrap).
  void write_slots(size_t first, const T* items, size_t count) noexcept {
    const size_t start = first & k_mask;
    const size_t before_wrap = std::min(count, Capacity - start);
    std::memcpy(slot(start), items, before_wrap * sizeof(T));
    std::memcpy(slot(0), items + before_wrap, (count - before_wrap) * sizeof(T));
  }

  void read_slots(size_t first, T* out, size_t count) noexcept {
    const size_t start = first & k_mask;
    const size_t before_wrap = std::min(count, Capacity - start);
    std::memcpy(out, slot(start), before_wrap * sizeof(T));
    std::memcpy(out + before_wrap, slot(0), (count - before_wrap) * sizeof(T));
  }

  // Slots are raw bytes copied with memcpy, so T needs no default
  // constructor; valid because T is trivially copyable.
  std::byte* slot(size_t index) noexcept { return _slots + index * sizeof(T); }

  // line A: written by the producer only
  alignas(k_line_bytes) std::atomic<size_t> _head{0};
  size_t _tail_cached = 0;
  // line B: written by the consumer only
  alignas(k_line_bytes) std::atomic<size_t> _tail{0};
  size_t _head_cached = 0;
  // lines C...: the alignas also pads line B to a full line
  alignas(k_line_bytes) alignas(T) std::byte _slots[Capacity * sizeof(T)];
};

}  // namespace sluice::shard
