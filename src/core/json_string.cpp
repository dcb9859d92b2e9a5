// The JSON string escaper (sluice/core/json_string.hpp).
#include "sluice/core/json_string.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <array>
#include <cstdint>
#include <cstring>

namespace sluice {

namespace {

constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD

// Bytes that go into a JSON string as they are: printable ASCII but '"'
// and '\\' (one table load per byte).
constexpr std::array<bool, 256> k_plain = [] {
  std::array<bool, 256> t{};
  for (unsigned c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}();

bool is_cont(unsigned char c) noexcept { return (c & 0xC0) == 0x80; }

#if defined(__SSE2__)
// The bytes of p[0, 16) that are not plain, as a bit mask: below 0x20 or
// from 0x80 (negative, signed), '"' and '\\'.
inline unsigned not_plain16(const unsigned char* p) noexcept {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i odd = _mm_or_si128(_mm_cmpgt_epi8(_mm_set1_epi8(0x20), v),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))));
  return static_cast<unsigned>(_mm_movemask_epi8(odd));
}
#endif

// Whether all eight bytes of w are plain (k_plain): none below 0x20, none
// from 0x80, no '"' or '\\'. Each test below is exact for "some byte is":
// a borrow starts only at a byte that meets it.
constexpr uint64_t k_ones = 0x0101010101010101ull, k_highs = 0x8080808080808080ull;
inline bool plain8(uint64_t w) noexcept {
  const auto zero_byte = [](uint64_t x) noexcept { return (x - k_ones) & ~x & k_highs; };
  const uint64_t below_space = (w - 0x20 * k_ones) & ~w & k_highs;
  return ((w & k_highs) | below_space | zero_byte(w ^ ('"' * k_ones)) | zero_byte(w ^ ('\\' * k_ones))) == 0;
}

inline uint64_t load8(const unsigned char* p) noexcept {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
inline uint32_t load4(const unsigned char* p) noexcept {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// Whether p[0, n), 4 <= n <= 16, is all plain: two loads that overlap
// where n is not 8 or 16, no loop.
inline bool plain_upto16(const unsigned char* p, size_t n) noexcept {
  if (n >= 8) return plain8(load8(p)) && plain8(load8(p + n - 8));
  return plain8(load4(p) | uint64_t{load4(p + n - 4)} << 32);
}

// Copies p[0, n), 4 <= n <= 16, as two fixed-size moves that overlap
// where n is not 8 or 16 (no call).
inline void copy_upto16(char* out, const char* p, size_t n) noexcept {
  if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + n - 8, 8);
    std::memcpy(out, &a, 8);
    std::memcpy(out + n - 8, &b, 8);
  } else {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + n - 4, 4);
    std::memcpy(out, &a, 4);
    std::memcpy(out + n - 4, &b, 4);
  }
}

// The escape of ASCII byte c (not plain) into esc; returns its length.
size_t ascii_escape(unsigned char c, char esc[6]) noexcept {
  static constexpr char hex[] = "0123456789abcdef";
  esc[0] = '\\';
  switch (c) {
    case '"': esc[1] = '"'; return 2;
    case '\\': esc[1] = '\\'; return 2;
    case '\b': esc[1] = 'b'; return 2;
    case '\f': esc[1] = 'f'; return 2;
    case '\n': esc[1] = 'n'; return 2;
    case '\r': esc[1] = 'r'; return 2;
    case '\t': esc[1] = 't'; return 2;
    default: break;
  }
  esc[1] = 'u';
  esc[2] = '0';
  esc[3] = '0';
  esc[4] = hex[c >> 4];
  esc[5] = hex[c & 0xF];
  return 6;
}

}  // namespace

int utf8_sequence(const unsigned char* s, size_t n) noexcept {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  unsigned char lo = 0x80, hi = 0xBF;
  int len;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // U+D800..U+DFFF are surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= n) return -i;
    const unsigned char b = s[i];
    if (i == 1 ? (b < lo || b > hi) : !is_cont(b)) return -i;
  }
  return len;
}

size_t json_escape(char* out, size_t cap, std::string_view s, size_t& consumed) noexcept {
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  // A short plain string with room for it -- most of an audit line's
  // fields, a token's text -- checked and copied without a loop or a call.
  if (const size_t n = s.size(); n >= 4 && n <= 16 && n <= cap && plain_upto16(u, n)) {
    copy_upto16(out, s.data(), n);
    consumed = n;
    return n;
  }
#if defined(__SSE2__)
  // The same for 17 to 32 bytes (a request id, a path, a backend's
  // address): two sixteen-byte tests and moves that overlap.
  if (const size_t n = s.size(); n > 16 && n <= 32 && n <= cap && (not_plain16(u) | not_plain16(u + n - 16)) == 0) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + n - 16));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + n - 16), b);
    consumed = n;
    return n;
  }
#endif
  size_t len = 0;
  size_t i = 0;
  while (i < s.size()) {
    // A run of plain printable ASCII -- nearly all of a token's text, an
    // id, a model name -- goes in one copy, as much of it as fits. The scan
    // stops at the room's end: a caller that writes a long string in small
    // pieces must not rescan its rest each time (that is quadratic).
    const size_t room = cap - len;
    const size_t stop = s.size() - i < room ? s.size() : i + room;
    size_t run = i;
#if defined(__SSE2__)
    // Sixteen bytes a turn while all are plain: 0x20..0x7F (signed, above
    // 0x1F) but '"' and '\\'.
    while (stop - run >= 16) {
      const unsigned m = not_plain16(u + run);
      if (m != 0) {
        run += static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(m)));
        break;
      }
      run += 16;
    }
    // Under sixteen left, where `stop` (an index into s) is at least 16:
    // the sixteen bytes before `stop` as one vector, all inside s; those
    // before `run` (passed, or before i) shifted off.
    if (stop - run < 16 && run < stop && stop >= 16) {
      const unsigned m = not_plain16(u + stop - 16) >> (run - (stop - 16));
      run = m == 0 ? stop : run + static_cast<size_t>(__builtin_ctz(m));
    }
#endif
    while (run < stop && k_plain[u[run]]) ++run;
    if (run != i) {
      std::memcpy(out + len, s.data() + i, run - i);
      len += run - i;
      i = run;
      continue;
    }
    if (room == 0) break;
    char esc[6];
    const char* piece;
    size_t piece_len;
    size_t took;
    if (u[i] < 0x80) {
      piece_len = ascii_escape(u[i], esc);
      piece = esc;
      took = 1;
    } else {
      const int k = utf8_sequence(u + i, s.size() - i);
      if (k > 0) {
        piece = s.data() + i;
        piece_len = static_cast<size_t>(k);
        took = piece_len;
      } else {
        piece = k_replacement.data();
        piece_len = k_replacement.size();
        took = static_cast<size_t>(-k);
      }
    }
    // A whole escape or character, or nothing: a cut one would make the
    // output invalid.
    if (cap - len < piece_len) break;
    std::memcpy(out + len, piece, piece_len);
    len += piece_len;
    i += took;
  }
  consumed = i;
  return len;
}

size_t json_escaped_size(std::string_view s) noexcept {
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    if (k_plain[u[i]]) {
      ++n, ++i;
    } else if (u[i] < 0x80) {
      char esc[6];
      n += ascii_escape(u[i], esc), ++i;
    } else {
      const int k = utf8_sequence(u + i, s.size() - i);
      n += k > 0 ? static_cast<size_t>(k) : k_replacement.size();
      i += static_cast<size_t>(k > 0 ? k : -k);
    }
  }
  return n;
}

}  // namespace sluice
