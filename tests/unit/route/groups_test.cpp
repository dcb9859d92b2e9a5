#include <doctest/doctest.h>

#include <string>

#include "sluice/route/groups.hpp"

using namespace sluice::route;
using sluice::openai::request_fields;

namespace {

std::shared_ptr<const sluice::config::config> load(std::string_view text) {
  return sluice::config::load(text, "test.toml", {});
}

constexpr std::string_view k_config = R"(
[router]
default_group = "general"

[[group]]
name = "general"
models = ["general", "gpt-*"]
backends = ["http://127.0.0.1:8001"]

[[group]]
name = "coder"
models = ["coder", "qwen-coder-[0-9]*", "gpt-4o"]
backends = ["http://127.0.0.1:8002"]

[[group]]
name = "vision"
backends = ["http://127.0.0.1:8003"]

[[group]]
name = "long"
backends = ["http://127.0.0.1:8004"]

[[rule]]
group = "vision"
has_images = true

[[rule]]
group = "coder"
contains_any = ["Python", "stack trace"]

[[rule]]
group = "coder"
regex = "^fix\\s+(this|my)\\b"

[[rule]]
group = "long"
min_prompt_bytes = 1000

[[rule]]
group = "coder"
has_tools = true
max_prompt_bytes = 999

[[key]]
id = "all"
key = "k1"

[[key]]
id = "general-only"
key = "k2"
groups = ["gen*"]
)";

request_fields ask(std::string_view text, std::string_view model = "auto") {
  request_fields f;
  f.model = model;
  f.last_user_message = text;
  f.input_bytes = text.size();
  return f;
}

}  // namespace

TEST_SUITE("route::glob") {
  TEST_CASE("globs match as fnmatch does without flags") {
    struct entry {
      const char* pattern;
      const char* text;
      bool match;
    };
    const entry cases[] = {
        {"*", "", true},
        {"*", "anything", true},
        {"qwen-*", "qwen-7b", true},
        {"qwen-*", "qwen", false},
        {"a?c", "abc", true},
        {"a?c", "ac", false},
        {"*-7b", "qwen-2-7b", true},
        {"*a*b*", "xxaxxbxx", true},
        {"*a*b", "xxaxxbx", false},
        {"m[0-9]", "m5", true},
        {"m[0-9]", "mx", false},
        {"m[!0-9]", "mx", true},
        {"m[!0-9]", "m1", false},
        {"m[abc]d", "mbd", true},
        {"m[]x]", "m]", true},
        {"m[", "m[", true},  // an unclosed class is a literal '['
        {"exact", "exact", true},
        {"exact", "exactly", false},
    };
    for (const entry& e : cases) {
      CAPTURE(e.pattern);
      CAPTURE(e.text);
      CHECK(glob_match(e.pattern, e.text) == e.match);
    }
  }
}

TEST_SUITE("route::group_table") {
  TEST_CASE("exact names win over patterns, patterns go in file order, unknown is none") {
    auto cfg = load(k_config);
    group_table t(*cfg);
    CHECK(t.find("general") == 0);
    CHECK(t.find("gpt-4o") == 1);  // exact in coder beats the earlier pattern gpt-*
    CHECK(t.find("gpt-3.5") == 0);
    CHECK(t.find("qwen-coder-7b") == 1);
    CHECK(t.find("qwen-coder-x") == k_none);
    CHECK(t.find("vision") == 2);
    CHECK(t.find("nope") == k_none);
  }

  TEST_CASE("auto rules pick a group in order, with the default group last") {
    auto cfg = load(k_config);
    group_table t(*cfg);
    struct entry {
      const char* name;
      request_fields f;
      uint32_t group;
    };
    request_fields image = ask("what is in this python picture?");
    image.has_images = true;
    request_fields tools = ask("call something");
    tools.has_tools = true;
    const std::string long_text(1500, 'x'), long_enough(1000, 'y');
    request_fields long_tools = ask(long_text);
    long_tools.has_tools = true;
    const entry cases[] = {
        {"images first, although a keyword matches too", image, 2},
        {"keyword, case-insensitive", ask("why does my PYTHON code fail"), 1},
        {"second keyword", ask("here is a Stack Trace:"), 1},
        {"regex, case-insensitive", ask("Fix this please"), 1},
        {"regex anchored at the start", ask("please fix this"), 0},
        {"prompt length", ask(long_enough), 3},
        {"tools below the length bound", tools, 1},
        {"long prompt wins over tools by order", long_tools, 3},
        {"nothing matches: default group", ask("hello"), 0},
    };
    for (const entry& e : cases) {
      CAPTURE(e.name);
      CHECK(t.resolve(e.f, 0) == e.group);
    }
  }

  TEST_CASE("a key's groups limit both names and rules") {
    auto cfg = load(k_config);
    group_table t(*cfg);
    CHECK(t.key_allows(0, 1));
    CHECK(t.key_allows(1, 0));
    CHECK_FALSE(t.key_allows(1, 1));
    CHECK(t.resolve(ask("", "coder"), 1) == k_none);   // exists, but not for this key: 404
    CHECK(t.resolve(ask("", "general"), 1) == 0);
    CHECK(t.resolve(ask("python"), 1) == 0);           // the coder rule is passed, default used
  }

  TEST_CASE("without a default group an unmatched auto request has no group") {
    auto cfg = load(R"(
[router]
auto_model = "router"
[[group]]
name = "a"
backends = ["http://127.0.0.1:8001"]
[[rule]]
group = "a"
contains_any = ["x"]
[[key]]
id = "k"
key = "k"
)");
    group_table t(*cfg);
    CHECK(t.is_auto("router"));
    CHECK_FALSE(t.is_auto("auto"));
    CHECK(t.resolve(ask("has x", "router"), 0) == 0);
    CHECK(t.resolve(ask("nothing", "router"), 0) == k_none);
    CHECK(t.resolve(ask("has x", "auto"), 0) == k_none);  // "auto" is no model here
  }

  TEST_CASE("a regex only sees the first k_rule_regex_bytes of the message") {
    auto cfg = load(R"(
[[group]]
name = "a"
backends = ["http://127.0.0.1:8001"]
[[rule]]
group = "a"
regex = "needle"
[[key]]
id = "k"
key = "k"
)");
    group_table t(*cfg);
    const std::string text(k_rule_regex_bytes, '.');
    const std::string late = text + "needle", early = "needle" + text;
    CHECK(t.resolve(ask(late), 0) == k_none);
    CHECK(t.resolve(ask(early), 0) == 0);
  }
}
