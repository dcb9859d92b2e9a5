// The example scorer ([router] classifier = "examples"): its features, its
// model, its scores, the config that picks it, and its accuracy on prompts
// written apart from its examples (issue 41 §4's held-out set).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "semantic_load.hpp"
#include "sluice/config/semantic.hpp"
#include "sluice/route/groups.hpp"
#include "sluice/route/semantic.hpp"

using namespace sluice::route;
namespace cfg = sluice::config;

namespace {

std::string group_toml(const std::string& dir, const std::vector<std::string>& groups) {
  std::string t;
  for (const std::string& g : groups) {
    t += "[[group]]\nname = \"" + g + "\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" + dir + "/" +
         (g == "translate" ? std::string("translation") : g) + ".txt\"\n";
  }
  return t + "[[key]]\nid = \"k\"\nkey = \"secret\"\n";
}

std::string normalized(std::string_view s) {
  std::string out(s.size() * 3 + 4, '\0');
  out.resize(cfg::semantic_normalize(s, out.data(), out.size()));
  return out;
}

std::multiset<std::pair<uint64_t, cfg::feature_kind>> features(std::string_view raw) {
  std::multiset<std::pair<uint64_t, cfg::feature_kind>> out;
  cfg::for_each_feature(normalized(raw), cfg::semantic_shape(raw),
                        [&](uint64_t h, cfg::feature_kind k) { out.emplace(h, k); });
  return out;
}

size_t count_kind(const std::multiset<std::pair<uint64_t, cfg::feature_kind>>& f, cfg::feature_kind k) {
  size_t n = 0;
  for (const auto& [h, kind] : f) n += kind == k;
  return n;
}

}  // namespace

TEST_SUITE("route::semantic examples") {
  TEST_CASE("shape bits: each from the text that has it, none from plain words") {
    CHECK(cfg::semantic_shape("hello there, how are you") == 0);
    CHECK(cfg::semantic_shape("你好，最近怎么样") == 0);
    CHECK(cfg::semantic_shape("in 1999") == 1);
    CHECK(cfg::semantic_shape("a = b") == 2);
    CHECK(cfg::semantic_shape("call f(x) now") == 4);
    CHECK(cfg::semantic_shape("obj.method") == 4);
    CHECK(cfg::semantic_shape("say \"hi\"") == 8);
    CHECK(cfg::semantic_shape("“生日快乐”") == 8);
    CHECK(cfg::semantic_shape("‘x’ y") == 8);
    CHECK(cfg::semantic_shape("用Python写") == 16);
    CHECK(cfg::semantic_shape("用P写") == 0);  // one Latin letter is no word
    CHECK(cfg::semantic_shape("fooBar baz") == 32);
    CHECK(cfg::semantic_shape("foo_bar") == (32 | 4));  // '_' against a word character is code punctuation too
    CHECK(cfg::semantic_shape("x^2 + 3") == (1 | 2));
    // Cut or odd bytes are read, never past the end.
    CHECK(cfg::semantic_shape(std::string_view("\xE2\x80", 2)) == 0);
    CHECK(cfg::semantic_shape(std::string_view("a\0b", 3)) == 0);
  }

  TEST_CASE("features: words, neighbours, character n-grams of ASCII words of 4+ bytes, shape bits") {
    const auto f = features("fix my code");
    CHECK(count_kind(f, cfg::feature_kind::word) == 3);
    CHECK(count_kind(f, cfg::feature_kind::bigram) == 2);
    // "<code>": 4 trigrams, 3 four-grams; "fix" and "my" are too short.
    CHECK(count_kind(f, cfg::feature_kind::chargram) == 7);
    CHECK(count_kind(f, cfg::feature_kind::shape) == 0);
    const auto z = features("写代码");
    CHECK(count_kind(z, cfg::feature_kind::word) == 3);  // a token per CJK character
    CHECK(count_kind(z, cfg::feature_kind::bigram) == 2);
    CHECK(count_kind(z, cfg::feature_kind::chargram) == 0);
    CHECK(count_kind(features("f(x) = 2"), cfg::feature_kind::shape) == 3);  // digit, operator, code
    // Case and spacing do not change a feature; another word does.
    CHECK(features("Fix  MY code") == f);
    CHECK(features("fix my cod") != f);
    CHECK(features("").empty());
  }

  TEST_CASE("the model: the examples' counts, the same every build; an example scores its own group") {
    const std::vector<std::vector<std::string>> ex = {
        {"fix my python function", "segfault in my C program", "写一个排序函数"},
        {"solve 2x + 3 = 7", "what is the derivative of x squared", "求解方程"},
        {"hello how are you", "tell me a joke"},
    };
    const cfg::example_model a = cfg::build_example_model(ex);
    const cfg::example_model b = cfg::build_example_model(ex);
    CHECK(a.nlabels == 3);
    CHECK(a.nexamples == 8);
    CHECK(a.nfeatures > 20);
    CHECK(a.slot_hash == b.slot_hash);
    CHECK(a.idf == b.idf);
    CHECK(a.likelihood == b.likelihood);
    CHECK(a.posting_weight == b.posting_weight);
    CHECK(a.find(12345) == UINT32_MAX);
    // Each example's vector is unit length.
    std::vector<double> norm(a.nexamples, 0.0);
    for (uint32_t f = 0; f < a.nfeatures; ++f) {
      for (uint32_t p = a.posting_offset[f]; p < a.posting_offset[f + 1]; ++p) {
        norm[a.posting_example[p]] += static_cast<double>(a.posting_weight[p] * a.posting_weight[p]);
      }
    }
    for (double n : norm) CHECK(n == doctest::Approx(1.0).epsilon(1e-5));

    auto m = std::make_shared<cfg::semantic_model>();
    m->method = cfg::classifier_method::examples;
    m->examples = a;
    m->labels = {"code", "math", "chat"};
    m->nlabels = 3;
    semantic_classifier c(m, 2048);
    for (uint32_t l = 0; l < ex.size(); ++l) {
      for (const std::string& e : ex[l]) {
        CAPTURE(e);
        CHECK(c.classify({}, e) == static_cast<int32_t>(l));
        double sum = 0;
        for (float p : c.probabilities()) {
          CHECK(p >= 0.0f);
          CHECK(p <= 1.0f);
          sum += static_cast<double>(p);
        }
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
      }
    }
    // No token: no decision. Words no example has: no group stands out.
    CHECK(c.classify({}, "") == -1);
    CHECK(c.classify({}, "   \n\t ") == -1);
    REQUIRE(c.classify({}, "qqqq zzzz wwww") >= 0);
    for (float p : c.probabilities()) CHECK(p == doctest::Approx(1.0 / 3).epsilon(1e-5));
    // The system prompt is read too when given.
    CHECK(c.classify("solve 2x + 3 = 7", "qqqq") == 1);
  }

  TEST_CASE("the token cache changes nothing: cached, evicted or uncached, every probability is the same bits") {
    const std::string dir = SLUICE_ROUTER_DATA;
    auto c = load_for_test("[router]\nsemantic = \"classifier\"\n" +
                           group_toml(dir, {"code", "math", "translation", "chat"}));
    semantic_classifier none(c->router.model, 2048, 0), tiny(c->router.model, 2048, 8), big(c->router.model, 2048, 4096);
    std::vector<std::string> texts;
    for (const std::string& l : read_lines(dir + "/eval.tsv")) texts.push_back(l.substr(l.find('\t') + 1));
    texts.emplace_back("a_very_long_identifier_name_of_forty_bytes and more");  // not cached: too long
    texts.emplace_back("supercalifragilistic");  // more known n-grams than a slot keeps, perhaps
    for (int pass = 0; pass < 2; ++pass) {
      for (const std::string& t : texts) {
        CAPTURE(t);
        const int32_t a = none.classify("system words", t);
        REQUIRE(tiny.classify("system words", t) == a);
        REQUIRE(big.classify("system words", t) == a);
        for (size_t l = 0; l < none.probabilities().size(); ++l) {
          CHECK(std::memcmp(&none.probabilities()[l], &tiny.probabilities()[l], sizeof(float)) == 0);
          CHECK(std::memcmp(&none.probabilities()[l], &big.probabilities()[l], sizeof(float)) == 0);
        }
      }
    }
    CHECK(none.token_hits() == 0);
    CHECK(big.token_hits() > big.token_misses());  // the second pass hits every cached token
    CHECK(tiny.token_misses() > big.token_misses());
  }

  TEST_CASE("config: examples by default, fasttext on request or with a model_file; a wrong method is refused") {
    const std::string dir = SLUICE_ROUTER_DATA;
    const std::string groups = group_toml(dir, {"code", "chat"});
    auto d = load_for_test("[router]\nsemantic = \"classifier\"\n" + groups);
    REQUIRE(d->router.model != nullptr);
    CHECK(d->router.classifier == cfg::classifier_method::examples);
    CHECK(d->router.model->method == cfg::classifier_method::examples);
    CHECK(d->router.model->labels == std::vector<std::string>{"code", "chat"});
    CHECK(d->router.model->origin.find("nearest examples over 100 examples of 2 groups") != std::string::npos);
    auto f = load_for_test("[router]\nsemantic = \"classifier\"\nclassifier = \"fasttext\"\n" + groups);
    CHECK(f->router.model->method == cfg::classifier_method::fasttext);
    CHECK_THROWS_WITH_AS(load_for_test("[router]\nsemantic = \"classifier\"\nclassifier = \"bayes\"\n" + groups),
                         doctest::Contains("router.classifier \"bayes\" is not a method; allowed: examples, fasttext"),
                         cfg::config_error);
    CHECK_THROWS_WITH_AS(
        load_for_test("[router]\nsemantic = \"classifier\"\nclassifier = \"examples\"\nmodel_file = \"/x.bin\"\n" + groups),
        doctest::Contains("router.model_file is a fastText model"), cfg::config_error);
  }

  TEST_CASE("on prompts written apart from its 25 examples a group, it routes at least 85 % right") {
    // The held-out setting of bench/router-eval --heldout; the figure is
    // deterministic (no training, no seed). 86.2 % when this was written;
    // fastText on the same examples: 77.5 %.
    const std::string dir = SLUICE_ROUTER_HELDOUT;
    auto c = load_for_test("[router]\nsemantic = \"classifier\"\ndefault_group = \"chat\"\nmin_confidence = 0.5\n" +
                           group_toml(dir, {"code", "math", "translation", "chat"}));
    size_t total = 0;
    const size_t right = routed_right(*c, dir + "/heldout.tsv", total);
    CHECK(total == 160);
    MESSAGE("held-out: ", right, "/", total);
    CHECK(right * 100 >= total * 85);
  }
}
