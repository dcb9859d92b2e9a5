#pragma once
// route: one shard's routing replica: every group's ring, the backends'
// routing state (up, draining) and the load view, updated only by apply()
// of ring-rebalancing messages. Built on the cold path from a config
// snapshot; pick() and the load bookkeeping never allocate.
//
// Messages travel over the shards' SPSC queues (shard::spsc_queue): the
// control thread sends health and weight changes and vLLM's
// num_requests_waiting; each shard sends its own in-flight counts to the
// others as load reports (changed backends only: every 10 ms while the
// shard is busy, at once when it goes idle).
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/route/groups.hpp"
#include "sluice/route/key.hpp"
#include "sluice/route/ring.hpp"

namespace sluice::route {

enum class message_kind : uint8_t {
  backend_up,        // health: may take requests again
  backend_down,      // health: down or ejected; skipped by every ring
  backend_drain,     // value 1: start draining (no new requests); 0: stop
  backend_weight,    // value = new weight (1..1000) in `group` (k_none: every group); rebuilds rings
  load_report,       // value = in-flight requests of shard `shard` on `backend`
  backend_waiting,   // value = the backend's vllm:num_requests_waiting (from /metrics)
  group_queued,      // value = 1 + the highest priority shard `shard` has queued for `group` (0: none; admission = "fair")
  key_served,        // value (as int32) = weighted tokens key `backend` was served in `group` on shard `shard`
                     // (fair admission's counters; the shard's queue reads it, the table ignores it)
};

// 16 bytes, trivially copyable: crosses threads by value.
struct message {
  message_kind kind = message_kind::backend_up;
  uint8_t reserved = 0;
  uint16_t shard = 0;      // load_report: the reporting shard
  uint32_t backend = 0;    // global backend index
  uint32_t group = k_none; // backend_weight, group_queued
  uint32_t value = 0;
};
static_assert(std::is_trivially_copyable_v<message> && sizeof(message) == 16);

// A routing decision. Retry: add bit `position` to the skip mask and pick
// again (the next backend on the key's walk).
struct choice {
  uint32_t backend = k_none;   // global index; k_none = no backend (503)
  uint32_t position = k_none;  // in the group's ring
};

// Shard-local; one per shard per config snapshot.
class table {
 public:
  table(const config::config& cfg, uint32_t shard, uint32_t shard_count);  // cold path
  // Reload (cold path): the rings of `cfg`, carrying over the routing state
  // (up, draining, every load figure) of each backend `previous` knew;
  // reconciled snapshots keep backend positions (config::reconcile). New
  // backends start up, as at start; removed ones are down.
  table(const config::config& cfg, const table& previous);
  table(const table&) = delete;
  table& operator=(const table&) = delete;

  const group_table& groups() const noexcept { return _groups; }
  group_table& groups() noexcept { return _groups; }  // the classifier's scratch is this shard's
  const maglev_ring& ring(uint32_t group) const noexcept { return _groups_state[group].ring; }
  const key_params& keys(uint32_t group) const noexcept { return _groups_state[group].keys; }

  // Applies one message. A backend_weight message rebuilds the group's
  // ring in place (~65k slot writes; rare, so it may allocate).
  void apply(const message& m) noexcept;

  // Picks the backend for `key` in `group` by the group's balance mode,
  // skipping down / draining backends and the positions in `tried_mask`;
  // key.pinned first, where it is an eligible member of the group.
  // Returns: a choice; choice.backend == k_none when none is eligible.
  choice pick(uint32_t group, const route_key_result& key, uint64_t tried_mask = 0) noexcept;

  // This shard's in-flight accounting (call once per attempt, and its end).
  void on_request_start(uint32_t backend) noexcept;
  void on_request_end(uint32_t backend) noexcept;
  // Moves with every start and end: a reporter that saw the same value has
  // nothing new to report.
  uint64_t local_version() const noexcept { return _local_version; }

  // This shard's report for `backend`, for the other shards.
  message load_report(uint32_t backend) const noexcept {
    return {message_kind::load_report, 0, static_cast<uint16_t>(_shard), backend, k_none, _local[backend]};
  }

  // --- fair admission (docs/architecture.md §2c) -------------------------------------
  // A backend's slots (the least max_inflight_per_backend of the fair
  // groups it serves; 0 = unlimited) are split into per-shard slices:
  // shard i owns cap / shards, plus one when i < cap % shards. A shard
  // starts a request on a backend when the backend runs fewer than `cap`
  // (all shards' in-flight, as the load reports say) and either
  //   - this shard runs fewer than its own slice, or
  //   - more slots are free than the peers that have requests queued for
  //     the group, at the level of the request or above, still miss of
  //     their slices (a peer's idle slice is lent, never one a waiting
  //     peer is owed);
  // and no peer has a higher level waiting (priority is strict across
  // shards: the slot is left for that peer to borrow).
  // No lock and no call: what a peer runs and queues reaches this replica
  // as its reports (load_report, group_queued); the bound on what a stale
  // report lets through is in README "Fair admission".
  enum class slots : uint8_t { free, full, none_eligible };
  // Whether a request of `group` at priority `level` may start now,
  // skipping `tried_mask`.
  slots slot_state(uint32_t group, uint64_t tried_mask = 0, uint8_t level = 0) const noexcept;
  // The level pick() judges slots at (set around a fair admission's start,
  // so the backend it picks is one slot_state counted; 0 otherwise).
  void set_admit_level(uint8_t level) noexcept { _admit_level = level; }
  // Whether this shard runs more on `backend` than its own slice (it
  // borrowed a peer's: the caller reports its load at once).
  bool beyond_slice(uint32_t backend) const noexcept {
    return _slot_cap[backend] != 0 && _local[backend] > slice_of(_shard, backend);
  }
  // ... on any backend of `group`.
  bool beyond_slice_in(uint32_t group) const noexcept {
    for (const backend_weight& m : _groups_state[group].members) {
      if (beyond_slice(m.backend)) return true;
    }
    return false;
  }
  bool fair(uint32_t group) const noexcept { return _groups_state[group].fair; }
  // Whether a peer has a request of `group` queued at a level above
  // `level` (any level when `level` is -1: this shard queues nothing).
  bool peer_waits_above(uint32_t group, int level) const noexcept {
    const size_t groups = _groups_state.size();
    for (uint32_t p = 0; p < _shard_count; ++p) {
      const uint32_t top = _queued[size_t{p} * groups + group];
      if (p != _shard && top != 0 && static_cast<int>(top) - 1 > level) return true;
    }
    return false;
  }
  uint32_t slot_cap(uint32_t backend) const noexcept { return _slot_cap[backend]; }
  // What this shard queues for `group`, as the peers get it: 0 nothing,
  // else 1 + the highest priority waiting.
  message queued_report(uint32_t group, uint32_t top) const noexcept {
    return {message_kind::group_queued, 0, static_cast<uint16_t>(_shard), 0, group, top};
  }

  uint32_t load(uint32_t backend) const noexcept { return _load[backend]; }
  load_view loads() const noexcept { return {_load}; }
  bool backend_up(uint32_t backend) const noexcept { return _up[backend] != 0; }
  bool backend_draining(uint32_t backend) const noexcept { return _draining[backend] != 0; }
  // Positions of `group` that take no new requests (down or draining).
  uint64_t skip_mask(uint32_t group) const noexcept { return _groups_state[group].skip; }

 private:
  struct group_state {
    maglev_ring ring;
    std::vector<backend_weight> members;  // by position, as given to the ring
    key_params keys;
    double bounded_load = 0;
    uint64_t skip = 0;         // positions a pick passes over (see refresh_group)
    uint64_t down = 0;         // positions whose backend is down or ejected
    uint64_t out = 0;          // positions whose backend is draining
    uint32_t panic_percent = 0;
    bool panic = false;        // too few healthy: the down ones serve too
    uint32_t rr_cursor = 0;
    bool fair = false;         // admission = "fair": pick() passes over backends without a free slot
  };

  void refresh_skip(uint32_t backend) noexcept;
  uint32_t slice_of(uint32_t shard, uint32_t backend) const noexcept {
    const uint32_t cap = _slot_cap[backend];
    return cap / _shard_count + (shard < cap % _shard_count ? 1 : 0);
  }
  bool slot_free(uint32_t group, uint32_t backend, uint8_t level) const noexcept;
  // Positions of `group` whose backend has no slot free for it at `level`.
  uint64_t full_mask(uint32_t group, uint8_t level) const noexcept;
  static void refresh_group(group_state& s) noexcept;
  void set_load(uint32_t backend) noexcept {
    _load[backend] = _local[backend] + static_cast<uint32_t>(_remote_sum[backend]) + _waiting[backend];
  }

  uint32_t _shard;
  uint32_t _shard_count;
  group_table _groups;
  std::vector<group_state> _groups_state;
  std::vector<uint8_t> _up;           // by backend
  std::vector<uint8_t> _draining;
  std::vector<uint32_t> _local;       // this shard's in-flight
  std::vector<uint64_t> _remote_sum;  // sum of the other shards' last reports
  std::vector<uint32_t> _remote;      // [shard * backends + backend]: last reports
  std::vector<uint32_t> _waiting;     // vllm:num_requests_waiting
  std::vector<uint32_t> _load;        // the sum of the three: the load view
  std::vector<uint32_t> _slot_cap;    // by backend: fair admission's slots (0 = unlimited)
  std::vector<uint32_t> _queued;      // [shard * groups + group]: the peers' queued reports (1 + top level; 0 none)
  uint8_t _admit_level = 0;
  uint64_t _local_version = 0;
};

}  // namespace sluice::route
