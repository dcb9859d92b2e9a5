#pragma once
// quota: the queue of a saturated group under admission = "fair" (docs/architecture.md
// §2c): virtual token counters (Sheng et al., "Fairness in Serving Large
// Language Models", OSDI 2024) with strict priorities and an age limit.
//
// Release rule, when a slot frees:
//   1. a waiter that has waited `age_limit_ms` or more goes first, oldest
//      first, whatever its priority (so the lowest level never starves);
//   2. else the highest priority level that has waiters;
//   3. within it, the key with the lowest virtual counter (ties: the key
//      whose oldest waiter came first), and that key's oldest waiter.
// A key's counter grows by the weighted tokens it is served (input x1,
// output x2, as quota), divided by its weight, as they stream. A key that
// had nothing queued nor running re-enters at the lowest counter among the
// keys that do (idleness is not banked), never lower than its own.
//
// Shard-local; no allocation after construction: waiters are the caller's
// objects with a fair_hook in them, linked into intrusive lists. A release
// and an idle key's entry walk the active keys (queued or running) only.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::quota {

struct fair_hook {
  fair_hook* key_prev = nullptr;  // in its key's FIFO
  fair_hook* key_next = nullptr;
  fair_hook* all_prev = nullptr;  // in the queue's FIFO (arrival order)
  fair_hook* all_next = nullptr;
  uint32_t key = 0;
  uint8_t priority = 0;
  bool queued = false;
  uint64_t since_ms = 0;          // when it was queued
};

class fair_queue {
 public:
  static constexpr uint8_t k_levels = 8;  // priorities 0..7 (higher first)

  // `keys`: key indices are 0..keys-1; `queue_max`: waiters at most.
  fair_queue(size_t keys, size_t queue_max, uint64_t age_limit_ms);
  fair_queue(const fair_queue&) = delete;
  fair_queue& operator=(const fair_queue&) = delete;

  void set_weight(uint32_t key, double weight) noexcept;
  // A reload's new keys (cold path; hooks stay where they are).
  void add_keys(size_t keys) {
    if (keys <= _keys.size()) return;
    _keys.resize(keys);
    _touched.reserve(keys);
    _active.reserve(keys);
  }
  size_t keys() const noexcept { return _keys.size(); }
  void set_limits(size_t queue_max, uint64_t age_limit_ms) noexcept {
    _queue_max = queue_max;
    _age_limit_ms = age_limit_ms;
  }

  // Returns: false when the queue is full (queue_max): the caller refuses.
  bool push(fair_hook& h, uint32_t key, uint8_t priority, uint64_t now_ms) noexcept;
  // The next waiter to release (unlinked, and counted running: call
  // ended() when its request ends), or null when none waits.
  fair_hook* pop(uint64_t now_ms) noexcept;
  // The level the waiter pop(now_ms) would release counts at: its priority,
  // or the highest level once it is past the age limit (it goes first
  // whatever its level, on this shard and against the peers'); 0 when none.
  uint8_t next_level(uint64_t now_ms) const noexcept;
  // The highest level waiting, the aged counting as the highest (0 when none).
  uint8_t top_level(uint64_t now_ms) const noexcept;
  // A waiter that leaves (its client went, its time ran out): unlinked.
  void remove(fair_hook& h) noexcept;
  // The waiter queued longest, if it has waited `timeout_ms` or more (the
  // caller answers 429 queue_timeout, then asks again).
  fair_hook* expired(uint64_t now_ms, uint64_t timeout_ms) const noexcept;

  // A request of `key` takes a free slot without waiting (a released
  // waiter was counted by pop()) / a running one ends: what makes a key
  // active (queued or running) for idle re-entry.
  void started(uint32_t key) noexcept;
  void ended(uint32_t key) noexcept;
  // Tokens served to `key` (weighted: input x1, output x2), as they stream;
  // negative: an estimate counted earlier corrected by the real usage.
  void served(uint32_t key, int64_t weighted_tokens) noexcept;

  // Tokens a peer shard served to `key` (its report): the counter moves,
  // nothing is owed to the peers.
  void served_remote(uint32_t key, int64_t weighted_tokens) noexcept;
  // What this shard served since the last call, per key, for the peers
  // (fn(key, weighted_tokens)); then forgotten.
  template <class Fn>
  void drain_served(Fn&& fn) noexcept {
    for (const uint32_t k : _touched) {
      if (_keys[k].pending != 0) fn(k, _keys[k].pending);
      _keys[k].pending = 0;
      _keys[k].listed = false;
    }
    _touched.clear();
  }
  bool served_pending() const noexcept { return !_touched.empty(); }

  double counter(uint32_t key) const noexcept { return _keys[key].counter; }
  size_t depth() const noexcept { return _depth; }
  uint64_t running_total() const noexcept { return _running; }

 private:
  struct key_state {
    double counter = 0;
    double weight = 1;
    uint32_t running = 0;
    uint32_t queued = 0;
    int64_t pending = 0;             // served here since the last drain_served
    bool listed = false;             // in _touched
    uint32_t active_at = k_inactive; // its place in _active
    fair_hook* head[k_levels] = {};  // its waiters per level, oldest first
    fair_hook* tail[k_levels] = {};
  };
  // The lowest counter among active keys other than `except` (or the
  // key's own when none is active).
  double lowest_active(uint32_t except) const noexcept;
  void lift_if_idle(uint32_t key) noexcept;
  // Keeps _active (the keys queued or running) in step with `key`'s counts.
  void track(uint32_t key) noexcept;
  static constexpr uint32_t k_inactive = ~uint32_t{0};

  std::vector<key_state> _keys;
  size_t _queue_max;
  uint64_t _age_limit_ms;
  size_t _depth = 0;
  uint64_t _running = 0;                 // requests counted running, every key
  uint32_t _level_count[k_levels] = {};  // waiters per level
  fair_hook* _all_head = nullptr;        // every waiter, in arrival order
  fair_hook* _all_tail = nullptr;
  std::vector<uint32_t> _touched;        // keys with `pending` (capacity: every key)
  // The keys queued or running (capacity: every key): what pop() and the
  // idle lift walk, so their cost follows the active keys, not the config's.
  std::vector<uint32_t> _active;
};

}  // namespace sluice::quota
