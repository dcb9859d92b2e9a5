#pragma once
// core: the one JSON string escaper of the tree (error bodies, rendered
// replies, audit lines, the status page's data, control answers). Its
// output is always valid JSON, whatever the input holds:
//   - '"' and '\\' escaped; \b \f \n \r \t by their short forms, the other
//     control characters as \u00XX;
//   - well-formed UTF-8 as it is (Unicode Table 3-7: no overlongs, no
//     surrogates, nothing above U+10FFFF);
//   - each maximal ill-formed subpart as one U+FFFD (Unicode §3.9, as
//     WHATWG's decoder does), so a cut or hostile string stays readable.
// A byte never becomes more than 6 bytes: `s.size() * 6` always suffices.
#include <cstddef>
#include <string_view>

namespace sluice {

// Length of the well-formed UTF-8 sequence at s[0, n): 1..4; or -k where k
// >= 1 is the length of the maximal ill-formed subpart there (one U+FFFD).
int utf8_sequence(const unsigned char* s, size_t n) noexcept;

// Writes `s` escaped (without quotes) as whole escapes and whole characters
// only, as much as fits in `cap`. `consumed`: how much of `s` it took (all
// of it unless `out` filled), so a long string can be escaped in pieces.
// Returns: bytes written, <= cap.
size_t json_escape(char* out, size_t cap, std::string_view s, size_t& consumed) noexcept;
inline size_t json_escape(char* out, size_t cap, std::string_view s) noexcept {
  size_t consumed = 0;
  return json_escape(out, cap, s, consumed);
}
// The bytes json_escape writes for the whole of `s`.
size_t json_escaped_size(std::string_view s) noexcept;

}  // namespace sluice
