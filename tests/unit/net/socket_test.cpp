#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sluice/net/socket.hpp"

namespace net = sluice::net;

namespace {

int int_option(int fd, int level, int name) {
  int value = -1;
  socklen_t len = sizeof value;
  REQUIRE(::getsockopt(fd, level, name, &value, &len) == 0);
  REQUIRE(len == sizeof value);
  return value;
}

}  // namespace

TEST_SUITE("net::socket") {
  TEST_CASE("an upstream socket has keepalive and a user timeout, so a dead backend fails in seconds") {
    for (int family : {AF_INET, AF_INET6}) {
      CAPTURE(family);
      const int fd = net::upstream_socket(family);
      if (family == AF_INET6 && fd == -EAFNOSUPPORT) continue;  // a host without IPv6
      REQUIRE(fd >= 0);
      CHECK(int_option(fd, SOL_SOCKET, SO_KEEPALIVE) == 1);
      CHECK(int_option(fd, IPPROTO_TCP, TCP_KEEPIDLE) == 10);
      CHECK(int_option(fd, IPPROTO_TCP, TCP_KEEPINTVL) == 5);
      CHECK(int_option(fd, IPPROTO_TCP, TCP_KEEPCNT) == 3);
      CHECK(int_option(fd, IPPROTO_TCP, TCP_USER_TIMEOUT) == 15000);
      // What stream_socket gives stays: non-blocking, close-on-exec, no Nagle.
      CHECK(int_option(fd, IPPROTO_TCP, TCP_NODELAY) == 1);
      CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
      CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
      ::close(fd);
    }
  }
}
