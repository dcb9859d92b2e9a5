#pragma once
// Test helper: N shard_slices joined by FIFO links with a delivery delay, on
// a simulated clock. Messages are delivered per link in order (the SPSC
// queue's guarantee); links are drained in a caller-chosen order, which is
// how the simulation reorders messages across links.
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "sluice/quota/shard_slices.hpp"

namespace sluice::quota::test {

struct in_transit {
  int64_t deliver_ns;
  message m;
};

class cluster {
 public:
  cluster(uint32_t shards, std::vector<key_limits> keys, int64_t now_ns, slices_options options = {})
      : _keys(std::move(keys)), _links(size_t{shards} * shards) {
    for (uint32_t i = 0; i < shards; ++i) {
      _shards.push_back(std::make_unique<shard_slices>(i, shards, _keys, now_ns, options));
    }
  }

  uint32_t size() const { return static_cast<uint32_t>(_shards.size()); }
  shard_slices& operator[](uint32_t i) { return *_shards[i]; }
  const std::vector<key_limits>& keys() const { return _keys; }

  // Moves up to `max` messages of each of shard `from`'s outboxes onto its
  // links, to be delivered `delay_ns` later (never before an earlier message
  // of the same link).
  void drain(uint32_t from, int64_t now_ns, int64_t delay_ns, size_t max = SIZE_MAX) {
    for (uint32_t to = 0; to < size(); ++to) {
      if (to == from) continue;
      auto& link = _links[from * size() + to];
      _shards[from]->drain_outbox(to, [&](const message* m, size_t n) {
        const size_t take = std::min(n, max);
        for (size_t i = 0; i < take; ++i) {
          const int64_t at = std::max(now_ns + delay_ns, link.empty() ? 0 : link.back().deliver_ns);
          link.push_back({at, m[i]});
        }
        _in_links += take;
        return take;
      });
    }
  }

  // Delivers the due messages of link (from → to). Returns: keys whose
  // borrow round completed on `to` (appended to `completed`).
  size_t deliver(uint32_t from, uint32_t to, int64_t now_ns, std::vector<uint32_t>* completed = nullptr) {
    auto& link = _links[from * size() + to];
    size_t n = 0;
    while (!link.empty() && link.front().deliver_ns <= now_ns) {
      const message m = link.front().m;
      link.pop_front();
      --_in_links;
      const auto effect = _shards[to]->on_message(m, now_ns);
      if (effect.round_complete && completed) completed->push_back(effect.key);
      ++n;
    }
    return n;
  }

  // Drains every outbox and delivers everything due, until nothing moves.
  void pump(int64_t now_ns, std::vector<uint32_t>* completed = nullptr) {
    for (;;) {
      size_t moved = 0;
      for (uint32_t from = 0; from < size(); ++from) {
        for (uint32_t to = 0; to < size(); ++to) moved += _shards[from]->outbox_size(to);
        drain(from, now_ns, 0);
      }
      for (uint32_t from = 0; from < size(); ++from) {
        for (uint32_t to = 0; to < size(); ++to) {
          if (from != to) moved += deliver(from, to, now_ns, completed);
        }
      }
      if (moved == 0) return;
    }
  }

  // Capacity and tokens of (key, r) everywhere: slices, outboxes, links.
  struct totals {
    int64_t capacity = 0;
    int64_t level = 0;            // positive levels only: what could be spent
    bool level_within_capacity = true;
  };
  totals sum(uint32_t key, resource r) const {
    totals t;
    const auto carried = [&](const message& m) {
      if (m.key != key || m.res != r || m.kind == message_kind::lend_request) return;
      t.capacity += m.capacity;
      t.level += m.level;
      if (m.level > m.capacity || m.level < 0) t.level_within_capacity = false;
    };
    for (uint32_t i = 0; i < size(); ++i) {
      const auto& s = *_shards[i];
      t.capacity += s.capacity(key, r);
      t.level += std::max<int64_t>(s.level(key, r), 0);
      if (s.level(key, r) > s.capacity(key, r)) t.level_within_capacity = false;
      for (uint32_t to = 0; to < size(); ++to) {
        if (to == i) continue;
        for (size_t m = 0; m < s.outbox_size(to); ++m) carried(s.outbox_at(to, m));
      }
    }
    for (const auto& link : _links) {
      for (const auto& x : link) carried(x.m);
    }
    return t;
  }

  // sum() for every key and resource in one pass: [key][resource].
  std::vector<std::array<totals, k_resource_count>> sum_all() const {
    std::vector<std::array<totals, k_resource_count>> all(_keys.size());
    const auto carried = [&](const message& m) {
      if (m.kind == message_kind::lend_request || m.key >= all.size()) return;
      totals& t = all[m.key][static_cast<size_t>(m.res)];
      t.capacity += m.capacity;
      t.level += m.level;
      if (m.level > m.capacity || m.level < 0) t.level_within_capacity = false;
    };
    for (uint32_t i = 0; i < size(); ++i) {
      const auto& s = *_shards[i];
      for (uint32_t key = 0; key < _keys.size(); ++key) {
        for (size_t r = 0; r < k_resource_count; ++r) {
          const auto res = static_cast<resource>(r);
          totals& t = all[key][r];
          t.capacity += s.capacity(key, res);
          t.level += std::max<int64_t>(s.level(key, res), 0);
          if (s.level(key, res) > s.capacity(key, res)) t.level_within_capacity = false;
        }
      }
      for (uint32_t to = 0; to < size(); ++to) {
        if (to == i) continue;
        for (size_t m = 0; m < s.outbox_size(to); ++m) carried(s.outbox_at(to, m));
      }
    }
    if (_in_links != 0) {
      for (const auto& link : _links) {
        for (const auto& x : link) carried(x.m);
      }
    }
    return all;
  }

  bool quiet() const {
    if (_in_links != 0) return false;
    for (const auto& s : _shards) {
      if (!s->outbox_empty()) return false;
    }
    return true;
  }

 private:
  std::vector<key_limits> _keys;
  std::vector<std::unique_ptr<shard_slices>> _shards;
  std::vector<std::deque<in_transit>> _links;  // [from * n + to]
  size_t _in_links = 0;
};

inline int64_t global_of(const key_limits& k, resource r) {
  switch (r) {
    case resource::tokens: return static_cast<int64_t>(k.tokens_per_minute);
    case resource::requests: return static_cast<int64_t>(k.requests_per_minute);
    case resource::concurrency: return k.max_concurrent;
  }
  return 0;
}

}  // namespace sluice::quota::test
