#include <doctest/doctest.h>

#include "sluice/shard/poll_window.hpp"

using sluice::shard::poll_window;

TEST_SUITE("shard::poll_window") {
  TEST_CASE("a window of 0 never polls, whatever the waits") {
    poll_window w(0);
    CHECK(w.ns() == 0);
    w.on_wait(1'000);
    w.on_wait(10'000'000);
    CHECK(w.ns() == 0);
  }

  TEST_CASE("it starts at its largest and stays while polls catch their completion") {
    poll_window w(50'000);
    CHECK(w.ns() == 50'000);
    for (int i = 0; i < 100; ++i) w.on_wait(40'000);
    CHECK(w.ns() == 50'000);
  }

  TEST_CASE("waits longer than the largest window halve it down to 0") {
    poll_window w(50'000);
    w.on_wait(20'000'000);
    CHECK(w.ns() == 25'000);
    w.on_wait(20'000'000);
    CHECK(w.ns() == 12'500);
    w.on_wait(20'000'000);  // 6'250 is below k_start_ns: closed
    CHECK(w.ns() == 0);
    w.on_wait(20'000'000);
    CHECK(w.ns() == 0);
  }

  TEST_CASE("a wait a longer poll would have caught reopens the window, doubling up to the largest") {
    poll_window w(50'000);
    for (int i = 0; i < 3; ++i) w.on_wait(1'000'000'000);
    REQUIRE(w.ns() == 0);
    w.on_wait(30'000);
    CHECK(w.ns() == poll_window::k_start_ns);
    w.on_wait(30'000);
    CHECK(w.ns() == 2 * poll_window::k_start_ns);
    w.on_wait(30'000);
    CHECK(w.ns() == 4 * poll_window::k_start_ns);
    w.on_wait(45'000);
    CHECK(w.ns() == 50'000);  // capped
    w.on_wait(50'000);        // exactly the window: caught
    CHECK(w.ns() == 50'000);
  }

  TEST_CASE("a largest window below the start value opens to the largest and closes on one long wait") {
    poll_window w(5'000);
    w.on_wait(10'000'000);
    CHECK(w.ns() == 0);
    w.on_wait(4'000);
    CHECK(w.ns() == 5'000);
  }
}
