#pragma once
// quota: one token bucket with continuous refill, in integer arithmetic.
//
// Shard-local. One per (key, resource) per shard, inside shard_slices; lives
// as long as the config snapshot that sized it.
//
// Semantics: the bucket refills its whole capacity once per minute, i.e. at
// `capacity` tokens per minute, continuously. For a key's global bucket the
// capacity is the per-minute limit, so the burst allowance is one minute's
// worth: an idle key may spend its full tokens_per_minute at once, and then
// gets tokens_per_minute spread over every following minute. A slice of the
// global bucket (see shard_slices.hpp) refills at its own capacity per
// minute, so the slices' refill rates always add up to at most the global
// rate, and moving capacity between shards moves refill rate with it.
//
// No float drift: refill computes elapsed_ns × capacity + carry (in
// token·ns-per-minute units, exact in 128 bits), adds the whole tokens and
// keeps the remainder, a fraction of one token below 60e9, as the carry for
// the next refill. Many small refills add exactly what one big refill adds.
// The carry is a fraction of a token already accrued, so it stays valid when
// capacity moves. Time is a parameter: nothing here reads a clock.
#include <cstdint>

namespace sluice::quota {

inline constexpr int64_t k_ns_per_minute = 60'000'000'000;
// Limits above this are refused at set-up so that elapsed × capacity fits
// in 128 bits with room to spare (2^40 ≈ 1.1e12 tokens per minute).
inline constexpr int64_t k_capacity_max = int64_t{1} << 40;

class token_bucket {
 public:
  token_bucket() = default;
  // Starts full.
  token_bucket(int64_t capacity, int64_t now_ns) noexcept;

  // Adds the tokens accrued since the last refill, up to capacity.
  void refill(int64_t now_ns) noexcept;

  int64_t capacity() const noexcept { return _capacity; }
  // May be negative: usage charged beyond a reservation is a debt that
  // refill repays.
  int64_t level() const noexcept { return _level; }

  // Returns: true and takes n when at least n tokens are there.
  bool try_take(int64_t n) noexcept;
  // Charges n unconditionally (usage beyond a reservation); the debt is
  // floored at -capacity so one bad estimate cannot block a key for more
  // than two minutes.
  void charge(int64_t n) noexcept;
  // Refunds n, up to capacity: like a single bucket, a refund into a full
  // bucket is lost rather than lifting it above its burst.
  void refund(int64_t n) noexcept;

  // Moves capacity (and `level` tokens with it) in or out; lending between
  // shards. Refills first so that the old rate applies up to now_ns.
  // remove() requires capacity <= this->capacity()
  // and level <= max(this->level(), 0); it keeps level <= capacity.
  void add(int64_t capacity, int64_t level, int64_t now_ns) noexcept;
  void remove(int64_t capacity, int64_t level, int64_t now_ns) noexcept;

  // Returns: nanoseconds until level >= n at the current capacity, 0 when
  // already there; for n > capacity or capacity 0, the time at a rate of
  // `rate_capacity` per minute instead (callers pass the rate they expect
  // after borrowing).
  int64_t ns_until(int64_t n, int64_t rate_capacity) const noexcept;

 private:
  int64_t _capacity = 0;
  int64_t _level = 0;
  int64_t _last_ns = 0;  // refill clock: what accrued up to here is in _level and _carry
  uint64_t _carry = 0;   // accrued fraction of a token, in 1/60e9 tokens
};

}  // namespace sluice::quota
