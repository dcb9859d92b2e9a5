#pragma once
// route: model name -> group, the semantic router ([[rule]]s and the
// classifier for the `[router] auto_model` name) and per-key group access.
// Built from a config snapshot on the cold path; one per shard (the
// classifier's scratch buffers make it shard-local).
//
// The auto model's decision (decide()): rules with priority = "before"
// first, in file order; then the classifier ([router] semantic =
// "classifier"), when its top probability reaches min_confidence; then the
// other rules; then the default group. With the classifier off every rule
// runs in file order, as before.
//
// Sticky sessions: with an X-Session-ID the text conditions and the
// classifier read the session's *first* user message (the earliest one the
// request's history carries) instead of the last one. Every turn of a
// conversation resends that message, so every turn -- on any shard, on any
// instance -- computes the same group, and no table of sessions is needed.
//
// Embeddings mode: after the before-rules, the prompt's vector (from the
// [router] embeddings_group, asked by the shard: see decision::pending)
// against the groups' centroids, the nearest winning; a decision cached per
// shard by the text's hash; while the centroids are not ready, or when the
// call fails, the classifier (trained on the same examples) and the rules.
//
// Matching order: exact names first (a sorted table of XXH3 hashes, binary
// search: no allocation), then glob patterns in file order. A name written
// exactly in two groups belongs to the first.
//
// Rules look at the last user message: contains_any keywords (ASCII
// case-insensitive, the whole message) and regex (ECMAScript,
// case-insensitive, on the first k_rule_regex_bytes only: std::regex
// backtracks recursively and allocates, so its input is bounded; only
// requests for the auto model that reach a regex rule pay for it).
#include <cstdint>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/route/ring.hpp"
#include "sluice/route/embeddings.hpp"
#include "sluice/route/semantic.hpp"

namespace sluice::route {

// How the auto model's group was picked (the audit's "route_how", metrics'
// `how` label: metrics::router_how_names is in this order).
enum class decision_how : uint8_t { rule, classifier, default_group, sticky, embeddings, name };
std::string_view to_string(decision_how h) noexcept;

struct decision {
  uint32_t group = k_none;
  decision_how how = decision_how::name;
  // The classifier's label: its top one, or the one a topic backs that it
  // yielded to (decide()); its group may be another (rules, the default).
  // `confidence` is that label's probability; -1 = it did not run.
  float confidence = -1;
  int32_t label = -1;
  // Embeddings mode: no decision yet -- the prompt (group_table::embed_input())
  // is to be embedded, then embedding_decision() decides; or, when that
  // cannot be, decide(..., false) without the embeddings.
  bool pending = false;
  bool cached = false;     // embeddings mode: from the shard's cache of earlier answers
};

// Embeddings mode: what a pending decision asks to embed. Views into the
// request (valid while its request_fields are).
struct embed_input {
  std::string_view system;   // "" unless [router] include_system
  std::string_view user;     // the (first, with a session) user message, cut at semantic_bytes
  uint64_t hash = 0;         // of both: the decision cache's key
  bool later_turn = false;   // decided as the session's first turn: how = sticky
};

inline constexpr size_t k_rule_regex_bytes = 16384;

// '*' any run, '?' one byte, "[abc]" "[a-z]" "[!a]" one byte of a class (as
// fnmatch(3) without flags; no escapes). No allocation.
bool glob_match(std::string_view pattern, std::string_view text) noexcept;

class group_table {
 public:
  explicit group_table(const config::config& cfg);  // cold path
  group_table(const group_table&) = delete;
  group_table& operator=(const group_table&) = delete;
  group_table(group_table&&) = default;

  uint32_t group_count() const noexcept { return _group_count; }
  bool is_auto(std::string_view model) const noexcept { return model == _auto_model; }

  // Returns: the group serving `model` by name or pattern, or k_none.
  uint32_t find(std::string_view model) const noexcept;

  // Returns: the group of the first rule that holds for `f` and that key
  // `key_index` may use; else the default group if the key may use it; else
  // k_none (404 model_not_found).
  uint32_t choose(const openai::request_fields& f, uint32_t key_index) const noexcept;

  // The auto model's decision, with how and the confidence (see the top).
  // `sticky`: the request names a session (X-Session-ID). Shard-local: it
  // uses the classifier's scratch.
  // `embeddings`: false once the embeddings could not decide (the call
  // failed, timed out, or could not start): the classifier and the rules do.
  decision decide(const openai::request_fields& f, uint32_t key_index, bool sticky, bool embeddings = true) noexcept;

  // Embeddings mode ([router] semantic = "embeddings"): the snapshot's
  // centroids (null while the control thread computes them, and when off),
  // the input of the last pending decision, and the decision from the
  // prompt's vector (k_none when no centroid fits or the key may not use
  // its group: then decide(..., false)). `c`: the centroids the call
  // started with; the decision is cached when they are still this table's.
  const config::embedding_centroids* centroids() const noexcept {
    return _centroids != nullptr ? _centroids->get() : nullptr;
  }
  std::shared_ptr<const config::embedding_centroids> centroids_shared() const noexcept {
    return _centroids != nullptr ? _centroids->shared() : nullptr;
  }
  const embed_input& pending_input() const noexcept { return _embed_in; }
  decision embedding_decision(const config::embedding_centroids& c, std::span<const float> vec, const embed_input& in,
                              uint32_t key_index) noexcept;
  const decision_cache& embeddings_cache() const noexcept { return _embed_cache; }

  // The whole decision: the auto model goes through choose(); any other name
  // through find(), and a group the key may not use reads as k_none (so a
  // 404 does not reveal that the model exists).
  uint32_t resolve(const openai::request_fields& f, uint32_t key_index) const noexcept;
  // resolve() with how it was decided (decide() for the auto model; how =
  // name for any other model).
  decision resolve_decision(const openai::request_fields& f, uint32_t key_index, bool sticky,
                            bool embeddings = true) noexcept;

  // The classifier ([router] semantic = "classifier"), or null.
  semantic_classifier* classifier() noexcept { return _classifier.get(); }
  // After a classify: whether `label`'s pick, at probability `p`, is one
  // on the examples alone that does not stand -- its group names a topic,
  // no term of it is in the prompt, and p is under min_confidence (code's:
  // config::unbacked_confidence). A group without a topic is judged by
  // min_confidence alone, as before (not here).
  bool unbacked_under_floor(int32_t label, float p) const noexcept;
  // The probability `label`'s pick needs when no term of its topic is in
  // the prompt: min_confidence, or code's more.
  double unbacked_floor(int32_t label) const noexcept;
  // After a classify: the most probable label whose group's topic matched
  // a term of the prompt and whose group `key_index` may reach; -1 when
  // none.
  int32_t backed_pick(uint32_t key_index) const noexcept;
  // The group of a classifier label; k_none when that group is gone.
  uint32_t label_group(int32_t label) const noexcept {
    return label >= 0 && static_cast<size_t>(label) < _label_group.size() ? _label_group[static_cast<size_t>(label)]
                                                                          : k_none;
  }

  // Whether key `key_index` (config::config::keys) may use `group` (its
  // `groups` globs, expanded at load into a bitmap).
  // key_index k_none: any group (--explain-route).
  bool key_allows(uint32_t key_index, uint32_t group) const noexcept {
    if (key_index == k_none) return true;
    return (_key_bits[size_t{key_index} * _words + group / 64] >> (group % 64)) & 1u;
  }

  // Whether one rule's conditions hold (exposed for tests and diagnostics).
  bool rule_matches(uint32_t rule, const openai::request_fields& f) const noexcept;
  // The same, with `text` in place of the last user message.
  bool rule_matches(uint32_t rule, const openai::request_fields& f, std::string_view text) const noexcept;

 private:
  struct exact_name {
    uint64_t hash;
    std::string name;
    uint32_t group;
  };
  struct pattern {
    std::string glob;
    uint32_t group;
  };
  struct rule {
    uint32_t group;
    std::vector<std::string> keywords;  // lower-cased
    std::optional<std::regex> regex;
    uint64_t min_prompt_bytes;
    uint64_t max_prompt_bytes;
    std::optional<bool> has_tools;
    std::optional<bool> has_images;
    bool before;
  };

  uint32_t _group_count = 0;
  std::string _auto_model;
  uint32_t _default_group = k_none;
  std::vector<exact_name> _exact;  // sorted by (hash, name)
  std::vector<pattern> _patterns;  // file order
  std::vector<rule> _rules;        // file order
  size_t _words = 1;               // uint64_t words per key in _key_bits
  std::vector<uint64_t> _key_bits;
  std::unique_ptr<semantic_classifier> _classifier;
  std::vector<uint32_t> _label_group;  // classifier label -> group
  double _min_confidence = 0.5;
  bool _include_system = false;
  uint32_t _semantic_bytes = 2048;
  std::shared_ptr<config::centroid_slot> _centroids;  // embeddings mode: the snapshot's
  decision_cache _embed_cache{0};
  embed_input _embed_in;
};

// --explain-route: the auto model's decision for a request whose one user
// message is `prompt`, whatever a key may use: "group: NAME\nhow: HOW\n
// confidence: P\n", then each label's probability when the classifier runs.
// Cold path. `one_line`: "NAME\tHOW\tP\n" only (P "-" without the classifier),
// for scripts (`--explain-route -` reads one prompt per line).
std::string explain_route(const config::config& cfg, std::string_view prompt, bool one_line = false);

}  // namespace sluice::route
