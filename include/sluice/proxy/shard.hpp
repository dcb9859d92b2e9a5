#pragma once
// proxy: the entry point of a shard thread, and what that thread shares with
// the control thread. The control module (control::gateway) binds the
// listeners, builds the mesh and one shard_link per shard, and starts a
// thread on run_shard() for each; from then on the two threads meet only in
// the fields of shard_link, each written by one side, as marked below.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/tls/tls.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/quota/budget.hpp"
#include "sluice/quota/shard_slices.hpp"
#include "sluice/route/table.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/shard/spsc_queue.hpp"

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

// The response store's entry ([responses] store, kept by the control
// thread: control::response_store), as it travels between a shard and the
// control thread on the heap: a put's record is the control thread's once
// pushed; a get's answer is the shard's once popped.
struct store_record {
  std::string id;        // "resp_" + the request id
  std::string key_id;    // the key that made it: no other key reads or deletes it
  // The conversation as Responses input items, comma-separated JSON objects.
  // A put: up to this response's input (the store adds its output items).
  std::string items;
  std::string response;  // the response object, as GET answers it
  // A route (route_put, route_get's answer): the URL of the backend that
  // made response `id` on a group that speaks Responses natively, where
  // previous_response_id must reach that backend again.
  std::string backend;
};

// Shard -> control: one operation on the store. get / remove name the id
// and the asking key in `record` (id, key_id) and are answered with `seq`;
// route_put and route_get do the same for the routes of native groups'
// responses (kept whatever [responses] store says: local unless it says
// "redis").
struct store_op {
  enum class kind : uint8_t { get, put, remove, route_put, route_get } what = kind::get;
  uint64_t seq = 0;
  store_record* record = nullptr;
};
using store_queue = shard::spsc_queue<store_op, 1024>;

// The shards' queues to each other, owned by the control thread's gateway
// (which outlives every shard thread); each shard holds this view of them.
struct shard_mesh {
  uint32_t count = 1;
  mesh_queue* const* queues = nullptr;           // [from * count + to]; diagonal unused
  std::atomic<shard::reactor*> const* reactors = nullptr;  // by shard; null until it runs
  outcome_queue* to_control = nullptr;                     // this shard's passive health reports
  std::atomic<int64_t>* quota_levels = nullptr;            // see quota::slices_options::published
  uint32_t quota_keys_max = 0;                             // keys per shard in quota_levels (reload room)
  quota::budget_board* budgets = nullptr;                  // budget counters (this shard's cells) and flags
  // [responses] store: this shard's operations, and the control thread's
  // reactor to wake for them (null until it runs).
  store_queue* to_store = nullptr;
  std::atomic<shard::reactor*> const* store_reactor = nullptr;
  // [cluster] mode: this shard's queues to and from the lender (peer
  // `count` of the quota slices; the control thread), and the control
  // thread's reactor to wake (null until it runs). Null: no lender.
  mesh_queue* to_lender = nullptr;
  mesh_queue* from_lender = nullptr;
  std::atomic<shard::reactor*> const* lender_reactor = nullptr;
  mesh_queue* queue(uint32_t from, uint32_t to) const noexcept { return queues[from * count + to]; }
};

// Control -> shard. Small and trivially copyable (spsc_queue's rule).
struct control_message {
  // handover: a drain whose listening sockets live on in the process that
  // took over (SIGUSR2): accepting stops without shutting them down.
  // store: the answer to the store operation `store_seq`: `record` (the
  // shard's to delete), or null when the store has no such response.
  enum class kind : uint8_t { drain, reopen_audit, route, reload, handover, store } what = kind::drain;
  uint32_t drain_ms = 0;  // drain, handover
  route::message r;  // kind::route
  // kind::reload: a heap copy of the snapshot's owner, taken over (and
  // deleted) by the shard; one left in the queue when the shard stopped is
  // the control thread's to delete.
  std::shared_ptr<const config::config>* snapshot = nullptr;
  // reload: the TLS listener's context for new connections (null: none, or
  // unchanged); owned like `snapshot`.
  std::shared_ptr<const tls::context>* tls = nullptr;
  uint64_t store_seq = 0;             // store
  store_record* record = nullptr;     // store; owned like `snapshot`
  bool store_unavailable = false;     // store: the store could not be asked (Redis away): not "not found"
};
// 64 control messages: a full inbox means the shard is far behind, and the
// control thread then waits for it (control ops are rare and cold).
using control_queue = shard::spsc_queue<control_message, 64>;

// Shared by the control thread and one shard thread. One per shard; made by
// the control thread before the shard thread starts and freed after it is
// joined, so either side may hold a reference for the thread's whole life.
struct shard_link {
  // Set by the control thread before the thread starts; read-only after.
  uint32_t index = 0;
  int cpu = -1;  // the CPU it is pinned to; -1: not pinned
  // Not pinned ([server] pin_shards = false): the CPUs it may run on, the
  // shards' whole list (empty: the process's affinity mask, inherited).
  std::vector<int> cpus_allowed;
  std::shared_ptr<const config::config> cfg;  // the start-up snapshot
  metrics::shard_metrics* metrics = nullptr;  // this shard's block (single writer: the shard)
  shard_mesh mesh;
  // Handed over: the control thread binds it, the shard takes it (and sets
  // -1) as it starts; the control thread does not touch it after the start.
  int listen_fd = -1;
  int tls_listen_fd = -1;                      // the TLS listener's socket, or -1; handed over likewise
  std::shared_ptr<const tls::context> tls;     // its start-up context

  // Control -> shard: the control thread pushes, the shard pops. `posted`
  // is written by the control thread only, `applied` by the shard only
  // (release: a reader that sees the count sees what the messages did);
  // the control thread compares them to tell when a shard has caught up.
  control_queue inbox;
  uint64_t posted = 0;
  std::atomic<uint64_t> applied{0};

  // Shard -> control: the shard pushes, the control thread pops.
  outcome_queue outcomes;
  store_queue store_ops;

  // Written by the shard thread, read by the control thread. `reactor` is
  // set before `ready` (whose release publishes it) and stays null when the
  // start failed. The reactor itself is kept until the link goes, after
  // the thread is joined: the control thread and peer shards may still
  // wake it while the shard leaves its loop.
  shard::reactor* reactor = nullptr;
  std::unique_ptr<shard::reactor> owned_reactor;
  std::atomic<bool> ready{false};    // started, or failed to (then `failed`)
  std::atomic<bool> failed{false};
  std::atomic<bool> stopped{false};  // left the loop, audit flushed; takes no more messages
};

// Shard thread: the whole life of one shard. Names and pins the thread,
// creates its reactor and shard server on `link`'s config and listener,
// says `ready`, then runs the loop, taking control messages between
// completions, until a drain has finished; flushes the audit log and says
// `stopped`. A start-up failure (no ring, no buffer ring, no audit file) is
// logged where it happens and said through `failed`.
void run_shard(shard_link& link) noexcept;

}  // namespace sluice::proxy
