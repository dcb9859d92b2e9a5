// The status page's sampler and its JSON (status.hpp). Control thread only;
// every read of a shard's counter is a relaxed load of a single-writer
// atomic, as /metrics does.
#include "sluice/control/status.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string_view>
#include <unordered_map>

#include "sluice/control/budgets.hpp"
#include "sluice/control/gateway.hpp"
#include "sluice/control/health.hpp"
#include "sluice/quota/budget.hpp"

namespace sluice::control {

namespace {

constexpr size_t k_shard_width = 7;  // shard_loop's five, connections open, memory

// 4xx and 5xx answers in a totals_codes row.
void error_classes(const uint64_t* codes, uint64_t& e4, uint64_t& e5) noexcept {
  e4 = e5 = 0;
  for (size_t c = 0; c + 1 < metrics::status_code_count; ++c) {
    const uint16_t s = metrics::status_codes[c];
    if (s >= 400 && s < 500) e4 += codes[c];
    if (s >= 500) e5 += codes[c];
  }
}

}  // namespace

status_sampler::status_sampler(const gateway& g)
    : _g(g),
      _traffic(g.metrics().group_capacity() + 2, metrics::totals_width, k_points),
      _backends(g.metrics().backend_capacity() + 1, 3, k_points),
      _keys(g.metrics().key_capacity() + 1, metrics::registry::key_usage_width, k_window_ms / k_step_ms + 2),
      _shards(g.shard_count(), k_shard_width, k_points) {}

void status_sampler::on_iteration(uint64_t now_ms) noexcept {
  if (!_sampled) {
    _started_ms = now_ms;
    sample(now_ms);
    return;
  }
  if (now_ms - _last_ms >= k_step_ms) sample(now_ms);
}

void status_sampler::sample(uint64_t now_ms) noexcept {
  const metrics::registry& m = _g.metrics();
  {
    std::span<uint64_t> p = _traffic.stage();
    const size_t w = metrics::totals_width;
    // Group rows 1..capacity+1 (the last is `none`); row 0 is their sum.
    // Rows past the named groups are 0 until a reload names them.
    const size_t named = std::min(m.label_names().groups.size(), m.group_capacity());
    for (size_t gi = 0; gi < named; ++gi) m.add_group_totals(gi, &p[(1 + gi) * w]);
    m.add_group_totals(m.group_capacity(), &p[(1 + m.group_capacity()) * w]);
    for (size_t r = 1; r < _traffic.rows(); ++r) {
      for (size_t f = 0; f < w; ++f) p[f] += p[r * w + f];
    }
    _traffic.commit(now_ms);
  }
  {
    std::span<uint64_t> p = _backends.stage();
    for (uint32_t b = 0; b < m.backend_capacity(); ++b) {
      uint64_t inflight = 0;
      m.backend_answers(b, p[b * 3], p[b * 3 + 1]);
      m.backend_load(b, inflight, p[b * 3 + 2]);
    }
    _backends.commit(now_ms);
  }
  {
    std::span<uint64_t> p = _keys.stage();
    for (uint32_t k = 0; k <= m.key_capacity(); ++k) m.key_usage(k, &p[k * metrics::registry::key_usage_width]);
    _keys.commit(now_ms);
  }
  {
    std::span<uint64_t> p = _shards.stage();
    for (size_t s = 0; s < _shards.rows(); ++s) {
      uint64_t* row = &p[s * k_shard_width];
      m.shard_loop(s, row);
      row[5] = m.shard(s).at(metrics::stat::connections_open).get();
      row[6] = m.shard(s).at(metrics::stat::memory_bytes).get();
    }
    _shards.commit(now_ms);
  }
  _last_ms = now_ms;
  _sampled = true;
}

void status_sampler::fill_traffic(traffic_row& r, size_t row, size_t from, size_t to, bool steps) const {
  const metrics::series_ring& t = _traffic;
  if (t.size() == 0) return;
  const uint64_t* now = t.at(to, row);
  r.requests = 0;
  for (size_t c = 0; c < metrics::status_code_count; ++c) {
    r.by_code[c] = now[metrics::totals_codes + c];
    r.requests += r.by_code[c];
  }
  error_classes(now + metrics::totals_codes, r.errors_4xx, r.errors_5xx);
  r.tokens_in = now[metrics::totals_tokens];
  r.tokens_out = now[metrics::totals_tokens + 1];
  const double dt_s = t.time_ms(to) > t.time_ms(from) ? static_cast<double>(t.time_ms(to) - t.time_ms(from)) / 1000.0 : 0;
  if (dt_s > 0) {
    uint64_t requests = 0;
    for (size_t c = 0; c < metrics::status_code_count; ++c) requests += t.delta(from, to, row, metrics::totals_codes + c);
    uint64_t e4 = 0, e5 = 0;
    uint64_t codes[metrics::status_code_count];
    for (size_t c = 0; c < metrics::status_code_count; ++c) codes[c] = t.delta(from, to, row, metrics::totals_codes + c);
    error_classes(codes, e4, e5);
    r.requests_s = static_cast<double>(requests) / dt_s;
    r.errors_4xx_s = static_cast<double>(e4) / dt_s;
    r.errors_5xx_s = static_cast<double>(e5) / dt_s;
    r.tokens_in_s = t.rate(from, to, row, metrics::totals_tokens);
    r.tokens_out_s = t.rate(from, to, row, metrics::totals_tokens + 1);
  }
  auto ms = [](double us) { return us < 0 ? -1.0 : us / 1000.0; };
  r.ttft_p50_ms = ms(t.quantile_us(from, to, row, metrics::totals_ttft, 0.5));
  r.ttft_p99_ms = ms(t.quantile_us(from, to, row, metrics::totals_ttft, 0.99));
  r.duration_p50_ms = ms(t.quantile_us(from, to, row, metrics::totals_duration, 0.5));
  r.duration_p99_ms = ms(t.quantile_us(from, to, row, metrics::totals_duration, 0.99));
  if (!steps) return;
  r.steps.resize(t.size() > 0 ? t.size() - 1 : 0);
  for (size_t i = 1; i < t.size(); ++i) fill_traffic(r.steps[i - 1], row, i - 1, i, false);
}

status_view status_sampler::view(const config::config& cfg, const health_checker* h, const budget_keeper* b,
                                 uint64_t now_ms, int64_t unix_ms) const {
  status_view v;
  v.unix_ms = unix_ms;
  v.uptime_s = (now_ms - _started_ms) / 1000;
  v.step_ms = k_step_ms;
  v.window_ms = k_window_ms;
  v.inflight = _g.metrics().inflight();
  _g.metrics().dialect_requests(v.dialects);
  const size_t n = _traffic.size();
  const size_t to = n == 0 ? 0 : n - 1;
  const size_t from = _traffic.window_start(k_window_ms);
  for (size_t i = 1; i < n; ++i) v.step_ms_ago.push_back(static_cast<int64_t>(_traffic.time_ms(to) - _traffic.time_ms(i)));
  fill_traffic(v.overall, 0, from, to, true);
  for (size_t gi = 0; gi < cfg.groups.size() && gi < _g.metrics().group_capacity(); ++gi) {
    if (cfg.groups[gi].removed) continue;
    traffic_row& r = v.groups.emplace_back();
    fill_traffic(r, 1 + gi, from, to, true);
    r.name = cfg.groups[gi].name;
  }
  if (h != nullptr) {
    std::vector<health_checker::backend_view> rows;
    h->status_rows(rows);
    const size_t bn = _backends.size();
    const size_t bfrom = _backends.window_start(k_window_ms);
    for (const health_checker::backend_view& hv : rows) {
      backend_row& r = v.backends.emplace_back();
      r.url = hv.url;
      r.state = hv.state;
      r.probation = hv.probation;
      r.waiting = hv.waiting;
      r.running = hv.running;
      r.kv_cache = hv.kv_cache;
      r.last_change = hv.last_change;
      r.last_change_unix_ms = hv.last_change_unix_ms;
      uint64_t failures_now = 0;
      _g.metrics().backend_load(hv.backend, r.inflight, failures_now);
      if (bn == 0 || hv.backend >= _backends.rows()) continue;
      r.answers = _backends.at(bn - 1, hv.backend)[0];
      r.errors_5xx = _backends.at(bn - 1, hv.backend)[1];
      r.failures = _backends.at(bn - 1, hv.backend)[2];
      r.requests_s = _backends.rate(bfrom, bn - 1, hv.backend, 0);
      r.errors_5xx_s = _backends.rate(bfrom, bn - 1, hv.backend, 1);
      r.failures_s = _backends.rate(bfrom, bn - 1, hv.backend, 2);
    }
  }
  // A reload that gives a key new limits makes a new row under the same id
  // and retires the old one: the id's usage is every row's.
  std::unordered_map<std::string_view, std::vector<uint32_t>> retired;
  for (uint32_t k = 0; k < cfg.keys.size(); ++k) {
    if (cfg.keys[k].removed) retired[cfg.keys[k].id].push_back(k);
  }
  const size_t kn = _keys.size();
  const size_t kfrom = _keys.window_start(k_window_ms);
  for (uint32_t k = 0; k < cfg.keys.size(); ++k) {
    const config::key_config& kc = cfg.keys[k];
    if (kc.removed) continue;
    key_row& r = v.keys.emplace_back();
    r.id = kc.id;
    r.tokens_per_minute = kc.tokens_per_minute;
    r.requests_per_minute = kc.requests_per_minute;
    r.max_concurrent = kc.max_concurrent;
    auto level = [&](uint64_t limit, int which) -> int64_t {
      if (limit == 0) return -1;
      const int64_t l = _g.quota_level(k, which);
      return l < 0 ? 0 : static_cast<uint64_t>(l) > limit ? static_cast<int64_t>(limit) : l;
    };
    auto add_usage = [&](uint32_t row) {
      if (kn == 0 || row >= _keys.rows() - 1) return;
      const uint64_t* u = _keys.at(kn - 1, row);
      r.requests += u[0];
      r.tokens_in += u[1];
      r.tokens_out += u[2];
      r.queued += u[3];
      r.queued_ms += u[4];
      r.requests_s += _keys.rate(kfrom, kn - 1, row, 0);
      r.tokens_s += _keys.rate(kfrom, kn - 1, row, 1) + _keys.rate(kfrom, kn - 1, row, 2);
    };
    add_usage(k);
    if (auto it = retired.find(kc.id); it != retired.end()) {
      for (uint32_t row : it->second) add_usage(row);
    }
    r.queued_ms_mean = r.queued != 0 ? static_cast<double>(r.queued_ms) / static_cast<double>(r.queued) : 0;
    r.weight = kc.weight;
    r.priority = kc.priority;
    r.tokens_remaining = level(kc.tokens_per_minute, 0);
    r.requests_remaining = level(kc.requests_per_minute, 1);
    const quota::budget_limits limits = quota::limits_of(kc);
    r.daily_tokens_limit = limits[static_cast<size_t>(quota::budget_kind::daily_tokens)];
    r.monthly_tokens_limit = limits[static_cast<size_t>(quota::budget_kind::monthly_tokens)];
    if (b != nullptr) {
      const quota::budget_usage u = b->key_usage(kc.id, unix_ms);
      r.daily_tokens_used = u.used[static_cast<size_t>(quota::budget_kind::daily_tokens)];
      r.monthly_tokens_used = u.used[static_cast<size_t>(quota::budget_kind::monthly_tokens)];
    }
  }
  const size_t sn = _shards.size();
  for (size_t s = 0; s < _shards.rows() && sn > 0; ++s) {
    shard_row& r = v.shards.emplace_back();
    const uint64_t* p = _shards.at(sn - 1, s);
    r.loop_iterations = p[0];
    r.cqes = p[1];
    r.polls_caught = p[2];
    r.polls_missed = p[3];
    r.connections_open = p[5];
    r.memory_bytes = p[6];
    r.loop_iterations_s = sn > 1 ? _shards.rate(sn - 2, sn - 1, s, 0) : 0;
  }
  return v;
}

// ---- JSON ----

namespace {

void put_number(std::string& out, double v) {
  if (v < 0) {
    out += "null";
    return;
  }
  fmt::format_to(std::back_inserter(out), "{:.3f}", v);
}

// A traffic row's fields, without the braces around them.
void put_traffic(std::string& out, const traffic_row& r) {
  auto it = std::back_inserter(out);
  out += "\"requests_s\":";
  put_number(out, r.requests_s);
  out += ",\"tokens_in_s\":";
  put_number(out, r.tokens_in_s);
  out += ",\"tokens_out_s\":";
  put_number(out, r.tokens_out_s);
  out += ",\"errors_4xx_s\":";
  put_number(out, r.errors_4xx_s);
  out += ",\"errors_5xx_s\":";
  put_number(out, r.errors_5xx_s);
  out += ",\"ttft_p50_ms\":";
  put_number(out, r.ttft_p50_ms);
  out += ",\"ttft_p99_ms\":";
  put_number(out, r.ttft_p99_ms);
  out += ",\"duration_p50_ms\":";
  put_number(out, r.duration_p50_ms);
  out += ",\"duration_p99_ms\":";
  put_number(out, r.duration_p99_ms);
  fmt::format_to(it, ",\"totals\":{{\"requests\":{},\"tokens_in\":{},\"tokens_out\":{},\"errors_4xx\":{},\"errors_5xx\":{},"
                 "\"by_code\":{{", r.requests, r.tokens_in, r.tokens_out, r.errors_4xx, r.errors_5xx);
  bool first = true;
  for (size_t c = 0; c < metrics::status_code_count; ++c) {
    if (r.by_code[c] == 0) continue;
    if (!first) out += ',';
    first = false;
    if (c + 1 < metrics::status_code_count) {
      fmt::format_to(it, "\"{}\":{}", metrics::status_codes[c], r.by_code[c]);
    } else {
      fmt::format_to(it, "\"other\":{}", r.by_code[c]);
    }
  }
  out += "}}";
}

// The steps as one array per field: {"requests_s":[...], ...}.
void put_steps(std::string& out, const traffic_row& r) {
  struct field {
    const char* name;
    double traffic_row::*at;
  };
  static constexpr field k_fields[] = {
      {"requests_s", &traffic_row::requests_s},         {"tokens_in_s", &traffic_row::tokens_in_s},
      {"tokens_out_s", &traffic_row::tokens_out_s},     {"errors_4xx_s", &traffic_row::errors_4xx_s},
      {"errors_5xx_s", &traffic_row::errors_5xx_s},     {"ttft_p50_ms", &traffic_row::ttft_p50_ms},
      {"ttft_p99_ms", &traffic_row::ttft_p99_ms},       {"duration_p50_ms", &traffic_row::duration_p50_ms},
      {"duration_p99_ms", &traffic_row::duration_p99_ms}};
  out += '{';
  for (size_t f = 0; f < std::size(k_fields); ++f) {
    if (f != 0) out += ',';
    fmt::format_to(std::back_inserter(out), "\"{}\":[", k_fields[f].name);
    for (size_t i = 0; i < r.steps.size(); ++i) {
      if (i != 0) out += ',';
      put_number(out, r.steps[i].*k_fields[f].at);
    }
    out += ']';
  }
  out += '}';
}

}  // namespace

void render_status_json(const status_view& v, std::string& out) {
  auto it = std::back_inserter(out);
  fmt::format_to(it, "{{\"object\":\"status\",\"unix_ms\":{},\"uptime_s\":{},\"step_ms\":{},\"window_ms\":{},\"inflight\":{},"
                 "\"overall\":",
                 v.unix_ms, v.uptime_s, v.step_ms, v.window_ms, v.inflight);
  out += '{';
  put_traffic(out, v.overall);
  out += "},\"dialects\":{";
  for (size_t d = 0; d < metrics::dialect_count; ++d) {
    fmt::format_to(it, "{}\"{}\":{}", d == 0 ? "" : ",", metrics::dialect_names[d], v.dialects[d]);
  }
  out += "},\"groups\":[";
  for (size_t i = 0; i < v.groups.size(); ++i) {
    if (i != 0) out += ',';
    out += "{\"name\":";
    put_json_string(out, v.groups[i].name);
    out += ',';
    put_traffic(out, v.groups[i]);
    out += '}';
  }
  out += "],\"series\":{\"ms_ago\":[";
  for (size_t i = 0; i < v.step_ms_ago.size(); ++i) fmt::format_to(it, "{}{}", i == 0 ? "" : ",", v.step_ms_ago[i]);
  out += "],\"overall\":";
  put_steps(out, v.overall);
  out += ",\"groups\":{";
  for (size_t i = 0; i < v.groups.size(); ++i) {
    if (i != 0) out += ',';
    put_json_string(out, v.groups[i].name);
    out += ':';
    put_steps(out, v.groups[i]);
  }
  out += "}},\"backends\":[";
  for (size_t i = 0; i < v.backends.size(); ++i) {
    const backend_row& b = v.backends[i];
    if (i != 0) out += ',';
    out += "{\"url\":";
    put_json_string(out, b.url);
    out += ",\"state\":";
    put_json_string(out, b.state);
    fmt::format_to(it, ",\"probation\":{},\"inflight\":{},\"answers\":{},\"errors_5xx\":{},\"failures\":{},\"requests_s\":",
                   b.probation, b.inflight, b.answers, b.errors_5xx, b.failures);
    put_number(out, b.requests_s);
    out += ",\"errors_5xx_s\":";
    put_number(out, b.errors_5xx_s);
    out += ",\"failures_s\":";
    put_number(out, b.failures_s);
    out += ",\"waiting\":";
    put_number(out, b.waiting);
    out += ",\"running\":";
    put_number(out, b.running);
    out += ",\"kv_cache_usage\":";
    put_number(out, b.kv_cache);
    out += ",\"last_change\":";
    put_json_string(out, b.last_change);
    fmt::format_to(it, ",\"last_change_unix_ms\":{}}}", b.last_change_unix_ms);
  }
  out += "],\"keys\":[";
  for (size_t i = 0; i < v.keys.size(); ++i) {
    const key_row& k = v.keys[i];
    if (i != 0) out += ',';
    out += "{\"id\":";
    put_json_string(out, k.id);
    fmt::format_to(it, ",\"tokens_per_minute\":{},\"requests_per_minute\":{},\"max_concurrent\":{},\"tokens_remaining\":",
                   k.tokens_per_minute, k.requests_per_minute, k.max_concurrent);
    put_number(out, static_cast<double>(k.tokens_remaining));
    out += ",\"requests_remaining\":";
    put_number(out, static_cast<double>(k.requests_remaining));
    fmt::format_to(it, ",\"daily_tokens_used\":{},\"monthly_tokens_used\":{},\"daily_tokens_limit\":{},"
                   "\"monthly_tokens_limit\":{},\"requests\":{},\"tokens_in\":{},\"tokens_out\":{},\"requests_s\":",
                   k.daily_tokens_used, k.monthly_tokens_used, k.daily_tokens_limit, k.monthly_tokens_limit, k.requests,
                   k.tokens_in, k.tokens_out);
    put_number(out, k.requests_s);
    out += ",\"tokens_s\":";
    put_number(out, k.tokens_s);
    fmt::format_to(it, ",\"queued\":{},\"queued_ms\":{},\"queued_ms_mean\":", k.queued, k.queued_ms);
    put_number(out, k.queued_ms_mean);
    out += ",\"weight\":";
    put_number(out, k.weight);
    fmt::format_to(it, ",\"priority\":{}}}", k.priority);
  }
  out += "],\"shards\":[";
  for (size_t i = 0; i < v.shards.size(); ++i) {
    const shard_row& s = v.shards[i];
    if (i != 0) out += ',';
    fmt::format_to(it, "{{\"shard\":{},\"loop_iterations\":{},\"loop_iterations_s\":", i, s.loop_iterations);
    put_number(out, s.loop_iterations_s);
    fmt::format_to(it, ",\"cqes\":{},\"polls_caught\":{},\"polls_missed\":{},\"connections_open\":{},\"memory_bytes\":{}}}",
                   s.cqes, s.polls_caught, s.polls_missed, s.connections_open, s.memory_bytes);
  }
  out += "]}\n";
}

}  // namespace sluice::control
