#pragma once
// net: sockets. Listeners are one per shard with SO_REUSEPORT so the kernel
// spreads connections over shards; upstream sockets are non-blocking and
// connected through io_uring.
#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "sluice/core/result.hpp"

namespace sluice::net {

// Returns: a listening socket fd bound to `addr` (SO_REUSEADDR, SO_REUSEPORT
// when `reuse_port`), or -errno.
int listen_socket(const sockaddr* addr, socklen_t len, bool reuse_port, int backlog = 4096) noexcept;

// Returns: the port a bound socket got (for listen addresses with port 0).
uint16_t local_port(int fd) noexcept;

// Returns: a non-blocking, close-on-exec TCP socket for `family`, with
// TCP_NODELAY, or -errno.
int stream_socket(int family) noexcept;

// What upstream_socket sets. A pooled connection to a backend that vanished
// (power loss, a black-holing firewall) sends no RST: without these it is
// found dead only by first_byte_timeout_ms (120 s) of the request that
// reuses it. Keepalive finds an idle one dead after idle + probes x interval
// (25 s); TCP_USER_TIMEOUT fails one with unacknowledged data (a request
// just sent) after 15 s and caps the keepalive probing too. A live backend
// in a long prefill is not affected: its kernel acknowledges the request and
// answers the probes.
inline constexpr int k_upstream_keepalive_idle_s = 10;
inline constexpr int k_upstream_keepalive_interval_s = 5;
inline constexpr int k_upstream_keepalive_probes = 3;
inline constexpr unsigned k_upstream_user_timeout_ms = 15000;

// Returns: a stream_socket for a backend connection, with SO_KEEPALIVE
// (TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT) and TCP_USER_TIMEOUT (Linux
// 2.6.37) as above, or -errno.
int upstream_socket(int family) noexcept;

void set_nodelay(int fd) noexcept;

// Formats a peer address as text ("127.0.0.1" / "::1") into `out`.
// Returns: bytes written.
size_t format_ip(const sockaddr_storage& ss, char* out, size_t cap) noexcept;

// Raises RLIMIT_NOFILE's soft limit to the hard limit (each stream can hold
// a downstream socket, an upstream socket and two pipes). Returns the limit.
uint64_t raise_fd_limit() noexcept;

}  // namespace sluice::net
