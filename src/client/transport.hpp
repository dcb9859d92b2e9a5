#pragma once
// client (private): the seam between a client connection's transport and
// the protocol it switched to.
//
// The transport (h1_codec) owns every client connection (downstream_conn):
// accept, TLS, receive, send, the connection's deadline, lingering close,
// drain; HTTP/1.1 is the protocol it starts with. A connection that spoke
// the HTTP/2 preface (or chose h2 by ALPN) is handed to a conn_protocol
// (h2_codec) and from then on the transport only carries its bytes:
//
//   h1_codec --conn_protocol--> h2_codec      (bytes in, sends done, close)
//   h2_codec --conn_transport--> h1_codec     (send, close, deadline)
//
// Neither includes the other's header; the shard's server wires them
// (shard_server). Every call is made on the shard's thread.
#include <string_view>

namespace sluice::proxy {

struct downstream_conn;

// What a protocol asks of the connection's transport.
class conn_transport {
 public:
  // Sends d->send_iov (the protocol's output).
  virtual void send_output(downstream_conn* d) noexcept = 0;
  // The connection ends (the protocol is done, or the client is gone).
  virtual void end_conn(downstream_conn* d, bool peer_gone) noexcept = 0;
  // After a call of the protocol's own (not one the transport made): a
  // connection that closed meanwhile is freed once nothing reads it.
  virtual void after_call(downstream_conn* d) noexcept = 0;
  // The connection's own deadline: `sending` -- its send went out now, and
  // the client must take it within idle_timeout_ms (re-armed with each
  // send); else `idle` -- nothing open: the keep-alive idle time runs;
  // else none (the protocol's streams have their own).
  virtual void arm_conn_deadline(downstream_conn* d, bool sending, bool idle) noexcept = 0;

 protected:
  conn_transport() = default;
  ~conn_transport() = default;
  conn_transport(const conn_transport&) = delete;
  conn_transport& operator=(const conn_transport&) = delete;
};

// A protocol a connection switched to, as its transport drives it.
class conn_protocol {
 public:
  // `d` speaks this protocol from now on; `first` holds its first
  // plaintext bytes (the preface, and what followed). Returns: false when
  // out of memory.
  [[nodiscard]] virtual bool adopt(downstream_conn* d, std::string_view first) noexcept = 0;
  // Plaintext from the client.
  virtual void on_bytes(downstream_conn* d, std::string_view bytes) noexcept = 0;
  // The send of the protocol's output completed (res: bytes, or -errno).
  virtual void on_sent(downstream_conn* d, int res) noexcept = 0;
  // The connection closes: whatever is still open ends (cancelled).
  virtual void on_close(downstream_conn* d) noexcept = 0;
  // Its object is about to be freed: the protocol's state of it goes.
  virtual void on_free(downstream_conn* d) noexcept = 0;
  // Graceful: no new requests; those in flight finish.
  virtual void drain(downstream_conn* d) noexcept = 0;
  // The drain's time is up: every request still in its exchange is cut
  // (audited cancelled, drain_timeout); the connection closes after.
  virtual void cut(downstream_conn* d) noexcept = 0;

 protected:
  conn_protocol() = default;
  ~conn_protocol() = default;
  conn_protocol(const conn_protocol&) = delete;
  conn_protocol& operator=(const conn_protocol&) = delete;
};

}  // namespace sluice::proxy
