#pragma once
// Shared helpers for the libFuzzer targets: a failed invariant prints what
// broke and aborts, so libFuzzer records the input as a crash; split points
// come from a small generator seeded by the input bytes, so every input has
// its own, reproducible, way of being cut into reads.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

// Not SLUICE_VERIFY: a fuzz target must fail in every build type, with the
// condition and the line in the crash report.
#define SLUICE_FUZZ_CHECK(cond)                                                    \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "fuzz invariant failed: %s at %s:%d\n", #cond, __FILE__, \
                   __LINE__);                                                       \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

namespace sluice::fuzz {

// FNV-1a over the input: the seed of the split generator.
inline uint64_t input_hash(const uint8_t* data, size_t len) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; ++i) {
    h ^= data[i];
    h *= 1099511628211ull;
  }
  return h;
}

// splitmix64: good enough to scatter split points, and tiny.
class split_rng {
 public:
  explicit split_rng(uint64_t seed) noexcept : _state(seed) {}
  uint64_t next() noexcept {
    uint64_t z = (_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform enough in [0, n]; n may be 0.
  size_t upto(size_t n) noexcept { return static_cast<size_t>(next() % (n + 1)); }
  // A read size: mostly small (1..16 bytes), sometimes large, as sockets deliver.
  size_t piece(size_t left) noexcept {
    if (left == 0) return 0;
    const uint64_t r = next();
    size_t n = (r & 3) != 0 ? 1 + static_cast<size_t>((r >> 8) % 16)
                            : 1 + static_cast<size_t>((r >> 8) % 4096);
    return n < left ? n : left;
  }

 private:
  uint64_t _state;
};

// A view is either empty or lies wholly inside [base, base + len).
inline bool inside(std::string_view v, const char* base, size_t len) noexcept {
  if (v.empty()) return true;
  const auto b = reinterpret_cast<uintptr_t>(base);
  const auto p = reinterpret_cast<uintptr_t>(v.data());
  return p >= b && p + v.size() <= b + len;
}

}  // namespace sluice::fuzz
