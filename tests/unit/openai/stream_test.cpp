// Spec-style tables for the backend scans: one SSE data payload (as vLLM's
// OpenAI server writes it) in, what billing and framing see out.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include <string>
#include <string_view>
#include <vector>

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

  // The walk (tried first) against the parse (the reference), on random
  // events: vLLM's layout with other members, orders, whitespace, escapes,
  // UTF-8 good and bad, numbers of every form and length, nesting, and
  // bytes cut, added or dropped. Where the walk vouches, every fact is the
  // parse's; scan_stream_event is the parse's answer everywhere.
  TEST_CASE("the walk's answer is the parse's wherever it vouches") {
    std::mt19937 rng(4117);
    const auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
    const auto ws = [&]() -> std::string {
      if (pick(6) != 0) return "";
      static constexpr const char* k_ws[] = {" ", "\t", "\n", "\r\n", "  "};
      return k_ws[pick(5)];
    };
    const auto str = [&]() -> std::string {
      static constexpr const char* k_pieces[] = {
          "stop", "length", "tool_calls", "custom", "", " word", "error", "Hello, world",
          "x y z 0123456789 ~!@#$%^&*()", "choices", "usage", "finish_reason", "{}[]:,", "\x7f",
          // Escapes and bytes the walk leaves to the parse.
          "{\\\"usage\\\":1}", "\\n", "\\\\", "\\u0065", "\xc3\xa9", "\xff", "\x01", "\t", "\n", "\r", "\x1f"};
      std::string v = "\"";
      for (size_t k = pick(3); k-- > 0;) v += k_pieces[pick(pick(6) == 0 ? 25 : 14)];
      return v + "\"";
    };
    const auto number = [&]() -> std::string {
      static constexpr const char* k_numbers[] = {
          "0", "7", "41", "220", "-3", "1718000000", "123456789012345678", "-123456789012345678",
          "1234567890123456789", "9223372036854775807", "18446744073709551616", "-0", "01", "1.5", "2e3",
          "-2.0E-1", "1e400", "1.", "-", "+1"};
      return k_numbers[pick(pick(3) == 0 ? 20 : 8)];
    };
    static constexpr const char* k_keys[] = {"choices", "usage", "error", "object", "delta", "content",
                                             "reasoning_content", "tool_calls", "text", "finish_reason",
                                             "prompt_tokens", "completion_tokens", "index", "logprobs",
                                             "id", "model", "x", "", "choic\\u0065s", "stop_reason"};
    std::function<std::string(int)> value = [&](int depth) -> std::string {
      const size_t kind = depth > 5 ? 2 + pick(4) : pick(7);
      switch (kind) {
        case 0: {
          std::string o = "{" + ws();
          for (size_t k = pick(5), i = 0; i < k; ++i) {
            if (i > 0) o += "," + ws();
            o += std::string("\"") + k_keys[pick(20)] + "\"" + ws() + ":" + ws() + value(depth + 1) + ws();
          }
          return o + "}";
        }
        case 1: {
          std::string a = "[" + ws();
          for (size_t k = pick(4), i = 0; i < k; ++i) a += (i > 0 ? "," + ws() : "") + value(depth + 1) + ws();
          return a + "]";
        }
        case 2: return str();
        case 3: return number();
        case 4: {
          static constexpr const char* k_literals[] = {"true", "false", "null", "nul", "tru"};
          return k_literals[pick(pick(5) == 0 ? 5 : 3)];
        }
        default: return pick(2) == 0 ? str() : "null";
      }
    };
    // An event: vLLM's members in some order, each value now and then
    // another, and other members among them.
    const auto event = [&]() -> std::string {
      std::vector<std::string> members = {"\"id\":\"chatcmpl-1\"", "\"object\":" + (pick(8) == 0 ? std::string("\"error\"") : str()),
                                          "\"created\":" + number(), "\"model\":\"m\""};
      std::string choices = "[";
      for (size_t k = pick(4) == 0 ? 0 : 1 + pick(3), i = 0; i < k; ++i) {
        std::string c = "{\"index\":" + number() + ",\"delta\":";
        c += pick(5) == 0 ? value(3) : "{\"content\":" + (pick(4) == 0 ? value(4) : str()) +
                                            (pick(4) == 0 ? ",\"tool_calls\":" + value(4) : std::string()) + "}";
        if (pick(4) == 0) c += ",\"text\":" + str();
        c += ",\"logprobs\":null,\"finish_reason\":" + (pick(2) == 0 ? std::string("null") : pick(4) == 0 ? value(4) : str());
        if (pick(8) == 0) c += ",\"finish_reason\":" + str();  // a second one: the first non-empty counts
        choices += (i > 0 ? "," : "") + c + "}";
      }
      members.push_back("\"choices\":" + (pick(10) == 0 ? value(1) : choices + "]"));
      if (pick(2) == 0) {
        members.push_back("\"usage\":" + (pick(5) == 0 ? value(1)
                                                       : "{\"prompt_tokens\":" + number() + ",\"total_tokens\":" + number() +
                                                             ",\"completion_tokens\":" + number() + "}"));
      }
      if (pick(10) == 0) members.push_back("\"error\":" + value(1));
      if (pick(4) == 0) members.push_back(std::string("\"") + k_keys[pick(20)] + "\":" + value(1));
      std::shuffle(members.begin(), members.end(), rng);
      std::string e = ws() + "{";
      for (size_t i = 0; i < members.size(); ++i) e += (i > 0 ? "," + ws() : ws()) + members[i];
      e += "}" + ws();
      // Now and then a byte cut, added or dropped, or a whole other value.
      switch (pick(12)) {
        case 0: e.resize(pick(e.size() + 1)); break;
        case 1: e.insert(pick(e.size() + 1), 1, "{}[],:\"\\ x0-.e\x80\f\v\t"[pick(18)]); break;
        case 2:
          if (!e.empty()) e.erase(pick(e.size()), 1);
          break;
        case 3: e = value(0); break;
        default: break;
      }
      return e;
    };
    size_t vouched = 0, malformed = 0, usage_only = 0, finished = 0, content = 0, errors = 0, counted = 0;
    for (int round = 0; round < 40000; ++round) {
      const std::string drawn = event();
      CAPTURE(drawn);
      // From a block of exactly its size: ASan sees a read past it.
      const auto block = std::make_unique<char[]>(drawn.size());
      std::memcpy(block.get(), drawn.data(), drawn.size());
      const std::string_view e(block.get(), drawn.size());
      // Compared field by field: finish_reason by its bytes (the parse
      // may return a static string, the walk a view of the same bytes).
      const stream_event_info want = sluice::openai::detail::scan_stream_event_parsed(e);
      const auto same = [&](const stream_event_info& got) {
        CHECK(got.done == want.done);
        CHECK(got.error == want.error);
        CHECK(got.has_usage == want.has_usage);
        CHECK(got.usage_only == want.usage_only);
        CHECK(got.has_content == want.has_content);
        CHECK(got.prompt_tokens == want.prompt_tokens);
        CHECK(got.completion_tokens == want.completion_tokens);
        CHECK(got.malformed == want.malformed);
        CHECK(got.finish_reason == want.finish_reason);
      };
      stream_event_info walked;
      if (sluice::openai::detail::walk_stream_event(e, walked)) {
        ++vouched;
        same(walked);
        usage_only += walked.usage_only;
        finished += !walked.finish_reason.empty();
        content += walked.has_content;
        errors += walked.error;
        counted += walked.prompt_tokens >= 0;
      }
      malformed += want.malformed;
      same(scan_stream_event(e));
    }
    // What the draw reached (not the walk's doing): both ways taken, and
    // each fact vouched for both ways in many events.
    CHECK(vouched > 8000);
    CHECK(40000 - vouched > 8000);
    CHECK(malformed > 3000);
    for (size_t n : {usage_only, finished, content, errors, counted}) CHECK(n > 300);
  }

  // The walk vouches to 64 levels (the event's object the first) and
  // leaves deeper ones to the parse -- at once, not by recursing down a
  // hostile event's whole depth.
  TEST_CASE("the walk leaves nesting past 64 levels to the parse") {
    for (const size_t arrays : {size_t{62}, size_t{63}, size_t{64}, size_t{2000}, size_t{100000}}) {
      CAPTURE(arrays);
      const std::string e = R"({"usage":{"prompt_tokens":5},"x":)" + std::string(arrays, '[') +
                            std::string(arrays, ']') + R"(,"choices":[]})";
      stream_event_info walked;
      const bool vouched = sluice::openai::detail::walk_stream_event(e, walked);
      CHECK(vouched == (arrays <= 63));
      const stream_event_info got = scan_stream_event(e);
      CHECK(got.malformed == (arrays > 1000));  // the parse's own limit: 1024 levels
      if (vouched) {
        CHECK(walked.usage_only);
        CHECK(walked.prompt_tokens == 5);
      }
      if (!got.malformed) {
        CHECK(got.usage_only);
        CHECK(got.prompt_tokens == 5);
      }
    }
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
    check_usage_rows(rows, [](const char* text) { return sluice::openai::detail::scan_response_usage_parsed(text); });
  }

  TEST_CASE("read from the end: the shapes other backends write, and the traps of a backward walk") {
    const usage_row rows[] = {
        {"SGLang: pretty-printed, CRLF, usage with details",
         "{\r\n  \"id\": \"a\",\r\n  \"choices\": [ { \"message\": { \"content\": \"hi\" } } ],\r\n  \"usage\": {\r\n"
         "    \"prompt_tokens\": 7,\r\n    \"prompt_tokens_details\": { \"cached_tokens\": 3 },\r\n"
         "    \"completion_tokens\": 2,\r\n    \"total_tokens\": 9\r\n  }\r\n}\r\n",
         7, 2, 9},
        {"a usage member nested in a choice is not the top level's",
         R"({"choices":[{"usage":{"prompt_tokens":99,"completion_tokens":99,"total_tokens":99}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})",
         1, 2, 3},
        {"only a nested usage: none at the top level",
         R"({"choices":[{"usage":{"prompt_tokens":99,"completion_tokens":99,"total_tokens":99}}]})", -1, -1, -1},
        {"content ending in a backslash, then a quoted key-like string",
         R"({"choices":[{"content":"a\\","x":"\"usage\":{\"prompt_tokens\":5}"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}})",
         4, 1, 5},
        {"a string value \"usage\" followed by a colon inside a later string",
         R"({"a":"usage","b":":","usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}})", 2, 2, 4},
        {"numbers that are not integers are left out",
         R"({"usage":{"prompt_tokens":5.0,"completion_tokens":1e2,"total_tokens":99999999999999999999}})", -1, -1, -1},
        {"negative and zero", R"({"usage":{"prompt_tokens":-3,"completion_tokens":0,"total_tokens":-0}})", -3, 0, 0},
        {"an empty usage object", R"({"usage":{}})", -1, -1, -1},
        {"a usage that is a string", R"({"usage":"12"})", -1, -1, -1},
        {"trailing garbage", R"({"usage":{"prompt_tokens":1}} x)", -1, -1, -1},
        {"an unterminated string", R"({"usage":{"prompt_tokens":1},"x":"abc})", -1, -1, -1},
        {"only a closing brace", "}", -1, -1, -1},
        {"an array at the top level", R"([{"usage":{"prompt_tokens":1}}])", -1, -1, -1},
        {"empty", "", -1, -1, -1},
        {"only whitespace", " \r\n", -1, -1, -1},
    };
    check_usage_rows(rows, [](const char* text) { return scan_response_usage(text); });
  }

  TEST_CASE("differential: the backward walk gives what a full parse gives, over generated bodies") {
    // Random JSON objects in the shapes backends write (and odder ones):
    // whitespace of every kind between tokens, strings with escapes and
    // backslashes at their ends, "usage" as a string value and as a nested
    // key, usage objects with extra members, null or absent usage, numbers
    // of every form. Bodies with two top-level "usage" keys are not valid
    // replies and are not generated.
    std::mt19937_64 rng(2026);
    const auto pick = [&](auto const& v) { return v[rng() % std::size(v)]; };
    const char* const spaces[] = {"", "", "", " ", "\n", "\r\n", "\t ", "  "};
    const char* const strings[] = {R"("")", R"("usage")", R"("a\\")", R"("\\\\")", R"("\"usage\":{\"prompt_tokens\":7}")",
                                   R"("}{][")", R"("x\\\"y")", R"("caf\u00e9")", R"(":")"};
    const char* const numbers[] = {"0", "5", "-12", "1.5", "2e3", "123456789012", "99999999999999999999", "-0"};
    const auto ws = [&] { return std::string_view(pick(spaces)); };
    // Joins pieces (operator+ chains trip GCC 12's -Wrestrict).
    const auto cat = [](std::initializer_list<std::string_view> parts) {
      std::string out;
      for (const std::string_view p : parts) out.append(p);
      return out;
    };
    std::function<std::string(int)> value = [&](int depth) -> std::string {
      switch (rng() % (depth > 2 ? 4 : 7)) {
        case 0: return pick(strings);
        case 1: return pick(numbers);
        case 2: return (rng() & 1) ? "null" : "true";
        case 3: return pick(strings);
        case 4: {
          std::string a = cat({"[", ws()});
          const int n = static_cast<int>(rng() % 3);
          for (int i = 0; i < n; ++i) a += cat({i ? "," : "", i ? ws() : "", value(depth + 1), ws()});
          return a + "]";
        }
        default: {
          std::string o = cat({"{", ws()});
          const int n = static_cast<int>(rng() % 3);
          for (int i = 0; i < n; ++i) {
            const char* const keys[] = {R"("usage")", R"("k")", R"("prompt_tokens")", R"("u\"sage")"};
            o += cat({i ? "," : "", i ? ws() : "", pick(keys), ws(), ":", ws(), value(depth + 1), ws()});
          }
          return o + "}";
        }
      }
    };
    const auto usage_value = [&]() -> std::string {
      if (rng() % 8 == 0) return "null";
      std::string o = cat({"{", ws()});
      const char* const keys[] = {R"("prompt_tokens")", R"("completion_tokens")", R"("total_tokens")",
                                  R"("prompt_tokens_details")", R"("other")"};
      const int n = static_cast<int>(rng() % 5);
      for (int i = 0; i < n; ++i) {
        const std::string v = rng() % 4 == 0 ? value(2) : std::string(pick(numbers));
        o += cat({i ? "," : "", i ? ws() : "", pick(keys), ws(), ":", ws(), v, ws()});
      }
      return o + "}";
    };
    size_t with_usage = 0, walked = 0, found = 0;
    for (int round = 0; round < 20000; ++round) {
      std::string body = cat({ws(), "{", ws()});
      const int members = static_cast<int>(rng() % 6);
      const int usage_at = rng() % 5 == 0 ? -1 : static_cast<int>(rng() % (members + 1));
      for (int i = 0; i <= members; ++i) {
        if (i != 0) body += cat({",", ws()});
        if (i == usage_at) {
          body += cat({R"("usage")", ws(), ":", ws(), usage_value(), ws()});
          ++with_usage;
        } else {
          const char* const keys[] = {R"("choices")", R"("id")", R"("x")", R"("usag")", R"("\"usage")"};
          body += cat({pick(keys), ws(), ":", ws(), value(0), ws()});
        }
      }
      body += cat({"}", ws()});
      CAPTURE(body);
      sluice::openai::usage fast;
      // The walk answers for (nearly) every valid body; the fallback is
      // compared too.
      walked += sluice::openai::detail::scan_response_usage_from_end(body, fast) ? 1 : 0;
      const sluice::openai::usage parsed = sluice::openai::detail::scan_response_usage_parsed(body);
      for (const sluice::openai::usage& u : {fast, scan_response_usage(body)}) {
        REQUIRE(u.prompt_tokens == parsed.prompt_tokens);
        REQUIRE(u.completion_tokens == parsed.completion_tokens);
        REQUIRE(u.total_tokens == parsed.total_tokens);
      }
      found += parsed.prompt_tokens != -1 ? 1 : 0;
    }
    CHECK(with_usage > 10000);
    CHECK(walked == 20000);
    CHECK(found > 2000);
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
