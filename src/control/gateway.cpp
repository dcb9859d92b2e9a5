// The shard set, run from the control thread: bind the listeners, build the
// mesh, start one thread per shard on proxy::run_shard (which is all the
// shard side: src/proxy/shard_main.cpp), post control messages, tell when the
// shards have taken them, join. A shard is reached only through its
// proxy::shard_link: an SPSC queue plus a ring wake-up.
#include "sluice/control/gateway.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <chrono>
#include <deque>
#include <string_view>
#include <thread>

#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/net/reuseport.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/proxy/shard.hpp"
#include "sluice/shard/cpuset.hpp"

#include "labels.hpp"

namespace sluice::control {

using proxy::control_message;
using proxy::shard_link;

// The queues between every ordered pair of shards, the shards' reactors (for
// wake-ups) and the published quota levels. Made before the first shard
// thread starts, freed after the last is joined.
struct gateway::mesh_storage {
  size_t count;
  uint32_t keys_max;  // quota keys per shard, room for reloads included
  std::vector<std::unique_ptr<proxy::mesh_queue>> queues;
  std::vector<proxy::mesh_queue*> ptrs;
  std::unique_ptr<std::atomic<shard::reactor*>[]> reactors;
  // [(shard * keys + key) * 2 + r], shards 0..n-1 and the lender's row n
  std::unique_ptr<std::atomic<int64_t>[]> quota_levels;
  quota::budget_board* budgets = nullptr;                 // the gateway's; outlives the shards
  // [cluster]: by shard, its queues to and from the lender (empty: none).
  std::vector<std::unique_ptr<proxy::mesh_queue>> to_lender, from_lender;
  std::atomic<shard::reactor*> control_reactor{nullptr};
  std::atomic<shard::reactor*> store_reactor{nullptr};

  mesh_storage(size_t n, size_t keys, bool lender);
  // Shard i's view; `to_control` is its outcome queue.
  proxy::shard_mesh view(size_t i, proxy::outcome_queue& to_control) const noexcept;
};

// A shard's link and the thread that runs it: the thread is joined before
// the slot (and so the link) goes.
struct gateway::shard_slot {
  shard_link link;
  std::thread thread;
  // Control messages that found the shard's inbox full, in order: the
  // control thread never waits for a shard (a stuck one would freeze the
  // admin API, health probes and signals); flush_control() moves them on
  // each loop turn. Nothing jumps ahead of them.
  std::deque<control_message> backlog;
  bool backlog_warned = false;
};

namespace {

metrics::registry::names names_of(const config::config& c) {
  metrics::registry::names names;
  for (const auto& grp : c.groups) names.groups.push_back(grp.name);
  for (uint32_t b = 0; b < c.backends.size(); ++b) {
    names.backends.push_back(c.backends[b].url);
    names.backend_protocols.emplace_back(backend_protocol_label(c, b));
  }
  for (const auto& k : c.keys) names.keys.push_back(k.id);
  return names;
}

void set_port(sockaddr_storage& addr, uint16_t port) noexcept {
  if (addr.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(port);
  }
}

tls::context_options tls_options_of(const config::server_config& s) {
  tls::context_options o;
  o.cert_path = s.tls_cert;
  o.key_path = s.tls_key;
  o.min_version = tls::parse_version(s.tls_min_version).value_or(tls::version::tls1_2);
  o.h2 = s.tls_h2;
  return o;
}

// One listener per shard. With port 0 the first one's port is then the one
// every other shard binds, so they share one SO_REUSEPORT group. A shard
// whose socket was handed over (`pool`, as `role`) takes it; the
// others bind into its group, on its port. Returns: the fds, by shard;
// `port` (0 on entry) is set to the bound port. Throws with the cause.
std::vector<int> bind_listeners(const config::socket_address& la, size_t n, uint16_t& port, listener_pool* pool,
                                std::string_view role) {
  sockaddr_storage addr = la.storage;
  std::vector<int> fds;
  for (size_t i = 0; i < n; ++i) {
    int fd = pool != nullptr ? pool->take(role, la, static_cast<uint32_t>(i)) : -1;
    if (fd >= 0) {
      if (port == 0) {
        port = net::local_port(fd);
        set_port(addr, port);
      }
      fds.push_back(fd);
      continue;
    }
    fd = net::listen_socket(reinterpret_cast<const sockaddr*>(&addr), la.length, true);
    if (fd < 0) {
      for (int f : fds) ::close(f);
      throw std::runtime_error(fmt::format("cannot listen on {}: {}", la.text, std::strerror(-fd)));
    }
    if (port == 0) {
      port = net::local_port(fd);
      set_port(addr, port);
    }
    fds.push_back(fd);
  }
  return fds;
}

// SO_REUSEPORT steering of one listener group (bound by bind_listeners, so
// shard i's listener is index i): each listener says its shard's CPU, and
// the group gets the program mapping the receiving CPU to that index.
// Only when enabled ([server] reuseport_steering) and the shards are
// pinned; no program when another process held the address before these
// listeners joined (its listeners are in the group too, and the indices
// would name them). What it did is logged; never a failed start.
void steer(const std::vector<int>& fds, const std::vector<int>& cpus, const config::socket_address& la, bool shared,
           bool enabled) {
  if (!enabled) return;  // the kernel's hash, as without steering
  if (cpus.empty()) {
    log::info("{}: shards are not pinned; the kernel spreads connections by hash", la.text);
    return;
  }
  for (size_t i = 0; i < fds.size(); ++i) net::set_incoming_cpu(fds[i], cpus[i]);
  if (shared) {
    log::info("{}: another process listens on it too; no steering program (each listener sets SO_INCOMING_CPU, "
              "which recent kernels honour)",
              la.text);
    return;
  }
  const int rc = net::attach_steering(fds[0], cpus);
  if (rc != 0) {
    log::warn("{}: cannot attach the steering program ({}); the kernel spreads connections by hash", la.text,
              std::strerror(-rc));
    return;
  }
  log::info("{}: a connection goes to the shard of the cpu that received it (cpus {})", la.text,
            shard::format_cpu_list(cpus));
}

// Whether a listener of another process holds `la` now (port 0: never).
bool held_elsewhere(const config::socket_address& la) {
  return la.port() != 0 && net::address_in_use(reinterpret_cast<const sockaddr*>(&la.storage), la.length);
}

// Frees what a control message owns (a reload's snapshot and context).
void release_control(control_message& m) noexcept {
  delete m.record;
  m.record = nullptr;
  delete m.snapshot;
  delete m.tls;
  m.snapshot = nullptr;
  m.tls = nullptr;
}

}  // namespace

bool gateway::send_control(shard_slot& s, const control_message& m) noexcept {
  shard_link& l = s.link;
  if (l.stopped.load(std::memory_order_acquire)) return false;
  if (s.backlog.empty() && l.inbox.try_push(m)) {
    ++l.posted;
    if (l.reactor != nullptr) l.reactor->wake();
    return true;
  }
  // Full: the shard is far behind. Kept in order for flush_control(); a
  // backlog this long means the shard takes nothing at all.
  if (s.backlog.size() >= k_backlog_max) {
    log::error("shard {}: takes no control messages ({} waiting); one is dropped", l.index, s.backlog.size());
    return false;
  }
  if (!s.backlog_warned) log::warn("shard {}: its control inbox is full; messages wait for it", l.index);
  s.backlog_warned = true;
  try {
    s.backlog.push_back(m);
  } catch (...) {
    return false;
  }
  if (l.reactor != nullptr) l.reactor->wake();
  return true;
}

void gateway::flush_control() noexcept {
  for (auto& s : _shards) {
    if (s->backlog.empty()) continue;
    shard_link& l = s->link;
    if (l.stopped.load(std::memory_order_acquire)) {
      for (control_message& m : s->backlog) release_control(m);
      s->backlog.clear();
      continue;
    }
    bool moved = false;
    while (!s->backlog.empty() && l.inbox.try_push(s->backlog.front())) {
      s->backlog.pop_front();
      ++l.posted;
      moved = true;
    }
    if (moved && l.reactor != nullptr) l.reactor->wake();
    if (s->backlog.empty() && s->backlog_warned) {
      log::info("shard {}: its control inbox takes messages again", l.index);
      s->backlog_warned = false;
    }
  }
}

gateway::mesh_storage::mesh_storage(size_t n, size_t keys, bool lender)
    : count(n),
      keys_max(static_cast<uint32_t>(keys)),
      queues(n * n),
      ptrs(n * n, nullptr),
      reactors(std::make_unique<std::atomic<shard::reactor*>[]>(n)),
      quota_levels(std::make_unique<std::atomic<int64_t>[]>(std::max<size_t>(1, (n + 1) * keys * 2))) {
  for (size_t i = 0; i < (n + 1) * keys * 2; ++i) quota_levels[i].store(0, std::memory_order_relaxed);
  if (lender) {
    for (size_t i = 0; i < n; ++i) {
      to_lender.push_back(std::make_unique<proxy::mesh_queue>());
      from_lender.push_back(std::make_unique<proxy::mesh_queue>());
    }
  }
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      if (from == to) continue;
      queues[from * n + to] = std::make_unique<proxy::mesh_queue>();
      ptrs[from * n + to] = queues[from * n + to].get();
    }
  }
  for (size_t i = 0; i < n; ++i) reactors[i].store(nullptr);
}

proxy::shard_mesh gateway::mesh_storage::view(size_t i, proxy::outcome_queue& to_control) const noexcept {
  proxy::shard_mesh m;
  if (!to_lender.empty()) {
    m.to_lender = to_lender[i].get();
    m.from_lender = from_lender[i].get();
    m.lender_reactor = &control_reactor;
  }
  m.count = static_cast<uint32_t>(count);
  m.to_control = &to_control;
  m.store_reactor = &store_reactor;
  m.quota_levels = quota_levels.get();
  m.quota_keys_max = keys_max;
  m.budgets = budgets;
  m.queues = ptrs.data();
  m.reactors = reactors.get();
  return m;
}

std::unique_ptr<gateway> gateway::start(std::shared_ptr<const config::config> cfg, const std::vector<int>& cpus,
                                        quota::budget_board* budgets, listener_pool* inherited) {
  std::unique_ptr<gateway> g(new gateway());
  net::raise_fd_limit();
  const size_t n = cpus.empty() ? 1 : cpus.size();
  g->_capacity = config::capacity_for(*cfg);
  const config::reload_capacity& cap = g->_capacity;
  if (budgets == nullptr) {
    g->_own_budgets = std::make_unique<quota::budget_board>(static_cast<uint32_t>(n), static_cast<uint32_t>(cap.keys),
                                                            static_cast<uint32_t>(cap.groups));
    budgets = g->_own_budgets.get();
  }
  SLUICE_VERIFY(budgets->shard_count() >= n && budgets->keys_max() >= cap.keys && budgets->groups_max() >= cap.groups);
  g->_budgets = budgets;
  g->_metrics = std::make_unique<metrics::registry>(
      n, names_of(*cfg),
      metrics::registry::room{cap.groups - cfg->groups.size(), cap.backends - cfg->backends.size(),
                              cap.keys - cfg->keys.size()});
  for (size_t b = 0; b < cfg->backends.size(); ++b) g->_metrics->set_backend_up(static_cast<uint32_t>(b), true);
  if (cfg->server.listen_tls.length != 0) {
    try {
      g->_tls = tls::context::load(tls_options_of(cfg->server));
    } catch (const tls::context_error& e) {
      throw std::runtime_error(fmt::format("server.listen_tls: {}", e.what()));
    }
  }
  const bool steering = cfg->server.reuseport_steering;
  // Shards pinned one to a CPU of `cpus` ([server] pin_shards, the default),
  // or run on all of them as a set (`pinned` empty).
  const std::vector<int> pinned = cfg->server.pin_shards ? cpus : std::vector<int>{};
  const bool shared = steering && !pinned.empty() && held_elsewhere(cfg->server.listen);
  const std::vector<int> fds = bind_listeners(cfg->server.listen, n, g->_port, inherited, "listen");
  steer(fds, pinned, cfg->server.listen, shared, steering);
  std::vector<int> tls_fds(n, -1);
  if (g->_tls) {
    const bool tls_shared = steering && !pinned.empty() && held_elsewhere(cfg->server.listen_tls);
    try {
      tls_fds = bind_listeners(cfg->server.listen_tls, n, g->_tls_port, inherited, "listen_tls");
    } catch (...) {
      for (int f : fds) ::close(f);
      throw;
    }
    steer(tls_fds, pinned, cfg->server.listen_tls, tls_shared, steering);
  }
  g->_listen_fds = fds;
  if (g->_tls) g->_tls_listen_fds = tls_fds;
  g->_mesh = std::make_unique<mesh_storage>(n, cap.keys, cfg->cluster.enabled());
  g->_mesh->budgets = budgets;
  for (size_t i = 0; i < n; ++i) g->add_shard(cfg, pinned.empty() ? -1 : pinned[i], cpus, fds[i], tls_fds[i]);
  g->launch();
  return g;
}

int64_t gateway::quota_level(uint32_t key, int r) const noexcept {
  if (key >= _mesh->keys_max) return 0;
  int64_t total = 0;
  // The lender's row holds what it keeps for the shards (tokens; 0 without one).
  for (size_t s = 0; s < _mesh->count + (r == 0 ? 1 : 0); ++s) {
    total += std::max<int64_t>(_mesh->quota_levels[(s * _mesh->keys_max + key) * 2 + static_cast<size_t>(r)].load(
                                   std::memory_order_relaxed),
                               0);
  }
  return total;
}

void gateway::add_shard(const std::shared_ptr<const config::config>& cfg, int cpu, const std::vector<int>& cpus,
                        int listen_fd, int tls_listen_fd) {
  auto s = std::make_unique<shard_slot>();
  shard_link& l = s->link;
  l.index = static_cast<uint32_t>(_shards.size());
  l.cpu = cpu;
  if (cpu < 0) l.cpus_allowed = cpus;
  l.listen_fd = listen_fd;
  l.tls_listen_fd = tls_listen_fd;
  l.tls = _tls;
  l.cfg = cfg;
  l.metrics = &_metrics->shard(l.index);
  l.mesh = _mesh->view(l.index, l.outcomes);
  l.mesh.to_store = &l.store_ops;
  _shards.push_back(std::move(s));
}

void gateway::launch() {
  for (auto& s : _shards) {
    shard_link* l = &s->link;
    s->thread = std::thread([l] { proxy::run_shard(*l); });
  }
  bool failed = false;
  for (auto& s : _shards) {
    s->link.ready.wait(false);
    failed |= s->link.failed.load();
  }
  if (failed) {
    drain(0);
    join();
    throw std::runtime_error("a shard failed to start (see the log above)");
  }
}

gateway::~gateway() {
  drain(0);
  join();
  // A reload that reached a shard's inbox (or its backlog) as it stopped:
  // its snapshot copy.
  for (auto& s : _shards) {
    control_message m;
    while (s->link.inbox.try_pop(m)) release_control(m);
    for (control_message& b : s->backlog) release_control(b);
    s->backlog.clear();
    // Store operations nobody took: their records.
    proxy::store_op op;
    while (s->link.store_ops.try_pop(op)) delete op.record;
  }
}

void gateway::post(uint8_t kind, uint32_t drain_ms, const route::message* r) noexcept {
  for (auto& s : _shards) {
    if (s->link.stopped) continue;
    control_message m;
    m.what = static_cast<control_message::kind>(kind);
    m.drain_ms = drain_ms;
    if (r != nullptr) m.r = *r;
    send_control(*s, m);
  }
}

gateway::settle_mark gateway::mark() const {
  settle_mark m;
  m.posted.reserve(_shards.size());
  // What waits in a backlog counts: the shard has taken the mark's messages
  // only once those too are in and applied.
  for (const auto& s : _shards) m.posted.push_back(s->link.posted + s->backlog.size());
  return m;
}

int gateway::behind(const settle_mark& m) const noexcept {
  for (size_t i = 0; i < _shards.size() && i < m.posted.size(); ++i) {
    const shard_link& s = _shards[i]->link;
    if (s.stopped.load(std::memory_order_acquire)) continue;
    if (s.applied.load(std::memory_order_acquire) < m.posted[i]) return static_cast<int>(i);
  }
  return -1;
}

bool settle_wait::over(const gateway& g, uint64_t now_ms) const noexcept {
  const int late = g.behind(_mark);
  if (late < 0) return true;
  if (now_ms < _deadline_ms) return false;
  log::warn("shard {} has not taken a control message within {} ms; it applies it at its next loop turn", late,
            k_bound_ms);
  return true;
}

void gateway::drain(uint32_t drain_ms) noexcept {
  post(static_cast<uint8_t>(control_message::kind::drain), drain_ms);
}

void gateway::hand_over(uint32_t drain_ms) noexcept {
  post(static_cast<uint8_t>(control_message::kind::handover), drain_ms);
}

void gateway::broadcast(const route::message& m) noexcept {
  post(static_cast<uint8_t>(control_message::kind::route), 0, &m);
}

void gateway::drain_outcomes(void (*fn)(void* ctx, uint32_t backend, bool failure), void* ctx) noexcept {
  for (auto& s : _shards) {
    proxy::upstream_outcome o;
    while (s->link.outcomes.try_pop(o)) fn(ctx, o.backend, o.failure != 0);
  }
}

void gateway::reload(std::shared_ptr<const config::config> next) {
  const size_t known = _metrics->label_names().backends.size();
  metrics::registry::names names = names_of(*next);
  // A removed backend's series keep the protocol they were named with.
  const std::vector<std::string>& had = _metrics->label_names().backend_protocols;
  for (size_t b = 0; b < known && b < had.size(); ++b) {
    if (next->backends[b].removed) names.backend_protocols[b] = had[b];
  }
  SLUICE_VERIFY(_metrics->rename(std::move(names)));
  for (size_t b = 0; b < next->backends.size(); ++b) {
    // New backends start up, as at start; removed ones read 0.
    if (next->backends[b].removed || b >= known) {
      _metrics->set_backend_up(static_cast<uint32_t>(b), !next->backends[b].removed);
    }
  }
  if (_tls) {
    // The certificate and key are read anew; the ticket keys carry over and
    // rotate (a client resumes with a ticket of the last key or this one).
    try {
      std::shared_ptr<tls::context> fresh = tls::context::load(tls_options_of(next->server), _tls.get());
      fresh->rotate_ticket_keys();
      _tls = std::move(fresh);
    } catch (const tls::context_error& e) {
      log::error("reload: server.tls_cert / tls_key: {}; new TLS connections keep the running certificate",
                 e.what());
      _tls->rotate_ticket_keys();
    }
  }
  for (auto& s : _shards) {
    if (s->link.stopped) continue;
    control_message m;
    m.what = control_message::kind::reload;
    m.snapshot = new std::shared_ptr<const config::config>(next);
    if (_tls) m.tls = new std::shared_ptr<const tls::context>(_tls);
    if (!send_control(*s, m)) release_control(m);
  }
}

bool gateway::lending() const noexcept { return !_mesh->to_lender.empty(); }

void gateway::set_store_reactor(shard::reactor* r) noexcept {
  _mesh->store_reactor.store(r, std::memory_order_release);
}

void gateway::take_store_ops(void (*fn)(void* ctx, uint32_t shard, const proxy::store_op& op), void* ctx) noexcept {
  for (auto& s : _shards) {
    proxy::store_op op;
    while (s->link.store_ops.try_pop(op)) fn(ctx, s->link.index, op);
  }
}

bool gateway::answer_store(uint32_t s, uint64_t seq, proxy::store_record* record, bool unavailable) noexcept {
  control_message m;
  m.what = control_message::kind::store;
  m.store_seq = seq;
  m.record = record;
  m.store_unavailable = unavailable;
  if (s < _shards.size() && send_control(*_shards[s], m)) return true;
  delete record;
  return false;
}

void gateway::set_control_reactor(shard::reactor* r) noexcept {
  _mesh->control_reactor.store(r, std::memory_order_release);
}

void gateway::take_lender_messages(void (*fn)(void* ctx, const quota::message& m), void* ctx) noexcept {
  for (auto& q : _mesh->to_lender) {
    proxy::shard_message m;
    while (q->try_pop(m)) fn(ctx, m.q);
  }
}

size_t gateway::send_from_lender(uint32_t s, std::span<const quota::message> msgs) noexcept {
  SLUICE_ASSERT(s < _mesh->from_lender.size());
  size_t pushed = 0;
  for (; pushed < msgs.size(); ++pushed) {
    proxy::shard_message m;
    m.what = proxy::shard_message::kind::quota;
    m.q = msgs[pushed];
    if (!_mesh->from_lender[s]->try_push(m)) break;
  }
  if (pushed != 0 && _shards[s]->link.reactor != nullptr && !_shards[s]->link.stopped.load(std::memory_order_acquire)) {
    _shards[s]->link.reactor->wake();
  }
  return pushed;
}

std::atomic<int64_t>* gateway::quota_cells() const noexcept { return _mesh->quota_levels.get(); }
uint32_t gateway::quota_stride() const noexcept { return _mesh->keys_max; }

void gateway::reopen_audit() noexcept { post(static_cast<uint8_t>(control_message::kind::reopen_audit), 0); }

bool gateway::stopped() const noexcept {
  for (auto& s : _shards) {
    if (!s->link.stopped) return false;
  }
  return true;
}

void gateway::join() noexcept {
  // A stop message may still wait in a backlog: moved on until each shard
  // has left its loop (the control loop's own turns do it before this).
  while (!stopped()) {
    flush_control();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& s : _shards) {
    if (s->thread.joinable()) s->thread.join();
  }
}

}  // namespace sluice::control
