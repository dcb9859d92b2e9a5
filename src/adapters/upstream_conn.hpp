#pragma once
// adapters (private): the backend side's connection objects. The OpenAI-over-
// HTTP/1.1 adapter (openai_http) drives them.
#include <sys/socket.h>

#include <cstdint>

#include "conn_memory.hpp"
#include "sluice/config/config.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::proxy {

class openai_http;
struct exchange;

// Shard-local. One per backend connection; from its socket() until it is
// closed and its last operation has completed. Pooled between exchanges
// (HTTP/1.1: one exchange at a time).
//
// Ownership: `ops` counts every SQE that names the connection's socket or
// memory, its own (connect, send, receive) and those of a downstream send
// that reads `buf` (buf_pinned: lent as a buffer_lender, given back at that
// send's completion). The object and its fd go only when ops is 0
// (maybe_free); shutdown(2) is what makes pending operations complete.
struct upstream_conn : buffer_lender {
  openai_http* adapter = nullptr;
  int fd = -1;
  shard::file_slot slot;  // fd in the ring's registered-file table: the receive and sends use it
  uint32_t backend = 0;
  int ops = 0;
  bool connected = false;
  bool in_pool = false;
  bool closing = false;
  bool reused = false;          // taken from the pool (a stale socket may fail: retry)
  uint64_t idle_since_ms = 0;   // pooled: when (the shard's now_ms)
  bool recv_armed = false;      // a receive is in flight (also while idle in the pool)
  bool buf_lent = false;        // buf is the shard's upstream ring buffer buf_bid
  bool buf_pinned = false;      // a downstream send reads buf (counted in ops): it stays until that completes
  uint16_t buf_bid = 0;
  exchange* owner = nullptr;     // the exchange this attempt serves; null while pooled
  // The exchange whose request bytes (its body and up_head) the send in
  // flight reads; its codec holds them (lend_request_bytes), unmoved, until
  // the completion.
  exchange* send_for = nullptr;
  op<upstream_conn> connect_op, send_op, recv_op;
  sockaddr_storage peer{};      // the backend's address, read by the connect SQE
  socklen_t peer_len = 0;
  list_hook<upstream_conn> pool_hook;
  // Response bytes (head, and body). Only while the connection holds bytes:
  // a receive with nothing held takes a buffer from the shard's upstream
  // ring when data comes (an idle stream or pooled connection holds none);
  // the buffer goes back once its bytes are sent. Its own allocation only
  // when the ring was empty.
  byte_buf buf;
};

// Shard-local. One per backend of the config snapshot: its pool and counts.
struct backend_state {
  const config::backend_config* cfg = nullptr;
  upstream_conn* idle_head = nullptr;
  uint32_t idle_count = 0;
  uint32_t inflight = 0;
  uint32_t open = 0;            // connections to it, pooled, busy or closing
  uint32_t closing = 0;         // of those, shut down: freed at their last completion, no load on the
                                // backend, so not counted against upstream.connections_max
};

}  // namespace sluice::proxy
