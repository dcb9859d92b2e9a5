#include "sluice/shard/timer_wheel.hpp"

#include "sluice/core/assert.hpp"

namespace sluice::shard {

timer_wheel::timer_wheel(uint64_t now_ms) noexcept : _cursor_tick(now_ms / k_slot_ms) {
  for (timer& s : _slots) s.prev = s.next = &s;
}

// Timers still armed are left as they are: their owners are gone first (a
// shard frees its connections before its wheel) and touch them no more.
timer_wheel::~timer_wheel() = default;

void timer_wheel::arm(timer& t, uint64_t deadline_ms) noexcept {
  if (t.armed()) {
    unlink(t);
  } else {
    ++_size;
  }
  t.deadline_ms = deadline_ms;
  const uint64_t tick = deadline_ms / k_slot_ms;
  // A deadline at or before the slot being walked goes to that slot: it is
  // walked again by the next expire().
  link_before(slot_of(tick < _cursor_tick ? _cursor_tick : tick), t);
}

void timer_wheel::cancel(timer& t) noexcept {
  if (!t.armed()) return;
  unlink(t);
  SLUICE_ASSERT(_size > 0);
  --_size;
}

}  // namespace sluice::shard
