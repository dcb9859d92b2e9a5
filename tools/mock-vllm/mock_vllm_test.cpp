// Unit tests of mock-vllm's pure parts: the prompt token formula, the
// reading of request bodies, and the exact bytes of vLLM's wire format.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

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
