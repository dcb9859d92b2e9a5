#pragma once
// client (private): the client side's connection object. The transport
// (client_transport) owns it: the socket, TLS, the receive and the send,
// its deadline and its close; the protocol it speaks (conn_protocol:
// h1_codec, h2_codec) keeps its own state here -- HTTP/1.1 the request
// buffers and the exchange in flight (exchange.hpp), HTTP/2 its session.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "conn_memory.hpp"
#include "deadline.hpp"
#include "exchange.hpp"
#include "receive_gate.hpp"
#include "sluice/http/request.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/shard/timer_wheel.hpp"
#include "sluice/tls/tls.hpp"

namespace sluice::proxy {

class client_transport;
class conn_protocol;
struct upstream_conn;
struct h2_link;

// A stream's idle deadline `at` (deadline_at; 0 = none) with a rendered
// Messages stream's pings (stream_pings): kept in r.idle_due_ms;
// returns when the timer falls due: the next ping tick when it comes first.
inline uint64_t idle_or_ping_at(stream_pings& r, uint64_t now_ms, uint64_t at) noexcept {
  r.idle_due_ms = at;
  if (r.ping_ms == 0) return at;
  const uint64_t tick = now_ms + r.ping_ms;
  return at == 0 || tick < at ? tick : at;
}

// Whether a stream's upstream_idle timer that fell due at `now_ms` is a
// ping tick (its idle deadline still ahead); then the timer is armed again
// for the rest of it: idle_rest_ms().
inline bool ping_tick(const stream_pings& r, uint64_t now_ms) noexcept {
  return r.ping_ms != 0 && (r.idle_due_ms == 0 || now_ms < r.idle_due_ms);
}
inline uint64_t idle_rest_ms(const stream_pings& r, uint64_t now_ms) noexcept {
  return r.idle_due_ms == 0 ? 0 : r.idle_due_ms - now_ms;
}

// A ping event as sluice renders one (dialect::stream_renderer::start),
// bare and as one chunk of an HTTP/1.1 chunked body.
inline constexpr std::string_view k_ping_event = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
inline constexpr std::string_view k_ping_chunk = "23\r\nevent: ping\ndata: {\"type\":\"ping\"}\n\n\r\n";
static_assert(k_ping_event.size() == 0x23 && k_ping_chunk.size() == 0x23 + 6);

enum class conn_state : uint8_t {
  idle,          // keep-alive, waiting for the next request's first byte
  head,          // reading the request head
  body,          // reading the request body
  upstream,      // request forwarded, waiting for the response head
  streaming,     // response body flowing upstream -> downstream
  local,         // sending an answer sluice made itself
  quota_wait,    // admitted once peers lend quota (a borrow round is out)
  lingering,     // an error answer went out and the write side is shut: input is read and dropped
  closing,
};

// Shard-local. One per downstream connection; from accept until both sides
// close and its last operation has completed.
//
// Ownership: `ops` counts every SQE that names the socket or reads this
// object's memory: its receive and send, and an upstream send that reads
// the request bytes (lent: x.up_send_inflight). Freed only when ops is 0
// (maybe_free). While x.up_send_inflight, `in`, `stash`'s merge and
// `mem.up_head` stay where they are; while send_busy, `out` and send_iov do.
struct downstream_conn {
  client_transport* transport = nullptr;
  conn_protocol* proto = nullptr;  // what it speaks; null until its first bytes (or ALPN) say
  int fd = -1;
  shard::file_slot slot;  // fd in the ring's registered-file table: the receive and sends use it
  int ops = 0;
  conn_state state = conn_state::idle;
  receive_gate recv;
  bool peer_eof = false;
  bool close_after_send = false;
  bool send_busy = false;          // a send is in flight: out / send_iov are the kernel's
  bool local_pending = false;      // a local answer waits for the send in flight (100 Continue)
  // The send in flight is a ping (stream_pings): the adapter's
  // send or end that comes meanwhile is held until its completion.
  bool ping_busy = false;
  struct held_send {
    bool live = false;             // send_response(with_head, body[0..n), lender, chunked)
    bool done = false;             // response_done()
    bool with_head = false;
    uint8_t n = 0;
    uint8_t chunked = 0;
    iovec body[3] = {};
    buffer_lender* lender = nullptr;  // given back if the connection closes meanwhile
  } held;
  // The upstream connection whose receive buffer the downstream send in
  // flight reads (its buf_pinned): released at that send's completion.
  buffer_lender* send_pin = nullptr;
  deadline_kind deadline = deadline_kind::none;
  shard::timer timer;              // in the shard's wheel while deadline != none
  op<downstream_conn> recv_op, send_op;
  list_hook<downstream_conn> all_hook;

  char peer_ip[48] = {};
  uint8_t peer_ip_len = 0;

  // Request bytes: [req_start, in.len) is the current request and anything
  // pipelined after it. Decoded chunked bodies are compacted in place.
  byte_buf in;
  byte_buf stash;                  // pipelined bytes that arrived while busy
  uint32_t req_start = 0;
  uint32_t body_begin = 0;         // offset of the body (after the head)
  uint32_t body_len = 0;           // body bytes ready at body_begin
  uint32_t raw_end = 0;            // offset just past the request's raw bytes
  uint32_t chunk_raw_pos = 0;      // chunked: first raw byte not yet decoded
  uint64_t linger_bytes = 0;       // dropped while lingering
  http::request_parser parser;

  // Outgoing bytes: `out` holds heads and local answers; send_iov points at
  // out and/or upstream buffer bytes.
  byte_buf out;                    // downstream response head / local answers
  iovec send_iov[4] = {};
  uint8_t send_iov_count = 0;
  msghdr down_msg = {};

  exchange_memory mem;             // its exchanges' buffers, kept across them
  exchange x;                      // the request in flight (or the last one)

  // HTTP/2: the session and its streams, once the connection spoke the
  // preface (h2_codec.hpp); `x` is unused then. Freed with the connection.
  std::unique_ptr<h2_link> h2;

  // TLS (accepted on the TLS listener): the session between the socket and
  // the codec. A send (send_busy, send_iov: plaintext) is encrypted into the
  // session's output ring, whose ciphertext goes out on tls_send_op; the
  // send completes (on_send_cqe's work) once all of its plaintext is
  // encrypted and a ciphertext send came back. While tls_out_busy, the
  // ring's pending output is the kernel's (it stays put until consumed).
  std::unique_ptr<tls::session> tls;
  bool tls_port = false;           // accepted on the TLS listener
  bool tls_out_busy = false;       // a ciphertext send is in flight
  bool tls_failed = false;         // the session ended (alert out, or the client's close_notify)
  bool tls_resume = false;         // the handshake or a read waits for room in the output ring
  op<downstream_conn> tls_send_op;
  iovec tls_iov[4] = {};           // the plaintext of the send in progress not yet encrypted
  uint8_t tls_iov_count = 0;
  uint32_t tls_plain_bytes = 0;    // that send's plaintext, all of it (what its completion reports)

  explicit downstream_conn(const http::limits& l);
  ~downstream_conn();
};

}  // namespace sluice::proxy
