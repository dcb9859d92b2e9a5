#pragma once
// Test helpers: a config loaded from TOML text (the classifier trains in
// it), and the lines of a data file.
#include <doctest/doctest.h>

#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"

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
