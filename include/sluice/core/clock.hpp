#pragma once
// Time is a parameter: logic takes `now_ms` / `now_ns` from its caller; only
// the reactor and main() read the clock.
#include <cstdint>
#include <ctime>

namespace sluice {

inline uint64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}
inline uint64_t monotonic_ms() noexcept { return monotonic_ns() / 1'000'000u; }

inline uint64_t realtime_ms() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000u + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000u;
}

}  // namespace sluice
