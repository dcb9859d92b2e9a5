// The built-in topic vocabulary ([[group]] topic): its names, its terms,
// its matcher (longest runs of tokens, plurals, CJK), the config keys that
// turn it on, what it does to the classifier's probabilities, and the
// held-out and fresh authors' figures with it.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "semantic_load.hpp"
#include "sluice/config/semantic.hpp"
#include "sluice/config/semantic_topics.hpp"
#include "sluice/route/groups.hpp"
#include "sluice/route/semantic.hpp"

using namespace sluice::route;
namespace cfg = sluice::config;

namespace {

constexpr uint8_t k_code = 1, k_math = 2, k_translation = 4, k_chat = 8;

std::string normalized(std::string_view s) {
  std::string out(s.size() * 3 + 4, '\0');
  out.resize(cfg::semantic_normalize(s, out.data(), out.size()));
  return out;
}

cfg::topic_vocabulary::hits count(const cfg::topic_vocabulary& v, std::string_view raw) {
  cfg::topic_vocabulary::hits h{};
  v.count(normalized(raw), h);
  return h;
}

cfg::topic_vocabulary::hits builtin(std::string_view raw) { return count(cfg::topic_vocabulary::builtin(), raw); }

// The four groups of a router data dir; `topics`: code, math and
// translation name theirs; `chat`: the chat group names its own.
std::string groups_toml(const std::string& dir, bool topics, bool chat = false) {
  std::string t;
  for (const char* g : {"code", "math", "translation", "chat"}) {
    t += std::string("[[group]]\nname = \"") + g + "\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" +
         dir + "/" + g + ".txt\"\n";
    if (std::string_view(g) == "chat" ? chat : topics) t += std::string("topic = \"") + g + "\"\n";
  }
  return t + "[[key]]\nid = \"k\"\nkey = \"secret\"\n";
}

// The fresh authors of tests/data/router-fresh, in the order written:
// author_a .. author_z, then author_aa .. author_ad.
std::vector<std::string> fresh_authors() {
  std::vector<std::string> a;
  for (char c = 'a'; c <= 'z'; ++c) a.emplace_back(1, c);
  for (const char* more : {"aa", "ab", "ac", "ad"}) a.emplace_back(more);
  return a;
}

const std::string k_router = "[router]\nsemantic = \"classifier\"\ndefault_group = \"chat\"\nmin_confidence = 0.5\n";

}  // namespace

TEST_SUITE("route::semantic topics") {
  TEST_CASE("names: the four topics, both ways; anything else is none") {
    CHECK(cfg::topic_from_name("code") == cfg::semantic_topic::code);
    CHECK(cfg::topic_from_name("math") == cfg::semantic_topic::math);
    CHECK(cfg::topic_from_name("translation") == cfg::semantic_topic::translation);
    CHECK(cfg::topic_from_name("chat") == cfg::semantic_topic::chat);
    CHECK_FALSE(cfg::topic_from_name("none").has_value());
    CHECK_FALSE(cfg::topic_from_name("Code").has_value());
    CHECK_FALSE(cfg::topic_from_name("").has_value());
    for (auto t : {cfg::semantic_topic::code, cfg::semantic_topic::math, cfg::semantic_topic::translation,
                   cfg::semantic_topic::chat}) {
      CHECK(cfg::topic_from_name(cfg::topic_name(t)) == t);
    }
    CHECK(cfg::topic_name(cfg::semantic_topic::none).empty());
  }

  TEST_CASE("the built-in vocabulary: hundreds of terms, English and Chinese, as prompts are normalised") {
    const cfg::topic_vocabulary& v = cfg::topic_vocabulary::builtin();
    CHECK(v.terms() > 1000);
    CHECK(&v == &cfg::topic_vocabulary::builtin());  // built once
    // Tools, libraries and errors a handful of examples cannot hold.
    for (const char* t : {"segfault", "webpack", "venv", "kubectl", "pandas", "NullPointerException", "CMake",
                          "Node.js", "C++", "c#", "std::vector", "node_modules", "git rebase", "报错", "编译", "数据库",
                          "空指针", "ModuleNotFoundError"}) {
      CAPTURE(t);
      CHECK((v.topics_of(t) & k_code) != 0);
    }
    for (const char* t : {"integral", "eigenvalue", "hypotenuse", "方程", "定积分", "导数", "概率", "勾股定理"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == k_math);
    }
    for (const char* t : {"translate", "into French", "to Japanese", "how do you say", "翻译", "译成", "怎么说", "用日语"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == k_translation);
    }
    // Everyday life: food, travel, health, things to buy, money, family,
    // work, writing, entertainment, pets, home, weather, history, advice.
    for (const char* t : {"recipe", "air fryer", "itinerary", "jet lag", "headache", "lose weight", "laptop", "headphones",
                          "iPhone", "battery life", "rent", "salary", "credit card", "girlfriend", "cover letter",
                          "job interview", "poem", "wedding speech", "movies", "video game", "puppy", "landlord",
                          "weather", "history", "should I", "recommend", "菜谱", "旅游", "减肥", "手机", "工资", "房租",
                          "男朋友", "简历", "作文", "电影", "宠物", "装修", "天气", "唐朝", "推荐", "怎么办"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == k_chat);
    }
    // A unit asked for as "to / into / in UNIT" is a conversion, math's; a
    // unit named alone, or one that is an everyday word, is no term.
    for (const char* t : {"to celsius", "in Fahrenheit", "to pounds", "into kg", "in grams", "to km/h", "to square feet",
                          "换算", "华氏度", "英寸"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == k_math);
    }
    for (const char* t : {"celsius", "kg", "miles", "to bar", "in cups", "to stone", "from miles"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == 0);
    }
    CHECK(builtin("convert 72 fahrenheit to celsius")[1] == 1);
    CHECK(builtin("150 psi to bar")[1] == 0);  // bar is a pub too
    CHECK(builtin("I ran 5 km in 30 minutes, then went to bar")[1] == 0);
    // Writing at work is chat's; a spreadsheet is code's.
    for (const char* t : {"语气", "写个 email", "年会", "开场白", "OKR", "sound more professional", "rewrite this"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == k_chat);
    }
    for (const char* t : {"in Excel", "Excel file", "WPS", "Google Sheets", "spreadsheet", "拆成两列"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == k_code);
    }
    // Not: "excel" the verb, a machine-learning "in ML", Australia's "to
    // Oz", "in knots", 系列里 (a series), a train (一列 / 整列 / 这一列火车).
    for (const char* t : {"excel", "in ML", "to Oz", "in knots", "列里", "一列", "整列", "这一列"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == 0);
    }
    // Some terms belong to two topics.
    CHECK(v.topics_of("函数") == (k_code | k_math));
    CHECK(v.topics_of("variable") == (k_code | k_math));
    // Words as often something else, and a language named alone, are no terms.
    for (const char* t : {"French", "in Japanese", "日语", "积分", "证明", "sin", "pi", "rust", "swift", "hello", "猫",
                          "库", "the", ""}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == 0);
    }
    // Nor are everyday words as often a code prompt's or a math word
    // problem's ("poetry" is chat's, not code's).
    CHECK(v.topics_of("poetry") == k_chat);
    for (const char* t : {"game", "cookie", "date", "sleep", "cat", "job", "buy", "price", "discount", "train", "car",
                          "pizza", "series", "游戏", "工作", "对象", "运动", "行程", "水果", "电脑"}) {
      CAPTURE(t);
      CHECK(v.topics_of(t) == 0);
    }
  }

  TEST_CASE("matching: the longest run of tokens at each token, each token read once") {
    const cfg::topic_vocabulary v({"a b c, a b, x\ny, q r s t", "b c, z", "a", "z, w"});
    CHECK(v.terms() == 9);  // "z" counts once
    CHECK(count(v, "a b c") == cfg::topic_vocabulary::hits{1, 0, 0, 0});  // not "a", "a b" or "b c" as well
    CHECK(count(v, "a b d") == cfg::topic_vocabulary::hits{1, 0, 0, 0});
    CHECK(count(v, "a d b c") == cfg::topic_vocabulary::hits{0, 1, 1, 0});
    CHECK(count(v, "x y z x") == cfg::topic_vocabulary::hits{3, 1, 0, 1});  // z: math and chat
    CHECK(count(v, "w w") == cfg::topic_vocabulary::hits{0, 0, 0, 2});
    CHECK(count(v, "q r s") == cfg::topic_vocabulary::hits{0, 0, 0, 0});  // a prefix of a term is none
    CHECK(count(v, "q r s t") == cfg::topic_vocabulary::hits{1, 0, 0, 0});
    CHECK(count(v, "A, B; C!") == cfg::topic_vocabulary::hits{0, 0, 1, 0});  // punctuation tokens break the run
    CHECK(count(v, "") == cfg::topic_vocabulary::hits{0, 0, 0, 0});
    CHECK(count(v, "   ") == cfg::topic_vocabulary::hits{0, 0, 0, 0});
  }

  TEST_CASE("matching: plurals of one-token English terms, Chinese inside sentences, case and punctuation") {
    CHECK(builtin("why do I keep getting segfaults")[0] == 1);
    CHECK(builtin("WEBPACK and Vite both fail")[0] == 2);
    CHECK(builtin("my Node.js server crashed")[0] == 1);
    CHECK(builtin("为什么我的代码一直报错")[0] == 2);       // 代码, 报错
    CHECK(builtin("数据库连接失败")[0] == 1);               // 数据库, not 数据 as well
    CHECK(builtin("求这个定积分和导数")[1] == 2);
    CHECK(builtin("把这句话翻译成日语")[2] == 1);           // 翻译成 (日语 alone is no term)
    CHECK(builtin("plot the sines and cosines")[1] == 2);  // plurals of four letters or more
    CHECK(builtin("translate this into Spanish please")[2] == 2);
    // Everyday chat: no code, math or translation term; chat's own.
    CHECK(builtin("tell me about French history") == cfg::topic_vocabulary::hits{0, 0, 0, 1});
    CHECK(builtin("what should I cook tonight") == cfg::topic_vocabulary::hits{0, 0, 0, 3});  // should i, cook, tonight
    CHECK(builtin("周末去哪里玩比较好") == cfg::topic_vocabulary::hits{0, 0, 0, 2});          // 周末, 去哪里玩
    CHECK(builtin("which laptop should I buy for college? recipes for a cheap dinner") ==
          cfg::topic_vocabulary::hits{0, 0, 0, 6});  // laptop, should i, college, recipes, cheap, dinner
    CHECK(builtin("我想买个手机，预算三千，有什么推荐") == cfg::topic_vocabulary::hits{0, 0, 0, 3});  // 手机, 预算, 有什么推荐
    CHECK(builtin("find the derivative of x^2")[3] == 0);
    CHECK(builtin("webpack build dies with a segfault")[3] == 0);
    // Words of a field that are as often everyday words are none of its
    // terms (chat's own may count): an "s" after three letters, "in
    // LANGUAGE", phrases of speech, Chinese words with an everyday sense
    // (points, a certificate, a language named alone).
    for (const char* chat : {"the sins of my father", "tans and freckles after the beach",
                             "in English class today we read a poem", "how do I say no to my boss",
                             "he repeated my speech word for word", "is it good to raise bilingual kids",
                             "我的会员积分怎么兑换", "去公司开个证明", "我在学英语", "这次考试分数不高",
                             "房子有多少平方米"}) {
      CAPTURE(chat);
      const cfg::topic_vocabulary::hits got = builtin(chat);
      CHECK(got[0] == 0);
      CHECK(got[1] == 0);
      CHECK(got[2] == 0);
    }
  }

  TEST_CASE("an everyday quantity question: a question of amount and two numbers add two of math's hits") {
    const auto q = [](std::string_view raw) { return cfg::quantity_question(normalized(raw)); };
    // Digits, English number words, Chinese numerals; the question's words.
    CHECK(q("we are 3 adults and 2 kids, how much rice should I cook"));
    CHECK(q("if the bus leaves at 7 and the ride is forty minutes what time do I get there"));
    CHECK(q("a dozen eggs cost three dollars so how many can I buy with twenty"));
    CHECK(q("一箱苹果二十四个 分给六个小朋友 每人几个"));
    CHECK(q("房租每月三千五 押一付三 一共要交多少"));
    CHECK(q("油价7块8一升 开了350公里 用了多少钱"));
    CHECK(q("买了三斤苹果两斤梨 还剩多少钱没花"));
    // One number, or none: no quantity to work out.
    CHECK_FALSE(q("how many people live in Tokyo"));
    CHECK_FALSE(q("how much should I tip in 2024"));
    CHECK_FALSE(q("这个多少钱"));
    // Numbers without the question of amount.
    CHECK_FALSE(q("I have 2 cats and 3 dogs, any tips for a road trip"));
    CHECK_FALSE(q("三个人去两天 推荐一下景点"));
    // "one" is "which one"; 一 alone is "a": neither is a number.
    CHECK_FALSE(q("which one is better, how much does it matter"));
    CHECK_FALSE(q("我有一个问题 一共有多少"));
    CHECK(q("我有一百二十块 买了一个四十的 还剩多少"));
    // A measure word after the number (七个, 五斤), or a run of numerals.
    CHECK(q("七个人 五斤肉 够不够 每人多少"));
    CHECK_FALSE(q("人 肉 每人多少"));

    // In count(): two hits on math, whatever else matched.
    const cfg::topic_vocabulary v({"x", "y", "z", "w"});
    CHECK(count(v, "how many boxes for 12 books if 4 fit in one") == cfg::topic_vocabulary::hits{0, 2, 0, 0});
    CHECK(count(v, "how many boxes for books") == cfg::topic_vocabulary::hits{0, 0, 0, 0});
    CHECK(count(v, "y: how many boxes for 12 books if 4 fit in one") == cfg::topic_vocabulary::hits{0, 3, 0, 0});
    // The tokens inside a longer term's match are read for it too.
    const cfg::topic_vocabulary runs({"how many boxes", "", "", ""});
    CHECK(count(runs, "how many boxes for 12 books if 4 fit in one") == cfg::topic_vocabulary::hits{1, 2, 0, 0});
    CHECK(count(runs, "so 12 books, 4 a box: how many boxes") == cfg::topic_vocabulary::hits{1, 2, 0, 0});
  }

  TEST_CASE("config: topic per group, checked; topic_weight in [router]") {
    const std::string dir = SLUICE_ROUTER_DATA;
    auto c = load_for_test(k_router + "topic_weight = 1.5\n" + groups_toml(dir, true));
    CHECK(c->groups[0].topic == cfg::semantic_topic::code);
    CHECK(c->groups[1].topic == cfg::semantic_topic::math);
    CHECK(c->groups[2].topic == cfg::semantic_topic::translation);
    CHECK(c->groups[3].topic == cfg::semantic_topic::none);
    const cfg::semantic_model& m = *c->router.model;
    CHECK(m.topics);
    CHECK(m.topic_weight == doctest::Approx(1.5));
    REQUIRE(m.label_topic.size() == m.labels.size());
    for (size_t l = 0; l < m.labels.size(); ++l) {
      CHECK(m.label_topic[l] == (m.labels[l] == "chat" ? cfg::semantic_topic::none : *cfg::topic_from_name(m.labels[l])));
    }
    auto chatty = load_for_test(k_router + groups_toml(dir, true, true));
    CHECK(chatty->groups[3].topic == cfg::semantic_topic::chat);
    for (size_t l = 0; l < chatty->router.model->labels.size(); ++l) {
      CHECK(chatty->router.model->label_topic[l] == *cfg::topic_from_name(chatty->router.model->labels[l]));
    }
    auto plain = load_for_test(k_router + groups_toml(dir, false));
    CHECK_FALSE(plain->router.model->topics);
    CHECK(plain->router.topic_weight == doctest::Approx(2.0));

    const std::string one = "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples = [\"x y\"]\n";
    const std::string two = "[[group]]\nname = \"b\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples = [\"p q\"]\n";
    const std::string key = "[[key]]\nid = \"k\"\nkey = \"secret\"\n";
    const std::string router = "[router]\nsemantic = \"classifier\"\n";
    CHECK_THROWS_WITH_AS(load_for_test(router + one + "topic = \"cooking\"\n" + two + key),
                         doctest::Contains("not a built-in topic; allowed: code, math, translation, chat"), cfg::config_error);
    CHECK_THROWS_WITH_AS(load_for_test(router + one + two + key +
                                       "[[group]]\nname = \"c\"\nbackends = [\"http://127.0.0.1:8001\"]\ntopic = \"math\"\n"),
                         doctest::Contains("group.topic"), cfg::config_error);
    CHECK_THROWS_WITH_AS(load_for_test(router + "topic_weight = 11\n" + one + two + key),
                         doctest::Contains("router.topic_weight"), cfg::config_error);
    CHECK_THROWS_WITH_AS(load_for_test(router + one + "topic = 3\n" + two + key), doctest::Contains("group.topic"),
                         cfg::config_error);
    CHECK_THROWS_WITH_AS(load_for_test(router + "topic_weight = -0.5\n" + one + two + key),
                         doctest::Contains("router.topic_weight"), cfg::config_error);
    // With no classifier a topic would be read by nothing: refused.
    CHECK_THROWS_WITH_AS(load_for_test("[router]\nsemantic = \"off\"\n" + one + "topic = \"code\"\n" + two + key),
                         doctest::Contains("needs [router] semantic = \"classifier\""), cfg::config_error);
    CHECK_THROWS_WITH_AS(load_for_test(one + "topic = \"code\"\n" + two + key),
                         doctest::Contains("needs [router] semantic = \"classifier\""), cfg::config_error);
  }

  TEST_CASE("the classifier: a topic's hits move probability to its group; none named, nothing changes") {
    const std::string dir = SLUICE_ROUTER_DATA;
    for (const char* method : {"examples", "fasttext"}) {
      CAPTURE(method);
      const std::string m = std::string("classifier = \"") + method + "\"\n";
      auto with = load_for_test(k_router + m + groups_toml(dir, true));
      auto without = load_for_test(k_router + m + groups_toml(dir, false));
      semantic_classifier a(with->router.model, 2048), b(without->router.model, 2048);
      const cfg::semantic_model& model = *with->router.model;
      // A group with no topic, to measure the others' odds against.
      size_t other = 0;
      while (model.label_topic[other] != cfg::semantic_topic::none) ++other;
      // Each prompt: the hits it must have (code, math, translation), at
      // least; the last has more than the cap.
      const std::pair<const char*, cfg::topic_vocabulary::hits> prompts[] = {
          {"webpack keeps rebuilding forever", {1, 0, 0}},
          {"kubectl apply hangs", {1, 0, 0}},
          {"求这个定积分和导数", {0, 2, 0}},
          {"translate this into Spanish please", {0, 0, 2}},
          {"webpack, vite, kubectl and docker all fail", {4, 0, 0}},
          {"hello there", {0, 0, 0}},
          {"你好", {0, 0, 0}},
      };
      for (const auto& [p, want] : prompts) {
        CAPTURE(p);
        a.classify("", p);
        b.classify("", p);
        const auto pa = a.probabilities(), pb = b.probabilities();
        double sum = 0;
        for (float x : pa) sum += static_cast<double>(x);
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
        REQUIRE(a.topic_hits() == want);
        // Each topic's group: its odds against the group without a topic
        // grow by e^(weight x hits), the hits capped at 2.
        for (size_t l = 0; l < pa.size(); ++l) {
          if (l == other) continue;
          const auto t = static_cast<size_t>(model.label_topic[l]);
          const uint32_t hits = t == 0 ? 0 : std::min<uint32_t>(want[t - 1], cfg::k_topic_hits_max);
          CAPTURE(model.labels[l]);
          const double before = std::log(static_cast<double>(pb[l]) / static_cast<double>(pb[other]));
          const double after = std::log(static_cast<double>(pa[l]) / static_cast<double>(pa[other]));
          CHECK(after - before == doctest::Approx(2.0 * hits).epsilon(1e-3));
        }
      }
      // No group names a topic: no vocabulary read.
      b.classify("", "segfault in webpack");
      CHECK(b.topic_hits() == cfg::topic_vocabulary::hits{0, 0, 0, 0});
    }
  }

  TEST_CASE("the classifier with chat's topic too: each group's odds move by its own topic's hits") {
    const std::string dir = SLUICE_ROUTER_DATA;
    for (const char* method : {"examples", "fasttext"}) {
      CAPTURE(method);
      const std::string m = std::string("classifier = \"") + method + "\"\n";
      auto with = load_for_test(k_router + m + groups_toml(dir, true, true));
      auto without = load_for_test(k_router + m + groups_toml(dir, false));
      semantic_classifier a(with->router.model, 2048), b(without->router.model, 2048);
      const cfg::semantic_model& model = *with->router.model;
      for (const char* p : {"which laptop should I buy for college", "我想买个手机，预算三千，有什么推荐",
                            "my laptop's docker build fails with a segfault", "hello there"}) {
        CAPTURE(p);
        a.classify("", p);
        b.classify("", p);
        const auto pa = a.probabilities(), pb = b.probabilities();
        const auto capped = [&](size_t l) {
          const size_t t = static_cast<size_t>(model.label_topic[l]);
          return static_cast<double>(std::min<uint32_t>(a.topic_hits()[t - 1], cfg::k_topic_hits_max));
        };
        for (size_t x = 0; x < pa.size(); ++x) {
          for (size_t y = 0; y < pa.size(); ++y) {
            const double before = std::log(static_cast<double>(pb[x]) / static_cast<double>(pb[y]));
            const double after = std::log(static_cast<double>(pa[x]) / static_cast<double>(pa[y]));
            CHECK(after - before == doctest::Approx(2.0 * (capped(x) - capped(y))).epsilon(1e-3));
          }
        }
      }
      a.classify("", "which laptop should I buy for college");
      CHECK(a.topic_hits()[3] >= 2);
      CHECK(a.topic_hits()[0] == 0);
    }
  }

  TEST_CASE("on prompts written apart from its 25 examples a group, with topics it routes at least 90 % right") {
    // bench/router-eval --heldout's setting with its config's topics, chat's
    // included: 95.6 % when this was written (92.5 % without chat's, 86.2 %
    // without any).
    const std::string dir = SLUICE_ROUTER_HELDOUT;
    auto c = load_for_test(k_router + groups_toml(dir, true, true));
    size_t total = 0;
    const size_t right = routed_right(*c, dir + "/heldout.tsv", total);
    CHECK(total == 160);
    MESSAGE("held-out with topics: ", right, "/", total);
    CHECK(right * 100 >= total * 90);
  }

  TEST_CASE("on thirty fresh authors' 3000 prompts, with topics it routes at least 91.5 % right, and without them less") {
    // bench/router-eval --fresh's last setting: every fresh author at once,
    // trained on the held-out author's 25 a group. 2762/3000 (92.1 %) with
    // the four topics when this was written (2695 before an unbacked pick
    // yielded to a backed one, and code's needed 0.75, and before units,
    // work writing and spreadsheets joined the topics), and 2345/3000
    // (78.2 %) without any topic. The fourth to fifteenth pairs were each
    // read once after the method of their time was fixed (bench/RESULTS.md);
    // this holds the figure from falling.
    const std::string dir = SLUICE_ROUTER_HELDOUT, fresh = SLUICE_ROUTER_FRESH;
    auto with = load_for_test(k_router + groups_toml(dir, true, true));
    auto without = load_for_test(k_router + groups_toml(dir, false));
    size_t right_with = 0, right_without = 0, total = 0;
    for (const std::string& a : fresh_authors()) {
      const std::string path = fresh + "/author_" + a + ".tsv";
      size_t n = 0, m = 0;
      right_with += routed_right(*with, path, n);
      right_without += routed_right(*without, path, m);
      CHECK(n == 100);
      CHECK(m == 100);
      total += n;
    }
    MESSAGE("fresh authors: ", right_with, "/", total, " with topics, ", right_without, " without");
    CHECK(total == 3000);
    CHECK(right_with * 1000 >= total * 915);
    CHECK(right_without < right_with);
  }

  TEST_CASE("a pick its topic backs stands; one on the examples alone needs min_confidence (code 0.75), else yields to a backed pick or the default") {
    // Every fresh author's prompt through the held-out setting with topics,
    // each decision against the classifier's own output: the top label
    // stands when its group's topic matched a term (any probability) or
    // its probability reaches max(min_confidence 0.5, unbacked_confidence:
    // code 0.75, the others 0); otherwise the most probable label whose
    // topic matched is the pick, and with none the default group.
    const std::string dir = SLUICE_ROUTER_HELDOUT, fresh = SLUICE_ROUTER_FRESH;
    auto c = load_for_test(k_router + groups_toml(dir, true, true));
    group_table t(*c);
    semantic_classifier sc(c->router.model, c->router.semantic_bytes);
    const auto& labels = c->router.model->labels;
    size_t backed_low = 0, sure = 0, yielded = 0, fell = 0, code_mid = 0;
    size_t yielded_right = 0, replaced_right = 0;
    for (const std::string& a : fresh_authors()) {
      for (const std::string& line : read_lines(fresh + "/author_" + a + ".tsv")) {
        const std::string label = line.substr(0, line.find('\t'));
        const std::string text = line.substr(line.find('\t') + 1);
        sluice::openai::request_fields f;
        f.model = "auto";
        f.last_user_message = f.first_user_message = text;
        f.message_count = 1;
        const decision d = t.decide(f, 0, false);
        const int32_t top = sc.classify("", text);
        REQUIRE(top >= 0);
        CAPTURE(text);
        const float p = sc.probabilities()[static_cast<size_t>(top)];
        const bool code = labels[static_cast<size_t>(top)] == "code";
        const double need = code ? 0.75 : 0.5;
        if (sc.label_topic_hits(top) > 0 || static_cast<double>(p) >= need) {
          CHECK(d.how == decision_how::classifier);
          CHECK(d.label == top);
          CHECK(d.confidence == p);
          ++(p < 0.5f ? backed_low : sure);
          continue;
        }
        if (code && p >= 0.5f) ++code_mid;
        int32_t backed = -1;
        for (size_t l = 0; l < labels.size(); ++l) {
          if (sc.label_topic_hits(static_cast<int32_t>(l)) > 0 &&
              (backed < 0 || sc.probabilities()[l] > sc.probabilities()[static_cast<size_t>(backed)])) {
            backed = static_cast<int32_t>(l);
          }
        }
        if (backed >= 0) {
          CHECK(d.how == decision_how::classifier);
          CHECK(d.label == backed);
          CHECK(d.label != top);
          CHECK(d.confidence == sc.probabilities()[static_cast<size_t>(backed)]);
          ++yielded;
          yielded_right += labels[static_cast<size_t>(backed)] == label;
          replaced_right += labels[static_cast<size_t>(top)] == label;
        } else {
          CHECK(d.how == decision_how::default_group);
          CHECK(d.label == top);
          ++fell;
        }
      }
    }
    MESSAGE("backed under 0.5: ", backed_low, ", sure: ", sure, ", yielded to a backed pick: ", yielded, " (", yielded_right,
            " right, the top pick ", replaced_right, "), to the default: ", fell, ", code unbacked in [0.5, 0.75): ", code_mid);
    CHECK(backed_low >= 20);
    CHECK(yielded >= 20);
    CHECK(fell >= 20);
    CHECK(code_mid >= 20);
    // A yield is right more often than the pick it replaced.
    CHECK(yielded_right > replaced_right);
  }
  TEST_CASE("the yield goes only to a group the key may reach; a group without a topic yields nothing") {
    // "标准差怎么算" in the held-out setting: chat 0.386 with no chat term,
    // math's topic matched (0.292). Key 0 reaches every group, key 1 only
    // code and chat.
    const std::string dir = SLUICE_ROUTER_HELDOUT;
    const std::string narrow = "[[key]]\nid = \"narrow\"\nkey = \"secret2\"\ngroups = [\"code\", \"chat\"]\n";
    auto c = load_for_test(k_router + groups_toml(dir, true, true) + narrow);
    group_table t(*c);
    sluice::openai::request_fields f;
    f.model = "auto";
    f.last_user_message = f.first_user_message = "标准差怎么算";
    f.message_count = 1;
    const auto& labels = c->router.model->labels;
    const decision all = t.decide(f, 0, false);
    REQUIRE(all.label >= 0);
    CHECK(labels[static_cast<size_t>(all.label)] == "math");
    CHECK(all.how == decision_how::classifier);
    CHECK(all.confidence < 0.5f);
    const decision some = t.decide(f, 1, false);
    CHECK(some.how == decision_how::default_group);  // no backed group it may reach: the default (chat)
    CHECK(c->groups[some.group].name == "chat");
    CHECK(labels[static_cast<size_t>(some.label)] == "chat");  // the top label kept, not the unreachable one
    // The same prompt with chat's group naming no topic: its pick under
    // min_confidence goes to the rules and the default, as without topics,
    // though math's topic matched.
    auto c2 = load_for_test(k_router + groups_toml(dir, true, false));
    group_table t2(*c2);
    const decision d2 = t2.decide(f, 0, false);
    const auto& labels2 = c2->router.model->labels;
    REQUIRE(d2.label >= 0);
    CHECK(labels2[static_cast<size_t>(d2.label)] == "chat");
    CHECK(d2.how == decision_how::default_group);
    CHECK(d2.confidence < 0.5f);
  }
}
