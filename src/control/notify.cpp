// sd_notify's wire protocol (notify.hpp): a datagram, no reply.
#include "sluice/control/notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "sluice/core/log.hpp"

namespace sluice::control {

bool notify_address(std::string_view name, void* addr, unsigned& len) noexcept {
  auto* a = static_cast<sockaddr_un*>(addr);
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (name.size() < 2 || (name[0] != '/' && name[0] != '@')) return false;
  // A path needs its NUL inside sun_path; an abstract name has none.
  if (name.size() > sizeof a->sun_path - (name[0] == '/' ? 1 : 0)) return false;
  std::memcpy(a->sun_path, name.data(), name.size());
  if (name[0] == '@') a->sun_path[0] = '\0';
  len = static_cast<unsigned>(offsetof(sockaddr_un, sun_path) + name.size() + (name[0] == '/' ? 1 : 0));
  return true;
}

bool service_notify(std::string_view state) noexcept {
  const char* v = std::getenv("NOTIFY_SOCKET");
  if (v == nullptr || *v == '\0') return false;
  sockaddr_un a;
  unsigned len = 0;
  if (!notify_address(v, &a, len)) {
    log::warn("NOTIFY_SOCKET: not a socket name: \"{}\"", v);
    return false;
  }
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    log::warn("NOTIFY_SOCKET: socket: {}", std::strerror(errno));
    return false;
  }
  const ssize_t n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&a), len);
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(state.size())) {
    log::warn("NOTIFY_SOCKET {}: {}", v, n < 0 ? std::strerror(err) : "short send");
    return false;
  }
  return true;
}

}  // namespace sluice::control
