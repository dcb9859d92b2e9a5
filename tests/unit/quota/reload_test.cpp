// Keys added by a config reload: shards apply the reload one after another,
// so a peer may hear of a key before it knows it.
#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "cluster.hpp"
#include "sluice/quota/shard_slices.hpp"

using namespace sluice::quota;
using sluice::quota::test::cluster;

namespace {
constexpr int64_t k_ms = 1'000'000;

slices_options with_room(uint32_t keys_max, std::atomic<int64_t>* published = nullptr) {
  slices_options o;
  o.published_stride = keys_max;
  o.published = published;
  return o;
}
}  // namespace

TEST_SUITE("quota::reload") {
  TEST_CASE("an added key starts at its home shares; existing keys keep their levels") {
    cluster c(2, {key_limits{0, 10, 0}}, 0, with_room(4));
    REQUIRE(c[0].try_reserve(0, 0, 0).result == outcome::admit);  // key 0: 5 -> 4 on shard 0
    c[0].add_keys(std::vector<key_limits>{{0, 7, 0}}, k_ms);
    CHECK(c[0].key_count() == 2);
    CHECK(c[0].level(0, resource::requests) == 4);
    CHECK(c[0].capacity(1, resource::requests) == 4);  // 7 split 4 + 3
    c[1].add_keys(std::vector<key_limits>{{0, 7, 0}}, k_ms);
    CHECK(c[1].capacity(1, resource::requests) == 3);
  }

  TEST_CASE("a borrow for a key the peer does not know yet is answered once the peer reloads; capacity is conserved") {
    cluster c(2, {key_limits{0, 10, 0}}, 0, with_room(4));
    int64_t now = k_ms;
    c[0].add_keys(std::vector<key_limits>{{0, 8, 0}}, now);  // shard 0 reloaded first: home 4
    for (int i = 0; i < 4; ++i) REQUIRE(c[0].try_reserve(1, 0, now).result == outcome::admit);
    // The fifth needs a peer's share: a lend_request to shard 1, which does
    // not know key 1 yet and keeps the request.
    CHECK(c[0].try_reserve(1, 0, now).result == outcome::wait);
    c.pump(now);
    CHECK(c[0].try_reserve(1, 0, now).result != outcome::admit);
    // Shard 1 reloads: the kept request is answered with a grant.
    now += k_ms;
    c[1].add_keys(std::vector<key_limits>{{0, 8, 0}}, now);
    now += 20 * k_ms;  // past the borrow cooldown
    c.pump(now);
    CHECK(c[0].try_reserve(1, 0, now).result == outcome::admit);
    CHECK(c[0].capacity(1, resource::requests) + c[1].capacity(1, resource::requests) == 8);
  }

  TEST_CASE("levels are published at the stride the process sized, so added keys never overlap another shard's cells") {
    std::vector<std::atomic<int64_t>> cells(2 * 3 * 2);
    for (auto& x : cells) x.store(-1);
    cluster c(2, {key_limits{100, 10, 0}}, 0, with_room(3, cells.data()));
    c[0].add_keys(std::vector<key_limits>{{60, 6, 0}}, 0);
    c[1].add_keys(std::vector<key_limits>{{60, 6, 0}}, 0);
    // [(shard * 3 + key) * 2 + tokens|requests]
    CHECK(cells[(0 * 3 + 0) * 2].load() == 50);
    CHECK(cells[(0 * 3 + 1) * 2].load() == 30);
    CHECK(cells[(0 * 3 + 1) * 2 + 1].load() == 3);
    CHECK(cells[(1 * 3 + 1) * 2].load() == 30);
    CHECK(cells[(0 * 3 + 2) * 2].load() == -1);  // room for a third key, untouched
    const rate_headers h = c[0].headers(1, 0);
    CHECK(h.tokens.limit == 60);
    CHECK(h.tokens.remaining == 60);
    CHECK(h.requests.remaining == 6);
  }
}
