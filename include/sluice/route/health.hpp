#pragma once
// route: one backend's health as pure logic. The control thread owns one per
// backend, feeds it probe results and request outcomes with the time as a
// parameter, and turns every returned event into a route::message for all
// shards. No sockets, no clock reads.
//
//   up --(fall probe failures)--> down --(rise probe successes)--> up
//   up --(eject_after request failures in a row)--> ejected
//   ejected --(backoff elapsed, then a probe success; or, with active probes
//              off, tick() after the backoff)--> up, on probation
//   on probation: one request failure ejects again with the backoff doubled
//              (up to backoff_max_ms); one success ends probation and resets
//              the backoff.
// Draining is orthogonal: a draining backend keeps its in-flight requests
// and takes no new ones (hash routing cannot tell a new session from an old
// one, so "no new sessions" means no new requests).
#include <cstdint>
#include <string_view>

#include "sluice/config/config.hpp"

namespace sluice::route {

enum class health_state : uint8_t { up, down, ejected };

// vLLM's queue length from its Prometheus /metrics body: the sum of
// `vllm:num_requests_waiting` over its label sets. Returns: -1 when the
// body has no such sample.
int64_t vllm_waiting_requests(std::string_view body) noexcept;
// The sum of gauge `name` over its label sets in a Prometheus text body
// (vllm:num_requests_running, vllm:kv_cache_usage_perc for the status
// page). Returns: -1 when the body has no such sample.
double prometheus_gauge_sum(std::string_view body, std::string_view name) noexcept;

// What the caller must tell the shards. `none`: nothing changed for routing.
enum class health_event : uint8_t { none, became_up, became_down, ejected, readmitted };

// Control thread; one per backend, for the life of the process (a reload
// keeps the states of backends it keeps).
class backend_health {
 public:
  explicit backend_health(const config::health_config& params) noexcept : _params(params), _backoff_ms(params.backoff_ms) {}

  health_state state() const noexcept { return _state; }
  bool draining() const noexcept { return _draining; }
  bool on_probation() const noexcept { return _probation; }
  // Whether shards may send it new requests.
  bool takes_requests() const noexcept { return _state == health_state::up && !_draining; }
  uint64_t ejected_until_ms() const noexcept { return _ejected_until_ms; }
  uint32_t backoff_ms() const noexcept { return _backoff_ms; }

  // An active GET /health result (a timeout is a failure).
  health_event on_probe(bool ok, uint64_t now_ms) noexcept;
  // A proxied request's outcome: failure = the backend unreachable or broken
  // (connect refused, reset, timeout, a malformed response); success = any
  // answer, 4xx and 5xx included (a rate of 5xx is judged apart:
  // health_checker). `may_eject`: false while ejecting it would exceed its
  // groups' max_ejection_percent.
  health_event on_request(bool failure, uint64_t now_ms, bool may_eject = true) noexcept;
  // A window in which nearly every answer was a 5xx (health_checker's
  // rate): ejected as a failure streak would, unless `may_eject` is false.
  health_event on_server_errors(uint64_t now_ms, bool may_eject) noexcept {
    if (_state != health_state::up || !may_eject) return health_event::none;
    return eject(now_ms);
  }
  // Periodic; re-admits an ejected backend when active probes are off.
  health_event tick(uint64_t now_ms) noexcept;
  void set_draining(bool draining) noexcept { _draining = draining; }
  void set_params(const config::health_config& params) noexcept { _params = params; }

 private:
  health_event eject(uint64_t now_ms) noexcept;

  config::health_config _params;
  health_state _state = health_state::up;  // serve at once; probes take it down
  bool _draining = false;
  bool _probation = false;
  uint32_t _probe_successes = 0;   // consecutive
  uint32_t _probe_failures = 0;    // consecutive
  uint32_t _request_failures = 0;  // consecutive
  uint32_t _backoff_ms;
  uint64_t _ejected_until_ms = 0;
};

}  // namespace sluice::route
