#pragma once
// exchange (private): the deadlines an exchange waits under, as its codec
// arms them (client_codec::wait_for_backend, stream_wait) and its adapter
// names them.
#include <cstdint>

namespace sluice::proxy {

enum class deadline_kind : uint8_t {
  none,
  header,          // 408: the head did not arrive in header_timeout_ms (total)
  body,            // 408: the body is too slow
  idle,            // keep-alive idle: close quietly
  upstream_connect,
  upstream_first_byte,
  upstream_idle,   // stream idle: no byte from the backend for stream_idle_timeout_ms
  send,            // the client takes no bytes: close
  linger,          // after an error answer that closes: stop reading what the client still sends
};

// When a deadline of kind `k`, `ms` from `now_ms`, falls due. Returns: 0
// for none (kind none, or ms 0 outside an upstream wait). An upstream wait
// never runs past the exchange's total deadline (upstream.total_timeout_ms;
// 0 = none), and with ms 0 it is that total deadline.
inline uint64_t deadline_at(deadline_kind k, uint64_t now_ms, uint64_t ms, uint64_t total_deadline_ms) noexcept {
  uint64_t at = k == deadline_kind::none || ms == 0 ? 0 : now_ms + ms;
  const bool upstream_wait = k == deadline_kind::upstream_connect || k == deadline_kind::upstream_first_byte ||
                             k == deadline_kind::upstream_idle;
  if (upstream_wait && total_deadline_ms != 0 && (at == 0 || at > total_deadline_ms)) at = total_deadline_ms;
  return at;
}

}  // namespace sluice::proxy
