#include <doctest/doctest.h>

#include <string_view>

#include "labels.hpp"
#include "sluice/config/config.hpp"

namespace cfg = sluice::config;
using sluice::control::backend_protocol_label;

namespace {

// b0 is listed by an openai and an anthropic group (in that order), b1 by
// the anthropic group alone, b2 (grpc://) by the triton group.
constexpr std::string_view k_three_protocols = R"(
[server]
listen = "127.0.0.1:0"
[audit]
path = ""
[[group]]
name = "chat"
models = ["chat"]
backends = ["http://127.0.0.1:9"]
[[group]]
name = "claude"
models = ["claude"]
protocol = "anthropic"
backends = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
[[group]]
name = "tri"
models = ["tri"]
protocol = "triton"
backends = ["grpc://127.0.0.1:11"]
[[key]]
id = "k"
key = "k"
)";

uint32_t index_of(const cfg::config& c, std::string_view url) {
  for (uint32_t b = 0; b < c.backends.size(); ++b) {
    if (c.backends[b].url == url) return b;
  }
  FAIL("no backend ", url);
  return 0;
}

}  // namespace

TEST_SUITE("control::backend_protocol_label") {
  TEST_CASE("a backend is labelled with the protocol of the first group that lists it") {
    auto c = cfg::load(k_three_protocols, "labels_test.toml", {});
    CHECK(backend_protocol_label(*c, index_of(*c, "http://127.0.0.1:9")) == "openai");
    CHECK(backend_protocol_label(*c, index_of(*c, "http://127.0.0.1:10")) == "anthropic");
    CHECK(backend_protocol_label(*c, index_of(*c, "grpc://127.0.0.1:11")) == "triton");
  }
}
