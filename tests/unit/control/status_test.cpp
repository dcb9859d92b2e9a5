#include <doctest/doctest.h>

#include <simdjson.h>

#include <string>
#include <string_view>

#include "sluice/control/status.hpp"

using namespace sluice::control;

namespace {

std::string html(std::string_view s) {
  std::string out;
  put_html_escaped(out, s);
  return out;
}

std::string json(std::string_view s) {
  std::string out;
  put_json_string(out, s);
  return out;
}

std::string query(std::string_view s) {
  std::string out;
  put_query_escaped(out, s);
  return out;
}

constexpr std::string_view k_hostile = "<script>alert('x')</script>&\"";

// A view whose every string is hostile.
status_view hostile_view() {
  status_view v;
  v.overall.requests_s = 1.5;
  v.overall.steps.resize(2);
  traffic_row& g = v.groups.emplace_back();
  g.name = k_hostile;
  g.steps.resize(2);
  backend_row& b = v.backends.emplace_back();
  b.url = std::string("http://h/") + std::string(k_hostile);
  b.state = "up";
  b.last_change = k_hostile;
  key_row& k = v.keys.emplace_back();
  k.id = k_hostile;
  v.shards.emplace_back();
  v.step_ms_ago = {2000, 0};
  return v;
}

}  // namespace

TEST_SUITE("control::status escaping") {
  TEST_CASE("HTML: the five special characters become character references") {
    CHECK(html("plain text 1.2") == "plain text 1.2");
    CHECK(html(k_hostile) == "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;");
    CHECK(html("a&amp;b") == "a&amp;amp;b");  // escaped again, never taken as markup
  }

  TEST_CASE("JSON: quotes, backslashes and control bytes escaped; < > & too, for a <script>") {
    CHECK(json("a\"b\\c") == R"("a\"b\\c")");
    CHECK(json(std::string_view("\x01\n", 2)) == R"("\u0001\n")");
    CHECK(json("</script>&") == R"("\u003c/script\u003e\u0026")");
    CHECK(json("") == R"("")");
    // Invalid UTF-8 does not pass through as is.
    const std::string bad = json("\xff");
    CHECK(bad.find('\xff') == std::string::npos);
  }

  TEST_CASE("query values: unreserved bytes stay, the rest is %XX") {
    CHECK(query("http://gpu-a:8000") == "http%3A%2F%2Fgpu-a%3A8000");
    CHECK(query("a b&c=d~._-") == "a%20b%26c%3Dd~._-");
  }
}

TEST_SUITE("control::status rendering") {
  TEST_CASE("the JSON of a hostile view parses and keeps the strings as they were") {
    std::string out;
    render_status_json(hostile_view(), out);
    CHECK(out.find("<script>") == std::string::npos);
    simdjson::padded_string p(out);
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    REQUIRE(parser.parse(p).get(doc) == simdjson::SUCCESS);
    std::string_view name, id, url;
    REQUIRE(doc["groups"].at(0)["name"].get(name) == simdjson::SUCCESS);
    CHECK(name == k_hostile);
    REQUIRE(doc["keys"].at(0)["id"].get(id) == simdjson::SUCCESS);
    CHECK(id == k_hostile);
    REQUIRE(doc["backends"].at(0)["url"].get(url) == simdjson::SUCCESS);
    CHECK(url.ends_with(k_hostile));
    double rps = 0;
    REQUIRE(doc["overall"]["requests_s"].get(rps) == simdjson::SUCCESS);
    CHECK(rps == doctest::Approx(1.5));
    // Nothing observed: a latency is null, not a number.
    CHECK(doc["overall"]["ttft_p50_ms"].is_null());
    simdjson::dom::array steps;
    REQUIRE(doc["series"]["overall"]["requests_s"].get(steps) == simdjson::SUCCESS);
    CHECK(steps.size() == 2);
  }

  TEST_CASE("the page escapes every string it shows and its drain form targets the backend") {
    std::string out;
    render_status_page(hostile_view(), true, out);
    // The only script element is the page's own.
    size_t scripts = 0;
    for (size_t at = out.find("<script"); at != std::string::npos; at = out.find("<script", at + 1)) ++scripts;
    CHECK(scripts == 1);
    CHECK(out.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;") != std::string::npos);
    CHECK(out.find("action=\"/backends/drain?url=http%3A%2F%2Fh%2F%3Cscript%3E") != std::string::npos);
    CHECK(out.find("<html") != std::string::npos);
    // Nothing loaded from anywhere: no src attribute, no link to a URL.
    CHECK(out.find(" src=") == std::string::npos);
    CHECK(out.find("href=\"http") == std::string::npos);
  }

  TEST_CASE("without the admin token the page has no data rows") {
    std::string out;
    render_status_page(hostile_view(), false, out);
    CHECK(out.find("&lt;script&gt;") == std::string::npos);
    CHECK(out.find("admin token") != std::string::npos);
  }
}
