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

void set_nodelay(int fd) noexcept;

// Formats a peer address as text ("127.0.0.1" / "::1") into `out`.
// Returns: bytes written.
size_t format_ip(const sockaddr_storage& ss, char* out, size_t cap) noexcept;

// Raises RLIMIT_NOFILE's soft limit to the hard limit (each stream can hold
// a downstream socket, an upstream socket and two pipes). Returns the limit.
uint64_t raise_fd_limit() noexcept;

}  // namespace sluice::net
