// openai_http's transport: connects, pooled keep-alive connections, and the
// failures of an attempt -- refused, reset, closed, timed out, an error or
// garbage answered -- each with what passive health hears, whether another
// backend gets the request, and what the client is answered.
#include "adapter_fixture.hpp"

using namespace sluice::adapters_test;

namespace {

constexpr std::string_view k_chat = R"({"model":"chat-1","messages":[{"role":"user","content":"hello"}],"max_tokens":10})";
constexpr std::string_view k_stream = k_chat_stream;
constexpr std::string_view k_reply_body = R"({"id":"cmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}})";

std::string group(std::string_view backends, std::string_view extra = {}) {
  return "[[group]]\nname = \"chat\"\nmodels = [\"chat-*\"]\nbackends = [" + std::string(backends) + "]\n" +
         std::string(extra) + "\n";
}

std::string json_reply(std::string_view body, std::string_view status = "200 OK", std::string_view extra = {}) {
  return response_head(status, "content-type: application/json\r\n" + std::string(extra) +
                                   "content-length: " + std::to_string(body.size()) + "\r\n") +
         std::string(body);
}


}  // namespace

TEST_SUITE("adapters::openai_http connections") {
  TEST_CASE("a keep-alive reply leaves its connection pooled: the next request goes on it") {
    shard_fixture f(group("\"{b0}\""));
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      call& c = f.start(k_chat);
      f.serve(c, {json_reply(k_reply_body)});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      CHECK(c.codec.done);
      CHECK(c.x.up == nullptr);  // the exchange let go of it
      CHECK(f.last_conn == 0);
      // Taken from the pool: connected already, the first-byte deadline at once.
      CHECK(c.codec.backend_waits.front() ==
            (i == 0 ? sluice::proxy::deadline_kind::upstream_connect : sluice::proxy::deadline_kind::upstream_first_byte));
    }
    CHECK(f.backend().conns.size() == 1);
    CHECK_FALSE(f.backend().peer_closed(0));
  }

  TEST_CASE("a reply that says connection: close is not pooled; the next request connects anew") {
    shard_fixture f(group("\"{b0}\""));
    call& c = f.start(k_chat);
    f.serve(c, {json_reply(k_reply_body, "200 OK", "connection: close\r\n")});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.done);
    CHECK(f.pump([&] { return f.backend().peer_closed(0); }));
    call& next = f.start(k_chat);
    f.serve(next, {json_reply(k_reply_body)});
    CHECK(f.last_conn == 1);
  }

  TEST_CASE("a pooled connection the backend closed leaves the pool; the next request connects anew") {
    shard_fixture f(group("\"{b0}\"", "upstream = { max_retries = 0 }"));
    call& c = f.start(k_chat);
    f.serve(c, {json_reply(k_reply_body)});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    // The receive a pooled connection keeps armed hears the close: the
    // connection goes (its fd with it) before anything asks for it.
    const int fds = open_fds();
    f.backend().close_conn(0);
    REQUIRE(f.pump([&] { return open_fds() == fds - 2; }));
    call& next = f.start(k_chat);
    f.serve(next, {json_reply(k_reply_body)});
    REQUIRE(f.pump([&] { return next.codec.ended(); }));
    CHECK(next.codec.done);
    CHECK(f.last_conn == 1);
    CHECK(next.x.attempts == 0);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
  }

  TEST_CASE("a pooled connection idle past pool_idle_timeout_ms is closed, not reused; one idle less long is reused") {
    // The backend may be closing a connection idle as long as its own
    // keep-alive timeout: a request written into it would be lost.
    for (const uint32_t timeout_ms : {1u, 60000u}) {
      CAPTURE(timeout_ms);
      shard_fixture f("[upstream]\npool_idle_timeout_ms = " + std::to_string(timeout_ms) + "\n" + group("\"{b0}\""));
      call& c = f.start(k_chat);
      f.serve(c, {json_reply(k_reply_body)});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      const uint64_t pooled_at = f.ring->now_ms();
      REQUIRE(f.pump([&] { return f.ring->now_ms() >= pooled_at + 2; }));  // 2 ms idle, by the shard's clock
      call& next = f.start(k_chat);
      f.serve(next, {json_reply(k_reply_body)});
      REQUIRE(f.pump([&] { return next.codec.ended(); }));
      CHECK(next.codec.done);
      CHECK(next.x.attempts == 0);
      if (timeout_ms == 1) {
        CHECK(f.last_conn == 1);  // a new connection
        CHECK(f.pump([&] { return f.backend().peer_closed(0); }));
        CHECK(next.codec.backend_waits.front() == sluice::proxy::deadline_kind::upstream_connect);
      } else {
        CHECK(f.last_conn == 0);
        CHECK(f.backend().conns.size() == 1);
      }
      CHECK(f.policy.failures_of(f.backend_index(0)) == 0);  // closing an old idle one is no failure
    }
  }

  TEST_CASE("at connections_max, an old pooled connection closed for its age does not count: the request connects anew") {
    shard_fixture f("[upstream]\npool_idle_timeout_ms = 1\n" + group("\"{b0}\"", "upstream = { connections_max = 1 }"));
    call& c = f.start(k_chat);
    f.serve(c, {json_reply(k_reply_body)});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    const uint64_t pooled_at = f.ring->now_ms();
    REQUIRE(f.pump([&] { return f.ring->now_ms() >= pooled_at + 2; }));
    call& next = f.start(k_chat);  // the old one is shut down here; its memory goes at its last completion
    CHECK_FALSE(next.codec.answered);
    f.serve(next, {json_reply(k_reply_body)});
    REQUIRE(f.pump([&] { return next.codec.ended(); }));
    CHECK(next.codec.done);
    CHECK(f.last_conn == 1);
  }

  TEST_CASE("at the group's connections_max the next request is shed with a 503 and a retry time") {
    shard_fixture f(group("\"{b0}\"", "upstream = { connections_max = 1 }"));
    call& busy = f.start(k_chat);
    std::string req;
    const size_t conn = f.await_request(0, req);
    call& shed = f.start(k_chat);
    CHECK(shed.codec.answered);
    CHECK(shed.codec.answer_status == 503);
    CHECK(shed.codec.answer_code == "overloaded");
    CHECK(shed.codec.answer_extra == "retry-after: 1\r\n");
    f.write_settled(busy, conn, json_reply(k_reply_body));
    REQUIRE(f.pump([&] { return busy.codec.ended(); }));
    CHECK(busy.codec.done);
  }

  TEST_CASE("a client that goes away mid-stream cuts the backend's request at once") {
    shard_fixture f(group("\"{b0}\""));
    call& c = f.start(k_stream);
    f.serve(c, {k_sse_head + chunked({"data: {\"choices\":[]}\n\n"}, false)});
    REQUIRE(c.x.up != nullptr);
    c.x.adapter->release(c.x);
    CHECK(c.x.up == nullptr);
    CHECK(f.pump([&] { return f.backend().peer_closed(f.last_conn); }));
    CHECK_FALSE(c.codec.ended());  // nothing more is said to a client that is gone
  }
}

TEST_SUITE("adapters::openai_http failures") {
  TEST_CASE("a refused connect goes to the next backend; the refused one is reported failed") {
    shard_fixture f(group("\"{b0}\", \"{b1}\""), {false, true});
    call& c = f.start(k_chat, {.pinned = f.backend_index(0)});
    f.serve(c, {json_reply(k_reply_body)}, 1);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.done);
    CHECK(c.codec.sent == k_reply_body);
    CHECK(c.x.attempts == 1);
    CHECK(c.x.backend_used == f.backend_index(1));
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    CHECK(f.policy.failures_of(f.backend_index(1)) == 0);
  }

  TEST_CASE("a refused connect with nowhere else to go is answered by sluice") {
    SUBCASE("no retry allowed: 502, the backend unavailable") {
      shard_fixture f(group("\"{b0}\"", "upstream = { max_retries = 0 }"), {false});
      call& c = f.start(k_chat);
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      CHECK(c.codec.answer_status == 502);
      CHECK(c.codec.answer_code == "bad_gateway");
      CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    }
    SUBCASE("a retry allowed, but the group's one backend was tried: 503, no backend") {
      shard_fixture f(group("\"{b0}\""), {false});
      call& c = f.start(k_chat);
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      CHECK(c.codec.answer_status == 503);
      CHECK(c.codec.answer_code == "no_backend");
      CHECK_FALSE(c.codec.head_sent);
    }
  }

  TEST_CASE("a backend that drops the connection after the request was sent is never sent it again: 502") {
    shard_fixture f(group("\"{b0}\", \"{b1}\""), {true, true});
    call& c = f.start(k_chat, {.pinned = f.backend_index(0)});
    std::string req;
    const size_t conn = f.await_request(0, req);
    SUBCASE("reset") { f.backend().reset(conn); }
    SUBCASE("closed") { f.backend().close_conn(conn); }
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.answer_status == 502);
    CHECK(c.codec.answer_code == "upstream_reset");
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    CHECK_FALSE(f.backend(1).try_accept());  // the other backend never got it
  }

  TEST_CASE("a 502 or 503 before anything reached the client goes to the next backend") {
    shard_fixture f(group("\"{b0}\", \"{b1}\""), {true, true});
    call& c = f.start(k_chat, {.pinned = f.backend_index(0)});
    f.serve(c, {json_reply(R"({"object":"error","message":"busy","type":"ServiceUnavailable","code":503})",
                           "503 Service Unavailable")});
    f.serve(c, {json_reply(k_reply_body)}, 1);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.done);
    CHECK(c.codec.head_status == 200);
    CHECK(c.codec.sent == k_reply_body);
    CHECK(c.x.attempts == 1);
    // It answered: reachable, whatever it said.
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
    CHECK(f.pump([&] { return f.backend(0).peer_closed(0); }));  // its body unread: not pooled
  }

  TEST_CASE("a backend's error answer is reshaped into OpenAI's, its retry advice passed on") {
    shard_fixture f(group("\"{b0}\""));
    const std::string body = R"({"object":"error","message":"Too many requests.","type":"RateLimitError","param":null,"code":429})";
    call& c = f.start(k_chat);
    f.serve(c, {json_reply(body, "429 Too Many Requests", "retry-after: 7\r\n")});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.answered);
    CHECK_FALSE(c.codec.head_sent);  // nothing of the backend's own went out
    CHECK(c.codec.answer_status == 429);
    CHECK(c.codec.answer_code == "upstream_error");
    CHECK(c.codec.answer_extra == "retry-after: 7\r\n");
    const json j(c.codec.answer_body);
    CHECK(str(j.root["error"]["message"]) == "Too many requests.");
    CHECK(j.root["error"]["type"].is_string());
    SUBCASE("and the connection, its body read whole, is pooled") {
      call& next = f.start(k_chat);
      f.serve(next, {json_reply(k_reply_body)});
      CHECK(f.last_conn == 0);
    }
  }

  TEST_CASE("a backend's 401 is its credentials refused, not the client's: 502") {
    shard_fixture f(group("\"{b0}\""));
    call& c = f.start(k_chat);
    f.serve(c, {json_reply(R"({"error":"Unauthorized"})", "401 Unauthorized")});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.answer_status == 502);
  }

  TEST_CASE("bytes that are no HTTP response: 502, not retried") {
    shard_fixture f(group("\"{b0}\", \"{b1}\""), {true, true});
    call& c = f.start(k_chat, {.pinned = f.backend_index(0)});
    f.serve(c, {"SSH-2.0-OpenSSH\r\n\r\n"});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.answer_status == 502);
    CHECK(c.codec.answer_code == "bad_gateway");
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    CHECK_FALSE(f.backend(1).try_accept());
  }

  TEST_CASE("no first byte before the deadline: 504, and the backend's connection is cut") {
    shard_fixture f(group("\"{b0}\""));
    call& c = f.start(k_chat);
    std::string req;
    const size_t conn = f.await_request(0, req);
    REQUIRE(c.codec.backend_waits.back() == sluice::proxy::deadline_kind::upstream_first_byte);
    c.x.adapter->on_timeout(c.x);  // what the codec's timer does
    CHECK(c.codec.answer_status == 504);
    CHECK(c.codec.answer_code == "upstream_timeout");
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    CHECK(f.pump([&] { return f.backend().peer_closed(conn); }));
  }

  TEST_CASE("a backend that closes mid-stream: the client's response is cut, with no [DONE] made up") {
    shard_fixture f(group("\"{b0}\""));
    call& c = f.start(k_stream);
    const std::string role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
    const std::string text = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    f.serve(c, {k_sse_head + chunked({role}, false), chunked({text}, false) + "1a\r\ndata: {\"choices\":"});
    CHECK(c.codec.head_sent);
    SUBCASE("closed") { f.backend().close_conn(f.last_conn); }
    SUBCASE("reset") { f.backend().reset(f.last_conn); }
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.failed);
    CHECK_FALSE(c.codec.done);
    CHECK(c.x.error_code == "upstream_truncated");
    std::string payload;
    CHECK_FALSE(dechunk(c.codec.sent, payload));  // no terminal chunk: the client sees the cut
    CHECK(c.codec.sent == chunked({role, text}, false));
    CHECK(c.codec.sent.find("[DONE]") == std::string::npos);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
  }
}
