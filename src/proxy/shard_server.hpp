#pragma once
// proxy (private): one shard's server, in parts that are objects of their
// own, each in its own library (docs/architecture.md §2a):
//
//   src/client    client_transport (+ transport_send.cpp,
//                 transport_tls.cpp): the listeners and the client
//                 connections -- accept, TLS, receive, send, deadlines,
//                 the sniff of the first bytes; on it the protocols:
//                 h1_codec (+ h1_send.cpp), HTTP/1.1; h2_codec, an
//                 nghttp2 session, each stream an exchange
//   src/proxy     shard_server: the exchanges' policy (policy.cpp,
//                 admission.cpp, fair_admission.cpp, response_state.cpp,
//                 embed_router.cpp: dispatch, models, auth, quota and fair
//                 admission, accounting and audit, the store's messages,
//                 the shard mesh) and the shard's life (this file)
//   src/adapters  openai_http (+ relay.cpp, relay_scan.cpp,
//                 rendered_relay.cpp): OpenAI over HTTP/1.1 -- pools, the
//                 forwarded request, the response on its way back;
//                 anthropic_http (+ anthropic_relay.cpp) on openai_http's
//                 transport; triton_grpc (+ triton_reply.cpp): KServe v2
//                 gRPC, an nghttp2 client session per connection
//
// The policy reaches the client side only through client_codec and the
// backend side only through backend_adapter; the codecs and adapters reach
// the policy only through exchange_policy, and the adapter reaches the
// client only through client_codec (src/exchange).
//
// run_shard() (shard_main.cpp) makes and runs one on its shard thread; the
// mesh's types and what the shard shares with the control thread are in
// sluice/proxy/shard.hpp.
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

#include "exchange.hpp"
#include "exchange_policy.hpp"
#include "sluice/dialect/request.hpp"
#include "client_transport.hpp"
#include "h1_codec.hpp"
#include "h2_codec.hpp"
#include "anthropic_http.hpp"
#include "embed_router.hpp"
#include "openai_http.hpp"
#include "triton_grpc.hpp"
#include "shard_context.hpp"
#include "sluice/audit/writer.hpp"
#include "sluice/auth/key_verifier.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/http/request.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/net/buffer_ring.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/proxy/shard.hpp"
#include "sluice/quota/shard_slices.hpp"
#include "sluice/route/table.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/shard/spsc_queue.hpp"
#include "sluice/shard/timer_wheel.hpp"

namespace sluice::proxy {

// Shard-local; created and run by the shard thread. The exchanges' policy
// (exchange_policy) and the composition root of the shard's parts.
class shard_server final : public exchange_policy {
 public:
  shard_server(uint32_t index, std::shared_ptr<const config::config> cfg, shard::reactor& r, int listen_fd,
               int tls_listen_fd, metrics::shard_metrics& m, const shard_mesh& mesh);
  ~shard_server();
  shard_server(const shard_server&) = delete;
  shard_server& operator=(const shard_server&) = delete;

  bool init() noexcept;
  void on_iteration(uint64_t now_ms) noexcept;
  // Before each iteration's completions: the peers' messages (see
  // reactor::hooks::before_completions), so a request is routed with every
  // load report pushed before it arrived.
  void before_completions(uint64_t now_ms) noexcept { take_mesh_messages(now_ms); }
  // `handover`: the listeners live on in another process (SIGUSR2); see
  // client_transport::begin_drain.
  void begin_drain(uint64_t deadline_ms, bool handover = false) noexcept;
  void reopen_audit() noexcept;
  void set_tls_context(std::shared_ptr<const tls::context> c) noexcept { _client.set_tls_context(std::move(c)); }
  void apply_route(const route::message& m) noexcept { _routes->apply(m); }
  // SIGHUP: `next` (reconciled with the running snapshot, so every index a
  // connection holds keeps its meaning) becomes this shard's snapshot. In-
  // flight requests carry on; new ones route by the new rings. Cold path.
  void reload(std::shared_ptr<const config::config> next);
  // Flushes and closes the audit log (shutdown); runs the reactor until done.
  void close_audit() noexcept;
  // Drained: no connection left, no accept in flight (a connection the
  // kernel handed to an accept that has not completed yet is served too),
  // and no embeddings call the kernel still holds buffers of (they end by
  // their timeout, or at the cut).
  bool drained() const noexcept {
    return _draining && _client.connection_count() == 0 && !_client.accepting() && _embed.idle();
  }
  bool draining() const noexcept { return _draining; }

  shard::reactor& ring() noexcept { return _r; }
  const config::config& cfg() const noexcept { return *_cfg; }
  uint64_t now_ms() const noexcept { return _r.now_ms(); }

  // --- the exchange's policy, as its codec and adapter call it ---------------
  // Accounting (audit + metrics) from the head's first byte until
  // end_request().
  void open_request(exchange& x) noexcept override;
  void end_request(exchange& x) noexcept override;
  void make_request_id(exchange& x) noexcept override;
  // A parsed head: the endpoint by path and method, and the bearer key,
  // before any body is read (a request sluice refuses never makes it send
  // 100 Continue or buffer 8 MiB). Returns: whether the request goes on;
  // else it was answered (404, 405, 401).
  bool accept_head(exchange& x, bool has_body) noexcept override;
  // The whole request is in: answered here, or admitted and sent on.
  void dispatch(exchange& x) noexcept override;
  // From the body's parse on: model -> group (an embeddings call may park
  // the exchange and call this again when it ends), limits, admission.
  void route_request(exchange& x) noexcept;
  // A Responses or Messages request written as the canonical chat body
  // (x.req.body). Returns: false when it answered the client (a 400).
  bool translate_request(exchange& x, std::string_view body) noexcept;
  // The group speaks the client's dialect: its bytes will pass (x.req.native),
  // once checked to read one way only. Returns: false when it answered (400).
  bool pass_native(exchange& x, const config::group_config& grp) noexcept;
  // [responses] store (response_state.cpp): the control thread's answer to
  // operation `seq` (`record`: this shard's, null when not found;
  // `unavailable`: the store could not be asked).
  void on_store_answer(uint64_t seq, store_record* record, bool unavailable = false) noexcept;
  // A translated Responses reply rendered whole (x.req.store_put): sent to
  // the store to keep, once (fire and forget), before its last bytes go out.
  void keep_response(exchange& x) noexcept override;
  // A native Responses reply of `backend` (x.req.keep_route) named
  // `response_id`: the backend kept by it (fire and forget, once), before
  // the reply's last bytes go out, so that previous_response_id reaches it.
  void keep_route(exchange& x, uint32_t backend, std::string_view response_id) noexcept override;
  // The client went away mid-exchange: cancelled, audited 499.
  void cancel(exchange& x) noexcept override;
  // A parked exchange leaves the waiter list (its client side closes).
  void unpark(exchange& x) noexcept override;
  // Fair admission: a relayed batch of a request counted under it moves
  // its key's virtual counter by the output so far (fair_admission.cpp).
  void fair_progress(exchange& x) noexcept override;
  size_t write_rate_headers(const exchange& x, char* out, size_t cap) noexcept;
  // write_rate_headers() and sluice's other response fields (x-sluice-group).
  size_t write_response_headers(const exchange& x, char* out, size_t cap) noexcept override;
  // Passive health: failures always, a success only after a failure (that
  // is all the consecutive-failure count needs). Full queue: dropped.
  void report_outcome(uint32_t backend, bool failure) noexcept override;
  // The backend adapter a new exchange starts with (until its model named
  // its group), and the one of a group's protocol.
  backend_adapter* adapter() noexcept override { return &_openai; }
  backend_adapter* adapter_for(config::backend_protocol p) noexcept {
    switch (p) {
      case config::backend_protocol::anthropic: return &_anthropic;
      case config::backend_protocol::triton: return &_triton;
      case config::backend_protocol::openai: break;
    }
    return &_openai;
  }

 private:
  void answer_models(exchange& x) noexcept;
  // [responses] store (response_state.cpp): posts a get or remove of
  // x.mem->store_id for x's key and parks x until the answer (false: not
  // posted, x answered 503); GET / DELETE /v1/responses/{id} answered from
  // it; a finished translated response kept (fire and forget).
  bool ask_store(exchange& x, store_op::kind k) noexcept;
  void answer_store_call(exchange& x, const store_record* r) noexcept;
  // exchange: admission (admission.cpp)
  void admit(exchange& x) noexcept;
  void answer_rate_limited(exchange& x, const quota::decision& q) noexcept;
  void settle_quota(exchange& x, uint64_t prompt, uint64_t completion) noexcept;
  // Budgets: a 429 insufficient_quota for the budgets whose bits are set;
  // the tokens (and spend) of a finished request onto this shard's cells;
  // the x-budget-* headers.
  void answer_budget_exhausted(exchange& x, uint8_t key_out, uint8_t group_out) noexcept;
  void count_budget(const exchange& x, uint64_t prompt, uint64_t completion) noexcept;
  size_t write_budget_headers(const exchange& x, char* out, size_t cap) noexcept;
  // Fair admission (fair_admission.cpp): after quota, a fair group's
  // request takes a slot or queues; each loop turn releases and times out
  // waiters; the end corrects the key's counter by the real usage.
  void reload_admission();
  void admit_to_slot(exchange& x) noexcept;
  void start_on_slot(exchange& x, quota::fair_queue& q, uint8_t level) noexcept;
  void release_queued(uint32_t group, quota::fair_queue& q, uint64_t now_ms) noexcept;
  void pump_admission(uint64_t now_ms) noexcept;
  void fair_end(exchange& x, uint64_t prompt, uint64_t completion) noexcept;
  void answer_queue_refused(exchange& x, bool timeout) noexcept;
  void append_waiter(exchange& x) noexcept;
  // Empties the waiter list and returns its old head; the chain stays
  // linked through wait_hook.next for the caller's walk.
  exchange* detach_waiters() noexcept;
  // The walk's next waiter, taken off the detached chain (see unpark).
  exchange* take_walked(exchange* w) noexcept;
  // Once per loop turn, after its completions: the quota tick, parked
  // requests whose time came, and this shard's messages (the peers' were
  // taken in before the completions).
  void pump_mesh(uint64_t now_ms) noexcept;
  void take_mesh_messages(uint64_t now_ms) noexcept;
  // A quota message from a peer or the lender; a completed borrow round
  // re-admits the key's waiters.
  void apply_quota_message(const quota::message& q, uint64_t now_ms) noexcept;
  void retry_waiters(uint64_t now_ms) noexcept;
  void send_quota_messages() noexcept;
  // `idle`: the shard's last request is ending; its reports go now.
  void send_load_reports(uint64_t now_ms, bool idle = false) noexcept;

  shard_context _ctx;
  // Aliases of the context's members, by the names the code reads.
  std::shared_ptr<const config::config>& _cfg = _ctx.cfg;
  shard::reactor& _r = _ctx.r;
  metrics::shard_metrics& _metrics = _ctx.metrics;
  std::unique_ptr<route::table>& _routes = _ctx.routes;
  bool& _draining = _ctx.draining;
  uint32_t _index;
  shard_mesh _mesh;
  std::unique_ptr<audit::writer> _audit;
  quota::shard_slices _quota;
  quota::budget_board& _budgets;  // the gateway's; this shard writes only its own cells
  exchange* _waiters = nullptr;   // parked for quota, oldest first
  exchange* _waiters_tail = nullptr;
  exchange* _walk_next = nullptr;  // a walk of detached waiters: the next one (unpark advances it)
  exchange* _store_waiters = nullptr;  // parked on a store answer (wait_hook, waiting_in::store)
  uint64_t _store_seq = 0;
  // Fair admission: each fair group's queue (null: fcfs), what the peers
  // were last told it queues, and a load report owed at once (a borrowed
  // slot).
  std::vector<std::unique_ptr<quota::fair_queue>> _fair;
  std::vector<uint32_t> _queued_reported;
  bool _report_now = false;
  uint64_t _last_served_report_ms = 0;
  uint64_t _fair_seen_version = 0;        // _routes->local_version() at the last pump_admission
  bool _wake_peers_after_report = false;  // a freed slot a peer waits for: wake them once reported
  uint64_t _prng = 0;
  uint64_t _last_report_ms = 0;
  uint64_t _last_quota_tick_ms = 0;
  std::vector<uint32_t> _reported;       // last load reported per backend (cold-sized)
  uint64_t _reported_version = ~uint64_t{0};  // _routes->local_version() at the last report
  std::vector<uint8_t> _last_failed;     // last outcome reported per backend was a failure
  openai::request_reader _reader;
  dialect::request_translator _translator;
  uint64_t _request_seq = 0;
  uint64_t _id_seed = 0;
  auth::key_verifier _keys;             // bearer keys verified on this shard
  // Embeddings mode: the calls of pending decisions (declared before the
  // codecs: a connection closed as they go unparks into it).
  embed_router _embed;
  // The parts: the client codec and the backend adapter (each refers to
  // the other two; constructed after the context, destroyed before it).
  openai_http _openai;
  anthropic_http _anthropic;    // on _openai's HTTP/1.1 transport
  triton_grpc _triton;
  client_transport _client;     // the client connections, under either protocol
  h1_codec _h1;
  h2_codec _h2;
  // The loop polls before sleeping (server.idle_poll_us) only while at most
  // this many requests are open on the shard, over at most this many client
  // connections.
  static constexpr uint64_t k_poll_open_max = 2;
  static constexpr uint32_t k_poll_connections_max = 2;
  // The loop's waits hold out for a batch of completions
  // (server.batch_wait_us) while at least this many requests are open, for
  // as many completions as there are open requests, at most k_batch_max.
  static constexpr uint64_t k_batch_open_min = 8;
  static constexpr uint64_t k_batch_max = 64;
};

}  // namespace sluice::proxy
