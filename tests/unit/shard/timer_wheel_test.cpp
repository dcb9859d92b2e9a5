#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "sluice/shard/timer_wheel.hpp"

using sluice::shard::timer;
using sluice::shard::timer_wheel;

namespace {

struct item {
  timer t;
  int id = 0;
  int fired = 0;
};

std::vector<int> fire(timer_wheel& w, uint64_t now) {
  std::vector<int> ids;
  w.expire(now, [&](timer& t) {
    auto* it = static_cast<item*>(t.owner);
    ++it->fired;
    ids.push_back(it->id);
  });
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

TEST_SUITE("shard::timer_wheel") {
  TEST_CASE("a timer fires at the first expire at or past its deadline, once") {
    timer_wheel w(1000);
    item a;
    a.t.owner = &a;
    a.id = 1;
    w.arm(a.t, 1100);
    CHECK(w.size() == 1);
    CHECK(fire(w, 1050).empty());
    CHECK(fire(w, 1099).empty());
    CHECK(fire(w, 1100) == std::vector<int>{1});
    CHECK_FALSE(a.t.armed());
    CHECK(w.size() == 0);
    CHECK(fire(w, 5000).empty());
    CHECK(a.fired == 1);
  }

  TEST_CASE("a deadline more than a turn away waits for its turn") {
    timer_wheel w(0);
    item a;
    a.t.owner = &a;
    const uint64_t far = 3 * timer_wheel::k_slots * timer_wheel::k_slot_ms + 5;
    w.arm(a.t, far);
    for (uint64_t now = 0; now < far; now += 7) CHECK(fire(w, now).empty());
    CHECK(fire(w, far).size() == 1);
  }

  TEST_CASE("re-arming moves a timer and cancelling removes it") {
    timer_wheel w(0);
    item a, b;
    a.t.owner = &a;
    b.t.owner = &b;
    a.id = 1;
    b.id = 2;
    w.arm(a.t, 100);
    w.arm(b.t, 100);
    w.arm(a.t, 500);  // moved
    w.cancel(b.t);
    w.cancel(b.t);    // twice: a no-op
    CHECK(w.size() == 1);
    CHECK(fire(w, 200).empty());
    CHECK(fire(w, 500) == std::vector<int>{1});
  }

  TEST_CASE("a callback may re-arm itself, and cancel or arm others of the same slot") {
    timer_wheel w(0);
    item a, b, c;
    for (item* i : {&a, &b, &c}) i->t.owner = i;
    a.id = 1;
    b.id = 2;
    c.id = 3;
    w.arm(a.t, 40);
    w.arm(b.t, 41);
    w.arm(c.t, 42);
    std::vector<int> order;
    w.expire(50, [&](timer& t) {
      auto* it = static_cast<item*>(t.owner);
      order.push_back(it->id);
      if (it == &a) {
        w.cancel(b.t);         // b, due in the same walk, does not fire
        w.arm(a.t, 1000);      // a again, later
        w.arm(c.t, 10);        // c moved into the past: fires in now's slot
      }
    });
    CHECK((order == std::vector<int>{1, 3}));
    CHECK(fire(w, 51).empty());
    CHECK(fire(w, 1000) == std::vector<int>{1});
    CHECK(w.size() == 0);
  }

  TEST_CASE("after a stall longer than a turn, everything due fires") {
    std::vector<item> items(100);
    timer_wheel w(0);
    for (int i = 0; i < 100; ++i) {
      items[static_cast<size_t>(i)].t.owner = &items[static_cast<size_t>(i)];
      w.arm(items[static_cast<size_t>(i)].t, static_cast<uint64_t>(i) * 97);
    }
    CHECK(fire(w, 100000).size() == 100);
    CHECK(w.size() == 0);
  }

  TEST_CASE("an empty wheel's expire still moves on: timers armed after it fire on time") {
    timer_wheel w(0);
    item a, b;
    a.t.owner = &a;
    a.id = 1;
    b.t.owner = &b;
    b.id = 2;
    // Idle for more than a turn: the expire walks nothing but moves the cursor.
    CHECK(fire(w, 10 * timer_wheel::k_slots * timer_wheel::k_slot_ms).empty());
    const uint64_t now = 10 * timer_wheel::k_slots * timer_wheel::k_slot_ms;
    w.arm(a.t, now + 3 * timer_wheel::k_slot_ms);  // a few slots ahead
    w.arm(b.t, now - 50);                          // already past: the next expire
    CHECK(fire(w, now) == std::vector<int>{2});
    CHECK(fire(w, now + 3 * timer_wheel::k_slot_ms - 1).empty());
    CHECK(fire(w, now + 3 * timer_wheel::k_slot_ms) == std::vector<int>{1});
    // An expire for an earlier time than the last one does nothing.
    w.arm(a.t, now + 100);
    CHECK(fire(w, now).empty());
    CHECK(fire(w, now + 100) == std::vector<int>{1});
    CHECK(w.size() == 0);
  }

  TEST_CASE("differential: the same timers fire as with a sorted reference, in time") {
    // Random arms, moves and cancels over simulated time; each expire's
    // fired set must equal the reference's set of deadlines <= now.
    std::mt19937_64 rng(12345);
    std::vector<item> items(300);  // before the wheel: outlives it
    timer_wheel w(10);
    for (size_t i = 0; i < items.size(); ++i) {
      items[i].t.owner = &items[i];
      items[i].id = static_cast<int>(i);
    }
    std::map<int, uint64_t> ref;  // id -> deadline
    uint64_t now = 10;
    for (int step = 0; step < 20000; ++step) {
      const uint64_t r = rng() % 100;
      item& it = items[rng() % items.size()];
      if (r < 45) {
        const uint64_t dl = now + rng() % 12000;  // up to ~3 turns out
        w.arm(it.t, dl);
        ref[it.id] = dl;
      } else if (r < 55) {
        w.cancel(it.t);
        ref.erase(it.id);
      } else {
        now += rng() % 40;
        std::set<int> want;
        for (auto [id, dl] : ref) {
          if (dl <= now) want.insert(id);
        }
        std::set<int> got;
        w.expire(now, [&](timer& t) { got.insert(static_cast<item*>(t.owner)->id); });
        REQUIRE(got == want);
        for (int id : got) ref.erase(id);
        REQUIRE(w.size() == ref.size());
      }
    }
  }
}
