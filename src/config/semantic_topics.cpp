// config: the topic vocabulary's table and matcher (see semantic_topics.hpp).
// Cold path, except topic_vocabulary::count(), which runs per request.
#include "sluice/config/semantic_topics.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "sluice/config/semantic.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::config {

namespace {

constexpr uint64_t k_seed = 0x746F706963ull;  // "topic"
constexpr size_t k_tokens_max = 8;            // the longest term, in tokens
constexpr uint16_t k_quantity_hits = 2;  // math's hits for an everyday quantity question

uint64_t run_key(const char* p, size_t n) noexcept {
  const uint64_t h = XXH3_64bits_withSeed(p, n, k_seed);
  return h == 0 ? 1 : h;
}

// The end of the token that starts at `i` (a space or the end).
size_t token_end(std::string_view s, size_t i) noexcept {
  while (i < s.size() && s[i] != ' ') ++i;
  return i;
}

bool ascii(std::string_view s) noexcept {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

}  // namespace

std::optional<semantic_topic> topic_from_name(std::string_view name) noexcept {
  if (name == "code") return semantic_topic::code;
  if (name == "math") return semantic_topic::math;
  if (name == "translation") return semantic_topic::translation;
  if (name == "chat") return semantic_topic::chat;
  return std::nullopt;
}

std::string_view topic_name(semantic_topic t) noexcept {
  switch (t) {
    case semantic_topic::code: return "code";
    case semantic_topic::math: return "math";
    case semantic_topic::translation: return "translation";
    case semantic_topic::chat: return "chat";
    case semantic_topic::none: break;
  }
  return "";
}

std::string_view topic_names() noexcept { return "code, math, translation, chat"; }

const topic_vocabulary& topic_vocabulary::builtin() {
  static const topic_vocabulary v = [] {
    const std::array<std::string, k_topics> lists = builtin_topic_terms();
    return topic_vocabulary({lists[0], lists[1], lists[2], lists[3]});
  }();
  return v;
}

topic_vocabulary::topic_vocabulary(const std::array<std::string_view, k_topics>& lists) {
  size_t entries = 0;
  for (std::string_view l : lists) entries += static_cast<size_t>(std::count_if(l.begin(), l.end(), [](char c) { return c == ',' || c == '\n'; })) + 1;
  size_t slots = 64;
  while (slots < entries * 4) slots *= 2;  // terms and their first tokens: at most half full
  _slots.resize(slots);
  std::string buf;
  for (size_t t = 0; t < k_topics; ++t) {
    std::string_view rest = lists[t];
    while (!rest.empty()) {
      const size_t cut = rest.find_first_of(",\n");
      const std::string_view raw = rest.substr(0, cut);
      rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);
      buf.assign(raw.size() * 3 + 4, '\0');
      const size_t n = semantic_normalize(raw, buf.data(), buf.size());
      if (n == 0) continue;
      const std::string_view term(buf.data(), n);
      const size_t tokens = static_cast<size_t>(std::count(term.begin(), term.end(), ' ')) + 1;
      SLUICE_VERIFY(tokens <= k_tokens_max);
      slot& s = insert(run_key(term.data(), term.size()));
      if (s.topics == 0) ++_terms;
      s.topics = static_cast<uint8_t>(s.topics | (1u << t));
      const size_t first_end = token_end(term, 0);
      slot& first = insert(run_key(term.data(), first_end));
      first.longest = static_cast<uint8_t>(std::max<size_t>(first.longest, tokens));
      const uint32_t sig = signature(term.data(), first_end);
      _starts[sig >> 6] |= uint64_t{1} << (sig & 63);
    }
  }
}

topic_vocabulary::slot& topic_vocabulary::insert(uint64_t key) {
  const size_t mask = _slots.size() - 1;
  for (size_t i = key & mask;; i = (i + 1) & mask) {
    slot& s = _slots[i];
    if (s.key == key) return s;
    if (s.key == 0) {
      SLUICE_VERIFY(++_used * 2 <= _slots.size());
      s.key = key;
      return s;
    }
  }
}

const topic_vocabulary::slot* topic_vocabulary::find(uint64_t key) const noexcept {
  const size_t mask = _slots.size() - 1;
  for (size_t i = key & mask;; i = (i + 1) & mask) {
    const slot& s = _slots[i];
    if (s.key == key) return &s;
    if (s.key == 0) return nullptr;
  }
}

uint8_t topic_vocabulary::topics_of(std::string_view raw_term) const {
  std::string buf(raw_term.size() * 3 + 4, '\0');
  const size_t n = semantic_normalize(raw_term, buf.data(), buf.size());
  if (n == 0) return 0;
  const slot* s = find(run_key(buf.data(), n));
  return s == nullptr ? 0 : s->topics;
}

namespace {

// What a token is to quantity_question(), as bits; one table lookup a token.
enum : uint16_t {
  q_number = 1,        // an English number word
  q_how = 2,           // "how"
  q_what = 4,          // "what"
  q_how_what = 8,      // much, many, long, far, old, big, heavy, tall (after "how")
  q_time = 16,         // "time" (after "what")
  q_zh_numeral = 32,   // 零一二两三四五六七八九十百千万亿半
  q_zh_measure = 64,   // a measure word or unit a number is read with
  q_duo = 128,         // 多
  q_duo_what = 256,    // 少久远长重 (after 多)
  q_ji = 512,          // 几
  q_gong_before = 1024,  // 一, 总 (before 共)
  q_gong = 2048,       // 共
  q_hai = 4096,        // 还
  q_sheng = 8192,      // 剩 (after 还)
  q_yi = 16384,        // 一 (alone it is "a", not a number)
};

class quantity_words {
 public:
  quantity_words() {
    const auto words = [this](std::string_view list, uint16_t kind) {
      while (!list.empty()) {
        const size_t cut = list.find(' ');
        add(list.substr(0, cut), kind);
        list = cut == std::string_view::npos ? std::string_view() : list.substr(cut + 1);
      }
    };
    const auto chars = [this](std::string_view list, uint16_t kind) {
      for (size_t i = 0; i + 3 <= list.size(); i += 3) add(list.substr(i, 3), kind);
    };
    words("zero two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand "
          "million billion half dozen twice triple",
          q_number);
    words("how", q_how);
    words("what", q_what);
    words("much many long far old big heavy tall", q_how_what);
    words("time", q_time);
    chars("零一二两三四五六七八九十百千万亿半", q_zh_numeral);
    chars("个元块毛角分斤克吨米里升人岁次天年月周时秒本张只条件杯瓶包箱辆台位倍折寸尺度份盒袋碗口层栋", q_zh_measure);
    chars("多", q_duo);
    chars("少久远长重", q_duo_what);
    chars("几", q_ji);
    chars("一总", q_gong_before);
    chars("共", q_gong);
    chars("还", q_hai);
    chars("剩", q_sheng);
    chars("一", q_yi);
  }

  // The token's bits (0: none of these words). `room`: bytes readable
  // from tok.data() (at least tok.size()).
  uint16_t kind(std::string_view tok, size_t room) const noexcept {
    // Most tokens (punctuation, most words) fail the first byte's test.
    const auto b0 = static_cast<unsigned char>(tok[0]);
    if (tok.size() > k_len_max || ((_first[b0 >> 6] >> (b0 & 63)) & 1) == 0) return 0;
    uint64_t key = 0;
    if (room >= 8) {
      std::memcpy(&key, tok.data(), 8);  // one load; the bytes past the token masked off
      if (tok.size() < 8) key &= (uint64_t{1} << (8 * tok.size())) - 1;
      key = (key ^ (uint64_t{tok.size()} << 59)) | 1;
    } else {
      key = pack(tok);
    }
    for (size_t i = slot_of(key);; i = (i + 1) & (k_slots - 1)) {
      if (_keys[i] == key) return _kinds[i];
      if (_keys[i] == 0) return 0;
    }
  }

 private:
  static constexpr size_t k_len_max = 9;  // "seventeen"
  static constexpr size_t k_slots = 256;  // at most half full
  // Up to 8 bytes and the length: distinct for every word above.
  static uint64_t pack(std::string_view tok) noexcept {
    uint64_t v = 0;
    std::memcpy(&v, tok.data(), std::min<size_t>(tok.size(), 8));
    return (v ^ (uint64_t{tok.size()} << 59)) | 1;  // never 0 (the empty slot)
  }
  static size_t slot_of(uint64_t key) noexcept { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 56); }
  void add(std::string_view tok, uint16_t kind) {
    SLUICE_VERIFY(!tok.empty() && tok.size() <= k_len_max);
    const auto b0 = static_cast<unsigned char>(tok[0]);
    _first[b0 >> 6] |= uint64_t{1} << (b0 & 63);
    const uint64_t key = pack(tok);
    for (size_t i = slot_of(key);; i = (i + 1) & (k_slots - 1)) {
      if (_keys[i] == key) {
        _kinds[i] = static_cast<uint16_t>(_kinds[i] | kind);
        return;
      }
      if (_keys[i] == 0) {
        SLUICE_VERIFY(++_used * 2 <= k_slots);
        _keys[i] = key;
        _kinds[i] = kind;
        return;
      }
    }
  }
  std::array<uint64_t, k_slots> _keys{};
  std::array<uint16_t, k_slots> _kinds{};
  std::array<uint64_t, 4> _first{};  // the words' first bytes
  size_t _used = 0;
};

const quantity_words& quantity_table() {
  static const quantity_words t;
  return t;
}

bool all_digits(std::string_view tok) noexcept {
  return std::all_of(tok.begin(), tok.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The quantity question's state over a text's tokens, fed in order.
class quantity_scan {
 public:
  // The token text[i, end).
  void token(std::string_view text, size_t i, size_t end) noexcept {
    const std::string_view tok(text.data() + i, end - i);  // i < end <= text.size()
    const bool digits = tok[0] >= '0' && tok[0] <= '9' && all_digits(tok);
    const uint16_t k = digits ? 0 : _words.kind(tok, text.size() - i);
    if (k == 0) {
      // Most tokens: no word of these, so no question's second word.
      if (_zh_run >= 2) ++_numbers;
      _zh_run = 0;
      _numbers += digits ? 1 : 0;
      _prev = 0;
      return;
    }
    if ((k & q_zh_numeral) != 0) {
      _run_is_yi = _zh_run == 0 && (k & q_yi) != 0;
      ++_zh_run;
    } else {
      // A run of numerals ends here: two or more, or one (not 一 alone)
      // before a measure word.
      if (_zh_run >= 2 || (_zh_run == 1 && !_run_is_yi && (k & q_zh_measure) != 0)) ++_numbers;
      _zh_run = 0;
      if (digits || (k & q_number) != 0) ++_numbers;
    }
    if (((_prev & q_how) != 0 && (k & q_how_what) != 0) || ((_prev & q_what) != 0 && (k & q_time) != 0) ||
        ((_prev & q_duo) != 0 && (k & q_duo_what) != 0) || ((_prev & q_ji) != 0 && (k & q_zh_measure) != 0) ||
        ((_prev & q_gong_before) != 0 && (k & q_gong) != 0) || ((_prev & q_hai) != 0 && (k & q_sheng) != 0)) {
      _asks = true;
    }
    _prev = k;
  }
  // Sticky: once true, later tokens do not change it.
  bool found() const noexcept { return _asks && _numbers + (_zh_run >= 2 ? 1 : 0) >= 2; }

 private:
  const quantity_words& _words = quantity_table();
  uint32_t _numbers = 0;
  bool _asks = false;
  uint16_t _prev = 0;       // the kind of the token before
  uint32_t _zh_run = 0;     // Chinese numerals in a row, ending at the token before
  bool _run_is_yi = false;  // the run is 一 alone (so far)
};

}  // namespace

bool quantity_question(std::string_view text) noexcept {
  quantity_scan q;
  size_t i = 0;
  while (i < text.size() && !q.found()) {
    while (i < text.size() && text[i] == ' ') ++i;
    if (i == text.size()) break;
    const size_t end = token_end(text, i);
    q.token(text, i, end);
    i = end;
  }
  return q.found();
}

void topic_vocabulary::count(std::string_view text, hits& out) const noexcept {
  out.fill(0);
  const auto add = [&](uint8_t topics) {
    for (size_t t = 0; t < k_topics; ++t) {
      if (((topics >> t) & 1) != 0 && out[t] != UINT16_MAX) ++out[t];
    }
  };
  quantity_scan q;  // every token, in the same pass
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    if (i == text.size()) break;
    const size_t end = token_end(text, i);
    q.token(text, i, end);
    // A plural of a term of four letters or more: "sins" and "tans" are
    // no plurals of sin and tan.
    const bool plural = end - i >= 5 && text[end - 1] == 's';
    if (!may_start(text.data() + i, end - i) && !(plural && may_start(text.data() + i, end - i - 1))) {
      i = end;
      continue;
    }
    const slot* s = find(run_key(text.data() + i, end - i));
    size_t next = end;  // where the next match may start: past this token, or past a longer match
    uint8_t topics = s != nullptr ? s->topics : 0;
    if (s != nullptr && s->longest > 1) {
      // Longer terms from here: each run of 2..longest tokens, the longest that is a term.
      size_t e = end;
      for (size_t k = 2; k <= s->longest && e < text.size(); ++k) {
        e = token_end(text, e + 1);
        const slot* longer = find(run_key(text.data() + i, e - i));
        if (longer != nullptr && longer->topics != 0) topics = longer->topics, next = e;
      }
    }
    if (topics == 0 && s == nullptr && plural) {
      // A plural of a one-token English term ("segfaults", "integrals").
      const std::string_view tok = text.substr(i, end - i);
      if (ascii(tok)) {
        const slot* singular = find(run_key(tok.data(), tok.size() - 1));
        if (singular != nullptr) topics = singular->topics;
      }
    }
    if (topics != 0) add(topics);
    // The rest of a longer match's tokens, to the quantity question.
    for (size_t t = end; t < next;) {
      while (t < next && text[t] == ' ') ++t;
      if (t == next) break;
      const size_t te = token_end(text, t);
      q.token(text, t, te);
      t = te;
    }
    i = next;
  }
  if (q.found()) {
    uint16_t& m = out[static_cast<size_t>(semantic_topic::math) - 1];
    m = static_cast<uint16_t>(m > UINT16_MAX - k_quantity_hits ? UINT16_MAX : m + k_quantity_hits);
  }
}

}  // namespace sluice::config
