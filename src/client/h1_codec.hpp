#pragma once
// client (private): the HTTP/1.1 client codec. Owns the listener and the
// client connections (downstream_conn): accept, receive, parse the head and
// the body, answers sluice writes itself, send, keep-alive, pipelining,
// lingering close, and every connection's deadline (h1_codec.cpp: input,
// connection life, deadlines; h1_send.cpp: answers, the relayed response,
// sends). What a request means is the policy's (exchange_policy); the
// backend side is the adapter's (backend_adapter).
#include <cstdint>
#include <memory>
#include <string_view>

#include "client_codec.hpp"
#include "downstream_conn.hpp"
#include "shard_context.hpp"
#include "transport.hpp"
#include "sluice/net/buffer_ring.hpp"
#include "sluice/tls/tls.hpp"

namespace sluice::proxy {

class exchange_policy;

// Shard-local; a part of the shard's server.
class h1_codec final : public client_codec, public conn_transport {
 public:
  // `tls_listen_fd`: the TLS listener, or -1 (then set_tls_context is
  // never called).
  h1_codec(shard_context& s, exchange_policy& x, int listen_fd, int tls_listen_fd) noexcept;
  ~h1_codec() override;
  h1_codec(const h1_codec&) = delete;
  h1_codec& operator=(const h1_codec&) = delete;

  bool init() noexcept;
  // Once per loop turn: buffers published, accept re-armed, deadlines due.
  void on_iteration(uint64_t now_ms) noexcept;
  // Stops accepting; idle keep-alive connections close, busy ones after
  // their response. `handover` (SIGUSR2): the listening sockets are shared
  // with the process that took over, so they are not shut down (that would
  // reset what waits in their queues for it): the accepts are cancelled, a
  // connection accepted before the cancel completed is served, and each fd
  // is closed once its accept has ended. Idle connections get
  // k_handover_idle_grace_ms before they close: a keep-alive client between
  // two requests gets its next answer (with `connection: close`) instead of
  // a close racing its request.
  void begin_drain(bool handover = false) noexcept;
  // Returns: whether an accept is in flight (its completion may still bring
  // a connection).
  bool accepting() const noexcept { return _accept_armed || _tls_accept_armed; }
  static constexpr uint32_t k_handover_idle_grace_ms = 1000;
  // The drain's time is up: whatever is left is cut (audited cancelled).
  void cut_drain() noexcept;
  uint32_t connection_count() const noexcept { return _conn_count; }
  // The protocol a connection's HTTP/2 moves to (the preface, or ALPN h2).
  void set_h2(conn_protocol* c) noexcept { _h2 = c; }
  // The TLS listener's certificate and settings for new connections (start,
  // SIGHUP); connections made on the old one finish on it.
  void set_tls_context(std::shared_ptr<const tls::context> c) noexcept { _tls_ctx = std::move(c); }

  // --- conn_transport: as the protocol a connection switched to uses it ---
  void send_output(downstream_conn* d) noexcept override { submit_send(d); }
  void end_conn(downstream_conn* d, bool peer_gone) noexcept override;
  void after_call(downstream_conn* d) noexcept override { maybe_free(d); }
  void arm_conn_deadline(downstream_conn* d, bool sending, bool idle) noexcept override;
  uint64_t now_ms() const noexcept { return _s.now_ms(); }

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
  void set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept;
  void submit_send(downstream_conn* d) noexcept;
  void on_response_sent(downstream_conn* d) noexcept;
  void close_downstream(downstream_conn* d) noexcept;
  void maybe_free(downstream_conn* d) noexcept;
  // The send that read a lender's buffer completed (or failed): it is its
  // lender's again; so is a held send's, once the connection closes.
  void give_back_lent_buffer(downstream_conn* d) noexcept;
  // A rendered Messages stream's ping (stream_pings), sent while
  // no send is in flight; what the adapter sends or ends meanwhile is held
  // (downstream_conn::held) and goes on at its completion (resume_held).
  void send_ping(downstream_conn* d) noexcept;
  void resume_held(downstream_conn* d) noexcept;
  void drop_held(downstream_conn* d) noexcept;
  void submit_accept() noexcept;
  void submit_tls_accept() noexcept;
  // Handover: closes each listener fd whose accept has ended.
  void close_handed_over_listeners() noexcept;
  static void on_accept(shard::completion* c, const io_uring_cqe* cqe);
  static void on_tls_accept(shard::completion* c, const io_uring_cqe* cqe);
  void on_accept_cqe(const io_uring_cqe* cqe, bool tls_port) noexcept;
  void accept_connection(int fd, bool tls_port) noexcept;
  // The plaintext of a receive: parsed (HTTP/1.1), or fed to the session
  // (HTTP/2). Returns: false when the connection closed (or must).
  bool take_plaintext(downstream_conn* d, const char* src, size_t n) noexcept;
  // --- TLS (h1_tls.cpp) ---
  // Ciphertext from the client: the handshake, then the plaintext on.
  void tls_input(downstream_conn* d, const char* src, size_t n) noexcept;
  // A failed session: its alert, then the close.
  void fail_tls(downstream_conn* d) noexcept;
  // Encrypts what the send in progress still has, sends ciphertext, and
  // completes the send once it is all out.
  void tls_pump(downstream_conn* d) noexcept;
  void submit_tls_send(downstream_conn* d) noexcept;
  static void on_tls_send(shard::completion* c, const io_uring_cqe* cqe);
  void on_tls_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  // The send's work once it completed (res: bytes, or -errno).
  void send_done(downstream_conn* d, int res) noexcept;
  void submit_recv(downstream_conn* d) noexcept;
  static void on_recv(shard::completion* c, const io_uring_cqe* cqe);
  void on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  void process_input(downstream_conn* d) noexcept;
  void start_request(downstream_conn* d) noexcept;
  // The preface came: the connection moves to the HTTP/2 codec.
  void start_h2(downstream_conn* d) noexcept;
  static void on_send(shard::completion* c, const io_uring_cqe* cqe);
  void on_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  void next_request(downstream_conn* d) noexcept;
  // The client closed or reset its connection: an exchange in flight is
  // cancelled (audited 499, client_closed), then the connection closes.
  void client_gone(downstream_conn* d) noexcept;
  // After an error answer that closes: shut the write side, drop input.
  void linger(downstream_conn* d) noexcept;
  void compact_input(downstream_conn* d) noexcept;
  void on_deadline(downstream_conn* d) noexcept;
  // The next request's exchange, made fresh in place. Only between
  // exchanges: nothing accounted, no attempt, no lent bytes, not parked.
  void reset_exchange(downstream_conn* d) noexcept;
  // The exchange's sides: this codec, the connection, the adapter.
  void bind_exchange(downstream_conn* d) noexcept;

  shard_context& _s;
  exchange_policy& _x;
  // Aliases of the context's members, by the names the code reads.
  std::shared_ptr<const config::config>& _cfg = _s.cfg;
  shard::reactor& _r = _s.r;
  metrics::shard_metrics& _metrics = _s.metrics;
  shard::timer_wheel& _timers = _s.timers;
  const bool& _draining = _s.draining;

  conn_protocol* _h2 = nullptr;
  int _listen_fd;
  http::limits _limits;
  op<h1_codec> _accept_op;
  bool _accept_armed = false;
  int _tls_listen_fd = -1;
  op<h1_codec> _tls_accept_op;
  bool _tls_accept_armed = false;
  std::shared_ptr<const tls::context> _tls_ctx;
  bool _handover = false;  // the drain hands the listeners over (begin_drain)
  std::unique_ptr<net::buffer_ring> _bufs;  // downstream receives (multishot)
  downstream_conn* _conns = nullptr;         // every live downstream connection
  uint32_t _conn_count = 0;
};

}  // namespace sluice::proxy
