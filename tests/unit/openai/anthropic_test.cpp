// The Anthropic translators: OpenAI requests in, Anthropic requests out;
// Anthropic replies and recorded streams in, OpenAI bodies and chunks out.
// Outputs are parsed back (simdjson) where key order does not matter, and
// compared byte for byte with what mock-vllm writes for vLLM where the
// shapes are meant to be the same.
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "sluice/openai/anthropic.hpp"
#include "vllm_reference.hpp"

using namespace sluice::openai;
using simdjson::dom::element;

namespace {

struct parsed {
  simdjson::dom::parser parser;
  element root;
  explicit parsed(const std::string& s) { REQUIRE(parser.parse(s).get(root) == simdjson::SUCCESS); }
};

std::string str(element e) { return std::string(std::string_view(e.get_string().value())); }

// `body` through the writer's chat or completions path.
bool write_request(anthropic_request_writer& writer, endpoint kind, std::string_view body, int64_t max_tokens_default,
                   std::string& out, request_error& err) {
  const anthropic_request_options opts{"claude-x", max_tokens_default};
  return kind == endpoint::completions ? writer.write_completion(body, opts, out, err)
                                       : writer.write(body, opts, out, err);
}

// Translates `body`; REQUIREs success.
std::string to_anthropic(std::string_view body, int64_t max_tokens_default = 512,
                         endpoint kind = endpoint::chat_completions) {
  anthropic_request_writer writer;
  std::string out;
  request_error err;
  const bool ok = write_request(writer, kind, body, max_tokens_default, out, err);
  INFO(err.message);
  REQUIRE(ok);
  return out;
}

request_error refused(std::string_view body, endpoint kind = endpoint::chat_completions) {
  static anthropic_request_writer writer;  // the error's views point into it
  std::string out;
  request_error err;
  CHECK_FALSE(write_request(writer, kind, body, 512, out, err));
  return err;
}

struct sse_event {
  std::string_view event;
  std::string_view data;
};

// Feeds a recorded stream; returns each OpenAI SSE event's data (without
// "data: " and the blank line) and the last feed's status.
std::vector<std::string> translate(anthropic_stream& s, const std::vector<sse_event>& events,
                                   anthropic_stream_status& last) {
  std::vector<std::string> out;
  char buf[4096];
  for (const sse_event& e : events) {
    anthropic_stream_result r = s.feed(e.event, e.data, buf, sizeof(buf));
    last = r.status;
    if (r.status != anthropic_stream_status::ok) break;
    std::string_view bytes(buf, r.written);
    while (!bytes.empty()) {
      REQUIRE(bytes.starts_with("data: "));
      size_t end = bytes.find("\n\n");
      REQUIRE(end != std::string_view::npos);
      out.emplace_back(bytes.substr(6, end - 6));
      bytes.remove_prefix(end + 2);
    }
  }
  return out;
}

const anthropic_reply_context k_ctx{"req1", 1700000000, "my-model", false};

const std::vector<sse_event> k_text_stream = {
    {"message_start",
     R"({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}})"},
    {"content_block_start", R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"},
    {"ping", R"({"type": "ping"})"},
    {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}})"},
    {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" \"world\"\n"}})"},
    {"content_block_stop", R"({"type":"content_block_stop","index":0})"},
    {"message_delta", R"({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}})"},
    {"message_stop", R"({"type":"message_stop"})"},
};

}  // namespace

TEST_SUITE("openai::anthropic request") {
  TEST_CASE("system messages become the top-level system and turns keep their order") {
    std::string out = to_anthropic(
        R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"developer","content":[{"type":"text","text":"no emoji"}]},)"
        R"({"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"},{"role":"user","content":"again"}]})");
    parsed p(out);
    CHECK(str(p.root["model"]) == "claude-x");
    CHECK(int64_t(p.root["max_tokens"]) == 512);
    auto system = p.root["system"].get_array().value();
    REQUIRE(system.size() == 2);
    CHECK(str(system.at(0)["text"]) == "be brief");
    CHECK(str(system.at(1)["text"]) == "no emoji");
    auto messages = p.root["messages"].get_array().value();
    REQUIRE(messages.size() == 3);  // the two last user messages share one turn
    CHECK(str(messages.at(0)["role"]) == "user");
    CHECK(str(messages.at(1)["role"]) == "assistant");
    CHECK(str(messages.at(1)["content"].at(0)["text"]) == "hello");
    CHECK(messages.at(2)["content"].get_array().value().size() == 2);
    CHECK(p.root["stream"].error() == simdjson::NO_SUCH_FIELD);
  }

  TEST_CASE("user becomes metadata.user_id") {
    parsed p(to_anthropic(R"({"model":"m","user":"u-42","messages":[{"role":"user","content":"x"}]})"));
    CHECK(str(p.root["metadata"]["user_id"]) == "u-42");
  }

  TEST_CASE("max_tokens, sampling, stop and stream are carried") {
    SUBCASE("stop as a string, max_tokens given") {
      parsed p(to_anthropic(
          R"({"model":"m","max_tokens":77,"temperature":0.5,"top_p":0.9,"stop":"END","stream":true,"messages":[{"role":"user","content":"x"}]})"));
      CHECK(int64_t(p.root["max_tokens"]) == 77);
      CHECK(double(p.root["temperature"]) == 0.5);
      CHECK(double(p.root["top_p"]) == 0.9);
      CHECK(str(p.root["stop_sequences"].at(0)) == "END");
      CHECK(bool(p.root["stream"]));
    }
    SUBCASE("stop as an array, max_completion_tokens wins") {
      parsed p(to_anthropic(
          R"({"model":"m","max_tokens":5,"max_completion_tokens":9,"stop":["a","b"],"messages":[{"role":"user","content":"x"}]})"));
      CHECK(int64_t(p.root["max_tokens"]) == 9);
      CHECK(p.root["stop_sequences"].get_array().value().size() == 2);
    }
    SUBCASE("missing max_tokens takes the caller's default") {
      parsed p(to_anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}]})", 4096));
      CHECK(int64_t(p.root["max_tokens"]) == 4096);
    }
  }

  TEST_CASE("tools, tool calls and tool results map to tool_use and tool_result blocks") {
    parsed p(to_anthropic(
        R"({"model":"m","tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},)"
        R"({"type":"function","function":{"name":"now"}}],"tool_choice":"required","messages":[{"role":"user","content":"weather?"},)"
        R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},)"
        R"({"id":"call_2","type":"function","function":{"name":"now","arguments":""}}]},)"
        R"({"role":"tool","tool_call_id":"call_1","content":"sunny"},{"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"noon"}]}]})"));
    auto tools = p.root["tools"].get_array().value();
    REQUIRE(tools.size() == 2);
    CHECK(str(tools.at(0)["name"]) == "get_weather");
    CHECK(str(tools.at(0)["description"]) == "Weather");
    CHECK(str(tools.at(0)["input_schema"]["properties"]["city"]["type"]) == "string");
    CHECK(str(tools.at(1)["input_schema"]["type"]) == "object");
    CHECK(str(p.root["tool_choice"]["type"]) == "any");
    auto messages = p.root["messages"].get_array().value();
    REQUIRE(messages.size() == 3);
    element use = messages.at(1)["content"].at(0);
    CHECK(str(use["type"]) == "tool_use");
    CHECK(str(use["id"]) == "call_1");
    CHECK(str(use["input"]["city"]) == "Paris");
    CHECK(messages.at(1)["content"].at(1)["input"].get_object().value().size() == 0);
    CHECK(str(messages.at(2)["role"]) == "user");
    auto results = messages.at(2)["content"].get_array().value();
    REQUIRE(results.size() == 2);  // both results in one user turn
    CHECK(str(results.at(0)["type"]) == "tool_result");
    CHECK(str(results.at(0)["tool_use_id"]) == "call_1");
    CHECK(str(results.at(0)["content"]) == "sunny");
    CHECK(str(results.at(1)["content"].at(0)["text"]) == "noon");
  }

  TEST_CASE("tool_choice maps to Anthropic's") {
    const char* rows[][2] = {{R"("auto")", "auto"}, {R"("none")", "none"}, {R"("required")", "any"},
                             {R"({"type":"function","function":{"name":"f"}})", "tool"}};
    for (auto& row : rows) {
      parsed p(to_anthropic(std::string(R"({"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":)") +
                            row[0] + R"(,"messages":[{"role":"user","content":"x"}]})"));
      CHECK(str(p.root["tool_choice"]["type"]) == row[1]);
    }
    parsed serial(to_anthropic(R"({"model":"m","parallel_tool_calls":false,"tools":[{"type":"function","function":{"name":"f"}}],)"
                               R"("messages":[{"role":"user","content":"x"}]})"));
    CHECK(str(serial.root["tool_choice"]["type"]) == "auto");
    CHECK(bool(serial.root["tool_choice"]["disable_parallel_tool_use"]));
    CHECK(refused(R"({"model":"m","tool_choice":"sometimes","messages":[{"role":"user","content":"x"}]})").param == "tool_choice");
    CHECK(refused(R"({"model":"m","tools":[{"type":"code_interpreter"}],"messages":[{"role":"user","content":"x"}]})").param == "tools[0]");
  }

  TEST_CASE("image parts become base64 or url sources") {
    parsed p(to_anthropic(
        R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what?"},)"
        R"({"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},)"
        R"({"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]}]})"));
    auto blocks = p.root["messages"].at(0)["content"].get_array().value();
    REQUIRE(blocks.size() == 3);
    CHECK(str(blocks.at(1)["source"]["type"]) == "base64");
    CHECK(str(blocks.at(1)["source"]["media_type"]) == "image/png");
    CHECK(str(blocks.at(1)["source"]["data"]) == "iVBORw0KGgo=");
    CHECK(str(blocks.at(2)["source"]["type"]) == "url");
    CHECK(str(blocks.at(2)["source"]["url"]) == "https://example.com/cat.jpg");
  }

  TEST_CASE("what cannot be carried is a 400 naming the field") {
    CHECK(refused(R"({"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]})").param ==
          "messages[0].content[0]");
    CHECK(refused(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"ftp://x"}}]}]})").param ==
          "messages[0].content[0]");
    CHECK(refused(R"({"model":"m","logprobs":true,"messages":[{"role":"user","content":"x"}]})").param == "logprobs");
    CHECK(refused(R"({"model":"m","n":2,"messages":[{"role":"user","content":"x"}]})").param == "n");
    CHECK(refused(R"({"model":"m","temperature":1.5,"messages":[{"role":"user","content":"x"}]})").param == "temperature");
    CHECK(refused(R"({"model":"m","messages":[{"role":"system","content":"only"}]})").param == "messages");
    CHECK(refused(R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"[1]"}}]}]})").param ==
          "messages[0].tool_calls[0]");
    CHECK(refused(R"({"model":"m","messages":[{"role":"function","content":"x"}]})").param == "messages[0].role");
  }
}

TEST_SUITE("openai::anthropic response") {
  TEST_CASE("a message becomes a chat.completion with joined text, tool calls and usage") {
    const std::string body =
        R"({"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi "},)"
        R"({"type":"text","text":"there"},{"type":"tool_use","id":"toolu_1","name":"get","input":{"a":[1,2]}}],)"
        R"("stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":4}})";
    std::string out;
    anthropic_outcome o;
    REQUIRE(anthropic_response_to_openai(body, k_ctx, out, o));
    CHECK(o.prompt_tokens == 10);
    CHECK(o.completion_tokens == 4);
    CHECK(o.finish_reason == "tool_calls");
    parsed p(out);
    CHECK(str(p.root["id"]) == "chatcmpl-req1");
    CHECK(str(p.root["object"]) == "chat.completion");
    CHECK(int64_t(p.root["created"]) == 1700000000);
    CHECK(str(p.root["model"]) == "my-model");
    element choice = p.root["choices"].at(0);
    CHECK(str(choice["message"]["content"]) == "Hi there");
    CHECK(str(choice["finish_reason"]) == "tool_calls");
    element call = choice["message"]["tool_calls"].at(0);
    CHECK(str(call["id"]) == "toolu_1");
    CHECK(str(call["function"]["name"]) == "get");
    CHECK(str(call["function"]["arguments"]) == R"({"a":[1,2]})");
    CHECK(int64_t(p.root["usage"]["prompt_tokens"]) == 10);
    CHECK(int64_t(p.root["usage"]["completion_tokens"]) == 4);
    CHECK(int64_t(p.root["usage"]["total_tokens"]) == 14);
  }

  TEST_CASE("prompt-cache reads and writes count as prompt tokens") {
    const std::string body =
        R"({"type":"message","content":[],"stop_reason":"end_turn","usage":{"input_tokens":3,)"
        R"("cache_creation_input_tokens":100,"cache_read_input_tokens":20,"output_tokens":2}})";
    std::string out;
    anthropic_outcome o;
    REQUIRE(anthropic_response_to_openai(body, k_ctx, out, o));
    CHECK(o.prompt_tokens == 123);
    parsed p(out);
    CHECK(p.root["choices"].at(0)["message"]["content"].is_null());
    CHECK(p.root["choices"].at(0)["message"]["tool_calls"].get_array().value().size() == 0);
    CHECK(int64_t(p.root["usage"]["total_tokens"]) == 125);
  }

  TEST_CASE("stop reasons map to finish reasons") {
    const char* rows[][2] = {{"end_turn", "stop"}, {"stop_sequence", "stop"}, {"max_tokens", "length"}, {"tool_use", "tool_calls"}};
    for (auto& row : rows) {
      std::string body = std::string(R"({"type":"message","content":[{"type":"text","text":"x"}],"stop_reason":")") + row[0] +
                         R"(","usage":{"input_tokens":1,"output_tokens":1}})";
      std::string out;
      anthropic_outcome o;
      REQUIRE(anthropic_response_to_openai(body, k_ctx, out, o));
      CHECK(o.finish_reason == row[1]);
      parsed p(out);
      CHECK(str(p.root["choices"].at(0)["finish_reason"]) == row[1]);
    }
  }

  TEST_CASE("an error body or malformed JSON is not a message") {
    std::string out;
    anthropic_outcome o;
    CHECK_FALSE(anthropic_response_to_openai(R"({"type":"error","error":{"type":"api_error","message":"x"}})", k_ctx, out, o));
    CHECK_FALSE(anthropic_response_to_openai(R"({"type":"message","content":[)", k_ctx, out, o));
  }

  TEST_CASE("Anthropic error bodies map to OpenAI errors and statuses") {
    struct row {
      uint16_t status;
      const char* body;
      uint16_t want_status;
      const char* want_message;
    };
    const row rows[] = {
        {400, R"({"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}})", 400, "max_tokens: too big"},
        {401, R"({"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}})", 502, "invalid x-api-key"},
        {404, R"({"type":"error","error":{"type":"not_found_error","message":"model: claude-y"}})", 404, "model: claude-y"},
        {429, R"({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}})", 429, "slow down"},
        {529, R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})", 503, "Overloaded"},
        {500, R"({"type":"error","error":{"type":"api_error","message":"boom"}})", 502, "boom"},
        {503, "<html>not json</html>", 502, nullptr},
    };
    for (const row& r : rows) {
      char out[1024];
      uint16_t status = 0;
      size_t n = anthropic_error_to_openai(r.status, r.body, out, sizeof(out), status);
      CHECK(status == r.want_status);
      parsed p(std::string(out, n));
      if (r.want_message) CHECK(str(p.root["error"]["message"]) == r.want_message);
      CHECK(p.root["error"]["type"].is_string());
    }
  }
}

TEST_SUITE("openai::anthropic stream") {
  TEST_CASE("a text stream becomes role, content, finish, usage and [DONE] chunks") {
    anthropic_stream s;
    anthropic_reply_context ctx = k_ctx;
    ctx.include_usage = true;
    s.reset(ctx);
    anthropic_stream_status last{};
    auto chunks = translate(s, k_text_stream, last);
    CHECK(last == anthropic_stream_status::ok);
    REQUIRE(chunks.size() == 6);
    parsed role(chunks[0]);
    CHECK(str(role.root["id"]) == "chatcmpl-req1");
    CHECK(str(role.root["object"]) == "chat.completion.chunk");
    CHECK(str(role.root["model"]) == "my-model");
    CHECK(int64_t(role.root["created"]) == 1700000000);
    CHECK(str(role.root["choices"].at(0)["delta"]["role"]) == "assistant");
    CHECK(str(role.root["choices"].at(0)["delta"]["content"]) == "");
    CHECK(role.root["choices"].at(0)["finish_reason"].is_null());
    CHECK(str(parsed(chunks[1]).root["choices"].at(0)["delta"]["content"]) == "Hello");
    CHECK(str(parsed(chunks[2]).root["choices"].at(0)["delta"]["content"]) == " \"world\"\n");
    CHECK(str(parsed(chunks[3]).root["choices"].at(0)["finish_reason"]) == "stop");
    parsed usage(chunks[4]);
    CHECK(usage.root["choices"].get_array().value().size() == 0);
    CHECK(int64_t(usage.root["usage"]["prompt_tokens"]) == 25);
    CHECK(int64_t(usage.root["usage"]["completion_tokens"]) == 15);
    CHECK(int64_t(usage.root["usage"]["total_tokens"]) == 40);
    CHECK(chunks[5] == "[DONE]");
    CHECK(s.done());
    CHECK(s.outcome().prompt_tokens == 25);
    CHECK(s.outcome().completion_tokens == 15);
    CHECK(s.outcome().finish_reason == "stop");
    char buf[64];
    CHECK(s.feed("message_stop", R"({"type":"message_stop"})", buf, sizeof(buf)).status == anthropic_stream_status::ended);
  }

  TEST_CASE("without include_usage there is no usage chunk, but usage is still reported") {
    anthropic_stream s;
    s.reset(k_ctx);
    anthropic_stream_status last{};
    auto chunks = translate(s, k_text_stream, last);
    REQUIRE(chunks.size() == 5);
    CHECK(chunks[4] == "[DONE]");
    CHECK(s.outcome().completion_tokens == 15);
  }

  TEST_CASE("a reset stream starts over with the new context") {
    anthropic_stream s;
    s.reset(k_ctx);
    anthropic_stream_status last{};
    (void)translate(s, k_text_stream, last);
    anthropic_reply_context next = k_ctx;
    next.request_id = "req2";
    s.reset(next);
    CHECK_FALSE(s.done());
    CHECK(s.outcome().prompt_tokens == -1);
    auto chunks = translate(s, k_text_stream, last);
    REQUIRE(chunks.size() == 5);
    CHECK(str(parsed(chunks[0]).root["id"]) == "chatcmpl-req2");
  }

  TEST_CASE("tool use streams as tool-call deltas with argument fragments") {
    anthropic_stream s;
    s.reset(k_ctx);
    anthropic_stream_status last{};
    auto chunks = translate(
        s,
        {{"message_start", R"({"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":0}}})"},
         {"content_block_start", R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"},
         {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check."}})"},
         {"content_block_stop", R"({"type":"content_block_stop","index":0})"},
         {"content_block_start", R"({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_9","name":"get_weather","input":{}}})"},
         {"content_block_delta", R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}})"},
         {"content_block_delta", R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}})"},
         {"content_block_delta", R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"is\"}"}})"},
         {"content_block_stop", R"({"type":"content_block_stop","index":1})"},
         {"message_delta", R"({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":30}})"},
         {"message_stop", R"({"type":"message_stop"})"}},
        last);
    REQUIRE(chunks.size() == 7);
    parsed start(chunks[2]);
    element call = start.root["choices"].at(0)["delta"]["tool_calls"].at(0);
    CHECK(int64_t(call["index"]) == 0);
    CHECK(str(call["id"]) == "toolu_9");
    CHECK(str(call["type"]) == "function");
    CHECK(str(call["function"]["name"]) == "get_weather");
    CHECK(str(call["function"]["arguments"]) == "");
    std::string arguments;
    for (int i : {3, 4}) {
      parsed frag(chunks[i]);
      element c = frag.root["choices"].at(0)["delta"]["tool_calls"].at(0);
      CHECK(int64_t(c["index"]) == 0);
      arguments += str(c["function"]["arguments"]);
    }
    CHECK(arguments == R"({"city": "Paris"})");
    CHECK(str(parsed(chunks[5]).root["choices"].at(0)["finish_reason"]) == "tool_calls");
    CHECK(chunks[6] == "[DONE]");
    CHECK(s.outcome().finish_reason == "tool_calls");
  }

  TEST_CASE("an error event ends the stream with an OpenAI error event and [DONE]") {
    anthropic_stream s;
    s.reset(k_ctx);
    anthropic_stream_status last{};
    auto chunks = translate(
        s,
        {k_text_stream[0], k_text_stream[1], k_text_stream[3],
         {"error", R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"}},
        last);
    REQUIRE(chunks.size() == 4);
    parsed error(chunks[2]);
    CHECK(str(error.root["error"]["message"]) == "Overloaded");
    CHECK(str(error.root["error"]["type"]) == "server_error");
    CHECK(chunks[3] == "[DONE]");
    CHECK(s.done());
    CHECK(s.outcome().finish_reason == "error");
  }

  TEST_CASE("ping and unknown events write nothing") {
    anthropic_stream s;
    s.reset(k_ctx);
    char buf[256];
    CHECK(s.feed("ping", R"({"type":"ping"})", buf, sizeof(buf)).written == 0);
    auto r = s.feed("future_event", R"({"type":"future_event","x":1})", buf, sizeof(buf));
    CHECK(r.status == anthropic_stream_status::ok);
    CHECK(r.written == 0);
    r = s.feed("content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}})",
               buf, sizeof(buf));
    CHECK(r.status == anthropic_stream_status::ok);
    CHECK(r.written > 0);  // only the role chunk
  }

  TEST_CASE("malformed events are a clear error") {
    anthropic_stream s;
    s.reset(k_ctx);
    char buf[256];
    CHECK(s.feed("content_block_delta", R"({"type":"content_block_delta","index":0,"delta":)", buf, sizeof(buf)).status ==
          anthropic_stream_status::malformed);
    CHECK(s.feed("message_start", "[1,2]", buf, sizeof(buf)).status == anthropic_stream_status::malformed);
    CHECK(s.feed("content_block_delta", R"({"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{"}})",
                 buf, sizeof(buf)).status == anthropic_stream_status::malformed);
  }

  TEST_CASE("an event past the stream's own capacity is read in buffers of its own, up to 4 MiB; past that, too_large") {
    // A whole tool call's input in one delta, as some backends write it.
    anthropic_stream small(64);
    small.reset(k_ctx);
    std::vector<char> out(1 << 20);
    REQUIRE(small.feed("message_start", k_text_stream[0].data, out.data(), out.size()).status == anthropic_stream_status::ok);
    REQUIRE(small.feed("content_block_start",
                       R"({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"write","input":{}}})",
                       out.data(), out.size()).status == anthropic_stream_status::ok);
    std::string input = "{\\\"content\\\":\\\"";  // {\"content\":\" as JSON string content
    input.append(100000, 'z');
    input += "\\\"}";
    const std::string delta =
        R"({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":")" + input + R"("}})";
    const auto r = small.feed("content_block_delta", delta, out.data(), out.size());
    REQUIRE(r.status == anthropic_stream_status::ok);
    simdjson::dom::parser p;
    const std::string chunk(out.data() + 6, r.written - 8);  // "data: " .. "\n\n"
    simdjson::dom::element root;
    REQUIRE(p.parse(chunk).get(root) == simdjson::SUCCESS);
    const std::string_view args = root["choices"].at(0)["delta"]["tool_calls"].at(0)["function"]["arguments"].get_string().value();
    CHECK(args.size() == 100000 + 14);  // {"content":" .. "}
    CHECK(args.starts_with(R"({"content":"zzz)"));
    std::string huge = R"({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":")";
    huge.append(anthropic_stream::k_large_event_bytes_max, 'z');
    huge += "\"}}";
    CHECK(small.feed("content_block_delta", huge, out.data(), out.size()).status == anthropic_stream_status::too_large);
  }

  TEST_CASE("output that does not fit says how much it needs and changes nothing") {
    anthropic_stream s;
    s.reset(k_ctx);
    char small[16];
    auto r = s.feed("message_start", k_text_stream[0].data, small, sizeof(small));
    CHECK(r.status == anthropic_stream_status::need_space);
    CHECK(r.written == 0);
    REQUIRE(r.needed > sizeof(small));
    std::vector<char> big(r.needed);
    auto again = s.feed("message_start", k_text_stream[0].data, big.data(), big.size());
    CHECK(again.status == anthropic_stream_status::ok);
    CHECK(again.written == r.needed);
    CHECK(std::string_view(big.data(), big.size()).find("\"role\":\"assistant\"") != std::string_view::npos);
  }
}

namespace {

// Feeds a recorded stream; returns all the bytes written.
std::string feed_bytes(anthropic_stream& s, const std::vector<sse_event>& events) {
  std::string out;
  char buf[4096];
  for (const sse_event& e : events) {
    anthropic_stream_result r = s.feed(e.event, e.data, buf, sizeof(buf));
    REQUIRE(r.status == anthropic_stream_status::ok);
    out.append(buf, r.written);
  }
  return out;
}

// mock-vllm's two-token reply ("tok0 tok1") as Anthropic streams it.
const std::vector<sse_event> k_two_tokens = {
    {"message_start",
     R"({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}})"},
    {"content_block_start", R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"},
    {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok0"}})"},
    {"ping", R"({"type": "ping"})"},
    {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" tok1"}})"},
    {"content_block_stop", R"({"type":"content_block_stop","index":0})"},
    {"message_delta", R"({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}})"},
    {"message_stop", R"({"type":"message_stop"})"},
};

anthropic_reply_context completions_ctx() {
  anthropic_reply_context ctx = k_ctx;
  ctx.kind = endpoint::completions;
  return ctx;
}

}  // namespace

TEST_SUITE("openai::anthropic completions") {
  TEST_CASE("the prompt becomes one user message; max_tokens, sampling, stop and stream are carried") {
    SUBCASE("a string prompt with everything given") {
      parsed p(to_anthropic(
          R"({"model":"m","prompt":"Say hi","max_tokens":7,"temperature":0.25,"top_p":0.5,"stop":["\n\n","END"],"stream":true,"n":1,"echo":false,"logprobs":null,"suffix":null})",
          512, endpoint::completions));
      CHECK(str(p.root["model"]) == "claude-x");
      CHECK(int64_t(p.root["max_tokens"]) == 7);
      CHECK(double(p.root["temperature"]) == 0.25);
      CHECK(double(p.root["top_p"]) == 0.5);
      auto stops = p.root["stop_sequences"].get_array().value();
      REQUIRE(stops.size() == 2);
      CHECK(str(stops.at(1)) == "END");
      CHECK(bool(p.root["stream"]));
      CHECK(p.root["system"].error() == simdjson::NO_SUCH_FIELD);
      auto messages = p.root["messages"].get_array().value();
      REQUIRE(messages.size() == 1);
      CHECK(str(messages.at(0)["role"]) == "user");
      auto content = messages.at(0)["content"].get_array().value();
      REQUIRE(content.size() == 1);
      CHECK(str(content.at(0)["type"]) == "text");
      CHECK(str(content.at(0)["text"]) == "Say hi");
    }
    SUBCASE("an array of one string, no max_tokens: the caller's default") {
      parsed p(to_anthropic(R"({"model":"m","prompt":["Once upon a time"]})", 4096, endpoint::completions));
      CHECK(int64_t(p.root["max_tokens"]) == 4096);
      CHECK(str(p.root["messages"].at(0)["content"].at(0)["text"]) == "Once upon a time");
      CHECK(p.root["stream"].error() == simdjson::NO_SUCH_FIELD);
      CHECK(p.root["stop_sequences"].error() == simdjson::NO_SUCH_FIELD);
    }
    SUBCASE("max_completion_tokens is not a completions member") {
      parsed p(to_anthropic(R"({"model":"m","prompt":"x","max_completion_tokens":9})", 100, endpoint::completions));
      CHECK(int64_t(p.root["max_tokens"]) == 100);
    }
  }

  TEST_CASE("what a Messages reply cannot give is a 400 naming the field") {
    struct refusal {
      std::string_view body;
      std::string_view param;
    };
    for (refusal r : {
             refusal{R"({"model":"m","prompt":[1,2,3]})", "prompt"},
             refusal{R"({"model":"m","prompt":[[1,2],[3]]})", "prompt"},
             refusal{R"({"model":"m","prompt":["a","b"]})", "prompt"},
             refusal{R"({"model":"m","prompt":[]})", "prompt"},
             refusal{R"({"model":"m","prompt":""})", "prompt"},
             refusal{R"({"model":"m"})", "prompt"},
             refusal{R"({"model":"m","prompt":"x","n":2})", "n"},
             refusal{R"({"model":"m","prompt":"x","best_of":3})", "best_of"},
             refusal{R"({"model":"m","prompt":"x","echo":true})", "echo"},
             refusal{R"({"model":"m","prompt":"x","logprobs":0})", "logprobs"},
             refusal{R"({"model":"m","prompt":"x","suffix":"end"})", "suffix"},
             refusal{R"({"model":"m","prompt":"x","temperature":1.5})", "temperature"},
         }) {
      CAPTURE(r.body);
      const request_error err = refused(r.body, endpoint::completions);
      CHECK(err.param == r.param);
      CHECK_FALSE(err.message.empty());
    }
    CHECK(refused(R"({"model":"m","prompt":"x","n":2})", endpoint::completions).message.find("Anthropic") !=
          std::string_view::npos);
  }

  TEST_CASE("a message becomes vLLM's text_completion body, byte for byte") {
    struct variant {
      std::string_view stop_reason;
      bool ends_by_length;
    };
    for (variant v : {variant{"end_turn", false}, variant{"stop_sequence", false}, variant{"max_tokens", true}}) {
      CAPTURE(v.stop_reason);
      const std::string body =
          std::string(R"({"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"tok0"},)"
                      R"({"type":"text","text":" tok1"}],"stop_reason":")") +
          std::string(v.stop_reason) + R"(","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}})";
      std::string out;
      anthropic_outcome o;
      REQUIRE(anthropic_response_to_openai(body, completions_ctx(), out, o));
      std::string expected;
      mock_vllm::append_completion_body(expected, "cmpl-req1", 1700000000, "my-model", 2, v.ends_by_length, {5, 2});
      CHECK(out == expected);
      CHECK(o.prompt_tokens == 5);
      CHECK(o.completion_tokens == 2);
      CHECK(o.finish_reason == (v.ends_by_length ? "length" : "stop"));
    }
  }

  TEST_CASE("a chat message is still vLLM's chat.completion body, byte for byte") {
    const std::string body =
        R"({"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"tok0 tok1"}],)"
        R"("stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}})";
    std::string out;
    anthropic_outcome o;
    REQUIRE(anthropic_response_to_openai(body, k_ctx, out, o));
    std::string expected;
    mock_vllm::append_chat_body(expected, "chatcmpl-req1", 1700000000, "my-model", 2, false, {5, 2});
    CHECK(out == expected);
  }

  TEST_CASE("a stream is vLLM's chunk sequence, byte for byte: text_completion chunks and no role chunk for completions") {
    struct variant {
      endpoint kind;
      mock_vllm::endpoint mock_kind;
      std::string_view id;
      bool include_usage;
    };
    for (variant v : {variant{endpoint::completions, mock_vllm::endpoint::completion, "cmpl-req1", false},
                      variant{endpoint::completions, mock_vllm::endpoint::completion, "cmpl-req1", true},
                      variant{endpoint::chat_completions, mock_vllm::endpoint::chat, "chatcmpl-req1", true}}) {
      CAPTURE(v.id);
      CAPTURE(v.include_usage);
      anthropic_reply_context ctx = k_ctx;
      ctx.kind = v.kind;
      ctx.include_usage = v.include_usage;
      anthropic_stream s;
      s.reset(ctx);
      CHECK(feed_bytes(s, k_two_tokens) ==
            sluice::test::vllm_stream(v.mock_kind, v.id, "my-model", 2, false,
                                      v.include_usage ? std::optional(mock_vllm::usage_counts{5, 2}) : std::nullopt));
      CHECK(s.done());
      CHECK(s.outcome().prompt_tokens == 5);
      CHECK(s.outcome().completion_tokens == 2);
      CHECK(s.outcome().finish_reason == "stop");
    }
  }

  TEST_CASE("a completions stream ended by max_tokens finishes with length; tool blocks write nothing") {
    anthropic_stream s;
    s.reset(completions_ctx());
    anthropic_stream_status last{};
    auto chunks = translate(
        s,
        {{"message_start", R"({"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}})"},
         {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}})"},
         {"content_block_start",
          R"({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}})"},
         {"content_block_delta",
          R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{}"}})"},
         {"message_delta", R"({"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":4}})"},
         {"message_stop", R"({"type":"message_stop"})"}},
        last);
    CHECK(last == anthropic_stream_status::ok);
    REQUIRE(chunks.size() == 3);
    parsed text(chunks[0]);
    CHECK(str(text.root["id"]) == "cmpl-req1");
    CHECK(str(text.root["object"]) == "text_completion");
    CHECK(str(text.root["choices"].at(0)["text"]) == "a");
    parsed finish(chunks[1]);
    CHECK(str(finish.root["choices"].at(0)["text"]) == "");
    CHECK(str(finish.root["choices"].at(0)["finish_reason"]) == "length");
    CHECK(chunks[2] == "[DONE]");
    CHECK(s.outcome().finish_reason == "length");
    CHECK(s.outcome().completion_tokens == 4);
  }
}
