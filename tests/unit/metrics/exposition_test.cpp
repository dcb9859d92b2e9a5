// The exposition writer the registry and the control thread's families
// share: HELP and TYPE once, label values escaped, exact scaled decimals.
#include <doctest/doctest.h>

#include <string>

#include "sluice/metrics/exposition.hpp"

namespace m = sluice::metrics;

TEST_SUITE("metrics::family") {
  TEST_CASE("a family writes HELP and TYPE once, then one line per sample") {
    std::string out;
    m::family f(out, "sluice_x_total", m::family_type::counter, "Things.");
    f.add({{"result", "ok"}}, 3);
    f.add({{"result", "failed"}}, 0);
    CHECK(out ==
          "# HELP sluice_x_total Things.\n# TYPE sluice_x_total counter\n"
          "sluice_x_total{result=\"ok\"} 3\nsluice_x_total{result=\"failed\"} 0\n");
  }

  TEST_CASE("a sample without labels has no braces; a gauge says so") {
    std::string out;
    m::family(out, "sluice_up", m::family_type::gauge, "Up.").add({}, 1);
    CHECK(out == "# HELP sluice_up Up.\n# TYPE sluice_up gauge\nsluice_up 1\n");
  }

  TEST_CASE("label values are escaped whatever they hold: quote, backslash, line feed") {
    std::string out;
    m::family f(out, "sluice_k", m::family_type::gauge, "K.");
    f.add({{"key", "a\"b\\c\nd"}, {"budget", "daily_tokens"}}, 7);
    CHECK(out.ends_with("sluice_k{key=\"a\\\"b\\\\c\\nd\",budget=\"daily_tokens\"} 7\n"));
    // One sample line: the line feed in the value did not end it.
    size_t lines = 0;
    for (char c : out) lines += c == '\n' ? 1 : 0;
    CHECK(lines == 3);
  }

  TEST_CASE("a scaled value is an exact decimal with its fraction digits") {
    std::string out;
    m::family f(out, "sluice_spend", m::family_type::gauge, "Spend.");
    f.add_scaled({}, 0, 9);
    f.add_scaled({}, 1'500'000, 9);
    f.add_scaled({}, 12'345'678'901, 9);
    f.add_scaled({}, 18'446'744'073'709'551'615ull, 9);
    f.add_scaled({}, 42, 0);
    CHECK(out.ends_with("sluice_spend 0.000000000\nsluice_spend 0.001500000\nsluice_spend 12.345678901\n"
                        "sluice_spend 18446744073.709551615\nsluice_spend 42\n"));
  }
}
