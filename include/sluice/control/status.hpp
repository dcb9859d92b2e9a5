#pragma once
// control: the operator's status page (admin GET / and GET /status.json).
//
// The sampler runs on the control thread's loop: every k_step_ms it copies
// the counters the metrics registry already sums over the shards (answers
// by group and status code, tokens, TTFT and duration histograms, backend
// answers, shard loop counters) into fixed-size rings (metrics::series_ring:
// k_points points, ~10 minutes; nothing grows). A request for the page
// builds a status_view from the rings, the health checker and the budget
// keeper, and renders it as JSON or as HTML whose tables need no
// JavaScript. The shards do nothing new: they count what they counted.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/metrics/series.hpp"

namespace sluice::control {

class gateway;
class health_checker;
class budget_keeper;

// Appends `s` with & < > " ' as character references: safe as HTML text
// and inside a quoted attribute value.
void put_html_escaped(std::string& out, std::string_view s);
// Appends `s` as a JSON string with its quotes (control bytes as \u00XX,
// invalid UTF-8 replaced, and < > & as \u003c \u003e \u0026 so the text
// may also sit inside an HTML <script>).
void put_json_string(std::string& out, std::string_view s);
// Appends `s` percent-encoded for a query value (unreserved bytes as they
// are, everything else %XX).
void put_query_escaped(std::string& out, std::string_view s);

// Rates are per second over the view's window; latencies are ms, -1 when
// nothing was observed in it; totals count since the start.
struct traffic_row {
  std::string name;  // the group's name; "" for the whole gateway
  double requests_s = 0, tokens_in_s = 0, tokens_out_s = 0, errors_4xx_s = 0, errors_5xx_s = 0;
  double ttft_p50_ms = -1, ttft_p99_ms = -1, duration_p50_ms = -1, duration_p99_ms = -1;
  uint64_t requests = 0, tokens_in = 0, tokens_out = 0, errors_4xx = 0, errors_5xx = 0;
  uint64_t by_code[metrics::status_code_count] = {};
  // One value per step of the ring, oldest first (JSON only).
  std::vector<traffic_row> steps;
};

struct backend_row {
  std::string url;
  std::string state;  // up | down | ejected | draining
  bool probation = false;
  double requests_s = 0, errors_5xx_s = 0, failures_s = 0;
  uint64_t answers = 0, errors_5xx = 0;
  uint64_t inflight = 0;  // sluice's own requests open to it now
  uint64_t failures = 0;  // connect errors, resets, timeouts, unreadable replies
  double waiting = -1, running = -1, kv_cache = -1;  // vLLM's /metrics; -1 unknown
  std::string last_change;
  int64_t last_change_unix_ms = 0;
};

struct key_row {
  std::string id;  // the key's id, never its secret
  uint64_t tokens_per_minute = 0, requests_per_minute = 0, max_concurrent = 0;
  int64_t tokens_remaining = -1, requests_remaining = -1;  // -1: no such limit
  uint64_t daily_tokens_used = 0, monthly_tokens_used = 0;
  uint64_t daily_tokens_limit = 0, monthly_tokens_limit = 0;  // 0: none
  uint64_t requests = 0, tokens_in = 0, tokens_out = 0;  // since the start
  double requests_s = 0, tokens_s = 0;                    // over the window, in + out
  // Fair admission (since the start): requests that waited for a slot, and
  // their mean wait; the key's share and level.
  uint64_t queued = 0, queued_ms = 0;
  double queued_ms_mean = 0;
  double weight = 1;
  uint32_t priority = 0;
};

struct shard_row {
  uint64_t loop_iterations = 0, cqes = 0, polls_caught = 0, polls_missed = 0;
  double loop_iterations_s = 0;
  uint64_t connections_open = 0, memory_bytes = 0;
};

struct status_view {
  int64_t unix_ms = 0;
  uint64_t uptime_s = 0;
  uint64_t step_ms = 0, window_ms = 0;
  uint64_t inflight = 0;              // requests in flight now, every shard
  std::vector<int64_t> step_ms_ago;  // the steps' ends, ms before the newest sample
  traffic_row overall;
  std::vector<traffic_row> groups;
  std::vector<backend_row> backends;
  std::vector<key_row> keys;
  std::vector<shard_row> shards;
  // Answered requests by the client's dialect (metrics::dialect_names).
  uint64_t dialects[metrics::dialect_count] = {};
};

void render_status_json(const status_view& v, std::string& out);
// The page: the view's tables rendered here (they read without JS), and a
// script that polls /status.json, redraws them and draws the charts.
// `with_data` false: the admin token was not given; the tables are empty
// and the page asks for it.
void render_status_page(const status_view& v, bool with_data, std::string& out);

// Control-thread-local. One per process; lives as long as the gateway.
class status_sampler {
 public:
  static constexpr uint64_t k_step_ms = 2000;
  static constexpr size_t k_points = 301;  // 10 minutes of steps
  static constexpr uint64_t k_window_ms = 60'000;

  explicit status_sampler(const gateway& g);

  // Each control loop turn: a sample when k_step_ms passed since the last.
  void on_iteration(uint64_t now_ms) noexcept;
  // Takes one now (the first is taken at the first turn).
  void sample(uint64_t now_ms) noexcept;

  status_view view(const config::config& cfg, const health_checker* h, const budget_keeper* b, uint64_t now_ms,
                   int64_t unix_ms) const;

 private:
  void fill_traffic(traffic_row& r, size_t row, size_t from, size_t to, bool steps) const;

  const gateway& _g;
  uint64_t _started_ms = 0;
  uint64_t _last_ms = 0;
  bool _sampled = false;
  // Rows: 0 the gateway, 1 + g group g (room for reloads), then the
  // no-group row; metrics::totals_* layout.
  metrics::series_ring _traffic;
  // Rows by backend: answers, 5xx answers, failures.
  metrics::series_ring _backends;
  // Rows by key row (room for reloads, then `none`): requests, prompt and
  // completion tokens; only as many points as the window needs.
  metrics::series_ring _keys;
  // Rows by shard: metrics::registry::shard_loop's five, connections open,
  // connection memory.
  metrics::series_ring _shards;
};

}  // namespace sluice::control
