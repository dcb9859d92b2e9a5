#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "../idle_shard_config.hpp"
#include "sluice/config/config.hpp"
#include "sluice/control/gateway.hpp"

namespace cfg = sluice::config;
using sluice::control::gateway;
using sluice::control::settle_wait;

namespace {

// Two shards; nothing is requested of them.
std::unique_ptr<gateway> start_two_shards() {
  return gateway::start(cfg::load(sluice::test::k_idle_shard_config, "test.toml", {}), {-1, -1});
}

sluice::route::message drain_of_backend_0() {
  sluice::route::message m;
  m.kind = sluice::route::message_kind::backend_drain;
  m.backend = 0;
  m.value = 1;
  return m;
}

// Polls settled(m) for up to 5 s: a woken shard takes its inbox within
// microseconds, so this only bounds a broken wake-up.
bool settles(const gateway& g, const gateway::settle_mark& m) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!g.settled(m)) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace

TEST_SUITE("control::gateway settle marks") {
  TEST_CASE("a mark is settled once every shard has taken what was posted before it") {
    auto g = start_two_shards();
    const gateway::settle_mark before = g->mark();
    CHECK(g->settled(before));  // nothing posted yet
    g->broadcast(drain_of_backend_0());
    const gateway::settle_mark after = g->mark();
    REQUIRE(after.posted.size() == 2);
    CHECK(after.posted[0] == before.posted[0] + 1);
    CHECK(after.posted[1] == before.posted[1] + 1);
    CHECK(settles(*g, after));
    CHECK(g->behind(after) == -1);
  }

  TEST_CASE("a shard behind a mark is named until it stops; a stopped shard counts as settled") {
    auto g = start_two_shards();
    // Ahead of anything ever posted: no running shard can reach it.
    const gateway::settle_mark ahead{{UINT64_MAX, UINT64_MAX}};
    CHECK(g->behind(ahead) == 0);
    g->drain(0);
    g->join();
    CHECK(g->settled(ahead));
  }

  TEST_CASE("a wait is over once settled, or once its bound has passed (not before)") {
    auto g = start_two_shards();
    const settle_wait late({{UINT64_MAX, UINT64_MAX}}, 1000);
    CHECK_FALSE(late.over(*g, 1000));
    CHECK_FALSE(late.over(*g, 1000 + settle_wait::k_bound_ms - 1));
    CHECK(late.over(*g, 1000 + settle_wait::k_bound_ms));  // and a warning names shard 0
    g->broadcast(drain_of_backend_0());
    const settle_wait w(g->mark(), 1000);
    REQUIRE(settles(*g, g->mark()));
    CHECK(w.over(*g, 1000));
  }
}
