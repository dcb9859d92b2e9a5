// The Prometheus text exposition format, one family at a time.
#include "sluice/metrics/exposition.hpp"

#include <fmt/format.h>

#include <iterator>

#include "sluice/metrics/registry.hpp"

namespace sluice::metrics {

namespace {
std::string_view type_name(family_type t) noexcept {
  switch (t) {
    case family_type::counter: return "counter";
    case family_type::gauge: return "gauge";
    case family_type::histogram: return "histogram";
  }
  return "untyped";
}
}  // namespace

void put_family_head(std::string& out, std::string_view name, family_type type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type_name(type));
}

family::family(std::string& out, std::string_view name, family_type type, std::string_view help)
    : _out(out), _name(name) {
  put_family_head(out, name, type, help);
}

void family::put_series(std::initializer_list<label> labels) {
  _out += _name;
  if (labels.size() == 0) return;
  char sep = '{';
  for (const label& l : labels) {
    _out += sep;
    _out += l.name;
    _out += "=\"";
    put_label_value(_out, l.value);
    _out += '"';
    sep = ',';
  }
  _out += '}';
}

void family::add(std::initializer_list<label> labels, uint64_t value) {
  put_series(labels);
  fmt::format_to(std::back_inserter(_out), " {}\n", value);
}

void family::add_scaled(std::initializer_list<label> labels, uint64_t units, unsigned scale) {
  put_series(labels);
  uint64_t div = 1;
  for (unsigned i = 0; i < scale && i < 19; ++i) div *= 10;
  if (scale == 0) {
    fmt::format_to(std::back_inserter(_out), " {}\n", units);
  } else {
    fmt::format_to(std::back_inserter(_out), " {}.{:0{}}\n", units / div, units % div, scale < 19 ? scale : 19);
  }
}

}  // namespace sluice::metrics
