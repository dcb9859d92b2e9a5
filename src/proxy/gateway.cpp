// Shard threads: start, pin, run, drain. The control thread reaches a shard
// only through its SPSC queue plus a ring wake-up.
#include "sluice/proxy/gateway.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "shard_server.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/shard/cpuset.hpp"
#include "sluice/shard/spsc_queue.hpp"

namespace sluice::proxy {

namespace {

// Control -> shard. Small and trivially copyable (spsc_queue's rule).
struct control_message {
  enum class kind : uint8_t { drain, reopen_audit, route, reload } what = kind::drain;
  uint32_t drain_ms = 0;
  route::message r;  // kind::route
  // kind::reload: a heap copy of the snapshot's owner, taken over (and
  // deleted) by the shard.
  std::shared_ptr<const config::config>* snapshot = nullptr;
};

}  // namespace

struct gateway::mesh_storage {
  std::vector<std::unique_ptr<mesh_queue>> queues;
  std::vector<mesh_queue*> ptrs;
  std::unique_ptr<std::atomic<shard::reactor*>[]> reactors;
  std::unique_ptr<std::atomic<int64_t>[]> quota_levels;  // [(shard * keys + key) * 2 + r]
};

struct gateway::shard_slot {
  uint32_t index = 0;
  int cpu = -1;
  int listen_fd = -1;
  std::shared_ptr<const config::config> cfg;
  metrics::shard_metrics* metrics = nullptr;
  shard_mesh mesh;
  outcome_queue outcomes;  // shard -> control: passive health reports
  shard::spsc_queue<control_message, 64> inbox;
  std::thread thread;
  shard::reactor* reactor = nullptr;  // set by the shard thread before `ready`
  // The shard's reactor, kept until the gateway goes (after every thread
  // is joined): the control thread and peer shards may still wake it while
  // the shard leaves its loop.
  std::unique_ptr<shard::reactor> owned_reactor;
  std::atomic<bool> ready{false};
  std::atomic<bool> failed{false};
  std::atomic<bool> stopped{false};
  // Control messages pushed to `inbox` (control thread only) and taken by
  // the shard (written by the shard only): behind() compares them.
  uint64_t posted = 0;
  std::atomic<uint64_t> applied{0};

  void run() noexcept;
};

namespace {

// Control thread: queues `m` for the shard, waiting while its inbox is full,
// unless the shard has stopped (then it takes nothing more). Returns:
// whether it was queued.
bool push_control(gateway::shard_slot& s, const control_message& m) noexcept {
  for (;;) {
    if (s.inbox.try_push(m)) {
      ++s.posted;
      return true;
    }
    if (s.stopped.load(std::memory_order_acquire)) return false;
    std::this_thread::yield();
  }
}

}  // namespace

void gateway::shard_slot::run() noexcept {
  char name[16];
  auto r = fmt::format_to_n(name, sizeof name - 1, "sluice-shard{}", index);
  name[r.size] = '\0';
  shard::name_current_thread(name);
  if (cpu >= 0 && !shard::pin_current_thread(cpu)) log::warn("shard {}: could not pin to cpu {}", index, cpu);

  shard::reactor::options ro;
  ro.idle_poll_us = cfg->server.idle_poll_us;
  owned_reactor = shard::reactor::create(ro);
  std::unique_ptr<shard::reactor>& rx = owned_reactor;
  if (!rx) {
    failed = true;
    ready = true;
    ready.notify_all();
    stopped = true;
    return;
  }
  shard_server srv(index, cfg, *rx, listen_fd, *metrics, mesh);
  listen_fd = -1;  // owned by srv now
  if (!srv.init()) {
    failed = true;
    ready = true;
    ready.notify_all();
    stopped = true;
    return;
  }
  log::debug("shard {} on cpu {}: io_uring {}", index, cpu, rx->setup_mode());
  reactor = rx.get();
  const_cast<std::atomic<shard::reactor*>*>(mesh.reactors)[index].store(rx.get(), std::memory_order_release);
  ready = true;
  ready.notify_all();

  struct ctx_t {
    shard_slot* slot;
    shard_server* srv;
    shard::reactor* r;
  } ctx{this, &srv, rx.get()};
  shard::reactor::hooks h;
  h.ctx = &ctx;
  h.on_iteration = [](void* p, uint64_t now) {
    auto* c = static_cast<ctx_t*>(p);
    control_message m;
    while (c->slot->inbox.try_pop(m)) {
      if (m.what == control_message::kind::drain) c->srv->begin_drain(now + m.drain_ms);
      if (m.what == control_message::kind::reopen_audit) c->srv->reopen_audit();
      if (m.what == control_message::kind::route) c->srv->apply_route(m.r);
      if (m.what == control_message::kind::reload) {
        std::unique_ptr<std::shared_ptr<const config::config>> next(m.snapshot);
        c->srv->reload(std::move(*next));
      }
      c->slot->applied.store(c->slot->applied.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    c->srv->on_iteration(now);
    if (c->srv->drained()) c->r->stop();
  };
  rx->run(h);
  const_cast<std::atomic<shard::reactor*>*>(mesh.reactors)[index].store(nullptr, std::memory_order_release);
  // Every request has ended: what is left in the audit batch goes to disk
  // before the shard says it stopped (SIGTERM loses no completed line).
  srv.close_audit();
  stopped = true;
}

std::unique_ptr<gateway> gateway::start(std::shared_ptr<const config::config> cfg, const std::vector<int>& cpus) {
  std::unique_ptr<gateway> g(new gateway());
  net::raise_fd_limit();
  metrics::registry::names names;
  for (const auto& grp : cfg->groups) names.groups.push_back(grp.name);
  for (const auto& b : cfg->backends) names.backends.push_back(b.url);
  for (const auto& k : cfg->keys) names.keys.push_back(k.id);
  const size_t shard_n = cpus.empty() ? 1 : cpus.size();
  g->_capacity = config::capacity_for(*cfg);
  const config::reload_capacity& cap = g->_capacity;
  g->_metrics = std::make_unique<metrics::registry>(
      shard_n, std::move(names),
      metrics::registry::room{cap.groups - cfg->groups.size(), cap.backends - cfg->backends.size(),
                              cap.keys - cfg->keys.size()});
  for (size_t b = 0; b < cfg->backends.size(); ++b) g->_metrics->set_backend_up(static_cast<uint32_t>(b), true);
  const config::socket_address& la = cfg->server.listen;
  // Bind the first listener; with port 0 its port is then the one every
  // other shard binds, so they share one SO_REUSEPORT group.
  sockaddr_storage addr = la.storage;
  const size_t n = cpus.empty() ? 1 : cpus.size();
  std::vector<int> fds;
  for (size_t i = 0; i < n; ++i) {
    int fd = net::listen_socket(reinterpret_cast<const sockaddr*>(&addr), la.length, true);
    if (fd < 0) {
      for (int f : fds) ::close(f);
      throw std::runtime_error(fmt::format("cannot listen on {}: {}", la.text, std::strerror(-fd)));
    }
    if (i == 0) {
      g->_port = net::local_port(fd);
      if (addr.ss_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(g->_port);
      } else {
        reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(g->_port);
      }
    }
    fds.push_back(fd);
  }
  // The mesh: one SPSC queue per ordered pair of shards.
  g->_mesh = std::make_unique<mesh_storage>();
  mesh_storage& ms = *g->_mesh;
  ms.queues.resize(n * n);
  ms.ptrs.assign(n * n, nullptr);
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      if (from == to) continue;
      ms.queues[from * n + to] = std::make_unique<mesh_queue>();
      ms.ptrs[from * n + to] = ms.queues[from * n + to].get();
    }
  }
  ms.quota_levels = std::make_unique<std::atomic<int64_t>[]>(std::max<size_t>(1, n * cap.keys * 2));
  ms.reactors = std::make_unique<std::atomic<shard::reactor*>[]>(n);
  for (size_t i = 0; i < n; ++i) ms.reactors[i].store(nullptr);
  for (size_t i = 0; i < n; ++i) {
    auto s = std::make_unique<shard_slot>();
    s->mesh.count = static_cast<uint32_t>(n);
    s->mesh.to_control = &s->outcomes;
    s->mesh.quota_levels = ms.quota_levels.get();
    s->mesh.quota_keys_max = static_cast<uint32_t>(cap.keys);
    s->mesh.queues = ms.ptrs.data();
    s->mesh.reactors = ms.reactors.get();
    s->index = static_cast<uint32_t>(i);
    s->cpu = cpus.empty() ? -1 : cpus[i];
    s->listen_fd = fds[i];
    s->cfg = cfg;
    s->metrics = &g->_metrics->shard(i);
    g->_shards.push_back(std::move(s));
  }
  for (auto& s : g->_shards) {
    shard_slot* p = s.get();
    s->thread = std::thread([p] { p->run(); });
  }
  bool failed = false;
  for (auto& s : g->_shards) {
    s->ready.wait(false);
    failed |= s->failed.load();
  }
  if (failed) {
    g->drain(0);
    g->join();
    throw std::runtime_error("a shard failed to start (see the log above)");
  }
  return g;
}

gateway::~gateway() {
  drain(0);
  join();
  // A reload that reached a shard's inbox as it stopped: its snapshot copy.
  for (auto& s : _shards) {
    control_message m;
    while (s->inbox.try_pop(m)) delete m.snapshot;
  }
}


void gateway::post(uint8_t kind, uint32_t drain_ms, const route::message* r) noexcept {
  for (auto& s : _shards) {
    if (s->stopped) continue;
    control_message m;
    m.what = static_cast<control_message::kind>(kind);
    m.drain_ms = drain_ms;
    if (r != nullptr) m.r = *r;
    // The queue holds 64 control messages; a full one means the shard is
    // far behind, and waiting for it is the right thing for a control op
    // (unless the shard has stopped: then it takes nothing more).
    if (!push_control(*s, m)) continue;
    if (s->reactor != nullptr) s->reactor->wake();
  }
}

gateway::settle_mark gateway::mark() const {
  settle_mark m;
  m.posted.reserve(_shards.size());
  for (const auto& s : _shards) m.posted.push_back(s->posted);
  return m;
}

int gateway::behind(const settle_mark& m) const noexcept {
  for (size_t i = 0; i < _shards.size() && i < m.posted.size(); ++i) {
    const shard_slot& s = *_shards[i];
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

void gateway::broadcast(const route::message& m) noexcept {
  post(static_cast<uint8_t>(control_message::kind::route), 0, &m);
}

void gateway::drain_outcomes(void (*fn)(void* ctx, uint32_t backend, bool failure), void* ctx) noexcept {
  for (auto& s : _shards) {
    upstream_outcome o;
    while (s->outcomes.try_pop(o)) fn(ctx, o.backend, o.failure != 0);
  }
}

void gateway::reload(std::shared_ptr<const config::config> next) {
  metrics::registry::names names;
  for (const auto& grp : next->groups) names.groups.push_back(grp.name);
  for (const auto& b : next->backends) names.backends.push_back(b.url);
  for (const auto& k : next->keys) names.keys.push_back(k.id);
  const size_t known = _metrics->label_names().backends.size();
  SLUICE_VERIFY(_metrics->rename(std::move(names)));
  for (size_t b = 0; b < next->backends.size(); ++b) {
    // New backends start up, as at start; removed ones read 0.
    if (next->backends[b].removed || b >= known) {
      _metrics->set_backend_up(static_cast<uint32_t>(b), !next->backends[b].removed);
    }
  }
  for (auto& s : _shards) {
    if (s->stopped) continue;
    control_message m;
    m.what = control_message::kind::reload;
    m.snapshot = new std::shared_ptr<const config::config>(next);
    if (!push_control(*s, m)) {
      delete m.snapshot;
      continue;
    }
    if (s->reactor != nullptr) s->reactor->wake();
  }
}

void gateway::reopen_audit() noexcept { post(static_cast<uint8_t>(control_message::kind::reopen_audit), 0); }

bool gateway::stopped() const noexcept {
  for (auto& s : _shards) {
    if (!s->stopped) return false;
  }
  return true;
}

void gateway::join() noexcept {
  for (auto& s : _shards) {
    if (s->thread.joinable()) s->thread.join();
  }
}

}  // namespace sluice::proxy
