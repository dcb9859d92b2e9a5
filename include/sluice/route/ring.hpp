#pragma once
// route: the per-group consistent-hash ring. One replica per shard per group,
// built on the cold path (start-up, reload, weight change); lookups are pure
// reads of precomputed arrays and never allocate.
//
// Why Maglev (Eisenbud et al., NSDI 2016) and not weighted virtual nodes
// (tests/unit/route/ring_test.cpp measures both, "the measured numbers";
// the figures: bench/RESULTS.md, "Figures behind choices in the code"):
// virtual nodes move only the removed backend's keys, but at 160 points
// they miss the balance bound of max/mean <= 1.10, and 1000 points (160 KiB of points
// per group per shard, a cache-missing binary search) still balance worse
// than Maglev's 64 KiB table (uint8 entries) read once. Maglev's extra remap
// on a rebuild (0.2 %) is well within the 1/N + 2 % bound. A backend that is
// down or draining is not rebuilt away but skipped by the walk below, which
// moves exactly its own keys. Weights are honoured within 5 % (tests:
// "weights are honoured").
//
// Successors: a key's candidates are the distinct backends met walking the
// table from its slot (slot, slot+1, ...). The walk order is the same on
// every shard and every sluice instance, so the spill of a hot or unhealthy
// backend lands on the same next backend everywhere: no shared state.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace sluice::route {

inline constexpr uint32_t k_none = UINT32_MAX;
inline constexpr uint32_t k_ring_backends_max = 64;  // masks are one uint64_t

// One backend as the ring sees it. `id` is its stable identity (backend_id()
// of its URL): the table depends on ids and weights, never on list order.
struct backend_weight {
  uint32_t backend = 0;  // global backend index (config::config::backends)
  uint64_t id = 0;
  uint32_t weight = 1;   // 1..1000
};

// XXH3-64 of a normalized backend URL ("http://host:port").
uint64_t backend_id(std::string_view url) noexcept;

// Per-backend load, indexed by GLOBAL backend index: this shard's in-flight +
// the other shards' last reports + the backend's vllm:num_requests_waiting
// (route::table keeps it up to date).
struct load_view {
  std::span<const uint32_t> load;
};

// Shard-local; lives as long as the config snapshot (or until a weight change
// rebuilds it in place).
class maglev_ring {
 public:
  static constexpr uint32_t k_table_size = 65521;  // prime < 2^16; fixed so a rebuild
                                                   // with another backend count remaps little

  maglev_ring() = default;
  // Cold path. At most k_ring_backends_max backends, each weight >= 1.
  explicit maglev_ring(std::span<const backend_weight> backends);
  void rebuild(std::span<const backend_weight> backends);

  uint32_t size() const noexcept { return static_cast<uint32_t>(_backends.size()); }
  // Ring position -> global backend index / weight.
  uint32_t backend(uint32_t position) const noexcept { return _backends[position].backend; }
  uint32_t weight(uint32_t position) const noexcept { return _backends[position].weight; }
  // Returns: the position of `backend` (global index), or k_none.
  uint32_t position_of(uint32_t backend) const noexcept;

  // The key's backend: walks the successors, passing positions in
  // `skip_mask` (bit = position: down, draining, already tried) and, when
  // c > 0, backends whose load would exceed their bounded-load capacity
  // ceil(c * (total + 1) * weight / total_weight) over the eligible ones.
  // Returns: a position, or k_none when every position is skipped (503).
  uint32_t pick(uint64_t key_hash, const load_view& load, double c, uint64_t skip_mask) const noexcept;

  // The first eligible position on the key's walk, ignoring load.
  uint32_t owner(uint64_t key_hash, uint64_t skip_mask = 0) const noexcept {
    return pick(key_hash, load_view{}, 0.0, skip_mask);
  }

  // Smooth weighted round-robin over the eligible positions; `cursor` is the
  // caller's (per shard per group). Returns: a position or k_none.
  uint32_t pick_round_robin(uint32_t& cursor, uint64_t skip_mask) const noexcept;

  // The eligible position with the least load per weight; ties are broken by
  // `tie_break` (e.g. the route key), so equal loads still spread.
  // Returns: a position or k_none.
  uint32_t pick_least_loaded(const load_view& load, uint64_t skip_mask, uint64_t tie_break) const noexcept;

  // Entries per position in the table (tests: balance of the table itself).
  std::vector<uint32_t> entry_counts() const;

 private:
  std::vector<backend_weight> _backends;  // by position (the order given)
  std::vector<uint8_t> _table;            // slot -> position
  std::vector<uint8_t> _rr;               // one smooth weighted round-robin cycle
  uint64_t _all_mask = 0;
};

// Weighted virtual nodes (ketama-style): `points_per_weight` points per unit
// of weight on a 64-bit circle, binary search on lookup. Kept as the measured
// alternative to Maglev (see the table above) and as a second opinion in
// tests; the proxy uses maglev_ring.
class vnode_ring {
 public:
  vnode_ring(std::span<const backend_weight> backends, uint32_t points_per_weight);
  // Returns: the position owning the first point at or after the key.
  uint32_t owner(uint64_t key_hash) const noexcept;

 private:
  struct point {
    uint64_t hash;
    uint32_t position;
  };
  std::vector<point> _points;  // sorted by hash
};

}  // namespace sluice::route
