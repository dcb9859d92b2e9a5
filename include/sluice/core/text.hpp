#pragma once
// core: a bounded text writer for the hot path (heads, ids, audit lines):
// no allocation, no format-string parsing. Every put checks room; after the
// first miss `ok` stays false and nothing more is written.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sluice {

struct text_writer {
  char* p;
  char* end;
  bool ok = true;

  text_writer(char* begin, size_t cap) noexcept : p(begin), end(begin + cap) {}

  void put(char c) noexcept {
    if (p == end) {
      ok = false;
      return;
    }
    *p++ = c;
  }
  void put(std::string_view s) noexcept {
    if (static_cast<size_t>(end - p) < s.size()) {
      ok = false;
      p = end;
      return;
    }
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  template <class Int>
  void put_int(Int v) noexcept {
    char tmp[24];
    const auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    put(std::string_view(tmp, static_cast<size_t>(r.ptr - tmp)));
  }
  // Lower-case hex, zero-padded to `width` digits (at most 16).
  void put_hex(uint64_t v, unsigned width) noexcept {
    static constexpr char digits[] = "0123456789abcdef";
    char tmp[16];
    for (unsigned i = width; i > 0; --i, v >>= 4) tmp[i - 1] = digits[v & 0xF];
    put(std::string_view(tmp, width));
  }
};

}  // namespace sluice
