#pragma once
// cluster: the lease protocol's Lua scripts, run atomically by Redis (SCRIPT
// LOAD once per connection, then EVALSHA; EVAL when Redis answers NOSCRIPT).
//
// One Redis hash per key, KEYS[1] = key_prefix .. "bucket:" .. key_id:
//   level     the global token bucket's level (a float: refill is continuous)
//   ts        Redis TIME (ms) of the last refill
//   l:<inst>  the amount of instance <inst>'s latest lease
//   e:<inst>  its expiry (Redis TIME, ms)
// Every script first refills the bucket from Redis's own clock (TIME: the
// instances' clocks never enter the arithmetic, so their skew does not
// matter), at limit / 60 s up to `limit`, and drops the lease records whose
// expiry has passed. A missing hash is a full bucket.
//
// Every script answers {tokens, level, server_now_ms, outstanding}:
//   tokens       lease: granted; give_back: accepted (the level caps at
//                limit); charge: taken (the level floors at -limit)
//   level        the bucket's level after the script, rounded down
//   server_now_ms  Redis TIME
//   outstanding  the sum of the unexpired lease records, this one included
//
// Every script sets PEXPIRE on the hash: the time the bucket needs to refill
// to `limit` from its level, plus 60 s (the longest lease TTL allowed).
// An idle key therefore vanishes only once it would read as a full bucket
// with no live lease record, so its vanishing changes nothing.
//
// The fourth script, `budget`, keeps the budget counters (README "Budgets";
// cluster/budget_store.hpp), one Redis hash per subject and calendar window:
//   t:<inst>  instance <inst>'s own tokens in that window
//   s:<inst>  its own spend, in nano-units of the currency
// KEYS = the hashes; ARGV[1] = the instance id, then three per hash: its own
// tokens, its own spend, the hash's expiry (unix ms). A field is only ever
// raised (HSET when larger, never HINCRBY): a push repeated after a timeout,
// or one that arrives late, counts nothing twice. It answers, per hash, its
// HGETALL (every instance's fields: the caller sums them exactly in 64 bits,
// which Lua's doubles would not).
#include <string_view>

namespace sluice::cluster {

enum class script : unsigned char { lease = 0, give_back = 1, charge = 2, budget = 3 };
inline constexpr unsigned k_script_count = 4;

// The longest lease TTL the scripts' PEXPIRE margin covers.
inline constexpr unsigned k_lease_ttl_max_ms = 60000;

// Returns: the full Lua source of `s` (the bucket scripts' shared prologue
// included).
std::string_view script_source(script s) noexcept;
std::string_view script_name(script s) noexcept;

}  // namespace sluice::cluster
