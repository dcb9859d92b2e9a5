#include "sluice/quota/estimate.hpp"

#include "sluice/core/assert.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sluice::quota {
namespace {

// Script classes of one character (see estimate.hpp for the costs).
enum class kind : uint8_t { none, letter, digit, space, newline, punct, cjk, cjk_punct, other };

// Costs in 1/64 tokens, fitted on the fixture corpus.
constexpr uint64_t k_word = 62;
constexpr uint64_t k_letter_beyond_5 = 5;
constexpr uint64_t k_digit = 64;
constexpr uint64_t k_punct_run = 75;
constexpr uint64_t k_punct_extra = 9;
constexpr uint64_t k_whitespace_run = 75;
constexpr uint64_t k_cjk = 36;
constexpr uint64_t k_cjk_punct = 79;
constexpr uint64_t k_other = 64;

struct character {
  kind k;
  uint8_t bytes;
};

// Classifies the character starting at p (p < end). Malformed UTF-8 counts
// as `other`, one byte at a time: it still costs, it never stalls the scan.
inline character classify(const unsigned char* p, const unsigned char* end) noexcept {
  const unsigned char c = *p;
  if (c < 0x80) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return {kind::letter, 1};
    if (c >= '0' && c <= '9') return {kind::digit, 1};
    if (c == ' ' || c == '\t') return {kind::space, 1};
    if (c == '\n' || c == '\r') return {kind::newline, 1};
    return {kind::punct, 1};
  }
  if (c >= 0xF0) return {kind::other, 4};
  if (c >= 0xE0) {
    // Three bytes: U+0800..U+FFFF, where CJK lives.
    if (end - p < 3) return {kind::other, 3};
    const uint32_t cp = (uint32_t{c} & 0x0F) << 12 | (uint32_t{p[1]} & 0x3F) << 6 | (uint32_t{p[2]} & 0x3F);
    if ((cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFF00 && cp <= 0xFFEF)) return {kind::cjk_punct, 3};
    if ((cp >= 0x3040 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7AF)) return {kind::cjk, 3};
    return {kind::other, 3};
  }
  // Two bytes: Latin with diacritics, Greek, Cyrillic...: letters.
  if (c >= 0xC0) return {kind::letter, 2};
  return {kind::other, 1};  // a stray continuation byte
}

// ASCII bytes by class; kind::none for 0x80 and up (classify() decodes those).
constexpr std::array<kind, 256> k_ascii = [] {
  std::array<kind, 256> t{};
  for (unsigned c = 0; c < 0x80; ++c) {
    const unsigned char b = static_cast<unsigned char>(c);
    t[c] = ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') ? kind::letter
           : (b >= '0' && b <= '9')                  ? kind::digit
           : (b == ' ' || b == '\t')                 ? kind::space
           : (b == '\n' || b == '\r')               ? kind::newline
                                                     : kind::punct;
  }
  return t;
}();

inline bool is_whitespace(kind k) noexcept { return k == kind::space || k == kind::newline; }

// Pure ASCII text (nearly every English or code prompt) is costed 64 bytes
// at a time from bit masks of its classes, with no branch per run: a run
// starts where a class bit is set and the bit before is not. Each rule of
// the table in estimate.hpp becomes a count of bits:
//   letter runs         62 x runs + 5 x letters with 5 letters before them
//   digits              64 x digits
//   punctuation runs    75 x runs + 9 x other bytes, less the last byte of
//                       each run that a letter follows (75 when the run is
//                       that one byte, else 9)
//   whitespace runs     75 x runs, less the lone spaces/tabs that are not
//                       the text's last byte
struct class_masks {
  uint64_t letter = 0, digit = 0, space = 0, newline = 0, valid = 0;
};

class_masks masks_of(const unsigned char* p, size_t n) noexcept {  // n <= 64
  class_masks m;
  m.valid = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
  size_t j = 0;
#if defined(__SSE2__)
  const auto in_range = [](__m128i v, char lo, char hi) noexcept {
    // Unsigned lo <= v <= hi: (v - lo) == min(v - lo, hi - lo).
    const __m128i d = _mm_sub_epi8(v, _mm_set1_epi8(lo));
    return _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(static_cast<char>(hi - lo))), d);
  };
  const auto classify = [&](__m128i v) noexcept {
    const __m128i lower = _mm_or_si128(v, _mm_set1_epi8(0x20));
    const auto bits = [](__m128i x) noexcept {
      return static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(x)));
    };
    m.letter |= bits(in_range(lower, 'a', 'z')) << j;
    m.digit |= bits(in_range(v, '0', '9')) << j;
    m.space |= bits(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\t')))) << j;
    m.newline |= bits(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\r')))) << j;
  };
  for (; j + 16 <= n; j += 16) classify(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j)));
  if (j < n) {
    // The last 1-15 bytes, NUL-padded: a NUL is no letter, digit or space,
    // and its bits are outside `valid`, so it counts as nothing.
    alignas(16) unsigned char rest[16] = {};
    std::memcpy(rest, p + j, n - j);
    classify(_mm_load_si128(reinterpret_cast<const __m128i*>(rest)));
    j = n;
  }
#endif
  for (; j < n; ++j) {
    const kind k = k_ascii[p[j]];
    m.letter |= uint64_t{k == kind::letter} << j;
    m.digit |= uint64_t{k == kind::digit} << j;
    m.space |= uint64_t{k == kind::space} << j;
    m.newline |= uint64_t{k == kind::newline} << j;
  }
  return m;
}

// Set bits in x: the POPCNT instruction where the function it is inlined
// into may use it; else SWAR (inline, it beats libgcc's call).
template <bool Popcnt>
[[gnu::always_inline]] inline uint64_t bits(uint64_t x) noexcept {
  if constexpr (Popcnt) {
    return static_cast<uint64_t>(__builtin_popcountll(x));
  } else {
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (x * 0x0101010101010101ull) >> 56;
  }
}

template <bool Popcnt>
[[gnu::always_inline]] inline uint64_t ascii_cost(const unsigned char* p, size_t n) noexcept {
  int64_t cost = 0;
  class_masks prev;  // the block before (none: all zero)
  class_masks cur = masks_of(p, n < 64 ? n : 64);
  for (size_t at = 0; at < n; at += 64) {
    const size_t rest = n - at - (n - at < 64 ? n - at : 64);
    const class_masks next = rest > 0 ? masks_of(p + at + 64, rest < 64 ? rest : 64) : class_masks{};
    // X shifted so that bit j says "the byte k before j is X" / "the byte after j is X".
    const auto before = [](uint64_t x, uint64_t x_prev, unsigned k) noexcept { return x << k | x_prev >> (64 - k); };
    const auto after = [](uint64_t x, uint64_t x_next) noexcept { return x >> 1 | x_next << 63; };
    const uint64_t punct = cur.valid & ~(cur.letter | cur.digit | cur.space | cur.newline);
    const uint64_t punct_prev = prev.valid & ~(prev.letter | prev.digit | prev.space | prev.newline);
    const uint64_t ws = cur.space | cur.newline, ws_prev = prev.space | prev.newline, ws_next = next.space | next.newline;

    const uint64_t l = cur.letter;
    const uint64_t letter_starts = l & ~before(l, prev.letter, 1);
    const uint64_t sixth_on = l & before(l, prev.letter, 1) & before(l, prev.letter, 2) & before(l, prev.letter, 3) &
                              before(l, prev.letter, 4) & before(l, prev.letter, 5);
    cost += static_cast<int64_t>(k_word * bits<Popcnt>(letter_starts) + k_letter_beyond_5 * bits<Popcnt>(sixth_on));
    cost += static_cast<int64_t>(k_digit * bits<Popcnt>(cur.digit));

    const uint64_t punct_starts = punct & ~before(punct, punct_prev, 1);
    cost += static_cast<int64_t>(k_punct_run * bits<Popcnt>(punct_starts) + k_punct_extra * (bits<Popcnt>(punct) - bits<Popcnt>(punct_starts)));
    const uint64_t before_letter = punct & after(cur.letter, next.letter);
    cost -= static_cast<int64_t>(k_punct_run * bits<Popcnt>(before_letter & punct_starts) +
                                 k_punct_extra * bits<Popcnt>(before_letter & ~punct_starts));

    const uint64_t ws_starts = ws & ~before(ws, ws_prev, 1);
    const uint64_t last_byte = rest == 0 ? uint64_t{1} << (n - at - 1) : 0;
    const uint64_t lone_space = cur.space & ~before(ws, ws_prev, 1) & ~after(ws, ws_next) & ~last_byte;
    cost += static_cast<int64_t>(k_whitespace_run * (bits<Popcnt>(ws_starts) - bits<Popcnt>(lone_space)));
    prev = cur;
    cur = next;
  }
  return static_cast<uint64_t>(cost);
}

// ~12 bit counts per 64 bytes: POPCNT makes the ASCII path of a chat body
// markedly cheaper (bench/RESULTS.md, "Figures behind choices in the
// code"). The build targets baseline
// x86-64, so the instruction is chosen at run time (every x86-64 CPU since
// 2008 has it), unless the build's -march already allows it.
uint64_t ascii_cost_portable(const unsigned char* p, size_t n) noexcept { return ascii_cost<false>(p, n); }

#if defined(__x86_64__) && !defined(__POPCNT__)
[[gnu::target("popcnt")]] uint64_t ascii_cost_popcnt(const unsigned char* p, size_t n) noexcept {
  return ascii_cost<true>(p, n);
}
const bool k_popcnt = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("popcnt") != 0;
}();
#else
uint64_t ascii_cost_popcnt(const unsigned char* p, size_t n) noexcept { return ascii_cost<true>(p, n); }
constexpr bool k_popcnt = true;
#endif

bool is_ascii(const unsigned char* p, size_t n) noexcept {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc |= w;
  }
  if (i < n && n >= 8) {
    uint64_t w;  // the last eight, overlapping the words before
    std::memcpy(&w, p + n - 8, 8);
    acc |= w;
    i = n;
  }
  for (; i < n; ++i) acc |= p[i];
  return (acc & 0x8080808080808080ull) == 0;
}

}  // namespace

uint64_t estimate_input_tokens(std::string_view text) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  if (text.empty()) return 0;
  if (is_ascii(p, text.size())) return detail::ascii_estimate(text, k_popcnt);
  const auto* const end = p + text.size();
  uint64_t cost = 0;
  kind run = kind::none;  // class of the current run (space and newline form one whitespace run)
  uint64_t run_chars = 0;
  bool run_has_newline = false;

  // Closes the current run; `next` is the class of the character after it.
  const auto close = [&](kind next) {
    switch (run) {
      case kind::none: break;
      case kind::letter:
        cost += k_word + k_letter_beyond_5 * (run_chars > 5 ? run_chars - 5 : 0);
        break;
      case kind::digit: cost += k_digit * run_chars; break;
      case kind::punct: {
        // The pre-tokenizer lets one non-letter lead a word ("name, .get):
        // the run's last byte joins the word that follows.
        const uint64_t effective = next == kind::letter ? run_chars - 1 : run_chars;
        if (effective > 0) cost += k_punct_run + k_punct_extra * (effective - 1);
        break;
      }
      case kind::space:
      case kind::newline:
        // One space joins the next word or punctuation; indentation, line
        // breaks and trailing space are tokens of their own.
        if (run_has_newline || run_chars >= 2 || next == kind::none) cost += k_whitespace_run;
        break;
      case kind::cjk: cost += k_cjk * run_chars; break;
      case kind::cjk_punct: cost += k_cjk_punct * run_chars; break;
      case kind::other: cost += k_other * run_chars; break;
    }
  };

  while (p < end) {
    // ASCII (nearly all of a chat body): the rest of the run in one loop.
    if (const kind k = k_ascii[*p]; k != kind::none) {
      const bool ws = is_whitespace(k);
      if (ws ? !is_whitespace(run) : k != run) {
        close(k);
        run = k;
        run_chars = 0;
        run_has_newline = false;
      }
      const unsigned char* q = p;
      if (ws) {
        for (kind c; q < end && is_whitespace(c = k_ascii[*q]); ++q) run_has_newline |= c == kind::newline;
      } else {
        while (q < end && k_ascii[*q] == k) ++q;
      }
      run_chars += static_cast<uint64_t>(q - p);
      p = q;
      continue;
    }
    const character ch = classify(p, end);
    const bool whitespace = ch.k == kind::space || ch.k == kind::newline;
    const bool same = whitespace ? (run == kind::space || run == kind::newline) : ch.k == run;
    if (!same) {
      close(ch.k);
      run = ch.k;
      run_chars = 0;
      run_has_newline = false;
    }
    ++run_chars;
    run_has_newline |= ch.k == kind::newline;
    p += std::min<std::ptrdiff_t>(ch.bytes, end - p);
  }
  close(kind::none);
  if (text.empty()) return 0;
  return std::max<uint64_t>(1, cost / 64);
}

namespace detail {

uint64_t ascii_estimate(std::string_view text, bool popcnt) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  if (text.empty()) return 0;
  SLUICE_ASSERT(is_ascii(p, text.size()));
  const uint64_t cost = popcnt ? ascii_cost_popcnt(p, text.size()) : ascii_cost_portable(p, text.size());
  return std::max<uint64_t>(1, cost / 64);
}

bool has_popcnt() noexcept { return k_popcnt; }

}  // namespace detail

uint64_t admission_cost(uint64_t input_tokens, uint64_t max_output_tokens, uint32_t input_weight,
                        uint32_t output_weight) noexcept {
  uint64_t in = 0, out = 0, sum = 0;
  if (__builtin_mul_overflow(input_tokens, uint64_t{input_weight}, &in) ||
      __builtin_mul_overflow(max_output_tokens, uint64_t{output_weight}, &out) ||
      __builtin_add_overflow(in, out, &sum)) {
    return UINT64_MAX;
  }
  return sum;
}

uint64_t estimate_request_tokens(const openai::request_text& text, uint32_t messages,
                                 uint32_t image_tokens) noexcept {
  // A chat template wraps each message in a few tokens (role markers,
  // separators: 4-5 for ChatML).
  constexpr uint64_t k_tokens_per_message = 4;
  uint64_t tokens = uint64_t{messages} * k_tokens_per_message + text.token_ids +
                    uint64_t{text.images} * image_tokens + text.overflow_bytes / 4;
  for (uint32_t i = 0; i < text.count; ++i) tokens += estimate_input_tokens(text.pieces[i]);
  return tokens;
}

}  // namespace sluice::quota
