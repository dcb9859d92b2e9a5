#pragma once
// control: listening sockets a process is handed at start instead of
// binding them -- by the process it takes over from (SIGUSR2, variable
// SLUICE_INHERIT_FDS) or by systemd's socket activation (LISTEN_FDS,
// LISTEN_PID). Nothing the environment says is trusted: every fd is checked
// to be a listening TCP socket (SO_ACCEPTCONN, getsockname) on the address
// the config names before it is used, and one that matches nothing is
// closed. Cold path: start-up only.
//
// SLUICE_INHERIT_FDS = entry{,entry}; entry = ROLE "." SHARD "=" FD, ROLE
// one of listen | listen_tls | admin (the [server] keys), e.g.
//   SLUICE_INHERIT_FDS=listen.0=5,listen.1=6,admin.0=7
// Shard i takes its role's socket i. The process that passes them has one
// per shard in one SO_REUSEPORT group; a process with more shards binds the
// rest into that group, one with fewer closes the rest (connections the
// kernel already queued on a closed one are reset when the old process
// closes it too, unless net.ipv4.tcp_migrate_req = 1).
//
// LISTEN_FDS = N (fds 3 .. 3+N-1), honoured only when LISTEN_PID is this
// process's pid. systemd passes one socket per ListenStream=: every shard
// shares it (a dup each: one accept queue that all shards take from). Such
// a socket is matched by its address alone, port included: a listener
// configured on port 0 binds its own.
//
// An inherited listener's port 0 matches any port: the process that passed
// it resolved the 0 when it bound it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"

namespace sluice::control {

// Control-thread-local. One per process, from start-up until the listeners
// are bound; then close_unclaimed().
class listener_pool {
 public:
  // The environment variables (which are then unset, so that nothing the
  // process starts later sees them). Bad entries are logged and skipped.
  static listener_pool from_environment();
  // The same from explicit values (null: unset); `pid`: this process's.
  // For tests.
  static listener_pool parse(const char* inherit_fds, const char* listen_fds, const char* listen_pid, long pid);

  // Returns: an fd for shard `shard` of the listener `role` ("listen",
  // "listen_tls", "admin") configured at `addr` (port 0: any port), owned
  // by the caller; or -1: none was handed over, bind one.
  int take(std::string_view role, const config::socket_address& addr, uint32_t shard);
  // Closes every fd no listener took (logged). Returns: how many.
  size_t close_unclaimed();
  size_t size() const noexcept { return _fds.size(); }

 private:
  struct entry {
    std::string role;   // "" for systemd's: any role whose address it has
    uint32_t shard = 0;
    int fd = -1;
    bool claimed = false;
  };
  std::vector<entry> _fds;
};

// Returns: whether `fd` is a listening TCP socket bound to `addr` (same
// family and IP, same port; any port when addr's is 0 and `zero_is_any`).
bool listens_on(int fd, const config::socket_address& addr, bool zero_is_any) noexcept;

}  // namespace sluice::control
