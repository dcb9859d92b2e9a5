#pragma once
// net: SO_REUSEPORT steering. The shards' listeners form one SO_REUSEPORT
// group; the kernel picks a listener per new connection by a hash of the
// 4-tuple unless the group carries a program. The program here (classic
// BPF, SO_ATTACH_REUSEPORT_CBPF, Linux 4.5) returns the index of the
// listener whose shard is pinned to the CPU that received the connection,
// so its packets, its accept and its requests stay on one core.
//
// Invariants: the listener at index i is the i-th socket that joined the
// group (listen() order: bind_listeners makes shard i's i-th), and index i
// belongs to the shard pinned to cpus[i]. A CPU without a shard gets an
// index past the end: the kernel then falls back to its hash (it also does
// when a listener has left the group and the indices no longer line up,
// which a draining process tolerates). Cold path: built and attached once
// at start.
#include <linux/filter.h>
#include <sys/socket.h>

#include <span>
#include <vector>

namespace sluice::net {

// The program mapping the receiving CPU to the index of `cpus` holding it
// (cpus ascending, as shard placement lists them); any other CPU maps to
// cpus.size(). A contiguous list becomes a subtraction and two bounds
// checks; any other list a chain of comparisons, one per CPU.
// Returns: empty when the list is empty or too long for one program
// (BPF_MAXINSNS).
std::vector<sock_filter> steering_program(std::span<const int> cpus);

// Attaches steering_program(cpus) to the SO_REUSEPORT group of `fd` (any
// listener of the group).
// Returns: 0, or -errno (-EINVAL for a list steering_program refuses).
int attach_steering(int fd, std::span<const int> cpus) noexcept;

// Sets SO_INCOMING_CPU (Linux 3.19) on a listener: kernels whose
// reuseport hash selection prefers a listener of the receiving CPU (6.x)
// then steer even when another process's listeners share the group and
// no program of ours is attached. Returns: 0 or -errno.
int set_incoming_cpu(int fd, int cpu) noexcept;

// Whether `addr` is already bound by a listener of another socket group
// (another process, or an earlier instance): a bind without SO_REUSEPORT
// fails with EADDRINUSE. A program attached to a shared group would index
// listeners this process does not own, so steering skips the program then.
bool address_in_use(const sockaddr* addr, socklen_t len) noexcept;

}  // namespace sluice::net
