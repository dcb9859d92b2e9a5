#include <doctest/doctest.h>

#include <array>
#include <vector>

#include "sluice/quota/fair_queue.hpp"

using sluice::quota::fair_hook;
using sluice::quota::fair_queue;

namespace {

// Keys that keep `backlog` requests queued each; every release is served
// `tokens` weighted tokens and ends at once. Returns the releases per key.
std::vector<int> run_backlogged(fair_queue& q, std::vector<int> backlog, int releases, uint64_t tokens) {
  std::vector<std::vector<fair_hook>> hooks(backlog.size());
  std::vector<size_t> next(backlog.size(), 0);
  for (size_t k = 0; k < backlog.size(); ++k) {
    hooks[k].resize(static_cast<size_t>(backlog[k]) + static_cast<size_t>(releases) + 1);
    for (int i = 0; i < backlog[k]; ++i) REQUIRE(q.push(hooks[k][next[k]++], static_cast<uint32_t>(k), 0, 0));
  }
  std::vector<int> served(backlog.size(), 0);
  for (int r = 0; r < releases; ++r) {
    fair_hook* h = q.pop(1);
    REQUIRE(h != nullptr);
    ++served[h->key];
    q.served(h->key, static_cast<int64_t>(tokens));
    q.ended(h->key);
    // The key stays backlogged: a new request takes the released one's place.
    REQUIRE(q.push(hooks[h->key][next[h->key]++], h->key, 0, 1));
  }
  return served;
}

}  // namespace

TEST_CASE("fair_queue: backlogged keys at 4:1 demand are served alike (fcfs would serve 4:1)") {
  fair_queue q(2, 1000, 1'000'000);
  const auto served = run_backlogged(q, {24, 6}, 200, 96);
  CHECK(served[0] == 100);
  CHECK(served[1] == 100);
}

TEST_CASE("fair_queue: weights 2:1 are served 2:1") {
  fair_queue q(2, 1000, 1'000'000);
  q.set_weight(0, 2.0);
  const auto served = run_backlogged(q, {10, 10}, 300, 96);
  CHECK(served[0] == 200);
  CHECK(served[1] == 100);
}

TEST_CASE("fair_queue: a key that was idle re-enters at the lowest active counter (no banked burst)") {
  fair_queue q(2, 1000, 1'000'000);
  // Key 0 runs alone for a while.
  std::array<fair_hook, 64> a{}, b{};
  for (int i = 0; i < 10; ++i) {
    REQUIRE(q.push(a[static_cast<size_t>(i)], 0, 0, 0));
    fair_hook* h = q.pop(0);
    REQUIRE(h == &a[static_cast<size_t>(i)]);
    q.served(0, 100);
    if (i < 9) q.ended(0);  // the last one still runs: key 0 stays active
  }
  CHECK(q.counter(0) == doctest::Approx(1000));
  CHECK(q.counter(1) == 0);
  // Key 1 arrives: lifted to 1000, not left at 0 (which would give it ten
  // releases in a row).
  REQUIRE(q.push(b[0], 1, 0, 5));
  CHECK(q.counter(1) == doctest::Approx(1000));
  // Never lowered: a key ahead of the others keeps its counter.
  fair_queue r(2, 10, 1'000'000);
  r.served(1, 5000);
  fair_hook x{}, y{};
  REQUIRE(r.push(x, 0, 0, 0));
  REQUIRE(r.push(y, 1, 0, 0));
  CHECK(r.counter(1) == doctest::Approx(5000));
  CHECK(r.pop(0) == &x);
}

TEST_CASE("fair_queue: a higher priority goes first; a waiter past the age limit goes first whatever its level") {
  fair_queue q(3, 100, 1000);
  fair_hook low1{}, low2{}, high{};
  REQUIRE(q.push(low1, 0, 0, 0));
  REQUIRE(q.push(low2, 1, 0, 10));
  REQUIRE(q.push(high, 2, 1, 20));
  q.served(2, 1'000'000);  // priority is strict: its counter does not matter
  CHECK(q.pop(30) == &high);
  CHECK(q.pop(40) == &low1);
  fair_hook late_high{};
  REQUIRE(q.push(late_high, 2, 1, 1500));
  // low2 has waited 1990 ms >= 1000: aged, it goes before the higher level.
  CHECK(q.pop(2000) == &low2);
  CHECK(q.pop(2000) == &late_high);
  CHECK(q.pop(2000) == nullptr);
}

TEST_CASE("fair_queue: queue_max, a waiter that leaves, and the one that timed out") {
  fair_queue q(2, 2, 1'000'000);
  fair_hook a{}, b{}, c{};
  REQUIRE(q.push(a, 0, 0, 0));
  REQUIRE(q.push(b, 1, 0, 100));
  CHECK_FALSE(q.push(c, 0, 0, 200));  // full: refused at once
  CHECK(q.depth() == 2);
  CHECK(q.expired(500, 1000) == nullptr);
  CHECK(q.expired(1000, 1000) == &a);
  q.remove(a);  // timed out (or its client left): gone from the queue
  CHECK_FALSE(a.queued);
  q.remove(a);  // twice is harmless
  CHECK(q.depth() == 1);
  CHECK(q.expired(1050, 1000) == nullptr);
  CHECK(q.pop(1100) == &b);
  CHECK(q.depth() == 0);
  REQUIRE(q.push(c, 0, 0, 1200));
  CHECK(q.pop(1200) == &c);
}

TEST_CASE("fair_queue: what this shard served goes to the peers once, summed per key; a peer's service moves the counter only") {
  fair_queue q(3, 10, 1'000'000);
  q.set_weight(1, 2);
  q.served(0, 100);
  q.served(1, 40);
  q.served(0, 20);
  q.served(1, -10);  // a stream's estimate corrected by its usage
  CHECK(q.counter(0) == 120);
  CHECK(q.counter(1) == 15);  // (40 - 10) / weight 2
  std::vector<std::pair<uint32_t, int64_t>> sent;
  q.drain_served([&](uint32_t k, int64_t t) { sent.emplace_back(k, t); });
  CHECK(sent == std::vector<std::pair<uint32_t, int64_t>>{{0, 120}, {1, 30}});
  CHECK_FALSE(q.served_pending());
  sent.clear();
  q.drain_served([&](uint32_t k, int64_t t) { sent.emplace_back(k, t); });
  CHECK(sent.empty());
  // A peer's report: the counter moves, nothing is owed back.
  q.served_remote(2, 500);
  q.served_remote(7, 500);  // a key this snapshot does not know: ignored
  CHECK(q.counter(2) == 500);
  CHECK_FALSE(q.served_pending());
  // A key served up and down to zero is listed once and sends nothing.
  q.served(2, 5);
  q.served(2, -5);
  q.drain_served([&](uint32_t k, int64_t t) { sent.emplace_back(k, t); });
  CHECK(sent.empty());
  // The peers' service decides the order here: key 2 came first, but was
  // served more elsewhere, so key 0 goes first.
  fair_hook a{}, b{};
  REQUIRE(q.push(a, 0, 0, 1));
  REQUIRE(q.push(b, 2, 0, 0));
  CHECK(q.pop(2) == &a);
}

TEST_CASE("fair_queue: the level a release counts at, for the peers: the highest waiting, the aged as the highest") {
  fair_queue q(2, 10, 1000);
  CHECK(q.top_level(0) == 0);
  fair_hook a{}, b{};
  REQUIRE(q.push(a, 0, 0, 0));
  CHECK(q.top_level(10) == 0);
  REQUIRE(q.push(b, 1, 3, 10));
  CHECK(q.top_level(20) == 3);
  CHECK(q.next_level(20) == 3);
  CHECK(q.top_level(1000) == fair_queue::k_levels - 1);  // a's age limit: it goes first whatever its level
  CHECK(q.pop(1000) == &a);
  CHECK(q.top_level(1000) == 3);
}
