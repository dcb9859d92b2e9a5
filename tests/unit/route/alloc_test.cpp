// route_key() and pick() run per request on a shard: they must not call
// the allocator. This binary counts every operator new.
#include <doctest/doctest.h>

#include <xxhash.h>

#include <cstdlib>
#include <new>

#include "../alloc_counter.hpp"
#include "sluice/route/table.hpp"

using namespace sluice::route;

TEST_SUITE("route::allocation") {
  TEST_CASE("route keys, group lookups and picks in every balance mode allocate nothing") {
    auto cfg = sluice::config::load(R"(
[[group]]
name = "s"
models = ["s", "s-*"]
backends = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"]
[[group]]
name = "l"
balance = "least-loaded"
backends = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
[[group]]
name = "r"
balance = "round-robin"
backends = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
[[rule]]
group = "r"
contains_any = ["word"]
[[key]]
id = "k"
key = "k"
)",
                                    "test.toml", {});
    auto* t = new table(*cfg, 0, 2);
    sluice::openai::request_fields f;
    f.model = "s-7b";
    f.system_prompt = "sys";
    f.first_user_message = "hello";
    f.last_user_message = "a word here";
    f.message_count = 2;
    const key_params params = t->keys(0);

    // No doctest macro inside the window: they may allocate themselves.
    const size_t before = sluice::test::allocations();
    uint64_t sum = 0;
    for (uint64_t i = 0; i < 1000; ++i) {
      const uint32_t g = t->groups().resolve(f, 0);
      const route_key_result k =
          route_key(params, sluice::openai::endpoint::chat_completions, f, "s", i % 2 ? "sess" : "", i);
      t->on_request_start(t->pick(g, k).backend);
      t->apply({message_kind::load_report, 0, 1, static_cast<uint32_t>(i % 3), k_none, static_cast<uint32_t>(i)});
      sum += t->pick(1, {i, key_source::random}).backend + t->pick(2, k).backend;
      sum += t->groups().resolve(sluice::openai::request_fields{.model = "auto"}, 0);
    }
    t->apply({message_kind::backend_down, 0, 0, 0, k_none, 0});
    sum += t->pick(0, {XXH3_64bits("x", 1), key_source::prefix}, 0b10).backend;
    const size_t after = sluice::test::allocations();

    CHECK(before > 0);
    CHECK(after == before);
    CHECK(sum > 0);
    delete t;
  }
}
