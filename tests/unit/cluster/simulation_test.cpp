// A seeded simulation of several instances sharing one key through the
// lease protocol: uneven demand, Redis outages and returns, instance clocks
// skewed from Redis's, an instance crash. The invariant of cluster.hpp is
// checked at every step, over several window lengths.
//
// The Redis side is bucket_model (bucket_model.hpp), which redis_test
// checks against the scripts on a real server.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bucket_model.hpp"
#include "sluice/cluster/lease.hpp"

using sluice::cluster::key_lease;
using sluice::test::bucket_model;

namespace {

constexpr uint64_t k_step_ms = 50;
constexpr uint64_t k_ttl_ms = 10000;
constexpr uint64_t k_detect_steps = 4;  // a client notices an outage when a command times out (200 ms)

struct instance {
  int id = 0;                 // a new id per incarnation
  int64_t clock_offset_ms = 0;
  int64_t drift_ppm = 0;
  double share = 0;           // of the total demand
  std::unique_ptr<key_lease> lease;
  bool alive = true;
  uint64_t revive_at_ms = 0;
  // The one call in flight: sent at some step, answered at the next.
  key_lease::request rq;
  bool waiting = false;
  bool applied = false;       // Redis ran it (its reply may still be lost)
  double reply_tokens = 0;
  uint64_t reply_due_ms = 0;
  uint64_t rejoin_at_ms = 0;
  double demand_credit = 0;
  double next_size = 0;
};

struct outage {
  uint64_t from_ms;
  uint64_t to_ms;
};

struct sim_result {
  double admitted_total = 0;
  double worst_excess = -1e18;  // max over steps and windows of admitted - bound
  std::vector<double> per_step;  // admitted per step
  double admitted_apart = 0;     // during outages
};

struct scenario {
  uint64_t seed = 1;
  double limit = 60000;
  double demand_factor = 1.5;   // total demand / limit
  std::vector<double> shares = {0.55, 0.25, 0.15, 0.05};
  // Instance clocks: off Redis's by seconds to minutes, and running up to
  // 0.2% fast or slow (they time only demand and the fallback allowance).
  std::vector<int64_t> offsets_ms = {0, 37000, -12000, 300000};
  std::vector<int64_t> drift_ppm = {0, 2000, -2000, 1000};
  std::vector<outage> outages;
  uint64_t crash_at_ms = 0;     // instance 1 dies here (0 = never)
  uint64_t crash_down_ms = 20000;
  uint64_t duration_ms = 600000;
  // Demand below the limit from low_from to low_to (ms).
  uint64_t low_from_ms = 0, low_to_ms = 0;
};

key_lease::params params_for(double limit, size_t instances) {
  key_lease::params p;
  p.limit_per_minute = limit;
  p.window_s = 5;
  p.bounds.min_tokens = 64;
  p.bounds.max_fraction = 0.1;
  p.fallback_per_minute = sluice::cluster::fallback_tokens_per_minute(limit, 0, static_cast<uint32_t>(instances));
  return p;
}

sim_result run(const scenario& sc) {
  std::mt19937_64 rng(sc.seed);
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  std::uniform_real_distribution<double> size(50, 450);
  const uint64_t base_ms = 1'000'000'000;  // server time at step 0
  const size_t n = sc.shares.size();
  const key_lease::params p = params_for(sc.limit, n);
  const double m = sluice::cluster::max_lease(sc.limit, p.bounds);
  const double rate_per_ms = sc.limit / 60000.0;

  bucket_model redis(sc.limit, base_ms);
  std::vector<instance> inst(n);
  int next_id = 0;
  for (size_t i = 0; i < n; ++i) {
    inst[i].id = next_id++;
    inst[i].clock_offset_ms = sc.offsets_ms[i];
    inst[i].drift_ppm = sc.drift_ppm[i];
    inst[i].share = sc.shares[i];
    inst[i].lease = std::make_unique<key_lease>(p, base_ms + sc.offsets_ms[i]);
    inst[i].next_size = size(rng);
  }
  auto down_at = [&](uint64_t t) {
    return std::any_of(sc.outages.begin(), sc.outages.end(), [&](const outage& o) { return t >= o.from_ms && t < o.to_ms; });
  };

  sim_result out;
  std::vector<double> cumulative{0};  // admitted up to the end of each step
  const uint64_t windows_ms[] = {1000, 10000, 60000, 180000};
  for (uint64_t t = 0; t < sc.duration_ms; t += k_step_ms) {
    const uint64_t server_ms = base_ms + t;
    const bool down = down_at(t);
    const bool low = t >= sc.low_from_ms && t < sc.low_to_ms;
    double admitted_step = 0;
    for (instance& in : inst) {
      const uint64_t local_ms = static_cast<uint64_t>(static_cast<int64_t>(server_ms) + in.clock_offset_ms +
                                                      static_cast<int64_t>(t) * in.drift_ppm / 1000000);
      if (!in.alive) {
        if (t < in.revive_at_ms) continue;
        // A new process: new id, nothing held, nothing owed.
        in.alive = true;
        in.id = next_id++;
        in.lease = std::make_unique<key_lease>(p, local_ms);
        in.waiting = false;
      }
      key_lease& kl = *in.lease;
      // The reply to last step's call; lost when Redis went away meanwhile.
      if (in.waiting && t >= in.reply_due_ms) {
        const bool ok = in.applied && !down;
        kl.on_reply(in.rq, ok, in.reply_tokens, local_ms);
        in.waiting = false;
      }
      // The client's view of the connection.
      const bool noticed_down = down && std::any_of(sc.outages.begin(), sc.outages.end(), [&](const outage& o) {
        return t >= o.from_ms + k_detect_steps * k_step_ms && t < o.to_ms;
      });
      if (noticed_down) {
        kl.on_apart(local_ms);
        in.rejoin_at_ms = 0;
      } else if (kl.apart() && !down) {
        if (in.rejoin_at_ms == 0) in.rejoin_at_ms = t + 100 + 50 * static_cast<uint64_t>(in.id % 3);  // the reconnect's backoff
        if (t >= in.rejoin_at_ms) kl.on_rejoin(local_ms);
      }
      // Demand: requests of 50-450 tokens; a denied one is gone (a 429).
      const double rate = sc.limit / 60000.0 * (low ? 0.5 : sc.demand_factor) * in.share;
      in.demand_credit += rate * static_cast<double>(k_step_ms) * jitter(rng);
      while (in.demand_credit >= in.next_size) {
        in.demand_credit -= in.next_size;
        if (kl.take(in.next_size, local_ms)) admitted_step += in.next_size;
        in.next_size = size(rng);
      }
      // At most one call in flight; Redis runs it now (server time), the
      // reply comes next step, or after the timeout when Redis is away.
      if (!in.waiting) {
        in.rq = kl.begin(local_ms);
        if (in.rq.kind != key_lease::op::none) {
          in.waiting = true;
          in.applied = !down;
          in.reply_due_ms = t + (down ? k_detect_steps : 1) * k_step_ms;
          in.reply_tokens = 0;
          if (!down) {
            switch (in.rq.kind) {
              case key_lease::op::lease: in.reply_tokens = redis.lease(in.rq.tokens, in.id, k_ttl_ms, server_ms); break;
              case key_lease::op::give_back: in.reply_tokens = redis.give_back(in.rq.tokens, in.id, server_ms); break;
              case key_lease::op::charge: in.reply_tokens = redis.charge(in.rq.tokens, server_ms); break;
              case key_lease::op::none: break;
            }
          }
        }
      }
    }
    if (sc.crash_at_ms != 0 && t == sc.crash_at_ms) {
      inst[1].alive = false;  // kill -9: its lease is never returned
      inst[1].revive_at_ms = t + sc.crash_down_ms;
    }
    out.per_step.push_back(admitted_step);
    out.admitted_total += admitted_step;
    if (down) out.admitted_apart += admitted_step;
    cumulative.push_back(out.admitted_total);

    // The invariant, over [0, now] and over trailing windows.
    const size_t steps = cumulative.size() - 1;
    const double slack = static_cast<double>(n) * m;
    const double elapsed_ms = static_cast<double>(t + k_step_ms);
    out.worst_excess = std::max(out.worst_excess, out.admitted_total - (sc.limit + rate_per_ms * elapsed_ms + slack));
    for (uint64_t w : windows_ms) {
      const size_t w_steps = static_cast<size_t>(w / k_step_ms);
      if (w_steps > steps) continue;
      const double in_window = cumulative[steps] - cumulative[steps - w_steps];
      out.worst_excess = std::max(out.worst_excess, in_window - (sc.limit + rate_per_ms * static_cast<double>(w) + slack));
    }
    // The Redis side never holds more than the limit, nor less than -limit.
    REQUIRE(redis.level <= sc.limit + 1e-6);
    REQUIRE(redis.level >= -sc.limit - 1e-6);
    // One lease record per instance, each at most one lease (a crashed
    // incarnation's stays until its TTL).
    REQUIRE(redis.outstanding() <= static_cast<double>(n + 1) * m);
  }
  return out;
}

double admitted_between(const sim_result& r, uint64_t from_ms, uint64_t to_ms) {
  double sum = 0;
  for (uint64_t t = from_ms; t < to_ms; t += k_step_ms) sum += r.per_step[t / k_step_ms];
  return sum;
}

}  // namespace

TEST_SUITE("cluster::simulation") {
  TEST_CASE("uneven demand over the limit: the invariant holds and >= 90% of the limit is used") {
    for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
      CAPTURE(seed);
      scenario sc;
      sc.seed = seed;
      sc.duration_ms = 300000;
      const sim_result r = run(sc);
      CHECK(r.worst_excess <= 0);
      // Demand 1.5x the limit drains the full bucket it starts with in two
      // minutes; from then on the refill is what is admitted.
      const double used = admitted_between(r, 150000, 300000) / (sc.limit * 2.5);
      CHECK(used >= 0.9);
      CHECK(used <= 1.02);
    }
  }

  TEST_CASE("Redis outages and returns, skewed clocks, a crash: the invariant holds at every step") {
    for (uint64_t seed : {11u, 12u, 13u, 14u}) {
      CAPTURE(seed);
      scenario sc;
      sc.seed = seed;
      sc.demand_factor = 2.0;
      std::mt19937_64 pick(seed);
      // Three outages at seeded times: a blip, tens of seconds, over two minutes.
      const uint64_t a = 60000 + pick() % 20000 / 50 * 50;
      const uint64_t b = 150000 + pick() % 20000 / 50 * 50;
      const uint64_t c = 300000 + pick() % 20000 / 50 * 50;
      sc.outages = {{a, a + 300}, {b, b + 40000}, {c, c + 150000}};
      sc.crash_at_ms = 230000;
      sc.low_from_ms = 250000;
      sc.low_to_ms = 280000;
      sc.duration_ms = 600000;
      const sim_result r = run(sc);
      CHECK(r.worst_excess <= 0);
      // While apart the instances stay within their fallback shares (the
      // leases they held aside): at most the refill over the outages' time.
      const double apart_ms = 300.0 + 40000 + 150000;
      CHECK(r.admitted_apart <= sc.limit / 60000.0 * apart_ms + 4 * 6000);
      // And they keep serving: at least half of the share's rate (the
      // smallest instance's share outruns its demand).
      CHECK(r.admitted_apart >= 0.5 * sc.limit / 60000.0 * apart_ms);
      // Redis back for good: the limit is used again once the charge is paid.
      const uint64_t back = c + 150000;
      const double used = admitted_between(r, back + 60000, 600000) / (sc.limit * (600000.0 - back - 60000) / 60000.0);
      CHECK(used >= 0.9);
    }
  }

  TEST_CASE("a crashed instance's lease is spent, and the others get the limit again within a minute") {
    scenario sc;
    sc.seed = 21;
    sc.demand_factor = 2.0;
    sc.crash_at_ms = 120000;
    sc.crash_down_ms = 400000;  // stays down to the end
    sc.duration_ms = 300000;
    const sim_result r = run(sc);
    CHECK(r.worst_excess <= 0);
    // The three left still want 1.5x the limit.
    const double used = admitted_between(r, 180000, 300000) / (sc.limit * 2);
    CHECK(used >= 0.9);
  }
}
