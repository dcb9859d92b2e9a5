// Live reload: lines a freshly loaded snapshot up with the running one so
// every index held by a shard or an in-flight request keeps its meaning
// (see reconcile() in config.hpp). Cold path: the control thread, on SIGHUP.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "sluice/config/config.hpp"
#include "sluice/config/semantic.hpp"

namespace sluice::config {

namespace {

bool same_server(const server_config& a, const server_config& b) {
  return a.listen.text == b.listen.text && a.admin.text == b.admin.text && a.cpus == b.cpus &&
         a.reuseport_steering == b.reuseport_steering && a.pin_shards == b.pin_shards &&
         a.max_body_bytes == b.max_body_bytes && a.max_head_bytes == b.max_head_bytes &&
         a.max_line_bytes == b.max_line_bytes && a.max_header_count == b.max_header_count &&
         a.header_timeout_ms == b.header_timeout_ms && a.body_timeout_ms == b.body_timeout_ms &&
         a.body_min_rate_bytes_per_s == b.body_min_rate_bytes_per_s && a.idle_timeout_ms == b.idle_timeout_ms &&
         a.drain_timeout_ms == b.drain_timeout_ms && a.connections_max == b.connections_max &&
         a.inflight_max == b.inflight_max && a.memory_max_bytes == b.memory_max_bytes && a.splice == b.splice &&
         a.upstream_buffers == b.upstream_buffers && a.idle_poll_us == b.idle_poll_us &&
         a.batch_wait_us == b.batch_wait_us &&
         a.admin_token == b.admin_token && a.h2c == b.h2c && a.listen_tls.text == b.listen_tls.text &&
         a.tls_h2 == b.tls_h2 && a.h2_max_concurrent_streams == b.h2_max_concurrent_streams &&
         a.h2_stream_window_bytes == b.h2_stream_window_bytes &&
         a.h2_connection_window_bytes == b.h2_connection_window_bytes &&
         a.h2_hpack_table_bytes == b.h2_hpack_table_bytes &&
         a.h2_resets_per_second_max == b.h2_resets_per_second_max &&
         a.h2_memory_max_bytes == b.h2_memory_max_bytes;
}

bool same_cluster(const cluster_config& a, const cluster_config& b) {
  return a.redis == b.redis && a.password == b.password && a.key_prefix == b.key_prefix &&
         a.expected_instances == b.expected_instances && a.timeout_ms == b.timeout_ms &&
         a.fallback_share == b.fallback_share && a.lease_window_ms == b.lease_window_ms &&
         a.lease_ttl_ms == b.lease_ttl_ms;
}

bool same_limits(const key_config& a, const key_config& b) {
  return a.tokens_per_minute == b.tokens_per_minute && a.requests_per_minute == b.requests_per_minute &&
         a.max_concurrent == b.max_concurrent;
}

// Places `next`'s entries at the running positions. `index_of(entry)`
// returns the running position of the same entry or npos. Returns: the old
// -> new position map of `next` (for remapping references).
template <class T, class Find, class Tombstone>
std::vector<uint32_t> line_up(const std::vector<T>& running, const std::vector<T>& next, std::vector<T>& out,
                              Find&& index_of, Tombstone&& tombstone) {
  out.clear();
  out.reserve(running.size() + next.size());
  for (const T& r : running) out.push_back(tombstone(r));
  std::vector<uint32_t> where(next.size());
  for (size_t i = 0; i < next.size(); ++i) {
    const size_t at = index_of(next[i]);
    if (at != std::string::npos) {
      out[at] = next[i];
      where[i] = static_cast<uint32_t>(at);
    } else {
      where[i] = static_cast<uint32_t>(out.size());
      out.push_back(next[i]);
    }
  }
  return where;
}

}  // namespace

reload_capacity capacity_for(const config& at_start) {
  // Room for growth without resizing anything a shard reads concurrently
  // (metrics rows, published quota levels). A reload past it needs a restart.
  reload_capacity c;
  c.backends = at_start.backends.size() + 32;
  c.groups = at_start.groups.size() + 16;
  c.keys = std::max<size_t>(at_start.keys.size() * 2, at_start.keys.size() + 64);
  return c;
}

std::shared_ptr<const config> reconcile(const config& next, const config& running, const reload_capacity& capacity,
                                        std::vector<std::string>& notes) {
  auto out = std::make_shared<config>(next);

  // Backends by URL.
  std::unordered_map<std::string, size_t> backend_at;
  for (size_t i = 0; i < running.backends.size(); ++i) backend_at.emplace(running.backends[i].url, i);
  const std::vector<uint32_t> backend_where = line_up(
      running.backends, next.backends, out->backends,
      [&](const backend_config& b) {
        auto it = backend_at.find(b.url);
        return it == backend_at.end() ? std::string::npos : it->second;
      },
      [](const backend_config& b) {
        backend_config t = b;
        t.removed = true;
        return t;
      });

  // Groups by name.
  std::unordered_map<std::string, size_t> group_at;
  for (size_t i = 0; i < running.groups.size(); ++i) group_at.emplace(running.groups[i].name, i);
  const std::vector<uint32_t> group_where = line_up(
      running.groups, next.groups, out->groups,
      [&](const group_config& g) {
        auto it = group_at.find(g.name);
        return it == group_at.end() ? std::string::npos : it->second;
      },
      [](const group_config& g) {
        group_config t = g;
        t.removed = true;
        t.models.clear();
        return t;
      });
  // References: a live group's backends (from `next`), rules, the default.
  for (size_t i = 0; i < next.groups.size(); ++i) {
    group_config& g = out->groups[group_where[i]];
    for (uint32_t& b : g.backends) b = backend_where[b];
  }
  for (rule_config& r : out->rules) r.group_index = group_where[r.group_index];
  if (out->router.embeddings_group_index != UINT32_MAX) {
    out->router.embeddings_group_index = group_where[out->router.embeddings_group_index];
  }
  if (out->router.default_group_index != UINT32_MAX) {
    out->router.default_group_index = group_where[out->router.default_group_index];
  }

  // Keys by id, and only with the same limits: new limits mean fresh
  // buckets, which a key's running slices (spread over every shard, with
  // capacity in flight between them) cannot be turned into in place.
  std::unordered_map<std::string, size_t> key_at;
  for (size_t i = 0; i < running.keys.size(); ++i) {
    if (!running.keys[i].removed) key_at[running.keys[i].id] = i;
  }
  size_t relimited = 0;
  line_up(
      running.keys, next.keys, out->keys,
      [&](const key_config& k) {
        auto it = key_at.find(k.id);
        if (it == key_at.end()) return std::string::npos;
        if (!same_limits(running.keys[it->second], k)) {
          ++relimited;
          return std::string::npos;
        }
        return it->second;
      },
      [](const key_config& k) {
        key_config t = k;
        t.removed = true;
        t.key_sha256 = {};
        t.groups.clear();
        return t;
      });

  if (out->backends.size() > capacity.backends || out->groups.size() > capacity.groups ||
      out->keys.size() > capacity.keys) {
    throw config_error(fmt::format(
        "{}: this reload needs {} backends, {} groups and {} keys counting removed ones; the running process has "
        "room for {}, {} and {}: restart sluice to apply it",
        next.source, out->backends.size(), out->groups.size(), out->keys.size(), capacity.backends,
        capacity.groups, capacity.keys));
  }

  if (!same_server(next.server, running.server)) {
    notes.push_back("[server] changed: its settings take effect at the next restart (the running values stay)");
  }
  if (next.audit.path != running.audit.path) {
    notes.push_back(fmt::format("[audit] path changed to \"{}\": takes effect at the next restart", next.audit.path));
  }
  if (next.audit.fsync_interval_ms != running.audit.fsync_interval_ms) {
    notes.push_back(fmt::format("[audit] fsync_interval_ms changed to {}: takes effect at the next restart",
                                next.audit.fsync_interval_ms));
  }
  // The control thread's Redis connection is made once, at start.
  if (!same_cluster(next.cluster, running.cluster)) {
    notes.push_back("[cluster] changed: its settings take effect at the next restart (the running values stay)");
  }
  out->server = running.server;
  out->audit = running.audit;
  out->cluster = running.cluster;

  auto count_live = [](const auto& v) {
    return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](const auto& e) { return !e.removed; }));
  };
  auto count_new = [](const auto& where, size_t running_size) {
    return static_cast<size_t>(std::count_if(where.begin(), where.end(), [&](uint32_t w) { return w >= running_size; }));
  };
  auto count_removed = [](const auto& before, const auto& after) {
    size_t n = 0;
    for (size_t i = 0; i < before.size(); ++i) n += !before[i].removed && after[i].removed;
    return n;
  };
  notes.push_back(fmt::format("backends: {} live ({} new, {} removed); groups: {} live ({} new, {} removed); keys: {} "
                              "live ({} with new limits)",
                              count_live(out->backends), count_new(backend_where, running.backends.size()),
                              count_removed(running.backends, out->backends), count_live(out->groups),
                              count_new(group_where, running.groups.size()),
                              count_removed(running.groups, out->groups), count_live(out->keys), relimited));
  if (out->router.model != nullptr) notes.push_back(fmt::format("router: classifier {}", out->router.model->origin));
  return out;
}

}  // namespace sluice::config
