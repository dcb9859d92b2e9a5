#pragma once
// client (private): the seam between a client connection's transport and
// the protocol it speaks.
//
// The transport (client_transport) owns every client connection
// (downstream_conn): accept, TLS, receive, send, the connection's
// deadline, lingering close, drain, and the sniffing of its first bytes.
// Once those (or ALPN) say which protocol the connection speaks, it is
// handed to that conn_protocol -- HTTP/1.1 (h1_codec) or HTTP/2
// (h2_codec) -- and from then on the transport only carries its bytes:
//
//   client_transport --conn_protocol--> h1_codec, h2_codec  (bytes in, sends done, deadline, close)
//   h1_codec, h2_codec --conn_transport--> client_transport (send, close, linger, deadline, receive)
//
// No protocol includes another's header, and the transport includes
// neither; the shard's server wires them (shard_server). Every call is made
// on the shard's thread.
//
// Lifetime: a connection is freed only by the transport, once it is closing
// and nothing holds it (downstream_conn::ops is 0). Every call the
// transport makes into a protocol holds it (++ops) for the call's length,
// so a protocol may close the connection in any call and still read it
// until it returns; a call of the protocol's own (a backend's event, a
// stream's timer) ends with after_call().
#include <cstdint>
#include <string_view>

#include "deadline.hpp"

namespace sluice::proxy {

struct downstream_conn;

// What a protocol asks of the connection's transport.
class conn_transport {
 public:
  // Sends d->send_iov (the protocol's output). One send at a time: the
  // iovecs and what they point at are the kernel's until on_sent.
  virtual void send_output(downstream_conn* d) noexcept = 0;
  // Closes the connection now: the protocol's on_close, then the socket is
  // shut down; it is freed once nothing holds it.
  virtual void close_conn(downstream_conn* d) noexcept = 0;
  // The protocol is done with a connection whose client may still be
  // sending: its on_close, then the write side is shut and what the client
  // still sends is read and dropped, for a bounded time and size
  // (lingering; nginx's lingering_close), then the close. `peer_gone`:
  // the client is gone, so it closes at once.
  virtual void end_conn(downstream_conn* d, bool peer_gone) noexcept = 0;
  // After an error answer that closes: the write side is shut and input
  // dropped, as end_conn does, without a second on_close.
  virtual void linger(downstream_conn* d) noexcept = 0;
  // After a call of the protocol's own (not one the transport made): a
  // connection that closed meanwhile is freed once nothing reads it.
  virtual void after_call(downstream_conn* d) noexcept = 0;
  // The connection's deadline, of kind `k`, falls due at `at_ms` (0: none;
  // the kind is none then too). on_deadline tells the protocol.
  virtual void set_deadline(downstream_conn* d, deadline_kind k, uint64_t at_ms) noexcept = 0;
  // The connection's own deadline, as HTTP/2 keeps it: `sending` -- its
  // send went out now, and the client must take it within idle_timeout_ms
  // (re-armed with each send); else `idle` -- nothing open: the keep-alive
  // idle time runs; else none (the protocol's streams have their own).
  virtual void arm_conn_deadline(downstream_conn* d, bool sending, bool idle) noexcept = 0;
  // Stops reading the client (too much input held) until resume_receive.
  virtual void pause_receive(downstream_conn* d) noexcept = 0;
  virtual void resume_receive(downstream_conn* d) noexcept = 0;
  // The drain hands the listeners to a new process (SIGUSR2): an idle
  // keep-alive connection gets a grace (k_handover_idle_grace_ms) for a
  // request already on its way.
  virtual bool handing_over() const noexcept = 0;
  static constexpr uint32_t k_handover_idle_grace_ms = 1000;

 protected:
  conn_transport() = default;
  ~conn_transport() = default;
  conn_transport(const conn_transport&) = delete;
  conn_transport& operator=(const conn_transport&) = delete;
};

// A protocol a connection speaks, as its transport drives it.
class conn_protocol {
 public:
  // `d` speaks this protocol from now on; `first` holds its first
  // plaintext bytes, in d->in (which the protocol owns from now on; HTTP/1.1
  // reads on from there). Returns: false when out of memory (the transport
  // then closes the connection).
  [[nodiscard]] virtual bool adopt(downstream_conn* d, std::string_view first) noexcept = 0;
  // Plaintext from the client; the bytes are the transport's once the call
  // returns.
  virtual void on_bytes(downstream_conn* d, std::string_view bytes) noexcept = 0;
  // Part of a send went out, `bytes` of it (0: some, over TLS), and the
  // rest goes on (the client reads, if slowly); what the rest reads is
  // still the kernel's.
  virtual void on_progress(downstream_conn* d, size_t bytes) noexcept = 0;
  // The send of the protocol's output completed: res is its bytes not yet
  // told by on_progress, or -errno. Also when the connection is closing (state closing): the protocol then
  // lets go of what the send read, and does nothing more.
  virtual void on_sent(downstream_conn* d, int res) noexcept = 0;
  // The client closed or reset its side (EOF, an error, TLS close_notify).
  virtual void on_peer_gone(downstream_conn* d) noexcept = 0;
  // The connection's deadline (set_deadline, arm_conn_deadline) fell due;
  // d->deadline is none again.
  virtual void on_deadline(downstream_conn* d, deadline_kind k) noexcept = 0;
  // The connection closes (called before its state is closing, and again
  // at the close after end_conn): whatever is still open ends (cancelled).
  virtual void on_close(downstream_conn* d) noexcept = 0;
  // Its object is about to be freed: the protocol's state of it goes.
  virtual void on_free(downstream_conn* d) noexcept = 0;
  // Graceful: no new requests; those in flight finish. Not called on a
  // connection that is closing or lingering.
  virtual void drain(downstream_conn* d) noexcept = 0;
  // The drain's time is up: every request still in its exchange is cut
  // (audited cancelled, drain_timeout); the transport closes it after.
  virtual void cut(downstream_conn* d) noexcept = 0;

 protected:
  conn_protocol() = default;
  ~conn_protocol() = default;
  conn_protocol(const conn_protocol&) = delete;
  conn_protocol& operator=(const conn_protocol&) = delete;
};

}  // namespace sluice::proxy
