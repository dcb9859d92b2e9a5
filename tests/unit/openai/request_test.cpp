// Spec-style tables for request_reader: a body in, the extracted fields or
// the 400 (message and param) out. A new edge case is a new row.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <string_view>

#include "sluice/openai/request.hpp"

using sluice::openai::endpoint;
using sluice::openai::request_error;
using sluice::openai::request_fields;
using sluice::openai::request_reader;

namespace {

constexpr int64_t cap = 4096;
constexpr size_t max_body_bytes = 1 << 20;

// The body with simdjson's padding after it, as the HTTP layer provides.
struct padded_body {
  std::string bytes;
  size_t len;
  explicit padded_body(std::string_view s) : bytes(s), len(s.size()) {
    bytes.append(simdjson::SIMDJSON_PADDING, '\0');
  }
};

struct outcome {
  bool ok;
  request_fields fields;
  request_error error;
  std::string message;  // copied: the view dies with the reader's next read
  std::string param;
};

outcome read_body(request_reader& reader, endpoint ep, std::string_view body,
                  int64_t max_tokens_cap = cap) {
  padded_body b(body);
  outcome o{};
  o.ok = reader.read(ep, b.bytes.data(), b.len, max_tokens_cap, o.fields, o.error);
  o.message = std::string(o.error.message);
  o.param = std::string(o.error.param);
  return o;
}

std::string token_text(std::string_view body, uint32_t begin, uint32_t end) {
  return std::string(body.substr(begin, end - begin));
}

std::string nested(int containers) {
  // {"model":"m","messages":[{"role":"user","content":"x"}],"x": [[...]]}:
  // the root object is one level, so `containers - 1` arrays follow.
  std::string s = R"({"model":"m","messages":[{"role":"user","content":"x"}],"x":)";
  for (int i = 0; i < containers - 1; ++i) s += '[';
  for (int i = 0; i < containers - 1; ++i) s += ']';
  s += '}';
  return s;
}

constexpr std::string_view chat_tail = R"("messages":[{"role":"user","content":"hi"}])";

std::string chat(std::string_view members) {
  return std::string("{\"model\":\"m\",") + std::string(chat_tail) +
         (members.empty() ? "" : ",") + std::string(members) + "}";
}

struct rejection {
  const char* name;
  endpoint ep;
  std::string body;
  const char* message_part;  // a substring of the expected message
  const char* param;         // "" = null
};

std::string large_object_with_duplicate() {
  std::string s = R"({"model":"m","messages":[{"role":"user","content":"x"}],"meta":{)";
  for (int i = 0; i < 40; ++i) s += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  s += R"("k17":0}})";
  return s;
}

}  // namespace

TEST_SUITE("openai::request_reader") {
  TEST_CASE("every malformed or ambiguous body is refused with a clear message and param") {
    const rejection table[] = {
        {"empty body", endpoint::chat_completions, "", "body is empty", ""},
        {"whitespace only", endpoint::chat_completions, " \r\n\t", "body is empty", ""},
        {"UTF-8 BOM", endpoint::chat_completions, std::string("\xEF\xBB\xBF") + chat(""), "byte order mark",
         ""},
        {"not JSON", endpoint::chat_completions, "model=m&messages=x", "'model' is not a JSON value",
         ""},
        {"trailing garbage", endpoint::chat_completions, chat("") + " x", "bytes after", ""},
        {"trailing second object", endpoint::chat_completions, chat("") + "{}", "bytes after", ""},
        {"trailing closing brace", endpoint::chat_completions, chat("") + "}", "bytes after", ""},
        {"top level array", endpoint::chat_completions, std::string("[") + chat("") + "]", "must be an object",
         ""},
        {"top level string", endpoint::chat_completions, R"("hello")", "must be an object", ""},
        {"top level null", endpoint::chat_completions, "null", "must be an object", ""},
        {"truncated object", endpoint::chat_completions, R"({"model":"m","messages":[)",
         "not valid JSON", ""},
        {"single quotes", endpoint::chat_completions, R"({'model':'m'})", "is not a JSON value", ""},
        {"trailing comma", endpoint::chat_completions, R"({"model":"m",})", "not valid JSON", ""},
        {"missing comma", endpoint::chat_completions, R"({"model":"m" "stream":true})",
         "not valid JSON", ""},
        {"invalid UTF-8 byte", endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":")" "\xFF" R"("}]})",
         "not valid UTF-8", ""},
        {"UTF-8 encoded surrogate", endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":")" "\xED\xA0\x80" R"("}]})",
         "not valid UTF-8", ""},
        {"overlong UTF-8", endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":")" "\xC0\xAF" R"("}]})",
         "not valid UTF-8", ""},
        {"invalid UTF-8 in a key", endpoint::chat_completions,
         R"({"model":"m",")" "\xFE" R"(":1,"messages":[{"role":"user","content":"x"}]})",
         "not valid UTF-8", ""},
        {"lone high surrogate", endpoint::chat_completions, chat(R"("user":"\ud800")"),
         "lone UTF-16 surrogate", ""},
        {"lone low surrogate", endpoint::chat_completions, chat(R"("user":"\udc00")"),
         "lone UTF-16 surrogate", ""},
        {"high surrogate then a non-surrogate escape", endpoint::chat_completions,
         chat(R"("user":"\ud800\u0041")"), "lone UTF-16 surrogate", ""},
        {"high surrogate then plain text", endpoint::chat_completions,
         chat(R"("user":"\ud800abc")"), "lone UTF-16 surrogate", ""},
        {"two high surrogates", endpoint::chat_completions, chat(R"("user":"\ud800\ud800")"),
         "lone UTF-16 surrogate", ""},
        {"lone surrogate in a key", endpoint::chat_completions, chat(R"("\udfff":1)"),
         "lone UTF-16 surrogate", ""},
        {"invalid escape", endpoint::chat_completions, chat(R"("user":"\x41")"),
         "invalid escape", ""},
        {"unescaped control character", endpoint::chat_completions,
         chat("\"user\":\"a\x01b\""), "unescaped control character", ""},
        {"NaN", endpoint::chat_completions, chat(R"("temperature":NaN)"), "'NaN' is not a JSON value",
         ""},
        {"Infinity", endpoint::chat_completions, chat(R"("temperature":Infinity)"),
         "'Infinity' is not a JSON value", ""},
        {"-Infinity", endpoint::chat_completions, chat(R"("temperature":-Infinity)"),
         "'Infinity' is not a JSON value", ""},
        {"leading zero", endpoint::chat_completions, chat(R"("seed":01)"),
         "malformed or out of range", ""},
        {"number beyond 64 bits", endpoint::chat_completions,
         chat(R"("max_tokens":99999999999999999999999)"), "malformed or out of range", ""},
        {"double overflow", endpoint::chat_completions, chat(R"("temperature":1e400)"),
         "malformed or out of range", ""},
        {"depth 65", endpoint::chat_completions, nested(65), "deeper than 64", ""},
        {"depth 1000", endpoint::chat_completions, nested(1000), "deeper than 64", ""},
        {"duplicate top-level key", endpoint::chat_completions,
         R"({"model":"a","model":"b","messages":[{"role":"user","content":"x"}]})",
         "Duplicate key 'model'", ""},
        {"duplicate key after unescaping", endpoint::chat_completions,
         chat(R"("meta":{"a":1,"\u0061":2})"), "Duplicate key 'a'", ""},
        {"duplicate model key spelled with escapes", endpoint::chat_completions,
         R"({"model":"a","\u006dodel":"b","messages":[{"role":"user","content":"x"}]})",
         "Duplicate key 'model'", ""},
        {"duplicate key deep in messages", endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"x","content":"y"}]})",
         "Duplicate key 'content'", ""},
        {"duplicate key in an array of objects", endpoint::chat_completions,
         chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"p":1,"p":2}}}])"),
         "Duplicate key 'p'", ""},
        {"duplicate key in a large object", endpoint::chat_completions,
         large_object_with_duplicate(), "Duplicate key 'k17'", ""},
        {"a child's duplicate reported before its parent's", endpoint::chat_completions,
         chat(R"("a":1,"a":{"b":1,"b":2})"), "Duplicate key 'b'", ""},
        {"duplicate key on either side of child objects", endpoint::chat_completions,
         chat(R"("meta":{"a":{"b":1,"c":{"a":2}},"c":[{"a":1},{"b":[{"c":3}]}],"a":2})"),
         "Duplicate key 'a'", ""},
        {"duplicate key in a large object among child objects", endpoint::chat_completions,
         chat(R"("meta":{"k0":{"k1":1},"k1":{"k0":{"k2":2}},"k2":3,"k3":4,"k4":5,"k5":6,"k6":7,"k7":8,)"
              R"("k8":9,"k9":10,"k10":11,"k11":12,"k12":13,"k13":14,"k14":15,"k15":16,"k16":{"k1":0},"k1":0})"),
         "Duplicate key 'k1'", ""},
        {"model missing", endpoint::chat_completions,
         R"({"messages":[{"role":"user","content":"x"}]})", "you must provide a model parameter",
         "model"},
        {"model a number", endpoint::chat_completions,
         R"({"model":7,"messages":[{"role":"user","content":"x"}]})",
         "Invalid type for 'model'", "model"},
        {"model null", endpoint::chat_completions,
         R"({"model":null,"messages":[{"role":"user","content":"x"}]})",
         "Invalid type for 'model'", "model"},
        {"model an empty string", endpoint::chat_completions,
         R"({"model":"","messages":[{"role":"user","content":"x"}]})", "empty string", "model"},
        {"messages missing", endpoint::chat_completions, R"({"model":"m"})",
         "Missing required parameter: 'messages'", "messages"},
        {"messages a string", endpoint::chat_completions, R"({"model":"m","messages":"hi"})",
         "Invalid type for 'messages'", "messages"},
        {"messages empty", endpoint::chat_completions, R"({"model":"m","messages":[]})",
         "empty array", "messages"},
        {"message not an object", endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"x"},"hi"]})",
         "Invalid type for 'messages[1]'", "messages"},
        {"prompt missing", endpoint::completions, R"({"model":"m"})",
         "Missing required parameter: 'prompt'", "prompt"},
        {"prompt a number", endpoint::completions, R"({"model":"m","prompt":5})",
         "Invalid type for 'prompt'", "prompt"},
        {"input missing", endpoint::embeddings, R"({"model":"m"})",
         "Missing required parameter: 'input'", "input"},
        {"input an object", endpoint::embeddings, R"({"model":"m","input":{}})",
         "Invalid type for 'input'", "input"},
        {"stream a string", endpoint::chat_completions, chat(R"("stream":"true")"),
         "Invalid type for 'stream'", "stream"},
        {"stream a number", endpoint::chat_completions, chat(R"("stream":1)"),
         "Invalid type for 'stream'", "stream"},
        {"stream_options an array", endpoint::chat_completions,
         chat(R"("stream":true,"stream_options":[])"), "Invalid type for 'stream_options'",
         "stream_options"},
        {"include_usage a string", endpoint::chat_completions,
         chat(R"("stream":true,"stream_options":{"include_usage":"yes"})"),
         "'stream_options.include_usage'", "stream_options.include_usage"},
        {"max_tokens a float", endpoint::chat_completions, chat(R"("max_tokens":10.0)"),
         "expected an integer, but got a decimal number", "max_tokens"},
        {"max_tokens in exponent form", endpoint::chat_completions, chat(R"("max_tokens":1e3)"),
         "expected an integer", "max_tokens"},
        {"max_tokens a string", endpoint::chat_completions, chat(R"("max_tokens":"100")"),
         "expected an integer, but got a string", "max_tokens"},
        {"max_tokens a boolean", endpoint::chat_completions, chat(R"("max_tokens":true)"),
         "expected an integer, but got a boolean", "max_tokens"},
        {"max_tokens negative", endpoint::chat_completions, chat(R"("max_tokens":-5)"),
         "Expected a value >= 1, but got -5", "max_tokens"},
        {"max_tokens zero", endpoint::chat_completions, chat(R"("max_tokens":0)"),
         "Expected a value >= 1, but got 0", "max_tokens"},
        {"max_tokens above the cap", endpoint::chat_completions, chat(R"("max_tokens":4097)"),
         "max_tokens is too large: 4097. This model supports at most 4096", "max_tokens"},
        {"max_tokens above int64", endpoint::chat_completions,
         chat(R"("max_tokens":9223372036854775808)"),
         "max_tokens is too large: 9223372036854775808", "max_tokens"},
        {"max_completion_tokens zero", endpoint::chat_completions,
         chat(R"("max_completion_tokens":0)"), "Invalid 'max_completion_tokens'",
         "max_completion_tokens"},
        {"max_completion_tokens above the cap", endpoint::chat_completions,
         chat(R"("max_tokens":10,"max_completion_tokens":100000)"),
         "max_completion_tokens is too large", "max_completion_tokens"},
        {"max_tokens invalid on completions", endpoint::completions,
         R"({"model":"m","prompt":"x","max_tokens":-1})", "integer below minimum value",
         "max_tokens"},
        {"n zero", endpoint::chat_completions, chat(R"("n":0)"), "expected an integer from 1 to 128, but got 0",
         "n"},
        {"n above 128", endpoint::chat_completions, chat(R"("n":129)"), "but got 129", "n"},
        {"n above int64", endpoint::chat_completions, chat(R"("n":9223372036854775808)"),
         "but got 9223372036854775808", "n"},
        {"n a float", endpoint::chat_completions, chat(R"("n":2.5)"), "Invalid type for 'n'", "n"},
        {"n a string", endpoint::chat_completions, chat(R"("n":"2")"), "Invalid type for 'n'", "n"},
        {"best_of negative", endpoint::completions, R"({"model":"m","prompt":"x","best_of":-1})",
         "expected an integer from 1 to 128", "best_of"},
    };
    request_reader reader(max_body_bytes);
    for (const rejection& r : table) {
      const std::string name = r.name;
      CAPTURE(name);
      outcome o = read_body(reader, r.ep, r.body);
      CHECK_FALSE(o.ok);
      CHECK_MESSAGE(o.message.find(r.message_part) != std::string::npos, o.message);
      CHECK(o.param == r.param);
    }
  }

  TEST_CASE("a body over max_body_bytes is refused") {
    request_reader reader(256);
    std::string body = chat(R"("user":")" + std::string(300, 'a') + "\"");
    outcome o = read_body(reader, endpoint::chat_completions, body);
    CHECK_FALSE(o.ok);
    CHECK(o.message.find("larger than") != std::string::npos);
  }

  TEST_CASE("a chat body yields every field sluice needs") {
    const std::string body =
        R"({"model":"qwen2.5-7b","messages":[)"
        R"({"role":"system","content":"You are terse."},)"
        R"({"role":"user","content":"Hello there"},)"
        R"({"role":"assistant","content":"Hi"},)"
        R"({"role":"user","content":"again"}],)"
        R"("stream":true,"stream_options":{"include_usage":true},"max_tokens":100})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    const request_fields& f = o.fields;
    CHECK(f.model == "qwen2.5-7b");
    CHECK(token_text(body, f.model_token_begin, f.model_token_end) == "\"qwen2.5-7b\"");
    CHECK(f.stream);
    CHECK(f.has_stream_options);
    CHECK(f.include_usage);
    CHECK(token_text(body, f.stream_options_begin, f.stream_options_end) ==
          R"({"include_usage":true})");
    CHECK(f.max_tokens == 100);
    CHECK(f.message_count == 4);
    CHECK(f.input_bytes == std::string_view("You are terse.").size() + 11 + 2 + 5);
    CHECK(f.system_prompt == "You are terse.");
    CHECK(f.first_user_message == "Hello there");
    CHECK_FALSE(f.has_tools);
    CHECK_FALSE(f.has_images);
  }

  TEST_CASE("an escaped model name is unescaped and its span covers the escaped token") {
    const std::string body =
        R"({"messages":[{"role":"user","content":"x"}], "model" : "qw\u0065n" ,"stream":false})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.model == "qwen");
    CHECK(token_text(body, o.fields.model_token_begin, o.fields.model_token_end) ==
          R"("qw\u0065n")");
    CHECK_FALSE(o.fields.stream);
    CHECK_FALSE(o.fields.has_stream_options);
  }

  TEST_CASE("only the top-level model key is taken, never a nested or quoted one") {
    const std::string body =
        R"({"metadata":{"model":"inner"},)"
        R"("messages":[{"role":"user","content":"say \"model\":\"fake\" \\","model":"m2"}],)"
        R"("tools":[{"type":"function","function":{"name":"f","parameters":{"model":{"type":"string"}}}}],)"
        R"("model":"outer","extra":[{"model":"x"},"model"]})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.model == "outer");
    CHECK(token_text(body, o.fields.model_token_begin, o.fields.model_token_end) == "\"outer\"");
    CHECK(o.fields.has_tools);
  }

  TEST_CASE("the span scanner skips any nested value before the model: quotes, escapes and brackets in strings, at every offset") {
    // Top-level members of random nested values (strings holding brackets,
    // escaped quotes and backslash runs, at lengths around sixteen) before
    // "model": its span must be exactly its token, however the walk's
    // sixteen-byte steps fall.
    std::mt19937 rng(43);
    const auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
    const auto string_of = [&](std::string& out) {
      constexpr std::string_view pieces[] = {"a", "{", "}", "[", "]", "\\\"", "\\\\", "\\\\\\\"", ",", ":", " ", "model", "\\u0022"};
      out += '"';
      for (size_t n = pick(40); n > 0; --n) out += pieces[pick(std::size(pieces))];
      out += '"';
    };
    const auto value_of = [&](auto& self, std::string& out, int depth) -> void {
      const size_t kind = depth > 4 ? pick(3) : pick(5);
      if (kind == 0) {
        string_of(out);
      } else if (kind == 1) {
        out += std::to_string(pick(100000));
      } else if (kind == 2) {
        out += pick(2) == 0 ? "true" : "null";
      } else if (kind == 3) {
        out += '[';
        for (size_t n = pick(4); n > 0; --n) {
          self(self, out, depth + 1);
          if (n > 1) out += pick(2) == 0 ? "," : " , ";
        }
        out += ']';
      } else {
        out += '{';
        for (size_t n = pick(4), k = 0; n > 0; --n, ++k) {
          out += "\"k" + std::to_string(k) + "\":";
          self(self, out, depth + 1);
          if (n > 1) out += ',';
        }
        out += '}';
      }
    };
    request_reader reader(max_body_bytes);
    size_t nested = 0;
    for (int round = 0; round < 3000; ++round) {
      std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
      for (size_t n = pick(3), k = 0; n > 0; --n, ++k) {
        body += ",\"x" + std::to_string(k) + "\":";
        const size_t before = body.size();
        value_of(value_of, body, 1);
        nested += body[before] == '{' || body[before] == '[';
      }
      const std::string model = "m-" + std::to_string(round);
      body += std::string(pick(3), ' ') + ",\"model\":\"" + model + "\"}";
      CAPTURE(body);
      outcome o = read_body(reader, endpoint::chat_completions, body);
      REQUIRE_MESSAGE(o.ok, o.message);
      CHECK(o.fields.model == model);
      REQUIRE(token_text(body, o.fields.model_token_begin, o.fields.model_token_end) == "\"" + model + "\"");
    }
    CHECK(nested > 800);  // rounds with an object or array before the model
  }

  TEST_CASE("a model key spelled with escapes is found by the span scanner") {
    const std::string body =
        R"({"messages":[{"role":"user","content":"x"}],"\u006dodel":"a\"b\\"})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.model == "a\"b\\");
    CHECK(token_text(body, o.fields.model_token_begin, o.fields.model_token_end) ==
          R"("a\"b\\")");
  }

  TEST_CASE("a multi-byte model name keeps its bytes") {
    const std::string body = R"({"model":"модель-7b","messages":[{"role":"user","content":"x"}]})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.model == "модель-7b");
    CHECK(token_text(body, o.fields.model_token_begin, o.fields.model_token_end) ==
          "\"модель-7b\"");
  }

  TEST_CASE("content arrays give text bytes, the first text part and images") {
    const std::string body =
        R"({"model":"m","messages":[)"
        R"({"role":"developer","content":[{"type":"text","text":"Be brief."},{"type":"text","text":"Really."}]},)"
        R"({"role":"system","content":"ignored: not the first"},)"
        R"({"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}},)"
        R"({"type":"text","text":"What is this?"}]},)"
        R"({"role":"assistant","content":null,"tool_calls":[]}]})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    const request_fields& f = o.fields;
    CHECK(f.system_prompt == "Be brief.");
    CHECK(f.first_user_message == "What is this?");
    CHECK(f.has_images);
    CHECK(f.message_count == 4);
    CHECK(f.input_bytes == 9 + 7 + std::string_view("ignored: not the first").size() + 13);
  }

  TEST_CASE("input_image parts count as images and a string system prompt is taken whole") {
    const std::string body =
        R"({"model":"m","messages":[{"role":"system","content":"sys"},)"
        R"({"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.has_images);
    CHECK(o.fields.system_prompt == "sys");
    CHECK(o.fields.first_user_message.empty());
  }

  TEST_CASE("tools or functions count only when non-empty") {
    request_reader reader(max_body_bytes);
    SUBCASE("empty tools") {
      outcome o = read_body(reader, endpoint::chat_completions, chat(R"("tools":[])"));
      REQUIRE(o.ok);
      CHECK_FALSE(o.fields.has_tools);
    }
    SUBCASE("functions") {
      outcome o =
          read_body(reader, endpoint::chat_completions, chat(R"("functions":[{"name":"f"}])"));
      REQUIRE(o.ok);
      CHECK(o.fields.has_tools);
    }
  }

  TEST_CASE("max_completion_tokens wins over max_tokens for chat, as in vLLM") {
    request_reader reader(max_body_bytes);
    struct row {
      const char* members;
      int64_t expected;
    };
    const row rows[] = {
        {R"("max_tokens":10,"max_completion_tokens":20)", 20},
        {R"("max_completion_tokens":20,"max_tokens":10)", 20},
        {R"("max_tokens":10)", 10},
        {R"("max_completion_tokens":30)", 30},
        {R"("max_tokens":null)", -1},
        {R"("max_tokens":10,"max_completion_tokens":null)", 10},
        {R"("max_tokens":4096)", 4096},
        {R"("max_tokens":1)", 1},
        {"", -1},
    };
    for (const row& r : rows) {
      const std::string members = r.members;
      CAPTURE(members);
      outcome o = read_body(reader, endpoint::chat_completions, chat(r.members));
      REQUIRE_MESSAGE(o.ok, o.message);
      CHECK(o.fields.max_tokens == r.expected);
    }
  }

  TEST_CASE("the last user message and the leading messages' texts are read for routing") {
    const std::string body =
        R"({"model":"m","messages":[)"
        R"({"role":"system","content":"sys"},)"
        R"({"role":"user","content":"first"},)"
        R"({"role":"assistant","content":[{"type":"text","text":"reply"}]},)"
        R"({"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"last"}]},)"
        R"({"role":"assistant","content":"tail"}]})";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.last_user_message == "last");
    CHECK(o.fields.leading_messages[0] == "sys");
    CHECK(o.fields.leading_messages[1] == "first");
    CHECK(o.fields.leading_messages[2] == "reply");
    CHECK(o.fields.leading_messages[3] == "last");
    CHECK(o.fields.leading_messages[4] == "tail");
    CHECK(o.fields.leading_messages[5].empty());
    outcome c = read_body(reader, endpoint::completions, R"({"model":"m","prompt":"Once upon"})");
    REQUIRE(c.ok);
    CHECK(c.fields.last_user_message == "Once upon");
  }

  TEST_CASE("completions read max_tokens and the prompt") {
    request_reader reader(max_body_bytes);
    SUBCASE("a string prompt") {
      outcome o = read_body(reader, endpoint::completions,
                            R"({"model":"m","prompt":"Once upon","max_tokens":7,"stream":true})");
      REQUIRE(o.ok);
      CHECK(o.fields.max_tokens == 7);
      CHECK(o.fields.input_bytes == 9);
      CHECK(o.fields.first_user_message == "Once upon");
      CHECK(o.fields.stream);
      CHECK(o.fields.message_count == 0);
    }
    SUBCASE("an array of strings and token ids") {
      outcome o = read_body(reader, endpoint::completions,
                            R"({"model":"m","prompt":["ab","cde",[1,2,3]],"max_completion_tokens":9})");
      REQUIRE(o.ok);
      CHECK(o.fields.max_tokens == -1);  // vLLM's completions ignore max_completion_tokens
      CHECK(o.fields.input_bytes == 2 + 3 + 3 * 4);
      CHECK(o.fields.first_user_message == "ab");
    }
  }

  TEST_CASE("the answers a request makes: n or best_of, times a completions batch's prompts") {
    struct row {
      const char* name;
      endpoint ep;
      std::string body;
      uint64_t sequences;
    };
    const row rows[] = {
        {"chat, no n", endpoint::chat_completions, chat(""), 1},
        {"chat, n null", endpoint::chat_completions, chat(R"("n":null)"), 1},
        {"chat, n 4", endpoint::chat_completions, chat(R"("n":4)"), 4},
        {"chat, n 128", endpoint::chat_completions, chat(R"("n":128)"), 128},
        {"chat, best_of above n", endpoint::chat_completions, chat(R"("n":2,"best_of":5)"), 5},
        {"completions, one string", endpoint::completions, R"({"model":"m","prompt":"x","n":3})", 3},
        {"completions, three strings", endpoint::completions, R"({"model":"m","prompt":["a","b","c"],"n":2})", 6},
        {"completions, one token-id prompt", endpoint::completions, R"({"model":"m","prompt":[1,2,3]})", 1},
        {"completions, two token-id prompts", endpoint::completions, R"({"model":"m","prompt":[[1,2],[3]],"best_of":4})",
         8},
        {"embeddings ignore n", endpoint::embeddings, R"({"model":"m","input":["a","b"],"n":3})", 1},
    };
    request_reader reader(max_body_bytes);
    for (const row& r : rows) {
      const std::string name = r.name;
      CAPTURE(name);
      outcome o = read_body(reader, r.ep, r.body);
      REQUIRE_MESSAGE(o.ok, o.message);
      CHECK(o.fields.output_sequences == r.sequences);
    }
  }

  TEST_CASE("embeddings read the input") {
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::embeddings,
                          R"({"input":["hello","world!"],"model":"e5","encoding_format":"float"})");
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.model == "e5");
    CHECK(o.fields.input_bytes == 11);
    o = read_body(reader, endpoint::embeddings, R"({"model":"e5","input":"abc"})");
    REQUIRE(o.ok);
    CHECK(o.fields.input_bytes == 3);
  }

  TEST_CASE("null optional fields count as absent, and a null stream_options keeps its span") {
    const std::string body = chat(R"("stream":null,"stream_options":null)");
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK_FALSE(o.fields.stream);
    CHECK(o.fields.has_stream_options);
    CHECK_FALSE(o.fields.include_usage);
    CHECK(token_text(body, o.fields.stream_options_begin, o.fields.stream_options_end) == "null");
  }

  TEST_CASE("stream_options without include_usage has a span and include_usage false") {
    const std::string body = R"({"stream_options": { "x" : [1,{"y":"}"}] } ,"model":"m",)" +
                             std::string(chat_tail) + "}";
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.has_stream_options);
    CHECK_FALSE(o.fields.include_usage);
    CHECK(token_text(body, o.fields.stream_options_begin, o.fields.stream_options_end) ==
          R"({ "x" : [1,{"y":"}"}] })");
  }

  TEST_CASE("valid edge shapes are accepted") {
    request_reader reader(max_body_bytes);
    SUBCASE("depth exactly 64") {
      outcome o = read_body(reader, endpoint::chat_completions, nested(64));
      CHECK_MESSAGE(o.ok, o.message);
    }
    SUBCASE("a large object without duplicates") {
      std::string s = R"({"model":"m","messages":[{"role":"user","content":"x"}],"meta":{)";
      for (int i = 0; i < 40; ++i) s += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
      s += R"("z":0}})";
      outcome o = read_body(reader, endpoint::chat_completions, s);
      CHECK_MESSAGE(o.ok, o.message);
    }
    SUBCASE("equal keys in different objects") {
      outcome o = read_body(reader, endpoint::chat_completions,
                            R"({"model":"m","messages":[{"role":"user","content":"a"},)"
                            R"({"role":"user","content":"b"}],"x":{"model":1},"y":{"model":2}})");
      CHECK_MESSAGE(o.ok, o.message);
      CHECK(o.fields.first_user_message == "a");
    }
    SUBCASE("a valid surrogate pair and trailing whitespace") {
      outcome o = read_body(reader, endpoint::chat_completions,
                            chat(R"("user":"\ud83d\ude00")") + " \r\n");
      CHECK_MESSAGE(o.ok, o.message);
    }
    SUBCASE("a parent's keys and its children's, equal but apart, in a small and a large object") {
      outcome o = read_body(reader, endpoint::chat_completions,
                            chat(R"("meta":{"a":{"a":1,"b":{"a":2}},"b":[{"a":1,"b":2}],"c":{"c":{"c":3}}})"));
      CHECK_MESSAGE(o.ok, o.message);
      std::string large = R"("meta":{)";
      for (int i = 0; i < 20; ++i) large += "\"k" + std::to_string(i) + "\":{\"k" + std::to_string(i + 1) + "\":{\"k0\":1}},";
      large += R"("z":0})";
      o = read_body(reader, endpoint::chat_completions, chat(large));
      CHECK_MESSAGE(o.ok, o.message);
      CHECK(reader.keys_held() == 0);
      // A refusal deep in a child leaves no keys behind.
      CHECK_FALSE(read_body(reader, endpoint::chat_completions, chat(R"("meta":{"x":{"y":{"z":1,"z":2}}})")).ok);
      CHECK(reader.keys_held() == 0);
      CHECK_FALSE(read_body(reader, endpoint::chat_completions, chat(R"("meta":{"p":1,"q":[{"r":1},{"s":1,"s":2}],"t":2})")).ok);
      CHECK(reader.keys_held() == 0);
      o = read_body(reader, endpoint::chat_completions, chat(R"("meta":{"x":1,"y":{"z":1}})"));
      CHECK_MESSAGE(o.ok, o.message);
      CHECK(reader.keys_held() == 0);
    }
    SUBCASE("keys that differ only after a NUL") {
      outcome o = read_body(reader, endpoint::chat_completions, chat(R"("x":{"a":1,"a\u0000":2})"));
      CHECK_MESSAGE(o.ok, o.message);
    }
  }

  TEST_CASE("the reader is reusable after a refusal and grows past its first size") {
    request_reader reader(max_body_bytes);
    CHECK_FALSE(read_body(reader, endpoint::chat_completions, "{").ok);
    const std::string big_text(200 * 1024, 'a');
    const std::string body = R"({"model":"m","messages":[{"role":"user","content":")" + big_text +
                             R"("}],"max_tokens":5})";
    outcome o = read_body(reader, endpoint::chat_completions, body);
    REQUIRE_MESSAGE(o.ok, o.message);
    CHECK(o.fields.input_bytes == big_text.size());
    CHECK(o.fields.max_tokens == 5);
    o = read_body(reader, endpoint::chat_completions, chat(""));
    REQUIRE(o.ok);
    CHECK(o.fields.first_user_message == "hi");
  }

  TEST_CASE("a group cap below max_tokens refuses it") {
    request_reader reader(max_body_bytes);
    outcome o = read_body(reader, endpoint::chat_completions, chat(R"("max_tokens":64)"), 32);
    CHECK_FALSE(o.ok);
    CHECK(o.param == "max_tokens");
    CHECK(read_body(reader, endpoint::chat_completions, chat(R"("max_tokens":32)"), 32).ok);
  }

  TEST_CASE("sampling and output members are recorded as sent; null is absent") {
    request_reader reader(max_body_bytes);
    const outcome o = read_body(
        reader, endpoint::chat_completions,
        R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.5,"top_p":null,)"
        R"("stop":["a"],"seed":3,"presence_penalty":1,"frequency_penalty":-1,"tool_choice":"none",)"
        R"("response_format":{"type":"text"},"logprobs":false,"top_logprobs":0,"n":2,"best_of":3})");
    REQUIRE(o.ok);
    const request_fields& f = o.fields;
    CHECK(f.temperature.present);
    CHECK(double(f.temperature.value) == 0.5);
    CHECK_FALSE(f.top_p.present);
    CHECK(f.stop.present);
    CHECK(f.stop.value.is_array());
    CHECK(int64_t(f.seed.value) == 3);
    CHECK(int64_t(f.presence_penalty.value) == 1);
    CHECK(int64_t(f.frequency_penalty.value) == -1);
    CHECK(std::string_view(f.tool_choice.value) == "none");
    CHECK(f.response_format.value.is_object());
    CHECK(f.logprobs.present);
    CHECK(f.top_logprobs.present);
    CHECK_FALSE(f.function_call.present);
    CHECK_FALSE(f.prompt.present);
    CHECK(f.n == 2);
    CHECK(f.best_of == 3);
    CHECK(f.output_sequences == 3);

    const outcome c = read_body(reader, endpoint::completions, R"({"model":"m","prompt":["p"]})");
    REQUIRE(c.ok);
    CHECK(c.fields.prompt.present);
    CHECK(c.fields.prompt.value.is_array());
    CHECK(c.fields.n == 1);
    CHECK_FALSE(c.fields.temperature.present);
  }
}
