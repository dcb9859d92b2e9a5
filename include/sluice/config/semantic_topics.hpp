#pragma once
// config: the semantic router's built-in topic vocabulary ([[group]] topic =
// "code" | "math" | "translation" | "chat"): prior knowledge for the
// example-based classifier, which learns only the words of its ~25 examples
// a group.
//
// A compiled-in list of terms per topic, written from general knowledge
// (never from an evaluation set): for code, programming languages,
// libraries and frameworks, build tools, CLIs, package managers, error and
// exception names, DevOps, cloud and database terms, spreadsheets; for
// math, its vocabulary, a unit asked for as "to / into / in UNIT" (a
// conversion), and an everyday quantity question (quantity_question(), two
// hits); for translation, the verbs and phrases that ask for one and
// "in / into / to LANGUAGE"; for chat, everyday life: food and cooking,
// travel, health and fitness, shopping and consumer products, money in
// everyday use, family and relationships, work life and careers, writing
// requests, entertainment, pets, home, weather, history and culture, and
// the phrases that ask for advice. English and Chinese. A term is matched on
// semantic_normalize's text as a whole run of its tokens ("node.js" ->
// "node . js", "数据库" -> "数 据 库"), the longest at each token; a
// one-token English term also matches with a trailing "s".
//
// A group that names a topic gets, per hit of the topic's terms in the
// prompt (at most k_topic_hits_max counted), `[router] topic_weight` nats
// of log-odds on its probability (route::semantic_classifier); with no
// group naming a topic nothing is matched and the scores are the same.
//
// The vocabulary is built once (the first builtin() call, on the config
// load's cold path); count() allocates nothing.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::config {

enum class semantic_topic : uint8_t { none = 0, code = 1, math = 2, translation = 3, chat = 4 };
inline constexpr size_t k_topics = 4;  // code, math, translation, chat: hits[topic - 1]
inline constexpr uint32_t k_topic_hits_max = 2;  // hits beyond these add nothing

// The probability a pick needs when none of its topic's terms is in the
// prompt (a pick on the examples alone), at least [router] min_confidence.
// Code's prompts name their field: a language, a tool, a library, an
// error, 代码 or 程序. A code pick without one of them is a question whose
// words look like code's examples ("what's the difference between X and
// Y", "how do I …", "帮我写一个 …"), and is right less often than a guess
// of the default group: it needs 0.75. The other topics' prompts often
// name nothing of theirs (a word problem, "render this in Portuguese", a
// chat about anything): 0, min_confidence alone.
constexpr double unbacked_confidence(semantic_topic t) noexcept { return t == semantic_topic::code ? 0.75 : 0.0; }

// "code" -> code; an unknown name -> nullopt ("none" is not a name).
std::optional<semantic_topic> topic_from_name(std::string_view name) noexcept;
std::string_view topic_name(semantic_topic t) noexcept;  // "" for none
// "code, math, translation, chat": for config messages.
std::string_view topic_names() noexcept;

class topic_vocabulary {
 public:
  using hits = std::array<uint16_t, k_topics>;
  // The built-in vocabulary (built at the first call; thread-safe).
  static const topic_vocabulary& builtin();

  // Counts the terms of each topic in normalised text (semantic_normalize's
  // form), into `out` (zeroed first; each count saturates at UINT16_MAX).
  // Longest match first; the tokens of a match are not read again.
  // Allocates nothing.
  void count(std::string_view normalized, hits& out) const noexcept;

  // The topics of a whole raw term (normalised here; cold: tests, tools),
  // as bits 1 << (topic - 1); 0 when it is no term.
  uint8_t topics_of(std::string_view raw_term) const;
  size_t terms() const noexcept { return _terms; }

  // From term lists, one per topic, terms separated by ',' or newlines
  // (blank entries skipped). The built-in one is this over the lists of
  // semantic_topics_terms.cpp.
  explicit topic_vocabulary(const std::array<std::string_view, k_topics>& lists);

 private:
  struct slot {
    uint64_t key = 0;     // 0: empty
    uint8_t topics = 0;   // the topics of the term this run of tokens is (0: only a prefix of longer ones)
    uint8_t longest = 0;  // the most tokens of a term that starts with this run (a one-token run's slot)
  };
  const slot* find(uint64_t key) const noexcept;
  slot& insert(uint64_t key);
  // A filter before the hash: a bit per signature (first two bytes, last
  // byte, length) of the tokens some term starts with; a token whose bit
  // is clear (most words, every punctuation mark no term starts with) is
  // no term's start, and costs no hash and no probe.
  static uint32_t signature(const char* p, size_t n) noexcept {
    const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(p[i])); };
    uint32_t h = b(0) * 0x9E3779B1u;
    h ^= (n > 1 ? b(1) : 0) * 0x85EBCA77u;
    h ^= b(n - 1) * 0xC2B2AE3Du;
    h ^= static_cast<uint32_t>(n) * 0x27D4EB2Fu;
    return (h ^ (h >> 15) ^ (h >> 23)) & (k_signature_bits - 1);
  }
  bool may_start(const char* p, size_t n) const noexcept {
    const uint32_t s = signature(p, n);
    return ((_starts[s >> 6] >> (s & 63)) & 1) != 0;
  }
  static constexpr size_t k_signature_bits = 1 << 16;
  std::array<uint64_t, k_signature_bits / 64> _starts{};
  std::vector<slot> _slots;  // open addressing, a power of two, at most half full
  size_t _used = 0;
  size_t _terms = 0;
};

// Whether normalised text asks an everyday quantity question: one of "how
// much / many / long / far / old / big", "what time", 多少, 几个 (几 and a
// measure word), 多久, 一共, 还剩…, and at least two numbers -- digits, an
// English number word ("one" aside: "which one"), or Chinese numerals (a
// run of two or more, or one before a measure word or unit; 一 alone is
// "a"). A recipe scaled for eleven, a trip's fuel cost, a salary after tax:
// arithmetic without one of math's words. count() adds it to math's hits.
// Allocates nothing.
bool quantity_question(std::string_view normalized) noexcept;

// The built-in term lists (semantic_topics_terms.cpp), by topic - 1. Cold.
std::array<std::string, k_topics> builtin_topic_terms();

}  // namespace sluice::config
