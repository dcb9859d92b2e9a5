#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <string_view>
#include <vector>

#include "sluice/audit/record.hpp"

using sluice::audit::format_line;
using sluice::audit::record;

namespace {

std::string line_of(const record& r) {
  std::string out(sluice::audit::max_line_bytes, '\0');
  size_t n = format_line(r, out.data(), out.size());
  REQUIRE(n > 0);
  out.resize(n);
  return out;
}

// Parses the line (without its '\n') strictly; fails the test if invalid.
simdjson::dom::element parse(simdjson::dom::parser& p, const std::string& line) {
  REQUIRE(!line.empty());
  REQUIRE(line.back() == '\n');
  REQUIRE(line.find('\n') == line.size() - 1);  // exactly one line
  simdjson::dom::element e;
  auto err = p.parse(line.data(), line.size() - 1).get(e);
  REQUIRE_MESSAGE(err == simdjson::SUCCESS, line);
  return e;
}

std::string str_field(simdjson::dom::element e, const char* name) {
  std::string_view v;
  REQUIRE(e[name].get(v) == simdjson::SUCCESS);
  return std::string(v);
}

record full_record() {
  record r;
  r.time_ms = 1717000000123;
  r.request_id = "req-1";
  r.key_id = "alice";
  r.endpoint = "/v1/chat/completions";
  r.model = "qwen2.5-7b";
  r.group = "qwen";
  r.backend = "http://127.0.0.1:8000";
  r.session_id = "sess-9";
  r.status = 200;
  r.prompt_tokens = 12;
  r.completion_tokens = 30;
  r.total_tokens = 42;
  r.quota_charged = 72;
  r.ttft_ms = 15;
  r.duration_ms = 230;
  r.stream = true;
  r.cancelled = false;
  r.finish_reason = "stop";
  return r;
}

}  // namespace

TEST_SUITE("audit::format_line") {
  TEST_CASE("a full record is one JSON line with every field in the fixed order") {
    const std::string line = line_of(full_record());
    CHECK(line ==
          "{\"time_ms\":1717000000123,\"request_id\":\"req-1\",\"key_id\":\"alice\","
          "\"endpoint\":\"/v1/chat/completions\",\"model\":\"qwen2.5-7b\",\"group\":\"qwen\","
          "\"backend\":\"http://127.0.0.1:8000\",\"session_id\":\"sess-9\",\"status\":200,"
          "\"prompt_tokens\":12,\"completion_tokens\":30,\"total_tokens\":42,\"quota_charged\":72,"
          "\"ttft_ms\":15,\"duration_ms\":230,\"stream\":true,\"finish_reason\":\"stop\","
          "\"cancelled\":false,\"error\":null}\n");
    simdjson::dom::parser p;
    auto e = parse(p, line);
    CHECK(str_field(e, "key_id") == "alice");
    uint64_t total = 0;
    REQUIRE(e["total_tokens"].get(total) == simdjson::SUCCESS);
    CHECK(total == 42);
  }

  TEST_CASE("the client's dialect follows the error when set") {
    record r = full_record();
    r.dialect = "messages";
    const std::string line = line_of(r);
    CHECK(line.ends_with(",\"cancelled\":false,\"error\":null,\"dialect\":\"messages\"}\n"));
    simdjson::dom::parser p;
    CHECK(str_field(parse(p, line), "dialect") == "messages");
  }

  TEST_CASE("empty strings and a missing first token are written as null") {
    record r;
    r.status = 401;
    r.error = "invalid_api_key";
    simdjson::dom::parser p;
    auto e = parse(p, line_of(r));
    for (const char* f : {"request_id", "key_id", "endpoint", "model", "group", "backend", "session_id",
                          "finish_reason", "ttft_ms"}) {
      CHECK_MESSAGE(e[f].is_null(), f);
    }
    CHECK(str_field(e, "error") == "invalid_api_key");
    size_t fields = 0;
    simdjson::dom::object o;
    REQUIRE(e.get(o) == simdjson::SUCCESS);
    for (auto kv : o) {
      (void)kv;
      ++fields;
    }
    CHECK(fields == 19);
  }

  TEST_CASE("strings are escaped so the line parses back to the same bytes") {
    struct escape_case {
      std::string_view input;
      std::string_view encoded;  // what the line must contain
    };
    const escape_case cases[] = {
        {"a\"b", R"("a\"b")"},
        {"a\\b", R"("a\\b")"},
        {"line\nbreak\r\t", R"("line\nbreak\r\t")"},
        {"\b\f", R"("\b\f")"},
        {std::string_view("nul\0x", 5), R"("nul\u0000x")"},
        {"\x01\x1f\x7f", "\"\\u0001\\u001f\x7f\""},
        {"</script>", R"("</script>")"},
        {"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80", "\"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\""},  // é 中 😀
    };
    simdjson::dom::parser p;
    for (const escape_case& c : cases) {
      CAPTURE(c.encoded);
      record r;
      r.model = c.input;
      const std::string line = line_of(r);
      CHECK(line.find(std::string(c.encoded)) != std::string::npos);
      CHECK(str_field(parse(p, line), "model") == std::string(c.input));
    }
  }

  TEST_CASE("bytes that are not UTF-8 become U+FFFD and the line stays valid") {
    struct bad_case {
      std::string_view input;
      std::string_view decoded;
    };
    const std::string_view fffd = "\xEF\xBF\xBD";
    const bad_case cases[] = {
        {"a\xFF" "b", "a\xEF\xBF\xBD" "b"},                  // never valid
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},             // overlong '/'
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // surrogate U+D800
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // > U+10FFFF
        {"x\xE4\xB8", "x\xEF\xBF\xBD"},                       // truncated at the end: one replacement
        {"\xE4\xB8" "A", "\xEF\xBF\xBD" "A"},                 // truncated before ASCII
        {"\x80", "\xEF\xBF\xBD"},                             // lone continuation byte
    };
    simdjson::dom::parser p;
    for (const bad_case& c : cases) {
      CAPTURE(c.decoded);
      record r;
      r.session_id = c.input;
      const std::string got = str_field(parse(p, line_of(r)), "session_id");
      CHECK(got == std::string(c.decoded));
      CHECK(got.find(std::string(fffd)) != std::string::npos);
    }
  }

  TEST_CASE("a huge field is cut at a character boundary and the line stays bounded") {
    std::string model;
    for (int i = 0; i < 100000; ++i) model += "\xE4\xB8\xAD\"";  // 中 and a quote: 5 output bytes each
    record r = full_record();
    r.model = model;
    r.request_id = model;
    r.error = model;
    const std::string line = line_of(r);
    CHECK(line.size() <= sluice::audit::max_line_bytes);
    simdjson::dom::parser p;
    auto e = parse(p, line);
    const std::string got = str_field(e, "model");
    CHECK(got.size() > 500);
    CHECK(std::string_view(model).substr(0, got.size()) == got);
    CHECK(str_field(e, "key_id") == "alice");  // fields after the long ones survive
  }

  TEST_CASE("the router's fields follow the others, only on a routed request") {
    record r = full_record();
    const std::string plain = line_of(r);
    CHECK(plain.find("\"route\"") == std::string::npos);
    r.route_how = "classifier";
    r.route_confidence = 0.9346;
    const std::string routed = line_of(r);
    CHECK(routed.substr(0, plain.size() - 2) == plain.substr(0, plain.size() - 2));
    CHECK(routed.ends_with(",\"route\":\"classifier\",\"route_confidence\":0.935}\n"));
    r.route_how = "rule";
    r.route_confidence = -1;
    CHECK(line_of(r).ends_with(",\"route\":\"rule\",\"route_confidence\":null}\n"));
    r.route_how = "classifier";
    r.route_confidence = 0.05;
    CHECK(line_of(r).ends_with(",\"route_confidence\":0.050}\n"));
    r.route_confidence = 1.0;
    CHECK(line_of(r).ends_with(",\"route_confidence\":1.000}\n"));
  }

  TEST_CASE("a line with every field at its limit still fits in max_line_bytes") {
    const std::string ctl(5000, '\x01');  // 6 output bytes per input byte
    record r = full_record();
    r.request_id = r.key_id = r.endpoint = r.model = r.group = r.backend = r.session_id = r.finish_reason = r.error =
        r.route_how = ctl;
    r.route_confidence = 1.0;
    r.time_ms = r.prompt_tokens = r.completion_tokens = r.total_tokens = r.quota_charged = r.duration_ms = UINT64_MAX;
    r.ttft_ms = INT64_MAX;
    r.status = 65535;
    std::vector<char> out(sluice::audit::max_line_bytes);
    const size_t n = format_line(r, out.data(), out.size());
    REQUIRE(n > 0);
    simdjson::dom::parser p;
    parse(p, std::string(out.data(), n));
  }

  TEST_CASE("a buffer too small for the line is reported, not overrun") {
    const record r = full_record();
    const std::string line = line_of(r);
    std::vector<char> out(line.size() + 8, '#');
    CHECK(format_line(r, out.data(), line.size() - 1) == 0);
    CHECK(out[line.size() - 1] == '#');  // nothing written past cap
    CHECK(format_line(r, out.data(), line.size()) == line.size());
    CHECK(format_line(r, out.data(), 0) == 0);
  }
}
