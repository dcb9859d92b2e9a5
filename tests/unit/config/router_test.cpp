// [router] semantic and the groups' examples, and [responses]: what loads,
// and each error's FILE:LINE message.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "sluice/config/config.hpp"
#include "sluice/config/semantic.hpp"

namespace cfg = sluice::config;

namespace {

std::string error_of(std::string_view text, std::string_view source = "test.toml") {
  try {
    cfg::load(text, source, {});
  } catch (const cfg::config_error& e) {
    return e.what();
  }
  return "";
}

constexpr std::string_view k_groups = R"(
[[group]]
name = "code"
backends = ["http://127.0.0.1:8000"]
examples = ["fix my python function", "why does this loop not compile", "write a C program"]

[[group]]
name = "chat"
backends = ["http://127.0.0.1:8000"]
examples = ["hello how are you", "tell me a joke", "what should I cook tonight"]

[[key]]
id = "k"
key = "secret"
)";

}  // namespace

TEST_SUITE("config::router") {
  TEST_CASE("semantic is off by default; the keys have their documented defaults") {
    auto c = cfg::load(std::string(k_groups), "test.toml", {});
    CHECK(c->router.semantic == cfg::semantic_mode::off);
    CHECK(c->router.min_confidence == doctest::Approx(0.5));
    CHECK(c->router.semantic_bytes == 2048);
    CHECK_FALSE(c->router.include_system);
    CHECK_FALSE(c->router.group_header);
    CHECK(c->router.model == nullptr);
    CHECK(c->groups[0].examples.size() == 3);
  }

  TEST_CASE("semantic = classifier trains a model whose labels are the groups with examples") {
    auto c = cfg::load("[router]\nsemantic = \"classifier\"\nmin_confidence = 0.7\nsemantic_bytes = 512\n"
                       "include_system = true\ngroup_header = true\n" + std::string(k_groups),
                       "test.toml", {});
    REQUIRE(c->router.model != nullptr);
    CHECK(c->router.model->nlabels == 2);
    CHECK(c->router.min_confidence == doctest::Approx(0.7));
    CHECK(c->router.semantic_bytes == 512);
    CHECK(c->router.include_system);
    CHECK(c->router.group_header);
  }

  TEST_CASE("examples_file is read relative to the config file; blank and # lines skipped") {
    char dir[] = "/tmp/sluice-router-test-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string path = std::string(dir) + "/code.txt";
    {
      std::ofstream out(path);
      out << "# a comment\n\nfix my python function\r\n   write a C program\n";
    }
    std::string text(k_groups);
    text.replace(text.find("examples = [\"fix"), text.find('\n', text.find("examples = [\"fix")) - text.find("examples = [\"fix"),
                 "examples_file = \"code.txt\"");
    auto c = cfg::load(text, std::string(dir) + "/sluice.toml", {});
    REQUIRE(c->groups[0].examples.size() == 2);
    CHECK(c->groups[0].examples[0] == "fix my python function");
    CHECK(c->groups[0].examples[1] == "write a C program");
    CHECK(error_of(text, "/nonexistent/sluice.toml").find("/nonexistent/sluice.toml:5: group.examples_file \"code.txt\": "
                                                          "cannot read /nonexistent/code.txt") == 0);
    std::remove(path.c_str());
    ::rmdir(dir);
  }

  TEST_CASE("errors name the file and line") {
    CHECK(error_of("[router]\nsemantic = \"embeddings\"\n" + std::string(k_groups)) ==
          "test.toml:1: router.semantic = \"embeddings\" needs router.embeddings_group = \"NAME\", the [[group]] "
          "whose backends serve /v1/embeddings");
    CHECK(error_of("[router]\nsemantic = \"embeddings\"\nembeddings_group = \"embed\"\n" + std::string(k_groups)) ==
          "test.toml:1: router.embeddings_group \"embed\" is not the name of a [[group]]");
    // The embeddings group's own examples are not a centroid: two other groups need them.
    CHECK(error_of("[router]\nsemantic = \"embeddings\"\nembeddings_group = \"chat\"\n" + std::string(k_groups))
              .find("test.toml:1: router.semantic = \"embeddings\" needs examples in at least two [[group]]s besides "
                    "the embeddings group") == 0);
    CHECK(error_of("[router]\nembeddings_cache = 1000\n" + std::string(k_groups)) ==
          "test.toml:2: router.embeddings_cache = 1000 is not a power of two (or 0: no cache)");
    CHECK(error_of("[router]\ntoken_cache = 3000\n" + std::string(k_groups)) ==
          "test.toml:2: router.token_cache = 3000 is not a power of two (or 0: no cache)");
    CHECK(cfg::load("[router]\ntoken_cache = 0\n" + std::string(k_groups), "test.toml", {})->router.token_cache == 0);
    CHECK(error_of("[router]\nembeddings_timeout_ms = 0\n" + std::string(k_groups)).find(
              "test.toml:2: router.embeddings_timeout_ms = 0 is out of range") == 0);
    CHECK(error_of("[router]\nsemantic = \"bert\"\n" + std::string(k_groups)) ==
          "test.toml:2: router.semantic \"bert\" is not a mode; allowed: off, classifier, embeddings");
    CHECK(error_of("[router]\nmin_confidence = 1.5\n" + std::string(k_groups)).find("test.toml:2: router.min_confidence") == 0);
    CHECK(error_of("[router]\nsemantic_bytes = 1\n" + std::string(k_groups)).find("test.toml:2: router.semantic_bytes") == 0);
    CHECK(error_of("[router]\nsemantik = \"classifier\"\n" + std::string(k_groups)).find("test.toml:2: unknown key \"semantik\"") == 0);
    CHECK(error_of("[router]\nmodel_file = \"\"\n" + std::string(k_groups)).find("test.toml:2: router.model_file must not be empty") == 0);
    CHECK(error_of(std::string(k_groups) + "[[rule]]\ngroup = \"code\"\npriority = \"first\"\n")
              .find("test.toml:17: rule.priority \"first\" is not allowed") == 0);
    // One group with examples is nothing to choose between.
    std::string one(k_groups);
    one.erase(one.find("examples = [\"hello"), one.find('\n', one.find("examples = [\"hello")) - one.find("examples = [\"hello"));
    CHECK(error_of("[router]\nsemantic = \"classifier\"\n" + one).find(
              "test.toml:1: router.semantic = \"classifier\" needs examples in at least two [[group]]s") == 0);
    CHECK(error_of("[router]\nsemantic = \"classifier\"\nmodel_file = \"/nonexistent.bin\"\n" + std::string(k_groups))
              .find("test.toml:1: router.model_file \"/nonexistent.bin\" is not a fastText model") == 0);
  }

  TEST_CASE("semantic = embeddings: the group resolved, a centroid slot per snapshot, the classifier as fallback") {
    const std::string text = "[router]\nsemantic = \"embeddings\"\nembeddings_group = \"embed\"\n" +
                             std::string(k_groups) +
                             "[[group]]\nname = \"embed\"\nmodels = [\"bge-m3\"]\nbackends = [\"http://127.0.0.1:8001\"]\n";
    auto c = cfg::load(text, "test.toml", {});
    CHECK(c->router.semantic == cfg::semantic_mode::embeddings);
    CHECK(c->router.embeddings_group_index == 2);
    CHECK(c->router.embeddings_timeout_ms == 250);
    CHECK(c->router.embeddings_cache == 4096);
    CHECK(c->router.token_cache == 4096);
    REQUIRE(c->router.centroids != nullptr);
    CHECK(c->router.centroids->get() == nullptr);  // the control thread computes them
    REQUIRE(c->router.model != nullptr);
    CHECK(cfg::embeddings_model(c->groups[2]) == "bge-m3");
    // The fingerprint: the same file gives the same; another example another.
    auto again = cfg::load(text, "test.toml", {});
    CHECK(cfg::embeddings_fingerprint(*c) == cfg::embeddings_fingerprint(*again));
    std::string other = text;
    other.replace(other.find("tell me a joke"), 14, "tell me a poem");
    CHECK(cfg::embeddings_fingerprint(*c) != cfg::embeddings_fingerprint(*cfg::load(other, "test.toml", {})));
    // A group of another protocol cannot embed.
    std::string anthropic = text;
    anthropic.replace(anthropic.find("models = [\"bge-m3\"]"), 19, "protocol = \"anthropic\"");
    CHECK(error_of(anthropic).find("router.embeddings_group \"embed\" has protocol = \"anthropic\"") != std::string::npos);
  }

  TEST_CASE("--explain-route takes a prompt, empty or not") {
    const char* argv[] = {"sluice", "--explain-route", "why does my loop never end", "--config", "x.toml"};
    const cfg::flags f = cfg::parse_flags(5, argv);
    REQUIRE(f.explain_route);
    CHECK(*f.explain_route == "why does my loop never end");
    const char* empty[] = {"sluice", "--explain-route="};
    CHECK(cfg::parse_flags(2, empty).explain_route == std::optional<std::string>(""));
    CHECK(cfg::usage_text().find("--explain-route PROMPT") != std::string_view::npos);
  }

  TEST_CASE("normalisation: lower case, punctuation and CJK characters as tokens, bounded output") {
    char out[64];
    auto norm = [&](std::string_view s, size_t cap = sizeof out) {
      return std::string(out, cfg::semantic_normalize(s, out, cap));
    };
    CHECK(norm("Fix f(x)!\n\tNow") == "fix f ( x ) ! now");
    CHECK(norm("翻译成English") == "翻 译 成 english");
    CHECK(norm("  ") == "");
    CHECK(norm("翻译", 4) == "翻");  // never half a character
    CHECK(cfg::fasttext_hash("a") == 0xe40c292cu);
    CHECK(cfg::fasttext_hash("\xe7") == 0xe1f37b86u);  // signed char: not 0x620b5c86 (unsigned FNV-1a)
  }
}

TEST_SUITE("config::responses") {
  TEST_CASE("[responses]: off by default; local with its bounds; each wrong value named") {
    const std::string groups(k_groups);
    auto d = cfg::load(groups, "test.toml", {});
    CHECK(d->responses.store == cfg::response_store_mode::off);
    CHECK(d->responses.store_ttl_s == 3600);
    CHECK(d->responses.store_max_bytes == (64ull << 20));
    auto l = cfg::load("[responses]\nstore = \"local\"\nstore_ttl_s = 60\nstore_max_bytes = 1048576\n" + groups, "test.toml", {});
    CHECK(l->responses.store == cfg::response_store_mode::local);
    CHECK(l->responses.store_ttl_s == 60);
    CHECK(l->responses.store_max_bytes == 1048576);
    CHECK(error_of("[responses]\nstore = \"memcached\"\n" + groups) ==
          "test.toml:2: responses.store \"memcached\" is not a store; allowed: off, local, redis");
    CHECK(error_of("[responses]\nstore = \"redis\"\n" + groups).find("set [cluster] redis") != std::string::npos);
    auto r = cfg::load("[cluster]\nredis = \"redis://127.0.0.1:6379\"\n[responses]\nstore = \"redis\"\n" + groups, "test.toml", {});
    CHECK(r->responses.store == cfg::response_store_mode::redis);
    CHECK(error_of("[responses]\nstore_ttl_s = 0\n" + groups).find("store_ttl_s") != std::string::npos);
    CHECK(error_of("[responses]\nstore_max_bytes = 10\n" + groups).find("store_max_bytes") != std::string::npos);
    CHECK(error_of("[responses]\nttl = 5\n" + groups).find("ttl") != std::string::npos);
  }
}
