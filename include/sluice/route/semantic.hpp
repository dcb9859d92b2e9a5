#pragma once
// route: the semantic router's classifier at request time -- fastText's
// supervised inference, written out over the trained matrices of a
// config::semantic_model so that it allocates nothing and takes
// microseconds (fastText's own predict builds vectors and a heap per call).
//
// Shard-local: one per shard per config snapshot (inside the shard's
// group_table); the model it reads is the snapshot's, shared read-only. The
// scratch buffers are sized once, at construction, from the model and
// [router] semantic_bytes.
//
// What it computes is fastText's predictLine on the normalised text
// (config::semantic_normalize), to a few units in the last place (a unit
// test holds the two side by side): the tokens' word rows and character
// n-gram buckets (FNV-1a with fastText's signed-char quirk), the word-bigram
// buckets, averaged; times the output matrix; softmax. The one difference
// is the order of the average's sum: each token's rows are summed first,
// so that a per-shard token cache can keep them.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "sluice/config/semantic.hpp"

namespace sluice::route {

class semantic_classifier {
 public:
  // Cold path. `text_bytes_max`: the most input bytes classify() reads.
  // `token_cache`: tokens whose summed rows are kept (a power of two, 0 =
  // none): entries x (32 + dim x 4) bytes.
  semantic_classifier(std::shared_ptr<const config::semantic_model> model, uint32_t text_bytes_max,
                      uint32_t token_cache = 4096);
  semantic_classifier(const semantic_classifier&) = delete;
  semantic_classifier& operator=(const semantic_classifier&) = delete;

  // Classifies already normalised text (whitespace-separated tokens, as
  // semantic_normalize writes them; at most text_capacity() bytes), with
  // the raw text's shape bits (config::semantic_shape; the example scorer
  // reads them, fastText does not). Returns: the most probable label, or
  // -1 when the text has no token; probabilities() then holds every
  // label's probability.
  int32_t infer(std::string_view normalized, uint8_t shape = 0) noexcept;

  // The request path: the first `text_bytes_max` bytes of `system` (when not
  // empty) and then of `user`, each cut at a UTF-8 boundary, normalised into
  // the scratch buffer and classified. Returns as infer().
  int32_t classify(std::string_view system, std::string_view user) noexcept;

  std::span<const float> probabilities() const noexcept { return {_output.data(), _output.size()}; }
  const config::semantic_model& model() const noexcept { return *_model; }
  size_t text_capacity() const noexcept { return _text.size(); }
  // The topic vocabulary's hits in the last classified text, by topic - 1
  // (zero when no group names a topic).
  const config::topic_vocabulary::hits& topic_hits() const noexcept { return _topic_hits; }
  // The hits of `label`'s topic in the last classified text (0 when it
  // names none).
  uint32_t label_topic_hits(int32_t label) const noexcept {
    if (label < 0 || static_cast<size_t>(label) >= _model->label_topic.size()) return 0;
    const auto t = static_cast<size_t>(_model->label_topic[static_cast<size_t>(label)]);
    return t == 0 ? 0 : _topic_hits[t - 1];
  }
  // The topic `label`'s group names (none when it names none).
  config::semantic_topic label_topic(int32_t label) const noexcept {
    if (label < 0 || static_cast<size_t>(label) >= _model->label_topic.size()) return config::semantic_topic::none;
    return _model->label_topic[static_cast<size_t>(label)];
  }
  // Tokens found in / added to the token cache since construction.
  uint64_t token_hits() const noexcept { return _token_hits; }
  uint64_t token_misses() const noexcept { return _token_misses; }

 private:
  int32_t infer_fasttext(std::string_view normalized) noexcept;
  // The groups' topics ([[group]] topic): each label's probability times
  // e^(topic_weight x its topic's hits, at most k_topic_hits_max), made to
  // sum to 1 again. Returns: the most probable label (`best` when no
  // group names a topic, or the text had no token).
  int32_t add_topics(std::string_view normalized, int32_t best) noexcept;
  // The example scorer (config::example_model): naive Bayes and the
  // nearest examples, averaged.
  int32_t infer_examples(std::string_view normalized, uint8_t shape) noexcept;
  int32_t find_word(std::string_view token, uint32_t hash) const noexcept;
  void add_row(int64_t row) noexcept;       // queued (prefetched), summed by flush_rows()
  void flush_rows() noexcept;               // sums the queued rows onto _hidden, in order
  void add_subwords(std::string_view token) noexcept;
  // The sum of `token`'s word row and character n-gram rows, from the
  // token cache or computed into it; adds their count to _rows.
  const float* token_vector(std::string_view token, uint32_t word_hash) noexcept;

  std::shared_ptr<const config::semantic_model> _model;
  uint32_t _text_bytes_max;
  std::vector<char> _text;         // normalised input: 3 bytes per input byte at most (punctuation)
  std::vector<char> _word;         // "<" token ">"
  std::vector<uint32_t> _hashes;   // the tokens' hashes, for word n-grams
  std::vector<float> _hidden;      // dim
  float* _target = nullptr;        // where flush_rows() sums: _hidden, or a token's vector
  // The token cache: two-way set-associative by the token's fastText
  // hash, the token kept whole and compared (so a hit is exact; longer
  // tokens are not cached). A token's vector is the same computed or
  // cached (its rows summed from zero in the same order), so a decision
  // never depends on what a shard saw before.
  static constexpr size_t k_cached_token_max = 26;
  struct alignas(32) token_slot {
    uint8_t len = 0;   // 0: empty (tokens are never empty)
    uint8_t rows = 0;  // rows summed into the vector (a token of more is not kept)
    char bytes[k_cached_token_max + 4] = {};
  };
  static_assert(sizeof(token_slot) == 32);
  size_t _cache_mask = 0;
  size_t _way_mask = 0;            // 1: two ways a set; 0: one slot (a cache of 1)
  std::vector<token_slot> _slots;  // the cache's entries (none without a cache)
  std::vector<float, config::cache_line_allocator<float>> _vectors;  // (slots + 1) x dim: + a scratch row
  uint64_t _token_hits = 0, _token_misses = 0;
  std::vector<float> _output;      // nlabels
  config::topic_vocabulary::hits _topic_hits{};
  // The example scorer's scratch, sized at construction: a feature's
  // count in this text (valid where its stamp is this call's), the
  // distinct features seen, each example's dot product, each label's
  // naive-Bayes sum and best cosines.
  std::vector<uint32_t> _stamp, _count, _seen;
  uint32_t _generation = 0;
  std::vector<float> _example_dot;
  std::vector<double> _bayes;
  std::vector<float> _best;        // nlabels x example_model::k_nearest
  // Its token cache (sized by token_cache, set-associative as the one
  // below): a token's features that some example has (its word and its
  // character n-grams), in the order they are read, so a decision is the
  // same bits cached or not. A token with more than k_example_ids of them
  // is not kept.
  static constexpr size_t k_example_ids = 25;
  struct alignas(32) example_slot {
    uint8_t len = 0;  // 0: empty
    uint8_t ids = 0;
    char bytes[26] = {};
    uint32_t id[k_example_ids] = {};
  };
  static_assert(sizeof(example_slot) == 128);
  std::vector<example_slot> _example_slots;
  uint64_t _rows = 0;              // rows added to _hidden
  static constexpr size_t k_row_block = 64;     // rows queued before a sum (their prefetches fit L1)
  std::array<const float*, k_row_block> _queued{};
  size_t _queued_n = 0;
};

}  // namespace sluice::route
