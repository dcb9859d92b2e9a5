// Unit tests of mock-vllm's pure parts: the prompt token formula, the
// reading of request bodies, and the exact bytes of vLLM's wire format.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "anthropic.hpp"
#include "options.hpp"
#include "plan.hpp"
#include "wire.hpp"

using namespace mock_vllm;

namespace {

// A body with the spare capacity simdjson needs, as the server prepares it.
std::string padded(std::string body) {
  body.reserve(body.size() + simdjson::SIMDJSON_PADDING);
  return body;
}

struct planned {
  bool ok;
  plan p;
  std::string error;
};

struct anthropic_planned {
  bool ok;
  anthropic_plan p;
  std::string error;
};

anthropic_planned run_anthropic(std::string body, uint32_t reply_tokens = 16) {
  static simdjson::dom::parser parser;
  anthropic_planned r{};
  std::string b = padded(std::move(body));
  r.ok = make_anthropic_plan(parser, b, reply_tokens, r.p, r.error);
  return r;
}

// The payload of each HTTP chunk in `out`, in order.
std::vector<std::string> chunks(std::string_view out) {
  std::vector<std::string> payloads;
  while (!out.empty()) {
    size_t eol = out.find("\r\n");
    size_t size = std::stoul(std::string(out.substr(0, eol)), nullptr, 16);
    payloads.emplace_back(out.substr(eol + 2, size));
    out.remove_prefix(eol + 2 + size + 2);
  }
  return payloads;
}

}  // namespace

namespace {

planned run_plan(endpoint kind, std::string body, uint32_t reply_tokens = 16) {
  static simdjson::dom::parser parser;
  planned r{};
  std::string b = padded(std::move(body));
  r.ok = make_plan(parser, b, kind, reply_tokens, r.p, r.error);
  return r;
}

}  // namespace

TEST_SUITE("mock_vllm::plan") {
  TEST_CASE("words are runs of non-whitespace bytes") {
    CHECK(count_words("") == 0);
    CHECK(count_words("   ") == 0);
    CHECK(count_words("one") == 1);
    CHECK(count_words(" one  two\tthree\nfour\r\n") == 4);
    CHECK(count_words("naïve café") == 2);
  }

  TEST_CASE("chat prompt tokens are 4 per message plus the words of its content") {
    auto r = run_plan(endpoint::chat,
                      R"({"messages":[{"role":"system","content":"be brief"},)"
                      R"({"role":"user","content":[{"type":"text","text":"a b c"},{"type":"image_url"}]},)"
                      R"({"role":"assistant","content":null}]})");
    REQUIRE(r.ok);
    CHECK(r.p.prompt_tokens == 4 + 2 + 4 + 3 + 4);
    CHECK(r.p.tokens == 16);
    CHECK_FALSE(r.p.ends_by_length);
    CHECK_FALSE(r.p.stream);
  }

  TEST_CASE("max_completion_tokens wins over max_tokens and cuts the reply by length") {
    auto r = run_plan(endpoint::chat, R"({"messages":[],"max_tokens":10,"max_completion_tokens":3})");
    REQUIRE(r.ok);
    CHECK(r.p.tokens == 3);
    CHECK(r.p.ends_by_length);
    auto equal = run_plan(endpoint::chat, R"({"messages":[],"max_tokens":16})");
    CHECK(equal.p.tokens == 16);
    CHECK_FALSE(equal.p.ends_by_length);
  }

  TEST_CASE("stream_options without include_usage means include_usage, as vLLM's default") {
    auto r = run_plan(endpoint::chat, R"({"messages":[],"stream":true,"stream_options":{}})");
    REQUIRE(r.ok);
    CHECK(r.p.include_usage);
    auto off = run_plan(endpoint::chat, R"({"messages":[],"stream":true,"stream_options":{"include_usage":false}})");
    CHECK_FALSE(off.p.include_usage);
  }

  TEST_CASE("completion prompts count words or token ids") {
    CHECK(run_plan(endpoint::completion, R"({"prompt":"x y z"})").p.prompt_tokens == 3);
    CHECK(run_plan(endpoint::completion, R"({"prompt":["x y","z"]})").p.prompt_tokens == 3);
    CHECK(run_plan(endpoint::completion, R"({"prompt":[1,2,3,4]})").p.prompt_tokens == 4);
    CHECK(run_plan(endpoint::completion, R"({"prompt":[[1,2],[3]]})").p.prompt_tokens == 3);
  }

  TEST_CASE("embeddings get one hash per input and equal inputs get equal hashes") {
    auto r = run_plan(endpoint::embedding, R"({"input":["same","same","other"]})");
    REQUIRE(r.ok);
    REQUIRE(r.p.input_hashes.size() == 3);
    CHECK(r.p.input_hashes[0] == r.p.input_hashes[1]);
    CHECK(r.p.input_hashes[0] != r.p.input_hashes[2]);
    CHECK(run_plan(endpoint::embedding, R"({"input":[5,6]})").p.input_hashes.size() == 1);
  }

  TEST_CASE("malformed bodies are refused with a message") {
    const char* bad[] = {
        "{",                                            // not JSON
        "[]",                                           // not an object
        R"({"model":"m"})",                             // no messages
        R"({"messages":{}})",                           // messages not a list
        R"({"messages":[1]})",                          // message not an object
        R"({"messages":[],"max_tokens":0})",            // below 1
        R"({"messages":[],"max_tokens":1.5})",          // not an integer
        R"({"messages":[],"stream":"yes"})",            // not a boolean
        R"({"messages":[],"stream_options":{}})",       // options without stream
        R"({"messages":[{"content":5}]})",              // content of the wrong type
    };
    for (const char* body : bad) {
      CAPTURE(body);
      auto r = run_plan(endpoint::chat, body);
      CHECK_FALSE(r.ok);
      CHECK_FALSE(r.error.empty());
    }
    CHECK_FALSE(run_plan(endpoint::completion, R"({"prompt":[]})").ok);
    CHECK_FALSE(run_plan(endpoint::completion, R"({"prompt":[{}]})").ok);
    CHECK_FALSE(run_plan(endpoint::embedding, R"({})").ok);
  }
}

TEST_SUITE("mock_vllm::wire") {
  TEST_CASE("JSON strings escape as Python's json with ensure_ascii=False") {
    std::string out;
    append_json_string(out, "a\"b\\c\nd\x01\xc3\xa9/");
    CHECK(out == "\"a\\\"b\\\\c\\nd\\u0001\xc3\xa9/\"");
    out.clear();
    append_json_bytes(out, "\xff" "a");
    CHECK(out == "\"\\u00ffa\"");
  }

  TEST_CASE("each SSE event is one HTTP chunk with a lowercase hex size") {
    std::string out, scratch, prefix;
    append_chunk_prefix(prefix, endpoint::chat, "chatcmpl-x", 7, "m");
    append_token_event(out, scratch, endpoint::chat, prefix, 1, false);
    const std::string event =
        "data: {\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok1\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
    char size[16];
    std::snprintf(size, sizeof size, "%zx", event.size());
    CHECK(out == std::string(size) + "\r\n" + event + "\r\n");
  }

  TEST_CASE("the usage chunk has no choices and no prompt_tokens_details") {
    std::string out, scratch, prefix;
    append_chunk_prefix(prefix, endpoint::completion, "cmpl-y", 7, "m");
    append_usage_event(out, scratch, prefix, usage_counts{5, 2});
    CHECK(out.find("\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2}}\n\n") !=
          std::string::npos);
  }

  TEST_CASE("the stream ends with [DONE] and the terminal chunk") {
    std::string out;
    append_done_events(out);
    CHECK(out == "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
  }

  TEST_CASE("errors come flat or nested") {
    std::string flat, nested;
    append_error_body(flat, error_format::flat, 400, "BadRequestError", "m");
    append_error_body(nested, error_format::nested, 400, "BadRequestError", "m");
    CHECK(flat == R"({"object":"error","message":"m","type":"BadRequestError","param":null,"code":400})");
    CHECK(nested == R"({"error":{"message":"m","type":"BadRequestError","param":null,"code":400}})");
  }

  TEST_CASE("responses carry uvicorn's headers in uvicorn's order") {
    std::string out;
    append_response(out, 404, "D", "{}", "application/json", true);
    CHECK(out ==
          "HTTP/1.1 404 Not Found\r\ndate: D\r\nserver: uvicorn\r\ncontent-length: 2\r\n"
          "content-type: application/json\r\nconnection: close\r\n\r\n{}");
  }

  TEST_CASE("the date header is an IMF-fixdate") {
    http_date date;
    CHECK(date.at(0) == "Thu, 01 Jan 1970 00:00:00 GMT");
    CHECK(date.at(1700000000) == "Tue, 14 Nov 2023 22:13:20 GMT");
  }
}

TEST_SUITE("mock_vllm::options") {
  TEST_CASE("flags are read in both spellings and bad values are refused") {
    const char* argv[] = {"mock-vllm", "--port", "0", "--model=m", "--error-format", "nested", "--no-record"};
    options o;
    std::string error;
    REQUIRE(parse_flags(7, const_cast<char**>(argv), o, error) == parse_outcome::run);
    CHECK(o.port == 0);
    CHECK(o.model == "m");
    CHECK(o.errors == error_format::nested);
    CHECK_FALSE(o.record);
    const char* bad[] = {"mock-vllm", "--threads", "0"};
    CHECK(parse_flags(3, const_cast<char**>(bad), o, error) == parse_outcome::error);
  }
}

TEST_SUITE("mock_vllm::anthropic") {
  TEST_CASE("prompt tokens equal the chat formula with the system prompt as one message") {
    auto r = run_anthropic(
        R"({"model":"m","max_tokens":100,"system":"be brief","messages":[)"
        R"({"role":"user","content":[{"type":"text","text":"a b c"},{"type":"image","source":{}}]},)"
        R"({"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},)"
        R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"sunny and warm"}]}]})");
    REQUIRE(r.ok);
    CHECK(r.p.prompt_tokens == (4 + 2) + (4 + 3) + 4 + (4 + 3));
    auto chat = run_plan(endpoint::chat,
                         R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"a b c"}]})");
    auto same = run_anthropic(
        R"({"model":"m","max_tokens":100,"system":[{"type":"text","text":"be brief"}],)"
        R"("messages":[{"role":"user","content":"a b c"}]})");
    REQUIRE(same.ok);
    CHECK(same.p.prompt_tokens == chat.p.prompt_tokens);
    CHECK(same.p.tokens == 16);
    CHECK_FALSE(same.p.ends_by_length);
    CHECK_FALSE(same.p.tool_use);
  }

  TEST_CASE("max_tokens below the reply length cuts it") {
    auto r = run_anthropic(R"({"model":"m","max_tokens":3,"stream":true,"messages":[]})");
    REQUIRE(r.ok);
    CHECK(r.p.tokens == 3);
    CHECK(r.p.ends_by_length);
    CHECK(r.p.stream);
  }

  TEST_CASE("tools and the word weather in the last user message ask for a tool call") {
    const std::string tools = R"("tools":[{"name":"get_weather","input_schema":{}},{"name":"other"}])";
    auto r = run_anthropic(R"({"model":"m","max_tokens":5,)" + tools +
                           R"(,"messages":[{"role":"user","content":"What is the Weather?"}]})");
    REQUIRE(r.ok);
    CHECK(r.p.tool_use);
    CHECK(r.p.tool_name == "get_weather");
    CHECK(r.p.tokens == k_tool_json_pieces);
    SUBCASE("not when the weather was in an earlier user message") {
      auto earlier = run_anthropic(R"({"model":"m","max_tokens":5,)" + tools +
                                   R"(,"messages":[{"role":"user","content":"weather"},)"
                                   R"({"role":"assistant","content":"ok"},{"role":"user","content":"thanks"}]})");
      REQUIRE(earlier.ok);
      CHECK_FALSE(earlier.p.tool_use);
    }
    SUBCASE("not without tools") {
      auto none = run_anthropic(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"weather"}]})");
      REQUIRE(none.ok);
      CHECK_FALSE(none.p.tool_use);
    }
  }

  TEST_CASE("malformed requests are refused with a message") {
    const char* bad[] = {
        "{",
        R"({"model":"m","messages":[]})",                                          // no max_tokens
        R"({"max_tokens":5,"messages":[]})",                                       // no model
        R"({"model":"m","max_tokens":0,"messages":[]})",                           // below 1
        R"({"model":"m","max_tokens":5})",                                         // no messages
        R"({"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]})",
        R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":5}]})",
        R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text"}]}]})",
        R"({"model":"m","max_tokens":5,"messages":[],"temperature":2})",
        R"({"model":"m","max_tokens":5,"messages":[],"stop_sequences":[1]})",
        R"({"model":"m","max_tokens":5,"messages":[],"tools":[{}]})",
        R"({"model":"m","max_tokens":5,"messages":[],"stream":1})",
    };
    for (const char* body : bad) {
      CAPTURE(body);
      auto r = run_anthropic(body);
      CHECK_FALSE(r.ok);
      CHECK_FALSE(r.error.empty());
    }
  }

  TEST_CASE("error types follow the HTTP status as Anthropic names them") {
    CHECK(anthropic_error_type(400) == "invalid_request_error");
    CHECK(anthropic_error_type(401) == "authentication_error");
    CHECK(anthropic_error_type(429) == "rate_limit_error");
    CHECK(anthropic_error_type(500) == "api_error");
    CHECK(anthropic_error_type(503) == "overloaded_error");
    CHECK(anthropic_error_type(529) == "overloaded_error");
    std::string body;
    append_anthropic_error_body(body, "rate_limit_error", "slow down");
    CHECK(body == R"({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}})");
  }

  TEST_CASE("a non-stream answer is a message with the chat reply's text and usage") {
    std::string body;
    append_message_body(body, "msg_1", "m", 3, true, 12);
    CHECK(body ==
          R"({"id":"msg_1","type":"message","role":"assistant","model":"m",)"
          R"("content":[{"type":"text","text":"tok0 tok1 tok2"}],"stop_reason":"max_tokens",)"
          R"("stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3}})");
    body.clear();
    append_tool_message_body(body, "msg_2", "m", "toolu_2", "get_weather", 7, 3);
    CHECK(body ==
          R"({"id":"msg_2","type":"message","role":"assistant","model":"m",)"
          R"("content":[{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Paris"}}],)"
          R"("stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":3}})");
  }

  TEST_CASE("a stream is Anthropic's event sequence, one event per HTTP chunk") {
    std::string out, scratch;
    append_message_start_event(out, scratch, "msg_1", "m", 9);
    append_text_block_start_event(out, scratch);
    append_ping_event(out, scratch);
    append_text_delta_event(out, scratch, 0);
    append_text_delta_event(out, scratch, 1);
    append_block_stop_event(out, scratch);
    append_message_delta_event(out, scratch, "end_turn", 2);
    append_message_stop_event(out, scratch);
    REQUIRE(out.ends_with("\r\n0\r\n\r\n"));
    auto events = chunks(std::string_view(out).substr(0, out.size() - 5));
    const std::vector<std::string> expected = {
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\","
        "\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
        "\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"tok0\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\" tok1\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
        "\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    };
    CHECK(events == expected);
  }

  TEST_CASE("the tool input streams in pieces that join to its JSON") {
    std::string joined;
    for (uint32_t i = 0; i < k_tool_json_pieces; ++i) joined += tool_input_piece(i);
    CHECK(joined == tool_input_json());
    std::string out, scratch;
    append_json_delta_event(out, scratch, 1);
    CHECK(chunks(out).at(0) ==
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
          "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\":\\\"Par\"}}\n\n");
    out.clear();
    append_stream_error_event(out, scratch, "overloaded_error", "Overloaded");
    CHECK(chunks(out).at(0) ==
          "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
          "\"message\":\"Overloaded\"}}\n\n");
  }
}
