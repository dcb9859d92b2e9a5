#include <doctest/doctest.h>

#include "sluice/quota/token_bucket.hpp"

using sluice::quota::k_ns_per_minute;
using sluice::quota::token_bucket;

namespace {
constexpr int64_t k_ms = 1'000'000;
constexpr int64_t k_s = 1'000'000'000;
}  // namespace

TEST_SUITE("quota::token_bucket") {
  TEST_CASE("a new bucket is full and refills its capacity once per minute") {
    token_bucket b(600, 0);
    CHECK(b.level() == 600);
    CHECK(b.try_take(600));
    CHECK_FALSE(b.try_take(1));
    b.refill(1 * k_s);  // 600 per minute = 10 per second
    CHECK(b.level() == 10);
    b.refill(30 * k_s);
    CHECK(b.level() == 300);
    b.refill(10 * 60 * k_s);
    CHECK(b.level() == 600);  // never above capacity
  }

  TEST_CASE("refill in many small steps adds exactly what one big step adds") {
    // 7 tokens per minute: one token every 8.571428... s, a rate with no
    // exact nanosecond period. Refilling every 1 ms for 60 s must give 7.
    token_bucket small(7, 0), big(7, 0);
    CHECK(small.try_take(7));
    CHECK(big.try_take(7));
    for (int64_t t = k_ms; t <= 60 * k_s; t += k_ms) small.refill(t);
    big.refill(60 * k_s);
    CHECK(small.level() == 7);
    CHECK(big.level() == 7);
    // Just before the first token is due, none is there.
    token_bucket c(7, 0);
    CHECK(c.try_take(7));
    c.refill(k_ns_per_minute / 7);  // 8.571428571 s rounded down: not yet
    CHECK(c.level() == 0);
    c.refill(k_ns_per_minute / 7 + 1);
    CHECK(c.level() == 1);
  }

  TEST_CASE("sub-token remainders carry over instead of being lost") {
    token_bucket b(60, 0);  // one token per second
    CHECK(b.try_take(60));
    for (int i = 1; i <= 10; ++i) b.refill(i * 700 * k_ms);  // steps of 0.7 s
    CHECK(b.level() == 7);  // 7.0 s elapsed
  }

  TEST_CASE("a clock that goes backwards adds nothing") {
    token_bucket b(60, 10 * k_s);
    CHECK(b.try_take(60));
    b.refill(5 * k_s);
    CHECK(b.level() == 0);
    b.refill(11 * k_s);
    CHECK(b.level() == 1);
  }

  TEST_CASE("refunds stop at capacity and charges may go into debt down to minus capacity") {
    token_bucket b(100, 0);
    CHECK(b.try_take(80));
    b.refund(50);
    CHECK(b.level() == 70);
    b.refund(500);
    CHECK(b.level() == 100);
    b.charge(150);
    CHECK(b.level() == -50);
    b.charge(1000);
    CHECK(b.level() == -100);
    CHECK_FALSE(b.try_take(1));
    b.refill(60 * k_s);  // debt repaid at the normal rate
    CHECK(b.level() == 0);
  }

  TEST_CASE("moving capacity moves the refill rate with it") {
    token_bucket b(60, 0);
    CHECK(b.try_take(60));
    b.add(60, 0, 0);  // now 120 per minute
    b.refill(1 * k_s);
    CHECK(b.level() == 2);
    b.remove(90, 2, 1 * k_s);
    CHECK(b.capacity() == 30);
    CHECK(b.level() == 0);
    b.refill(3 * k_s);  // 30 per minute = 0.5 per second
    CHECK(b.level() == 1);
  }

  TEST_CASE("the time until n tokens uses the local rate, or the given one when n exceeds capacity") {
    token_bucket b(600, 0);
    CHECK(b.ns_until(1, 600) == 0);
    CHECK(b.try_take(600));
    CHECK(b.ns_until(10, 600) == 1 * k_s);
    CHECK(b.ns_until(1200, 1200) == 60 * k_s);
    token_bucket empty(0, 0);
    CHECK(empty.ns_until(1, 0) == k_ns_per_minute);
  }
}
