#pragma once
// metrics: the single-writer counter. Written by one thread (its shard),
// read by any thread at scrape time. A relaxed load + store instead of a
// fetch_add: with one writer no update can be lost, and a plain store costs
// no locked instruction on the hot path; readers see some recent value.
#include <atomic>
#include <cstdint>

namespace sluice::metrics {

struct counter {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n = 1) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  void sub(uint64_t n = 1) noexcept { v.store(v.load(std::memory_order_relaxed) - n, std::memory_order_relaxed); }
  void set(uint64_t n) noexcept { v.store(n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

}  // namespace sluice::metrics
