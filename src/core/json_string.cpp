// The JSON string escaper (sluice/core/json_string.hpp).
#include "sluice/core/json_string.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <array>
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
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + run));
      const __m128i odd = _mm_or_si128(_mm_cmpgt_epi8(_mm_set1_epi8(0x20), v),  // below 0x20, or 0x80.. (negative)
                                       _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                                    _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))));
      const int m = _mm_movemask_epi8(odd);
      if (m != 0) {
        run += static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(m)));
        break;
      }
      run += 16;
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
