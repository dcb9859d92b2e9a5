#pragma once
// control: the shard set, seen from the control thread. Starts one shard per
// CPU (a thread pinned to it, or free on the list with [server] pin_shards =
// false, running proxy::run_shard: its own reactor, listener
// (SO_REUSEPORT), buffer ring, pools and counters), posts control messages to
// them (drain, reload, health, audit reopen), tells when they have taken
// them, and joins them. It reaches a shard only through its proxy::shard_link:
// SPSC queues plus a ring wake-up.
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/control/inherit.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/quota/budget.hpp"
#include "sluice/quota/shard_slices.hpp"
#include "sluice/route/table.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/tls/tls.hpp"

namespace sluice::proxy {
struct control_message;
struct store_op;
struct store_record;
}  // namespace sluice::proxy

namespace sluice::control {

// Control-thread-local. One per process, from start-up until every shard
// thread is joined.
class gateway {
 public:
  // Binds the listeners (resolving port 0 once, so every shard shares the
  // port), starts one shard thread per cpu and waits until each has its
  // reactor running. Throws std::runtime_error with the cause on failure
  // (start-up is the config/main boundary).
  // `budgets`: the board the shards count budgets on and read their flags
  // from (made and loaded by the caller before any shard runs, sized for
  // cpus and config::capacity_for(cfg); it must outlive the gateway).
  // Null: the gateway makes one of its own (no budget is kept).
  // `inherited`: listening sockets handed over at start (SIGUSR2, systemd),
  // taken before any is bound (null: bind them all).
  static std::unique_ptr<gateway> start(std::shared_ptr<const config::config> cfg, const std::vector<int>& cpus,
                                        quota::budget_board* budgets = nullptr, listener_pool* inherited = nullptr);
  ~gateway();
  gateway(const gateway&) = delete;
  gateway& operator=(const gateway&) = delete;

  uint16_t port() const noexcept { return _port; }
  uint16_t tls_port() const noexcept { return _tls_port; }  // 0: no TLS listener
  // The listening sockets' fds by shard (TLS: empty without one), as the
  // shards hold them until a drain: what SIGUSR2 passes on. Numbers only;
  // the shards own them.
  const std::vector<int>& listen_fds() const noexcept { return _listen_fds; }
  const std::vector<int>& tls_listen_fds() const noexcept { return _tls_listen_fds; }
  size_t shard_count() const noexcept { return _shards.size(); }
  const metrics::registry& metrics() const noexcept { return *_metrics; }
  metrics::registry& metrics() noexcept { return *_metrics; }
  const quota::budget_board& budgets() const noexcept { return *_budgets; }
  // Any thread: a key's quota level (tokens: r = 0, requests: r = 1) summed
  // over the shards as they last published it (what the rate-limit headers
  // report as remaining).
  int64_t quota_level(uint32_t key, int r) const noexcept;

  // SIGHUP: `next` must come from config::reconcile() against the running
  // snapshot, within capacity(). Every shard swaps to it between two
  // completions (in-flight requests carry on); the metrics get its names.
  // With a TLS listener, its certificate and key are read anew (new
  // connections get the new pair; a pair that does not load keeps the old
  // one, and the error is logged), and the session ticket key rotates.
  void reload(std::shared_ptr<const config::config> next);
  const config::reload_capacity& capacity() const noexcept { return _capacity; }
  // Control thread: reload outcomes, for /metrics.
  void count_reload(bool ok) noexcept { ++(ok ? _reloads_ok : _reloads_failed); _last_reload_ok = ok; }
  uint64_t reloads_ok() const noexcept { return _reloads_ok; }
  uint64_t reloads_failed() const noexcept { return _reloads_failed; }
  bool last_reload_ok() const noexcept { return _last_reload_ok; }

  // SIGUSR1: every shard reopens the audit log (after a rename by logrotate).
  void reopen_audit() noexcept;

  // Control thread: a ring-rebalancing message (health) to every shard.
  void broadcast(const route::message& m) noexcept;
  // Control thread: every shard's count of control messages posted so far.
  // Taken right after posting a reload or a drain; settled() then says when
  // every shard has taken it, so what the operator is told has happened
  // holds for the next request on any shard, and the control thread (which
  // serves /metrics and the signals) never waits for a shard.
  struct settle_mark {
    std::vector<uint64_t> posted;  // by shard index
  };
  settle_mark mark() const;
  // Returns: the index of a running shard that has not yet taken every
  // control message posted before `m`, or -1 when none (a stopped shard
  // takes nothing more: it counts as settled).
  int behind(const settle_mark& m) const noexcept;
  bool settled(const settle_mark& m) const noexcept { return behind(m) < 0; }
  // Control thread: the shards' passive reports of upstream outcomes
  // (failure = connect error, timeout, 5xx), in order per shard.
  void drain_outcomes(void (*fn)(void* ctx, uint32_t backend, bool failure), void* ctx) noexcept;

  // [cluster] mode (cfg.cluster.enabled() at start): the mesh has a lender
  // seat, peer shard_count() of every shard's quota slices, whose messages
  // the control thread moves (control::cluster_keeper).
  bool lending() const noexcept;
  // Control thread, once its reactor exists: shards wake it when they send
  // the lender something (until then it sees their messages at its tick).
  void set_control_reactor(shard::reactor* r) noexcept;
  // Control thread: every message the shards sent the lender, in order per
  // shard.
  void take_lender_messages(void (*fn)(void* ctx, const quota::message& m), void* ctx) noexcept;
  // Control thread: queues what fits of `msgs` for shard `s` and wakes it.
  // Returns: how many were queued.
  size_t send_from_lender(uint32_t s, std::span<const quota::message> msgs) noexcept;
  // The published quota levels (the lender's row is shard_count()).
  std::atomic<int64_t>* quota_cells() const noexcept;
  uint32_t quota_stride() const noexcept;

  // [responses] store: the control thread, once its reactor exists, is
  // woken when a shard posts a store operation.
  void set_store_reactor(shard::reactor* r) noexcept;
  // Control thread: every store operation the shards posted, in order per
  // shard (the shard's index with it). A put's record becomes the callee's.
  void take_store_ops(void (*fn)(void* ctx, uint32_t shard, const proxy::store_op& op), void* ctx) noexcept;
  // Control thread: the answer to shard `s`'s operation `seq` (`record`
  // null: not found). The record becomes the shard's (deleted here when the
  // shard has stopped). Returns: false when it could not be queued.
  // `unavailable`: the store could not be asked (the shard answers 503).
  bool answer_store(uint32_t s, uint64_t seq, proxy::store_record* record, bool unavailable = false) noexcept;

  // Stop accepting, finish in-flight requests up to drain_ms, then stop.
  void drain(uint32_t drain_ms) noexcept;
  // The same once another process has taken the listening sockets over
  // (SIGUSR2): they are not shut down, only this process's fds closed.
  void hand_over(uint32_t drain_ms) noexcept;
  // Returns: whether every shard thread has left its loop.
  bool stopped() const noexcept;
  // Control thread, each loop turn: control messages that found a shard's
  // inbox full go in now, in order, as far as it has room.
  void flush_control() noexcept;
  void join() noexcept;

 private:
  gateway() = default;
  // start(): the next shard's link, on its listener, before any thread runs.
  // `cpu`: the CPU the shard is pinned to, or -1; then it runs on `cpus`
  // (empty: the process's affinity mask).
  void add_shard(const std::shared_ptr<const config::config>& cfg, int cpu, const std::vector<int>& cpus,
                 int listen_fd, int tls_listen_fd);
  // start(): one thread per shard, then waits until each is ready. Throws
  // (after stopping the others) when one failed to start.
  void launch();
  void post(uint8_t kind, uint32_t drain_ms, const route::message* r = nullptr) noexcept;
  struct shard_slot;
  // Queues `m` for the shard (or its backlog when the inbox is full) and
  // wakes it; never waits. Returns: false when the shard has stopped or
  // its backlog is at k_backlog_max (the caller frees what m owns).
  bool send_control(shard_slot& s, const proxy::control_message& m) noexcept;
  static constexpr size_t k_backlog_max = 65536;

  std::unique_ptr<metrics::registry> _metrics;
  std::unique_ptr<quota::budget_board> _own_budgets;
  quota::budget_board* _budgets = nullptr;
  // The shard mesh (queues by (from, to) and each shard's reactor for
  // wake-ups); defined in gateway.cpp. Outlives every shard thread.
  struct mesh_storage;
  std::unique_ptr<mesh_storage> _mesh;
  // A shard's link, its thread and its control backlog; defined in gateway.cpp.
  std::vector<std::unique_ptr<shard_slot>> _shards;
  uint16_t _port = 0;
  uint16_t _tls_port = 0;
  std::vector<int> _listen_fds, _tls_listen_fds;
  std::shared_ptr<tls::context> _tls;  // the TLS listener's, as of the last load (ticket keys rotate on it)
  config::reload_capacity _capacity;
  uint64_t _reloads_ok = 0, _reloads_failed = 0;
  bool _last_reload_ok = true;
};

// Control thread. A wait, polled by its owner, for every shard to take the
// control messages posted before it began (a drain answered over the admin
// API, a reload's log line). Bounded: a shard stuck in one long loop turn
// must not hold the answer forever; it takes the message at its next turn.
class settle_wait {
 public:
  static constexpr uint32_t k_bound_ms = 1000;

  // `m`: gateway::mark(), taken just after the messages were posted.
  settle_wait(gateway::settle_mark m, uint64_t now_ms) : _mark(std::move(m)), _deadline_ms(now_ms + k_bound_ms) {}
  // Returns: whether the wait is over: every shard took the messages, or
  // k_bound_ms passed (then a warning names the shard still behind). Poll
  // it until it says so, then no more: the warning is logged once.
  bool over(const gateway& g, uint64_t now_ms) const noexcept;

 private:
  gateway::settle_mark _mark;
  uint64_t _deadline_ms;
};

}  // namespace sluice::control
