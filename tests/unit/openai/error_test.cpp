// Error bodies: OpenAI's shape, always valid JSON. Every output is parsed back
// with simdjson to prove it.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <string_view>

#include "sluice/openai/error.hpp"

using sluice::openai::default_error_for_status;
using sluice::openai::error_fields;
using sluice::openai::json_escape;
using sluice::openai::write_error_body;

namespace {

struct parsed_error {
  bool valid = false;
  std::string message, type;
  bool param_null = false, code_null = false;
  std::string param, code;
};

parsed_error parse_back(std::string_view body) {
  parsed_error p;
  simdjson::dom::parser parser;
  simdjson::padded_string padded(body);
  simdjson::dom::element root;
  if (parser.parse(padded).get(root) != simdjson::SUCCESS) return p;
  simdjson::dom::object err;
  if (root["error"].get(err) != simdjson::SUCCESS) return p;
  std::string_view s;
  if (err["message"].get(s) != simdjson::SUCCESS) return p;
  p.message = std::string(s);
  if (err["type"].get(s) != simdjson::SUCCESS) return p;
  p.type = std::string(s);
  simdjson::dom::element v;
  if (err["param"].get(v) != simdjson::SUCCESS) return p;
  p.param_null = v.is_null();
  if (v.is_string()) p.param = std::string(std::string_view(v));
  if (err["code"].get(v) != simdjson::SUCCESS) return p;
  p.code_null = v.is_null();
  if (v.is_string()) p.code = std::string(std::string_view(v));
  p.valid = true;
  return p;
}

std::string write(const error_fields& e, size_t cap = 1024) {
  std::string buf(cap, '\0');
  size_t n = write_error_body(buf.data(), cap, e);
  REQUIRE(n <= cap);
  buf.resize(n);
  return buf;
}

}  // namespace

TEST_SUITE("openai::error") {
  TEST_CASE("an error body has OpenAI's shape with nulls for empty param and code") {
    error_fields e;
    e.message = "Bad request.";
    CHECK(write(e) ==
          R"({"error":{"message":"Bad request.","type":"invalid_request_error","param":null,"code":null}})");
    e.param = "max_tokens";
    e.code = "invalid_value";
    CHECK(write(e) ==
          R"({"error":{"message":"Bad request.","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}})");
  }

  TEST_CASE("messages are escaped so the body is always valid JSON") {
    struct row {
      const char* name;
      std::string message;
      std::string expected_escaped;  // as written between the quotes
      std::string expected_parsed;   // as a JSON parser reads it back
    };
    const row rows[] = {
        {"quotes and backslash", "say \"hi\" \\ ok", R"(say \"hi\" \\ ok)", "say \"hi\" \\ ok"},
        {"newline and tab", "a\nb\tc", R"(a\nb\tc)", "a\nb\tc"},
        {"other control characters", "a\x01" "b\x1f", R"(a\u0001b\u001f)", "a\x01" "b\x1f"},
        {"NUL and other controls", std::string("x\0y\x1f", 4), R"(x\u0000y\u001f)",
         std::string("x\0y\x1f", 4)},
        {"DEL and slash pass through", "a\x7f/b", "a\x7f/b", "a\x7f/b"},
        {"valid multi-byte UTF-8", "модель 😀", "модель 😀", "модель 😀"},
        {"invalid byte", "a\xFFz", "a\xEF\xBF\xBDz", "a\xEF\xBF\xBDz"},
        {"UTF-8 surrogate", "\xED\xA0\x80!", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD!",
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD!"},
        {"overlong", "\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        // A cut sequence is one maximal ill-formed subpart: one U+FFFD.
        {"cut sequence at the end", "ok\xE2\x82", "ok\xEF\xBF\xBD", "ok\xEF\xBF\xBD"},
        {"above U+10FFFF", "\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD",
         "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
    };
    for (const row& r : rows) {
      const std::string name = r.name;
      CAPTURE(name);
      char buf[256];
      size_t n = json_escape(buf, sizeof(buf), r.message);
      CHECK(std::string_view(buf, n) == r.expected_escaped);
      error_fields e;
      e.message = r.message;
      e.param = r.message;  // param and code are escaped the same way
      e.code = "c\"d";
      parsed_error p = parse_back(write(e));
      REQUIRE(p.valid);
      CHECK(p.message == r.expected_parsed);
      CHECK(p.param == r.expected_parsed);
      CHECK(p.code == "c\"d");
    }
  }

  TEST_CASE("json_escape writes whole escapes and characters only") {
    char buf[16];
    CHECK(json_escape(buf, 5, "ab\x01""cd") == 2);   // \u0001 needs 6 bytes
    CHECK(json_escape(buf, 3, "ab\ncd") == 2);       // \n needs 2
    CHECK(json_escape(buf, 3, "a\"b") == 3);         // a \"
    CHECK(json_escape(buf, 2, "a\"b") == 1);
    CHECK(json_escape(buf, 3, "a😀") == 1);          // the emoji needs 4
    CHECK(json_escape(buf, 0, "abc") == 0);
  }

  TEST_CASE("a small buffer shortens the body and keeps it valid JSON") {
    const std::string message = std::string(300, '"') + "\n\xFF модель";  // every kind of escape
    error_fields e;
    e.message = message;
    e.param = "stream_options.include_usage";
    e.code = "rate_limit_exceeded";
    for (size_t cap = 0; cap <= 1024; ++cap) {
      CAPTURE(cap);
      std::string body = write(e, cap);
      if (cap < 59) {
        CHECK(body.empty());
        continue;
      }
      parsed_error p = parse_back(body);
      REQUIRE(p.valid);
      if (cap >= 128) {
        CHECK(p.param == "stream_options.include_usage");
        CHECK(p.code == "rate_limit_exceeded");
        CHECK(p.type == "invalid_request_error");
      }
    }
    std::string full = write(e, 4096);
    parsed_error p = parse_back(full);
    REQUIRE(p.valid);
    CHECK(p.message == std::string(300, '"') + "\n\xEF\xBF\xBD модель");
  }

  TEST_CASE("each status gets OpenAI's type and code") {
    struct row {
      uint16_t status;
      const char* type;
      const char* code;  // "" = null
    };
    const row rows[] = {
        {400, "invalid_request_error", ""},
        {401, "invalid_request_error", "invalid_api_key"},
        {403, "invalid_request_error", ""},
        {404, "invalid_request_error", "model_not_found"},
        {405, "invalid_request_error", ""},
        {408, "invalid_request_error", ""},
        {413, "invalid_request_error", ""},
        {414, "invalid_request_error", ""},
        {431, "invalid_request_error", ""},
        {429, "requests", "rate_limit_exceeded"},
        {418, "invalid_request_error", ""},
        {500, "server_error", ""},
        {502, "server_error", ""},
        {503, "server_error", ""},
        {504, "server_error", ""},
        {599, "server_error", ""},
    };
    for (const row& r : rows) {
      CAPTURE(r.status);
      error_fields e = default_error_for_status(r.status, "m");
      CHECK(e.type == r.type);
      CHECK(e.code == r.code);
      CHECK(e.message == "m");
      CHECK(e.param.empty());
      CHECK_FALSE(default_error_for_status(r.status, "").message.empty());
      parsed_error p = parse_back(write(e));
      REQUIRE(p.valid);
      CHECK(p.code_null == (std::string_view(r.code).empty()));
      CHECK(p.param_null);
    }
  }
}
