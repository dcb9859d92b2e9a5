// The HTTP/1.1 codec's deadlines and caps, on a config with short timeouts
// and one connection per shard: what a slow or surplus client gets, and
// that the policy hears of it only as requests opened and ended.
#include <doctest/doctest.h>

#include <string>

#include "codec_harness.hpp"

using namespace codec_test;

namespace {

// Short timeouts (a quarter second: long beside a loaded machine's stalls,
// short beside the loop's bound): the loop turns until they fall due (no sleep).
constexpr std::string_view k_short_config = R"(
[server]
listen = "127.0.0.1:0"
header_timeout_ms = 250
body_timeout_ms = 250
body_min_rate_bytes_per_s = 0
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

// One connection per shard, and time enough to hold it.
constexpr std::string_view k_one_connection_config = R"(
[server]
listen = "127.0.0.1:0"
connections_max = 1
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

}  // namespace

TEST_SUITE("client::h1_codec limits") {
  TEST_CASE("a head not whole within header_timeout_ms gets 408 and the close") {
    shard_fixture f(k_short_config);
    client_conn& c = f.connect();
    f.send(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: slu");
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 408);
    CHECK(rs[0].body.find("request_timeout") != std::string::npos);
    CHECK(f.closed_by_server(c));
    CHECK(f.policy.heads.empty());
    CHECK(f.policy.opened == 1);
    CHECK(f.policy.ended == 1);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a connection that says nothing is closed at the header deadline, with no request") {
    shard_fixture f(k_short_config);
    client_conn& c = f.connect();
    CHECK(f.closed_by_server(c));
    CHECK(c.received.empty());
    CHECK(f.policy.opened == 0);
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
  }

  TEST_CASE("a body that stops coming gets 408 at body_timeout_ms, never dispatched") {
    shard_fixture f(k_short_config);
    client_conn& c = f.connect();
    f.send(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\ncontent-length: 50\r\n\r\n{\"a\":");
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 408);
    CHECK(f.policy.heads.size() == 1);
    CHECK(f.policy.dispatched.empty());
    CHECK(f.closed_by_server(c));
    CHECK(f.policy.ended == 1);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a keep-alive connection's next head gets its own header deadline") {
    shard_fixture f(k_short_config);
    client_conn& c = f.connect();
    f.send(c, get("/v1/models"));
    f.responses(c, 1);
    f.send(c, "GET /v1/mod");
    const auto rs = f.responses(c, 2);
    CHECK(rs[0].status == 200);
    CHECK(rs[1].status == 408);
    CHECK(f.policy.opened == 2);
    CHECK(f.policy.ended == 2);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("past connections_max a new connection gets 503 overloaded and the close; the policy hears nothing") {
    shard_fixture f(k_one_connection_config);
    client_conn& first = f.connect();
    f.send(first, "GET /v1/mo");  // held open: its head is not whole
    client_conn& surplus = f.connect_raw();
    CHECK(f.closed_by_server(surplus));
    const auto rs = surplus.responses();
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].status == 503);
    CHECK(rs[0].headers.at("retry-after") == "1");
    CHECK(rs[0].body.find("\"code\":\"overloaded\"") != std::string::npos);
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::shed_connections).get() == 1);
    CHECK(f.policy.opened == 0);
    CHECK(f.transport->connection_count() == 1);
    CHECK_FALSE(first.eof);
  }
}
