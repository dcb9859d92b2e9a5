#pragma once
// Test helper: a config loaded from TOML text (the classifier trains in it).
#include <memory>
#include <string_view>

#include "sluice/config/config.hpp"

inline std::shared_ptr<const sluice::config::config> load_for_test(std::string_view text) {
  return sluice::config::load(text, "test.toml", {});
}
