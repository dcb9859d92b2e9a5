#pragma once
// Test helper: a config for tests that start real shard threads but send
// them no request: an ephemeral port (tests run side by side), no audit file,
// and a backend that is never dialled.
#include <string_view>

namespace sluice::test {

inline constexpr std::string_view k_idle_shard_config = R"(
[server]
listen = "127.0.0.1:0"
[audit]
path = ""
[[group]]
name = "g"
models = ["*"]
backends = ["http://127.0.0.1:9"]
[[key]]
id = "k"
key = "k"
)";

}  // namespace sluice::test
