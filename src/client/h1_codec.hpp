#pragma once
// client (private): the HTTP/1.1 client codec, a protocol on the client
// transport (conn_protocol; transport.hpp). Parses the head and the body,
// writes the answers sluice makes itself and the relayed response's head,
// keep-alive, pipelining, and the request's deadlines (h1_codec.cpp: input,
// deadlines, the request's life; h1_send.cpp: answers, the relayed
// response, its sends). The socket, TLS, the send's completion and the
// close are the transport's; what a request means is the policy's
// (exchange_policy); the backend side is the adapter's (backend_adapter).
#include <cstdint>
#include <memory>
#include <string_view>

#include "client_codec.hpp"
#include "downstream_conn.hpp"
#include "shard_context.hpp"
#include "transport.hpp"

namespace sluice::proxy {

class exchange_policy;

// Shard-local; a part of the shard's server.
class h1_codec final : public client_codec, public conn_protocol {
 public:
  h1_codec(shard_context& s, exchange_policy& x, conn_transport& t) noexcept;
  h1_codec(const h1_codec&) = delete;
  h1_codec& operator=(const h1_codec&) = delete;
  uint64_t now_ms() const noexcept { return _s.now_ms(); }

  // --- conn_protocol: as the transport drives a connection that speaks it ---
  bool adopt(downstream_conn* d, std::string_view first) noexcept override;
  void on_bytes(downstream_conn* d, std::string_view bytes) noexcept override;
  void on_progress(downstream_conn* d, size_t bytes) noexcept override;
  void on_sent(downstream_conn* d, int res) noexcept override;
  // The client closed or reset its connection: an exchange in flight is
  // cancelled (audited 499, client_closed), then the connection closes.
  void on_peer_gone(downstream_conn* d) noexcept override;
  void on_deadline(downstream_conn* d, deadline_kind k) noexcept override;
  void on_close(downstream_conn* d) noexcept override;
  void on_free(downstream_conn* d) noexcept override;
  // Idle keep-alive connections close (in a handover after a grace:
  // k_handover_idle_grace_ms, so a keep-alive client between two requests
  // gets its next answer, with `connection: close`, instead of a close
  // racing its request); busy ones after their response.
  void drain(downstream_conn* d) noexcept override;
  void cut(downstream_conn* d) noexcept override;

  // --- client_codec ---
  std::string_view request_body(const exchange& x) const noexcept override;
  std::string_view peer_ip(const exchange& x) const noexcept override;
  void wait_for_quota(exchange& x) noexcept override;
  void wait_for_backend(exchange& x, deadline_kind k, uint64_t ms) noexcept override;
  void answer(exchange& x, uint16_t status, std::string_view body, bool close, std::string_view extra_headers,
              std::string_view error_code) noexcept override;
  void fail(exchange& x) noexcept override;
  void lend_request_bytes(exchange& x) noexcept override;
  bool return_request_bytes(exchange& x) noexcept override;
  void request_bytes_free(exchange& x) noexcept override;
  bool takes_chunked(const exchange& x) const noexcept override;
  bool stage_response_head(exchange& x, const http::response_head& rh, bool dechunked) noexcept override;
  void stream_wait(exchange& x, uint64_t idle_ms) noexcept override;
  void send_response(exchange& x, bool with_head, const iovec* body, uint8_t n, buffer_lender* lender,
                     uint8_t chunked) noexcept override;
  void response_done(exchange& x) noexcept override;

 private:
  // A deadline `ms` from now, within the exchange's total deadline.
  void set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept;
  void on_response_sent(downstream_conn* d) noexcept;
  // The send that read a lender's buffer completed (or failed): it is its
  // lender's again; so is a held send's, once the connection closes.
  void give_back_lent_buffer(downstream_conn* d) noexcept;
  // A rendered Messages stream's ping (stream_pings), sent while
  // no send is in flight; what the adapter sends or ends meanwhile is held
  // (downstream_conn::held) and goes on at its completion (resume_held).
  void send_ping(downstream_conn* d) noexcept;
  void resume_held(downstream_conn* d) noexcept;
  void drop_held(downstream_conn* d) noexcept;
  void process_input(downstream_conn* d) noexcept;
  void start_request(downstream_conn* d) noexcept;
  void next_request(downstream_conn* d) noexcept;
  void compact_input(downstream_conn* d) noexcept;
  // The next request's exchange, made fresh in place. Only between
  // exchanges: nothing accounted, no attempt, no lent bytes, not parked.
  void reset_exchange(downstream_conn* d) noexcept;
  // The exchange's sides: this codec, the connection, the adapter.
  void bind_exchange(downstream_conn* d) noexcept;

  shard_context& _s;
  exchange_policy& _x;
  conn_transport& _t;
  // Aliases of the context's members, by the names the code reads.
  std::shared_ptr<const config::config>& _cfg = _s.cfg;
  metrics::shard_metrics& _metrics = _s.metrics;
  const bool& _draining = _s.draining;
};

}  // namespace sluice::proxy
