// The classifier runs per auto-model request on a shard: once built, it
// must not call the allocator. This binary counts every operator new.
#include <doctest/doctest.h>

#include <string>

#include "../alloc_counter.hpp"
#include "semantic_load.hpp"
#include "sluice/route/groups.hpp"

using namespace sluice::route;

TEST_SUITE("route::semantic allocation") {
  TEST_CASE("classifying and deciding allocate nothing, whatever the input, by either method, with topics or not") {
    for (const char* method : {"examples", "fasttext"}) {
      for (const bool topics : {false, true}) {
        CAPTURE(method);
        CAPTURE(topics);
        const std::string dir = SLUICE_ROUTER_DATA;
        std::string toml = "[router]\nsemantic = \"classifier\"\ndefault_group = \"b\"\ninclude_system = true\n";
        toml += std::string("classifier = \"") + method + "\"\n";
        toml += "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" + dir + "/code.txt\"\n";
        if (topics) toml += "topic = \"code\"\n";
        toml += "[[group]]\nname = \"b\"\nbackends = [\"http://127.0.0.1:8001\"]\nexamples_file = \"" + dir + "/chat.txt\"\n";
        if (topics) toml += "topic = \"chat\"\n";
        toml += "[[rule]]\ngroup = \"a\"\ncontains_any = [\"zzqq\"]\npriority = \"before\"\n";
        toml += "[[key]]\nid = \"k\"\nkey = \"k\"\n";
        auto cfg = load_for_test(toml);
        auto* t = new group_table(*cfg);
        const std::string big(1u << 20, 'x');
        const std::string texts[] = {"my python function returns None, why?", "你好，最近怎么样", "", big, "数据库报错 segfaults",
                                     "(((( )))) ;;; __label__a </s> 😀", "a b c d e f g h i j k l m n o p",
                                     "should I buy a laptop for college? 推荐一款手机，预算3000怎么办"};
        sluice::openai::request_fields f;
        f.model = "auto";
        f.system_prompt = "You are a helpful assistant.";

        // No doctest macro inside the window: they may allocate themselves.
        const size_t before = sluice::test::allocations();
        uint64_t groups = 0;
        for (int round = 0; round < 50; ++round) {
          for (const std::string& s : texts) {
            f.last_user_message = s;
            f.first_user_message = texts[0];
            groups += t->decide(f, 0, round % 2 == 0).group;
            groups += static_cast<uint64_t>(t->classifier()->classify(s, s) + 1);
          }
        }
        const size_t after = sluice::test::allocations();
        CHECK(after == before);
        CHECK(groups > 0);
        delete t;
      }
    }
  }
}
