#pragma once
// metrics: the Prometheus text exposition format (version 0.0.4), written
// one family at a time. The registry's families and the control thread's
// own (reloads, budgets, the cluster lease, backends draining) go through
// this, so every family has its HELP and TYPE once, before its samples, and
// every label value is escaped the one way (put_label_value).
//
//   metrics::family f(out, "sluice_budget_used", metrics::family_type::gauge, "Used in ...");
//   f.add({{"key", id}, {"budget", "daily_tokens"}}, used);
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace sluice::metrics {

enum class family_type : uint8_t { counter, gauge, histogram };

// A sample's label: its name (a plain identifier, written as it is) and its
// value (any bytes, escaped).
struct label {
  std::string_view name;
  std::string_view value;
};

// A family's HELP and TYPE lines (the samples follow, written by the caller).
void put_family_head(std::string& out, std::string_view name, family_type type, std::string_view help);

// Control thread or any thread that renders: appends to `out`. Writes the
// family's HELP and TYPE lines when made.
class family {
 public:
  family(std::string& out, std::string_view name, family_type type, std::string_view help);
  family(const family&) = delete;
  family& operator=(const family&) = delete;

  // One sample: name{labels} value (no braces without labels).
  void add(std::initializer_list<label> labels, uint64_t value);
  // A value in units of 10^-scale (a spend in nano-units: scale 9), written
  // as an exact decimal with `scale` fraction digits: 1500000, 9 -> 0.001500000.
  void add_scaled(std::initializer_list<label> labels, uint64_t units, unsigned scale);

 private:
  void put_series(std::initializer_list<label> labels);
  std::string& _out;
  std::string_view _name;
};

}  // namespace sluice::metrics
