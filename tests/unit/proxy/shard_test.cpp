// A shard thread through its public entry point alone: one shard_link built
// by hand, as the control thread builds it, and run_shard on a thread of its
// own. What is checked is the link's contract: what the shard publishes as
// it starts and stops, and how it takes control messages.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "../idle_shard_config.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/proxy/shard.hpp"

namespace proxy = sluice::proxy;
namespace cfg = sluice::config;

namespace {

sluice::metrics::registry::names names_of(const cfg::config& c) {
  sluice::metrics::registry::names n;
  for (const auto& g : c.groups) n.groups.push_back(g.name);
  for (const auto& b : c.backends) n.backends.push_back(b.url);
  for (const auto& k : c.keys) n.keys.push_back(k.id);
  return n;
}

// One shard alone in its mesh (no peer queues), on an ephemeral port.
struct one_shard {
  std::shared_ptr<const cfg::config> config = cfg::load(sluice::test::k_idle_shard_config, "shard_test.toml", {});
  sluice::metrics::registry metrics{1, names_of(*config)};
  std::atomic<sluice::shard::reactor*> reactors[1] = {nullptr};
  std::unique_ptr<std::atomic<int64_t>[]> levels = std::make_unique<std::atomic<int64_t>[]>(config->keys.size() * 2);
  sluice::quota::budget_board budgets{1, static_cast<uint32_t>(config->keys.size()), static_cast<uint32_t>(config->groups.size())};
  proxy::shard_link link;

  one_shard() {
    const cfg::socket_address& la = config->server.listen;
    link.listen_fd = sluice::net::listen_socket(reinterpret_cast<const sockaddr*>(&la.storage), la.length, true);
    link.cfg = config;
    link.metrics = &metrics.shard(0);
    link.mesh.count = 1;
    link.mesh.reactors = reactors;
    link.mesh.to_control = &link.outcomes;
    link.mesh.quota_levels = levels.get();
    link.mesh.quota_keys_max = static_cast<uint32_t>(config->keys.size());
    link.mesh.budgets = &budgets;
  }

  // What the control thread does to post: push, count, wake.
  void post(const proxy::control_message& m) {
    REQUIRE(link.inbox.try_push(m));
    ++link.posted;
    link.reactor->wake();
  }
};

proxy::control_message drain_now() {
  proxy::control_message m;
  m.what = proxy::control_message::kind::drain;
  m.drain_ms = 0;
  return m;
}

}  // namespace

TEST_SUITE("proxy::run_shard") {
  TEST_CASE("a shard says ready with its reactor published, and stopped with it withdrawn after a drain") {
    one_shard s;
    REQUIRE(s.link.listen_fd >= 0);
    std::thread t([&s] { proxy::run_shard(s.link); });
    s.link.ready.wait(false);
    REQUIRE_FALSE(s.link.failed.load());
    CHECK(s.link.listen_fd == -1);  // taken by the shard
    REQUIRE(s.link.reactor != nullptr);
    CHECK(s.reactors[0].load() == s.link.reactor);
    CHECK(s.link.reactor == s.link.owned_reactor.get());

    s.post(drain_now());
    t.join();
    CHECK(s.link.stopped.load());
    CHECK(s.link.applied.load() == 1);
    CHECK(s.reactors[0].load() == nullptr);
    // Kept past the loop: the control thread may still wake it.
    CHECK(s.link.owned_reactor != nullptr);
  }

  TEST_CASE("a shard takes every control message queued before a drain, counting each once") {
    one_shard s;
    std::thread t([&s] { proxy::run_shard(s.link); });
    s.link.ready.wait(false);
    REQUIRE_FALSE(s.link.failed.load());
    proxy::control_message reopen;
    reopen.what = proxy::control_message::kind::reopen_audit;
    s.post(reopen);
    proxy::control_message reload;
    reload.what = proxy::control_message::kind::reload;
    reload.snapshot = new std::shared_ptr<const cfg::config>(s.config);  // the shard deletes it
    s.post(reload);
    s.post(drain_now());
    t.join();
    CHECK(s.link.applied.load() == 3);
    CHECK(s.link.posted == 3);
  }
}
