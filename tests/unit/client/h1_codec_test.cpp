// The HTTP/1.1 codec on real loopback sockets: a request's head and body
// reaching the policy, the answers sluice writes itself, keep-alive,
// pipelining and the close, with a fake policy that answers at once (or
// hands the request to a fake adapter) and checks the accounting contract:
// end_request once for every open_request, in every path.
#include <doctest/doctest.h>

#include <string>

#include "codec_harness.hpp"

using namespace codec_test;

namespace {

// The accounting is whole: every request opened has ended, once.
void check_accounted(const fake_policy& p) {
  CHECK(p.contract_breaks == 0);
  CHECK(p.ended == p.opened);
}

}  // namespace

TEST_SUITE("client::h1_codec") {
  TEST_CASE("a request's head and Content-Length body reach the policy, and its answer the client") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", R"({"model":"m"})", "authorization: Bearer k\r\n"));
    const auto rs = f.responses(c, 1);
    REQUIRE(f.policy.heads.size() == 1);
    CHECK(f.policy.heads[0].method == "POST");
    CHECK(f.policy.heads[0].path == "/v1/chat/completions");
    CHECK(f.policy.heads[0].has_body);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].body == R"({"model":"m"})");
    CHECK(rs[0].status == 200);
    CHECK(rs[0].body == R"({"n":1})");
    CHECK(rs[0].headers.at("x-request-id") == "req-1");
    CHECK(rs[0].headers.at("x-fake-policy") == "1");  // the policy's own fields
    CHECK(rs[0].headers.count("connection") == 0);    // keep-alive
    check_accounted(f.policy);
  }

  TEST_CASE("a request with no body is dispatched from its head alone") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, get("/v1/models"));
    const auto rs = f.responses(c, 1);
    REQUIRE(f.policy.heads.size() == 1);
    CHECK_FALSE(f.policy.heads[0].has_body);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].body.empty());
    CHECK(rs[0].status == 200);
  }

  TEST_CASE("a body split across many writes is dispatched once, whole") {
    shard_fixture f;
    client_conn& c = f.connect();
    std::string body = R"({"messages":")";
    body += std::string(300, 'q');
    body += "\"}";
    const std::string req = post("/v1/chat/completions", body);
    // The head and the body a byte or a few at a time, with the loop
    // turning between writes: nothing is dispatched before the last byte.
    for (size_t at = 0; at < req.size(); at += 7) {
      f.send(c, std::string_view(req).substr(at, 7));
      f.turn();
      if (at + 7 < req.size()) REQUIRE(f.policy.dispatched.empty());
    }
    const auto rs = f.responses(c, 1);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].body == body);
    CHECK(f.policy.heads.size() == 1);
    check_accounted(f.policy);
  }

  TEST_CASE("a body larger than the first buffer keeps its head readable at dispatch") {
    // The request buffer grows (and moves) while the body comes: the head's
    // views must move with it, or the policy reads freed memory.
    shard_fixture f;
    client_conn& c = f.connect();
    const std::string body = "{\"pad\":\"" + std::string(200000, 'p') + "\"}";
    const std::string req = post("/v1/chat/completions", body);
    f.send(c, std::string_view(req).substr(0, 300));
    REQUIRE(f.run_until([&] { return f.policy.heads.size() == 1; }));
    f.send(c, std::string_view(req).substr(300));
    f.responses(c, 1);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].path == "/v1/chat/completions");
    CHECK(f.policy.dispatched[0].method == "POST");
    CHECK(f.policy.dispatched[0].body == body);
  }

  TEST_CASE("a chunked body is decoded before dispatch, wherever its chunks are cut") {
    shard_fixture f;
    client_conn& c = f.connect();
    const std::string head =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\ntransfer-encoding: chunked\r\n\r\n";
    const std::string chunks = "5\r\n{\"a\":\r\n3\r\n123\r\n1;ext=1\r\n}\r\n0\r\n\r\n";
    SUBCASE("in one write") { f.send(c, head + chunks); }
    SUBCASE("a byte at a time") {
      f.send(c, head);
      for (char ch : chunks) {
        f.send(c, std::string_view(&ch, 1));
        f.turn();
      }
    }
    const auto rs = f.responses(c, 1);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].body == R"({"a":123})");
    CHECK(f.policy.heads[0].has_body);
    CHECK(rs[0].status == 200);
  }

  TEST_CASE("keep-alive: a second request on the connection after the first answer") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{}"));
    f.responses(c, 1);
    f.send(c, post("/v1/embeddings", "{\"x\":1}"));
    const auto rs = f.responses(c, 2);
    CHECK(rs[0].body == R"({"n":1})");
    CHECK(rs[1].body == R"({"n":2})");
    REQUIRE(f.policy.dispatched.size() == 2);
    CHECK(f.policy.dispatched[1].path == "/v1/embeddings");
    CHECK(f.policy.dispatched[1].body == "{\"x\":1}");  // not the first request's bytes
    CHECK(rs[1].headers.at("x-request-id") == "req-2");  // a fresh exchange
    CHECK(f.transport->connection_count() == 1);
    CHECK_FALSE(c.eof);
    check_accounted(f.policy);
  }

  TEST_CASE("pipelined requests are answered in order, each after the one before it") {
    shard_fixture f;
    // The first goes to the backend; the second waits for its answer.
    f.policy.on_dispatch = [&](exchange& x) {
      if (f.policy.dispatched.size() == 1) {
        x.adapter->start(x);
      } else {
        f.policy.answer_ok(x);
      }
    };
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{\"first\":1}") + post("/v1/chat/completions", "{\"second\":2}") +
                  get("/v1/models"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    for (int i = 0; i < 5; ++i) f.turn();
    CHECK(f.policy.dispatched.size() == 1);  // the next waits
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 13\r\n\r\n",
                      {"{\"backend\":1}"}, true);
    const auto rs = f.responses(c, 3);
    CHECK(rs[0].body == "{\"backend\":1}");
    CHECK(rs[1].body == R"({"n":2})");
    CHECK(rs[2].body == R"({"n":3})");
    REQUIRE(f.policy.dispatched.size() == 3);
    CHECK(f.policy.dispatched[1].body == "{\"second\":2}");
    CHECK(f.policy.dispatched[2].path == "/v1/models");
    check_accounted(f.policy);
  }

  TEST_CASE("a client that pipelines past the held bound is paused, then served in full") {
    shard_fixture f;
    f.policy.on_dispatch = [&](exchange& x) {
      if (f.policy.dispatched.size() == 1) {
        x.adapter->start(x);
      } else {
        f.policy.answer_ok(x);
      }
    };
    client_conn& c = f.connect();
    const std::string pad(900, 'h');
    std::string all = get("/v1/models");
    constexpr int k_more = 100;  // ~100 KiB behind the first: past the 64 KiB the codec holds
    for (int i = 0; i < k_more; ++i) all += get("/v1/models", "x-pad: " + pad + "\r\n");
    f.send(c, all);
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    for (int i = 0; i < 5; ++i) f.turn();
    CHECK(f.policy.dispatched.size() == 1);
    f.adapter.respond("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", {"{}"}, true);
    const auto rs = f.responses(c, 1 + k_more);
    CHECK(rs.size() == 1 + k_more);
    CHECK(rs.back().body == "{\"n\":" + std::to_string(1 + k_more) + "}");
    check_accounted(f.policy);
  }

  TEST_CASE("connection: close closes after the answer") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, get("/v1/models", "connection: close\r\n"));
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 200);
    CHECK(rs[0].headers.at("connection") == "close");
    CHECK(f.closed_by_server(c));
    CHECK(f.run_until([&] { return f.transport->connection_count() == 0; }));
    check_accounted(f.policy);
  }

  TEST_CASE("HTTP/1.0 closes after its answer unless it asked to be kept") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, "GET /v1/models HTTP/1.0\r\nhost: sluice\r\n\r\n");
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].headers.at("connection") == "close");
    CHECK(f.closed_by_server(c));
  }

  TEST_CASE("a malformed head gets 400 and the close, without reaching the policy's head or dispatch") {
    shard_fixture f;
    client_conn& c = f.connect();
    SUBCASE("a space before the colon") { f.send(c, "GET /v1/models HTTP/1.1\r\nhost : sluice\r\n\r\n"); }
    SUBCASE("a bare LF line end") { f.send(c, "GET /v1/models HTTP/1.1\r\nhost: sluice\nx: y\r\n\r\n"); }
    SUBCASE("no request line at all") { f.send(c, "\x01\x02garbage\r\n\r\n"); }
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 400);
    CHECK(rs[0].headers.at("connection") == "close");
    CHECK(rs[0].body.find("\"type\":\"invalid_request_error\"") != std::string::npos);
    CHECK(f.closed_by_server(c));
    CHECK(f.policy.heads.empty());
    CHECK(f.policy.dispatched.empty());
    CHECK(f.policy.opened == 1);  // audited all the same
    check_accounted(f.policy);
  }

  TEST_CASE("a head over max_head_bytes gets 431 and the close") {
    shard_fixture f;
    client_conn& c = f.connect();
    std::string req = "GET /v1/models HTTP/1.1\r\nhost: sluice\r\n";
    for (int i = 0; i < 8; ++i) req += "x-field-" + std::to_string(i) + ": " + std::string(1000, 'v') + "\r\n";
    req += "\r\n";  // 8 KiB of fields: past the config's 4 KiB
    f.send(c, req);
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 431);
    CHECK(rs[0].headers.at("connection") == "close");
    CHECK(f.closed_by_server(c));
    CHECK(f.policy.dispatched.empty());
    check_accounted(f.policy);
  }

  TEST_CASE("a body over max_body_bytes gets 413 before any of it is read") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\ncontent-length: 2000000\r\n\r\n{");
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 413);
    CHECK(f.policy.dispatched.empty());
    CHECK(f.closed_by_server(c));
    check_accounted(f.policy);
  }

  TEST_CASE("a malformed chunked body gets 400 after the head was accepted, and is never dispatched") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\ntransfer-encoding: chunked\r\n\r\n"
              "zz\r\nhello\r\n0\r\n\r\n");
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 400);
    CHECK(f.policy.heads.size() == 1);
    CHECK(f.policy.dispatched.empty());
    CHECK(f.closed_by_server(c));
    check_accounted(f.policy);
  }

  TEST_CASE("a request refused by its head is answered and its body is never read as a next request") {
    shard_fixture f;
    f.policy.on_head = [](exchange& x, bool has_body) {
      x.codec->answer_error(x, 401, "Incorrect API key provided.", "invalid_request_error", {}, "invalid_api_key",
                            has_body);  // as the policy does: a body still coming closes
      return false;
    };
    client_conn& c = f.connect();
    // The body looks like a request of its own: it must not be served.
    f.send(c, post("/v1/chat/completions", get("/v1/models")));
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 401);
    CHECK(rs[0].body.find("invalid_api_key") != std::string::npos);
    CHECK(f.closed_by_server(c));
    CHECK(c.responses().size() == 1);
    CHECK(f.policy.heads.size() == 1);
    CHECK(f.policy.dispatched.empty());
    check_accounted(f.policy);
  }

  TEST_CASE("an answer to a Messages client carries Anthropic's error shape") {
    shard_fixture f;
    f.policy.on_dispatch = [](exchange& x) {
      x.req.speaks = sluice::dialect::client_dialect::messages;
      x.codec->answer_error(x, 429, "Slow down.", "requests", {}, "rate_limit_exceeded", false);
    };
    client_conn& c = f.connect();
    f.send(c, post("/v1/messages", "{}"));
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 429);
    CHECK(rs[0].body == R"({"type":"error","error":{"type":"rate_limit_error","message":"Slow down."}})");
    CHECK(std::stoul(rs[0].headers.at("content-length")) == rs[0].body.size());
  }

  TEST_CASE("Expect: 100-continue gets 100 Continue once the head is accepted, then the answer") {
    shard_fixture f;
    client_conn& c = f.connect();
    const std::string body = R"({"model":"m"})";
    f.send(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\nexpect: 100-continue\r\ncontent-length: " +
                  std::to_string(body.size()) + "\r\n\r\n");
    auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 100);
    CHECK(f.policy.heads.size() == 1);
    CHECK(f.policy.dispatched.empty());
    f.send(c, body);
    rs = f.responses(c, 2);
    CHECK(rs[1].status == 200);
    REQUIRE(f.policy.dispatched.size() == 1);
    CHECK(f.policy.dispatched[0].body == body);
    check_accounted(f.policy);
  }

  TEST_CASE("Expect: 100-continue refused by its head gets the refusal, never a 100") {
    shard_fixture f;
    f.policy.on_head = [](exchange& x, bool has_body) {
      x.codec->answer_error(x, 404, "Unknown request URL.", "invalid_request_error", {}, "unknown_url", has_body);
      return false;
    };
    client_conn& c = f.connect();
    f.send(c, "POST /v1/nothing HTTP/1.1\r\nhost: sluice\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n");
    const auto rs = f.responses(c, 1);
    CHECK(rs[0].status == 404);
    CHECK(f.closed_by_server(c));
    CHECK(c.received.find("100 Continue") == std::string::npos);
    check_accounted(f.policy);
  }

  TEST_CASE("a client gone mid-body: the request ends once, never dispatched, never cancelled at the backend") {
    shard_fixture f;
    client_conn& c = f.connect();
    f.send(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\ncontent-length: 100\r\n\r\n{\"partial\":");
    REQUIRE(f.run_until([&] { return f.policy.heads.size() == 1; }));
    c.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
    CHECK(f.policy.dispatched.empty());
    CHECK(f.policy.cancels == 0);  // nothing was sent on
    CHECK(f.policy.opened == 1);
    check_accounted(f.policy);
  }

  TEST_CASE("a client gone while its request waits for the backend: cancelled and ended once, the attempt released") {
    shard_fixture f;
    f.policy.on_dispatch = [](exchange& x) { x.adapter->start(x); };
    client_conn& c = f.connect();
    f.send(c, post("/v1/chat/completions", "{}"));
    REQUIRE(f.run_until([&] { return f.adapter.x != nullptr; }));
    c.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
    CHECK(f.policy.cancels == 1);
    CHECK(f.adapter.released == 1);
    CHECK(f.policy.opened == 1);
    check_accounted(f.policy);
  }

  TEST_CASE("a client gone while the policy holds its exchange parked: unparked once, whatever the codec was told") {
    // The policy parks an exchange in a list of its own (the store's
    // waiters, a fair queue); the connection that holds it must not go
    // while it is linked there, even where the codec was last told to wait
    // for a backend.
    for (const bool told : {true, false}) {
      CAPTURE(told);
      shard_fixture f;
      f.policy.on_dispatch = [&](exchange& x) {
        x.codec->wait_for_backend(x, proxy::deadline_kind::none, 0);
        x.waiting = exchange::waiting_in::store;
        if (told) x.codec->wait_for_quota(x);
      };
      client_conn& c = f.connect();
      f.send(c, post("/v1/chat/completions", "{}"));
      REQUIRE(f.run_until([&] { return f.policy.dispatched.size() == 1; }));
      c.close();
      REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
      CHECK(f.policy.unparks == 1);
      CHECK(f.policy.cancels == 1);
      check_accounted(f.policy);
    }
  }

  TEST_CASE("a client that only connects and goes opens no request") {
    shard_fixture f;
    client_conn& c = f.connect();
    c.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
    CHECK(f.policy.opened == 0);
    CHECK(f.policy.ended == 0);
  }

  TEST_CASE("connections are counted open while they live") {
    shard_fixture f;
    client_conn& a = f.connect();
    client_conn& b = f.connect();
    CHECK(f.transport->connection_count() == 2);
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::connections_open).get() == 2);
    a.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 1; }));
    b.close();
    REQUIRE(f.run_until([&] { return f.transport->connection_count() == 0; }));
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::connections_open).get() == 0);
    CHECK(f.metrics->shard(0).at(sluice::metrics::stat::connections_accepted).get() == 2);
  }

  TEST_CASE("an error answer that closes after the held bound paused the receive still lingers: the client's EOF is read") {
    shard_fixture f;
    f.policy.on_head = [](exchange& x, bool has_body) {
      x.codec->answer_error(x, 401, "Incorrect API key provided.", "invalid_request_error", {}, "invalid_api_key",
                            has_body);  // as the policy does: a body still coming closes
      return false;
    };
    client_conn& c = f.connect();
    // An SDK writes head and body at once: 120 KiB of body is in the socket
    // before the server reads the head.
    const std::string req = post("/v1/chat/completions", std::string(120u << 10, 'b'));
    size_t off = 0;
    for (int i = 0; i < 100 && off < req.size(); ++i) {
      const ssize_t n = ::send(c.fd, req.data() + off, req.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    REQUIRE(off == req.size());
    CHECK(f.responses(c, 1)[0].status == 401);
    REQUIRE(f.closed_by_server(c));  // the write side is shut: lingering
    ::shutdown(c.fd, SHUT_WR);       // the client is done: lingering reads its EOF and closes
    // Within the loop's turns, well inside the 5 s linger deadline.
    CHECK(f.run_until([&] { return f.transport->connection_count() == 0; }, 150));
  }
}
