#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "sluice/net/reuseport.hpp"
#include "sluice/net/socket.hpp"

namespace net = sluice::net;

namespace {

// A reference interpreter for the instructions steering_program emits,
// run with the receiving CPU as the one input. Any other instruction, a
// jump out of the program or a missing return is a failure (nullopt), so
// a program the kernel's checker would refuse fails here too.
std::optional<uint32_t> run(const std::vector<sock_filter>& code, uint32_t cpu) {
  uint32_t a = 0;
  for (size_t pc = 0; pc < code.size(); ++pc) {
    const sock_filter& f = code[pc];
    switch (f.code) {
      case BPF_LD | BPF_W | BPF_ABS:
        if (f.k != static_cast<uint32_t>(SKF_AD_OFF + SKF_AD_CPU)) return std::nullopt;
        a = cpu;
        break;
      case BPF_ALU | BPF_SUB | BPF_K:
        a -= f.k;
        break;
      case BPF_JMP | BPF_JEQ | BPF_K:
        pc += a == f.k ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JGE | BPF_K:
        pc += a >= f.k ? f.jt : f.jf;
        break;
      case BPF_RET | BPF_A:
        return a;
      case BPF_RET | BPF_K:
        return f.k;
      default:
        return std::nullopt;
    }
  }
  return std::nullopt;
}

// What the program must compute: the index of the cpu in the list, else
// the list's length (out of range: the kernel hashes).
uint32_t expected(const std::vector<int>& cpus, uint32_t cpu) {
  for (size_t i = 0; i < cpus.size(); ++i) {
    if (static_cast<uint32_t>(cpus[i]) == cpu) return static_cast<uint32_t>(i);
  }
  return static_cast<uint32_t>(cpus.size());
}

void check_mapping(const std::vector<int>& cpus) {
  const std::vector<sock_filter> code = net::steering_program(cpus);
  REQUIRE_FALSE(code.empty());
  CHECK(code.size() <= BPF_MAXINSNS);
  for (uint32_t cpu = 0; cpu < 300; ++cpu) {
    CAPTURE(cpu);
    CHECK(run(code, cpu) == expected(cpus, cpu));
  }
  CHECK(run(code, 0xffffffffu) == cpus.size());
}

int reuseport_listener() {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = net::listen_socket(reinterpret_cast<const sockaddr*>(&a), sizeof a, true, 16);
  REQUIRE(fd >= 0);
  return fd;
}

}  // namespace

TEST_SUITE("net::reuseport") {
  TEST_CASE("a contiguous cpu list maps each cpu to its shard, any other cpu past the end") {
    check_mapping({0, 1});
    check_mapping({8, 9, 10, 11, 12, 13, 14, 15});
    check_mapping({5});
    // Short: a subtraction and one bound check, not a comparison per cpu.
    CHECK(net::steering_program(std::vector<int>{64, 65, 66, 67, 68, 69, 70, 71}).size() == 5);
  }

  TEST_CASE("a list with gaps maps through a chain of comparisons") {
    check_mapping({0, 2, 4, 6});
    check_mapping({0, 1, 2, 3, 16, 17, 18, 19});  // a node with SMT siblings
    check_mapping({7, 250});
  }

  TEST_CASE("an empty, negative or too long list makes no program") {
    CHECK(net::steering_program(std::vector<int>{}).empty());
    CHECK(net::steering_program(std::vector<int>{-1}).empty());
    std::vector<int> many;
    for (int cpu = 0; cpu < 4096; cpu += 2) many.push_back(cpu);  // 2048 with gaps: 4098 instructions
    CHECK(net::steering_program(many).empty());
    many.pop_back();
    check_mapping(many);
  }

  TEST_CASE("the kernel takes the program on a SO_REUSEPORT listener") {
    const int fd = reuseport_listener();
    CHECK(net::attach_steering(fd, std::vector<int>{0, 1}) == 0);
    CHECK(net::attach_steering(fd, std::vector<int>{1, 3, 8}) == 0);
    CHECK(net::attach_steering(fd, std::vector<int>{}) == -EINVAL);
    CHECK(net::set_incoming_cpu(fd, 0) == 0);
    ::close(fd);
  }

  TEST_CASE("an address held by a listener is in use; a free one is not") {
    const int fd = reuseport_listener();
    sockaddr_in a{};
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    CHECK(net::address_in_use(reinterpret_cast<const sockaddr*>(&a), len));
    ::close(fd);
    CHECK_FALSE(net::address_in_use(reinterpret_cast<const sockaddr*>(&a), len));
  }
}
