// The semantic classifier: training, inference against fastText's own
// predictLine, the auto model's decision order, and hostile input.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/config/semantic_train.hpp"
#include "sluice/route/groups.hpp"
#include "semantic_load.hpp"

using namespace sluice::route;
namespace cfg = sluice::config;
using sluice::openai::request_fields;

namespace {

const std::vector<std::string> k_groups = {"code", "math", "translation", "chat"};

std::vector<std::vector<std::string>> training_set() {
  std::vector<std::vector<std::string>> ex;
  for (const auto& g : k_groups) ex.push_back(read_lines(std::string(SLUICE_ROUTER_DATA) + "/" + g + ".txt"));
  return ex;
}

// The evaluation prompts (not trained on) and some odd ones.
std::vector<std::string> probe_texts() {
  std::vector<std::string> out;
  for (const std::string& l : read_lines(std::string(SLUICE_ROUTER_DATA) + "/eval.tsv")) {
    out.push_back(l.substr(l.find('\t') + 1));
  }
  for (const char* s : {"x", "a b", "你", "</s>", "__label__code is a label", "((((", "the the the the the",
                        "Ünïcödé wörds ünd ñ", "emoji 😀 😀 ok", "1 2 3 4 5 6 7 8 9 0"}) {
    out.emplace_back(s);
  }
  return out;
}

std::string normalized(std::string_view s) {
  std::string out(s.size() * 3 + 4, '\0');
  out.resize(cfg::semantic_normalize(s, out.data(), out.size()));
  return out;
}

std::string router_toml(std::string_view extra_router = "", std::string_view extra = "") {
  return std::string("[router]\nsemantic = \"classifier\"\ndefault_group = \"chat\"\n") + std::string(extra_router) +
         "\n[[group]]\nname = \"code\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" +
         SLUICE_ROUTER_DATA + "/code.txt\"\n"
         "[[group]]\nname = \"math\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" +
         SLUICE_ROUTER_DATA + "/math.txt\"\n"
         "[[group]]\nname = \"translation\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" +
         SLUICE_ROUTER_DATA + "/translation.txt\"\n"
         "[[group]]\nname = \"chat\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" +
         SLUICE_ROUTER_DATA + "/chat.txt\"\n"
         "[[group]]\nname = \"vision\"\nbackends = [\"http://127.0.0.1:8001\"]\n" +
         std::string(extra) + "\n[[key]]\nid = \"k\"\nkey = \"secret\"\n";
}

request_fields auto_request(std::string_view last_user, std::string_view first_user = {}) {
  request_fields f;
  f.model = "auto";
  f.last_user_message = last_user;
  f.first_user_message = first_user.empty() ? last_user : first_user;
  f.input_bytes = last_user.size();
  f.message_count = 1;
  return f;
}

}  // namespace

TEST_SUITE("route::semantic") {
  TEST_CASE("inference equals fastText's predictLine: labels and probabilities") {
    auto ft = cfg::train_semantic_fasttext(k_groups, training_set());
    auto model = cfg::semantic_model_from(*ft, k_groups, "test");
    semantic_classifier c(model, 4096);
    size_t compared = 0;
    for (const std::string& text : probe_texts()) {
      const std::string n = normalized(text);
      for (const std::string& input : {n, text}) {  // normalised, and as it came (raw tokens)
        std::istringstream in(input);
        std::vector<std::pair<fasttext::real, std::string>> predictions;
        ft->predictLine(in, predictions, -1, 0.0);
        const int32_t label = c.infer(input);
        if (predictions.empty()) {
          CHECK(label == -1);
          continue;
        }
        REQUIRE(label >= 0);
        CAPTURE(input);
        CHECK(predictions.size() == static_cast<size_t>(model->nlabels));
        // The top label, unless fastText's top two tie within its output's
        // rounding (a text none of whose n-grams was trained: the rows'
        // random start values make the labels nearly equal); the
        // probabilities below are compared either way.
        const bool tie = predictions.size() > 1 && predictions[0].first - predictions[1].first < 4e-6f;
        if (!tie) CHECK("__label__" + model->labels[static_cast<size_t>(label)] == predictions[0].second);
        // fastText reports exp(log(p + 1e-5)).
        for (const auto& [p, name] : predictions) {
          size_t l = 0;
          while ("__label__" + model->labels[l] != name) ++l;
          CHECK(std::fabs(static_cast<double>(c.probabilities()[l]) + 1e-5 - static_cast<double>(p)) < 2e-6);
        }
        ++compared;
      }
    }
    CHECK(compared >= 400);
  }

  TEST_CASE("the token cache changes nothing: cached, evicted or uncached, every probability is the same bits") {
    auto ft = cfg::train_semantic_fasttext(k_groups, training_set());
    auto model = cfg::semantic_model_from(*ft, k_groups, "test");
    semantic_classifier none(model, 4096, 0);
    semantic_classifier big(model, 4096, 4096);
    semantic_classifier tiny(model, 4096, 8);  // evictions and slot collisions all the time
    std::vector<std::string> texts = probe_texts();
    texts.emplace_back("averyveryverylongtokenthatisnotcachedbecauseitislong and short ones");
    uint64_t seen = 0;
    for (int pass = 0; pass < 2; ++pass) {  // the second pass: every short token of `big` is a hit
      for (const std::string& text : texts) {
        CAPTURE(text);
        const int32_t a = none.classify({}, text);
        const int32_t b = big.classify({}, text);
        const int32_t c = tiny.classify({}, text);
        REQUIRE(a == b);
        REQUIRE(a == c);
        if (a < 0) continue;
        for (size_t l = 0; l < none.probabilities().size(); ++l) {
          CHECK(std::memcmp(&none.probabilities()[l], &big.probabilities()[l], sizeof(float)) == 0);
          CHECK(std::memcmp(&none.probabilities()[l], &tiny.probabilities()[l], sizeof(float)) == 0);
        }
      }
      if (pass == 0) seen = big.token_misses();
    }
    CHECK(none.token_hits() == 0);
    CHECK(none.token_misses() == 0);
    // The second pass misses only where more distinct tokens met in a set
    // than it has ways.
    const uint64_t again = big.token_misses() - seen;
    CHECK(again * 5 < seen);
    CHECK(big.token_hits() > big.token_misses());
    CHECK(tiny.token_misses() > big.token_misses());
    MESSAGE("token cache over the evaluation set: first pass ", seen, " misses, second pass ", again, " misses; ",
            big.token_hits(), " hits in all");
  }

  TEST_CASE("training is deterministic: the same examples give the same matrices") {
    auto a = cfg::semantic_model_from(*cfg::train_semantic_fasttext(k_groups, training_set()), k_groups, "a");
    auto b = cfg::semantic_model_from(*cfg::train_semantic_fasttext(k_groups, training_set()), k_groups, "b");
    CHECK(a->input == b->input);
    CHECK(a->output == b->output);
    CHECK(a->labels == b->labels);
  }

  TEST_CASE("hostile input: empty, 1 MiB of one character, only images, cut UTF-8 -- classified or defaulted") {
    auto c = load_for_test(router_toml("semantic_bytes = 2048"));
    group_table t(*c);
    SUBCASE("empty content gets the default group") {
      const decision d = t.decide(auto_request(""), 0, false);
      CHECK(d.group == 3);
      CHECK(d.how == decision_how::default_group);
      CHECK(d.confidence < 0);
    }
    SUBCASE("1 MiB of one character is read up to semantic_bytes") {
      for (const char ch : {'a', ' ', '(', '\n'}) {
        const std::string big(1u << 20, ch);
        const decision d = t.decide(auto_request(big), 0, false);
        CHECK(d.group != k_none);
      }
      std::string han;
      while (han.size() < (1u << 20)) han += "码";
      CHECK(t.decide(auto_request(han), 0, false).group != k_none);
    }
    SUBCASE("only images (no text) gets the default, or the has_images rule") {
      request_fields f = auto_request("");
      f.has_images = true;
      CHECK(t.decide(f, 0, false).group == 3);
    }
    SUBCASE("a prefix never ends inside a UTF-8 sequence") {
      const std::string s = "ab码";  // 2 + 3 bytes
      CHECK(cfg::utf8_prefix(s, 4) == "ab");
      CHECK(cfg::utf8_prefix(s, 5) == s);
      CHECK(cfg::utf8_prefix(s, 2) == "ab");
    }
  }

  TEST_CASE("the auto model's order: before-rules, the classifier, other rules, the default") {
    auto c = load_for_test(router_toml("min_confidence = 0.5",
                                       "[[rule]]\ngroup = \"vision\"\nhas_images = true\npriority = \"before\"\n"
                                       "[[rule]]\ngroup = \"math\"\ncontains_any = [\"zzqq\"]\n"));
    group_table t(*c);
    request_fields img = auto_request("my python function returns None, why?");
    img.has_images = true;
    CHECK(t.decide(img, 0, false).group == 4);
    CHECK(t.decide(img, 0, false).how == decision_how::rule);
    const decision code = t.decide(auto_request("my python function returns None, why?"), 0, false);
    CHECK(code.group == 0);
    CHECK(code.how == decision_how::classifier);
    CHECK(code.confidence >= 0.5f);
    // Unsure (no known token) -> the later rule, else the default.
    const decision rule = t.decide(auto_request("zzqq"), 0, false);
    CHECK(rule.group == 1);
    CHECK(rule.how == decision_how::rule);
    SUBCASE("min_confidence 1 leaves every decision to the rules and the default") {
      auto strict = load_for_test(router_toml("min_confidence = 1.0"));
      group_table s(*strict);
      const decision d = s.decide(auto_request("my python function returns None, why?"), 0, false);
      CHECK(d.group == 3);
      CHECK(d.how == decision_how::default_group);
      CHECK(d.confidence > 0.5f);
    }
  }

  TEST_CASE("a session decides from its first user message, on every turn") {
    auto c = load_for_test(router_toml());
    group_table t(*c);
    const std::string first = "solve the equation 4x + 1 = 9";
    const std::string later = "translate this sentence into German please";
    const decision one = t.decide(auto_request(first), 0, true);
    CHECK(one.group == 1);
    CHECK(one.how == decision_how::classifier);
    const decision turn = t.decide(auto_request(later, first), 0, true);
    CHECK(turn.group == 1);
    CHECK(turn.how == decision_how::sticky);
    // Without a session the last message decides.
    CHECK(t.decide(auto_request(later, first), 0, false).group == 2);
  }

  TEST_CASE("a model_file saved by fastText decides as the model trained from the same examples") {
    auto ft = cfg::train_semantic_fasttext(k_groups, training_set());
    char path[] = "/tmp/sluice-model-XXXXXX";
    const int fd = ::mkstemp(path);
    REQUIRE(fd >= 0);
    ::close(fd);
    ft->saveModel(path);
    auto loaded = load_for_test(router_toml(std::string("model_file = \"") + path + "\""));
    auto trained = load_for_test(router_toml("classifier = \"fasttext\""));
    std::remove(path);
    REQUIRE(loaded->router.model != nullptr);
    CHECK(loaded->router.model->origin == path);
    CHECK(loaded->router.model->input == trained->router.model->input);
    group_table a(*loaded), b(*trained);
    for (const std::string& text : probe_texts()) {
      CHECK(a.decide(auto_request(text), 0, false).group == b.decide(auto_request(text), 0, false).group);
    }
  }

  TEST_CASE("explain_route prints the group, how and confidence") {
    auto c = load_for_test(router_toml());
    const std::string out = explain_route(*c, "what is the derivative of x cubed");
    REQUIRE(out.find("group: math\nhow: classifier\nconfidence: ") == 0);
    const double confidence = std::stod(out.substr(out.find("confidence: ") + 12));
    CHECK(confidence >= 0.5);
    CHECK(confidence <= 1.0);
    CHECK(explain_route(*c, "", true) == "chat\tdefault\t-\n");
  }
}
