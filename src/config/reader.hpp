#pragma once
// config (private): the TOML reader every part of the config is read with --
// typed lookups that fail with "FILE:LINE: what is wrong; allowed: ...".
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "sluice/config/config.hpp"
#include "values.hpp"

namespace sluice::config::detail {

using names = std::initializer_list<std::string_view>;

inline constexpr uint64_t k_timeout_max_ms = 24ull * 3600 * 1000;  // a day: beyond is a typo, not a policy

inline std::string join(names list) {
  std::string out;
  for (auto n : list) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

inline std::string_view type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

class reader {
 public:
  explicit reader(std::string_view source) : _source(source) {}
  std::string_view source() const { return _source; }

  std::string at(const toml::source_region& where) const {
    return fmt::format("{}:{}", _source, where.begin.line == 0 ? 1 : where.begin.line);
  }
  std::string at(const toml::node& n) const { return at(n.source()); }

  [[noreturn]] void fail(const toml::node& n, std::string_view msg) const {
    throw config_error(fmt::format("{}: {}", at(n), msg));
  }

  void check_keys(const toml::table& t, std::string_view table_name, names allowed) const {
    for (auto&& [k, v] : t) {
      if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end()) continue;
      std::string hint;
      size_t best = 3;  // farther than 2 edits is a different word, not a typo
      for (auto candidate : allowed) {
        size_t distance = edit_distance(k.str(), candidate);
        if (distance < best) {
          best = distance;
          hint = fmt::format(" (did you mean \"{}\"?)", candidate);
        }
      }
      throw config_error(fmt::format("{}: unknown key \"{}\" in {}{}; allowed: {}",
                                     at(k.source()), k.str(), table_name, hint, join(allowed)));
    }
  }

  // A [name] table; nullptr when absent.
  const toml::table* table(const toml::table& parent, std::string_view key, std::string_view name) const {
    const toml::node* n = parent.get(key);
    if (n == nullptr) return nullptr;
    if (!n->is_table()) fail(*n, fmt::format("{} must be a table, written [{}] (got {})", name, name, type_name(*n)));
    return n->as_table();
  }

  template <class U>
  void read_uint(const toml::table& t, std::string_view table_name, std::string_view key, U& out,
                 uint64_t min, uint64_t max, std::string_view note = {}) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return;
    if (!n->is_integer()) fail(*n, fmt::format("{}.{} must be an integer (got {})", table_name, key, type_name(*n)));
    int64_t value = n->as_integer()->get();
    if (value < 0 || static_cast<uint64_t>(value) < min || static_cast<uint64_t>(value) > max) {
      fail(*n, fmt::format("{}.{} = {} is out of range; allowed: {}-{}{}", table_name, key, value, min, max, note));
    }
    out = static_cast<U>(value);
  }

  void read_timeout(const toml::table& t, std::string_view table_name, std::string_view key, uint32_t& out,
                    uint64_t min = 1) const {
    read_uint(t, table_name, key, out, min, k_timeout_max_ms, min == 0 ? " ms (0 = none)" : " ms");
  }

  void read_bool(const toml::table& t, std::string_view table_name, std::string_view key, bool& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return;
    if (!n->is_boolean()) fail(*n, fmt::format("{}.{} must be true or false (got {})", table_name, key, type_name(*n)));
    out = n->as_boolean()->get();
  }

  // An integer or a float within [min, max]. Returns the node (null when absent).
  const toml::node* read_number(const toml::table& t, std::string_view table_name, std::string_view key, double& out,
                                double min, double max, std::string_view note = {}) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return nullptr;
    double v = 0;
    if (n->is_floating_point()) {
      v = n->as_floating_point()->get();
    } else if (n->is_integer()) {
      v = static_cast<double>(n->as_integer()->get());
    } else {
      fail(*n, fmt::format("{}.{} must be a number (got {})", table_name, key, type_name(*n)));
    }
    if (!(v >= min && v <= max)) fail(*n, fmt::format("{}.{} = {} is out of range; allowed: {}-{}{}", table_name, key, v, min, max, note));
    out = v;
    return n;
  }

  // Returns the node so that later checks can point at its line.
  const toml::node* read_string(const toml::table& t, std::string_view table_name, std::string_view key,
                                std::string& out) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return nullptr;
    if (!n->is_string()) fail(*n, fmt::format("{}.{} must be a string (got {})", table_name, key, type_name(*n)));
    out = n->as_string()->get();
    return n;
  }

  // An array of non-empty strings; each element keeps its node for messages.
  std::vector<const toml::node*> read_strings(const toml::table& t, std::string_view table_name,
                                              std::string_view key) const {
    std::vector<const toml::node*> out;
    const toml::node* n = t.get(key);
    if (n == nullptr) return out;
    const auto* arr = n->as_array();
    if (arr == nullptr) {
      fail(*n, fmt::format("{}.{} must be an array of strings, e.g. [\"a\", \"b\"] (got {})", table_name, key, type_name(*n)));
    }
    if (arr->empty()) fail(*n, fmt::format("{}.{} must not be empty", table_name, key));
    for (const toml::node& element : *arr) {
      if (!element.is_string() || element.as_string()->get().empty()) {
        fail(element, fmt::format("{}.{} must hold non-empty strings (got {})", table_name, key, type_name(element)));
      }
      out.push_back(&element);
    }
    return out;
  }

  // [[name]]: an array of tables; empty when absent.
  std::vector<const toml::table*> tables(const toml::table& root, std::string_view key) const {
    std::vector<const toml::table*> out;
    const toml::node* n = root.get(key);
    if (n == nullptr) return out;
    if (!n->is_array_of_tables()) {
      fail(*n, fmt::format("{} must be written as [[{}]] (one block per {}), got {}", key, key, key, type_name(*n)));
    }
    for (const toml::node& element : *n->as_array()) out.push_back(element.as_table());
    return out;
  }

 private:
  std::string _source;
};

// group.native_dialects, read after group.protocol (dialects.cpp).
void read_native_dialects(const reader& r, const toml::table& t, group_config& g);
// admission.cpp: admission, max_inflight_per_backend, queue_timeout_ms,
// queue_max; a key's weight and priority.
void read_group_admission(const reader& r, const toml::table& t, group_config& g);
void read_key_admission(const reader& r, const toml::table& t, key_config& k);

}  // namespace sluice::config::detail
