#pragma once
// Assertions and branch hints. Programmer errors only: never assert on bytes
// that came from the network (those are operating errors, see result.hpp).

namespace sluice::detail {
[[noreturn]] void verify_failed(const char* expr, const char* file, int line) noexcept;
}

// Always on, also in release builds.
#define SLUICE_VERIFY(cond) \
  ((cond) ? static_cast<void>(0) : ::sluice::detail::verify_failed(#cond, __FILE__, __LINE__))

// Debug builds only.
#ifdef NDEBUG
#define SLUICE_ASSERT(cond) static_cast<void>(0)
#else
#define SLUICE_ASSERT(cond) SLUICE_VERIFY(cond)
#endif

#define SLUICE_LIKELY(x) __builtin_expect(!!(x), 1)
#define SLUICE_UNLIKELY(x) __builtin_expect(!!(x), 0)
