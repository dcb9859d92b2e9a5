// Lease sizing and reconciliation: pure functions, time as a parameter.
#include <doctest/doctest.h>

#include "sluice/cluster/cluster.hpp"

using namespace sluice::cluster;

namespace {
key_lease::params sample_params() {
  key_lease::params p;
  p.limit_per_minute = 60000;
  p.window_s = 5;
  p.bounds = {64, 0.1};
  p.fallback_per_minute = fallback_tokens_per_minute(60000, 0, 4);
  return p;
}
constexpr uint64_t t0 = 1'000'000;
}  // namespace

TEST_SUITE("cluster::lease") {
  TEST_CASE("lease_size covers the window's demand within its bounds") {
    const lease_bounds b{64, 0.1};
    CHECK(lease_size(100, 60000, 5, b) == doctest::Approx(500));
    CHECK(lease_size(0, 60000, 5, b) == doctest::Approx(64));         // the floor
    CHECK(lease_size(-3, 60000, 5, b) == doctest::Approx(64));
    CHECK(lease_size(100000, 60000, 5, b) == doctest::Approx(6000));  // 10% of the limit
    CHECK(lease_size(100, 100, 5, b) == doctest::Approx(64));          // floor above 10%, under the limit
    CHECK(lease_size(100, 30, 5, b) == doctest::Approx(30));           // never more than the limit
    CHECK(max_lease(60000, b) == doctest::Approx(6000));
    CHECK(max_lease(30, b) == doctest::Approx(30));
  }

  TEST_CASE("surplus: given back only past twice the target, down to the target") {
    CHECK(surplus(1000, 600) == 0);
    CHECK(surplus(1200, 600) == 0);
    CHECK(surplus(1300, 600) == doctest::Approx(700));
    CHECK(surplus(0, 0) == 0);
  }

  TEST_CASE("fallback share: the configured fraction, else limit / expected_instances") {
    CHECK(fallback_tokens_per_minute(60000, 0, 3) == doctest::Approx(20000));
    CHECK(fallback_tokens_per_minute(60000, 0, 0) == doctest::Approx(60000));
    CHECK(fallback_tokens_per_minute(60000, 0.25, 3) == doctest::Approx(15000));
    CHECK(fallback_tokens_per_minute(60000, 7, 3) == doctest::Approx(60000));
  }

  TEST_CASE("demand_rate follows a steady demand and decays when it stops") {
    demand_rate d(5);
    for (uint64_t t = 0; t < 60000; t += 100) d.add(50, t0 + t);  // 500 tokens/s
    CHECK(d.per_second(t0 + 60000) == doctest::Approx(500).epsilon(0.02));
    CHECK(d.per_second(t0 + 65000) == doctest::Approx(500 * 0.3679).epsilon(0.03));
  }

  TEST_CASE("key_lease: asks for the window's demand, tops up under half, gives surplus back") {
    key_lease kl(sample_params(), t0);
    key_lease::request rq = kl.begin(t0);
    REQUIRE(rq.kind == key_lease::op::lease);
    CHECK(rq.tokens == 64);
    CHECK(kl.begin(t0).kind == key_lease::op::none);  // one call in flight
    kl.on_reply(rq, true, 64, t0 + 1);
    CHECK(kl.held() == 64);
    CHECK(kl.take(60, t0 + 2));
    CHECK(!kl.take(10, t0 + 3));  // 4 left
    // Demand of 400 tokens/s for a while: the target grows to ~2000.
    uint64_t t = t0 + 100;
    for (; t < t0 + 30000; t += 100) {
      (void)kl.take(40, t);
      rq = kl.begin(t);
      if (rq.kind == key_lease::op::lease) kl.on_reply(rq, true, rq.tokens, t);
    }
    CHECK(kl.target(t) == doctest::Approx(2000).epsilon(0.05));
    CHECK(kl.held() <= kl.target(t) + 1);
    // Demand stops: the target falls back to the floor and the surplus goes.
    t += 30000;
    rq = kl.begin(t);
    REQUIRE(rq.kind == key_lease::op::give_back);
    const double before = kl.held() + rq.tokens;
    CHECK(kl.held() == doctest::Approx(kl.target(t)).epsilon(0.01));  // gone before the reply (at most once)
    kl.on_reply(rq, false, 0, t + 1);
    CHECK(kl.held() + rq.tokens == doctest::Approx(before));
  }

  TEST_CASE("key_lease: a short grant waits retry_ms before the next lease call") {
    key_lease kl(sample_params(), t0);
    key_lease::request rq = kl.begin(t0);
    kl.on_reply(rq, true, 10, t0);
    CHECK(kl.begin(t0 + 50).kind == key_lease::op::none);
    CHECK(kl.begin(t0 + 100).kind == key_lease::op::lease);
  }

  TEST_CASE("key_lease apart: the lease left first, then the share; what the share paid for is charged on return") {
    key_lease kl(sample_params(), t0);
    key_lease::request rq = kl.begin(t0);
    kl.on_reply(rq, true, 64, t0);
    kl.on_apart(t0 + 10);
    CHECK(kl.begin(t0 + 10).kind == key_lease::op::none);  // no calls while apart
    CHECK(kl.take(64, t0 + 10));                             // the lease: owes nothing
    CHECK(kl.owed() == 0);
    CHECK(!kl.take(1, t0 + 10));
    // 15000 tokens per minute: 250 per second, capped at one lease (6000).
    CHECK(kl.take(250, t0 + 1010));
    CHECK(kl.owed() == doctest::Approx(250));
    kl.refill(t0 + 600000);
    CHECK(kl.held() == doctest::Approx(6000));
    CHECK(kl.take(6000, t0 + 600000));
    CHECK(kl.owed() == doctest::Approx(6250));
    kl.refill(t0 + 601000);
    kl.on_rejoin(t0 + 601000);
    CHECK(kl.held() == 0);  // the allowance's rest is not ours to keep
    rq = kl.begin(t0 + 601000);
    REQUIRE(rq.kind == key_lease::op::charge);
    CHECK(rq.tokens == 6250);
    kl.on_reply(rq, false, 0, t0 + 601001);  // lost: sent again (at least once)
    rq = kl.begin(t0 + 601002);
    REQUIRE(rq.kind == key_lease::op::charge);
    kl.on_reply(rq, true, 6250, t0 + 601003);
    CHECK(kl.owed() == 0);
    CHECK(kl.begin(t0 + 601004).kind == key_lease::op::lease);
  }

  TEST_CASE("key_lease: a refund returns to the lease, or pays off what is owed first") {
    key_lease kl(sample_params(), t0);
    key_lease::request rq = kl.begin(t0);
    kl.on_reply(rq, true, 64, t0);
    REQUIRE(kl.take(40, t0));
    kl.refund(15);
    CHECK(kl.held() == doctest::Approx(39));
    CHECK(kl.owed() == 0);
    kl.on_apart(t0);
    REQUIRE(kl.take(39, t0));
    REQUIRE(kl.take(100, t0 + 1000));  // out of the allowance: owed
    CHECK(kl.owed() == doctest::Approx(100));
    kl.refund(30);
    CHECK(kl.owed() == doctest::Approx(70));
    CHECK(kl.held() == doctest::Approx(180));  // 250 accrued - 100 + 30
  }

  TEST_CASE("key_lease apart: an idle instance saves up one lease at most, its lease included") {
    key_lease kl(sample_params(), t0);
    key_lease::request rq = kl.begin(t0);
    kl.on_reply(rq, true, 64, t0);
    kl.on_apart(t0);
    kl.refill(t0 + 3'600'000);
    CHECK(kl.held() == doctest::Approx(6000));
  }
}

TEST_SUITE("cluster::from_config") {
  TEST_CASE("[cluster] maps onto the client's options and a key's lease parameters") {
    sluice::config::cluster_config c;
    c.redis = "redis://10.1.2.3:7000";
    c.url = {"10.1.2.3", 7000};
    c.password = "pw";
    c.key_prefix = "edge:";
    c.timeout_ms = 150;
    c.expected_instances = 3;
    c.lease_window_ms = 2500;
    const redis_options o = redis_options_from(c);
    CHECK(o.host == "10.1.2.3");
    CHECK(o.port == 7000);
    CHECK(o.password == "pw");
    CHECK(o.key_prefix == "edge:");
    CHECK(o.timeout_ms == 150);
    key_lease::params p = lease_params_from(c, 60000);
    CHECK(p.limit_per_minute == 60000);
    CHECK(p.window_s == doctest::Approx(2.5));
    CHECK(p.fallback_per_minute == doctest::Approx(20000));
    c.fallback_share = 0.5;
    CHECK(lease_params_from(c, 60000).fallback_per_minute == doctest::Approx(30000));
  }
}
