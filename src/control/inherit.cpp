// Listening sockets handed over at start (SIGUSR2's SLUICE_INHERIT_FDS,
// systemd's LISTEN_FDS): parsed, checked against the config, taken by the
// gateway and the admin listener, the rest closed. See inherit.hpp.
#include "sluice/control/inherit.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "sluice/core/log.hpp"

namespace sluice::control {

namespace {

// fds 0-2 are stdio: never taken, never closed, whatever a variable says.
constexpr int k_first_fd = 3;
// systemd's SD_LISTEN_FDS_START is 3; a count beyond this is not sockets.
constexpr long k_listen_fds_max = 1024;

bool parse_number(std::string_view s, long& out) noexcept {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool known_role(std::string_view r) noexcept { return r == "listen" || r == "listen_tls" || r == "admin"; }

// An inherited fd is this process's now: close-on-exec, as every fd sluice
// makes (the upgrade clears it only in the child it starts).
void keep_private(int fd) noexcept { ::fcntl(fd, F_SETFD, FD_CLOEXEC); }

bool is_open(int fd) noexcept { return ::fcntl(fd, F_GETFD) >= 0; }

}  // namespace

bool listens_on(int fd, const config::socket_address& addr, bool zero_is_any) noexcept {
  int type = 0, accepting = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  len = sizeof accepting;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || accepting == 0) return false;
  sockaddr_storage ss{};
  len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 || ss.ss_family != addr.storage.ss_family) {
    return false;
  }
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    const auto& b = reinterpret_cast<const sockaddr_in&>(addr.storage);
    return a.sin_addr.s_addr == b.sin_addr.s_addr && ((zero_is_any && b.sin_port == 0) || a.sin_port == b.sin_port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    const auto& b = reinterpret_cast<const sockaddr_in6&>(addr.storage);
    return std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof a.sin6_addr) == 0 &&
           ((zero_is_any && b.sin6_port == 0) || a.sin6_port == b.sin6_port);
  }
  return false;
}

listener_pool listener_pool::parse(const char* inherit_fds, const char* listen_fds, const char* listen_pid,
                                   long pid) {
  listener_pool p;
  if (inherit_fds != nullptr) {
    std::string_view rest(inherit_fds);
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      const size_t dot = item.find('.'), eq = item.find('=');
      long shard = -1, fd = -1;
      if (dot == std::string_view::npos || eq == std::string_view::npos || eq < dot ||
          !known_role(item.substr(0, dot)) || !parse_number(item.substr(dot + 1, eq - dot - 1), shard) ||
          !parse_number(item.substr(eq + 1), fd) || shard < 0 || shard > 4096 || fd < k_first_fd ||
          fd > 1 << 20) {
        log::warn("SLUICE_INHERIT_FDS: ignoring \"{}\" (want ROLE.SHARD=FD, ROLE listen|listen_tls|admin)", item);
        continue;
      }
      if (!is_open(static_cast<int>(fd))) {
        log::warn("SLUICE_INHERIT_FDS: {}: fd {} is not open", item, fd);
        continue;
      }
      bool seen = false;
      for (const entry& e : p._fds) seen |= e.fd == fd;
      if (seen) {
        log::warn("SLUICE_INHERIT_FDS: {}: fd {} named twice; the first one counts", item, fd);
        continue;
      }
      p._fds.push_back({std::string(item.substr(0, dot)), static_cast<uint32_t>(shard), static_cast<int>(fd)});
    }
  }
  if (listen_fds != nullptr) {
    long n = 0, for_pid = 0;
    if (listen_pid == nullptr || !parse_number(listen_pid, for_pid) || for_pid != pid) {
      // Meant for another process (systemd sets it for the one it starts;
      // a child that inherited the variable is not that one).
      log::debug("LISTEN_FDS is not for this process (LISTEN_PID {})", listen_pid ? listen_pid : "unset");
    } else if (!parse_number(listen_fds, n) || n < 0 || n > k_listen_fds_max) {
      log::warn("LISTEN_FDS: ignoring \"{}\" (want a count of sockets from fd 3)", listen_fds);
    } else {
      for (long i = 0; i < n; ++i) {
        const int fd = k_first_fd + static_cast<int>(i);
        if (is_open(fd)) p._fds.push_back({std::string(), 0, fd});
      }
    }
  }
  for (const entry& e : p._fds) keep_private(e.fd);
  return p;
}

listener_pool listener_pool::from_environment() {
  const char* inherit = std::getenv("SLUICE_INHERIT_FDS");
  const char* fds = std::getenv("LISTEN_FDS");
  const char* pid = std::getenv("LISTEN_PID");
  listener_pool p = parse(inherit, fds, pid, static_cast<long>(::getpid()));
  ::unsetenv("SLUICE_INHERIT_FDS");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDNAMES");
  return p;
}

int listener_pool::take(std::string_view role, const config::socket_address& addr, uint32_t shard) {
  for (entry& e : _fds) {
    if (e.claimed || e.role != role || e.shard != shard) continue;
    if (!listens_on(e.fd, addr, true)) continue;  // closed with the rest: the config moved it
    e.claimed = true;
    return e.fd;
  }
  for (entry& e : _fds) {
    if (!e.role.empty() || !listens_on(e.fd, addr, false)) continue;
    if (!e.claimed) {
      e.claimed = true;
      return e.fd;
    }
    const int copy = ::fcntl(e.fd, F_DUPFD_CLOEXEC, k_first_fd);
    return copy >= 0 ? copy : -1;
  }
  return -1;
}

size_t listener_pool::close_unclaimed() {
  size_t n = 0;
  for (entry& e : _fds) {
    if (e.claimed) continue;
    log::warn("inherited fd {} ({}.{}): no listener of this config takes it; closed", e.fd,
              e.role.empty() ? "LISTEN_FDS" : e.role, e.shard);
    ::close(e.fd);
    e.claimed = true;
    ++n;
  }
  return n;
}

}  // namespace sluice::control
