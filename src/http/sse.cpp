// SSE scanning of the de-chunked body of a streaming response. Runs per body
// piece on the hot path: line ends are found with one SIMD pass (a whole
// event) or memchr (the line state machine), never a byte-by-byte loop over
// the payload, and an event's data is copied only when it has several
// lines or spans two pieces.
#include "sluice/http/sse.hpp"

#include "sluice/http/chunked.hpp"

#include <cstring>
#include <new>

#if defined(__SSE2__)
#include <emmintrin.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#endif

namespace sluice::http {

namespace {

#if defined(__SSE2__)
// The CR and LF bytes of the 16 at q, as a bit mask.
inline int cr_lf_mask16(const char* q) noexcept {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\r'))));
}

// Exact, for n >= 16: 16 bytes a turn, the last 16 read again overlapping
// (no byte loop).
bool cr_lf_in(const char* p, size_t n) noexcept {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if (cr_lf_mask16(p + i) != 0) return true;
  }
  return i < n && cr_lf_mask16(p + n - 16) != 0;
}

// The tail after the 64-byte blocks, [i, n) with n >= 16.
bool cr_lf_tail(const char* p, size_t i, size_t n) noexcept {
  if (n - i >= 16) return cr_lf_in(p + i, n - i);
  return i < n && cr_lf_mask16(p + n - 16) != 0;
}

// Per 64 bytes, the question asked first is "is any byte below 14?" (LF is
// 10, CR 13): the unsigned minimum of the block, then one compare -- where
// testing CR and LF apart costs two compares and an OR per 16 bytes. A raw
// byte below 14 other than CR and LF (a tab, a NUL: never inside a JSON
// string) only sends its block to the exact test.
bool line_end_sse2(const char* p, size_t n) noexcept {
  if (n < 16) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] == '\n' || p[i] == '\r') return true;
    }
    return false;
  }
  const auto load = [p](size_t at) noexcept { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at)); };
  const __m128i low = _mm_set1_epi8(13);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i m = _mm_min_epu8(_mm_min_epu8(load(i), load(i + 16)), _mm_min_epu8(load(i + 32), load(i + 48)));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(m, low), m)) != 0 && cr_lf_in(p + i, 64)) return true;
  }
  return cr_lf_tail(p, i, n);
}

#if defined(__x86_64__)
// The same with 32-byte registers, where the CPU has them (chosen at start):
// the minimum of 128 bytes a turn, then of the rest in overlapping loads --
// one test for a skipped chunk's whole event (~200 bytes), where 64-byte
// blocks and a 16-byte exact tail cost twice the instructions.
__attribute__((target("avx2"), always_inline)) inline __m256i load32(const char* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
__attribute__((target("avx2"), always_inline)) inline __m256i min32(__m256i x, __m256i y) noexcept {
  return _mm256_min_epu8(x, y);
}
// Whether the minimum m holds a byte below 14 (a CR or an LF among them).
__attribute__((target("avx2"), always_inline)) inline bool any_low(__m256i m) noexcept {
  return _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_min_epu8(m, _mm256_set1_epi8(13)), m)) != 0;
}
__attribute__((target("avx2"))) bool line_end_avx2(const char* p, size_t n) noexcept {
  if (n < 32) return line_end_sse2(p, n);
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i m = _mm256_min_epu8(_mm256_min_epu8(load32(p + i), load32(p + i + 32)),
                                      _mm256_min_epu8(load32(p + i + 64), load32(p + i + 96)));
    if (any_low(m)) {
      _mm256_zeroupper();  // the exact test is SSE2: no dirty upper state into it (GCC below -O3 calls it)
      if (cr_lf_in(p + i, 128)) return true;
    }
  }
  if (i == n) return false;
  // [i, n), under 128 bytes: the last 32 and every 32 from i.
  const size_t rest = i;
  __m256i m = load32(p + n - 32);
  for (; i + 32 < n; i += 32) m = _mm256_min_epu8(m, load32(p + i));
  if (!any_low(m)) return false;
  const size_t from = rest < n - 32 ? rest : n - 32;  // n >= 32: the exact test reads 16 at least
  _mm256_zeroupper();
  return cr_lf_in(p + from, n - from);
}

// Whether p[0, n) holds a CR or an LF, for a short span the run's vector
// minimum flagged (rare: a byte below 14 in an event): the exact test,
// out of the run's loop.
__attribute__((noinline)) bool flagged_span_has_line_end(const char* p, size_t n) noexcept {
  return n >= 16 ? cr_lf_in(p, n) : line_end_sse2(p, n);
}

// detail::skip_run: body_sink's skip test with 32-byte registers, inlined
// in the walk of the chunks, the pattern held in registers for the whole
// run: the head's 16 bytes, the tail's 32, then the minimum of the bytes
// between, one test for a byte below 14. Where what the limits leave
// is at least `len`, no chunk of the run can reach them: the loop does not
// compare, and the run's totals are taken off at its end. (A response's
// body has no limits; a bounded walk near its limit takes none here and
// tests its chunks one by one.)
__attribute__((target("avx2"))) size_t skip_run_avx2(const detail::skip_pattern& s, const char* data, size_t len,
                                                     size_t i, uint64_t& body_left, uint64_t& framing_left,
                                                     uint32_t& chunks) noexcept {
  if (body_left < len || framing_left < len) return i;
  const __m128i head = _mm_load_si128(reinterpret_cast<const __m128i*>(s.head));
  const __m256i tail = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.tail));
  const __m128i head_mask = _mm_load_si128(reinterpret_cast<const __m128i*>(s.head_mask));
  const __m256i tail_mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.tail_mask));
  const size_t from = s.head_n, cut = s.scan_cut;
  const size_t first = i;
  uint64_t payload = 0;
  uint32_t c = 0;
  const auto crlf = detail::is_crlf;
  const auto hex = [data](size_t k) noexcept { return k_hex_value[static_cast<unsigned char>(data[k])]; };
  while (true) {
    // The size line. An event's chunk of 48 to 4095 bytes has two or three
    // digits: "<hex><hex>CRLF" or "<hex><hex><hex>CRLF", told apart by where
    // the CRLF is (read as two bytes at i + 2, then at i + 3); either is
    // whole_chunk_at's answer for those bytes. A non-digit among them is no
    // such chunk for it either (a digit's place holds no CR). Anything else
    // (more digits, leading zeros past three, an extension) is read by
    // whole_chunk_at itself. A whole chunk of 48 bytes or more needs 54
    // left: under 8, none starts here.
    if (len - i < 8) break;
    size_t at;
    size_t n;
    if (crlf(data + i + 2)) {
      const unsigned d0 = hex(i), d1 = hex(i + 1);
      if ((d0 | d1) >= 16) break;
      n = d0 << 4 | d1;
      at = i + 4;
    } else if (crlf(data + i + 3)) {
      const unsigned d0 = hex(i), d1 = hex(i + 1), d2 = hex(i + 2);
      if ((d0 | d1 | d2) >= 16) break;
      n = d0 << 8 | d1 << 4 | d2;
      at = i + 5;
    } else {
      uint64_t size;
      if (!whole_chunk_at(data, len, i, at, size)) break;
      n = static_cast<size_t>(size);  // at most len: whole_chunk_at compared it
    }
    // len - at >= 3 here: the size is compared with what follows, never
    // added to a place.
    if (n < detail::k_skip_pattern_min || n > len - at - 2 || !crlf(data + at + n)) break;
    const char* q = data + at;
    // Head and tail: the bytes that differ from the pattern's, under its
    // mask, are none (one PTEST each).
    const __m128i hx = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), head);
    const __m256i tx = _mm256_xor_si256(load32(q + n - 32), tail);
    if (!_mm_testz_si128(hx, head_mask) || !_mm256_testz_si256(tx, tail_mask)) break;
    // No CR or LF in [from, n - cut): the minimum of its bytes, then one
    // compare. Up to 256 bytes (an event's usual size) without a loop: the
    // first and the last 32, 64 or 128 bytes, overlapping where they meet.
    const char* a = q + from;
    const char* const b = q + n - cut;
    const auto span = static_cast<size_t>(b - a);
    // The class of a content event (129-256: one compare) first.
    if (span - 129 < 128) {
      const __m256i m = min32(min32(min32(load32(a), load32(a + 32)), min32(load32(a + 64), load32(a + 96))),
                              min32(min32(load32(b - 128), load32(b - 96)), min32(load32(b - 64), load32(b - 32))));
      if (any_low(m) && flagged_span_has_line_end(q + from, span)) break;
    } else if (span < 32) {
      if (line_end_sse2(a, span)) break;
    } else {
      __m256i m;
      if (span <= 64) {
        m = min32(load32(a), load32(b - 32));
      } else if (span <= 128) {
        m = min32(min32(load32(a), load32(a + 32)), min32(load32(b - 64), load32(b - 32)));
      } else {
        // Two minimums: the last 32 bytes and the first 32, then 64 bytes
        // a turn, then the last 32 or fewer.
        __m256i m2 = load32(a);
        m = load32(b - 32);
        for (a += 32; b - a > 64; a += 64) {
          m = min32(m, load32(a));
          m2 = min32(m2, load32(a + 32));
        }
        if (b - a > 32) m = min32(m, load32(a));
        m = min32(m, m2);
      }
      if (any_low(m) && flagged_span_has_line_end(q + from, span)) break;
    }
    payload += n;
    i = at + n + 2;
    ++c;
  }
  body_left -= payload;
  framing_left -= (i - first) - payload;
  chunks += c;
  return i;
}

using detail::line_end_fn;
// Picked at the first call (it may run before main, from a static
// initialiser: __builtin_cpu_init first), as skip_run_impl() is.
line_end_fn line_end_now() noexcept {
  static const line_end_fn f = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? &line_end_avx2 : &line_end_sse2;
  }();
  return f;
}
#else
constexpr detail::line_end_fn line_end_now() noexcept { return &line_end_sse2; }
#endif
#endif

}  // namespace

detail::line_end_fn detail::line_end_impl() noexcept {
#if defined(__SSE2__)
  return line_end_now();
#else
  return &has_line_end;
#endif
}

bool detail::make_skip_pattern(std::string_view head, std::string_view tail, skip_pattern& out) noexcept {
  if (head.size() > sizeof out.head || tail.size() > sizeof out.tail || tail.size() < 2 ||
      tail.substr(tail.size() - 2) != "\n\n") {
    return false;
  }
  out = skip_pattern{};
  std::memcpy(out.head, head.data(), head.size());
  std::memcpy(out.tail + sizeof out.tail - tail.size(), tail.data(), tail.size());
  std::memset(out.head_mask, 0xff, head.size());
  std::memset(out.tail_mask + sizeof out.tail - tail.size(), 0xff, tail.size());
  out.head_n = static_cast<uint8_t>(head.size());
  out.tail_n = static_cast<uint8_t>(tail.size());
  // The tail matched, its bytes before the last two need no scan when they
  // are no line end themselves.
  const std::string_view body = tail.substr(0, tail.size() - 2);
  out.scan_cut = static_cast<uint8_t>(body.find_first_of("\r\n") == std::string_view::npos ? tail.size() : 2);
  return true;
}

bool detail::skip_sse2(const skip_pattern& s, const char* p, size_t n) noexcept {
#if defined(__SSE2__)
  const auto load = [](const char* q) noexcept { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  // A byte of the pattern's mask that differs: 0xff in andnot(equal, mask).
  const auto differs = [&](const char* q, const char* pat, const unsigned char* mask) noexcept {
    const __m128i m = _mm_load_si128(reinterpret_cast<const __m128i*>(mask));
    return _mm_movemask_epi8(_mm_andnot_si128(_mm_cmpeq_epi8(load(q), _mm_load_si128(reinterpret_cast<const __m128i*>(pat))), m));
  };
  if ((differs(p, s.head, s.head_mask) | differs(p + n - 32, s.tail, s.tail_mask) |
       differs(p + n - 16, s.tail + 16, s.tail_mask + 16)) != 0) {
    return false;
  }
  const size_t from = s.head_n, to = n - s.scan_cut;
  return !sluice::http::line_end_sse2(p + from, to - from);
#else
  if (std::memcmp(p, s.head, s.head_n) != 0 || std::memcmp(p + n - s.tail_n, s.tail + sizeof s.tail - s.tail_n, s.tail_n) != 0) {
    return false;
  }
  return !has_line_end(p + s.head_n, n - s.head_n - s.scan_cut);
#endif
}

detail::skip_run_fn detail::skip_run_impl() noexcept {
#if defined(__SSE2__) && defined(__x86_64__)
  static const skip_run_fn f = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? &skip_run_avx2 : nullptr;
  }();
  return f;
#else
  return nullptr;
#endif
}

detail::skip_fn detail::skip_impl() noexcept {
  // A chunk at a time only where the run stopped (four chunks of vLLM's
  // stream) or has no AVX2: SSE2 does.
  return &detail::skip_sse2;
}

bool detail::line_end_sse2(const char* p, size_t n) noexcept {
#if defined(__SSE2__)
  return sluice::http::line_end_sse2(p, n);
#else
  return has_line_end(p, n);
#endif
}

// One SIMD pass for both CR and LF, cheaper than a memchr for each; the
// minimum test above cuts that pass's instructions further (the figures:
// bench/RESULTS.md, "Figures behind choices in the code").
bool has_line_end(const char* p, size_t n) noexcept {
#if defined(__SSE2__)
  return line_end_now()(p, n);
#else
  for (size_t i = 0; i < n; ++i) {
    if (p[i] == '\n' || p[i] == '\r') return true;
  }
  return false;
#endif
}

namespace {

// The first CR or LF in [p, end), or end.
const char* find_eol(const char* p, const char* end) noexcept {
  const auto* lf = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
  const char* limit = lf != nullptr ? lf : end;
  const auto* cr = static_cast<const char*>(std::memchr(p, '\r', static_cast<size_t>(limit - p)));
  return cr != nullptr ? cr : limit;
}

}  // namespace

void sse_scanner::reset() noexcept {
  _events = 0;
  _len = 0;
  _view = nullptr;
  _view_len = 0;
  _truncated = false;
  _has_data = false;
  _after_cr = false;
  _in_event = false;
  _state = line_state::start;
  _name_len = 0;
  _limit = k_event_bytes_max;
  if (_cap != k_event_bytes_max) {
    _buf.reset();
    _cap = k_event_bytes_max;
  }
}

void sse_scanner::end_line(char eol) noexcept {
  _after_cr = eol == '\r';
  _state = line_state::start;
}

void sse_scanner::begin_data_line() noexcept {
  if (_has_data) append("\n", 1);
  _has_data = true;
}

void sse_scanner::append(const char* data, size_t len) noexcept {
  if (_len == 0 && _view == nullptr && !_truncated) {
    // The first bytes of the event: keep a view, copy nothing yet.
    _view = data;
    _view_len = len;
    return;
  }
  if (_view != nullptr) copy_view();
  if (!have_buffer()) {
    _truncated = true;  // out of memory: the bytes still flow, the scan copy is cut
    return;
  }
  if (!_truncated && len > _cap - _len) (void)grow(_len + len);  // at the limit: cut below
  const size_t room = _cap - _len;
  const size_t n = len < room ? len : room;
  std::memcpy(_buf.get() + _len, data, n);
  _len += n;
  if (n < len) _truncated = true;
}

bool sse_scanner::have_buffer() noexcept {
  // Made on the first event that needs a copy (several data lines, or one
  // that spans two pieces) and kept: a stream whose events all arrive whole
  // never holds it (an idle stream then costs ~16 KiB less).
  if (!_buf) {
    _buf.reset(new (std::nothrow) char[k_event_bytes_max]);
    _cap = k_event_bytes_max;
  }
  return _buf != nullptr;
}

bool sse_scanner::grow(size_t need) noexcept {
  if (need > _limit) return false;
  size_t cap = _cap;
  while (cap < need) cap = cap * 2 < _limit ? cap * 2 : _limit;
  std::unique_ptr<char[]> b(new (std::nothrow) char[cap]);
  if (!b) return false;
  std::memcpy(b.get(), _buf.get(), _len);
  _buf = std::move(b);
  _cap = cap;
  return true;
}

void sse_scanner::copy_view() noexcept {
  // Runs with _len == 0: the view is always the event's first bytes.
  const char* v = _view;
  const size_t len = _view_len;
  _view = nullptr;
  _view_len = 0;
  if (!have_buffer()) {
    _truncated = true;
    return;
  }
  if (len > _cap) (void)grow(len);
  const size_t n = len < _cap ? len : _cap;
  std::memcpy(_buf.get(), v, n);
  _len = n;
  if (n < len) _truncated = true;
}

void sse_scanner::dispatch() noexcept {
  if (_has_data) {
    ++_events;
    if (_cb != nullptr) {
      if (_view != nullptr) {
        _cb(_ctx, sse_event{std::string_view(_view, _view_len), false, true});
      } else {
        _cb(_ctx, sse_event{std::string_view(_buf ? _buf.get() : "", _len), _truncated, false});
      }
    }
  }
  _view = nullptr;
  _view_len = 0;
  _len = 0;
  _truncated = false;
  _has_data = false;
  if (_cap != k_event_bytes_max) {
    // A large event's buffer was its own: the stream goes on with the usual one.
    _buf.reset();
    _cap = k_event_bytes_max;
  }
}

void sse_scanner::feed(const char* data, size_t len) noexcept {
  // The common piece is exactly one event, "data: <json>\n\n" (vLLM writes
  // one per chunk, and chunks arrive whole): with nothing pending, it is
  // reported in place after one pass for CR/LF, without the line state
  // machine.
  if (_state == line_state::start && !_after_cr && !_has_data && _view == nullptr && _len == 0 && len >= 7 &&
      std::memcmp(data, "data:", 5) == 0 && data[len - 1] == '\n' && data[len - 2] == '\n') {
    const char* v = data + 5;
    const char* const v_end = data + len - 2;
    if (v < v_end && *v == ' ') ++v;
    const auto n = static_cast<size_t>(v_end - v);
    if (!has_line_end(v, n)) {
      ++_events;
      if (_cb != nullptr) _cb(_ctx, sse_event{std::string_view(v, n), false, true});
      return;
    }
  }
  const char* p = data;
  const char* const end = data + len;
  while (p < end) {
    if (_after_cr) {
      // The LF of a CRLF (possibly in the next piece): the line already ended.
      _after_cr = false;
      if (*p == '\n') {
        ++p;
        continue;
      }
    }
    switch (_state) {
      case line_state::start:
        if (*p == '\r' || *p == '\n') {
          dispatch();  // an empty line ends the event
          _in_event = false;
          end_line(*p++);
          break;
        }
        _in_event = true;
        if (*p == ':') {
          _state = line_state::skip;  // a comment
          ++p;
        } else {
          _name_len = 0;
          _state = line_state::name;
        }
        break;
      case line_state::name: {
        const char c = *p++;
        const bool is_data = _name_len == 4 && std::memcmp(_name, "data", 4) == 0;
        if (c == ':') {
          _state = is_data ? line_state::value_first : line_state::skip;
        } else if (c == '\r' || c == '\n') {
          if (is_data) begin_data_line();  // "data" alone: an empty data line
          end_line(c);
        } else if (_name_len < sizeof(_name)) {
          _name[_name_len++] = c;
        }
        break;
      }
      case line_state::value_first:
        begin_data_line();
        if (*p == ' ') ++p;
        _state = line_state::value;
        break;
      case line_state::value:
      case line_state::skip: {
        const char* eol = find_eol(p, end);
        if (_state == line_state::value) append(p, static_cast<size_t>(eol - p));
        p = eol;
        if (p < end) end_line(*p++);
        break;
      }
    }
  }
  // The caller's bytes go away: an event still open keeps its own copy.
  if (_view != nullptr) copy_view();
}

}  // namespace sluice::http
