// The lender with real shard slices: a shard's borrow round answered from
// the lease, a round that waits for Redis, idle slices giving their tokens
// home, the fallback share while apart, and a seeded run of several
// instances (each: shards + lender) over one shared bucket, where what the
// instances admit stays within the invariant of cluster.hpp and uses the
// limit when demand exceeds it.
#include <doctest/doctest.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "bucket_model.hpp"
#include "sluice/cluster/cluster.hpp"
#include "sluice/cluster/lender.hpp"
#include "sluice/quota/shard_slices.hpp"

using sluice::cluster::key_lease;
using sluice::cluster::lender;
using sluice::quota::decision;
using sluice::quota::message;
using sluice::quota::outcome;
using sluice::quota::resource;
using sluice::quota::shard_slices;
using sluice::test::bucket_model;

namespace {

constexpr int64_t k_ms = 1'000'000;

// Redis: the bucket model, answering each call `delay_ms` later (or
// failing while `down`).
struct fake_redis final : sluice::cluster::lease_calls {
  bucket_model* bucket;
  int instance;
  uint64_t delay_ms = 1;
  bool down = false;
  uint64_t now_ms = 0;
  struct call {
    uint32_t key;
    key_lease::request rq;
    uint64_t due_ms;
  };
  std::deque<call> in_flight;
  uint64_t sent = 0;

  fake_redis(bucket_model* b, int inst) : bucket(b), instance(inst) {}
  bool send(uint32_t key, const key_lease::request& rq) override {
    if (down) return false;
    ++sent;
    in_flight.push_back({key, rq, now_ms + delay_ms});
    return true;
  }
  // Delivers the due replies to `l`.
  void answer(lender& l, uint64_t now) {
    while (!in_flight.empty() && in_flight.front().due_ms <= now) {
      const call c = in_flight.front();
      in_flight.pop_front();
      if (down) {
        l.on_reply(c.key, c.rq, nullptr, now);
        continue;
      }
      sluice::cluster::bucket_reply r;
      switch (c.rq.kind) {
        case key_lease::op::lease: r.tokens = static_cast<int64_t>(bucket->lease(c.rq.tokens, instance, 10000, now)); break;
        case key_lease::op::give_back: r.tokens = static_cast<int64_t>(bucket->give_back(c.rq.tokens, instance, now)); break;
        case key_lease::op::charge: r.tokens = static_cast<int64_t>(bucket->charge(c.rq.tokens, now)); break;
        case key_lease::op::none: break;
      }
      r.level = static_cast<int64_t>(bucket->level);
      l.on_reply(c.key, c.rq, &r, now);
    }
  }
};

// One instance: `n` shards with a lender, messages delivered at once in
// pump().
struct instance {
  std::vector<std::unique_ptr<shard_slices>> shards;
  std::unique_ptr<lender> lend;
  fake_redis redis;
  sluice::config::cluster_config cfg;

  instance(uint32_t n, uint64_t limit, bucket_model* b, int id, uint64_t now_ms, uint32_t expected = 1)
      : redis(b, id) {
    cfg.redis = "redis://127.0.0.1:6379";
    cfg.expected_instances = expected;
    const std::vector<sluice::quota::key_limits> keys{{limit, 0, 0}};
    sluice::quota::slices_options o;
    o.lender = true;
    for (uint32_t i = 0; i < n; ++i) {
      shards.push_back(std::make_unique<shard_slices>(i, n, keys, static_cast<int64_t>(now_ms) * k_ms, o));
    }
    lender::options lo;
    lo.shard_count = n;
    const std::vector<uint64_t> limits{limit};
    lend = std::make_unique<lender>(lo, cfg, limits, now_ms);
  }

  // Moves every message both ways until none is left, runs a lender step.
  // Returns: how many borrow rounds completed.
  int pump(uint64_t now_ms, bool connected = true) {
    redis.now_ms = now_ms;
    const int64_t ns = static_cast<int64_t>(now_ms) * k_ms;
    int completed = 0;
    for (int pass = 0; pass < 4; ++pass) {
      for (auto& s : shards) {
        s->drain_outbox(static_cast<uint32_t>(shards.size()), [&](const message* m, size_t k) {
          for (size_t i = 0; i < k; ++i) lend->on_message(m[i], now_ms);
          return k;
        });
      }
      redis.answer(*lend, now_ms);
      lend->step(now_ms, connected, redis);
      for (uint32_t i = 0; i < shards.size(); ++i) {
        const auto out = lend->outbox(i);
        for (const message& m : out) completed += shards[i]->on_message(m, ns).round_complete ? 1 : 0;
        lend->consume(i, out.size());
      }
    }
    return completed;
  }
  void tick(uint64_t now_ms) {
    for (auto& s : shards) s->tick(static_cast<int64_t>(now_ms) * k_ms);
  }
  int64_t shard_levels() const {
    int64_t sum = 0;
    for (const auto& s : shards) sum += std::max<int64_t>(0, s->level(0, resource::tokens));
    return sum;
  }
};

}  // namespace

TEST_SUITE("cluster::lender") {
  TEST_CASE("a shard's token slice starts empty, borrows from the lender alone, and is admitted once Redis answers") {
    bucket_model bucket(60000, 0);
    instance in(2, 60000, &bucket, 1, 0);
    CHECK(in.shards[0]->leased(0));
    CHECK(in.shards[0]->peer_count() == 3);
    CHECK(in.shards[0]->level(0, resource::tokens) == 0);
    in.pump(0);  // connected: the keys rejoin (nothing leased yet: no demand)
    CHECK(in.redis.sent == 0);
    decision d = in.shards[0]->try_reserve(0, 500, 1 * k_ms);
    REQUIRE(d.result == outcome::wait);
    CHECK(in.shards[0]->outbox_size(1) == 0);  // no peer shard is asked
    CHECK(in.shards[0]->outbox_size(2) == 1);  // the lender is
    // The lender has nothing yet: the request waits for the lease call.
    CHECK(in.pump(1) == 0);
    CHECK(in.redis.sent == 1);
    CHECK(in.redis.in_flight.front().rq.kind == key_lease::op::lease);
    CHECK(in.pump(2) == 1);  // the reply, the grant, the round complete
    d = in.shards[0]->try_reserve(0, 500, 2 * k_ms);
    REQUIRE(d.result == outcome::admit);
    // The lease came from the shared bucket; the shard holds what it asked
    // for and a top-up, the rest stays with the lender.
    const lender::key_view v = in.lend->view(0);
    CHECK(v.granted >= 500);
    CHECK(static_cast<double>(v.granted) + v.held == doctest::Approx(60000 - bucket.level));
    CHECK(in.shards[0]->level(0, resource::tokens) == static_cast<int64_t>(v.granted) - 500);
    // Settling below the reservation refunds into the shard's slice.
    CHECK(in.shards[0]->settle(d.held, 120, 3 * k_ms));
    CHECK(in.shards[0]->level(0, resource::tokens) == static_cast<int64_t>(v.granted) - 120);
  }

  TEST_CASE("a waiting round gets what there is after defer_ms; a round the lease covers is answered at once") {
    bucket_model bucket(60000, 0);
    instance in(1, 60000, &bucket, 1, 0);
    in.pump(0);
    in.redis.delay_ms = 1000;  // Redis is slow
    REQUIRE(in.shards[0]->try_reserve(0, 300, 1 * k_ms).result == outcome::wait);
    CHECK(in.pump(1) == 0);
    CHECK(in.pump(30) == 0);
    CHECK(in.pump(60) == 1);  // answered empty after defer_ms (50)
    CHECK(in.lend->view(0).granted == 0);
    // The lease arrives; the next round is covered at once.
    CHECK(in.pump(1001) == 0);
    CHECK(in.lend->view(0).held >= 300);
    const decision d = in.shards[0]->try_reserve(0, 300, 1100 * k_ms);
    REQUIRE((d.result == outcome::wait || d.result == outcome::reject_tokens));
    if (d.result == outcome::wait) {
      CHECK(in.pump(1100) == 1);
    } else {
      // Cooldown after the short round: the retry borrows.
      REQUIRE(in.shards[0]->try_reserve(0, 300, 1200 * k_ms).result == outcome::wait);
      CHECK(in.pump(1200) == 1);
    }
    CHECK(in.shards[0]->try_reserve(0, 300, 1200 * k_ms).result == outcome::admit);
  }

  TEST_CASE("an idle slice gives its tokens back to the lender, which gives the surplus back to Redis") {
    bucket_model bucket(60000, 0);
    instance in(2, 60000, &bucket, 1, 0);
    in.pump(0);
    decision d = in.shards[1]->try_reserve(0, 2000, 1 * k_ms);
    REQUIRE(d.result == outcome::wait);
    in.pump(1);
    in.pump(2);
    d = in.shards[1]->try_reserve(0, 2000, 2 * k_ms);
    REQUIRE(d.result == outcome::admit);
    REQUIRE(in.shards[1]->settle(d.held, 100, 3 * k_ms));
    const int64_t held_at_shard = in.shards[1]->level(0, resource::tokens);
    CHECK(held_at_shard > 0);
    in.tick(500);  // not idle yet (1 s)
    CHECK(in.shards[1]->level(0, resource::tokens) == held_at_shard);
    in.tick(1100);
    in.pump(1100);
    CHECK(in.shards[1]->level(0, resource::tokens) == 0);
    CHECK(in.lend->view(0).returned == static_cast<uint64_t>(held_at_shard));
    // Demand gone: the lease shrinks toward its floor, the surplus goes back.
    for (uint64_t t = 1200; t <= 60000; t += 100) in.pump(t);
    CHECK(in.lend->view(0).held <= 2 * 64.0);
    CHECK(bucket.level >= 60000 - 100 - 2 * 64.0 - 1);
  }

  TEST_CASE("apart: the fallback share accrues and is owed; rejoined, the debt is charged first") {
    bucket_model bucket(60000, 0);
    instance in(1, 60000, &bucket, 1, 0, /*expected=*/3);
    // Never connected: apart from the start, on limit / 3 per minute.
    int64_t admitted = 0;
    for (uint64_t t = 0; t < 6000; t += 10) {
      in.pump(t, false);
      const decision d = in.shards[0]->try_reserve(0, 100, static_cast<int64_t>(t) * k_ms);
      if (d.result == outcome::admit) {
        admitted += 100;
        sluice::quota::reservation h = d.held;
        in.shards[0]->settle(h, 100, static_cast<int64_t>(t) * k_ms);
      }
      in.pump(t, false);
    }
    // 6 s at 20,000 / min = 2,000 tokens, capped by one lease's slack.
    CHECK(admitted <= 2000 + 100);
    CHECK(admitted >= 1500);
    CHECK(in.redis.sent == 0);
    const double owed = in.lend->view(0).owed;
    CHECK(owed >= static_cast<double>(admitted) - 1);
    // Redis reachable: the owed tokens are charged before any lease.
    in.pump(6000, true);
    REQUIRE(in.redis.in_flight.size() == 1);
    CHECK(in.redis.in_flight.front().rq.kind == key_lease::op::charge);
    in.pump(6001, true);
    CHECK(in.lend->view(0).owed == 0);
    CHECK(bucket.level <= 60000 - static_cast<double>(admitted) + 1);
  }

  TEST_CASE("a lend_request for another resource, or an unlimited key, gets an empty grant") {
    bucket_model bucket(1000, 0);
    sluice::config::cluster_config cfg;
    lender::options lo;
    lo.shard_count = 2;
    const std::vector<uint64_t> limits{0, 1000};
    lender l(lo, cfg, limits, 0);
    message m;
    m.kind = sluice::quota::message_kind::lend_request;
    m.key = 0;
    m.from_shard = 1;
    m.round = 7;
    m.capacity = 10;
    l.on_message(m, 0);
    m.key = 1;
    m.res = resource::requests;
    l.on_message(m, 0);
    REQUIRE(l.outbox(1).size() == 2);
    for (const message& g : l.outbox(1)) {
      CHECK(g.kind == sluice::quota::message_kind::grant);
      CHECK(g.round == 7);
      CHECK(g.level == 0);
      CHECK(g.from_shard == 2);
    }
  }

  TEST_CASE("instances of shards over one bucket: the invariant holds and >= 90% of the limit is used") {
    for (uint64_t seed : {1u, 2u, 3u}) {
      CAPTURE(seed);
      std::mt19937_64 rng(seed);
      const double limit = 60000;
      bucket_model bucket(limit, 0);
      std::vector<std::unique_ptr<instance>> ins;
      const double shares[] = {0.7, 0.2, 0.1};
      for (int i = 0; i < 3; ++i) ins.push_back(std::make_unique<instance>(2, 60000, &bucket, i + 1, 0, 3));
      struct live {
        sluice::quota::reservation held;
        uint32_t shard;
        uint64_t ends_ms;
        uint64_t used;
      };
      std::vector<std::vector<live>> inflight(3);
      struct parked_request {
        uint32_t shard;
        uint64_t cost;
        uint64_t since_ms;
      };
      std::vector<std::vector<parked_request>> parked(3);
      double used_total = 0, used_late = 0;
      const uint64_t duration_ms = 180000;
      // Demand: 1.5x the limit, spread 70/20/10 %; requests of 100..400
      // tokens reserved, 40..100 % of that used, each lasting 50..500 ms.
      for (uint64_t t = 0; t < duration_ms; t += 5) {
        const int64_t ns = static_cast<int64_t>(t) * k_ms;
        for (int i = 0; i < 3; ++i) {
          instance& in = *ins[i];
          auto& live_i = inflight[i];
          for (size_t j = 0; j < live_i.size();) {
            if (live_i[j].ends_ms <= t) {
              in.shards[live_i[j].shard]->settle(live_i[j].held, live_i[j].used, ns);
              used_total += static_cast<double>(live_i[j].used);
              if (t >= 60000) used_late += static_cast<double>(live_i[j].used);
              live_i[j] = live_i.back();
              live_i.pop_back();
            } else {
              ++j;
            }
          }
          // Expected tokens per 5 ms step: 1.5 * limit / 12000 * share; a
          // request averages 250 * 0.7 used.
          const double rate = 1.5 * limit / 12000.0 * shares[i] / 175.0;
          if (std::uniform_real_distribution<double>(0, 1)(rng) < rate) {
            parked[i].push_back({static_cast<uint32_t>(rng() % 2), 100 + rng() % 301, t});
          }
          // A request that has to wait (a borrow round, or a short cooldown)
          // is parked and tried again each step for up to 250 ms, as the
          // proxy does; then it is refused.
          for (size_t j = 0; j < parked[i].size();) {
            const parked_request p = parked[i][j];
            const decision d = in.shards[p.shard]->try_reserve(0, p.cost, ns);
            if (d.result == outcome::admit) {
              const uint64_t used = p.cost * (40 + rng() % 61) / 100;
              live_i.push_back({d.held, p.shard, t + 50 + rng() % 451, used});
            }
            if (d.result == outcome::admit || t - p.since_ms >= 250 || d.too_large) {
              parked[i][j] = parked[i].back();
              parked[i].pop_back();
            } else {
              ++j;
            }
          }
          if (t % 100 == 0) in.tick(t);
          in.pump(t);
        }
        // The invariant, checked as the run goes: what was used (and is
        // still reserved) never exceeds the bucket's start plus its refill
        // plus one maximal lease per instance.
        // M: a lease, and the half of a lease target its shards may hold.
        const double m = 1.5 * sluice::cluster::max_lease(limit, {});
        double reserved = 0;
        for (const auto& v : inflight)
          for (const auto& l : v) reserved += static_cast<double>(l.held.tokens);
        REQUIRE(used_total <= limit + limit * static_cast<double>(t) / 60000.0 + 3 * m);
        CHECK(reserved >= 0);
      }
      // Demand (1.5x the rate, 270,000 tokens) exceeds what the bucket can
      // give over the run (its start plus its refill, 240,000): at least
      // 90 % of that is used.
      const double available = limit + limit * static_cast<double>(duration_ms) / 60000.0;
      MESSAGE("used ", used_total / available, " of what the bucket could give");
      CHECK(used_total >= 0.9 * available);
      CHECK(used_late > 0);
    }
  }
}

TEST_SUITE("cluster::lender") {
  TEST_CASE("a request larger than the lease target gets one lease sized for it") {
    bucket_model bucket(6000, 0);  // a tenth of the limit: 600
    instance in(1, 6000, &bucket, 1, 0);
    in.pump(0);
    REQUIRE(in.shards[0]->try_reserve(0, 2000, 1 * k_ms).result == outcome::wait);
    CHECK(in.pump(1) == 0);
    REQUIRE(in.redis.in_flight.size() == 1);
    CHECK(in.redis.in_flight.front().rq.tokens >= 2000);
    CHECK(in.pump(2) == 1);
    CHECK(in.shards[0]->try_reserve(0, 2000, 2 * k_ms).result == outcome::admit);
    // Once served, leases go back to the demand's size.
    CHECK(in.lend->view(0).held < 600);
  }
}
