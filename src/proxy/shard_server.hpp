#pragma once
// proxy (private): one shard's server. Owns the listener, the downstream
// connections, the upstream pools and the request path between them, in
// four parts, each in its own files:
//
//   downstream_h1.cpp    the HTTP/1.1 codec of the client side: receive,
//                        parse, send, keep-alive, pipelining, close
//   exchange.cpp         one request's policy: dispatch, models, auth,
//   admission.cpp          quota admission, accounting and audit
//   upstream_openai.cpp  the OpenAI-over-HTTP/1.1 backend adapter: pools,
//                        the forwarded request, connect / send / receive
//   relay.cpp            the response on its way back: head rewrite, body
//   relay_scan.cpp         relay, usage cut, SSE facts, backend errors
//
// Lifetimes: a connection object lives from accept (or connect) until its fd
// is closed AND every io_uring operation that names it has completed (`ops`
// counts them); only then is it freed. An SQE that reads one object's memory
// and another's socket counts on both. Closing starts with shutdown(2),
// which makes pending operations complete at once and, on the upstream
// side, tells the backend (vLLM aborts the generation and frees its KV cache
// on that).
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "downstream_conn.hpp"
#include "exchange.hpp"
#include "upstream_conn.hpp"
#include "sluice/audit/writer.hpp"
#include "sluice/auth/key_verifier.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/http/request.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/net/buffer_ring.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/quota/shard_slices.hpp"
#include "sluice/route/table.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/shard/spsc_queue.hpp"
#include "sluice/shard/timer_wheel.hpp"

namespace sluice::proxy {

// Shard -> shard: ring rebalancing (load reports) and quota lending. Small
// and trivially copyable, as the SPSC queues require.
struct shard_message {
  enum class kind : uint8_t { route, quota } what = kind::route;
  union {
    route::message r;
    quota::message q;
  };
  shard_message() noexcept : r() {}
};
static_assert(std::is_trivially_copyable_v<shard_message>);

using mesh_queue = shard::spsc_queue<shard_message, 1024>;

// Shard -> control: one upstream attempt's outcome, for passive health.
struct upstream_outcome {
  uint32_t backend = 0;
  uint8_t failure = 0;
};
using outcome_queue = shard::spsc_queue<upstream_outcome, 4096>;

// The shards' queues to each other, owned by the gateway.
struct shard_mesh {
  uint32_t count = 1;
  mesh_queue* const* queues = nullptr;           // [from * count + to]; diagonal unused
  std::atomic<shard::reactor*> const* reactors = nullptr;  // by shard; null until it runs
  outcome_queue* to_control = nullptr;                     // this shard's passive health reports
  std::atomic<int64_t>* quota_levels = nullptr;            // see quota::slices_options::published
  uint32_t quota_keys_max = 0;                             // keys per shard in quota_levels (reload room)
  mesh_queue* queue(uint32_t from, uint32_t to) const noexcept { return queues[from * count + to]; }
};

// Shard-local; created and run by the shard thread.
class shard_server {
 public:
  shard_server(uint32_t index, std::shared_ptr<const config::config> cfg, shard::reactor& r, int listen_fd,
               metrics::shard_metrics& m, const shard_mesh& mesh);
  ~shard_server();
  shard_server(const shard_server&) = delete;
  shard_server& operator=(const shard_server&) = delete;

  bool init() noexcept;
  void on_iteration(uint64_t now_ms) noexcept;
  void begin_drain(uint64_t deadline_ms) noexcept;
  void reopen_audit() noexcept;
  void apply_route(const route::message& m) noexcept { _routes->apply(m); }
  // SIGHUP: `next` (reconciled with the running snapshot, so every index a
  // connection holds keeps its meaning) becomes this shard's snapshot. In-
  // flight requests carry on; new ones route by the new rings. Cold path.
  void reload(std::shared_ptr<const config::config> next);
  // Flushes and closes the audit log (shutdown); runs the reactor until done.
  void close_audit() noexcept;
  bool drained() const noexcept { return _draining && _conn_count == 0; }
  bool draining() const noexcept { return _draining; }

  // --- used by the connection code ---
  shard::reactor& ring() noexcept { return _r; }
  const config::config& cfg() const noexcept { return *_cfg; }
  uint64_t now_ms() const noexcept { return _r.now_ms(); }

 private:
  // accept
  void submit_accept() noexcept;
  static void on_accept(shard::completion* c, const io_uring_cqe* cqe);
  void on_accept_cqe(const io_uring_cqe* cqe) noexcept;

  // downstream: the HTTP/1.1 codec (downstream_h1.cpp)
  void submit_recv(downstream_conn* d) noexcept;
  static void on_recv(shard::completion* c, const io_uring_cqe* cqe);
  void on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  void process_input(downstream_conn* d) noexcept;
  void start_request(downstream_conn* d) noexcept;
  // A parsed head: the endpoint by path and method, and the bearer key,
  // before any body is read (a request sluice refuses never makes it send
  // 100 Continue or buffer 8 MiB). Returns: whether the request goes on;
  // else it was answered (404, 405, 401).
  bool accept_head(downstream_conn* d, bool has_body) noexcept;
  void dispatch(downstream_conn* d) noexcept;
  void answer_models(downstream_conn* d) noexcept;
  void answer_error(downstream_conn* d, uint16_t status, std::string_view message, std::string_view type,
                    std::string_view param, std::string_view code, bool close,
                    std::string_view extra_headers = {}) noexcept;
  // Sends a JSON answer sluice wrote (an error body) with sluice's headers;
  // `error_code` (a static string) goes to the audit record.
  void send_answer(downstream_conn* d, uint16_t status, std::string_view body, bool close,
                   std::string_view extra_headers, std::string_view error_code) noexcept;
  void send_out(downstream_conn* d) noexcept;
  void submit_send(downstream_conn* d) noexcept;
  static void on_send(shard::completion* c, const io_uring_cqe* cqe);
  void on_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  void on_response_sent(downstream_conn* d) noexcept;
  void finish_exchange(downstream_conn* d) noexcept;
  void next_request(downstream_conn* d) noexcept;
  // The client closed or reset its connection: an exchange in flight is
  // cancelled (audited 499, client_closed), then the connection closes.
  void client_gone(downstream_conn* d) noexcept;
  void close_downstream(downstream_conn* d) noexcept;
  // After an error answer that closes: shut the write side, drop input.
  void linger(downstream_conn* d) noexcept;
  void maybe_free(downstream_conn* d) noexcept;
  void compact_input(downstream_conn* d) noexcept;
  // Arms the connection's one deadline `ms` from now (0 or none: none). An
  // upstream wait is capped at the exchange's total deadline.
  void set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept;
  void on_deadline(downstream_conn* d) noexcept;
  void reset_exchange(downstream_conn* d) noexcept;
  void make_request_id(downstream_conn* d) noexcept;
  void open_request(downstream_conn* d) noexcept;
  // exchange: admission (admission.cpp)
  void admit(downstream_conn* d) noexcept;
  void answer_rate_limited(downstream_conn* d, const quota::decision& q) noexcept;
  size_t write_rate_headers(downstream_conn* d, char* out, size_t cap) noexcept;
  void settle_quota(downstream_conn* d, uint64_t prompt, uint64_t completion) noexcept;
  void unpark(downstream_conn* d) noexcept;
  void append_waiter(downstream_conn* d) noexcept;
  // Empties the waiter list and returns its old head; the chain stays
  // linked through wait_hook.next for the caller's walk.
  downstream_conn* detach_waiters() noexcept;
  // Once per loop turn: the peers' messages (load reports, quota), the
  // quota tick, parked requests whose time came, and this shard's messages.
  void pump_mesh(uint64_t now_ms) noexcept;
  void take_mesh_messages(uint64_t now_ms) noexcept;
  void retry_waiters(uint64_t now_ms) noexcept;
  void send_quota_messages() noexcept;
  void send_load_reports(uint64_t now_ms) noexcept;
  // Passive health: failures always, a success only after a failure (that
  // is all the consecutive-failure count needs). Full queue: dropped.
  void report_outcome(uint32_t backend, bool failure) noexcept;
  void end_request(downstream_conn* d) noexcept;

  // upstream: the OpenAI-over-HTTP/1.1 adapter (upstream_openai.cpp)
  void forward(downstream_conn* d, const openai::request_fields& f) noexcept;
  void start_attempt(downstream_conn* d) noexcept;
  bool build_upstream_request(downstream_conn* d, const openai::request_fields& f) noexcept;
  // The forwarded body as iovecs (x.up_iov[1..]): the client's bytes with at
  // most two byte edits (model, include_usage). Returns: its length.
  uint64_t plan_upstream_body(downstream_conn* d, const openai::request_fields& f) noexcept;
  // Returns: a pooled connection, else a new one while the backend has
  // fewer than `open_max` on this shard; null when at the cap or out of
  // resources.
  upstream_conn* acquire_upstream(uint32_t backend, uint32_t open_max) noexcept;
  void release_upstream(upstream_conn* u, bool reusable) noexcept;
  void close_upstream(upstream_conn* u) noexcept;
  void maybe_free(upstream_conn* u) noexcept;
  // An upstream CQE's first step: counts the operation done. Returns:
  // whether the connection no longer serves an exchange (then handled).
  bool upstream_gone(upstream_conn* u) noexcept;
  void submit_connect(upstream_conn* u) noexcept;
  void submit_upstream_send(downstream_conn* d) noexcept;
  // No-op while one is armed. With no bytes held (u->buf empty) the
  // receive takes a buffer from _up_bufs; else it appends to u->buf.
  // `poll_first`: no bytes can be there yet (skip the first attempt).
  void submit_recv(upstream_conn* u, bool poll_first = false) noexcept;
  // Gives u->buf's storage back (to _up_bufs when lent). Only while no
  // operation writes to it.
  void drop_upstream_buffer(upstream_conn* u) noexcept;
  static void on_up_connect(shard::completion* c, const io_uring_cqe* cqe);
  static void on_up_send(shard::completion* c, const io_uring_cqe* cqe);
  static void on_up_recv(shard::completion* c, const io_uring_cqe* cqe);
  void on_up_connect_cqe(upstream_conn* u, int res) noexcept;
  void on_up_send_cqe(upstream_conn* u, int res) noexcept;
  void on_up_recv_cqe(upstream_conn* u, int res) noexcept;
  void upstream_failed(downstream_conn* d, errc why) noexcept;
  // The client's answer to an attempt that failed and is not retried.
  void answer_upstream_failure(downstream_conn* d, errc why) noexcept;
  // The upstream send that read d's request bytes has completed: what
  // waited for it (the next request, a retry, the free) goes on.
  void after_upstream_send_done(downstream_conn* d) noexcept;
  // The downstream send about to go reads u->buf: u (and its buffer) stays
  // until that send completes.
  void pin_upstream_buffer(downstream_conn* d, upstream_conn* u) noexcept;
  void unpin_upstream_buffer(downstream_conn* d) noexcept;
  void on_response_head(downstream_conn* d) noexcept;
  // The client's response head in `out`: the backend's status and end-to-end
  // fields, sluice's own (x-request-id, rate limits, processing time).
  // Returns: false when out of memory.
  bool write_response_head(downstream_conn* d) noexcept;
  // Parses u->buf[parse_from, len) and sends [fwd_from, send_end) (with
  // the response head first when with_head).
  void relay(downstream_conn* d, uint32_t parse_from, bool with_head) noexcept;
  void after_body_sent(downstream_conn* d) noexcept;
  // The batch [fwd_from, send_end) holds the usage event sluice asked for:
  // sent without it (its chunk cut out, or the batch re-framed).
  void send_cut(downstream_conn* d, bool with_head, bool end_client) noexcept;
  // The client's terminal chunk, sent by sluice after [DONE]; marks the
  // response ended for the client.
  iovec terminal_chunk_iov(downstream_conn* d) noexcept;
  // Sends send_iov[0..n) (nothing: on to after_body_sent); `pin`: the
  // upstream connection whose buffer the send reads, held until it completes.
  void send_batch(downstream_conn* d, uint8_t n, upstream_conn* pin) noexcept;
  // An HTTP/1.0 client: the batch's payload, de-chunked, after the head.
  void send_dechunked(downstream_conn* d, bool with_head, bool end_client) noexcept;
  // Returns: whether u->buf could double (own allocation, up to 1 MiB).
  bool grow_upstream_buffer(upstream_conn* u) noexcept;
  // After [DONE] on a response the backend keeps open: how long its rest is
  // waited for before the connection is closed instead of pooled.
  static constexpr uint64_t k_after_done_wait_ms = 1000;
  // A held backend error (hold_error), read whole: answered in OpenAI's shape.
  void answer_backend_error(downstream_conn* d) noexcept;
  void abort_exchange(downstream_conn* d) noexcept;
  static void on_body_data(void* ctx, const char* data, size_t len);
  static void on_sse_event(void* ctx, const http::sse_event& ev);
  static void on_chunk_end(void* ctx, const char* at);
  static void on_sse_chunk(void* ctx, const char* data, size_t len, const char* end);

  uint32_t _index;
  std::shared_ptr<const config::config> _cfg;
  shard::reactor& _r;
  metrics::shard_metrics& _metrics;
  shard_mesh _mesh;
  std::unique_ptr<audit::writer> _audit;
  std::unique_ptr<route::table> _routes;  // replaced whole on reload
  quota::shard_slices _quota;
  downstream_conn* _waiters = nullptr;   // quota_wait connections, oldest first
  downstream_conn* _waiters_tail = nullptr;
  uint64_t _prng = 0;
  uint64_t _last_report_ms = 0;
  uint64_t _last_quota_tick_ms = 0;
  std::vector<uint32_t> _reported;       // last load reported per backend (cold-sized)
  uint64_t _reported_version = ~uint64_t{0};  // _routes->local_version() at the last report
  std::vector<uint8_t> _last_failed;     // last outcome reported per backend was a failure
  int _listen_fd;
  http::limits _limits;
  op<shard_server> _accept_op;
  bool _accept_armed = false;
  std::unique_ptr<net::buffer_ring> _bufs;      // downstream receives (multishot)
  std::unique_ptr<net::buffer_ring> _up_bufs;   // upstream receives with nothing held
  openai::request_reader _reader;
  std::unique_ptr<backend_state[]> _backends;
  downstream_conn* _conns = nullptr;   // every live downstream connection
  uint32_t _conn_count = 0;
  uint32_t _rr_cursor = 0;
  uint64_t _request_seq = 0;
  uint64_t _id_seed = 0;
  auth::key_verifier _keys;             // bearer keys verified on this shard
  shard::timer_wheel _timers;           // every connection's deadline
  bool _draining = false;
  uint64_t _drain_deadline_ms = 0;
  // The loop polls before sleeping (server.idle_poll_us) only while at most
  // this many requests are open on the shard.
  static constexpr uint64_t k_poll_open_max = 2;
};

}  // namespace sluice::proxy
