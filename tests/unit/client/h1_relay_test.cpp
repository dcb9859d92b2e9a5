// The HTTP/1.1 codec relaying a backend's response: the fake adapter stages
// the backend's head, sends its body in pieces as each send completes, and
// ends the response, as the real adapters do through client_codec.
#include <doctest/doctest.h>

#include <string>

#include "codec_harness.hpp"

using namespace codec_test;

namespace {

constexpr std::string_view k_sse_head =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    "x-backend-field: kept\r\nkeep-alive: timeout=5\r\n\r\n";

std::string chunk(std::string_view data) {
  char size[16];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return std::string(size, static_cast<size_t>(n)) + std::string(data) + "\r\n";
}

// A fixture whose policy sends every request to the adapter.
struct relay_fixture : shard_fixture {
  relay_fixture() {
    policy.on_dispatch = [](exchange& x) { x.adapter->start(x); };
  }
};

}  // namespace

TEST_SUITE("client::h1_codec relay") {
  TEST_CASE("a streamed response goes out piece by piece in the backend's chunked framing") {
    relay_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", R"({"stream":true})"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond(k_sse_head, {chunk("data: {\"a\":1}\n\n")}, false);
    REQUIRE(f.run_until([&] { return f.adapter.on_sent_calls == 1; }));
    CHECK(c.responses().empty());  // the body has not ended
    f.adapter.more({chunk("data: {\"a\":2}\n\n"), chunk("data: [DONE]\n\n"), "0\r\n\r\n"}, true);
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 200);
    CHECK(rs[0].headers.at("content-type") == "text/event-stream");
    CHECK(rs[0].headers.at("x-backend-field") == "kept");
    CHECK(rs[0].headers.count("keep-alive") == 0);  // hop-by-hop: the backend's own
    CHECK(rs[0].headers.at("x-request-id") == "req-1");
    CHECK(rs[0].headers.count("openai-processing-ms") == 1);
    CHECK(rs[0].headers.at("x-fake-policy") == "1");
    CHECK(rs[0].body == "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n");
    CHECK(f.adapter.on_sent_calls == 4);  // one completion per send
    CHECK(f.policy.ended == 1);
    CHECK(f.policy.contract_breaks == 0);
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::responses_2xx).get() == 1);
  }

  TEST_CASE("after a relayed response the connection takes the next request") {
    relay_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{}"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n", {"{\"r\":1}\n"}, true);
    f.responses(c, 1);
    f.send(c, post("/v1/chat/completions", "{}"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n", {"{\"r\":2}\n"}, true);
    const auto rs = f.responses(c, 2);
    CHECK(rs[0].body == "{\"r\":1}\n");
    CHECK(rs[1].body == "{\"r\":2}\n");
    CHECK(rs[1].headers.at("x-request-id") == "req-2");
    CHECK(f.adapter.started == 2);
    CHECK(f.policy.ended == 2);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a lent buffer goes back once: at once when joined to the head, else when its send completed") {
    relay_fixture f;
    counting_lender lender;
    f.adapter.lender = &lender;
    client_conn& c = f.connect();
    SUBCASE("a short body joined to the head") {
      f.send(c, post("/v1/chat/completions", "{}"));
      REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
      f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", {"{}"}, true);
      CHECK(lender.given_back == 1);  // copied: the backend's buffer is free before the send
      f.responses(c, 1);
      CHECK(lender.given_back == 1);
    }
    SUBCASE("a large body sent from the lender's buffer") {
      const std::string big(256 << 10, 'b');
      f.send(c, post("/v1/chat/completions", "{}"));
      REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
      f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: " + std::to_string(big.size()) + "\r\n\r\n", {big}, true);
      CHECK(lender.given_back == 0);  // the kernel reads it until the send completes
      const auto rs = f.responses(c, 1);
      CHECK(rs[0].body.size() == big.size());
      CHECK(f.run_until([&] { return lender.given_back == 1; }));
      for (int i = 0; i < 3; ++i) f.turn();
      CHECK(lender.given_back == 1);
    }
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a client gone mid-stream: the exchange is cancelled and ended once, the attempt released") {
    relay_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", R"({"stream":true})"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond(k_sse_head, {chunk("data: {\"a\":1}\n\n")}, false);
    REQUIRE(f.run_until([&] { return f.adapter.on_sent_calls == 1; }));
    c.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
    CHECK(f.policy.cancels == 1);
    CHECK(f.adapter.released == 1);
    CHECK(f.policy.opened == 1);
    CHECK(f.policy.ended == 1);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a pipelined request behind a stream is served once the stream ends") {
    relay_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{\"one\":1}") + post("/v1/chat/completions", "{\"two\":2}"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond(k_sse_head, {chunk("data: 1\n\n")}, false);
    REQUIRE(f.run_until([&] { return f.adapter.on_sent_calls == 1; }));
    CHECK(f.policy.dispatched.size() == 1);
    f.adapter.more({"0\r\n\r\n"}, true);
    REQUIRE(f.run_until([&] { return f.policy.dispatched.size() == 2; }));
    CHECK(f.policy.dispatched[1].body == "{\"two\":2}");
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", {"{}"}, true);
    const auto rs = f.responses(c, 2);
    CHECK(rs[0].body == "data: 1\n\n");
    CHECK(rs[1].body == "{}");
    CHECK(f.policy.ended == 2);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a request that asked to close gets connection: close on the relayed head, then the close") {
    relay_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{}", "connection: close\r\n"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", {"{}"}, true);
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].headers.at("connection") == "close");
    CHECK(f.closed_by_server(c));
    CHECK(f.policy.ended == 1);
  }

  TEST_CASE("an HTTP/1.0 client takes no chunked framing; HTTP/1.1 does") {
    relay_fixture f;
    bool chunked_ok = true;
    f.policy.on_dispatch = [&](exchange& x) {
      chunked_ok = x.codec->takes_chunked(x);
      x.codec->answer(x, 200, "{}", false, {}, {});
    };
    client_conn& a = f.connect();
    f.send(a, "POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}");
    f.responses(a, 1);
    CHECK_FALSE(chunked_ok);
    client_conn& b = f.connect();
    f.send(b, post("/v1/chat/completions", "{}"));
    f.responses(b, 1);
    CHECK(chunked_ok);
  }

  TEST_CASE("an error status relayed from the backend is counted as one, and the connection kept") {
    relay_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{}"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n", {"{}"}, true);
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 503);
    REQUIRE(f.run_until([&] { return f.policy.ended == 1; }));
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::responses_5xx).get() == 1);
    // The client may send its next request on the same connection.
    f.send(c, get("/v1/models"));
    REQUIRE(f.run_until([&] { return f.policy.dispatched.size() == 2; }));
    CHECK_FALSE(c.eof);
  }
}
