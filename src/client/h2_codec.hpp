#pragma once
// client (private): the HTTP/2 client codec. A connection that starts with
// the client preface (h2c with prior knowledge on the plaintext listener,
// or ALPN h2 after a TLS handshake) is handed over by the client transport
// (client_transport: the socket, the receive and the send, TLS when there
// is one), and gets an h2_link: an nghttp2
// server session (sluice/h2/session.hpp) and its streams. Each stream is one
// exchange on the same policy and adapters as an HTTP/1.1 request; the
// response's body goes out as DATA frames, without the backend's chunk
// framing (takes_chunked() is false, so the relay sends the payload).
//
// Lifetimes:
//   - the link lives as long as its connection object (freed with it);
//   - a stream (h2_stream) from its request head until the session closed
//     it AND nothing reads its memory: not an upstream send of its request
//     bytes (ops), not a DATA piece of a lender's buffer (pin). The session
//     reports a close from inside its own calls; the exchange is accounted
//     there (its request views are valid until that event returns), and the
//     object is freed later, from flush(), never inside a session call;
//   - the session's events run inside feed() / send_body() / consume_output()
//     and only mark what flush() does next: a drained body (the adapter's
//     on_sent, an answer's accounting), a closed stream (freed).
#include <cstdint>
#include <memory>
#include <string_view>

#include "client_codec.hpp"
#include "downstream_conn.hpp"
#include "shard_context.hpp"
#include "transport.hpp"
#include "sluice/h2/session.hpp"
#include "sluice/shard/timer_wheel.hpp"

namespace sluice::proxy {

class exchange_policy;
class h2_codec;
struct h2_link;

// Shard-local. One per request stream: from its request head until freed
// (see the lifetimes above).
struct h2_stream {
  h2_link* link = nullptr;
  int32_t id = 0;
  conn_state state = conn_state::head;
  deadline_kind deadline = deadline_kind::none;
  shard::timer timer;               // in the codec's wheel while deadline != none
  int ops = 0;                      // upstream sends reading `body` (lent request bytes)
  uint32_t body_counted = 0;        // of `body`: counted in the link's body_bytes until freed
  bool closed = false;              // the session closed the stream: its request views are gone
  bool finished = false;            // accounted (end_request); the exchange is over
  bool body_done = false;           // the request body ended (END_STREAM)
  bool dispatched = false;          // the whole request went to the exchange's policy
  bool sending = false;             // DATA pieces queued in the session, not yet drained
  bool drained = false;             // they were: flush() tells the adapter (or accounts an answer)
  bool end_queued = false;          // END_STREAM is queued: the response is whole
  bool answered = false;            // an answer of sluice's own is queued (accounted when drained)
  bool reset_after_answer = false;  // the request body is still coming: RST_STREAM NO_ERROR once answered
  // Refused by its head (401, 404, 405...) with a body still coming: once
  // answered, the stream stays half-closed (local) a short while instead of
  // being reset at once, so the client's next frames on it are judged as on
  // any open stream (flow control, padding, trailers, content-length: RFC
  // 9113's errors) rather than ignored. Reset (NO_ERROR) past the while or
  // k_linger_bytes_max of body, whichever comes first; the client's
  // END_STREAM closes it at once.
  bool linger_after_answer = false;
  bool lingering = false;
  uint32_t linger_bytes = 0;
  bool in_ready = false;
  uint16_t head_status = 0;         // the staged response head's status
  buffer_lender* pin = nullptr;     // whose buffer the queued pieces read (given back when drained)
  h2_stream* ready_next = nullptr;  // in the link's list of streams flush() looks at
  list_hook<h2_stream> hook;        // in the link's streams
  h2_stream* free_next = nullptr;   // in the codec's pool
  byte_buf body;                    // the request body, with simdjson's padding after it
  byte_buf head;                    // the staged response head: "name: value\r\n" lines
  byte_buf answer;                  // an answer's body while it goes out
  exchange_memory mem;
  exchange x;
};

// Shard-local. One per HTTP/2 connection, owned by its downstream_conn.
// Neither copyable nor movable (the session holds its address).
struct h2_link final : h2::session_owner {
  h2_link(h2_codec& c, downstream_conn* conn, const h2::options& o) : codec(c), d(conn), session(*this, o) {}
  h2_codec& codec;
  downstream_conn* d;
  h2::server_session session;
  h2_stream* streams = nullptr;      // every stream not yet freed
  h2_stream* ready = nullptr;        // streams with news for flush()
  uint32_t stream_count = 0;
  bool flushing = false;
  bool closed_pending = false;       // a closed stream waits to be freed
  bool goaway = false;               // no new streams: a GOAWAY went out or came in
  uint64_t counted_streams = 0;      // session counters already added to the shard's metrics
  uint64_t body_bytes = 0;           // request body bytes its streams hold (body_counted, summed)
  h2::counters counted{};

  // --- h2::session_owner ---
  void on_request_head(const h2::request& r) override;
  void on_request_data(int32_t stream_id, std::span<const char> bytes, bool end_stream) override;
  void on_body_drained(int32_t stream_id) override;
  void on_stream_closed(int32_t stream_id, h2::close_cause cause, uint32_t code) override;
  void on_goaway(uint32_t code, bool from_client) override;

  h2_stream* find(int32_t id) const noexcept;
};

// Shard-local; a part of the shard's server beside the HTTP/1.1 codec, on the
// same transport, which hands it the HTTP/2 connections (adopt).
class h2_codec final : public client_codec, public conn_protocol {
 public:
  h2_codec(shard_context& s, exchange_policy& x, conn_transport& transport) noexcept;
  ~h2_codec() override;
  h2_codec(const h2_codec&) = delete;
  h2_codec& operator=(const h2_codec&) = delete;

  // --- the transport's calls (conn_protocol) -----------------------------
  // `d` speaks HTTP/2 from now on; `first` holds its first plaintext bytes
  // (the preface, and what followed). Returns: false when out of memory.
  bool adopt(downstream_conn* d, std::string_view first) noexcept override;
  // Plaintext from the client.
  void on_bytes(downstream_conn* d, std::string_view bytes) noexcept override;
  // Part of the session's output went: it is consumed (the session refills
  // its ring, the streams' batches drain and their idle deadlines start
  // again), and the connection's send deadline starts again.
  void on_progress(downstream_conn* d, size_t bytes) noexcept override;
  // The send of session output completed (res: bytes, or -errno).
  void on_sent(downstream_conn* d, int res) noexcept override;
  // The client closed its side: the streams end with the connection.
  void on_peer_gone(downstream_conn* d) noexcept override;
  // The connection's own deadline: idle with no stream (GOAWAY, then the
  // close), or its output was not taken in time (closed as stalled).
  void on_deadline(downstream_conn* d, deadline_kind k) noexcept override;
  // The connection closes: every stream still open ends (cancelled).
  void on_close(downstream_conn* d) noexcept override;
  // Its object is about to be freed: the link goes, with its streams.
  void on_free(downstream_conn* d) noexcept override;
  // Graceful: GOAWAY, streams in flight finish.
  void drain(downstream_conn* d) noexcept override;
  // The drain's time is up: every stream still in its exchange is cut
  // (audited cancelled, drain_timeout); the connection closes after.
  void cut(downstream_conn* d) noexcept override;
  // Once per loop turn: the streams' deadlines.
  void on_iteration(uint64_t now_ms) noexcept;
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
  bool takes_chunked(const exchange&) const noexcept override { return false; }
  bool stage_response_head(exchange& x, const http::response_head& rh, bool dechunked) noexcept override;
  void stream_wait(exchange& x, uint64_t idle_ms) noexcept override;
  bool dechunks(const exchange&) const noexcept override { return true; }
  void send_response(exchange& x, bool with_head, const iovec* body, uint8_t n, buffer_lender* lender,
                     uint8_t chunked) noexcept override;
  void response_done(exchange& x) noexcept override;

  // --- the links' events (h2_link forwards them) ---
  void on_request_head(h2_link& l, const h2::request& r) noexcept;
  void on_request_data(h2_link& l, int32_t stream_id, std::span<const char> bytes, bool end_stream) noexcept;
  void on_body_drained(h2_link& l, int32_t stream_id) noexcept;
  void on_stream_closed(h2_link& l, int32_t stream_id, h2::close_cause cause, uint32_t code) noexcept;
  void on_goaway(h2_link& l, uint32_t code, bool from_client) noexcept;

 private:
  static h2_stream& stream_of(const exchange& x) noexcept { return *x.h2; }
  h2_stream* new_stream(h2_link& l, int32_t id) noexcept;
  void free_stream(h2_stream* st) noexcept;
  void mark_ready(h2_stream* st) noexcept;
  // The lender of the pieces the session copied (or dropped) has its buffer back.
  void give_back_pin(h2_stream* st) noexcept;
  // After every call from outside the session: what its events marked
  // (drained bodies, closed streams), then the output to the socket, and
  // the connection's close once the session is done.
  // `may_free`: closed streams are freed (only from the connection's own
  // calls: a receive, a send, a deadline).
  void flush(h2_link& l, bool may_free = false) noexcept;
  void submit_output(h2_link& l) noexcept;
  // The exchange is over, as any answer: audited, counted.
  void finish(h2_stream* st) noexcept;
  // The stream ends before its exchange did (the client reset it, the
  // connection went): cancelled, audited 499 -- or, `client_went` false,
  // cut by sluice, audited with the exchange's own status and code.
  void abandon(h2_stream* st, bool client_went = true) noexcept;
  // Submits the staged head (head_status, head's lines) with the codec's
  // own fields. Returns: false when the session refused it.
  bool submit_head(h2_stream* st, bool end_stream) noexcept;
  void set_deadline(h2_stream* st, deadline_kind k, uint64_t ms) noexcept;
  void on_deadline(h2_stream* st) noexcept;
  void publish_counters(h2_link& l) noexcept;

  shard_context& _s;
  exchange_policy& _x;
  conn_transport& _t;
  std::shared_ptr<const config::config>& _cfg = _s.cfg;
  metrics::shard_metrics& _metrics = _s.metrics;
  shard::timer_wheel _timers;        // the streams' deadlines
  h2_stream* _pool = nullptr;        // freed streams, kept with their buffers
  uint32_t _pooled = 0;
};

// The session's limits from the server's config.
h2::options h2_options_from(const config::server_config& s) noexcept;

}  // namespace sluice::proxy
