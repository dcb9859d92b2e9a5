// openai_http's pass-through: the request the backend gets (sluice's head,
// the client's body with at most two edits) and the relay of its reply --
// a JSON body, an event stream in chunked framing cut into pieces at every
// place, the usage event sluice asked for cut out whatever its shape.
#include "adapter_fixture.hpp"

#include <cstdlib>

using namespace sluice::adapters_test;

namespace {

constexpr std::string_view k_group = k_chat_group;

constexpr std::string_view k_chat = R"({"model":"chat-1","messages":[{"role":"user","content":"hello"}],"max_tokens":10})";
constexpr std::string_view k_stream = k_chat_stream;

const std::string k_reply_body =
    R"({"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},)"
    R"("finish_reason":"stop"}],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2}})";

std::string json_reply(std::string_view body, std::string_view extra = {}) {
  return response_head("200 OK", "content-type: application/json\r\n" + std::string(extra) +
                                     "content-length: " + std::to_string(body.size()) + "\r\n") +
         std::string(body);
}


// vLLM's stream, one event per chunk: role, two deltas, the finish, the
// usage event asked for, [DONE].
std::string chunk_event(std::string_view delta, std::string_view finish = "null") {
  return R"(data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"chat-1","choices":[{"index":0,"delta":)" +
         std::string(delta) + R"(,"logprobs":null,"finish_reason":)" + std::string(finish) + "}]}\n\n";
}
const std::string k_role = chunk_event(R"({"role":"assistant","content":""})");
const std::string k_hel = chunk_event(R"({"content":"Hel"})");
const std::string k_lo = chunk_event(R"({"content":"lo"})");
const std::string k_finish = chunk_event(R"({"content":""})", "\"stop\"");
const std::string k_usage =
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"chat-1\",\"choices\":[],"
    "\"usage\":{\"prompt_tokens\":7,\"total_tokens\":10,\"completion_tokens\":3}}\n\n";
const std::string k_done = "data: [DONE]\n\n";

std::string data_of(const std::string& event) { return sse_data(event).at(0); }

// The events a client of a cut stream reads: every one but the usage event.
const std::vector<std::string> k_uncut_events = {data_of(k_role), data_of(k_hel), data_of(k_lo), data_of(k_finish),
                                                 "[DONE]"};

// The client's response is a whole chunked body; returns its events.
std::vector<std::string> client_events(const call& c) {
  std::string payload;
  CHECK(dechunk(c.codec.sent, payload));
  return sse_data(payload);
}

}  // namespace

TEST_SUITE("adapters::openai_http request") {
  TEST_CASE("the backend gets sluice's head: its own host, the group's key, the ids; no hop-by-hop field, no client key") {
    ::setenv("SLUICE_ADAPTERS_TEST_KEY", "backend-secret", 1);
    shard_fixture f(std::string(k_group) + "api_key_env = \"SLUICE_ADAPTERS_TEST_KEY\"\n");
    call& c = f.start(k_chat, {.headers = "authorization: Bearer sk-client\r\nx-api-key: sk-client\r\n"
                                          "x-request-id: chosen-by-client\r\nx-forwarded-for: 10.0.0.1\r\n"
                                          "connection: keep-alive, x-hop\r\nx-hop: 1\r\nkeep-alive: timeout=5\r\n"
                                          "te: trailers\r\nx-custom: kept\r\n"});
    const parsed_request r(f.serve(c, {json_reply(k_reply_body)}));
    CHECK(r.request_line == "POST /v1/chat/completions HTTP/1.1");
    CHECK(r.value("host") == "127.0.0.1:" + std::to_string(f.backend().port));
    CHECK(r.values("authorization") == std::vector<std::string>{"Bearer backend-secret"});
    CHECK(r.values("x-api-key").empty());
    CHECK(r.value("x-request-id") == c.request_id);
    CHECK(r.value("x-forwarded-for") == "10.0.0.1, 192.0.2.7");
    for (std::string_view hop : {"connection", "x-hop", "keep-alive", "te"}) {
      CAPTURE(hop);
      CHECK(r.values(hop).empty());
    }
    CHECK(r.value("x-custom") == "kept");
    CHECK(r.value("content-type") == "application/json");
    CHECK(r.value("content-length") == std::to_string(r.body.size()));
    CHECK(r.body == k_chat);  // a non-stream request without a backend model: the client's bytes
    CHECK(f.pump([&] { return c.codec.ended(); }));
  }

  TEST_CASE("without a group key the client's credential is not replaced by anything") {
    shard_fixture f(k_group);
    call& c = f.start(k_chat, {.headers = "authorization: Bearer sk-client\r\n"});
    const parsed_request r(f.serve(c, {json_reply(k_reply_body)}));
    CHECK(r.values("authorization").empty());
    CHECK(r.value("x-forwarded-for") == "192.0.2.7");
  }

  TEST_CASE("a stream whose client did not ask for usage gets it asked for; the group's backend model replaces the model") {
    shard_fixture f(std::string(k_group) + "backend_model = \"org/served\"\n");
    SUBCASE("no stream_options: the member goes in first") {
      call& c = f.start(k_stream);
      const parsed_request r(f.serve(c, {k_sse_head + chunked({k_role, k_done})}));
      CHECK(r.body == R"({"stream_options":{"include_usage":true},"model":"org/served","stream":true,"messages":[{"role":"user","content":"hi"}]})");
      CHECK(r.value("content-length") == std::to_string(r.body.size()));
      CHECK(c.x.rsp.cut_usage);
    }
    SUBCASE("the client's other stream options stay") {
      call& c = f.start(R"({"model":"chat-1","stream":true,"stream_options":{"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]})");
      const parsed_request r(f.serve(c, {k_sse_head + chunked({k_role, k_done})}));
      const json j(r.body);
      CHECK(str(j.root["model"]) == "org/served");
      CHECK(bool(j.root["stream_options"]["include_usage"]));
      CHECK(bool(j.root["stream_options"]["continuous_usage_stats"]));
    }
    SUBCASE("an explicit include_usage false is replaced") {
      call& c = f.start(R"({"model":"chat-1","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]})");
      const parsed_request r(f.serve(c, {k_sse_head + chunked({k_role, k_done})}));
      CHECK(r.body == R"({"model":"org/served","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]})");
    }
    SUBCASE("a client that asked for usage: nothing to cut, only the model edited") {
      call& c = f.start(R"({"model":"chat-1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]})");
      const parsed_request r(f.serve(c, {k_sse_head + chunked({k_role, k_done})}));
      CHECK(r.body == R"({"model":"org/served","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]})");
      CHECK_FALSE(c.x.rsp.cut_usage);
    }
  }

  TEST_CASE("a group with inject_usage off forwards a stream's body as the client wrote it") {
    shard_fixture f(std::string(k_group) + "inject_usage = false\n");
    call& c = f.start(k_stream);
    const parsed_request r(f.serve(c, {k_sse_head + chunked({k_role, k_done})}));
    CHECK(r.body == k_stream);
    CHECK_FALSE(c.x.rsp.cut_usage);
  }
}

TEST_SUITE("adapters::openai_http relay") {
  TEST_CASE("a JSON reply passes with its status and end-to-end fields; its body is kept for the usage") {
    shard_fixture f(k_group);
    const std::string reply = json_reply(k_reply_body, "x-backend-field: b1\r\n");
    SUBCASE("in one piece") {
      call& c = f.start(k_chat);
      f.serve(c, {reply});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      CHECK(c.codec.done);
      CHECK(c.codec.head_status == 200);
      CHECK(c.codec.field("x-backend-field") == "b1");
      CHECK(c.codec.field("content-length") == std::to_string(k_reply_body.size()));
      CHECK(c.codec.sent == k_reply_body);
      CHECK(c.x.status == 200);
      const std::string_view kept(c.mem.body.data, c.mem.body.len);
      CHECK(kept == k_reply_body);
      const sluice::openai::usage u = sluice::openai::scan_response_usage(kept);
      CHECK(u.prompt_tokens == 9);
      CHECK(u.completion_tokens == 2);
    }
    SUBCASE("cut inside the head and inside the body") {
      call& c = f.start(k_chat);
      const size_t head_cut = 20, body_cut = reply.size() - 30;
      f.serve(c, {reply.substr(0, head_cut), reply.substr(head_cut, body_cut - head_cut), reply.substr(body_cut)});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      CHECK(c.codec.done);
      CHECK(c.codec.sent == k_reply_body);
      CHECK(std::string_view(c.mem.body.data, c.mem.body.len) == k_reply_body);
    }
    // The backend answered: a success for passive health.
    REQUIRE(f.policy.outcomes.size() == 1);
    CHECK_FALSE(f.policy.outcomes[0].failure);
  }

  TEST_CASE("a body delimited by the backend's close ends with it, and the connection is not pooled") {
    shard_fixture f(k_group);
    call& c = f.start(k_chat);
    f.serve(c, {response_head("200 OK", "content-type: application/json\r\nconnection: close\r\n") + k_reply_body});
    CHECK_FALSE(c.codec.done);  // no length: more may come
    f.backend().close_conn(f.last_conn);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.done);
    CHECK(c.codec.sent == k_reply_body);
    call& next = f.start(k_chat);
    f.serve(next, {json_reply(k_reply_body)});
    CHECK(f.backend().conns.size() == 2);  // a new connection
  }

  TEST_CASE("a stream passes whole wherever the backend's writes split it; the usage sluice asked for is cut") {
    shard_fixture f(k_group);
    const std::string reply = k_sse_head + chunked({k_role, k_hel, k_lo, k_finish, k_usage, k_done});
    // Every place a two-piece write can split it, each on the pooled
    // connection of the one before.
    for (size_t split = 1; split < reply.size(); ++split) {
      CAPTURE(split);
      call& c = f.start(k_stream);
      f.serve(c, {reply.substr(0, split), reply.substr(split)});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      REQUIRE(c.codec.done);
      CHECK(c.codec.head_status == 200);
      CHECK_FALSE(c.codec.head_dechunked);
      CHECK(client_events(c) == k_uncut_events);
      CHECK(c.x.rsp.facts.prompt_tokens == 7);
      CHECK(c.x.rsp.facts.completion_tokens == 3);
      CHECK(c.x.rsp.facts.done);
      CHECK(c.x.rsp.facts.events == 6);
      CHECK(c.x.rsp.facts.content_events == 2);
      CHECK(std::string_view(c.x.rsp.facts.finish_reason, c.x.rsp.facts.finish_reason_len) == "stop");
    }
    CHECK(f.backend().conns.size() == 1);  // every reply kept alive: one connection served them all
  }

  TEST_CASE("a stream written a byte at a time is relayed as it was written in one piece") {
    shard_fixture f(k_group);
    const std::string reply = k_sse_head + chunked({k_role, k_hel, k_lo, k_finish, k_usage, k_done});
    call& c = f.start(k_stream);
    std::vector<std::string> bytes;
    for (const char ch : reply) bytes.emplace_back(1, ch);
    f.serve(c, bytes);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.done);
    CHECK(client_events(c) == k_uncut_events);
    CHECK(c.x.rsp.facts.prompt_tokens == 7);
    CHECK(c.x.rsp.facts.completion_tokens == 3);
    CHECK(c.codec.sends > 5);  // relayed as it came, not held to the end
  }

  TEST_CASE("a client that asked for usage gets the backend's body byte for byte") {
    shard_fixture f(k_group);
    const std::string body = chunked({k_role, k_hel, k_finish, k_usage, k_done});
    call& c = f.start(R"({"model":"chat-1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]})");
    f.serve(c, {k_sse_head + body.substr(0, 100), body.substr(100)});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.sent == body);
    CHECK(c.x.rsp.facts.prompt_tokens == 7);
  }

  TEST_CASE("the usage event is cut whatever its shape") {
    struct row {
      const char* name;
      std::vector<std::string> chunks;
    };
    const std::string crlf_usage =
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
        "\"completion_tokens\":3,\"total_tokens\":10}}\r\n\r\n";
    const std::string spaced_usage =
        "data: {\"id\": \"c1\", \"choices\": [], \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 3, "
        "\"total_tokens\": 10}}\n\n";
    auto crlf = [](std::string e) {
      e.resize(e.size() - 2);
      return e + "\r\n\r\n";
    };
    const std::vector<row> rows = {
        {"in a chunk of its own", {k_role, k_hel, k_lo, k_finish, k_usage, k_done}},
        {"sharing a chunk with the finish and [DONE]", {k_role, k_hel, k_lo, k_finish + k_usage + k_done}},
        {"sharing a chunk with the event before it", {k_role, k_hel, k_lo, k_finish + k_usage, k_done}},
        {"with CRLF line ends", {crlf(k_role), crlf(k_hel), crlf(k_lo), crlf(k_finish), crlf_usage, crlf(k_done)}},
        {"with spaces in its JSON", {k_role, k_hel, k_lo, k_finish, spaced_usage, k_done}},
        {"over two chunks", {k_role, k_hel, k_lo, k_finish, k_usage.substr(0, 40), k_usage.substr(40), k_done}},
    };
    for (const row& r : rows) {
      CAPTURE(std::string(r.name));
      shard_fixture f(k_group);
      const std::string reply = k_sse_head + chunked(r.chunks);
      for (size_t split = k_sse_head.size() - 3; split < reply.size(); ++split) {
        CAPTURE(split);
          call& c = f.start(k_stream);
        f.serve(c, {reply.substr(0, split), reply.substr(split)});
        REQUIRE(f.pump([&] { return c.codec.ended(); }));
        REQUIRE(c.codec.done);
        CHECK(client_events(c) == k_uncut_events);
        CHECK(c.x.rsp.facts.prompt_tokens == 7);
        CHECK(c.x.rsp.facts.completion_tokens == 3);
      }
    }
  }

  TEST_CASE("an HTTP/1.0 client gets the stream's payload without chunk framing, the usage cut") {
    shard_fixture f(k_group);
    const std::string reply = k_sse_head + chunked({k_role, k_hel, k_lo, k_finish, k_usage, k_done});
    for (size_t split : {size_t{10}, k_sse_head.size() + 5, reply.size() - 60, reply.size() - 3}) {
      CAPTURE(split);
      call& c = f.start(k_stream, {.http10 = true});
      f.serve(c, {reply.substr(0, split), reply.substr(split)});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      REQUIRE(c.codec.done);
      CHECK(c.codec.head_dechunked);
      CHECK(c.codec.sent.find("\r\n") == std::string::npos);  // no chunk size line
      CHECK(sse_data(c.codec.sent) == k_uncut_events);
      CHECK(c.x.rsp.facts.prompt_tokens == 7);
    }
  }

  TEST_CASE("after [DONE] the client's response ends at once; the backend's terminal chunk is waited for to pool") {
    shard_fixture f(k_group);
    call& c = f.start(k_stream);
    f.serve(c, {k_sse_head + chunked({k_role, k_hel, k_usage, k_done}, false)});
    CHECK_FALSE(c.codec.done);
    std::string payload;
    CHECK(dechunk(c.codec.sent, payload));  // sluice's own terminal chunk
    CHECK(sse_data(payload) == std::vector<std::string>{data_of(k_role), data_of(k_hel), "[DONE]"});
    SUBCASE("the terminal chunk comes: pooled") {
      f.write_settled(c, f.last_conn, "0\r\n\r\n");
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      CHECK(c.codec.done);
      CHECK(c.codec.sent.ends_with("0\r\n\r\n"));
      CHECK(c.codec.sent.find("0\r\n\r\n") == c.codec.sent.size() - 5);  // only one
      call& next = f.start(k_chat);
      f.serve(next, {json_reply(k_reply_body)});
      CHECK(f.backend().conns.size() == 1);
    }
    SUBCASE("it does not come in time: the exchange ends, the connection closes") {
      c.x.adapter->on_timeout(c.x);
      CHECK(c.codec.done);
      CHECK_FALSE(c.codec.failed);
      CHECK(f.pump([&] { return f.backend().peer_closed(f.last_conn); }));
      CHECK(f.policy.failures_of(f.backend_index(0)) == 0);  // nothing failed for the client
    }
  }

  TEST_CASE("fair admission's counter moves with every batch relayed") {
    shard_fixture f(k_group);
    call& c = f.start(k_stream);
    c.x.adm.running = true;
    f.serve(c, {k_sse_head + chunked({k_role}, false), chunked({k_hel}, false), chunked({k_done})});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(f.policy.fair_progress_calls == c.codec.sends);
    CHECK(c.codec.sends >= 3);
  }
}
