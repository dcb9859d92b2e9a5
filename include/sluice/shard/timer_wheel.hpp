#pragma once
// shard: the deadlines of one shard's connections (header, body, idle,
// upstream and send timeouts), as a hashed timing wheel: arming, moving and
// cancelling a timer is O(1), and a loop iteration walks only the slots
// whose time has come, instead of every connection of the shard.
//
// Shard-local; lives as long as the shard's loop. Time is a parameter
// (`now_ms`), never read here. A slot is k_slot_ms wide and the wheel turns
// every k_slots * k_slot_ms; a timer further out than a turn sits in its
// slot and is passed over until its turn comes. A timer fires at the first
// expire() whose now_ms is at or past its deadline (and whose slot walk
// reaches it: at most one slot width later than the deadline).
#include <cstddef>
#include <cstdint>

namespace sluice::shard {

// Embedded in the object it times (intrusive: no allocation). Linked into a
// circular list while armed; `owner` is the embedding object.
struct timer {
  timer* prev = nullptr;
  timer* next = nullptr;
  uint64_t deadline_ms = 0;
  void* owner = nullptr;
  bool armed() const noexcept { return next != nullptr; }
};

class timer_wheel {
 public:
  static constexpr uint32_t k_slots = 512;
  static constexpr uint64_t k_slot_ms = 8;  // a turn: ~4 s

  explicit timer_wheel(uint64_t now_ms) noexcept;
  timer_wheel(const timer_wheel&) = delete;
  timer_wheel& operator=(const timer_wheel&) = delete;
  ~timer_wheel();

  // Arms `t` for `deadline_ms` (moving it if armed). A deadline already
  // past fires at the next expire().
  void arm(timer& t, uint64_t deadline_ms) noexcept;
  void cancel(timer& t) noexcept;
  size_t size() const noexcept { return _size; }

  // Calls fn(t) for each timer due at `now_ms`, disarmed before the call.
  // fn may arm or cancel any timer, itself and the others included; one
  // armed during the walk for a time already past fires later in this walk
  // or at the next call.
  // Returns: how many fired.
  template <class Fn>
  size_t expire(uint64_t now_ms, Fn&& fn) noexcept;

 private:
  static void link_before(timer& at, timer& t) noexcept {
    t.prev = at.prev;
    t.next = &at;
    at.prev->next = &t;
    at.prev = &t;
  }
  static void unlink(timer& t) noexcept {
    t.prev->next = t.next;
    t.next->prev = t.prev;
    t.prev = t.next = nullptr;
  }
  timer& slot_of(uint64_t tick) noexcept { return _slots[tick % k_slots]; }

  timer _slots[k_slots];   // sentinels of circular lists
  uint64_t _cursor_tick;   // the last walk's now: the next walk starts there (timers armed for it since)
  size_t _size = 0;
};

template <class Fn>
size_t timer_wheel::expire(uint64_t now_ms, Fn&& fn) noexcept {
  const uint64_t now_tick = now_ms / k_slot_ms;
  if (now_tick < _cursor_tick) return 0;
  if (_size == 0) {
    // Nothing armed (an HTTP/2 wheel with no streams, say: every loop
    // iteration calls this): the walk would find every slot empty.
    _cursor_tick = now_tick;
    return 0;
  }
  // After a long stall, one turn covers every slot.
  const uint64_t first = now_tick - _cursor_tick >= k_slots ? now_tick - (k_slots - 1) : _cursor_tick;
  // Set first: a timer armed during the walk for a time already past goes
  // to now's slot, which this walk reaches last and the next walks first.
  _cursor_tick = now_tick;
  size_t fired = 0;
  for (uint64_t tick = first; tick <= now_tick; ++tick) {
    timer& head = slot_of(tick);
    if (head.next == &head) continue;
    // The slot's timers move to a local list first: fn may arm timers into
    // this very slot (they wait for the next call) or cancel any timer of
    // the local list (unlink needs only its neighbours).
    timer local;
    local.prev = head.prev;
    local.next = head.next;
    head.prev->next = &local;
    head.next->prev = &local;
    head.prev = head.next = &head;
    while (local.next != &local) {
      timer& t = *local.next;
      unlink(t);
      if (t.deadline_ms <= now_ms) {
        --_size;
        ++fired;
        fn(t);
      } else {
        link_before(slot_of(t.deadline_ms / k_slot_ms), t);  // a later turn: back where it was
      }
    }
  }
  return fired;
}

}  // namespace sluice::shard
