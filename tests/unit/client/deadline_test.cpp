// The client codecs' deadlines: an upstream wait under the exchange's total
// deadline, and a rendered Messages stream's ping ticks beside its idle
// deadline.
#include <doctest/doctest.h>

#include "downstream_conn.hpp"

using namespace sluice::proxy;

TEST_SUITE("client deadlines") {
  TEST_CASE("an upstream wait never runs past the exchange's total deadline") {
    CHECK(deadline_at(deadline_kind::none, 100, 50, 0) == 0);
    CHECK(deadline_at(deadline_kind::idle, 100, 0, 0) == 0);
    CHECK(deadline_at(deadline_kind::idle, 100, 50, 120) == 150);  // not an upstream wait: no cap
    CHECK(deadline_at(deadline_kind::upstream_first_byte, 100, 50, 0) == 150);
    CHECK(deadline_at(deadline_kind::upstream_first_byte, 100, 50, 120) == 120);
    CHECK(deadline_at(deadline_kind::upstream_idle, 100, 50, 400) == 150);
    CHECK(deadline_at(deadline_kind::upstream_connect, 100, 0, 400) == 400);  // no own bound: the total
  }

  TEST_CASE("a pinged stream's timer: the next ping tick when it comes first; the idle deadline kept apart") {
    stream_pings r;
    CHECK(idle_or_ping_at(r, 100, 5000) == 5000);  // no pings: the deadline itself
    CHECK(r.idle_due_ms == 5000);
    CHECK_FALSE(ping_tick(r, 4000));
    r.ping_ms = 1000;
    CHECK(idle_or_ping_at(r, 100, 5000) == 1100);
    CHECK(r.idle_due_ms == 5000);
    CHECK(ping_tick(r, 1100));
    CHECK(idle_rest_ms(r, 1100) == 3900);  // armed again for the rest (deadline_at: 1100 + 3900)
    CHECK(idle_or_ping_at(r, 4500, 5000) == 5000);  // the deadline before the next tick
    CHECK_FALSE(ping_tick(r, 5000));                // due: the idle deadline's own work
    CHECK(idle_or_ping_at(r, 100, 0) == 1100);      // no idle deadline at all: ticks alone
    CHECK(ping_tick(r, 1100));
    CHECK(idle_rest_ms(r, 1100) == 0);
    CHECK(k_ping_chunk.substr(4, k_ping_event.size()) == k_ping_event);
  }
}
