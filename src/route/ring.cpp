// Maglev table population and the successor walk (see ring.hpp for the
// choice and its numbers).
#include "sluice/route/ring.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "sluice/core/assert.hpp"

namespace sluice::route {

namespace {

// Seeds for the two permutation hashes of a backend id; any fixed values do,
// but changing them remaps every key on every sluice instance.
constexpr uint64_t k_offset_seed = 0x6d61676c65762d6full;  // "maglev-o"
constexpr uint64_t k_skip_seed = 0x6d61676c65762d73ull;    // "maglev-s"
constexpr uint8_t k_empty = 0xff;

uint64_t hash_id(uint64_t id, uint64_t seed) noexcept { return XXH3_64bits_withSeed(&id, sizeof id, seed); }

uint64_t bit(uint32_t position) noexcept { return uint64_t{1} << position; }

}  // namespace

uint64_t backend_id(std::string_view url) noexcept { return XXH3_64bits(url.data(), url.size()); }

maglev_ring::maglev_ring(std::span<const backend_weight> backends) { rebuild(backends); }

void maglev_ring::rebuild(std::span<const backend_weight> backends) {
  SLUICE_VERIFY(backends.size() <= k_ring_backends_max);
  _backends.assign(backends.begin(), backends.end());
  _table.assign(k_table_size, k_empty);
  _rr.clear();
  const auto n = static_cast<uint32_t>(_backends.size());
  _all_mask = n == 64 ? ~uint64_t{0} : bit(n) - 1;
  if (n == 0) return;

  // Populate in id order, not list order: the same set of backends gives the
  // same table whatever order the config lists them in.
  std::array<uint32_t, k_ring_backends_max> order{};
  std::iota(order.begin(), order.begin() + n, 0u);
  std::sort(order.begin(), order.begin() + n, [&](uint32_t a, uint32_t b) {
    return _backends[a].id != _backends[b].id ? _backends[a].id < _backends[b].id : a < b;
  });
  std::array<uint64_t, k_ring_backends_max> offset{}, skip{}, next{}, credit{};
  uint32_t weight_max = 1;
  for (uint32_t p = 0; p < n; ++p) {
    SLUICE_VERIFY(_backends[p].weight >= 1);
    offset[p] = hash_id(_backends[p].id, k_offset_seed) % k_table_size;
    skip[p] = hash_id(_backends[p].id, k_skip_seed) % (k_table_size - 1) + 1;
    weight_max = std::max(weight_max, _backends[p].weight);
  }
  // Weighted Maglev: every round, each backend earns `weight` credit and
  // claims one slot per `weight_max` credit, so slot counts follow weights.
  uint32_t filled = 0;
  while (filled < k_table_size) {
    for (uint32_t i = 0; i < n && filled < k_table_size; ++i) {
      const uint32_t p = order[i];
      credit[p] += _backends[p].weight;
      while (credit[p] >= weight_max && filled < k_table_size) {
        credit[p] -= weight_max;
        uint64_t slot = 0;
        do {
          slot = (offset[p] + next[p] * skip[p]) % k_table_size;
          ++next[p];
        } while (_table[slot] != k_empty);
        _table[slot] = static_cast<uint8_t>(p);
        ++filled;
      }
    }
  }

  // One cycle of smooth weighted round-robin (each step: every position gains
  // its weight, the richest is chosen and pays the total), so a weight-3 and
  // a weight-1 backend alternate A A B A rather than A A A B. The cycle is
  // sum(weights) / gcd long.
  uint32_t g = 0;
  for (const auto& b : _backends) g = std::gcd(g, b.weight);
  int64_t total = 0;
  for (const auto& b : _backends) total += b.weight / g;
  std::array<int64_t, k_ring_backends_max> current{};
  _rr.reserve(static_cast<size_t>(total));
  for (int64_t step = 0; step < total; ++step) {
    uint32_t best = 0;
    for (uint32_t p = 0; p < n; ++p) {
      current[p] += _backends[p].weight / g;
      if (current[p] > current[best]) best = p;
    }
    current[best] -= total;
    _rr.push_back(static_cast<uint8_t>(best));
  }
}

uint32_t maglev_ring::position_of(uint32_t backend) const noexcept {
  for (uint32_t p = 0; p < size(); ++p) {
    if (_backends[p].backend == backend) return p;
  }
  return k_none;
}

namespace {
constexpr double k_min_capacity_per_weight = 2.0;
}  // namespace

uint32_t maglev_ring::pick(uint64_t key_hash, const load_view& load, double c, uint64_t skip_mask) const noexcept {
  const uint64_t eligible = _all_mask & ~skip_mask;
  if (eligible == 0) return k_none;
  const bool bounded = c > 0 && !load.load.empty();

  // Capacity per weight unit: c * (total + 1) / total_weight over the
  // eligible backends (Mirrokni et al.: ceil(c * (m + 1) / n) bins, weighted).
  double per_weight = 0;
  if (bounded) {
    uint64_t total = 0, total_weight = 0;
    for (uint32_t p = 0; p < size(); ++p) {
      if ((eligible & bit(p)) == 0) continue;
      SLUICE_ASSERT(_backends[p].backend < load.load.size());
      total += load.load[_backends[p].backend];
      total_weight += _backends[p].weight;
    }
    per_weight = c * static_cast<double>(total + 1) / static_cast<double>(total_weight);
  }
  const auto fits = [&](uint32_t p) {
    if (!bounded) return true;
    // At least two requests per weight unit: at near-zero load the bound
    // (ceil(c * (m + 1) / n) = 1) would move a session off its backend for
    // one request in flight -- or for a load report from another shard
    // that is a few milliseconds old -- and cost it its KV cache for
    // nothing. Spilling is for real pile-ups.
    const double capacity =
        std::max(std::ceil(per_weight * _backends[p].weight), k_min_capacity_per_weight * _backends[p].weight);
    return static_cast<double>(load.load[_backends[p].backend]) + 1.0 <= capacity;
  };

  uint64_t seen = 0;
  uint32_t slot = static_cast<uint32_t>(key_hash % k_table_size);
  for (uint32_t step = 0; step < k_table_size; ++step) {
    const uint32_t p = _table[slot];
    if ((seen & bit(p)) == 0) {
      seen |= bit(p);
      if ((eligible & bit(p)) != 0 && fits(p)) return p;
      if ((seen & eligible) == eligible) break;  // every candidate met: none fits
    }
    slot = slot + 1 == k_table_size ? 0 : slot + 1;
  }
  // Unreachable with c > 1 (the least loaded per weight always fits, see the
  // proof in the paper); kept so that a stale or odd load view still routes.
  return pick_least_loaded(load, skip_mask, key_hash);
}

uint32_t maglev_ring::pick_round_robin(uint32_t& cursor, uint64_t skip_mask) const noexcept {
  const uint64_t eligible = _all_mask & ~skip_mask;
  if (eligible == 0 || _rr.empty()) return k_none;
  const auto cycle = static_cast<uint32_t>(_rr.size());
  for (uint32_t i = 0; i < cycle; ++i) {
    const uint32_t p = _rr[cursor++ % cycle];
    if ((eligible & bit(p)) != 0) return p;
  }
  return k_none;  // unreachable: every position appears in a cycle
}

uint32_t maglev_ring::pick_least_loaded(const load_view& load, uint64_t skip_mask, uint64_t tie_break) const noexcept {
  const uint64_t eligible = _all_mask & ~skip_mask;
  if (eligible == 0) return k_none;
  const uint32_t n = size();
  const auto start = static_cast<uint32_t>(tie_break % n);
  uint32_t best = k_none;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t p = (start + i) % n;
    if ((eligible & bit(p)) == 0) continue;
    if (best == k_none) {
      best = p;
      continue;
    }
    if (load.load.empty()) break;
    // load_p / w_p < load_best / w_best, without division.
    const uint64_t lhs = uint64_t{load.load[_backends[p].backend]} * _backends[best].weight;
    const uint64_t rhs = uint64_t{load.load[_backends[best].backend]} * _backends[p].weight;
    if (lhs < rhs) best = p;
  }
  return best;
}

std::vector<uint32_t> maglev_ring::entry_counts() const {
  std::vector<uint32_t> counts(size(), 0);
  for (uint8_t p : _table) ++counts[p];
  return counts;
}

vnode_ring::vnode_ring(std::span<const backend_weight> backends, uint32_t points_per_weight) {
  for (uint32_t p = 0; p < backends.size(); ++p) {
    const uint32_t points = points_per_weight * backends[p].weight;
    for (uint32_t i = 0; i < points; ++i) {
      _points.push_back({XXH3_64bits_withSeed(&backends[p].id, sizeof backends[p].id, i), p});
    }
  }
  std::sort(_points.begin(), _points.end(), [](const point& a, const point& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.position < b.position;
  });
}

uint32_t vnode_ring::owner(uint64_t key_hash) const noexcept {
  if (_points.empty()) return k_none;
  auto it = std::lower_bound(_points.begin(), _points.end(), key_hash,
                             [](const point& a, uint64_t h) { return a.hash < h; });
  if (it == _points.end()) it = _points.begin();
  return it->position;
}

}  // namespace sluice::route
