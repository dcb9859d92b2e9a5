#pragma once
// control: backend health on the control thread. Active probes (over a
// fresh connection every interval: GET /health for http:// backends, gRPC
// ServerReady + ModelReady for grpc:// ones) and the shards'
// passive reports (connect failures, 5xx) feed one route::backend_health per
// backend; every change becomes a ring-rebalancing message to all shards.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/control/gateway.hpp"
#include "sluice/route/health.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::control {

// Control-thread-local. One per process; lives as long as the gateway.
class health_checker {
 public:
  health_checker(shard::reactor& r, gateway& g, std::shared_ptr<const config::config> cfg);
  ~health_checker();
  health_checker(const health_checker&) = delete;
  health_checker& operator=(const health_checker&) = delete;

  // Call once per control loop iteration.
  void on_iteration(uint64_t now_ms) noexcept;
  void stop() noexcept { _stopping = true; }
  // SIGHUP, after gateway::reload(next): probes for new backends, new
  // parameters for the others; removed backends are no longer probed.
  void reload(std::shared_ptr<const config::config> next);

  // Operator drain (admin POST /backends/drain): a draining backend takes no
  // new requests, so no new sessions; requests in flight finish. Survives
  // reloads. Returns: false when `url` names no backend of the config.
  bool set_draining(std::string_view url, bool draining) noexcept;

  // Admin GET /backends and /metrics: one JSON object per backend, and the
  // sluice_backend_draining gauge.
  void describe_json(std::string& out) const;
  void render_metrics(std::string& out) const;

  // The status page's view of one live backend (admin GET /, /status.json).
  // Views point into the checker: valid until its next reload.
  struct backend_view {
    uint32_t backend = 0;
    std::string_view url;
    std::string_view state;  // "up", "down", "ejected" or "draining"
    bool probation = false;
    // vLLM's gauges as of the last /metrics scrape; -1: not known.
    double waiting = -1, running = -1, kv_cache = -1;
    // The last health change and when (wall clock); "" / 0: none yet.
    std::string_view last_change;
    int64_t last_change_unix_ms = 0;
  };
  void status_rows(std::vector<backend_view>& out) const;

  struct probe;

 private:
  void add_probe(uint32_t backend);
  void start_probe(probe& p, uint64_t now_ms) noexcept;
  void finish_probe(probe& p, bool ok, uint64_t now_ms) noexcept;
  // The last operation is back: close the socket, free a gRPC session.
  void close_probe(probe& p) noexcept;
  // A grpc:// backend's probe, one completed connect/send/recv at a time.
  void on_grpc_step(probe& p, int res, uint64_t now_ms) noexcept;
  void apply(uint32_t backend, route::health_event e) noexcept;
  // Whether ejecting `backend` keeps every group it serves within its
  // max_ejection_percent.
  bool may_eject(uint32_t backend) const noexcept;
  void judge_server_errors(probe& p, uint64_t now_ms) noexcept;
  static void on_cqe(shard::completion* c, const io_uring_cqe* cqe);

  shard::reactor& _r;
  gateway& _g;
  std::shared_ptr<const config::config> _cfg;
  std::vector<std::unique_ptr<probe>> _probes;  // by backend
  bool _stopping = false;
};

}  // namespace sluice::control
