// Spec-style tables for the backend scans: one SSE data payload (as vLLM's
// OpenAI server writes it) in, what billing and framing see out.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "sluice/openai/request.hpp"

using sluice::openai::scan_response_usage;
using sluice::openai::scan_usage_in_tail;
using sluice::openai::scan_stream_event;
using sluice::openai::stream_event_info;

namespace {

struct event_case {
  const char* name;
  const char* payload;
  bool done;
  bool error;
  bool has_usage;
  bool usage_only;
  bool has_content;
  int64_t prompt_tokens;
  int64_t completion_tokens;
  const char* finish_reason;
  bool malformed;
};

// One usage scan's input and the token counts it must read (-1: none).
struct usage_row {
  const char* name;
  const char* text;
  int64_t prompt;
  int64_t completion;
  int64_t total;
};

template <size_t N, class Scan>
void check_usage_rows(const usage_row (&rows)[N], Scan scan) {
  for (const usage_row& r : rows) {
    const std::string name = r.name;
    CAPTURE(name);
    const sluice::openai::usage u = scan(r.text);
    CHECK(u.prompt_tokens == r.prompt);
    CHECK(u.completion_tokens == r.completion);
    CHECK(u.total_tokens == r.total);
  }
}

}  // namespace

TEST_SUITE("openai::scan_stream_event") {
  TEST_CASE("vLLM chat and completion chunks are read as billing needs") {
    const event_case table[] = {
        {"role chunk",
         R"({"id":"chatcmpl-5f1c","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})",
         false, false, false, false, false, -1, -1, "", false},
        {"content chunk",
         R"({"id":"chatcmpl-5f1c","object":"chat.completion.chunk","created":1718000000,"model":"Qwen/Qwen2.5-7B-Instruct","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"content that quotes a usage object is still plain content",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"{\"usage\":{\"prompt_tokens\":5}}"},"logprobs":null,"finish_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"content that quotes a finish_reason does not finish the stream",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"\"finish_reason\":\"stop\""},"logprobs":null,"finish_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"a usage object after a null usage is read",
         R"({"id":"c","object":"text_completion","created":1,"model":"m","choices":[],"usage":null,"x":{"usage":{"prompt_tokens":3,"completion_tokens":4}}})",
         false, false, false, false, false, -1, -1, "", false},
        {"content chunk with usage null",
         R"({"id":"chatcmpl-5f1c","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}],"usage":null})",
         false, false, false, false, true, -1, -1, "", false},
        {"escaped content",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"\n"},"finish_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"finish chunk with stop_reason",
         R"({"id":"chatcmpl-5f1c","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]})",
         false, false, false, false, false, -1, -1, "stop", false},
        {"finish chunk by length with continuous usage",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":12,"total_tokens":28,"completion_tokens":16}})",
         false, false, true, false, true, 12, 16, "length", false},
        {"usage-only chunk",
         R"({"id":"chatcmpl-5f1c","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28}})",
         false, false, true, true, false, 12, 28, "", false},
        {"tool call delta",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]},"finish_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"reasoning delta",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"think"},"finish_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"tool_calls finish",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
         false, false, false, false, false, -1, -1, "tool_calls", false},
        {"first non-null finish_reason of several choices",
         R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":null},{"index":1,"delta":{"content":"x"},"finish_reason":"length"},{"index":2,"delta":{},"finish_reason":"stop"}]})",
         false, false, false, false, true, -1, -1, "length", false},
        {"text completion chunk",
         R"({"id":"cmpl-9a","object":"text_completion","created":1718000000,"model":"m","choices":[{"index":0,"text":" upon","logprobs":null,"finish_reason":null,"stop_reason":null}]})",
         false, false, false, false, true, -1, -1, "", false},
        {"text completion finish",
         R"({"id":"cmpl-9a","object":"text_completion","created":1718000000,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]})",
         false, false, false, false, false, -1, -1, "length", false},
        {"error event",
         R"({"error":{"object":"error","message":"This model's maximum context length is 32768 tokens.","type":"BadRequestError","param":null,"code":400}})",
         false, true, false, false, false, -1, -1, "", false},
        {"bare error response",
         R"({"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500})",
         false, true, false, false, false, -1, -1, "", false},
        {"done", "[DONE]", true, false, false, false, false, -1, -1, "", false},
        {"done with spaces", " [DONE] \r\n", true, false, false, false, false, -1, -1, "", false},
        {"not JSON", R"({"id":"c","choices":[)", false, false, false, false, false, -1, -1, "",
         true},
        {"trailing bytes", R"({"choices":[]} x)", false, false, false, false, false, -1, -1, "",
         true},
        {"an array", R"([1,2])", false, false, false, false, false, -1, -1, "", true},
        {"empty", "", false, false, false, false, false, -1, -1, "", true},
    };
    for (const event_case& c : table) {
      const std::string name = c.name;
      CAPTURE(name);
      stream_event_info i = scan_stream_event(c.payload);
      CHECK(i.done == c.done);
      CHECK(i.error == c.error);
      CHECK(i.has_usage == c.has_usage);
      CHECK(i.usage_only == c.usage_only);
      CHECK(i.has_content == c.has_content);
      CHECK(i.prompt_tokens == c.prompt_tokens);
      CHECK(i.completion_tokens == c.completion_tokens);
      CHECK(i.finish_reason == c.finish_reason);
      CHECK(i.malformed == c.malformed);
    }
  }

  TEST_CASE("an unknown finish_reason is a view into the payload") {
    const std::string payload =
        R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"custom_reason"}]})";
    stream_event_info i = scan_stream_event(payload);
    CHECK(i.finish_reason == "custom_reason");
    CHECK(i.finish_reason.data() >= payload.data());
    CHECK(i.finish_reason.data() + i.finish_reason.size() <= payload.data() + payload.size());
    // A later scan does not disturb it.
    (void)scan_stream_event(R"({"choices":[{"finish_reason":"stop"}]})");
    CHECK(i.finish_reason == "custom_reason");
  }

  TEST_CASE("a payload larger than the scratch buffer is read") {
    std::string payload = R"({"choices":[{"index":0,"delta":{"content":")";
    payload += std::string(100000, 'x');
    payload += R"("},"finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":4}})";
    stream_event_info i = scan_stream_event(payload);
    CHECK_FALSE(i.malformed);
    CHECK(i.has_content);
    CHECK(i.prompt_tokens == 3);
    CHECK(i.completion_tokens == 4);
  }
}

TEST_SUITE("openai::scan_response_usage") {
  TEST_CASE("usage is read from non-stream responses") {
    const usage_row rows[] = {
        {"chat completion",
         R"({"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2},"prompt_logprobs":null})",
         9, 2, 11},
        {"embeddings without completion tokens",
         R"({"id":"embd-1","object":"list","created":1,"model":"e5","data":[{"index":0,"object":"embedding","embedding":[0.1,-0.2,3e-5]}],"usage":{"prompt_tokens":4,"total_tokens":4,"completion_tokens":0}})",
         4, 0, 4},
        {"usage first", R"({"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},"x":[]})",
         1, 2, 3},
        {"usage null", R"({"id":"x","usage":null})", -1, -1, -1},
        {"no usage", R"({"id":"x"})", -1, -1, -1},
        {"not JSON", R"(<html>502</html>)", -1, -1, -1},
        {"truncated", R"({"usage":{"prompt_tokens":1,)", -1, -1, -1},
    };
    check_usage_rows(rows, [](const char* text) { return scan_response_usage(text); });
  }
  TEST_CASE("usage is read from the last bytes of a body too large to keep whole") {
    const usage_row rows[] = {
        {"vLLM's tail, cut inside the choices",
         R"(":"stop","stop_reason":null}],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2},"prompt_logprobs":null})",
         9, 2, 11},
        {"a nested details object",
         R"(null}],"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":1},"completion_tokens":5,"total_tokens":8}})",
         3, 5, 8},
        {"braces inside a string of the usage object",
         R"(x"}],"usage":{"note":"}{\"}","prompt_tokens":2,"completion_tokens":3,"total_tokens":5}})", 2, 3, 5},
        {"the escaped key inside content is not the key",
         R"(abc \"usage\":{\"prompt_tokens\":99} xyz","finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}})",
         4, 6, 10},
        {"whitespace around the object", R"(], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3} })", 1, 2, 3},
        {"the last usage is null", R"("usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}},"usage":null})", -1, -1, -1},
        {"the object cut at the end", R"(}],"usage":{"prompt_tokens":9,"tot)", -1, -1, -1},
        {"no usage", R"(,"logprobs":{"content":[{"token":"a"}]}}]})", -1, -1, -1},
        {"empty", "", -1, -1, -1},
    };
    check_usage_rows(rows, [](const char* text) { return scan_usage_in_tail(text); });
  }
}
