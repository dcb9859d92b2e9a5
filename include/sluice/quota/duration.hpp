#pragma once
// quota: durations as OpenAI's x-ratelimit-reset-* headers and 429 messages
// write them ("1.2s", "6m0s", "250ms", "1h2m3.5s"), into a caller's buffer.
//
// Stateless; per response.
#include <cstddef>
#include <cstdint>
#include <span>

namespace sluice::quota {

// Large enough for any uint64_t milliseconds ("5124095576030h25m51.615s" is 24).
inline constexpr size_t k_duration_chars_max = 32;

// Format, from milliseconds:
//   0           → "0s"
//   < 1 s       → "<ms>ms"                       ("250ms")
//   < 1 min     → "<s>[.<frac>]s", frac without trailing zeros ("1.2s", "59.005s")
//   < 1 h       → "<m>m<s>[.<frac>]s"            ("6m0s")
//   else        → "<h>h<m>m<s>[.<frac>]s"        ("1h0m0s")
// Returns: the characters written (no NUL); out must hold k_duration_chars_max.
size_t format_duration(uint64_t ms, std::span<char> out) noexcept;

// Returns: whole seconds for the Retry-After header, rounded up, at least 1.
inline uint64_t retry_after_seconds(uint64_t ms) noexcept { return ms == 0 ? 1 : (ms + 999) / 1000; }

}  // namespace sluice::quota
