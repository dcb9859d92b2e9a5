#include "head_scan.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sluice::http::detail {

namespace {

// ALPHA / DIGIT and the bytes of `extra`.
constexpr std::array<bool, 256> alnum_and(std::string_view extra) noexcept {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[static_cast<size_t>(c)] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[static_cast<size_t>(c)] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[static_cast<size_t>(c)] = true;
  for (char c : extra) t[static_cast<unsigned char>(c)] = true;
  return t;
}
// tchar (RFC 9110 §5.6.2): the bytes of a token.
constexpr std::array<bool, 256> k_tchar = alnum_and("!#$%&'*+-.^_`|~");
// RFC 3986 unreserved / sub-delims: what a reg-name holds besides
// pct-encoded octets. An IPvFuture literal holds these and ':'.
constexpr std::array<bool, 256> k_reg_name = alnum_and("-._~!$&'()*+,;=");

bool is_hex(char c) noexcept { return k_hex_value[static_cast<unsigned char>(c)] < 16; }

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

// reg-name = *( unreserved / pct-encoded / sub-delims ), non-empty here.
bool valid_reg_name(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (k_reg_name[static_cast<unsigned char>(s[i])]) continue;
    if (s[i] != '%' || i + 2 >= s.size() || !is_hex(s[i + 1]) || !is_hex(s[i + 2])) return false;
    i += 2;
  }
  return true;
}

// IPv4address = dec-octet "." dec-octet "." dec-octet "." dec-octet, each
// 0-255 without leading zeros (RFC 3986 §3.2.2).
bool valid_ipv4(std::string_view s) noexcept {
  for (int octet = 0; octet < 4; ++octet) {
    if (octet > 0) {
      if (s.empty() || s.front() != '.') return false;
      s.remove_prefix(1);
    }
    size_t n = 0;
    unsigned v = 0;
    while (n < s.size() && n < 4 && is_digit(s[n])) v = v * 10 + static_cast<unsigned>(s[n++] - '0');
    if (n == 0 || n > 3 || v > 255 || (n > 1 && s[0] == '0')) return false;
    s.remove_prefix(n);
  }
  return s.empty();
}

// IPv6address (RFC 3986 §3.2.2): eight 16-bit pieces of 1-4 hex digits, or
// fewer with one "::" standing for at least one zero piece; the last 32 bits
// may be written as an IPv4 address.
bool valid_ipv6(std::string_view s) noexcept {
  unsigned pieces = 0;
  bool elided = false;
  size_t i = 0;
  if (s.starts_with("::")) {
    elided = true;
    i = 2;
    if (i == s.size()) return true;  // "::"
  }
  for (;;) {
    size_t j = i;
    while (j < s.size() && j - i < 5 && is_hex(s[j])) ++j;
    if (j < s.size() && s[j] == '.') {
      // The IPv4 tail: two pieces, and nothing after it.
      if (pieces > 6 || !valid_ipv4(s.substr(i))) return false;
      pieces += 2;
      break;
    }
    if (j == i || j - i > 4 || ++pieces > 8) return false;
    if (j == s.size()) break;
    if (s[j] != ':') return false;
    if (j + 1 < s.size() && s[j + 1] == ':') {
      if (elided) return false;  // a second "::" is ambiguous
      elided = true;
      i = j + 2;
      if (i == s.size()) break;  // "1::"
    } else {
      i = j + 1;
      if (i == s.size()) return false;  // "1:" ends inside a piece
    }
  }
  return elided ? pieces <= 7 : pieces == 8;
}

// IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ).
bool valid_ipvfuture(std::string_view s) noexcept {
  if (s.size() < 4 || (s[0] != 'v' && s[0] != 'V')) return false;
  size_t i = 1;
  while (i < s.size() && is_hex(s[i])) ++i;
  if (i == 1 || i + 1 >= s.size() || s[i] != '.') return false;
  for (++i; i < s.size(); ++i) {
    if (!k_reg_name[static_cast<unsigned char>(s[i])] && s[i] != ':') return false;
  }
  return true;
}

// port = 1-5 digits, at most 65535 (RFC 3986 allows *DIGIT; see valid_host).
bool valid_port(std::string_view s) noexcept {
  if (s.empty() || s.size() > 5) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (!is_digit(c)) return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  return v <= 65535;
}

// Whether [p, p+n), the first bytes of a request's start line, can still
// begin `method SP` (RFC 9112 §3; a method is a token, RFC 9110 §9.1). Reads
// at most max + 1 bytes, so checking the open line again on every read costs
// little. Returns: none, or why these bytes are no request line.
scan_error check_method(const char* p, size_t n, uint8_t max) noexcept {
  const size_t end = std::min<size_t>(n, size_t{max} + 1);
  for (size_t i = 0; i < end; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    if (c == ' ') return i == 0 ? scan_error::not_a_request_line : scan_error::none;
    if (!k_tchar[c]) return scan_error::not_a_request_line;
  }
  return n > max ? scan_error::method_too_long : scan_error::none;
}

// The byte that made a line invalid, classified for the error message.
scan_error classify_ctl(unsigned char c, scan_error otherwise) noexcept {
  if (c == '\r') return scan_error::bare_cr;
  if (c == '\0') return scan_error::nul;
  return otherwise;
}

// Whether [p, p+n) holds a byte that a field value (or a start line) may not
// hold: a CTL other than HTAB (or any CTL when `htab_ok` is false) or DEL.
// Written as a branch-free reduction so the compiler can vectorise it: a
// head is a few hundred bytes and every request pays for this pass.
bool has_ctl(const char* p, size_t n, bool htab_ok) noexcept {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  const unsigned char tab = htab_ok ? '\t' : 0xff;
#if defined(__SSE2__)
  if (n >= 16) {
    // Sixteen bytes a turn, the last sixteen read again overlapping: most
    // values are short, and a vectorised loop would do their rest a byte
    // at a time. A byte <= 0x1F is min(c, 0x1F) == c.
    const __m128i ctl_max = _mm_set1_epi8(0x1f), del = _mm_set1_epi8(0x7f);
    const __m128i ht = _mm_set1_epi8(static_cast<char>(tab));
    const auto bad16 = [&](const unsigned char* q) noexcept {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(v, ctl_max), v);
      return _mm_movemask_epi8(_mm_or_si128(_mm_andnot_si128(_mm_cmpeq_epi8(v, ht), low), _mm_cmpeq_epi8(v, del)));
    };
    int bad = 0;
    for (size_t i = 0; i + 16 < n; i += 16) bad |= bad16(u + i);
    return (bad | bad16(u + n - 16)) != 0;
  }
#endif
  unsigned bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = u[i];
    bad |= static_cast<unsigned>(c < 0x20 && c != tab) | static_cast<unsigned>(c == 0x7f);
  }
  return bad != 0;
}

// Whether [p, p+n) holds SP or HTAB; branch-free like has_ctl().
bool has_ws(const char* p, size_t n) noexcept {
  unsigned bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= static_cast<unsigned>(p[i] == ' ') | static_cast<unsigned>(p[i] == '\t');
  return bad != 0;
}

// Slow path after has_ctl() said yes: which byte, for the message.
scan_error first_ctl(const char* p, size_t n, bool htab_ok, scan_error otherwise) noexcept {
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    if ((c < 0x20 && !(htab_ok && c == '\t')) || c == 0x7f) return classify_ctl(c, otherwise);
  }
  return otherwise;
}

}  // namespace

std::string_view scan_message(scan_error e) noexcept {
  switch (e) {
    case scan_error::none: return "ok";
    case scan_error::head_too_large: return "header section too large";
    case scan_error::start_line_too_long: return "start line too long";
    case scan_error::field_line_too_long: return "header field line too long";
    case scan_error::too_many_fields: return "too many header fields";
    case scan_error::bare_lf: return "bare LF in the head (lines must end with CRLF)";
    case scan_error::bare_cr: return "bare CR in the head";
    case scan_error::nul: return "NUL byte in the head";
    case scan_error::ctl_in_start_line: return "control character in the start line";
    case scan_error::ctl_in_value: return "control character in a header field";
    case scan_error::obs_fold: return "obsolete line folding (a header line starts with whitespace)";
    case scan_error::space_before_colon: return "whitespace between header field name and colon";
    case scan_error::empty_name: return "empty header field name";
    case scan_error::missing_colon: return "header field line without a colon";
    case scan_error::not_a_request_line:
      return "not an HTTP/1.1 request (the request line must start with a method and a space)";
    case scan_error::method_too_long:
      static_assert(k_method_bytes_max == 32, "the message names the limit");
      return "not an HTTP/1.1 request (method longer than 32 bytes)";
  }
  return "malformed head";
}

bool is_tchar(unsigned char c) noexcept { return k_tchar[c]; }

bool istarts_with(std::string_view s, std::string_view lower) noexcept {
  return s.size() >= lower.size() && iequals(s.substr(0, lower.size()), lower);
}

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool valid_host(std::string_view v) noexcept {
  std::string_view port;
  bool has_port = false;
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string_view::npos) return false;
    const std::string_view literal = v.substr(1, close - 1);
    if (!valid_ipv6(literal) && !valid_ipvfuture(literal)) return false;
    const std::string_view rest = v.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      has_port = true;
      port = rest.substr(1);
    }
  } else {
    // A reg-name holds no ':', so the first one starts the port.
    const size_t colon = v.find(':');
    if (!valid_reg_name(v.substr(0, colon))) return false;
    if (colon != std::string_view::npos) {
      has_port = true;
      port = v.substr(colon + 1);
    }
  }
  return !has_port || valid_port(port);
}

bool parse_content_length(std::string_view s, uint64_t& out) noexcept {
  // 19 digits hold every value below 2^63; more digits (even leading zeros)
  // are no length a client needs to send.
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  if (v >= (uint64_t{1} << 63)) return false;
  out = v;
  return true;
}

// Whether every byte of the name [p, p+n) is a tchar: one table lookup per
// byte, no branch in the loop.
static bool all_tchar_walk(const char* p, size_t n) noexcept {
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= k_tchar[static_cast<unsigned char>(p[i])];
  return ok;
}

#if defined(__SSE2__)
// The bytes of v in [lo, hi], as 0xff.
static __m128i in_range(__m128i v, char lo, char hi) noexcept {
  const __m128i off = _mm_sub_epi8(v, _mm_set1_epi8(lo));
  return _mm_cmpeq_epi8(_mm_subs_epu8(off, _mm_set1_epi8(static_cast<char>(hi - lo))), _mm_setzero_si128());
}

// The bytes of v that are letters, digits, '-', '_' or '.', as bits.
static unsigned plain_name_bytes(__m128i v) noexcept {
  const __m128i letter = in_range(_mm_or_si128(v, _mm_set1_epi8(0x20)), 'a', 'z');
  const __m128i punct = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('-')),
                                                  _mm_cmpeq_epi8(v, _mm_set1_epi8('_'))),
                                     _mm_cmpeq_epi8(v, _mm_set1_epi8('.')));
  const __m128i ok = _mm_or_si128(_mm_or_si128(letter, in_range(v, '0', '9')), punct);
  return static_cast<unsigned>(_mm_movemask_epi8(ok));
}
#endif

// The same. `room`: the bytes readable from p (the rest of the line, n <=
// room). The names seen in practice are letters, digits and '-': sixteen
// bytes are checked at a time against those and '_' and '.', and a name
// with any other byte gets the exact walk above.
static bool all_tchar(const char* p, size_t n, size_t room) noexcept {
#if defined(__SSE2__)
  if (room >= 16) {
    for (size_t i = 0; i < n; i += 16) {
      // The last block may start earlier and overlap the one before, so
      // that it ends within the line.
      const size_t at = i + 16 <= room ? i : room - 16;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
      const unsigned got = plain_name_bytes(v);
      const size_t from = i - at, to = std::min(n, i + 16) - at;  // the name's bytes in this block
      const unsigned want = ((1u << to) - 1) & ~((1u << from) - 1);
      if ((got & want) != want) return all_tchar_walk(p, n);
    }
    return true;
  }
#else
  (void)room;
#endif
  return all_tchar_walk(p, n);
}

// The checks of a field line p[0, n) (its CR LF off), in their one order,
// from what either way of reading it found: `ctl`, whether it holds a
// byte has_ctl() refuses in a value; `colon`, its first ':' (null: none);
// `name_plain(k)`, whether the name's k bytes are all tchars.
template <class NamePlain>
__attribute__((always_inline)) inline static scan_error check_field_line(const char* p, size_t n, bool ctl,
                                                                         const char* colon, NamePlain&& name_plain,
                                                                         bool& name_not_token) noexcept {
  // obs-fold (RFC 9112 §5.2): a line starting with whitespace continues the
  // previous field. Other hops may join it differently: reject.
  if (p[0] == ' ' || p[0] == '\t') return scan_error::obs_fold;
  // CTLs over the whole line (HTAB aside); the name's HTAB and SP are
  // caught below.
  if (ctl) return first_ctl(p, n, true, scan_error::ctl_in_value);
  if (colon == nullptr) return scan_error::missing_colon;
  if (colon == p) return scan_error::empty_name;
  // "Name : value" (RFC 9112 §5.1: MUST be rejected with 400). Any other
  // byte outside the token set is llhttp's to reject (strict mode checks
  // it): the head is flagged so its parser asks llhttp.
  const auto name_n = static_cast<size_t>(colon - p);
  if (!name_plain(name_n)) {
    if (has_ws(p, name_n)) return scan_error::space_before_colon;
    name_not_token = true;
  }
  return scan_error::none;
}

// Notes the field line that ends at `cr`, with its colon, in `idx`, offsets from the first
// field line: only while every line before it is there, and only while
// they fit the index's 16 bits.
// Inlined in both ways of reading a line. The usual value, one SP after
// the colon and no whitespace at its end, takes one compare at each end.
__attribute__((always_inline)) inline static void index_field(field_index& idx, const head_scan_state& s,
                                                              const char* data, const char* colon,
                                                              const char* cr) noexcept {
  if (idx.n + 1u != s.fields || idx.n == k_indexed_fields) [[unlikely]] return;
  const char* first = data + s.start_end + 2;
  if (static_cast<size_t>(cr - first) > 0xffff) [[unlikely]] return;
  const char* vb = colon + 1;
  const char* ve = cr;
  const auto ows = [](char c) noexcept { return c == ' ' || c == '\t'; };
  if (vb < ve && *vb == ' ') ++vb;
  if (vb < ve && (ows(*vb) || ows(ve[-1]))) [[unlikely]] {
    while (vb < ve && ows(*vb)) ++vb;
    while (ve > vb && ows(ve[-1])) --ve;
  }
  idx.at[idx.n++] = field_ref{static_cast<uint16_t>(colon - first), static_cast<uint16_t>(vb - first),
                              static_cast<uint16_t>(ve - first), static_cast<uint16_t>(cr - first)};
}

#if defined(__SSE2__)
// A field line's first bytes classified sixteen at a time (bit i: byte i of
// the line): LF, ':', and a byte has_ctl() refuses in a value (a CTL other
// than HTAB, or DEL).
struct line_masks {
  uint64_t lf = 0, colon = 0, ctl = 0;
};

static void classify16(const char* q, unsigned shift, line_masks& m) noexcept {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const auto bits = [shift](__m128i x) noexcept {
    return static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(x))) << shift;
  };
  const __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
  const __m128i ctl = _mm_or_si128(_mm_andnot_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\t')), low),
                                   _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f)));
  m.lf |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')));
  m.colon |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8(':')));
  m.ctl |= bits(ctl);
}

// Whether the name [p, p + n) is all letters, digits, '-', '_' and '.' (the
// bytes all_tchar()'s vector test takes), sixteen at a time; the blocks it
// reads are ones classify16() read.
static bool plain_name(const char* p, size_t n) noexcept {
  for (size_t i = 0; i < n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const unsigned want = n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1;
    if ((plain_name_bytes(v) & want) != want) return false;
  }
  return true;
}

// The longest line the masks judge (its LF within the first 64 bytes);
// a longer one, or one the read has not brought whole, goes the
// line-by-line way below.
inline constexpr size_t k_masked_line_max = 64;
#endif

scan_state scan_head(head_scan_state& s, const char* data, size_t len, const scan_limits& l, field_index* idx) noexcept {
  const auto fail = [&s](scan_error e) noexcept {
    s.error = static_cast<uint8_t>(e);
    return scan_state::failed;
  };
  if (s.error != 0) return scan_state::failed;
  if (s.head_bytes != 0) return scan_state::complete;
  // A complete head ends within head_bytes_max: never look further.
  const size_t limit = std::min<size_t>(len, l.head_bytes_max);
  for (;;) {
#if defined(__SSE2__)
    // A field line whose LF is within its first 64 bytes and within what
    // may be read: check_field_line's checks, as the way below makes
    // them, from one classification of its bytes (the way below costs a
    // memchr for the LF, a pass for CTLs, a memchr for the colon and one
    // for the name's bytes: most lines are 20-50 bytes, where each call
    // costs more than its bytes).
    if (s.have_start_line && limit - s.line_begin >= 16) {
      const char* p = data + s.line_begin;
      const size_t room = std::min<size_t>(limit - s.line_begin, k_masked_line_max);
      line_masks m;
      unsigned seen = 0;
      do {
        classify16(p + seen, seen, m);
        seen += 16;
      } while (m.lf == 0 && seen + 16 <= room);
      if (m.lf != 0) {
        const auto e = static_cast<unsigned>(__builtin_ctzll(m.lf));  // the LF, < seen <= room
        if (e > size_t{l.field_line_bytes_max} + 1) return fail(scan_error::field_line_too_long);
        if (e == 0 || p[e - 1] != '\r') return fail(scan_error::bare_lf);
        const size_t n = e - 1;
        if (n == 0) {
          s.head_bytes = s.line_begin + e + 1;
          return scan_state::complete;
        }
        if (++s.fields > l.fields_max) return fail(scan_error::too_many_fields);
        const uint64_t line = (uint64_t{1} << n) - 1;  // n <= 62
        const uint64_t colons = m.colon & line;
        const char* colon = colons == 0 ? nullptr : p + __builtin_ctzll(colons);
        // The name's blocks are ones classify16() read.
        const auto name_plain = [p](size_t k) noexcept { return plain_name(p, k) || all_tchar_walk(p, k); };
        const scan_error fe = check_field_line(p, n, (m.ctl & line) != 0, colon, name_plain, s.name_not_token);
        if (fe != scan_error::none) return fail(fe);
        if (idx != nullptr) index_field(*idx, s, data, colon, p + n);
        s.line_begin = s.pos = s.line_begin + e + 1;
        continue;
      }
      s.pos = std::max<uint32_t>(s.pos, s.line_begin + seen);  // no LF in what the masks read
    }
#endif
    const void* hit = s.pos < limit ? std::memchr(data + s.pos, '\n', limit - s.pos) : nullptr;
    if (hit == nullptr) {
      s.pos = static_cast<uint32_t>(limit);
      // The open line, CR included, may be one byte longer than its limit.
      const size_t open = limit - s.line_begin;
      // Checked before the length, and on the whole line below in the same
      // order, so a head gets the same answer however it is split in reads.
      // A lone CR may still become an empty line before the request line.
      if (!s.have_start_line && l.method_bytes_max != 0 && !(open == 1 && data[s.line_begin] == '\r')) {
        const scan_error e = check_method(data + s.line_begin, open, l.method_bytes_max);
        if (e != scan_error::none) return fail(e);
      }
      if (!s.have_start_line && open > size_t{l.start_line_bytes_max} + 1) {
        return fail(scan_error::start_line_too_long);
      }
      if (s.have_start_line && open > size_t{l.field_line_bytes_max} + 1) {
        return fail(scan_error::field_line_too_long);
      }
      if (len >= l.head_bytes_max) return fail(scan_error::head_too_large);
      return scan_state::need_more;
    }
    const auto end = static_cast<uint32_t>(static_cast<const char*>(hit) - data);
    // The start line with its CR LF (neither is a token byte nor SP): a line
    // with no SP after the method fails here, as its open prefix did, and
    // before the checks below, which its open prefix did not get. Empty
    // lines (CRLF; a bare LF is refused below) are no start line.
    const bool empty_line = end == s.line_begin || (end == s.line_begin + 1 && data[s.line_begin] == '\r');
    if (!s.have_start_line && l.method_bytes_max != 0 && !empty_line) {
      const scan_error e = check_method(data + s.line_begin, end + 1 - s.line_begin, l.method_bytes_max);
      if (e != scan_error::none) return fail(e);
    }
    // The length before the line's end: the open line's check above, so a
    // line too long with a bare LF is too long however the reads cut it.
    if (!s.have_start_line && end - s.line_begin > size_t{l.start_line_bytes_max} + 1) {
      return fail(scan_error::start_line_too_long);
    }
    if (s.have_start_line && end - s.line_begin > size_t{l.field_line_bytes_max} + 1) {
      return fail(scan_error::field_line_too_long);
    }
    if (end == s.line_begin || data[end - 1] != '\r') return fail(scan_error::bare_lf);
    const char* p = data + s.line_begin;
    const size_t n = end - 1 - s.line_begin;
    if (!s.have_start_line) {
      // Empty lines before the start line are skipped (RFC 9112 §2.2: a
      // client may send a CRLF after a POST body).
      if (n != 0) {
        if (has_ctl(p, n, l.start_line_htab)) {
          return fail(first_ctl(p, n, l.start_line_htab, scan_error::ctl_in_start_line));
        }
        s.start_begin = s.line_begin;
        s.start_end = end - 1;
        s.have_start_line = true;
      }
    } else if (n == 0) {
      s.head_bytes = end + 1;
      return scan_state::complete;
    } else {
      if (++s.fields > l.fields_max) return fail(scan_error::too_many_fields);
      const auto* colon = static_cast<const char*>(std::memchr(p, ':', n));
      const auto name_plain = [p, n](size_t k) noexcept { return all_tchar(p, k, n); };
      const scan_error e = check_field_line(p, n, has_ctl(p, n, true), colon, name_plain, s.name_not_token);
      if (e != scan_error::none) return fail(e);
      if (idx != nullptr) index_field(*idx, s, data, colon, p + n);
    }
    s.line_begin = s.pos = end + 1;
  }
}

}  // namespace sluice::http::detail
