#include "sluice/quota/duration.hpp"

#include <charconv>

#include "sluice/core/assert.hpp"

namespace sluice::quota {

size_t format_duration(uint64_t ms, std::span<char> out) noexcept {
  SLUICE_ASSERT(out.size() >= k_duration_chars_max);
  char* p = out.data();
  char* const end = out.data() + out.size();
  const auto number = [&](uint64_t v) { p = std::to_chars(p, end, v).ptr; };
  if (ms < 1000) {
    number(ms);
    if (ms != 0) *p++ = 'm';
    *p++ = 's';
    return static_cast<size_t>(p - out.data());
  }
  const uint64_t hours = ms / 3'600'000;
  const uint64_t minutes = ms / 60'000 % 60;
  const uint64_t seconds = ms / 1000 % 60;
  uint64_t frac = ms % 1000;
  if (hours != 0) {
    number(hours);
    *p++ = 'h';
  }
  if (hours != 0 || minutes != 0) {
    number(minutes);
    *p++ = 'm';
  }
  number(seconds);
  if (frac != 0) {
    *p++ = '.';
    // Three digits with trailing zeros dropped: 200 → "2", 5 → "005".
    char digits[3] = {static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                      static_cast<char>('0' + frac % 10)};
    size_t n = 3;
    while (digits[n - 1] == '0') --n;
    for (size_t i = 0; i < n; ++i) *p++ = digits[i];
  }
  *p++ = 's';
  return static_cast<size_t>(p - out.data());
}

}  // namespace sluice::quota
