#pragma once
// Test helpers: a config loaded from TOML text (the classifier trains in
// it), the lines of a data file, and a labelled set routed through a
// config's groups.
#include <doctest/doctest.h>

#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/route/groups.hpp"

inline std::shared_ptr<const sluice::config::config> load_for_test(std::string_view text) {
  return sluice::config::load(text, "test.toml", {});
}

// The lines of a data file, '#' comments and blank lines left out.
inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l[0] != '#') out.push_back(l);
  }
  return out;
}

// Routes every prompt of a labelled file (label TAB prompt) as the only user
// message of an `auto` request through `c`'s groups.
// Returns: how many went to the group their label names; `total`: how many
// there were.
inline size_t routed_right(const sluice::config::config& c, const std::string& path, size_t& total) {
  sluice::route::group_table t(c);
  size_t right = 0;
  total = 0;
  for (const std::string& line : read_lines(path)) {
    const size_t tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    sluice::openai::request_fields f;
    f.model = "auto";
    f.last_user_message = f.first_user_message = std::string_view(line).substr(tab + 1);
    f.message_count = 1;
    const sluice::route::decision d = t.decide(f, 0, false);
    REQUIRE(d.group < c.groups.size());
    right += c.groups[d.group].name == line.substr(0, tab);
    ++total;
  }
  return right;
}
