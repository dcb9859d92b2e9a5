// quota: weighted fair queueing by virtual token counters (fair_queue.hpp).
#include "sluice/quota/fair_queue.hpp"

#include "sluice/core/assert.hpp"

namespace sluice::quota {

fair_queue::fair_queue(size_t keys, size_t queue_max, uint64_t age_limit_ms)
    : _keys(keys), _queue_max(queue_max), _age_limit_ms(age_limit_ms) {
  _touched.reserve(keys);
  _active.reserve(keys);
}

void fair_queue::set_weight(uint32_t key, double weight) noexcept {
  SLUICE_ASSERT(key < _keys.size());
  _keys[key].weight = weight > 0 ? weight : 1;
}

double fair_queue::lowest_active(uint32_t except) const noexcept {
  double low = -1;
  for (const uint32_t k : _active) {
    if (k == except) continue;
    if (low < 0 || _keys[k].counter < low) low = _keys[k].counter;
  }
  return low;
}

void fair_queue::track(uint32_t key) noexcept {
  key_state& s = _keys[key];
  const bool active = s.running != 0 || s.queued != 0;
  if (active && s.active_at == k_inactive) {
    s.active_at = static_cast<uint32_t>(_active.size());
    _active.push_back(key);  // within the capacity reserved for every key
  } else if (!active && s.active_at != k_inactive) {
    const uint32_t last = _active.back();
    _active[s.active_at] = last;
    _keys[last].active_at = s.active_at;
    _active.pop_back();
    s.active_at = k_inactive;
  }
}

void fair_queue::lift_if_idle(uint32_t key) noexcept {
  key_state& s = _keys[key];
  if (s.running != 0 || s.queued != 0) return;
  const double low = lowest_active(key);
  if (low > s.counter) s.counter = low;
}

bool fair_queue::push(fair_hook& h, uint32_t key, uint8_t priority, uint64_t now_ms) noexcept {
  SLUICE_ASSERT(key < _keys.size() && !h.queued);
  if (_depth >= _queue_max) return false;
  if (priority >= k_levels) priority = k_levels - 1;
  lift_if_idle(key);
  key_state& s = _keys[key];
  h = fair_hook{};
  h.key = key;
  h.priority = priority;
  h.queued = true;
  h.since_ms = now_ms;
  h.key_prev = s.tail[priority];
  if (s.tail[priority] != nullptr) {
    s.tail[priority]->key_next = &h;
  } else {
    s.head[priority] = &h;
  }
  s.tail[priority] = &h;
  h.all_prev = _all_tail;
  if (_all_tail != nullptr) {
    _all_tail->all_next = &h;
  } else {
    _all_head = &h;
  }
  _all_tail = &h;
  ++s.queued;
  ++_level_count[priority];
  ++_depth;
  track(key);
  return true;
}

void fair_queue::remove(fair_hook& h) noexcept {
  if (!h.queued) return;
  key_state& s = _keys[h.key];
  const uint8_t p = h.priority;
  (h.key_prev != nullptr ? h.key_prev->key_next : s.head[p]) = h.key_next;
  (h.key_next != nullptr ? h.key_next->key_prev : s.tail[p]) = h.key_prev;
  (h.all_prev != nullptr ? h.all_prev->all_next : _all_head) = h.all_next;
  (h.all_next != nullptr ? h.all_next->all_prev : _all_tail) = h.all_prev;
  h.key_prev = h.key_next = h.all_prev = h.all_next = nullptr;
  h.queued = false;
  --s.queued;
  --_level_count[p];
  --_depth;
  track(h.key);
}

fair_hook* fair_queue::pop(uint64_t now_ms) noexcept {
  if (_depth == 0) return nullptr;
  // 1. Aged: the oldest waiter, whatever its level.
  fair_hook* pick = nullptr;
  if (_all_head != nullptr && now_ms - _all_head->since_ms >= _age_limit_ms) pick = _all_head;
  if (pick == nullptr) {
    // 2. The highest level with waiters; 3. its lowest counter.
    int level = k_levels - 1;
    while (level > 0 && _level_count[level] == 0) --level;
    for (const uint32_t k : _active) {  // only an active key has waiters
      fair_hook* h = _keys[k].head[level];
      if (h == nullptr) continue;
      if (pick == nullptr) {
        pick = h;
        continue;
      }
      const double c = _keys[k].counter, best = _keys[pick->key].counter;
      if (c < best || (c == best && h->since_ms < pick->since_ms)) pick = h;
    }
  }
  SLUICE_VERIFY(pick != nullptr);  // _depth != 0: some level has a waiter
  ++_keys[pick->key].running;  // released onto a slot: still active (before remove() tracks it)
  ++_running;
  remove(*pick);
  return pick;
}

uint8_t fair_queue::top_level(uint64_t now_ms) const noexcept {
  if (_all_head != nullptr && now_ms - _all_head->since_ms >= _age_limit_ms) return k_levels - 1;
  for (int level = k_levels - 1; level > 0; --level) {
    if (_level_count[level] != 0) return static_cast<uint8_t>(level);
  }
  return 0;
}

uint8_t fair_queue::next_level(uint64_t now_ms) const noexcept { return top_level(now_ms); }

fair_hook* fair_queue::expired(uint64_t now_ms, uint64_t timeout_ms) const noexcept {
  if (_all_head == nullptr || now_ms - _all_head->since_ms < timeout_ms) return nullptr;
  return _all_head;
}

void fair_queue::started(uint32_t key) noexcept {
  lift_if_idle(key);  // a request released without waiting is active too
  ++_keys[key].running;
  ++_running;
  track(key);
}

void fair_queue::ended(uint32_t key) noexcept {
  key_state& s = _keys[key];
  if (s.running != 0) {
    --s.running;
    --_running;
    track(key);
  }
}

void fair_queue::served(uint32_t key, int64_t weighted_tokens) noexcept {
  key_state& s = _keys[key];
  s.counter += static_cast<double>(weighted_tokens) / s.weight;
  if (!s.listed && weighted_tokens != 0) {
    s.listed = true;
    _touched.push_back(key);  // at most once per key: within the capacity reserved
  }
  s.pending += weighted_tokens;
}

void fair_queue::served_remote(uint32_t key, int64_t weighted_tokens) noexcept {
  if (key >= _keys.size()) return;
  key_state& s = _keys[key];
  s.counter += static_cast<double>(weighted_tokens) / s.weight;
}

}  // namespace sluice::quota
