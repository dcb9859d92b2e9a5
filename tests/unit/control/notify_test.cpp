// control::service_notify: sd_notify's datagram reaches a socket bound where
// NOTIFY_SOCKET says (a path or an abstract name), byte for byte; a bad
// name or no variable sends nothing.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "sluice/control/notify.hpp"

using sluice::control::notify_address;
using sluice::control::service_notify;

namespace {

// A datagram socket bound at `name` (NOTIFY_SOCKET's syntax).
int bound(const std::string& name) {
  sockaddr_un a;
  unsigned len = 0;
  REQUIRE(notify_address(name, &a, len));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) == 0);
  return fd;
}

std::string receive(int fd) {
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  return n < 0 ? std::string("<nothing>") : std::string(buf, static_cast<size_t>(n));
}

}  // namespace

TEST_SUITE("control::service_notify") {
  TEST_CASE("a path: the state arrives as one datagram") {
    char dir[] = "/tmp/sluice-notify-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const std::string path = std::string(dir) + "/notify";
    const int fd = bound(path);
    ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
    CHECK(service_notify("READY=1"));
    CHECK(receive(fd) == "READY=1");
    CHECK(service_notify("MAINPID=4242"));
    CHECK(receive(fd) == "MAINPID=4242");
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd);
    ::unlink(path.c_str());
    ::rmdir(dir);
  }

  TEST_CASE("an abstract name (@...)") {
    const std::string name = "@sluice-notify-test-" + std::to_string(::getpid());
    const int fd = bound(name);
    ::setenv("NOTIFY_SOCKET", name.c_str(), 1);
    CHECK(service_notify("STOPPING=1"));
    CHECK(receive(fd) == "STOPPING=1");
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd);
  }

  TEST_CASE("no variable, a relative, empty or too long name: nothing is sent") {
    ::unsetenv("NOTIFY_SOCKET");
    CHECK_FALSE(service_notify("READY=1"));
    sockaddr_un a;
    unsigned len = 0;
    CHECK_FALSE(notify_address("", &a, len));
    CHECK_FALSE(notify_address("run/notify", &a, len));
    CHECK_FALSE(notify_address("/", &a, len));
    CHECK_FALSE(notify_address("/" + std::string(sizeof a.sun_path, 'x'), &a, len));
    CHECK(notify_address("@" + std::string(sizeof a.sun_path - 1, 'x'), &a, len));  // no NUL needed
    CHECK(notify_address("/" + std::string(sizeof a.sun_path - 2, 'x'), &a, len));  // its NUL fits
    ::setenv("NOTIFY_SOCKET", "relative/path", 1);
    CHECK_FALSE(service_notify("READY=1"));
    // A name where nothing listens: the send fails, reported, no crash.
    ::setenv("NOTIFY_SOCKET", "/nonexistent-dir/notify", 1);
    CHECK_FALSE(service_notify("READY=1"));
    ::unsetenv("NOTIFY_SOCKET");
  }
}
