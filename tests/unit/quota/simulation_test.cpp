// Deterministic simulation of N shards sharing keys' budgets over delayed
// FIFO links: random traffic, random skew, random delivery delays, random
// interleaving of links, partial outbox draining, ticks; the invariant is
// checked after every step and the admitted amounts against the global
// bucket over sliding windows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "cluster.hpp"
#include "sluice/quota/shard_slices.hpp"

using namespace sluice::quota;
using sluice::quota::test::cluster;
using sluice::quota::test::global_of;

namespace {
constexpr int64_t k_ms = 1'000'000;
constexpr int64_t k_s = 1'000'000'000;
__extension__ typedef __int128 i128;  // exact capacity × window products

struct event {
  int64_t at_ns;
  int64_t amount;  // + admitted, - refunded
};

struct pending_settle {
  int64_t at_ns;
  uint32_t shard;
  reservation held;
  uint64_t actual;
};

// Largest sum of `amount` over events that start at an admission and lie
// within [t, t + window]. Returns: true when within capacity + rate × window.
bool within_budget(const std::vector<event>& events, int64_t capacity, int64_t window_ns, int64_t& worst) {
  worst = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].amount <= 0) continue;
    int64_t sum = 0, best = 0;
    for (size_t j = i; j < events.size() && events[j].at_ns <= events[i].at_ns + window_ns; ++j) {
      sum += events[j].amount;
      best = std::max(best, sum);
    }
    worst = std::max(worst, best);
    // capacity + capacity per minute × window, compared without division.
    const i128 lhs = static_cast<i128>(best) * k_ns_per_minute;
    const i128 rhs = static_cast<i128>(capacity) * k_ns_per_minute +
                         static_cast<i128>(capacity) * window_ns;
    if (lhs > rhs) return false;
  }
  return true;
}

struct sim_result {
  bool invariant_held = true;
  int64_t steps = 0;
  int64_t admitted = 0;
  int64_t waited = 0;
  int64_t rejected = 0;
  std::vector<event> tokens[2];    // per key
  std::vector<event> requests[2];  // per key
};

sim_result simulate(uint64_t seed, uint32_t shards) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  // Two keys: a small one that is mostly dry, a bigger one with concurrency.
  std::vector<key_limits> keys = {key_limits{6000, 120, 0},
                                  key_limits{static_cast<uint64_t>(pick(20'000, 200'000)), 0,
                                             static_cast<uint32_t>(pick(1, 40))}};
  slices_options o;
  o.outbox_capacity = 8;  // small, so that full outboxes and dropped requests happen
  o.idle_ns = pick(50, 2000) * k_ms;
  cluster c(shards, keys, 0, o);
  // Random skew: each shard gets a weight; one seed in four puts everything on shard 0.
  std::vector<int64_t> weight(shards);
  for (auto& w : weight) w = pick(0, 10);
  if (seed % 4 == 0) std::fill(weight.begin(), weight.end(), 0);
  weight[0] += 1;
  std::discrete_distribution<uint32_t> pick_shard(weight.begin(), weight.end());

  sim_result r;
  std::vector<pending_settle> inflight;
  int64_t now = 0;
  const int64_t max_delay = pick(0, 5) * k_ms;
  for (int step = 0; step < 4000; ++step) {
    now += pick(0, 3) * k_ms + pick(0, 999);
    const int64_t action = pick(0, 99);
    if (action < 45) {
      const uint32_t at = pick_shard(rng);
      const auto key = static_cast<uint32_t>(pick(0, 1));
      const auto cost = static_cast<uint64_t>(pick(1, key == 0 ? 1500 : 9000));
      const decision d = c[at].try_reserve(key, cost, now);
      if (d.result == outcome::admit) {
        ++r.admitted;
        r.tokens[key].push_back({now, d.held.tokens});
        r.requests[key].push_back({now, 1});
        inflight.push_back({now + pick(0, 3000) * k_ms, at, d.held, static_cast<uint64_t>(pick(0, int64_t(cost)))});
      } else if (d.result == outcome::wait) {
        ++r.waited;
      } else {
        ++r.rejected;
      }
    } else if (action < 60) {
      // Settle what is due (actual <= reserved: refunds only, so levels stay
      // non-negative and the window bound is exact).
      for (size_t i = 0; i < inflight.size();) {
        if (inflight[i].at_ns <= now) {
          auto& p = inflight[i];
          const int64_t refund = p.held.tokens - static_cast<int64_t>(std::min<uint64_t>(p.actual, p.held.tokens));
          if (p.held.tokens > 0 && refund > 0) r.tokens[p.held.key].push_back({now, -refund});
          c[p.shard].settle(p.held, p.actual, now);
          inflight[i] = inflight.back();
          inflight.pop_back();
        } else {
          ++i;
        }
      }
    } else if (action < 75) {
      // A shard's reactor moves (part of) its outboxes into the queues.
      c.drain(static_cast<uint32_t>(pick(0, shards - 1)), now, pick(0, max_delay), static_cast<size_t>(pick(1, 4)));
    } else if (action < 95) {
      // Links are drained in a random order: FIFO within a link only.
      for (int k = 0; k < 3; ++k) {
        const auto from = static_cast<uint32_t>(pick(0, shards - 1));
        const auto to = static_cast<uint32_t>(pick(0, shards - 1));
        if (from != to) c.deliver(from, to, now);
      }
    } else {
      c[static_cast<uint32_t>(pick(0, shards - 1))].tick(now);
    }
    ++r.steps;
    const auto all = c.sum_all();
    for (uint32_t key = 0; key < keys.size(); ++key) {
      for (resource res : {resource::tokens, resource::requests, resource::concurrency}) {
        const auto& t = all[key][static_cast<size_t>(res)];
        const int64_t global = global_of(keys[key], res);
        if (global == 0) continue;
        if (t.capacity != global || t.level > global || !t.level_within_capacity) {
          if (r.invariant_held) {
            std::printf("seed %llu shards %u step %d key %u res %d: capacity %lld level %lld global %lld\n",
                        static_cast<unsigned long long>(seed), shards, step, key, int(res),
                        static_cast<long long>(t.capacity), static_cast<long long>(t.level),
                        static_cast<long long>(global));
          }
          r.invariant_held = false;
        }
      }
    }
  }
  return r;
}
}  // namespace

TEST_SUITE("quota::simulation") {
  TEST_CASE("slices plus tokens in transit never exceed the global bucket, and no window admits more than it") {
    int64_t admitted = 0, waited = 0, rejected = 0;
    for (uint32_t shards : {2u, 3u, 4u, 8u, 16u}) {
      for (uint64_t seed = 1; seed <= 30; ++seed) {
        CAPTURE(shards);
        CAPTURE(seed);
        const sim_result r = simulate(seed * 7919 + shards, shards);
        CHECK(r.invariant_held);
        admitted += r.admitted;
        waited += r.waited;
        rejected += r.rejected;
        int64_t worst = 0;
        for (int64_t window : {int64_t{100} * k_ms, int64_t{1} * k_s, int64_t{10} * k_s}) {
          CHECK(within_budget(r.tokens[0], 6000, window, worst));
          CHECK(within_budget(r.requests[0], 120, window, worst));
        }
      }
    }
    // The simulation exercised all three outcomes.
    CHECK(admitted > 1000);
    CHECK(waited > 100);
    CHECK(rejected > 100);
    std::printf("simulation: %lld admitted, %lld waited for a borrow round, %lld rejected\n",
                static_cast<long long>(admitted), static_cast<long long>(waited), static_cast<long long>(rejected));
  }

  TEST_CASE("a key whose traffic all lands on one shard still gets at least 90% of its global rate") {
    for (uint32_t shards : {1u, 2u, 4u, 8u, 16u, 32u}) {
      CAPTURE(shards);
      const int64_t per_minute = 60'000;
      cluster c(shards, {key_limits{static_cast<uint64_t>(per_minute), 0, 0}}, 0);
      const int64_t step = k_ms;
      const int64_t delay = 50'000;  // 50 µs between cores
      const int64_t warmup = 60 * k_s, end = 6 * 60 * k_s;
      int64_t measured = 0;
      bool waiting = false;
      std::vector<uint32_t> completed;
      for (int64_t now = step; now <= end; now += step) {
        // The client always has a request ready (saturating demand).
        if (!waiting) {
          for (;;) {
            decision d = c[0].try_reserve(0, 100, now);
            if (d.result == outcome::wait) waiting = true;
            if (d.result != outcome::admit) break;
            if (now > warmup) measured += d.held.tokens;
            c[0].settle(d.held, 100, now);
          }
        }
        if (!c.quiet()) {
          completed.clear();
          for (uint32_t s = 0; s < shards; ++s) c.drain(s, now, delay);
          for (uint32_t from = 0; from < shards; ++from) {
            for (uint32_t to = 0; to < shards; ++to) {
              if (from != to) c.deliver(from, to, now, to == 0 ? &completed : nullptr);
            }
          }
          if (!completed.empty()) waiting = false;
        }
        if (now % (100 * k_ms) == 0) {
          for (uint32_t s = 0; s < shards; ++s) c[s].tick(now);
        }
      }
      const double share = static_cast<double>(measured) / static_cast<double>(per_minute * 5);
      std::printf("skew: %2u shards, all traffic on one: %.1f%% of the global rate\n", shards, share * 100);
      CHECK(share >= 0.90);
      CHECK(share <= 1.0);
    }
  }
}
