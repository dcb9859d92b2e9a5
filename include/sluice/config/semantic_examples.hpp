#pragma once
// config: the semantic router's example scorer ([router] classifier =
// "examples", the default): the groups' examples kept as they are, and a
// prompt scored against them two ways, averaged --
//   - naive Bayes over its words and shape features (binary, Laplace
//     smoothing α = 0.3, every group the same prior: class-balanced);
//   - the nearest examples: cosine over TF-IDF vectors of words, word
//     bigrams, character 3- and 4-grams of ASCII words and the shape
//     features; a group's score the mean of its 3 best, turned into a
//     probability by a softmax at temperature 0.05.
// Nothing is trained (no epochs, no seed): the model is counts and weights
// of the examples, built in microseconds at load. Chosen over the fastText
// classifier on the held-out evaluation (bench/router-eval
// --heldout: 77.5 % -> see README "Semantic routing"), with the method and
// its settings picked on tests/data/router's own set.
//
// Built on the cold path (config load, SIGHUP), one per config snapshot,
// shared read-only by the shards; route::semantic_classifier scores with it
// without allocating.
#include <xxhash.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::config {

// How the classifier decides ([router] classifier).
enum class classifier_method : uint8_t {
  examples,  // this scorer: the default
  fasttext,  // fastText's supervised model, trained from the examples or read from model_file
};

enum class feature_kind : uint8_t { word = 1, shape = 2, bigram = 3, chargram = 4 };
// Naive Bayes reads words and shape features; the nearest-example score all.
constexpr bool bayes_reads(feature_kind k) noexcept { return k == feature_kind::word || k == feature_kind::shape; }

// A feature's 64-bit key; never 0 (0 marks an empty slot of the vocabulary).
constexpr uint64_t nonzero(uint64_t h) noexcept { return h == 0 ? 1 : h; }
// A 64-bit mix (the murmur3 / splitmix finaliser).
constexpr uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

// The shape of the raw text, as bits (each a feature of its own): a digit;
// an operator (= + - * / ^ % < >); code punctuation ( ( ) { } [ ] ; _ .
// against a word character); a quote (" ' and the curly ones); CJK text with
// a Latin word of 2+ letters in it; an identifier's shape (aB, a_b).
// Several parts (the system prompt, the message) OR their bits.
uint8_t semantic_shape(std::string_view raw) noexcept;
inline constexpr int k_shape_bits = 6;

// Feature keys. A token's: its bytes; a pair of neighbouring tokens': the
// two tokens' keys mixed (so a cached token's key is all a pair needs).
inline uint64_t word_key(std::string_view token) noexcept {
  return nonzero(XXH3_64bits_withSeed(token.data(), token.size(), static_cast<uint64_t>(feature_kind::word)));
}
constexpr uint64_t bigram_key(uint64_t prev, uint64_t cur) noexcept {
  return nonzero(mix64(prev * 0x9E3779B97F4A7C15ull ^ (cur + 0x632BE59BD9B4E019ull)));
}
constexpr uint64_t shape_key(int bit) noexcept {
  return nonzero(mix64((uint64_t{static_cast<uint8_t>(feature_kind::shape)} << 56) | static_cast<uint64_t>(bit)));
}
// A character n-gram of up to 4 bytes, packed (n in the fifth byte).
constexpr uint64_t chargram_key(uint32_t packed, size_t n) noexcept {
  return nonzero(mix64((uint64_t{static_cast<uint8_t>(feature_kind::chargram)} << 56) | (uint64_t{n} << 32) | packed));
}

// Calls f(key) for each character 3- and 4-gram of `token` when it is
// ASCII (`ascii`) and 4 bytes or more ("<" and ">" mark its ends).
template <class F>
void for_each_chargram(std::string_view token, bool ascii, F&& f) noexcept {
  if (!ascii || token.size() < 4) return;
  // "<" token ">": position p of that string.
  const auto at = [&](size_t p) -> uint32_t {
    return static_cast<uint8_t>(p == 0 ? '<' : p == token.size() + 1 ? '>' : token[p - 1]);
  };
  for (size_t n = 3; n <= 4; ++n) {
    for (size_t p = 0; p + n <= token.size() + 2; ++p) {
      uint32_t packed = 0;
      for (size_t j = 0; j < n; ++j) packed = packed << 8 | at(p + j);
      f(chargram_key(packed, n));
    }
  }
}

// Calls tok(token, ascii) for each token of normalised text
// (semantic_normalize's form: tokens separated by spaces).
template <class F>
void for_each_token(std::string_view normalized, F&& tok) noexcept {
  size_t i = 0;
  while (i < normalized.size()) {
    while (i < normalized.size() && normalized[i] == ' ') ++i;
    const size_t start = i;
    bool ascii = true;
    while (i < normalized.size() && normalized[i] != ' ') ascii &= static_cast<unsigned char>(normalized[i++]) < 0x80;
    if (i == start) break;
    tok(normalized.substr(start, i - start), ascii);
  }
}

// Calls f(key, kind) for each feature occurrence of normalised text and of
// the shape bits, in the order the classifier reads them: each shape bit
// set; then per token its word, its character n-grams, and the pair it
// makes with the token before it. Allocates nothing.
template <class F>
void for_each_feature(std::string_view normalized, uint8_t shape, F&& f) noexcept {
  for (int b = 0; b < k_shape_bits; ++b) {
    if ((shape >> b) & 1) f(shape_key(b), feature_kind::shape);
  }
  uint64_t prev = 0;
  for_each_token(normalized, [&](std::string_view token, bool ascii) {
    const uint64_t w = word_key(token);
    f(w, feature_kind::word);
    for_each_chargram(token, ascii, [&](uint64_t c) { f(c, feature_kind::chargram); });
    if (prev != 0) f(bigram_key(prev, w), feature_kind::bigram);
    prev = w;
  });
}

struct example_model {
  static constexpr uint32_t k_nearest = 3;       // a group's score: the mean of its best 3 cosines
  static constexpr float k_temperature = 0.05f;  // of the nearest-example softmax
  static constexpr double k_alpha = 0.3;         // naive Bayes' smoothing
  uint32_t nlabels = 0;
  uint32_t nexamples = 0;
  uint32_t nfeatures = 0;
  // The vocabulary: every feature of the examples by its hash, open
  // addressing (a power of two, at least twice nfeatures; 0 = empty).
  std::vector<uint64_t> slot_hash;
  std::vector<uint32_t> slot_feature;
  // By feature.
  std::vector<feature_kind> kind;
  std::vector<float> idf;         // log((examples + 1) / (examples holding it + 1))
  std::vector<float> likelihood;  // nfeatures x nlabels: log P(feature | group) (Bayes' kinds; else 0)
  std::vector<uint32_t> posting_offset;  // nfeatures + 1: its examples are posting_*[offset[f], offset[f+1])
  std::vector<uint32_t> posting_example;
  std::vector<float> posting_weight;     // the feature's weight in the example's unit TF-IDF vector
  std::vector<uint32_t> example_label;   // by example

  // Returns: the feature of hash `h`, or UINT32_MAX when no example has it.
  uint32_t find(uint64_t h) const noexcept {
    const size_t mask = slot_hash.size() - 1;
    for (size_t s = h & mask;; s = (s + 1) & mask) {
      if (slot_hash[s] == h) return slot_feature[s];
      if (slot_hash[s] == 0) return UINT32_MAX;
    }
  }
};

// The model of `examples[l]` (label l's, each a prompt). Labels without an
// example are allowed (they score nothing). Cold path.
example_model build_example_model(const std::vector<std::vector<std::string>>& examples);

}  // namespace sluice::config
