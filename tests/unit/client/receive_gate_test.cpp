#include <doctest/doctest.h>

#include "receive_gate.hpp"

using sluice::proxy::receive_gate;

TEST_SUITE("proxy::receive_gate") {
  TEST_CASE("a multishot receive that ends on its own is armed again") {
    receive_gate g;
    CHECK(g.wants_arm());
    g.on_armed();
    CHECK_FALSE(g.wants_arm());
    g.on_ended();  // -ENOBUFS, or the kernel ended it
    CHECK(g.wants_arm());
  }

  TEST_CASE("a pause cancels an armed receive once and keeps it off until resumed") {
    receive_gate g;
    g.on_armed();
    CHECK(g.pause());
    CHECK_FALSE(g.pause());  // a second full batch: the cancel is out already
    g.on_ended();            // -ECANCELED
    CHECK_FALSE(g.wants_arm());
    g.resume();
    CHECK(g.wants_arm());
  }

  TEST_CASE("a cancel whose completion comes after the resume re-arms the receive") {
    // The response ended (resume) before the cancel's -ECANCELED came back:
    // the resume saw the receive still armed and could not arm it; the
    // completion must, or the connection never reads again.
    receive_gate g;
    g.on_armed();
    REQUIRE(g.pause());
    g.resume();
    CHECK_FALSE(g.wants_arm());  // still armed: nothing to do yet
    g.on_ended();
    CHECK(g.wants_arm());
  }

  TEST_CASE("a pause with no receive armed asks for no cancel and keeps it off") {
    receive_gate g;
    CHECK_FALSE(g.pause());
    CHECK_FALSE(g.wants_arm());
    g.resume();
    CHECK(g.wants_arm());
  }
}
