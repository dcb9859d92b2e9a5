#pragma once
// client (private): the client transport. Owns the listeners and every
// client connection (downstream_conn) from accept to free: TLS, the
// multishot receive, the send, the connection's deadline, lingering close,
// drain, and the sniffing of a connection's first bytes, which picks the
// protocol it speaks (transport.hpp): HTTP/2 for the client preface (or
// ALPN h2), else the first protocol (HTTP/1.1). What the bytes mean is the
// protocol's; nothing here knows HTTP/1.1 or HTTP/2 framing beyond the
// sniff. (client_transport.cpp: accept, receive, close, deadlines, drain;
// transport_tls.cpp: TLS; transport_send.cpp: the send.)
#include <cstdint>
#include <memory>
#include <span>

#include "downstream_conn.hpp"
#include "shard_context.hpp"
#include "transport.hpp"
#include "sluice/net/buffer_ring.hpp"
#include "sluice/tls/tls.hpp"

namespace sluice::proxy {

// Shard-local; a part of the shard's server.
class client_transport final : public conn_transport {
 public:
  // `tls_listen_fd`: the TLS listener, or -1 (then set_tls_context is
  // never called). Takes both fds.
  client_transport(shard_context& s, int listen_fd, int tls_listen_fd) noexcept;
  ~client_transport();
  client_transport(const client_transport&) = delete;
  client_transport& operator=(const client_transport&) = delete;

  // `first`: what a connection speaks unless its first bytes (or ALPN) say
  // HTTP/2; `h2`: HTTP/2, or null (then no connection speaks it). Before
  // init.
  void set_protocols(conn_protocol* first, conn_protocol* h2) noexcept {
    _first = first;
    _h2 = h2;
  }
  bool init() noexcept;
  // Once per loop turn: buffers published, accept re-armed, deadlines due.
  void on_iteration(uint64_t now_ms) noexcept;
  // Stops accepting; each connection's protocol drains it (idle keep-alive
  // connections close, busy ones after their response). `handover`
  // (SIGUSR2): the listening sockets are shared with the process that took
  // over, so they are not shut down (that would reset what waits in their
  // queues for it): the accepts are cancelled, a connection accepted before
  // the cancel completed is served, and each fd is closed once its accept
  // has ended.
  void begin_drain(bool handover = false) noexcept;
  // Returns: whether an accept is in flight (its completion may still bring
  // a connection).
  bool accepting() const noexcept { return _accept_armed || _tls_accept_armed; }
  // The drain's time is up: whatever is left is cut (audited cancelled).
  void cut_drain() noexcept;
  uint32_t connection_count() const noexcept { return _conn_count; }
  // The TLS listener's certificate and settings for new connections (start,
  // SIGHUP); connections made on the old one finish on it.
  void set_tls_context(std::shared_ptr<const tls::context> c) noexcept { _tls_ctx = std::move(c); }
  uint64_t now_ms() const noexcept { return _s.now_ms(); }

  // --- conn_transport ---
  void send_output(downstream_conn* d) noexcept override;
  void close_conn(downstream_conn* d) noexcept override;
  void end_conn(downstream_conn* d, bool peer_gone) noexcept override;
  void linger(downstream_conn* d) noexcept override;
  void after_call(downstream_conn* d) noexcept override { maybe_free(d); }
  void set_deadline(downstream_conn* d, deadline_kind k, uint64_t at_ms) noexcept override;
  void arm_conn_deadline(downstream_conn* d, bool sending, bool idle) noexcept override;
  void pause_receive(downstream_conn* d) noexcept override;
  void resume_receive(downstream_conn* d) noexcept override;
  bool handing_over() const noexcept override { return _handover; }

 private:
  // A deadline `ms` from now (0: none).
  void arm_in(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept;
  void maybe_free(downstream_conn* d) noexcept;
  void submit_accept() noexcept;
  void submit_tls_accept() noexcept;
  // Handover: closes each listener fd whose accept has ended.
  void close_handed_over_listeners() noexcept;
  static void on_accept(shard::completion* c, const io_uring_cqe* cqe);
  static void on_tls_accept(shard::completion* c, const io_uring_cqe* cqe);
  void on_accept_cqe(const io_uring_cqe* cqe, bool tls_port) noexcept;
  void accept_connection(int fd, bool tls_port) noexcept;
  void submit_recv(downstream_conn* d) noexcept;
  static void on_recv(shard::completion* c, const io_uring_cqe* cqe);
  void on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  // Plaintext from the client: to its protocol, or sniffed until one is
  // known. Returns: false when the connection closed (or must).
  bool take_plaintext(downstream_conn* d, const char* src, size_t n) noexcept;
  // The first bytes (in d->in) say which protocol: a ClientHello on the
  // plaintext port is refused, the HTTP/2 preface goes to HTTP/2, anything
  // else to the first protocol. Waits while they cannot tell yet.
  void sniff(downstream_conn* d) noexcept;
  // `p` takes the connection; `first` its first bytes.
  void hand_to(downstream_conn* d, conn_protocol* p, std::string_view first) noexcept;
  void peer_gone(downstream_conn* d) noexcept;
  void on_deadline(downstream_conn* d) noexcept;
  // --- the send (transport_send.cpp) ---
  static void on_send(shard::completion* c, const io_uring_cqe* cqe);
  void on_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  // The send's completion (res: bytes, or -errno): a short one goes on,
  // else the protocol hears of it.
  void send_done(downstream_conn* d, int res) noexcept;
  // --- TLS (transport_tls.cpp) ---
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

  shard_context& _s;
  std::shared_ptr<const config::config>& _cfg = _s.cfg;
  shard::reactor& _r = _s.r;
  metrics::shard_metrics& _metrics = _s.metrics;
  shard::timer_wheel& _timers = _s.timers;
  const bool& _draining = _s.draining;

  conn_protocol* _first = nullptr;
  conn_protocol* _h2 = nullptr;
  http::limits _limits;
  int _listen_fd;
  op<client_transport> _accept_op;
  bool _accept_armed = false;
  int _tls_listen_fd = -1;
  op<client_transport> _tls_accept_op;
  bool _tls_accept_armed = false;
  std::shared_ptr<const tls::context> _tls_ctx;
  bool _handover = false;  // the drain hands the listeners over (begin_drain)
  std::unique_ptr<net::buffer_ring> _bufs;  // downstream receives (multishot)
  downstream_conn* _conns = nullptr;         // every live downstream connection
  uint32_t _conn_count = 0;
};

}  // namespace sluice::proxy
