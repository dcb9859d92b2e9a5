// Reserve at admission, settle on real usage: the acceptance scenarios of
// issue 4 on one shard and on several shards whose peers lend.
#include <doctest/doctest.h>

#include <vector>

#include "cluster.hpp"
#include "sluice/quota/estimate.hpp"
#include "sluice/quota/shard_slices.hpp"

using namespace sluice::quota;
using sluice::quota::test::cluster;

namespace {
constexpr int64_t k_ms = 1'000'000;
constexpr int64_t k_s = 1'000'000'000;

// Admits on shard `at`, pumping peers' answers while the shard waits for a
// borrow round, as the proxy would park and retry the request.
decision admit_on(cluster& c, uint32_t at, uint32_t key, uint64_t cost, int64_t now_ns) {
  for (int tries = 0;; ++tries) {
    const decision d = c[at].try_reserve(key, cost, now_ns);
    if (d.result != outcome::wait || tries > 4) return d;
    c.pump(now_ns);
  }
}
}  // namespace

TEST_SUITE("quota::reserve") {
  TEST_CASE("with 3000 tokens per minute, 20 sequential requests of max_tokens 1000 answering 10 tokens all pass") {
    for (uint32_t shards : {1u, 2u, 4u}) {
      CAPTURE(shards);
      cluster c(shards, {key_limits{3000, 0, 0}}, 0);
      const uint64_t input = estimate_input_tokens("Say hello in one short sentence.");
      const uint64_t cost = admission_cost(input, 1000, 1, 2);
      REQUIRE(cost <= 3000);
      int64_t now = 0;
      int admitted = 0;
      for (int i = 0; i < 20; ++i) {
        now += 50 * k_ms;  // back to back: far less than the 40 s refill of one request
        decision d = admit_on(c, 0, 0, cost, now);
        CHECK(d.result == outcome::admit);
        if (d.result != outcome::admit) continue;
        ++admitted;
        CHECK(c[0].settle(d.held, usage_cost(input, 10, 1, 2), now + 10 * k_ms));
      }
      CHECK(admitted == 20);
    }
  }

  TEST_CASE("sequential requests that land on alternating shards all pass (each borrows back what the other holds)") {
    for (uint32_t shards : {2u, 3u, 4u}) {
      CAPTURE(shards);
      cluster c(shards, {key_limits{3000, 100, 0}}, 0);
      const uint64_t input = estimate_input_tokens("Say hello in one short sentence.");
      const uint64_t cost = admission_cost(input, 1000, 1, 2);
      int64_t now = 0;
      int admitted = 0;
      for (int i = 0; i < 20; ++i) {
        now += 3 * k_ms;  // faster than the borrow cooldown
        const uint32_t at = static_cast<uint32_t>(i) % shards;
        decision d = admit_on(c, at, 0, cost, now);
        CAPTURE(i);
        CHECK(d.result == outcome::admit);
        if (d.result != outcome::admit) continue;
        ++admitted;
        now += k_ms;
        c.pump(now);
        CHECK(c[at].settle(d.held, usage_cost(input, 10, 1, 2), now));
        c.pump(now);
      }
      CHECK(admitted == 20);
    }
  }

  TEST_CASE("five concurrent requests that each reserve 2010 of 3000 tokens: only the first is admitted") {
    for (uint32_t shards : {1u, 4u}) {
      CAPTURE(shards);
      cluster c(shards, {key_limits{3000, 0, 0}}, 0);
      std::vector<decision> held;
      int64_t admitted_tokens = 0;
      for (int i = 0; i < 5; ++i) {
        decision d = admit_on(c, 0, 0, 2010, k_ms * i);
        if (i == 0) {
          CHECK(d.result == outcome::admit);
        } else {
          CHECK(d.result == outcome::reject_tokens);
          CHECK_FALSE(d.too_large);
          CHECK(d.retry_after_ms > 0);
        }
        if (d.result == outcome::admit) admitted_tokens += d.held.tokens;
        held.push_back(d);
      }
      CHECK(admitted_tokens <= 3000);
      // The rejected ones were told when 2010 tokens are back: 1020 missing
      // at 3000 per minute is 20.4 s.
      if (shards == 1) CHECK(held[1].retry_after_ms == 20'400);
    }
  }

  TEST_CASE("shards that all borrow for one key at once: exactly one request is admitted, not none") {
    // Each of 2010 of 3000 tokens: no slice can cover it alone, and every
    // shard asks its peers at the same moment. Lending to each other what
    // each asks for would swap equal amounts and admit nobody.
    for (uint32_t shards : {2u, 3u, 4u}) {
      CAPTURE(shards);
      cluster c(shards, {key_limits{3000, 0, 0}}, 0);
      for (uint32_t i = 0; i < shards; ++i) REQUIRE(c[i].try_reserve(0, 2010, 0).result == outcome::wait);
      int admitted = 0;
      for (int rounds = 0; rounds < 3; ++rounds) {
        c.pump(k_ms);
        for (uint32_t i = 0; i < shards; ++i) {
          const decision d = c[i].try_reserve(0, 2010, k_ms);
          if (d.result == outcome::admit) ++admitted;
        }
      }
      CHECK(admitted == 1);
      const auto t = c.sum(0, resource::tokens);
      CHECK(t.capacity == 3000);
      CHECK(t.level_within_capacity);
    }
  }

  TEST_CASE("contending shards whose answers fall on both sides of a priority slot's end still admit one") {
    // Rounds start at 99 and 99.5 ms; shard 1 answers at 99.8 ms, shard 0
    // at 100.2 ms, in the next 100 ms slot. Each taking the slot of its own
    // answer would see a different leader: both lent (an even swap) and
    // nobody was admitted. The slot of the earlier round start is one for
    // both.
    cluster c(2, {key_limits{3000, 0, 0}}, 0);
    const int64_t t0 = 99 * k_ms, t1 = 99 * k_ms + k_ms / 2;
    REQUIRE(c[0].try_reserve(0, 2010, t0).result == outcome::wait);
    c.drain(0, t0, 0);
    REQUIRE(c[1].try_reserve(0, 2010, t1).result == outcome::wait);
    c.drain(1, t1, 0);
    const int64_t answer1 = 99 * k_ms + 8 * k_ms / 10, answer0 = 100 * k_ms + 2 * k_ms / 10;
    REQUIRE(c.deliver(0, 1, answer1) == 1);  // shard 1 answers shard 0's request
    c.drain(1, answer1, 0);
    REQUIRE(c.deliver(1, 0, answer0) == 2);  // shard 0 answers, and takes shard 1's grant
    c.drain(0, answer0, 0);
    REQUIRE(c.deliver(0, 1, answer0) == 1);  // shard 1 takes shard 0's grant
    int admitted = 0;
    for (uint32_t i = 0; i < 2; ++i) admitted += c[i].try_reserve(0, 2010, answer0).result == outcome::admit ? 1 : 0;
    CHECK(admitted == 1);
    const auto t = c.sum(0, resource::tokens);
    CHECK(t.capacity == 3000);
    CHECK(t.level_within_capacity);
  }

  TEST_CASE("two shards that both stay short for one key both keep admitting: neither gets under a third") {
    // 30,000 tokens per minute asked for at ~240 times that rate from both
    // shards (every 5 ms each tries a request of 300): every round is
    // contended. Priority rotates, so both shards keep admitting (with a
    // fixed winner the other got ~28% and lost its rate to the winner).
    cluster c(2, {key_limits{30000, 0, 0}}, 0);
    int admitted[2] = {0, 0};
    reservation held[2];
    for (int64_t t = 0; t < 60'000 * k_ms; t += 5 * k_ms) {
      for (int pass = 0; pass < 2; ++pass) {
        for (uint32_t i = 0; i < 2; ++i) {
          if (held[i].live) c[i].settle(held[i], 300, t);
          const decision d = c[i].try_reserve(0, 300, t);
          if (d.result == outcome::admit) {
            ++admitted[i];
            held[i] = d.held;
          }
        }
        c.pump(t);
      }
      c[0].tick(t);
      c[1].tick(t);
    }
    CAPTURE(admitted[0]);
    CAPTURE(admitted[1]);
    CHECK(admitted[0] + admitted[1] >= 140);  // ~30,000 / 300 per minute, plus the first full bucket
    CHECK(admitted[0] * 3 >= (admitted[0] + admitted[1]));
    CHECK(admitted[1] * 3 >= (admitted[0] + admitted[1]));
  }

  TEST_CASE("a borrow round past its timeout no longer counts as contention: the shard lends again") {
    // Shard 0's round never completes (its request to shard 1 is never
    // delivered). Past round_timeout it lends to a higher-numbered
    // borrower as before, instead of refusing it for good.
    slices_options o;
    cluster c(2, {key_limits{3000, 0, 0}}, 0, o);
    REQUIRE(c[0].try_reserve(0, 2010, 0).result == outcome::wait);
    c[0].drain_outbox(1, [](const message*, size_t n) { return n; });  // lost on the way
    const int64_t later = o.round_timeout_ns + k_ms;
    REQUIRE(c[1].try_reserve(0, 2010, later).result == outcome::wait);
    std::vector<uint32_t> completed;
    c.pump(later, &completed);
    REQUIRE(completed.size() == 1);
    CHECK(c[1].try_reserve(0, 2010, later).result == outcome::admit);
  }

  TEST_CASE("a request larger than the whole bucket is rejected as too large") {
    cluster c(1, {key_limits{3000, 0, 0}}, 0);
    const decision d = c[0].try_reserve(0, 3001, 0);
    CHECK(d.result == outcome::reject_tokens);
    CHECK(d.too_large);
    CHECK(c[0].try_reserve(0, 3000, 0).result == outcome::admit);
  }

  TEST_CASE("settling is exactly once: a second settle changes nothing") {
    cluster c(1, {key_limits{3000, 0, 2}}, 0);
    decision d = c[0].try_reserve(0, 2000, 0);
    REQUIRE(d.result == outcome::admit);
    CHECK(c[0].level(0, resource::tokens) == 1000);
    CHECK(c[0].settle(d.held, 500, 0));
    CHECK(c[0].level(0, resource::tokens) == 2500);
    CHECK_FALSE(c[0].settle(d.held, 0, 0));
    CHECK(c[0].level(0, resource::tokens) == 2500);
    CHECK(c[0].level(0, resource::concurrency) == 2);
  }

  TEST_CASE("usage above the reservation is charged, as a debt that refill repays") {
    cluster c(1, {key_limits{600, 0, 0}}, 0);
    decision d = c[0].try_reserve(0, 100, 0);
    REQUIRE(d.result == outcome::admit);
    CHECK(c[0].settle(d.held, 900, 0));
    CHECK(c[0].level(0, resource::tokens) == -300);
    CHECK(c[0].try_reserve(0, 1, 0).result == outcome::reject_tokens);
    CHECK(c[0].try_reserve(0, 1, 31 * k_s).result == outcome::admit);  // 310 back after 31 s
  }

  TEST_CASE("requests per minute and max concurrent are enforced and named in the rejection") {
    cluster c(1, {key_limits{0, 3, 2}}, 0);
    decision a = c[0].try_reserve(0, 10, 0);
    decision b = c[0].try_reserve(0, 10, 0);
    CHECK(a.result == outcome::admit);
    CHECK(b.result == outcome::admit);
    const decision third = c[0].try_reserve(0, 10, 0);
    CHECK(third.result == outcome::reject_concurrency);
    CHECK(third.retry_after_ms > 0);
    CHECK(c[0].settle(a.held, 0, 0));
    decision d = c[0].try_reserve(0, 10, 0);
    CHECK(d.result == outcome::admit);  // a slot came back, and one request is left
    CHECK(c[0].settle(b.held, 0, 0));
    const decision fourth = c[0].try_reserve(0, 10, 0);
    CHECK(fourth.result == outcome::reject_requests);
    CHECK(fourth.retry_after_ms == 20'000);  // 3 per minute: one every 20 s
    CHECK(c[0].try_reserve(0, 10, 20 * k_s).result == outcome::admit);
  }

  TEST_CASE("zero limits mean unlimited") {
    cluster c(2, {key_limits{}}, 0);
    for (int i = 0; i < 1000; ++i) {
      decision d = c[0].try_reserve(0, 1'000'000, 0);
      REQUIRE(d.result == outcome::admit);
      CHECK(d.held.tokens == 0);
    }
    CHECK(c[0].outbox_empty());
    const rate_headers h = c[0].headers(0, 0);
    CHECK(h.tokens.limit == 0);
    CHECK(h.requests.limit == 0);
  }

  TEST_CASE("a shard that is short waits for one borrow round, then admits with the lent tokens") {
    cluster c(4, {key_limits{4000, 0, 0}}, 0);
    CHECK(c[0].capacity(0, resource::tokens) == 1000);
    const decision first = c[0].try_reserve(0, 2500, 0);
    CHECK(first.result == outcome::wait);
    CHECK(c[0].try_reserve(0, 2500, 0).result == outcome::wait);  // one round at a time
    std::vector<uint32_t> completed;
    c.pump(k_ms, &completed);
    REQUIRE(completed.size() == 1);
    CHECK(completed[0] == 0);
    CHECK(c[0].capacity(0, resource::tokens) > 2500);
    CHECK(c[0].try_reserve(0, 2500, k_ms).result == outcome::admit);
    const auto t = c.sum(0, resource::tokens);
    CHECK(t.capacity == 4000);
  }

  TEST_CASE("a wait names the resource it waits for: a key limited by requests only is refused as 'requests' if the wait runs out") {
    cluster c(2, {key_limits{0, 4, 0}}, 0);  // 4 requests per minute, unlimited tokens: 2 per shard
    CHECK(c[0].try_reserve(0, 10, 0).result == outcome::admit);
    CHECK(c[0].try_reserve(0, 10, 0).result == outcome::admit);
    const decision d = c[0].try_reserve(0, 10, 0);  // the slice is empty: a borrow round goes out
    REQUIRE(d.result == outcome::wait);
    CHECK(d.wait_rejection == outcome::reject_requests);
    CHECK(d.wait_retry_after_ms == 15'000);  // 4 per minute: one every 15 s
    // A token-limited key waits for tokens.
    cluster t(2, {key_limits{1000, 0, 0}}, 0);
    const decision e = t[0].try_reserve(0, 800, 0);
    REQUIRE(e.result == outcome::wait);
    CHECK(e.wait_rejection == outcome::reject_tokens);
    CHECK(e.wait_retry_after_ms > 0);
  }

  TEST_CASE("after a round that brought too little the next try is rejected until the cooldown ends") {
    cluster c(2, {key_limits{1000, 0, 0}}, 0);
    decision hot = c[1].try_reserve(0, 400, 0);  // shard 1 is active: lends only above half its home
    REQUIRE(hot.result == outcome::admit);
    CHECK(c[0].try_reserve(0, 900, 0).result == outcome::wait);
    c.pump(0);
    const decision d = c[0].try_reserve(0, 900, 0);
    CHECK(d.result == outcome::reject_tokens);
    CHECK_FALSE(d.too_large);
    CHECK(d.retry_after_ms >= 1);
  }

  TEST_CASE("rate-limit header values: limit, remaining and time until full") {
    cluster c(1, {key_limits{6000, 60, 0}}, 0);
    decision d = c[0].try_reserve(0, 3000, 0);
    REQUIRE(d.result == outcome::admit);
    const rate_headers h = c[0].headers(0, 0);
    CHECK(h.tokens.limit == 6000);
    CHECK(h.tokens.remaining == 3000);
    CHECK(h.tokens.reset_ms == 30'000);
    CHECK(h.requests.limit == 60);
    CHECK(h.requests.remaining == 59);
    CHECK(h.requests.reset_ms == 1'000);
  }

  TEST_CASE("an idle shard hands capacity above its home share back to its peers") {
    slices_options o;
    cluster c(4, {key_limits{4000, 0, 0}}, 0, o);
    CHECK(c[0].try_reserve(0, 3000, 0).result == outcome::wait);
    c.pump(0);
    decision d = c[0].try_reserve(0, 3000, 0);
    REQUIRE(d.result == outcome::admit);
    CHECK(c[0].settle(d.held, 3000, 0));
    const int64_t before = c[0].capacity(0, resource::tokens);
    CHECK(before > 1000);
    c[0].tick(o.idle_ns / 2);  // not idle yet
    CHECK(c[0].capacity(0, resource::tokens) == before);
    c[0].tick(o.idle_ns + 1);
    c.pump(o.idle_ns + 1);
    CHECK(c[0].capacity(0, resource::tokens) == 1000);
    CHECK(c.sum(0, resource::tokens).capacity == 4000);
  }
}
