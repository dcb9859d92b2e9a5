#include "sluice/quota/token_bucket.hpp"

#include <algorithm>

#include "sluice/core/assert.hpp"

namespace sluice::quota {
namespace {

// 128-bit products keep elapsed_ns × capacity exact (both below 2^41).
__extension__ typedef unsigned __int128 u128;

// From a debt of -capacity the bucket is full again after two minutes, so a
// longer gap needs no arithmetic (and cannot overflow).
constexpr int64_t k_full_after_ns = 2 * k_ns_per_minute;

}  // namespace

token_bucket::token_bucket(int64_t capacity, int64_t now_ns) noexcept
    : _capacity(capacity), _level(capacity), _last_ns(now_ns) {
  SLUICE_ASSERT(capacity >= 0 && capacity <= k_capacity_max);
}

void token_bucket::refill(int64_t now_ns) noexcept {
  if (now_ns <= _last_ns) return;  // same instant, or a caller's clock behind ours
  const int64_t elapsed_ns = now_ns - _last_ns;
  _last_ns = now_ns;
  if (_level >= _capacity) {
    _carry = 0;  // full: nothing accrues
    return;
  }
  if (elapsed_ns >= k_full_after_ns) {
    _level = _capacity;
    _carry = 0;
    return;
  }
  const u128 accrued = u128(static_cast<uint64_t>(elapsed_ns)) * u128(static_cast<uint64_t>(_capacity)) + _carry;
  const auto added = static_cast<int64_t>(accrued / u128(k_ns_per_minute));
  _carry = static_cast<uint64_t>(accrued % u128(k_ns_per_minute));
  if (added >= _capacity - _level) {
    _level = _capacity;
    _carry = 0;
    return;
  }
  _level += added;
}

bool token_bucket::try_take(int64_t n) noexcept {
  if (_level < n) return false;
  _level -= n;
  return true;
}

void token_bucket::charge(int64_t n) noexcept { _level = std::max(_level - n, -_capacity); }

void token_bucket::refund(int64_t n) noexcept { _level = std::min(_level + n, _capacity); }

void token_bucket::add(int64_t capacity, int64_t level, int64_t now_ns) noexcept {
  SLUICE_ASSERT(capacity >= 0 && level >= 0 && level <= capacity);
  refill(now_ns);  // the old capacity's rate applies up to now
  _capacity += capacity;
  _level += level;
}

void token_bucket::remove(int64_t capacity, int64_t level, int64_t now_ns) noexcept {
  SLUICE_ASSERT(capacity >= 0 && capacity <= _capacity);
  SLUICE_ASSERT(level >= 0 && level <= std::max<int64_t>(_level, 0));
  refill(now_ns);
  _capacity -= capacity;
  _level -= level;
  SLUICE_ASSERT(_level <= _capacity);
}

int64_t token_bucket::ns_until(int64_t n, int64_t rate_capacity) const noexcept {
  if (_level >= n) return 0;
  const int64_t rate = (n <= _capacity && _capacity > 0) ? _capacity : rate_capacity;
  if (rate <= 0) return k_ns_per_minute;  // nothing refills here: a minute is the honest guess
  const u128 deficit = u128(static_cast<uint64_t>(n - _level));
  const u128 ns = (deficit * u128(k_ns_per_minute) + u128(static_cast<uint64_t>(rate)) - 1) /
                  u128(static_cast<uint64_t>(rate));
  return ns > u128(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(ns);
}

}  // namespace sluice::quota
