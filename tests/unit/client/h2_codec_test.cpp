// The HTTP/2 codec on a real loopback connection: h2c with prior knowledge
// on the plaintext listener (the HTTP/1.1 codec hands the connection over
// at the preface), an nghttp2 client session on the test's side, and the
// same fake policy and adapter as the HTTP/1.1 tests: each stream is one
// exchange, accounted once whatever ends it.
#include <doctest/doctest.h>

#include <string>

#include "../h2/h2_peer.hpp"
#include "codec_harness.hpp"

using namespace codec_test;

namespace {

// An nghttp2 client on one of the fixture's connections.
struct h2_client {
  shard_fixture& f;
  client_conn& conn;
  h2_test::client session;
  size_t fed = 0;  // bytes of conn.received given to the session

  explicit h2_client(shard_fixture& fx) : f(fx), conn(fx.connect()) {}

  // The session's output onto the socket (the preface first).
  void flush() {
    const std::string out = session.take_output();
    if (!out.empty()) f.send(conn, out);
  }
  // What the server sent, into the session; its answers (SETTINGS ACK,
  // WINDOW_UPDATE) back out.
  void take() {
    if (conn.received.size() > fed) {
      session.receive(std::string_view(conn.received).substr(fed));
      fed = conn.received.size();
    }
    flush();
  }
  // Turns the loop until `done` holds, moving bytes both ways.
  template <class F>
  bool run_until(F done) {
    return f.run_until([&] {
      take();
      return done();
    });
  }
  h2_test::client_stream& stream(int32_t id) { return session.streams[id]; }
  bool ended(int32_t id) {
    return run_until([&] { return session.streams[id].end_stream || session.streams[id].closed; });
  }
};

std::string header_of(const h2_test::client_stream& s, std::string_view name) {
  for (const auto& [n, v] : s.headers) {
    if (n == name) return v;
  }
  return {};
}

}  // namespace

TEST_SUITE("client::h2_codec") {
  TEST_CASE("an h2c connection's GET stream reaches accept_head and dispatch; the answer is HEADERS and DATA") {
    shard_fixture f;
    h2_client c(f);
    const int32_t id = c.session.request("GET", "/v1/models");
    c.flush();
    REQUIRE(c.ended(id));
    const auto& s = c.stream(id);
    CHECK(s.status == 200);
    CHECK(s.body == R"({"n":1})");
    CHECK(header_of(s, "content-type") == "application/json");
    CHECK(header_of(s, "content-length") == "7");
    CHECK(header_of(s, "x-request-id") == "req-1");
    CHECK(header_of(s, "x-fake-policy") == "1");
    REQUIRE(f.policy.heads.size() == 1);
    CHECK(f.policy.heads[0].method == "GET");
    CHECK(f.policy.heads[0].path == "/v1/models");
    CHECK_FALSE(f.policy.heads[0].has_body);
    REQUIRE(f.policy.dispatched.size() == 1);
    REQUIRE(f.run_until([&] { return f.policy.ended == 1; }));
    CHECK(f.policy.contract_breaks == 0);
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::h2_connections).get() == 1);
  }

  TEST_CASE("a POST body in DATA frames reaches dispatch whole") {
    shard_fixture f;
    h2_client c(f);
    h2_test::client_body body{"{\"messages\":\"" + std::string(50000, 'm') + "\"}"};
    const int32_t id =
        c.session.request("POST", "/v1/chat/completions", {{"content-type", "application/json"}}, &body);
    c.flush();
    REQUIRE(c.ended(id));
    CHECK(c.stream(id).status == 200);
    REQUIRE(f.policy.heads.size() == 1);
    CHECK(f.policy.heads[0].has_body);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].body == body.bytes);
    CHECK(f.policy.dispatched[0].path == "/v1/chat/completions");
  }

  TEST_CASE("streams on one connection are exchanges of their own, each accounted once") {
    shard_fixture f;
    h2_client c(f);
    const int32_t a = c.session.request("GET", "/v1/models");
    const int32_t b = c.session.request("GET", "/v1/models?second");
    const int32_t d = c.session.request("GET", "/v1/models?third");
    c.flush();
    REQUIRE(c.ended(a));
    REQUIRE(c.ended(b));
    REQUIRE(c.ended(d));
    CHECK(c.stream(a).status == 200);
    CHECK(c.stream(b).status == 200);
    CHECK(c.stream(d).status == 200);
    CHECK(header_of(c.stream(a), "x-request-id") != header_of(c.stream(b), "x-request-id"));
    CHECK(f.policy.dispatched.size() == 3);
    REQUIRE(f.run_until([&] { return f.policy.ended == 3; }));
    CHECK(f.policy.opened == 3);
    CHECK(f.policy.contract_breaks == 0);
    CHECK(f.transport->connection_count() == 1);
  }

  TEST_CASE("a relayed response goes out as DATA without the backend's framing, ended at response_done") {
    shard_fixture f;
    f.policy.on_dispatch = [](exchange& x) { x.adapter->start(x); };
    h2_client c(f);
    const int32_t id = c.session.request("GET", "/v1/models");
    c.flush();
    REQUIRE(c.run_until([&] { return f.adapter.x != nullptr; }));
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                      "connection: keep-alive\r\nx-backend-field: kept\r\n\r\n",
                      {"data: 1\n\n"}, false);
    REQUIRE(c.run_until([&] { return c.stream(id).body == "data: 1\n\n"; }));
    CHECK(c.stream(id).status == 200);
    CHECK_FALSE(c.stream(id).end_stream);
    // Connection-specific fields are not HTTP/2's.
    CHECK(header_of(c.stream(id), "transfer-encoding").empty());
    CHECK(header_of(c.stream(id), "connection").empty());
    CHECK(header_of(c.stream(id), "x-backend-field") == "kept");
    CHECK(header_of(c.stream(id), "content-type") == "text/event-stream");
    f.adapter.more({"data: [DONE]\n\n"}, true);
    REQUIRE(c.ended(id));
    CHECK(c.stream(id).end_stream);
    CHECK(c.stream(id).body == "data: 1\n\ndata: [DONE]\n\n");
    REQUIRE(f.run_until([&] { return f.policy.ended == 1; }));
    CHECK(f.policy.cancels == 0);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a stream the client resets mid-exchange is cancelled and ended once; the connection goes on") {
    shard_fixture f;
    f.policy.on_dispatch = [&](exchange& x) {
      if (f.policy.dispatched.size() == 1) {
        x.adapter->start(x);
      } else {
        f.policy.answer_ok(x);
      }
    };
    h2_client c(f);
    const int32_t id = c.session.request("GET", "/v1/models");
    c.flush();
    REQUIRE(c.run_until([&] { return f.adapter.x != nullptr; }));
    REQUIRE(nghttp2_submit_rst_stream(c.session.native(), NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL) == 0);
    c.flush();
    REQUIRE(c.run_until([&] { return f.policy.cancels == 1; }));
    CHECK(f.policy.ended == 1);
    CHECK(f.adapter.released == 1);
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::h2_client_resets).get() == 1);
    const int32_t next = c.session.request("GET", "/v1/models");
    c.flush();
    REQUIRE(c.ended(next));
    CHECK(c.stream(next).status == 200);
    REQUIRE(f.run_until([&] { return f.policy.ended == 2; }));
    CHECK(f.policy.cancels == 1);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a connection closed with streams in flight: each is cancelled and ended once") {
    shard_fixture f;
    f.policy.on_dispatch = [](exchange& x) { x.adapter->start(x); };
    h2_client c(f);
    c.session.request("GET", "/v1/models");
    c.flush();
    REQUIRE(c.run_until([&] { return f.adapter.x != nullptr; }));
    c.conn.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
    CHECK(f.policy.cancels == 1);
    CHECK(f.policy.opened == 1);
    CHECK(f.policy.ended == 1);
    CHECK(f.adapter.released == 1);
    CHECK(f.policy.contract_breaks == 0);
  }

  TEST_CASE("a stream refused by its head gets the refusal on its own stream, never dispatched") {
    shard_fixture f;
    f.policy.on_head = [](exchange& x, bool has_body) {
      x.codec->answer_error(x, 401, "Incorrect API key provided.", "invalid_request_error", {}, "invalid_api_key",
                            has_body);
      return false;
    };
    h2_client c(f);
    h2_test::client_body body{"{}"};
    const int32_t id = c.session.request("POST", "/v1/chat/completions", {}, &body);
    c.flush();
    REQUIRE(c.ended(id));
    CHECK(c.stream(id).status == 401);
    CHECK(c.stream(id).body.find("invalid_api_key") != std::string::npos);
    CHECK(f.policy.dispatched.empty());
    REQUIRE(f.run_until([&] { return f.policy.ended == 1; }));
    CHECK(f.policy.contract_breaks == 0);
    CHECK_FALSE(c.session.goaway);  // one stream's refusal leaves the connection
  }
}
