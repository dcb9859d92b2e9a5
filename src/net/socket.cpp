#include "sluice/net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sluice::net {

int listen_socket(const sockaddr* addr, socklen_t len, bool reuse_port, int backlog) noexcept {
  int fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuse_port && ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    int e = errno;
    ::close(fd);
    return -e;
  }
  if (addr->sa_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd, addr, len) != 0 || ::listen(fd, backlog) != 0) {
    int e = errno;
    ::close(fd);
    return -e;
  }
  return fd;
}

uint16_t local_port(int fd) noexcept {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void set_nodelay(int fd) noexcept {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int stream_socket(int family) noexcept {
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  set_nodelay(fd);
  return fd;
}

int upstream_socket(int family) noexcept {
  const int fd = stream_socket(family);
  if (fd < 0) return fd;
  const int on = 1;
  const int idle_s = k_upstream_keepalive_idle_s;
  const int interval_s = k_upstream_keepalive_interval_s;
  const int probes = k_upstream_keepalive_probes;
  const unsigned user_timeout_ms = k_upstream_user_timeout_ms;
  if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms) != 0) {
    // Not expected on a TCP socket; a connection without them would hang
    // for minutes on a dead backend, so it is not made.
    const int e = errno;
    ::close(fd);
    return -e;
  }
  return fd;
}

size_t format_ip(const sockaddr_storage& ss, char* out, size_t cap) noexcept {
  const char* r = nullptr;
  if (ss.ss_family == AF_INET) {
    r = ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, out,
                    static_cast<socklen_t>(cap));
  } else if (ss.ss_family == AF_INET6) {
    r = ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, out,
                    static_cast<socklen_t>(cap));
  }
  return r != nullptr ? std::strlen(out) : 0;
}

uint64_t raise_fd_limit() noexcept {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace sluice::net
