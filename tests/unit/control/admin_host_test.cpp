#include <doctest/doctest.h>

#include "sluice/control/admin.hpp"

using sluice::control::own_host;

TEST_SUITE("control::own_host (DNS rebinding)") {
  TEST_CASE("IP literals and localhost, with no port or the listener's own") {
    for (const char* h : {"127.0.0.1:9090", "127.0.0.1", "localhost:9090", "LocalHost", "[::1]:9090", "[::1]",
                          "10.1.2.3:9090", "[2001:db8::1]:9090"}) {
      CAPTURE(h);
      CHECK(own_host(h, 9090));
    }
  }

  TEST_CASE("any other name, another port, or a malformed host is refused") {
    for (const char* h : {"evil.example:9090", "evil.example", "127.0.0.1.nip.io:9090", "localhost.evil:9090",
                          "127.0.0.1:9091", "127.0.0.1:99999999", "127.0.0.1:90a0", "[::1", "[::1]x",
                          "[evil]:9090", "", ":9090", "1.2.3:9090", "0x7f.0.0.1:9090"}) {
      CAPTURE(h);
      CHECK_FALSE(own_host(h, 9090));
    }
  }
}
