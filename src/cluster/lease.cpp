// Lease sizing and reconciliation (lease.hpp). Pure arithmetic.
#include "sluice/cluster/lease.hpp"

#include <algorithm>
#include <cmath>

namespace sluice::cluster {

double max_lease(double limit_per_minute, const lease_bounds& b) noexcept {
  return std::min(limit_per_minute, std::max(b.min_tokens, b.max_fraction * limit_per_minute));
}

double lease_size(double recent_rate_tokens_per_s, double limit_per_minute, double window_s,
                  const lease_bounds& b) noexcept {
  const double most = max_lease(limit_per_minute, b);
  const double want = std::max(0.0, recent_rate_tokens_per_s) * window_s;
  return std::clamp(want, std::min(b.min_tokens, most), most);
}

double surplus(double held_tokens, double target_tokens) noexcept {
  return held_tokens > 2 * target_tokens ? held_tokens - target_tokens : 0;
}

double fallback_tokens_per_minute(double limit_per_minute, double fallback_share,
                                  uint32_t expected_instances) noexcept {
  if (fallback_share > 0) return limit_per_minute * std::min(1.0, fallback_share);
  return limit_per_minute / std::max<uint32_t>(1, expected_instances);
}

void demand_rate::decay_to(uint64_t now_ms) noexcept {
  if (!_started) {
    _started = true;
    _at_ms = now_ms;
    return;
  }
  if (now_ms <= _at_ms) return;
  _rate *= std::exp(-static_cast<double>(now_ms - _at_ms) / (1000.0 * _window_s));
  _at_ms = now_ms;
}

void demand_rate::add(double tokens, uint64_t now_ms) noexcept {
  decay_to(now_ms);
  // An impulse of `tokens` spread over the time constant.
  _rate += tokens / _window_s;
}

double demand_rate::per_second(uint64_t now_ms) const noexcept {
  if (!_started || now_ms <= _at_ms) return _rate;
  return _rate * std::exp(-static_cast<double>(now_ms - _at_ms) / (1000.0 * _window_s));
}

key_lease::key_lease(const params& p, uint64_t now_ms) noexcept : _p(p), _demand(p.window_s) {
  _accrued_ms = now_ms;
}

double key_lease::target(uint64_t now_ms) const noexcept {
  return lease_size(_demand.per_second(now_ms), _p.limit_per_minute, _p.window_s, _p.bounds);
}

bool key_lease::take(double tokens, uint64_t now_ms) noexcept {
  _demand.add(tokens, now_ms);
  if (_apart) refill(now_ms);
  if (tokens > held()) return false;
  const double from_lease = std::min(tokens, _lease);
  _lease -= from_lease;
  const double from_allowance = tokens - from_lease;
  _allowance -= from_allowance;
  _owed += from_allowance;
  return true;
}

double key_lease::take_available(double tokens, uint64_t now_ms) noexcept {
  if (_apart) refill(now_ms);
  const double n = std::floor(std::min(tokens, held()));
  if (n <= 0) return 0;
  if (n >= _need) _need = 0;  // the large request is served: leases follow demand again
  const double from_lease = std::min(n, _lease);
  _lease -= from_lease;
  _allowance -= n - from_lease;
  _owed += n - from_lease;
  return n;
}

void key_lease::refund(double tokens) noexcept {
  if (tokens <= 0) return;
  // Admitted out of the allowance and not used: owed no more. While apart
  // the allowance gets them back; once rejoined that share is gone anyway.
  const double unowed = std::min(_owed, tokens);
  _owed -= unowed;
  if (_apart) _allowance += unowed;
  _lease += tokens - unowed;
}

key_lease::request key_lease::begin(uint64_t now_ms) noexcept {
  request rq;
  if (_in_flight || _apart) return rq;
  const double want = target(now_ms);
  // A waiting request larger than the target: one lease sized for it (the
  // most one instance holds is then that request's cost).
  const double sized = std::min(_p.limit_per_minute, std::max(want, _need));
  if (_owed > 0) {
    rq = {op::charge, std::ceil(_owed)};
  } else if ((_lease < want / 2 || _lease < _need) && now_ms >= _lease_not_before_ms) {
    rq = {op::lease, std::ceil(sized - _lease)};
  } else if (const double extra = std::floor(surplus(_lease, std::max(want, _need))); extra >= 1) {
    rq = {op::give_back, extra};
    _lease -= extra;  // at most once: gone from here whatever Redis answers
  } else {
    return rq;
  }
  _in_flight = true;
  return rq;
}

void key_lease::on_reply(const request& rq, bool ok, double tokens, uint64_t now_ms) noexcept {
  _in_flight = false;
  switch (rq.kind) {
    case op::lease:
      if (ok) _lease += tokens;
      if (!ok || tokens < rq.tokens) _lease_not_before_ms = now_ms + _p.retry_ms;
      return;
    case op::charge:
      // Settled whether or not the floor at -limit forgave part of it.
      if (ok) _owed = std::max(0.0, _owed - rq.tokens);
      return;
    case op::give_back:
    case op::none:
      return;
  }
}

void key_lease::on_apart(uint64_t now_ms) noexcept {
  if (_apart) return;
  _apart = true;
  _allowance = 0;
  _accrued_ms = now_ms;
}

void key_lease::on_rejoin(uint64_t now_ms) noexcept {
  if (!_apart) return;
  refill(now_ms);
  _apart = false;
  // The allowance was never taken from the global bucket: what is left of
  // it is not ours to keep. The lease part still is.
  _allowance = 0;
  _lease_not_before_ms = 0;
}

void key_lease::refill(uint64_t now_ms) noexcept {
  if (!_apart || now_ms <= _accrued_ms) return;
  // Lease and allowance together never exceed one maximal lease: an idle
  // instance cannot save up more than the invariant's slack for a burst.
  const double most = max_lease(_p.limit_per_minute, _p.bounds);
  const double room = std::max(0.0, most - _lease);
  _allowance = std::min(room, _allowance + static_cast<double>(now_ms - _accrued_ms) * _p.fallback_per_minute / 60000.0);
  _accrued_ms = now_ms;
}

}  // namespace sluice::cluster
