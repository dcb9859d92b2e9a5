// SO_REUSEPORT steering: the classic BPF program that maps the receiving
// CPU to a shard's listener, and the socket options around it. Cold path.
#include "sluice/net/reuseport.hpp"

#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace sluice::net {

namespace {

// linux/filter.h's BPF_STMT / BPF_JUMP are C casts; these are the same
// four fields.
constexpr sock_filter stmt(uint16_t code, uint32_t k) noexcept { return sock_filter{code, 0, 0, k}; }
constexpr sock_filter jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) noexcept {
  return sock_filter{code, jt, jf, k};
}

constexpr uint16_t k_load_word = BPF_LD | BPF_W | BPF_ABS;
// The ancillary "load": the number of the CPU running the program, which
// for a new connection is the CPU that processes its SYN (RSS/RPS).
constexpr uint32_t k_cpu_offset = static_cast<uint32_t>(SKF_AD_OFF + SKF_AD_CPU);

bool contiguous(std::span<const int> cpus) noexcept {
  for (size_t i = 1; i < cpus.size(); ++i) {
    if (cpus[i] != cpus[0] + static_cast<int>(i)) return false;
  }
  return true;
}

}  // namespace

std::vector<sock_filter> steering_program(std::span<const int> cpus) {
  std::vector<sock_filter> code;
  const size_t n = cpus.size();
  if (n == 0 || 2 + 2 * n > BPF_MAXINSNS) return code;
  for (int cpu : cpus) {
    if (cpu < 0) return code;
  }
  const auto past_end = static_cast<uint32_t>(n);
  code.push_back(stmt(k_load_word, k_cpu_offset));
  if (contiguous(cpus)) {
    // A CPU below the first wraps around to a large value (the ALU is
    // unsigned 32-bit), so one bound check covers both ends.
    code.push_back(stmt(BPF_ALU | BPF_SUB | BPF_K, static_cast<uint32_t>(cpus[0])));
    code.push_back(jump(BPF_JMP | BPF_JGE | BPF_K, past_end, 1, 0));
    code.push_back(stmt(BPF_RET | BPF_A, 0));
    code.push_back(stmt(BPF_RET | BPF_K, past_end));
    return code;
  }
  for (size_t i = 0; i < n; ++i) {
    // Equal: fall through to "return i"; else skip it to the next test.
    code.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(cpus[i]), 0, 1));
    code.push_back(stmt(BPF_RET | BPF_K, static_cast<uint32_t>(i)));
  }
  code.push_back(stmt(BPF_RET | BPF_K, past_end));
  return code;
}

int attach_steering(int fd, std::span<const int> cpus) noexcept {
  std::vector<sock_filter> code;
  try {
    code = steering_program(cpus);
  } catch (...) {  // bad_alloc at start-up: no steering, not a failed start
    return -ENOMEM;
  }
  if (code.empty()) return -EINVAL;
  sock_fprog prog{static_cast<unsigned short>(code.size()), code.data()};
  if (::setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0) return -errno;
  return 0;
}

int set_incoming_cpu(int fd, int cpu) noexcept {
  if (::setsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, sizeof cpu) != 0) return -errno;
  return 0;
}

bool address_in_use(const sockaddr* addr, socklen_t len) noexcept {
  const int fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // As listen_socket sets them, so that only a listener (not a connection
  // in TIME_WAIT) makes the bind fail.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr->sa_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  const bool in_use = ::bind(fd, addr, len) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

}  // namespace sluice::net
