#pragma once
// core: text helpers for the hot path. ASCII case-insensitive equality
// (HTTP field names and tokens: the one the tree uses), hex digits (chunk
// sizes, %-escapes, \u escapes: the one table the tree reads), and a bounded text
// writer (heads, ids, audit lines): no allocation, no format-string
// parsing. Every put checks room; after the first miss `ok` stays false and
// nothing more is written. [begin, p) is always exactly what was written:
// a put that does not fit leaves `p` where it was, so a caller that sends
// `p - begin` bytes without reading `ok` sends a short text, never bytes
// nobody wrote.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sluice {

namespace detail {
// The eight bytes of w with those in 'A'-'Z' made lower case (0x20 set),
// every other byte as it is: each byte's low seven bits plus a constant
// carry into its high bit (never into the next byte) where it is >= 'A',
// and where it is > 'Z'.
inline uint64_t ascii_lower8(uint64_t w) noexcept {
  constexpr uint64_t high = 0x8080808080808080ull, ones = 0x0101010101010101ull;
  const uint64_t seven = w & ~high;
  const uint64_t from_a = seven + ones * (0x80 - 'A');
  const uint64_t past_z = seven + ones * (0x80 - 'Z' - 1);
  return w | ((from_a & ~past_z & ~w & high) >> 2);
}

inline uint64_t load8(const char* p) noexcept {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
}  // namespace detail

// ASCII case-insensitive equality: bytes outside A-Z compare as they are.
// From eight bytes on, eight at a time (the last eight read again,
// overlapping), after the first byte: field names are compared this way
// after a switch on their length, and most that share a length differ
// there.
inline bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  if (a.size() >= 8) {
    if (((static_cast<unsigned char>(a[0]) ^ static_cast<unsigned char>(b[0])) & ~0x20u) != 0) return false;
    const size_t n = a.size();
    for (size_t i = 0; i + 8 < n; i += 8) {
      if (detail::ascii_lower8(detail::load8(a.data() + i)) != detail::ascii_lower8(detail::load8(b.data() + i))) {
        return false;
      }
    }
    return detail::ascii_lower8(detail::load8(a.data() + n - 8)) == detail::ascii_lower8(detail::load8(b.data() + n - 8));
  }
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = static_cast<unsigned char>(a[i]);
    auto y = static_cast<unsigned char>(b[i]);
    if (x >= 'A' && x <= 'Z') x = static_cast<unsigned char>(x | 0x20);
    if (y >= 'A' && y <= 'Z') y = static_cast<unsigned char>(y | 0x20);
    if (x != y) return false;
  }
  return true;
}

#if defined(__SSE2__)
namespace detail {
// find_bytes's and rfind_bytes's test of sixteen places at once: two of
// the needle's bytes (its second and its next to last, from four bytes
// on; its first and last below that) where they must be. k >= 2.
struct needle_probe {
  size_t p1, p2;
  __m128i b1, b2;
  explicit needle_probe(std::string_view needle) noexcept
      : p1(needle.size() >= 4 ? 1 : 0),
        p2(needle.size() >= 4 ? needle.size() - 2 : needle.size() - 1),
        b1(_mm_set1_epi8(needle[p1])),
        b2(_mm_set1_epi8(needle[p2])) {}
  // Bit j: place at + j may hold the needle. Reads [at + p1, at + p2 + 16).
  unsigned places(const char* at) const noexcept {
    const __m128i at1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + p1));
    const __m128i at2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + p2));
    return static_cast<unsigned>(_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(at1, b1), _mm_cmpeq_epi8(at2, b2))));
  }
};
}  // namespace detail
#endif

// The first place of `needle` in [h, h + n), or null: memmem's answer.
// Sixteen places a turn where two of the needle's bytes (its second and its
// next to last, from four bytes on) are where they must be, and a compare
// only there: glibc's memmem is a generic two-way search, ~600
// instructions to find a 17-byte key in a 450-byte JSON body.
inline const char* find_bytes(const char* h, size_t n, std::string_view needle) noexcept {
  const size_t k = needle.size();
  if (k == 0) return h;
  if (n < k) return nullptr;
  size_t i = 0;
#if defined(__SSE2__)
  if (k >= 2) {
    const detail::needle_probe probe(needle);
    for (; i + probe.p2 + 16 <= n; i += 16) {
      for (unsigned m = probe.places(h + i); m != 0; m &= m - 1) {
        const size_t at = i + static_cast<size_t>(__builtin_ctz(m));
        if (at + k <= n && std::memcmp(h + at, needle.data(), k) == 0) return h + at;
      }
    }
  }
#endif
  for (; i + k <= n; ++i) {
    if (h[i] == needle[0] && std::memcmp(h + i, needle.data(), k) == 0) return h + i;
  }
  return nullptr;
}

// The last place of `needle` in [h, h + n), or null: string_view::rfind's
// answer (that one compares at every place, a call each). Sixteen places
// a turn from the end, with find_bytes's two bytes.
inline const char* rfind_bytes(const char* h, size_t n, std::string_view needle) noexcept {
  const size_t k = needle.size();
  if (k == 0) return h + n;
  if (n < k) return nullptr;
  size_t end = n - k + 1;  // the places left: [0, end)
#if defined(__SSE2__)
  if (k >= 2) {
    const detail::needle_probe probe(needle);
    // Places [end - 16, end): the loads end at end - 1 + p2 < n.
    for (; end >= 16; end -= 16) {
      const size_t i = end - 16;
      unsigned m = probe.places(h + i);
      while (m != 0) {
        const auto bit = static_cast<unsigned>(31 - __builtin_clz(m));
        if (std::memcmp(h + i + bit, needle.data(), k) == 0) return h + i + bit;
        m &= ~(1u << bit);
      }
    }
  }
#endif
  while (end > 0) {
    --end;
    if (h[end] == needle[0] && std::memcmp(h + end, needle.data(), k) == 0) return h + end;
  }
  return nullptr;
}

// Hex digit values by byte (0-9, a-f, A-F); 0xFF for any other byte.
inline constexpr auto k_hex_value = [] {
  struct table {
    uint8_t v[256];
    constexpr uint8_t operator[](unsigned char c) const { return v[c]; }
  } t{};
  for (unsigned c = 0; c < 256; ++c) {
    t.v[c] = c >= '0' && c <= '9' ? static_cast<uint8_t>(c - '0')
             : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? static_cast<uint8_t>((c | 0x20) - 'a' + 10)
                                                      : uint8_t{0xFF};
  }
  return t;
}();

// A hex digit's value, or -1 for any other byte.
inline int hex_digit(char c) noexcept {
  const uint8_t v = k_hex_value[static_cast<unsigned char>(c)];
  return v < 16 ? v : -1;
}

struct text_writer {
  char* p;
  char* end;
  bool ok = true;

  text_writer(char* begin, size_t cap) noexcept : p(begin), end(begin + cap) {}

  void put(char c) noexcept {
    if (!ok || p == end) {
      ok = false;
      return;
    }
    *p++ = c;
  }
  void put(std::string_view s) noexcept {
    // An empty view may have a null data(), which memcpy must not get.
    if (s.empty() || !ok) return;
    if (static_cast<size_t>(end - p) < s.size()) {
      ok = false;
      return;
    }
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  template <class Int>
  void put_int(Int v) noexcept {
    // Straight into the output when any value fits (no copy, no memcpy
    // call for a few digits); else through a buffer, cut as put() cuts.
    if (!ok) return;
    if (static_cast<size_t>(end - p) >= 24) {
      p = std::to_chars(p, end, v).ptr;
      return;
    }
    char tmp[24];
    const auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    put(std::string_view(tmp, static_cast<size_t>(r.ptr - tmp)));
  }
  // Lower-case hex with no leading zeros (0 is "0"): an HTTP chunk size.
  void put_hex_min(uint64_t v) noexcept {
    unsigned width = 1;
    while (width < 16 && (v >> (4 * width)) != 0) ++width;
    put_hex(v, width);
  }
  // Lower-case hex, zero-padded to `width` digits (at most 16).
  void put_hex(uint64_t v, unsigned width) noexcept {
    static constexpr char digits[] = "0123456789abcdef";
    char tmp[16];
    width = width == 0 ? 1 : width > 16 ? 16 : width;  // (also what lets GCC see the loop's bound)
    for (unsigned i = width; i > 0; --i, v >>= 4) tmp[i - 1] = digits[v & 0xF];
    put(std::string_view(tmp, width));
  }
};

}  // namespace sluice
