#pragma once
// cluster: how much of a key's global bucket an instance holds, when it asks
// for more or gives some back, what it may admit while Redis is away and
// what it owes when Redis returns. Pure: no I/O, time is a parameter.
//
// Delivery rules (what keeps a lost reply on the safe side):
//   lease      at most once: a grant whose reply is lost is never used (its
//              tokens are spent: the bucket refills anyway);
//   give_back  at most once: the tokens leave the instance when the call is
//              sent, whether or not Redis takes them;
//   charge     at least once: a charge whose reply is lost is sent again
//              (a double charge only makes later leases wait).
#include <algorithm>
#include <cstdint>

namespace sluice::cluster {

struct lease_bounds {
  double min_tokens = 64;       // a smaller lease is not worth a round trip
  double max_fraction = 0.1;    // of the limit per minute: the most one instance holds
};

// Returns: the most one instance holds of a key: M in the invariant
// (cluster.hpp), max_fraction * limit but at least min_tokens, at most limit.
double max_lease(double limit_per_minute, const lease_bounds& b) noexcept;

// Returns: the tokens an instance should hold to cover window_s of its
// recent demand, within [min_tokens, max_fraction * limit] (and never more
// than the limit).
double lease_size(double recent_rate_tokens_per_s, double limit_per_minute, double window_s,
                  const lease_bounds& b) noexcept;

// Returns: what to give back of `held_tokens` when demand fell: the excess
// over `target_tokens` once held is over twice the target, else 0 (the gap
// keeps a steady demand from flipping between lease and give_back).
double surplus(double held_tokens, double target_tokens) noexcept;

// Returns: the tokens per minute one instance may admit while Redis is away:
// limit * fallback_share when the share is set (0 < share <= 1), else
// limit / expected_instances.
double fallback_tokens_per_minute(double limit_per_minute, double fallback_share,
                                  uint32_t expected_instances) noexcept;

// Recent demand, as an exponentially weighted rate with time constant
// window_s: what lease_size sizes for.
class demand_rate {
 public:
  explicit demand_rate(double window_s) noexcept : _window_s(window_s) {}
  void add(double tokens, uint64_t now_ms) noexcept;
  double per_second(uint64_t now_ms) const noexcept;

 private:
  void decay_to(uint64_t now_ms) noexcept;
  double _window_s;
  double _rate = 0;        // tokens per second at _at_ms
  uint64_t _at_ms = 0;
  bool _started = false;
};

// Control-thread. One per (key, this instance), from the key's first request
// to its removal (or the process's end: a crash loses it, and its lease's
// tokens are spent).
//
// While Redis answers: `held` is this instance's lease, topped up when it
// falls under half of lease_size, and its surplus given back. While apart:
// `held` is what is left of the last lease (already taken from the global
// bucket: spending it owes nothing) plus a fallback allowance accruing at
// fallback_per_minute (lease + allowance capped at one maximal lease, so
// an idle instance saves up no more than that); what is admitted out
// of the allowance is owed, and charged first once Redis answers again.
class key_lease {
 public:
  struct params {
    double limit_per_minute = 0;
    double window_s = 5;
    lease_bounds bounds;
    double fallback_per_minute = 0;   // fallback_tokens_per_minute()
    uint32_t retry_ms = 100;          // after a short or failed grant, before the next lease call
  };
  enum class op : uint8_t { none, lease, give_back, charge };
  struct request {
    op kind = op::none;
    double tokens = 0;
  };

  key_lease(const params& p, uint64_t now_ms) noexcept;

  // Admission: records the demand, and takes `tokens` when held covers it.
  // Returns: whether they were taken.
  bool take(double tokens, uint64_t now_ms) noexcept;
  // Takes what held covers of `tokens`, whole tokens only, without
  // recording demand (a top-up beyond what was asked, or a short grant once
  // waiting is over). Returns: the tokens taken (0..tokens).
  double take_available(double tokens, uint64_t now_ms) noexcept;
  // Records `tokens` of demand without taking any (what the lender gave its
  // shards: their consumption, which the lease is sized for).
  void note_demand(double tokens, uint64_t now_ms) noexcept { _demand.add(tokens, now_ms); }
  // Settlement: tokens taken but not used (a reservation above the real
  // usage) come back to this instance's pool; surplus goes on to Redis
  // with the next give_back. While owing, they first pay off the debt.
  void refund(double tokens) noexcept;
  // A request larger than the lease target is waiting: lease calls ask for
  // at least `tokens` in all (capped at the limit), and nothing of it is
  // given back, until a take_available() of that size serves it.
  void need(double tokens) noexcept { _need = std::max(_need, tokens); }
  double held() const noexcept { return _lease + _allowance; }
  double owed() const noexcept { return _owed; }
  bool apart() const noexcept { return _apart; }
  bool in_flight() const noexcept { return _in_flight; }

  // The call to send now (op::none: nothing, or one already in flight).
  // give_back's tokens leave the instance here.
  request begin(uint64_t now_ms) noexcept;
  // The reply to begin()'s request: ok with the script's `tokens`, or not.
  void on_reply(const request& rq, bool ok, double tokens, uint64_t now_ms) noexcept;

  // Redis became unreachable / reachable again (the client's connected()).
  void on_apart(uint64_t now_ms) noexcept;
  void on_rejoin(uint64_t now_ms) noexcept;
  // While apart: the allowance accrues up to now_ms.
  void refill(uint64_t now_ms) noexcept;

  const params& parameters() const noexcept { return _p; }
  double target(uint64_t now_ms) const noexcept;

 private:
  params _p;
  demand_rate _demand;
  double _lease = 0;        // tokens taken from the global bucket, not yet admitted
  double _allowance = 0;    // apart only: the fallback share accrued, not yet admitted
  double _owed = 0;         // admitted out of the allowance, not yet charged
  double _need = 0;         // need(): the next lease covers at least this
  uint64_t _accrued_ms = 0; // apart: the allowance is accrued up to here
  uint64_t _lease_not_before_ms = 0;
  bool _apart = false;
  bool _in_flight = false;
};

}  // namespace sluice::cluster
