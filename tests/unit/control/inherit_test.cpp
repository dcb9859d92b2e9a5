// control::listener_pool: what SLUICE_INHERIT_FDS and LISTEN_FDS hand over
// is taken only where the socket itself agrees (a listening TCP socket on
// the configured address); anything else is skipped or closed.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "sluice/config/config.hpp"
#include "sluice/control/inherit.hpp"
#include "sluice/net/socket.hpp"

namespace cfg = sluice::config;
using sluice::control::listener_pool;

namespace {

// A listening socket on 127.0.0.1, a free port.
int listener() {
  const cfg::socket_address a = cfg::parse_socket_address("127.0.0.1:0");
  const int fd = sluice::net::listen_socket(reinterpret_cast<const sockaddr*>(&a.storage), a.length, true);
  REQUIRE(fd >= 3);
  return fd;
}

std::string on_port(int fd) { return "127.0.0.1:" + std::to_string(sluice::net::local_port(fd)); }

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

}  // namespace

TEST_SUITE("control::listener_pool") {
  TEST_CASE("an inherited socket is taken by its role and shard on its address") {
    const int a = listener(), b = listener();
    const std::string env = "listen.0=" + std::to_string(a) + ",admin.0=" + std::to_string(b);
    listener_pool p = listener_pool::parse(env.c_str(), nullptr, nullptr, 1);
    CHECK(p.size() == 2);
    // Port 0 in the config: the passing process resolved it; any port does.
    const cfg::socket_address any = cfg::parse_socket_address("127.0.0.1:0");
    CHECK(p.take("listen", any, 1) == -1);  // no shard 1 was passed: bind one
    CHECK(p.take("listen_tls", any, 0) == -1);
    CHECK(p.take("admin", cfg::parse_socket_address(on_port(b)), 0) == b);
    CHECK(p.take("listen", any, 0) == a);
    CHECK(p.close_unclaimed() == 0);
    CHECK((::fcntl(a, F_GETFD) & FD_CLOEXEC) != 0);  // this process's own now
    ::close(a);
    ::close(b);
  }

  TEST_CASE("a socket on another address than the config's is not taken, and closed") {
    const int a = listener();
    const std::string env = "listen.0=" + std::to_string(a);
    listener_pool p = listener_pool::parse(env.c_str(), nullptr, nullptr, 1);
    CHECK(p.take("listen", cfg::parse_socket_address("127.0.0.2:0"), 0) == -1);
    CHECK(p.take("listen", cfg::parse_socket_address("127.0.0.1:1"), 0) == -1);
    CHECK(p.close_unclaimed() == 1);
    CHECK_FALSE(is_open(a));
  }

  TEST_CASE("an fd that is no listening socket is not taken") {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const std::string env = "listen.0=" + std::to_string(pipe_fds[0]);
    listener_pool p = listener_pool::parse(env.c_str(), nullptr, nullptr, 1);
    CHECK(p.take("listen", cfg::parse_socket_address("127.0.0.1:0"), 0) == -1);
    p.close_unclaimed();
    ::close(pipe_fds[1]);
  }

  TEST_CASE("malformed entries are skipped") {
    const int a = listener();
    const std::string fd = std::to_string(a);
    for (const std::string& bad : {"listen=" + fd, "listen.x=" + fd, "tls.0=" + fd, std::string("listen.0="), std::string("listen.0=2"),
                                  "listen.0=" + fd + "x", ".0=" + fd, "listen.-1=" + fd, std::string("listen.0=99999999")}) {
      CAPTURE(bad);
      CHECK(listener_pool::parse(bad.c_str(), nullptr, nullptr, 1).size() == 0);
    }
    // Each good entry of a list counts; a repeated fd only once.
    const std::string list = "junk,listen.0=" + fd + ",listen.1=" + fd;
    CHECK(listener_pool::parse(list.c_str(), nullptr, nullptr, 1).size() == 1);
    ::close(a);
  }

  TEST_CASE("LISTEN_FDS for another pid, or not a count, is not taken") {
    CHECK(listener_pool::parse(nullptr, "1", "1234", 99).size() == 0);
    CHECK(listener_pool::parse(nullptr, "1", nullptr, 99).size() == 0);
    CHECK(listener_pool::parse(nullptr, "many", "99", 99).size() == 0);
    CHECK(listener_pool::parse(nullptr, "-1", "99", 99).size() == 0);
  }
}
