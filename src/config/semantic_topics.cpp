// config: the topic vocabulary's table and matcher (see semantic_topics.hpp).
// Cold path, except topic_vocabulary::count(), which runs per request.
#include "sluice/config/semantic_topics.hpp"

#include <xxhash.h>

#include <algorithm>
#include <string>

#include "sluice/config/semantic.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::config {

namespace {

constexpr uint64_t k_seed = 0x746F706963ull;  // "topic"
constexpr size_t k_tokens_max = 8;            // the longest term, in tokens

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

void topic_vocabulary::count(std::string_view text, hits& out) const noexcept {
  out.fill(0);
  const auto add = [&](uint8_t topics) {
    for (size_t t = 0; t < k_topics; ++t) {
      if (((topics >> t) & 1) != 0 && out[t] != UINT16_MAX) ++out[t];
    }
  };
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    if (i == text.size()) break;
    const size_t end = token_end(text, i);
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
    i = next;
  }
}

}  // namespace sluice::config
