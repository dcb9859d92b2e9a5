// A shard's routing replica (see table.hpp).
#include "sluice/route/table.hpp"

#include <algorithm>

#include "sluice/core/assert.hpp"

namespace sluice::route {

table::table(const config::config& cfg, uint32_t shard, uint32_t shard_count)
    : _shard(shard), _shard_count(shard_count), _groups(cfg) {
  SLUICE_VERIFY(shard < shard_count);
  const size_t backends = cfg.backends.size();
  _up.assign(backends, 1);
  _draining.assign(backends, 0);
  _local.assign(backends, 0);
  _remote_sum.assign(backends, 0);
  _remote.assign(backends * shard_count, 0);
  _waiting.assign(backends, 0);
  _load.assign(backends, 0);
  _slot_cap.assign(backends, 0);
  _queued.assign(size_t{shard_count} * cfg.groups.size(), 0);
  _groups_state.resize(cfg.groups.size());
  for (size_t g = 0; g < cfg.groups.size(); ++g) {
    const config::group_config& gc = cfg.groups[g];
    group_state& s = _groups_state[g];
    for (size_t i = 0; i < gc.backends.size(); ++i) {
      const uint32_t b = gc.backends[i];
      s.members.push_back({b, backend_id(cfg.backends[b].url), i < gc.weights.size() ? gc.weights[i] : 1});
    }
    s.ring.rebuild(s.members);
    s.keys = {parse_balance_mode(gc.balance), gc.prefix_messages, gc.prefix_bytes};
    s.bounded_load = gc.bounded_load;
    s.panic_percent = gc.health.panic_threshold_percent;
    s.fair = gc.admission == config::admission_mode::fair && gc.max_inflight_per_backend != 0 && !gc.removed;
    if (!s.fair) continue;
    for (const uint32_t b : gc.backends) {
      uint32_t& cap = _slot_cap[b];
      cap = cap == 0 ? gc.max_inflight_per_backend : std::min(cap, gc.max_inflight_per_backend);
    }
  }
}

table::table(const config::config& cfg, const table& previous) : table(cfg, previous._shard, previous._shard_count) {
  const size_t backends = cfg.backends.size();
  const size_t known = std::min(backends, previous._up.size());
  for (size_t b = 0; b < known; ++b) {
    _up[b] = previous._up[b];
    _draining[b] = previous._draining[b];
    _local[b] = previous._local[b];
    _remote_sum[b] = previous._remote_sum[b];
    _waiting[b] = previous._waiting[b];
    for (size_t s = 0; s < _shard_count; ++s) _remote[s * backends + b] = previous._remote[s * previous._up.size() + b];
  }
  const size_t groups = std::min(_groups_state.size(), previous._groups_state.size());
  for (size_t s = 0; s < _shard_count; ++s) {
    for (size_t g = 0; g < groups; ++g) _queued[s * _groups_state.size() + g] = previous._queued[s * previous._groups_state.size() + g];
  }
  for (size_t b = 0; b < backends; ++b) {
    if (cfg.backends[b].removed) _up[b] = 0;
    set_load(static_cast<uint32_t>(b));
    refresh_skip(static_cast<uint32_t>(b));
  }
}

void table::refresh_skip(uint32_t backend) noexcept {
  const bool down = _up[backend] == 0;
  const bool out = _draining[backend] != 0;
  for (group_state& s : _groups_state) {
    const uint32_t p = s.ring.position_of(backend);
    if (p == k_none) continue;
    const uint64_t bit = uint64_t{1} << p;
    s.down = down ? (s.down | bit) : (s.down & ~bit);
    s.out = out ? (s.out | bit) : (s.out & ~bit);
    refresh_group(s);
  }
}

void table::refresh_group(group_state& s) noexcept {
  // Envoy's panic threshold: with fewer of the group's backends healthy than
  // panic_threshold_percent, refusing every request is worse than trying the
  // sick ones, so all of them serve (the draining ones stay out: an
  // operator took them out on purpose).
  const auto total = static_cast<uint32_t>(s.members.size()) - static_cast<uint32_t>(__builtin_popcountll(s.out));
  const auto healthy = total - static_cast<uint32_t>(__builtin_popcountll(s.down & ~s.out));
  s.panic = total != 0 && uint64_t{healthy} * 100 < uint64_t{s.panic_percent} * total;
  s.skip = s.out | (s.panic ? 0 : s.down);
}

void table::apply(const message& m) noexcept {
  if (m.kind == message_kind::key_served || m.kind == message_kind::group_queued) {
    if (m.kind == message_kind::group_queued && m.shard < _shard_count && m.shard != _shard && m.group < _groups_state.size()) {
      _queued[size_t{m.shard} * _groups_state.size() + m.group] = m.value;
    }
    return;
  }
  if (m.backend >= _load.size()) return;  // a message of another snapshot: ignore
  switch (m.kind) {
    case message_kind::backend_up:
      _up[m.backend] = 1;
      refresh_skip(m.backend);
      break;
    case message_kind::backend_down:
      _up[m.backend] = 0;
      refresh_skip(m.backend);
      break;
    case message_kind::backend_drain:
      _draining[m.backend] = m.value != 0;
      refresh_skip(m.backend);
      break;
    case message_kind::backend_weight:
      if (m.value == 0) break;
      for (uint32_t g = 0; g < _groups_state.size(); ++g) {
        if (m.group != k_none && m.group != g) continue;
        group_state& s = _groups_state[g];
        const uint32_t p = s.ring.position_of(m.backend);
        if (p == k_none || s.members[p].weight == m.value) continue;
        s.members[p].weight = m.value;
        s.ring.rebuild(s.members);  // same positions: the skip mask stays valid
      }
      break;
    case message_kind::load_report: {
      if (m.shard >= _shard_count || m.shard == _shard) break;
      uint32_t& last = _remote[size_t{m.shard} * _load.size() + m.backend];
      _remote_sum[m.backend] = _remote_sum[m.backend] - last + m.value;
      last = m.value;
      set_load(m.backend);
      break;
    }
    case message_kind::backend_waiting:
      _waiting[m.backend] = m.value;
      set_load(m.backend);
      break;
    case message_kind::key_served:
    case message_kind::group_queued:
      break;  // above
  }
}

bool table::slot_free(uint32_t group, uint32_t backend, uint8_t level) const noexcept {
  const uint32_t cap = _slot_cap[backend];
  if (cap == 0) return true;
  const uint64_t running = _local[backend] + _remote_sum[backend];
  if (running >= cap) return false;
  const size_t backends = _load.size(), groups = _groups_state.size();
  // Priority is strict across shards: a slot is left to a peer that has a
  // higher level waiting (it takes it as a loan once it sees it free).
  for (uint32_t p = 0; p < _shard_count; ++p) {
    const uint32_t top = _queued[size_t{p} * groups + group];
    if (p != _shard && top != 0 && top - 1 > level) return false;
  }
  if (_local[backend] < slice_of(_shard, backend)) return true;
  // Beyond this shard's slice: only what no waiting peer is owed.
  uint64_t owed = 0;
  for (uint32_t p = 0; p < _shard_count; ++p) {
    const uint32_t top = _queued[size_t{p} * groups + group];
    if (p == _shard || top == 0 || top - 1 < level) continue;  // a lower level waits behind this one
    const uint32_t slice = slice_of(p, backend), runs = _remote[size_t{p} * backends + backend];
    if (runs < slice) owed += slice - runs;
  }
  return cap - running > owed;
}

uint64_t table::full_mask(uint32_t group, uint8_t level) const noexcept {
  const group_state& s = _groups_state[group];
  uint64_t full = 0;
  for (uint32_t p = 0; p < s.members.size(); ++p) {
    if (!slot_free(group, s.members[p].backend, level)) full |= uint64_t{1} << p;
  }
  return full;
}

table::slots table::slot_state(uint32_t group, uint64_t tried_mask, uint8_t level) const noexcept {
  SLUICE_ASSERT(group < _groups_state.size());
  const group_state& s = _groups_state[group];
  const uint64_t all = s.members.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << s.members.size()) - 1;
  const uint64_t eligible = all & ~(s.skip | tried_mask);
  if (eligible == 0) return slots::none_eligible;
  if (!s.fair) return slots::free;
  return (eligible & ~full_mask(group, level)) != 0 ? slots::free : slots::full;
}

choice table::pick(uint32_t group, const route_key_result& key, uint64_t tried_mask) noexcept {
  SLUICE_ASSERT(group < _groups_state.size());
  group_state& s = _groups_state[group];
  const uint64_t skip = s.skip | tried_mask | (s.fair ? full_mask(group, _admit_level) : 0);
  uint32_t p = k_none;
  if (key.pinned != k_none) {
    for (uint32_t i = 0; i < s.ring.size(); ++i) {
      if (s.ring.backend(i) == key.pinned && ((skip >> i) & 1) == 0) return {key.pinned, i};
    }
  }
  switch (s.keys.mode) {
    case balance_mode::session:
    case balance_mode::prefix:
      p = s.ring.pick(key.hash, loads(), s.bounded_load, skip);
      break;
    case balance_mode::least_loaded:
      p = s.ring.pick_least_loaded(loads(), skip, key.hash);
      break;
    case balance_mode::round_robin:
      p = s.ring.pick_round_robin(s.rr_cursor, skip);
      break;
  }
  if (p == k_none) return {};
  return {s.ring.backend(p), p};
}

void table::on_request_start(uint32_t backend) noexcept {
  ++_local[backend];
  ++_local_version;
  set_load(backend);
}

void table::on_request_end(uint32_t backend) noexcept {
  SLUICE_ASSERT(_local[backend] > 0);
  if (_local[backend] > 0) --_local[backend];
  ++_local_version;
  set_load(backend);
}

}  // namespace sluice::route
