#pragma once
// proxy (private): one shard's server. Owns the listener, the downstream
// connections, the upstream pools and the request path between them.
//
// Lifetimes: a connection object lives from accept (or connect) until its fd
// is closed AND every io_uring operation on it has completed (`_ops` counts
// them); only then is it freed. Closing starts with shutdown(2), which makes
// pending receives complete at once and, on the upstream side, tells the
// backend (vLLM aborts the generation and frees its KV cache on that).
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "sluice/audit/writer.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/http/request.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/net/buffer_ring.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/proxy/stats.hpp"
#include "sluice/quota/shard_slices.hpp"
#include "sluice/route/table.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/shard/spsc_queue.hpp"
#include "receive_gate.hpp"

namespace sluice::proxy {

class shard_server;
struct downstream_conn;
struct upstream_conn;

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

// Connection memory of the calling shard thread: connection objects and
// their buffers (server.memory_max_bytes). Thread-local: each shard counts
// its own, with no atomics; the shard publishes it to its stats per tick.
int64_t connection_memory_bytes() noexcept;
// A connection's SSE scanner, counted with the event buffer it may make.
inline constexpr int64_t k_sse_scanner_bytes =
    static_cast<int64_t>(sizeof(http::sse_scanner) + http::sse_scanner::k_event_bytes_max);
void account_connection_memory(int64_t delta) noexcept;

// A growable byte buffer owned by one connection. Grows (rarely: bodies
// larger than the first size) and is kept across keep-alive requests.
struct byte_buf {
  char* data = nullptr;
  uint32_t len = 0;
  uint32_t cap = 0;
  ~byte_buf();
  // Returns: false when `n` exceeds what may be allocated.
  bool reserve(size_t n) noexcept;
  void release() noexcept;
};

// An io_uring operation owned by a connection.
template <class Owner>
struct op : shard::completion {
  Owner* owner = nullptr;
};

// Intrusive doubly linked list hook.
template <class T>
struct list_hook {
  T* prev = nullptr;
  T* next = nullptr;
};

enum class deadline_kind : uint8_t {
  none,
  header,          // 408: the head did not arrive in header_timeout_ms (total)
  body,            // 408: the body is too slow
  idle,            // keep-alive idle: close quietly
  upstream_connect,
  upstream_first_byte,
  upstream_idle,   // stream idle: no byte from the backend for stream_idle_timeout_ms
  send,            // the client takes no bytes: close
};

// Shard-local. One per backend connection; pooled between requests.
struct upstream_conn {
  shard_server* srv = nullptr;
  int fd = -1;
  uint32_t backend = 0;
  int ops = 0;
  bool connected = false;
  bool in_pool = false;
  bool closing = false;
  bool reused = false;          // taken from the pool (a stale socket may fail: retry)
  bool recv_armed = false;      // a receive is in flight (also while idle in the pool)
  bool buf_lent = false;        // buf is the shard's upstream ring buffer buf_bid
  bool buf_pinned = false;      // a downstream send reads buf (counted in ops): it stays until that completes
  uint16_t buf_bid = 0;
  downstream_conn* owner = nullptr;
  // The exchange whose request bytes (its `in` and `up_head`) the send in
  // flight reads; that exchange's connection counts the send in its ops
  // too, and neither moves nor frees those bytes until the completion.
  downstream_conn* send_for = nullptr;
  op<upstream_conn> connect_op, send_op, recv_op;
  sockaddr_storage peer{};      // the backend's address, read by the connect SQE
  socklen_t peer_len = 0;
  list_hook<upstream_conn> pool_hook;
  // Response bytes (head, and body on the copy path). Only while the
  // connection holds bytes: a receive with nothing held takes a buffer from
  // the shard's upstream ring when data comes (an idle stream or pooled
  // connection holds none); the buffer goes back once its bytes are sent.
  // Its own allocation only when the ring was empty.
  byte_buf buf;
};

// What the scan of a streamed response saw (for billing and audit).
struct stream_facts {
  uint32_t events = 0;
  uint32_t content_events = 0;
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  bool done = false;     // data: [DONE]
  bool error = false;    // data: {"error": ...}
  uint8_t finish_reason_len = 0;
  char finish_reason[23] = {};
};

// What an exchange does once the upstream send still reading its request
// bytes has completed (see downstream_conn::up_send_inflight).
enum class after_upstream_send : uint8_t {
  nothing,
  next_request,
  retry,              // decided (a 502/503 answer): start the next attempt
  retry_unless_sent,  // a failed attempt: retry only if the send had not written the whole request
};

enum class conn_state : uint8_t {
  idle,          // keep-alive, waiting for the next request's first byte
  head,          // reading the request head
  body,          // reading the request body
  upstream,      // request forwarded, waiting for the response head
  streaming,     // response body flowing upstream -> downstream
  local,         // sending an answer sluice made itself
  quota_wait,    // admitted once peers lend quota (a borrow round is out)
  closing,
};

// Shard-local. One per downstream connection; from accept until both sides close.
struct downstream_conn {
  shard_server* srv = nullptr;
  int fd = -1;
  int ops = 0;
  conn_state state = conn_state::idle;
  receive_gate recv;
  bool peer_eof = false;
  bool close_after_send = false;
  bool send_busy = false;
  bool expect_sent = false;
  bool response_started = false;   // a byte of the response reached the socket
  bool is_models = false;          // GET /v1/models: answered by sluice
  bool local_pending = false;      // a local answer waits for the send in flight
  bool request_open = false;       // a request is accounted (audit + metrics) until end_request()
  bool head_ok = false;            // `head` holds a parsed head (its views are valid)
  bool cancelled = false;          // the client went away mid-exchange
  bool is_stream = false;
  bool inflight_counted = false;
  deadline_kind deadline = deadline_kind::none;
  uint64_t deadline_ms = 0;
  uint64_t request_start_ms = 0;
  uint64_t body_start_ms = 0;
  uint64_t total_deadline_ms = 0;  // upstream.total_timeout_ms for this exchange; 0 = none
  op<downstream_conn> recv_op, send_op;
  list_hook<downstream_conn> all_hook;

  char peer_ip[48] = {};
  uint8_t peer_ip_len = 0;

  // Request bytes: [req_start, in.len) is the current request and anything
  // pipelined after it. Decoded chunked bodies are compacted in place.
  byte_buf in;
  byte_buf stash;                // pipelined bytes that arrived while busy
  uint32_t req_start = 0;
  uint32_t body_begin = 0;       // offset of the body (after the head)
  uint32_t body_len = 0;         // body bytes ready at body_begin
  uint32_t raw_end = 0;          // offset just past the request's raw bytes
  uint32_t chunk_raw_pos = 0;    // chunked: first raw byte not yet decoded
  http::request_parser parser;
  http::request_head head;

  // The exchange in flight.
  openai::endpoint endpoint = openai::endpoint::chat_completions;
  uint32_t group = metrics::none;  // index into cfg().groups once the model matched
  route::route_key_result route_key;
  uint64_t tried_mask = 0;         // ring positions already tried (retries)
  uint32_t route_position = 0;
  quota::reservation held;         // live from admission to settle()
  uint64_t quota_cost = 0;         // reserved weighted tokens
  uint64_t input_estimate = 0;
  uint64_t quota_charged = 0;
  uint64_t wait_since_ms = 0;     // quota_wait: since when (0: not waiting)
  uint64_t wait_until_ms = 0;     // quota_wait on a short retry time: try again then
  list_hook<downstream_conn> wait_hook;   // in the shard's quota waiters
  int32_t key_index = -1;
  upstream_conn* up = nullptr;
  // An upstream send reads this connection's request bytes (counted in ops).
  bool up_send_inflight = false;
  // The attempt's whole request reached the backend's socket: from then on
  // the backend may have started it, and a failure is never retried.
  bool up_request_sent = false;
  after_upstream_send after_up_send = after_upstream_send::nothing;
  // The upstream connection whose receive buffer the downstream send in
  // flight reads (its buf_pinned): released at that send's completion.
  upstream_conn* send_pin = nullptr;
  uint8_t attempts = 0;
  uint16_t status = 0;
  char request_id[64] = {};
  char scratch[256] = {};
  char model[128] = {};            // the client's model name, for audit (truncated)
  uint8_t model_len = 0;
  uint32_t backend_used = metrics::none;
  uint64_t start_wall_ms = 0;
  uint64_t first_token_ms = 0;     // monotonic; 0 = none yet
  std::string_view error_code;     // static strings only
  byte_buf resp_body;              // non-stream response body, for usage (bounded)
  bool resp_body_overflow = false;
  uint8_t request_id_len = 0;
  uint32_t backend_cursor = 0;

  // Outgoing bytes: `out` holds heads and local answers; iov points at out
  // and/or upstream buffer bytes. Nothing else touches those while send_busy.
  byte_buf out;        // downstream response head / local answers
  byte_buf up_head;    // upstream request head
  iovec send_iov[4] = {};
  uint8_t send_iov_count = 0;
  iovec up_iov[6] = {};          // [1..]: the body, with its byte edits (none: joined to up_head)
  uint8_t up_iov_count = 0;
  iovec up_msg_iov[8] = {};      // what the upstream send sends (advanced on short sends)
  uint8_t up_msg_iov_count = 0;
  uint32_t host_offset = 0;      // where the backend's host goes in up_head
  uint32_t host_len = 0;         // the host now written there
  uint64_t up_body_len = 0;
  msghdr up_msg = {};
  msghdr down_msg = {};

  // Response scanning.
  http::response_parser rparser;
  http::response_head rhead;
  bool response_complete = false;
  bool upstream_head = false;     // rhead holds this request's response head
  bool up_reusable = false;
  std::unique_ptr<http::sse_scanner> sse;
  stream_facts facts;
  uint32_t fwd_from = 0;          // copy path: first byte of up->buf not yet sent
  uint32_t send_end = 0;          // copy path: end of the bytes being sent
  bool cut_usage = false;         // sluice asked for usage: cut that chunk from the stream
  bool hold_error = false;        // a backend error answer is being read whole, to be reshaped
  bool usage_in_batch = false;    // the usage-only event was seen, its chunk not yet cut: in this batch or held at its front
  const char* usage_event_at = nullptr;  // that event's data in up->buf, when the scan saw it in place


  explicit downstream_conn(const http::limits& l) : parser(l) {}
};

struct backend_state {
  const config::backend_config* cfg = nullptr;
  upstream_conn* idle_head = nullptr;
  uint32_t idle_count = 0;
  uint32_t inflight = 0;
  uint32_t open = 0;            // connections to it, pooled or busy (upstream.connections_max)
};

// Shard-local; created and run by the shard thread.
class shard_server {
 public:
  shard_server(uint32_t index, std::shared_ptr<const config::config> cfg, shard::reactor& r, int listen_fd,
               shard_stats& stats, metrics::shard_metrics& m, const shard_mesh& mesh);
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

  // --- used by the connection code (downstream.cpp, upstream.cpp) ---
  shard::reactor& ring() noexcept { return _r; }
  const config::config& cfg() const noexcept { return *_cfg; }
  shard_stats& stats() noexcept { return _stats; }
  uint64_t now_ms() const noexcept { return _r.now_ms(); }

 private:
  friend struct downstream_ops;
  friend struct upstream_ops;

  // accept
  void submit_accept() noexcept;
  static void on_accept(shard::completion* c, const io_uring_cqe* cqe);
  void on_accept_cqe(const io_uring_cqe* cqe) noexcept;

  // downstream (downstream.cpp)
  void submit_recv(downstream_conn* d) noexcept;
  static void on_recv(shard::completion* c, const io_uring_cqe* cqe);
  void on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept;
  void process_input(downstream_conn* d) noexcept;
  void start_request(downstream_conn* d) noexcept;
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
  void close_downstream(downstream_conn* d) noexcept;
  void maybe_free(downstream_conn* d) noexcept;
  void compact_input(downstream_conn* d) noexcept;
  void set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept;
  void on_deadline(downstream_conn* d) noexcept;
  // Returns: the index of the presented key in cfg().keys, or -1.
  int32_t authenticate(const http::request_head& h) noexcept;
  void make_request_id(downstream_conn* d) noexcept;
  void open_request(downstream_conn* d) noexcept;
  // Quota (quota.cpp).
  void admit(downstream_conn* d) noexcept;
  void answer_rate_limited(downstream_conn* d, const quota::decision& q) noexcept;
  size_t write_rate_headers(downstream_conn* d, char* out, size_t cap) noexcept;
  void settle_quota(downstream_conn* d, uint64_t prompt, uint64_t completion) noexcept;
  void unpark(downstream_conn* d) noexcept;
  void append_waiter(downstream_conn* d) noexcept;
  // Empties the waiter list and returns its old head; the chain stays
  // linked through wait_hook.next for the caller's walk.
  downstream_conn* detach_waiters() noexcept;
  void pump_mesh(uint64_t now_ms) noexcept;
  // Passive health: failures always, a success only after a failure (that
  // is all the consecutive-failure count needs). Full queue: dropped.
  void report_outcome(uint32_t backend, bool failure) noexcept;
  void end_request(downstream_conn* d) noexcept;

  // upstream (upstream.cpp)
  void forward(downstream_conn* d, const openai::request_fields& f) noexcept;
  void start_attempt(downstream_conn* d) noexcept;
  bool build_upstream_request(downstream_conn* d, const openai::request_fields& f) noexcept;
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
  // Parses u->buf[parse_from, len) and sends [fwd_from, send_end) (with
  // the response head first when with_head).
  void relay(downstream_conn* d, uint32_t parse_from, bool with_head) noexcept;
  void after_body_sent(downstream_conn* d) noexcept;
  // A held backend error (hold_error), read whole: answered in OpenAI's shape.
  void answer_backend_error(downstream_conn* d) noexcept;
  void abort_exchange(downstream_conn* d) noexcept;
  static void on_body_data(void* ctx, const char* data, size_t len);
  static void on_sse_event(void* ctx, const http::sse_event& ev);

  uint32_t _index;
  std::shared_ptr<const config::config> _cfg;
  shard::reactor& _r;
  shard_stats& _stats;
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
  uint64_t _last_sweep_ms = 0;
  // Verified bearer keys (see authenticate()). 64 x 128 bytes per shard.
  struct auth_cache_entry {
    uint64_t tag = 0;
    int32_t key_index = -1;
    uint8_t key_len = 0;
    char key[115] = {};
  };
  static constexpr size_t k_auth_cache_entries = 64;
  auth_cache_entry _auth_cache[k_auth_cache_entries];
  bool _draining = false;
  uint64_t _drain_deadline_ms = 0;
  // The loop polls before sleeping (server.idle_poll_us) only while at most
  // this many requests are open on the shard.
  static constexpr uint64_t k_poll_open_max = 2;
};

}  // namespace sluice::proxy
