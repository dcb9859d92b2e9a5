#include <doctest/doctest.h>

#include <xxhash.h>

#include <string>

#include "sluice/route/table.hpp"

using namespace sluice::route;

namespace {

std::shared_ptr<const sluice::config::config> load(std::string_view balance, std::string_view extra = "") {
  std::string text = "[[group]]\nname = \"g\"\nbalance = \"" + std::string(balance) + "\"\n" + std::string(extra) +
                     "backends = [\"http://127.0.0.1:8001\", \"http://127.0.0.1:8002\", "
                     "{ url = \"http://127.0.0.1:8003\", weight = 2 }]\n"
                     "[[key]]\nid = \"k\"\nkey = \"k\"\n";
  return sluice::config::load(text, "test.toml", {});
}

route_key_result key(uint64_t i) { return {XXH3_64bits(&i, sizeof i), key_source::prefix}; }

}  // namespace

TEST_SUITE("route::table") {
  TEST_CASE("the same key picks the same backend on every shard") {
    auto cfg = load("session");
    table a(*cfg, 0, 4), b(*cfg, 3, 4);
    for (uint64_t i = 0; i < 1000; ++i) CHECK(a.pick(0, key(i)).backend == b.pick(0, key(i)).backend);
  }

  TEST_CASE("down and draining backends are skipped until they come back") {
    auto cfg = load("session", "health = { panic_threshold_percent = 0 }\n");
    table t(*cfg, 0, 1);
    t.apply({message_kind::backend_down, 0, 0, 0, k_none, 0});
    t.apply({message_kind::backend_drain, 0, 0, 1, k_none, 1});
    CHECK(t.skip_mask(0) == 0b011);
    for (uint64_t i = 0; i < 200; ++i) CHECK(t.pick(0, key(i)).backend == 2);
    t.apply({message_kind::backend_down, 0, 0, 2, k_none, 0});
    CHECK(t.pick(0, key(1)).backend == k_none);
    t.apply({message_kind::backend_up, 0, 0, 0, k_none, 0});
    t.apply({message_kind::backend_drain, 0, 0, 1, k_none, 0});
    CHECK(t.skip_mask(0) == 0b100);
  }

  TEST_CASE("below the panic threshold the down backends serve too; draining ones never") {
    auto cfg = load("session");  // panic_threshold_percent 50 by default
    table t(*cfg, 0, 1);
    t.apply({message_kind::backend_down, 0, 0, 0, k_none, 0});
    CHECK(t.skip_mask(0) == 0b001);  // 2 of 3 healthy: no panic
    t.apply({message_kind::backend_down, 0, 0, 1, k_none, 0});
    CHECK(t.skip_mask(0) == 0);      // 1 of 3 healthy: every backend serves
    bool saw_down = false;
    for (uint64_t i = 0; i < 200; ++i) saw_down |= t.pick(0, key(i)).backend != 2;
    CHECK(saw_down);
    t.apply({message_kind::backend_drain, 0, 0, 0, k_none, 1});
    // 1 of the 2 not draining is healthy: 50% is not below 50%, no panic.
    CHECK(t.skip_mask(0) == 0b011);
    t.apply({message_kind::backend_down, 0, 0, 2, k_none, 0});
    CHECK(t.skip_mask(0) == 0b001);  // none healthy: panic, the drained one stays out
    CHECK(t.pick(0, key(3)).backend != 0);
  }

  TEST_CASE("a pinned backend is picked whatever the key and mode, while it is eligible; else the key decides") {
    for (std::string_view mode : {"session", "prefix", "least-loaded", "round-robin"}) {
      auto cfg = load(mode, "health = { panic_threshold_percent = 0 }\n");
      table t(*cfg, 0, 1);
      for (uint64_t i = 0; i < 100; ++i) {
        route_key_result k = key(i);
        k.pinned = 1;
        const choice c = t.pick(0, k);
        CHECK(c.backend == 1);
        CHECK(t.ring(0).backend(c.position) == 1);
      }
      route_key_result k = key(7);
      k.pinned = 1;
      const choice first = t.pick(0, k);
      // Tried already (a retry), down, or not a member: the key decides.
      CHECK(t.pick(0, k, uint64_t{1} << first.position).backend != 1);
      k.pinned = 9;
      CHECK(t.pick(0, k).backend != k_none);
      k.pinned = 1;
      t.apply({message_kind::backend_down, 0, 0, 1, k_none, 0});
      for (uint64_t i = 0; i < 50; ++i) {
        route_key_result d = key(i);
        d.pinned = 1;
        CHECK(t.pick(0, d).backend != 1);
      }
    }
  }

  TEST_CASE("a retry skips the positions already tried") {
    auto cfg = load("session");
    table t(*cfg, 0, 1);
    const choice first = t.pick(0, key(5));
    const choice second = t.pick(0, key(5), uint64_t{1} << first.position);
    CHECK(second.backend != k_none);
    CHECK(second.backend != first.backend);
    const choice third = t.pick(0, key(5), (uint64_t{1} << first.position) | (uint64_t{1} << second.position));
    CHECK(third.backend != first.backend);
    CHECK(third.backend != second.backend);
    CHECK(t.pick(0, key(5), 0b111).backend == k_none);
  }

  TEST_CASE("the load view sums local in-flight, other shards' reports and vLLM's queue") {
    auto cfg = load("session");
    table t(*cfg, 1, 3);
    t.on_request_start(0);
    t.on_request_start(0);
    t.apply({message_kind::load_report, 0, 0, 0, k_none, 5});
    t.apply({message_kind::load_report, 0, 2, 0, k_none, 1});
    t.apply({message_kind::load_report, 0, 1, 0, k_none, 100});  // its own shard: ignored
    t.apply({message_kind::backend_waiting, 0, 0, 0, k_none, 7});
    CHECK(t.load(0) == 2 + 5 + 1 + 7);
    t.apply({message_kind::load_report, 0, 0, 0, k_none, 2});  // replaces shard 0's last report
    t.on_request_end(0);
    CHECK(t.load(0) == 1 + 2 + 1 + 7);
    CHECK(t.load_report(0).value == 1);
    CHECK(t.load_report(0).shard == 1);
    t.apply({message_kind::load_report, 0, 0, 99, k_none, 2});  // unknown backend: ignored
  }

  TEST_CASE("fair admission: a backend's slots, this shard's slice, and a peer's idle slice lent but never one it is owed") {
    // 3 backends, 4 slots each, 2 shards: slices of 2.
    auto cfg = load("round-robin", "admission = \"fair\"\nmax_inflight_per_backend = 4\nhealth = { panic_threshold_percent = 0 }\n");
    table t(*cfg, 0, 2);
    CHECK(t.fair(0));
    CHECK(t.slot_cap(0) == 4);
    CHECK(t.slot_state(0) == table::slots::free);
    // Every backend full on this shard's slice with a peer that queues: full.
    t.apply(t.queued_report(0, 3));  // its own report: ignored
    for (uint32_t b = 0; b < 3; ++b) {
      t.on_request_start(b);
      t.on_request_start(b);
    }
    CHECK(t.slot_state(0) == table::slots::free);  // nobody else queues: the peer's idle slice is lent
    CHECK_FALSE(t.beyond_slice(0));
    message q = t.queued_report(0, 2);
    q.shard = 1;
    t.apply(q);
    CHECK(t.slot_state(0) == table::slots::full);  // the peer queues and runs nothing: its slices are owed
    CHECK(t.slot_state(0, 0, 1) == table::slots::full);  // at priority 1 (the peer's top level): owed too
    CHECK(t.slot_state(0, 0, 2) == table::slots::free);  // a higher level goes before the peer's waiters
    for (uint64_t i = 0; i < 10; ++i) CHECK(t.pick(0, key(i)).backend == k_none);  // pick passes over full backends
    // The peer runs its own slice on backend 1: nothing more is owed there,
    // but the backend's 4 slots are all taken.
    t.apply({message_kind::load_report, 0, 1, 1, k_none, 2});
    CHECK(t.slot_state(0) == table::slots::full);
    // It runs 1 on backend 2: one slot is free there and one is owed. Still full.
    t.apply({message_kind::load_report, 0, 1, 2, k_none, 1});
    CHECK(t.slot_state(0) == table::slots::full);
    // The peer stops queueing: backend 2's free slot is lent.
    q.value = 0;
    t.apply(q);
    CHECK(t.slot_state(0) == table::slots::free);
    CHECK(t.pick(0, key(1)).backend == 2);
    t.on_request_start(2);
    CHECK(t.beyond_slice(2));
    CHECK(t.slot_state(0) == table::slots::free);  // backend 0: 2 here, 0 on the peer
    t.on_request_start(0);
    t.on_request_start(0);
    CHECK(t.slot_state(0) == table::slots::full);  // 4 + 2 + 1 + 4 running: every slot taken
    // A down backend's slots do not count: with every backend down, none is eligible.
    for (uint32_t b = 0; b < 3; ++b) t.apply({message_kind::backend_down, 0, 0, b, k_none, 0});
    CHECK(t.slot_state(0) == table::slots::none_eligible);
  }

  TEST_CASE("fair admission: pick() judges slots at the level its request was admitted at") {
    auto cfg = load("round-robin", "admission = \"fair\"\nmax_inflight_per_backend = 2\n");
    table t(*cfg, 0, 2);  // slices of 1
    for (uint32_t b = 0; b < 3; ++b) t.on_request_start(b);
    message q = t.queued_report(0, 1);  // the peer queues at level 0
    q.shard = 1;
    t.apply(q);
    CHECK(t.pick(0, key(1)).backend == k_none);  // level 0: the peer's slices are owed
    t.set_admit_level(1);
    CHECK(t.pick(0, key(1)).backend != k_none);  // level 1 goes first
    t.set_admit_level(0);
    // A peer with a level-1 waiter: this shard leaves even its own slice's
    // slots to it at level 0, not at level 1.
    table u(*cfg, 0, 2);
    message hi = u.queued_report(0, 2);
    hi.shard = 1;
    u.apply(hi);
    CHECK(u.slot_state(0) == table::slots::full);
    CHECK(u.slot_state(0, 0, 1) == table::slots::free);
  }

  TEST_CASE("fcfs groups have no slots: every eligible backend is free whatever it runs") {
    auto cfg = load("round-robin");
    table t(*cfg, 0, 1);
    CHECK_FALSE(t.fair(0));
    for (int i = 0; i < 1000; ++i) t.on_request_start(0);
    CHECK(t.slot_cap(0) == 0);
    CHECK(t.slot_state(0) == table::slots::free);
    CHECK_FALSE(t.beyond_slice(0));
  }

  TEST_CASE("the local version moves with every start and end, and only with them") {
    auto cfg = load("session");
    table t(*cfg, 0, 2);
    const uint64_t v0 = t.local_version();
    t.apply({message_kind::load_report, 0, 1, 0, k_none, 3});  // another shard's report
    t.apply({message_kind::backend_waiting, 0, 0, 0, k_none, 4});
    CHECK(t.local_version() == v0);
    t.on_request_start(1);
    const uint64_t v1 = t.local_version();
    CHECK(v1 != v0);
    t.on_request_end(1);  // back to the same count: still a change to report
    CHECK(t.local_version() != v1);
    CHECK(t.local_version() != v0);
  }

  TEST_CASE("a hot key spills under bounded load and stays when it is off") {
    auto spill = load("session");
    auto stay = load("session", "bounded_load = 0\n");
    table on(*spill, 0, 1), off(*stay, 0, 1);
    const uint32_t home = on.pick(0, key(9)).backend;
    for (int i = 0; i < 10; ++i) {
      on.on_request_start(home);
      off.on_request_start(home);
    }
    CHECK(on.pick(0, key(9)).backend != home);
    CHECK(off.pick(0, key(9)).backend == home);
  }

  TEST_CASE("least-loaded and round-robin groups ignore the key") {
    SUBCASE("least-loaded") {
      auto cfg = load("least-loaded");
      table t(*cfg, 0, 1);
      t.on_request_start(0);
      t.on_request_start(1);
      t.on_request_start(2);
      t.on_request_start(2);  // backend 2 has weight 2: 2/2 = 1 per weight, a tie
      t.on_request_start(0);
      CHECK(t.pick(0, key(1)).backend != 0);
    }
    SUBCASE("round-robin") {
      auto cfg = load("round-robin");
      table t(*cfg, 0, 1);
      uint32_t seen[3] = {};
      for (uint64_t i = 0; i < 8; ++i) ++seen[t.pick(0, key(0)).backend];
      CHECK(seen[0] == 2);
      CHECK(seen[1] == 2);
      CHECK(seen[2] == 4);
    }
  }

  TEST_CASE("a weight change rebuilds the group's ring") {
    auto cfg = load("session");
    table t(*cfg, 0, 1);
    CHECK(t.ring(0).weight(2) == 2);
    t.apply({message_kind::backend_weight, 0, 0, 2, 0, 8});
    CHECK(t.ring(0).weight(2) == 8);
    uint32_t on_two = 0;
    for (uint64_t i = 0; i < 10'000; ++i) on_two += t.pick(0, key(i)).backend == 2;
    CHECK(on_two > 7500);  // 8 / 10 of the keys, give or take
    CHECK(on_two < 8500);
  }
}

TEST_SUITE("route::table reload") {
  TEST_CASE("a reloaded table keeps each backend's health, drain and load, and routes keys to the new backend") {
    auto cfg3 = sluice::config::load(
        "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:8001\", \"http://127.0.0.1:8002\", \"http://127.0.0.1:8003\"]\n[[key]]\nid = \"k\"\nkey = \"k\"\n",
        "a.toml", {});
    auto cfg4 = sluice::config::load(
        "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:8001\", \"http://127.0.0.1:8002\", \"http://127.0.0.1:8003\", "
        "\"http://127.0.0.1:8004\"]\n[[key]]\nid = \"k\"\nkey = \"k\"\n",
        "b.toml", {});
    std::vector<std::string> notes;
    auto next = sluice::config::reconcile(*cfg4, *cfg3, sluice::config::capacity_for(*cfg3), notes);
    table old(*cfg3, 1, 2);
    old.apply({message_kind::backend_down, 0, 0, 0, k_none, 0});
    old.apply({message_kind::backend_drain, 0, 0, 1, k_none, 1});
    old.on_request_start(2);
    old.apply({message_kind::load_report, 0, 0, 2, k_none, 5});
    old.apply({message_kind::backend_waiting, 0, 0, 2, k_none, 3});
    table t(*next, old);
    CHECK_FALSE(t.backend_up(0));
    CHECK(t.backend_draining(1));
    CHECK(t.load(2) == 1 + 5 + 3);
    CHECK(t.backend_up(3));
    CHECK(t.load(3) == 0);
    // The in-flight request that started on the old table ends on the new one.
    t.on_request_end(2);
    CHECK(t.load(2) == 5 + 3);
    // Backends 0 and 1 take nothing new: keys land on 2 and 3, both used.
    size_t on_new = 0;
    for (uint64_t i = 0; i < 400; ++i) {
      const uint32_t b = t.pick(0, key(i)).backend;
      CHECK((b == 2 || b == 3));
      on_new += b == 3;
    }
    CHECK(on_new > 100);
  }

  TEST_CASE("a backend removed by a reload is down in the new table") {
    auto cfg2 = sluice::config::load(
        "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:8001\", \"http://127.0.0.1:8002\"]\n[[key]]\nid = \"k\"\nkey = \"k\"\n", "a.toml", {});
    auto cfg1 = sluice::config::load("[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:8002\"]\n[[key]]\nid = \"k\"\nkey = \"k\"\n", "b.toml", {});
    std::vector<std::string> notes;
    auto next = sluice::config::reconcile(*cfg1, *cfg2, sluice::config::capacity_for(*cfg2), notes);
    table old(*cfg2, 0, 1);
    table t(*next, old);
    CHECK_FALSE(t.backend_up(0));
    CHECK(t.backend_up(1));
    for (uint64_t i = 0; i < 100; ++i) CHECK(t.pick(0, key(i)).backend == 1);
  }
}
