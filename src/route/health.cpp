// The backend health state machine (see health.hpp for the diagram).
#include "sluice/route/health.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

namespace sluice::route {

double prometheus_gauge_sum(std::string_view body, std::string_view name) noexcept {
  double total = -1;
  size_t at = 0;
  while (!name.empty() && (at = body.find(name, at)) != std::string_view::npos) {
    const bool line_start = at == 0 || body[at - 1] == '\n';
    at += name.size();
    if (!line_start || at >= body.size() || (body[at] != '{' && body[at] != ' ')) continue;
    const size_t eol = body.find('\n', at);
    const std::string_view line = body.substr(at, eol == std::string_view::npos ? body.size() - at : eol - at);
    const size_t space = line.rfind(' ');
    if (space == std::string_view::npos) continue;
    double v = 0;
    const std::string_view num = line.substr(space + 1);
    if (std::from_chars(num.data(), num.data() + num.size(), v).ec != std::errc{} || !(v >= 0)) continue;
    total = (total < 0 ? 0 : total) + v;
  }
  return total;
}

// Sums vllm:num_requests_waiting over its label sets in a Prometheus text
// body, whole requests. Returns: -1 when the body has no such sample.
int64_t vllm_waiting_requests(std::string_view body) noexcept {
  const double v = prometheus_gauge_sum(body, "vllm:num_requests_waiting");
  return v < 0 ? -1 : v > 9.0e18 ? INT64_MAX : static_cast<int64_t>(v);
}

health_event backend_health::eject(uint64_t now_ms) noexcept {
  // A backend that fails again right after re-admission waits longer each
  // time, so a flapping backend costs a few requests per backoff, not many.
  if (_probation) _backoff_ms = std::min<uint64_t>(uint64_t{_backoff_ms} * 2, _params.backoff_max_ms);
  _state = health_state::ejected;
  _probation = false;
  _request_failures = 0;
  _probe_successes = 0;
  _ejected_until_ms = now_ms + _backoff_ms;
  return health_event::ejected;
}

health_event backend_health::on_probe(bool ok, uint64_t now_ms) noexcept {
  if (ok) {
    _probe_failures = 0;
    ++_probe_successes;
  } else {
    _probe_successes = 0;
    ++_probe_failures;
  }
  switch (_state) {
    case health_state::up:
      if (!ok && _probe_failures >= _params.fall) {
        _state = health_state::down;
        _probation = false;
        return health_event::became_down;
      }
      return health_event::none;
    case health_state::down:
      if (ok && _probe_successes >= _params.rise) {
        _state = health_state::up;
        _request_failures = 0;
        return health_event::became_up;
      }
      return health_event::none;
    case health_state::ejected:
      if (ok && now_ms >= _ejected_until_ms) {
        _state = health_state::up;
        _probation = true;
        _request_failures = 0;
        return health_event::readmitted;
      }
      return health_event::none;
  }
  return health_event::none;
}

health_event backend_health::on_request(bool failure, uint64_t now_ms, bool may_eject) noexcept {
  if (_state != health_state::up) return health_event::none;  // late answers of an old state
  if (!failure) {
    _request_failures = 0;
    if (_probation) {
      _probation = false;
      _backoff_ms = _params.backoff_ms;
    }
    return health_event::none;
  }
  ++_request_failures;
  // Over the group's max_ejection_percent the count stays where it is: the
  // next failure asks again, once another backend may have come back.
  if (!may_eject) return health_event::none;
  if (_probation) return eject(now_ms);
  if (_params.eject_after != 0 && _request_failures >= _params.eject_after) return eject(now_ms);
  return health_event::none;
}

health_event backend_health::tick(uint64_t now_ms) noexcept {
  if (_params.interval_ms != 0) return health_event::none;  // probes decide
  if (_state == health_state::ejected && now_ms >= _ejected_until_ms) {
    _state = health_state::up;
    _probation = true;
    return health_event::readmitted;
  }
  return health_event::none;
}

}  // namespace sluice::route
