// sluice: flags, config, shards, signals. Nothing else lives here.
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/control/admin.hpp"
#include "sluice/control/budgets.hpp"
#include "sluice/control/cluster.hpp"
#include "sluice/control/embeddings.hpp"
#include "sluice/control/gateway.hpp"
#include "sluice/tls/tls.hpp"
#include "sluice/control/health.hpp"
#include "sluice/control/responses.hpp"
#include "sluice/control/status.hpp"
#include "sluice/control/inherit.hpp"
#include "sluice/control/notify.hpp"
#include "sluice/control/upgrade.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/route/groups.hpp"
#include "sluice/shard/cpuset.hpp"
#include "sluice/shard/reactor.hpp"

namespace {

using namespace sluice;

// The shards' CPUs: --cpus / server.cpus, else the affinity mask; with
// --numa-node, the node's CPUs within those. {-1}: unpinned (the mask
// could not be read).
std::vector<int> choose_cpus(const config::flags& f, const config::config& c) {
  const bool configured = !c.server.cpus.empty();
  std::vector<int> allowed = configured ? c.server.cpus : shard::affinity_cpus();
  if (f.numa_node) {
    const int node = *f.numa_node;
    auto r = shard::numa_node_cpus(node);
    if (!r.ok()) {
      throw config::config_error(fmt::format(
          "--numa-node {}: no such NUMA node (/sys/devices/system/node/node{}/cpulist {})", node, node,
          r.error() == errc::not_found ? "is absent; the kernel may lack NUMA support" : "cannot be read"));
    }
    if (r.value().empty()) throw config::config_error(fmt::format("--numa-node {}: the node has no online CPUs", node));
    std::vector<int> cpus = shard::cpus_within(r.value(), allowed);
    if (cpus.empty()) {
      throw config::config_error(fmt::format("--numa-node {}: none of its CPUs ({}) is in {} ({})", node,
                                             shard::format_cpu_list(r.value()),
                                             configured ? "--cpus / server.cpus" : "the affinity mask",
                                             shard::format_cpu_list(allowed)));
    }
    return cpus;
  }
  if (configured) return c.server.cpus;
  if (allowed.empty()) allowed.push_back(-1);
  return allowed;
}

// --numa-node: the memory policy of this thread, inherited by the shards
// and the control thread started after it. Logged either way.
void prefer_node_memory(int node) {
  switch (shard::prefer_numa_node(node)) {
    case shard::numa_policy::preferred:
      log::info("--numa-node {}: memory is allocated on node {} first", node, node);
      return;
    case shard::numa_policy::single_node:
      log::info("--numa-node {}: one NUMA node; memory policy unchanged", node);
      return;
    case shard::numa_policy::no_numa:
      log::info("--numa-node {}: no NUMA support (libnuma); memory policy unchanged", node);
      return;
    case shard::numa_policy::failed:
      log::warn("--numa-node {}: could not set the memory policy; memory comes from any node", node);
      return;
  }
}

// Control-thread state for the signal handler completion.
struct control_state {
  shard::reactor* r = nullptr;
  control::gateway* g = nullptr;
  control::admin_server* admin = nullptr;
  control::health_checker* health = nullptr;
  control::budget_keeper* budgets = nullptr;
  control::cluster_keeper* cluster = nullptr;  // [cluster] mode only
  control::embeddings_loader* embeddings = nullptr;
  control::response_keeper* responses = nullptr;
  control::status_sampler* status = nullptr;
  control::binary_upgrade* upgrade = nullptr;
  int admin_fd = -1;  // the admin listener's fd (admin_server owns it), for SIGUSR2
  const config::flags* flags = nullptr;
  std::shared_ptr<const config::config> cfg;  // the running snapshot
  int sig_fd = -1;
  signalfd_siginfo info{};
  struct sig_op : shard::completion {
    control_state* self = nullptr;
  } op;
  bool draining = false;
  // Reloads taken but not yet on every shard, oldest first: their
  // "reloaded" line waits for that (polled each loop turn, never waited for).
  struct pending_reload {
    control::settle_wait settled;
    std::string source;
    std::vector<std::string> notes;
  };
  std::vector<pending_reload> reloads;

  void arm() {
    io_uring_sqe* s = r->sqe(&op);
    io_uring_prep_read(s, sig_fd, &info, sizeof info, 0);
  }

  static void on_signal(shard::completion* c, const io_uring_cqe* cqe) {
    control_state* self = static_cast<sig_op*>(c)->self;
    if (cqe->res == static_cast<int>(sizeof(signalfd_siginfo))) self->handle(static_cast<int>(self->info.ssi_signo));
    self->arm();
  }

  // Re-reads the file (flags still override it). A valid one becomes every
  // shard's snapshot; an invalid one is logged with its line and counted,
  // and the running config stays.
  void reload() {
    if (draining) {
      log::warn("SIGHUP: draining; not reloading");
      return;
    }
    try {
      std::shared_ptr<const config::config> loaded = config::load_from_flags(*flags);
      std::vector<std::string> notes;
      std::shared_ptr<const config::config> next = config::reconcile(*loaded, *cfg, g->capacity(), notes);
      g->reload(next);
      health->reload(next);
      embeddings->reload(next);
      responses->reload(*next);
      if (cluster != nullptr) cluster->reload(*next);
      if (next->cluster.redis != cfg->cluster.redis || next->cluster.key_prefix != cfg->cluster.key_prefix) {
        log::warn("SIGHUP: [cluster] changed; the running instance keeps its Redis until it restarts");
      }
      // Counted now, in the order the files came (a failed one just after
      // still reads last); the log line waits for every shard.
      reloads.push_back({control::settle_wait(g->mark(), r->now_ms()), next->source, std::move(notes)});
      cfg = std::move(next);
      g->count_reload(true);
    } catch (const config::config_error& e) {
      g->count_reload(false);
      log::error("SIGHUP: {}; the running config stays", e.what());
    } catch (const std::exception& e) {
      g->count_reload(false);
      log::error("SIGHUP: reload failed: {}; the running config stays", e.what());
    }
  }

  // Each loop turn: "SIGHUP: reloaded" for the reloads every shard now
  // serves (marks only grow, so they settle in order).
  void log_settled_reloads(uint64_t now_ms) {
    size_t done = 0;
    while (done < reloads.size() && reloads[done].settled.over(*g, now_ms)) {
      log::info("SIGHUP: reloaded {}", reloads[done].source);
      for (const std::string& n : reloads[done].notes) log::info("SIGHUP: {}", n);
      ++done;
    }
    reloads.erase(reloads.begin(), reloads.begin() + static_cast<ptrdiff_t>(done));
  }

  // SIGUSR2: the new process starts with every listening socket; this one
  // serves on until it says it is ready (hand_over).
  void upgrade_binary() {
    if (draining) {
      log::warn("SIGUSR2: draining; not upgrading");
      return;
    }
    std::vector<control::passed_listener> fds;
    for (size_t i = 0; i < g->listen_fds().size(); ++i) fds.push_back({"listen", uint32_t(i), g->listen_fds()[i]});
    for (size_t i = 0; i < g->tls_listen_fds().size(); ++i) {
      fds.push_back({"listen_tls", uint32_t(i), g->tls_listen_fds()[i]});
    }
    fds.push_back({"admin", 0, admin_fd});
    upgrade->start(fds, r->now_ms());
  }

  // The new process serves: this one stops accepting, drains and exits 0.
  void hand_over() {
    if (draining) return;  // a SIGTERM came first: its drain goes on
    draining = true;
    log::info("SIGUSR2: pid {} serves; this process stops accepting and drains (up to {} ms)", upgrade->child(),
              cfg->server.drain_timeout_ms);
    // Under systemd the new process becomes the service's main one: its
    // exit, not this one's, ends the service; reload and stop signal it.
    control::service_notify(fmt::format("MAINPID={}", upgrade->child()));
    admin->stop_accepting();
    admin->set_draining(true);
    health->stop();
    budgets->hand_over();  // its usage from here on reaches the new process
    g->hand_over(cfg->server.drain_timeout_ms);
  }

  void handle(int sig) {
    switch (sig) {
      case SIGTERM:
      case SIGINT:
        if (draining) {
          log::warn("second signal: stopping now");
          g->drain(0);
          return;
        }
        draining = true;
        log::info("signal {}: draining (up to {} ms)", sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg->server.drain_timeout_ms);
        control::service_notify("STOPPING=1");
        admin->set_draining(true);
        health->stop();
        // With an upgrade under way the listening sockets may live on in
        // the new process: they are handed over, not shut down.
        if (upgrade->in_progress()) {
          budgets->hand_over();
          g->hand_over(cfg->server.drain_timeout_ms);
        } else {
          g->drain(cfg->server.drain_timeout_ms);
        }
        return;
      case SIGHUP:
        reload();
        return;
      case SIGUSR1:
        log::info("SIGUSR1: reopening the audit log");
        g->reopen_audit();
        return;
      case SIGUSR2:
        upgrade_binary();
        return;
      default:
        return;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  config::flags f;
  std::shared_ptr<const config::config> cfg;
  try {
    f = config::parse_flags(argc, argv);
    if (f.help) {
      std::fputs(config::usage_text().data(), stdout);
      return 0;
    }
    if (f.version) {
      std::printf("sluice %s\n", SLUICE_VERSION);
      return 0;
    }
    if (f.log_level) {
      const std::string& l = *f.log_level;
      log::set_level(l == "debug" ? log::level::debug : l == "warn" ? log::level::warn
                     : l == "error" ? log::level::error : log::level::info);
    }
    cfg = config::load_from_flags(f);
    if (f.explain_route) {
      if (*f.explain_route != "-") {
        std::fputs(route::explain_route(*cfg, *f.explain_route).c_str(), stdout);
        return 0;
      }
      for (std::string line; std::getline(std::cin, line);) {
        std::fputs(route::explain_route(*cfg, line, true).c_str(), stdout);
      }
      return 0;
    }
    if (f.check_config) {
      // The budget state file too: a start would refuse a corrupt one.
      if (!cfg->quota.budget_state_file.empty()) {
        quota::budget_file_store store(cfg->quota.budget_state_file);
        quota::budget_state state;
        std::string error;
        if (!store.load(state, error)) throw config::config_error(error);
      }
      // The shard CPUs too: a --numa-node the machine lacks fails here,
      // before a service manager starts the process.
      std::vector<int> cpus = choose_cpus(f, *cfg);
      std::string placement = cpus.size() == 1 && cpus[0] < 0 ? "1 shard, unpinned"
                                                             : fmt::format("{} shard{} on cpus {}{}", cpus.size(),
                                                                           cpus.size() == 1 ? "" : "s",
                                                                           shard::format_cpu_list(cpus),
                                                                           cfg->server.pin_shards ? "" : ", not pinned");
      std::printf("%s: ok (%zu groups, %zu backends, %zu keys; %s)\n", cfg->source.c_str(), cfg->groups.size(),
                  cfg->backends.size(), cfg->keys.size(), placement.c_str());
      return 0;
    }
  } catch (const config::config_error& e) {
    std::fprintf(stderr, "sluice: %s\n", e.what());
    if (f.check_config) return 1;
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice: %s\n", e.what());
    return 1;
  }

  // Signals go to the control thread's signalfd only: block them before any
  // shard thread exists so every thread inherits the mask.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGUSR1);
  sigaddset(&mask, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  try {
    std::vector<int> cpus = choose_cpus(f, *cfg);
    if (cpus.size() == 1 && cpus[0] < 0) cpus.clear();
    if (f.numa_node) prefer_node_memory(*f.numa_node);
    // Budgets before the shards: their flags are set from the kept state
    // before the first request (a corrupt state file stops the start here).
    control::budget_keeper budgets(*cfg, cpus.empty() ? 1 : cpus.size());
    // Sockets handed over by the process this one takes over from (SIGUSR2)
    // or by systemd, taken before anything is bound.
    control::listener_pool inherited = control::listener_pool::from_environment();
    auto g = control::gateway::start(cfg, cpus, &budgets.board(), &inherited);

    const config::socket_address& aa = cfg->server.admin;
    int admin_fd = inherited.take("admin", aa, 0);
    if (admin_fd < 0) admin_fd = net::listen_socket(reinterpret_cast<const sockaddr*>(&aa.storage), aa.length, false, 64);
    inherited.close_unclaimed();
    if (admin_fd < 0) throw std::runtime_error(fmt::format("cannot listen on admin {}: {}", aa.text, std::strerror(-admin_fd)));
    const uint16_t admin_port = net::local_port(admin_fd);

    shard::reactor::options ro;
    ro.entries = 256;
    ro.tick_ms = 50;
    auto r = shard::reactor::create(ro);
    if (!r) return 1;
    control::admin_server admin(*r, *g, admin_fd);
    admin.set_token(cfg->server.admin_token);
    admin.start();
    control::health_checker health(*r, *g, cfg);
    admin.set_health(&health);
    control::embeddings_loader embeddings(*r, cfg);
    control::response_keeper responses(*r, *g, *cfg);
    control::status_sampler status(*g);
    admin.set_status(&status);

    control_state ctl;
    ctl.r = r.get();
    ctl.g = g.get();
    ctl.admin = &admin;
    ctl.health = &health;
    ctl.embeddings = &embeddings;
    ctl.responses = &responses;
    ctl.budgets = &budgets;
    ctl.status = &status;
    ctl.cfg = cfg;
    admin.set_budgets(&budgets, &ctl.cfg);
    ctl.flags = &f;
    control::binary_upgrade upgrade(*r, argc, argv);
    ctl.upgrade = &upgrade;
    ctl.admin_fd = admin_fd;
    ctl.sig_fd = ::signalfd(-1, &mask, SFD_CLOEXEC);
    ctl.op.self = &ctl;
    ctl.op.fn = &control_state::on_signal;
    ctl.arm();

    auto host_of = [](const config::socket_address& a) {
      std::string t = a.text;
      size_t colon = t.rfind(':');
      return colon == std::string::npos ? t : t.substr(0, colon);
    };
    log::info("sluice listening on http://{}:{} ({} shard{})", host_of(cfg->server.listen), g->port(),
              g->shard_count(), g->shard_count() == 1 ? "" : "s");
    if (g->tls_port() != 0) {
      std::string why;
      const bool ktls = tls::ktls_available(&why);
      log::info("sluice listening on https://{}:{} (TLS {}+, ALPN {}http/1.1; kTLS {})",
                host_of(cfg->server.listen_tls), g->tls_port(), cfg->server.tls_min_version,
                cfg->server.tls_h2 ? "h2, " : "", ktls ? "available, not used: records are encrypted in user space"
                                                       : "off: " + why);
    }
    if (cfg->server.splice) {
      log::warn("server.splice = true is accepted for old configs and has no effect: every body is relayed by "
                "copy (README, \"How a request flows\")");
    }
    std::unique_ptr<control::cluster_keeper> cluster;
    if (cfg->cluster.enabled()) {
      cluster = std::make_unique<control::cluster_keeper>(*r, *g, *cfg);
      ctl.cluster = cluster.get();
      admin.set_cluster(cluster.get());
    }
    log::info("sluice admin on http://{}:{}", host_of(aa), admin_port);

    budgets.attach(*r);  // [cluster]: budgets in Redis, on this reactor until shutdown()
    shard::reactor::hooks h;
    h.ctx = &ctl;
    h.on_iteration = [](void* p, uint64_t) {
      auto* c = static_cast<control_state*>(p);
      c->g->flush_control();
      c->health->on_iteration(c->r->now_ms());
      c->embeddings->on_iteration(c->r->now_ms());
      c->responses->on_iteration(c->r->now_ms());
      c->status->on_iteration(c->r->now_ms());
      if (c->cluster != nullptr) c->cluster->on_iteration(c->r->now_ms());
      c->log_settled_reloads(c->r->now_ms());
      if (c->upgrade->on_iteration(c->r->now_ms())) c->hand_over();
      c->budgets->on_iteration(*c->cfg, c->r->now_ms(), static_cast<int64_t>(realtime_ms()));
      // The loop ends once the shards have, and no call of the control
      // thread's own has its buffers in the kernel.
      if (c->g->stopped() && c->embeddings->stop()) c->r->stop();
    };
    // Every shard takes connections and the admin listener is armed: a
    // process this one takes over from may hand over now.
    control::binary_upgrade::signal_ready();
    r->run(h);
    g->join();
    cluster.reset();
    // Every shard has stopped: their counters are final.
    budgets.shutdown(*ctl.cfg, static_cast<int64_t>(realtime_ms()));
    log::info("stopped");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice: %s\n", e.what());
    return 1;
  }
}
