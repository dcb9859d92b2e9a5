// Budgets on the control thread: the ledger's period, the state file's
// saves, the budget metrics and GET /keys/{id} (sluice/control/budgets.hpp).
#include "sluice/metrics/exposition.hpp"
#include "sluice/control/budgets.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>

#include "sluice/cluster/budget_store.hpp"
#include "sluice/cluster/cluster.hpp"
#include "sluice/control/gateway.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/route/groups.hpp"

namespace sluice::control {

namespace {

// The rejection reasons' label values, in the board's order: the key's four
// budgets, then its group's two.
constexpr std::string_view k_reasons[quota::budget_board::k_reasons] = {
    "daily_tokens", "monthly_tokens", "daily_spend", "monthly_spend", "group_daily_tokens", "group_monthly_tokens"};

void put_budget_json(std::string& out, quota::budget_kind k, uint64_t limit, uint64_t used, int64_t reset_ms) {
  char reset[quota::k_utc_chars];
  const std::string_view at(reset, quota::format_utc(reset_ms, reset));
  const uint64_t left = limit > used ? limit - used : 0;
  if (quota::is_spend(k)) {
    fmt::format_to(std::back_inserter(out), "\"{}\":{{\"limit\":{:.6f},\"used\":{:.6f},\"left\":{:.6f},\"resets_at\":\"{}\"}}",
                   quota::budget_name(k), static_cast<double>(limit) / 1e9, static_cast<double>(used) / 1e9,
                   static_cast<double>(left) / 1e9, at);
  } else {
    fmt::format_to(std::back_inserter(out), "\"{}\":{{\"limit\":{},\"used\":{},\"left\":{},\"resets_at\":\"{}\"}}",
                   quota::budget_name(k), limit, used, left, at);
  }
}

int64_t reset_of(quota::budget_kind k, quota::budget_windows w) {
  return quota::is_daily(k) ? quota::day_end_ms(w.day) : quota::month_end_ms(w.month);
}

}  // namespace

budget_keeper::budget_keeper(const config::config& cfg, size_t shards) {
  const config::reload_capacity cap = config::capacity_for(cfg);
  _board = std::make_unique<quota::budget_board>(static_cast<uint32_t>(shards == 0 ? 1 : shards),
                                                 static_cast<uint32_t>(cap.keys), static_cast<uint32_t>(cap.groups));
  std::unique_ptr<quota::budget_store> store;
  if (cfg.cluster.enabled()) {
    // Shared by every instance; the state file is not used.
    auto redis = std::make_unique<cluster::redis_budget_store>(cluster::redis_options_from(cfg.cluster),
                                                               cluster::instance_id());
    _redis = redis.get();
    store = std::move(redis);
  } else if (!cfg.quota.budget_state_file.empty()) {
    store = std::make_unique<quota::budget_file_store>(cfg.quota.budget_state_file);
  }
  _ledger = std::make_unique<quota::budget_ledger>(*_board, std::move(store));
  const auto now_ms = static_cast<int64_t>(realtime_ms());
  std::string error;
  if (!_ledger->load(cfg, now_ms, error)) throw std::runtime_error(error);
  // The flags are right before the first request: a key used up before a
  // restart (or on another instance) is refused from the start.
  _ledger->step(cfg, now_ms);
}

budget_keeper::~budget_keeper() = default;

void budget_keeper::attach(shard::reactor& r) {
  if (_redis != nullptr) _redis->attach(r);
}

void budget_keeper::on_iteration(const config::config& cfg, uint64_t mono_ms, int64_t unix_ms) {
  if (_redis != nullptr) _redis->on_iteration(mono_ms);
  if (mono_ms - _last_step_ms < k_period_ms) return;
  _last_step_ms = mono_ms;
  // Redis's answer first: the step publishes the others' usage at once (the
  // admin page never shows a total whose bits have not flipped yet).
  _ledger->collect();
  _ledger->step(cfg, unix_ms);
  _ledger->save(unix_ms);
}

void budget_keeper::hand_over() { _ledger->hand_over(); }

void budget_keeper::shutdown(const config::config& cfg, int64_t unix_ms) {
  _ledger->step(cfg, unix_ms);
  const bool kept = _ledger->save(unix_ms, true);
  if (!kept && _ledger->store() != nullptr) {
    log::error("budgets: the last usage could not be kept in {}", _ledger->store()->describe());
  }
  if (_redis != nullptr) _redis->detach();
}

void budget_keeper::render_metrics(const config::config& cfg, int64_t unix_ms, std::string& out) const {
  const quota::budget_board& b = *_board;
  const size_t keys = std::min<size_t>(cfg.keys.size(), b.keys_max());
  // A key re-limited by a reload has several positions under one id: one series.
  std::map<std::string_view, std::array<uint64_t, quota::budget_board::k_reasons>> rejected;
  for (uint32_t k = 0; k < keys; ++k) {
    auto& row = rejected[cfg.keys[k].id];
    for (size_t r = 0; r < quota::budget_board::k_reasons; ++r) row[r] += b.rejections(k, r);
  }
  metrics::family rejections(out, "sluice_budget_rejections_total", metrics::family_type::counter,
                             "Requests refused 429 insufficient_quota, by key and the budget used up.");
  for (const auto& [id, row] : rejected) {
    for (size_t r = 0; r < row.size(); ++r) {
      if (row[r] != 0) rejections.add({{"key", id}, {"budget", k_reasons[r]}}, row[r]);
    }
  }
  // Used amounts of the budgets that are set (spend in currency units).
  const quota::budget_windows now = quota::windows_at(unix_ms);
  metrics::family used(out, "sluice_budget_used", metrics::family_type::gauge,
                       "Used in the current window, by key and budget (tokens; spend in currency).");
  for (uint32_t k = 0; k < keys; ++k) {
    const config::key_config& kc = cfg.keys[k];
    if (kc.removed) continue;
    const quota::budget_limits limits = quota::limits_of(kc);
    const quota::budget_usage u = _ledger->usage(quota::subject_kind::key, kc.id, now);
    for (size_t i = 0; i < quota::budget_kind_count; ++i) {
      if (limits[i] == 0) continue;
      if (i >= 2) {
        used.add_scaled({{"key", kc.id}, {"budget", k_reasons[i]}}, u.used[i], 9);  // nano-units of currency
      } else {
        used.add({{"key", kc.id}, {"budget", k_reasons[i]}}, u.used[i]);
      }
    }
  }
  metrics::family group_used(out, "sluice_group_budget_used_tokens", metrics::family_type::gauge,
                             "Tokens used in the current window by a group's keys together.");
  for (const config::group_config& g : cfg.groups) {
    if (g.removed || (g.daily_tokens | g.monthly_tokens) == 0) continue;
    const quota::budget_usage u = _ledger->usage(quota::subject_kind::group, g.name, now);
    for (size_t i = 0; i < 2; ++i) {
      if ((i == 0 ? g.daily_tokens : g.monthly_tokens) == 0) continue;
      group_used.add({{"group", g.name}, {"budget", k_reasons[i]}}, u.used[i]);
    }
  }
}

quota::budget_usage budget_keeper::key_usage(std::string_view id, int64_t unix_ms) const {
  return _ledger->usage(quota::subject_kind::key, id, quota::windows_at(unix_ms));
}

bool budget_keeper::describe_key(const config::config& cfg, const gateway& g, std::string_view id, int64_t unix_ms,
                                 std::string& out) const {
  int64_t at = -1;
  for (size_t k = 0; k < cfg.keys.size(); ++k) {
    if (!cfg.keys[k].removed && cfg.keys[k].id == id) at = static_cast<int64_t>(k);
  }
  if (at < 0) return false;
  const uint32_t k = static_cast<uint32_t>(at);
  const config::key_config& kc = cfg.keys[k];
  const quota::budget_windows now = quota::windows_at(unix_ms);
  // The levels as the rate-limit headers compute them: every shard's slice
  // as it last published it.
  auto level = [&](uint64_t limit, int r) -> std::string {
    if (limit == 0) return "null";
    const int64_t v = g.quota_level(k, r);
    return fmt::format("{}", v < 0 ? 0 : static_cast<uint64_t>(v) > limit ? limit : static_cast<uint64_t>(v));
  };
  // The key's id is a plain name (config.cpp checks it): no escaping needed.
  fmt::format_to(std::back_inserter(out),
                 "{{\"object\":\"key\",\"id\":\"{}\",\"limits\":{{\"tokens_per_minute\":{},\"requests_per_minute\":{},"
                 "\"max_concurrent\":{}}},\"levels\":{{\"tokens_remaining\":{},\"requests_remaining\":{}}},\"budgets\":{{",
                 kc.id, kc.tokens_per_minute, kc.requests_per_minute, kc.max_concurrent, level(kc.tokens_per_minute, 0),
                 level(kc.requests_per_minute, 1));
  const quota::budget_limits limits = quota::limits_of(kc);
  const quota::budget_usage u = _ledger->usage(quota::subject_kind::key, kc.id, now);
  bool first = true;
  for (size_t i = 0; i < quota::budget_kind_count; ++i) {
    if (limits[i] == 0) continue;
    if (!first) out += ',';
    first = false;
    const auto bk = static_cast<quota::budget_kind>(i);
    put_budget_json(out, bk, limits[i], u.used[i], reset_of(bk, now));
  }
  // What the key used in its windows, budget or not.
  fmt::format_to(std::back_inserter(out), "}},\"used\":{{\"daily_tokens\":{},\"monthly_tokens\":{},\"daily_spend\":{:.6f},"
                 "\"monthly_spend\":{:.6f}}},\"groups\":[",
                 u.used[0], u.used[1], static_cast<double>(u.used[2]) / 1e9, static_cast<double>(u.used[3]) / 1e9);
  // The budgets of the groups this key may use (all keys of a group together).
  first = true;
  for (const config::group_config& grp : cfg.groups) {
    if (grp.removed || (grp.daily_tokens | grp.monthly_tokens) == 0) continue;
    bool allowed = false;
    for (const std::string& p : kc.groups) allowed = allowed || route::glob_match(p, grp.name);
    if (!allowed) continue;
    if (!first) out += ',';
    first = false;
    const quota::budget_usage gu = _ledger->usage(quota::subject_kind::group, grp.name, now);
    fmt::format_to(std::back_inserter(out), "{{\"name\":\"{}\",\"budgets\":{{", grp.name);
    bool inner_first = true;
    for (size_t i = 0; i < 2; ++i) {
      const uint64_t limit = i == 0 ? grp.daily_tokens : grp.monthly_tokens;
      if (limit == 0) continue;
      if (!inner_first) out += ',';
      inner_first = false;
      const auto bk = static_cast<quota::budget_kind>(i);
      put_budget_json(out, bk, limit, gu.used[i], reset_of(bk, now));
    }
    out += "}}";
  }
  out += "]}";
  return true;
}

}  // namespace sluice::control
