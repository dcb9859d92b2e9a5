// anthropic_http on openai_http's transport: the Messages request it writes
// and the reply translated into the OpenAI chat shape the client asked in --
// a stream's events as chat chunks (usage, finish, [DONE]), a whole message
// as a chat.completion, an error in OpenAI's shape.
#include "adapter_fixture.hpp"

#include <cstdlib>

using namespace sluice::adapters_test;

namespace {

constexpr std::string_view k_group = R"(
[[group]]
name = "claude"
models = ["claude-*"]
protocol = "anthropic"
backend_model = "claude-x"
api_key_env = "SLUICE_ADAPTERS_TEST_ANTHROPIC_KEY"
backends = [BACKENDS]
)";

std::string config(std::string_view backends = "\"{b0}\"") {
  std::string g(k_group);
  g.replace(g.find("BACKENDS"), 8, backends);
  ::setenv("SLUICE_ADAPTERS_TEST_ANTHROPIC_KEY", "anthropic-secret", 1);
  return g;
}

constexpr std::string_view k_stream = R"({"model":"claude-1","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]})";
constexpr std::string_view k_chat = R"({"model":"claude-1","max_tokens":50,"messages":[{"role":"user","content":"hi"}]})";

std::string event(std::string_view name, std::string_view data) {
  return "event: " + std::string(name) + "\ndata: " + std::string(data) + "\n\n";
}

// A Messages stream: two text deltas, 25 tokens in, 15 out.
const std::vector<std::string> k_events = {
    event("message_start",
          R"({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}})"),
    event("content_block_start", R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"),
    event("ping", R"({"type":"ping"})"),
    event("content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}})"),
    event("content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}})"),
    event("content_block_stop", R"({"type":"content_block_stop","index":0})"),
    event("message_delta", R"({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}})"),
    event("message_stop", R"({"type":"message_stop"})"),
};

std::string json_reply(std::string_view body, std::string_view status = "200 OK") {
  return response_head(status, "content-type: application/json\r\ncontent-length: " + std::to_string(body.size()) +
                                   "\r\n") +
         std::string(body);
}

// The chat chunks a client read: role, the two texts, the finish, then
// the usage chunk when `usage`, then [DONE].
void check_chat_stream(const call& c, bool usage) {
  std::string payload;
  REQUIRE(dechunk(c.codec.sent, payload));
  const std::vector<std::string> events = sse_data(payload);
  REQUIRE(events.size() == (usage ? 6u : 5u));
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    CAPTURE(events[i]);
    const json j(events[i]);
    CHECK(str(j.root["object"]) == "chat.completion.chunk");
    CHECK(str(j.root["model"]) == "claude-1");  // the client's model, not the backend's
    CHECK(str(j.root["id"]) == "chatcmpl-" + c.request_id);
    simdjson::dom::array choices;
    REQUIRE(j.root["choices"].get_array().get(choices) == simdjson::SUCCESS);
    if (choices.size() == 0) continue;
    std::string_view s;
    if (choices.at(0)["delta"]["content"].get_string().get(s) == simdjson::SUCCESS) text += s;
  }
  CHECK(str(json(events[0]).root["choices"].at(0)["delta"]["role"]) == "assistant");
  CHECK(text == "Hello world");
  CHECK(str(json(events[3]).root["choices"].at(0)["finish_reason"]) == "stop");
  if (usage) {
    const json u(events[4]);
    CHECK(int64_t(u.root["usage"]["prompt_tokens"]) == 25);
    CHECK(int64_t(u.root["usage"]["completion_tokens"]) == 15);
    CHECK(int64_t(u.root["usage"]["total_tokens"]) == 40);
  }
  CHECK(events.back() == "[DONE]");
  // What billing and audit read.
  const sluice::proxy::stream_facts& s = c.x.rsp.facts;
  CHECK(s.prompt_tokens == 25);
  CHECK(s.completion_tokens == 15);
  CHECK(s.done);
  CHECK_FALSE(s.error);
  CHECK(std::string_view(s.finish_reason, s.finish_reason_len) == "stop");
}

}  // namespace

TEST_SUITE("adapters::anthropic_http") {
  TEST_CASE("the backend gets a Messages request under sluice's head; the client's key stays behind") {
    shard_fixture f(config());
    call& c = f.start(k_stream, {.headers = "authorization: Bearer sk-client\r\nx-api-key: sk-client\r\n"},
                      f.anthropic.get());
    const parsed_request r(f.serve(c, {k_sse_head + chunked(k_events)}));
    CHECK(r.request_line == "POST /v1/messages HTTP/1.1");
    CHECK(r.value("host") == "127.0.0.1:" + std::to_string(f.backend().port));
    CHECK(r.value("anthropic-version") == "2023-06-01");
    CHECK(r.values("x-api-key") == std::vector<std::string>{"anthropic-secret"});
    CHECK(r.values("authorization").empty());
    CHECK(r.value("x-request-id") == c.request_id);
    CHECK(r.value("content-length") == std::to_string(r.body.size()));
    const json j(r.body);
    CHECK(str(j.root["model"]) == "claude-x");
    CHECK(int64_t(j.root["max_tokens"]) == 50);
    CHECK(bool(j.root["stream"]));
    CHECK(str(j.root["messages"].at(0)["role"]) == "user");
    CHECK(j.root["stream_options"].error() == simdjson::NO_SUCH_FIELD);  // nothing of OpenAI's own
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
  }

  TEST_CASE("a Messages stream comes out as OpenAI chat chunks, usage and finish right, wherever it is split") {
    shard_fixture f(config());
    const std::string reply = k_sse_head + chunked(k_events);
    for (size_t split = 5; split < reply.size(); split += 9) {
      CAPTURE(split);
      call& c = f.start(k_stream, {}, f.anthropic.get());
      f.serve(c, {reply.substr(0, split), reply.substr(split)});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      REQUIRE(c.codec.done);
      CHECK(c.codec.head_status == 200);
      CHECK(c.codec.field("content-type").starts_with("text/event-stream"));
      check_chat_stream(c, false);
    }
    CHECK(f.backend().conns.size() == 1);  // the pooled connection took every one
  }

  TEST_CASE("a client that asked for usage gets its usage chunk; several events in one chunk read the same") {
    shard_fixture f(config());
    std::string all;
    for (const std::string& e : k_events) all += e;
    call& c = f.start(R"({"model":"claude-1","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"messages":[{"role":"user","content":"hi"}]})",
                      {}, f.anthropic.get());
    f.serve(c, {k_sse_head + chunked({all.substr(0, 300), all.substr(300)})});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.done);
    check_chat_stream(c, true);
  }

  TEST_CASE("an HTTP/1.0 client gets the translated chunks without chunk framing") {
    shard_fixture f(config());
    call& c = f.start(k_stream, {.http10 = true}, f.anthropic.get());
    f.serve(c, {k_sse_head + chunked(k_events)});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.done);
    CHECK(c.codec.head_dechunked);
    const std::vector<std::string> events = sse_data(c.codec.sent);
    REQUIRE(events.size() == 5);
    CHECK(events.back() == "[DONE]");
    CHECK(c.x.rsp.facts.completion_tokens == 15);
  }

  TEST_CASE("a whole message is answered as a chat.completion with its usage") {
    shard_fixture f(config());
    call& c = f.start(k_chat, {}, f.anthropic.get());
    f.serve(c, {json_reply(
                   R"({"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hello world"}],)"
                   R"("stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":50}})")});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK(c.codec.answer_status == 200);
    const json j(c.codec.answer_body);
    CHECK(str(j.root["object"]) == "chat.completion");
    CHECK(str(j.root["model"]) == "claude-1");
    CHECK(str(j.root["choices"].at(0)["message"]["content"]) == "Hello world");
    CHECK(str(j.root["choices"].at(0)["finish_reason"]) == "length");
    CHECK(int64_t(j.root["usage"]["prompt_tokens"]) == 12);
    CHECK(int64_t(j.root["usage"]["completion_tokens"]) == 50);
    CHECK(c.x.rsp.facts.prompt_tokens == 12);
    CHECK(c.x.rsp.facts.completion_tokens == 50);
    CHECK(c.x.rsp.answered_ok);
  }

  TEST_CASE("Anthropic's error answer is reshaped into OpenAI's") {
    shard_fixture f(config());
    call& c = f.start(k_stream, {}, f.anthropic.get());
    f.serve(c, {json_reply(R"({"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}})",
                           "400 Bad Request")});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK_FALSE(c.codec.head_sent);
    CHECK(c.codec.answer_status == 400);
    const json j(c.codec.answer_body);
    CHECK(str(j.root["error"]["message"]) == "max_tokens: too large");
    CHECK(str(j.root["error"]["type"]) == "invalid_request_error");
  }

  TEST_CASE("Anthropic's 529 overloaded goes to the next backend, as a 503 does") {
    shard_fixture f(config("\"{b0}\", \"{b1}\""), {true, true});
    call& c = f.start(k_stream, {.pinned = f.backend_index(0)}, f.anthropic.get());
    f.serve(c, {json_reply(R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})", "529 Overloaded")});
    f.serve(c, {k_sse_head + chunked(k_events)}, 1);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.done);
    CHECK(c.x.attempts == 1);
    check_chat_stream(c, false);
  }

  TEST_CASE("a stream the backend cuts short ends the client's response without a made-up [DONE]") {
    shard_fixture f(config());
    call& c = f.start(k_stream, {}, f.anthropic.get());
    f.serve(c, {k_sse_head + chunked({k_events[0], k_events[1], k_events[3]}, false)});
    f.backend().close_conn(f.last_conn);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.failed);
    CHECK_FALSE(c.codec.done);
    CHECK(c.codec.sent.find("Hello") != std::string::npos);  // what came before the cut went out
    CHECK(c.codec.sent.find("[DONE]") == std::string::npos);
    CHECK_FALSE(c.x.rsp.facts.done);
  }

  TEST_CASE("an embeddings request cannot go to a Messages backend: 400 before any connection") {
    shard_fixture f(config());
    call& c = f.start(R"({"model":"claude-1","input":"hi"})", {.path = "/v1/embeddings"}, f.anthropic.get());
    CHECK(c.codec.answer_status == 400);
    CHECK(c.codec.answer_code == "unsupported_endpoint");
    CHECK_FALSE(f.backend().try_accept());
  }
}
