#pragma once
// route: model name -> group, the semantic router ([[rule]]s for the
// `[router] auto_model` name) and per-key group access. Built from a config
// snapshot on the cold path; one per shard (or shared read-only: it holds no
// mutable state).
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
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/route/ring.hpp"

namespace sluice::route {

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

  // The whole decision: the auto model goes through choose(); any other name
  // through find(), and a group the key may not use reads as k_none (so a
  // 404 does not reveal that the model exists).
  uint32_t resolve(const openai::request_fields& f, uint32_t key_index) const noexcept;

  // Whether key `key_index` (config::config::keys) may use `group` (its
  // `groups` globs, expanded at load into a bitmap).
  bool key_allows(uint32_t key_index, uint32_t group) const noexcept {
    return (_key_bits[size_t{key_index} * _words + group / 64] >> (group % 64)) & 1u;
  }

  // Whether one rule's conditions hold (exposed for tests and diagnostics).
  bool rule_matches(uint32_t rule, const openai::request_fields& f) const noexcept;

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
  };

  uint32_t _group_count = 0;
  std::string _auto_model;
  uint32_t _default_group = k_none;
  std::vector<exact_name> _exact;  // sorted by (hash, name)
  std::vector<pattern> _patterns;  // file order
  std::vector<rule> _rules;        // file order
  size_t _words = 1;               // uint64_t words per key in _key_bits
  std::vector<uint64_t> _key_bits;
};

}  // namespace sluice::route
