#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "sluice/net/buffer_ring.hpp"
#include "sluice/shard/reactor.hpp"

using sluice::net::buffer_ring;
using sluice::shard::completion;
using sluice::shard::reactor;

namespace {
struct recv_probe : completion {
  int results = 0;
  int bytes = 0;
  bool more = false;
  uint16_t bid = 0;
  char seen[64] = {};
  buffer_ring* ring = nullptr;
};
}  // namespace

TEST_SUITE("net::buffer_ring") {
  TEST_CASE("a multishot receive lands in provided buffers that are recycled") {
    auto r = reactor::create(reactor::options{});
    REQUIRE(r != nullptr);
    auto br = buffer_ring::create(r->ring(), 7, 4, 64);
    REQUIRE(br != nullptr);
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);

    recv_probe probe;
    probe.ring = br.get();
    probe.fn = [](completion* c, const io_uring_cqe* cqe) {
      auto* p = static_cast<recv_probe*>(c);
      ++p->results;
      p->more = (cqe->flags & IORING_CQE_F_MORE) != 0;
      if (cqe->res > 0 && (cqe->flags & IORING_CQE_F_BUFFER) != 0) {
        p->bid = static_cast<uint16_t>(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
        std::memcpy(p->seen + p->bytes, p->ring->buffer(p->bid), static_cast<size_t>(cqe->res));
        p->bytes += cqe->res;
        p->ring->recycle(p->bid);
      }
    };
    io_uring_sqe* s = r->sqe(&probe);
    io_uring_prep_recv_multishot(s, sv[0], nullptr, 0, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = 7;

    // More messages than buffers: works only if recycled buffers go back.
    for (int i = 0; i < 10; ++i) {
      REQUIRE(::write(sv[1], "ab", 2) == 2);
      for (int spins = 0; probe.bytes < 2 * (i + 1) && spins < 100; ++spins) {
        r->run_once(100);
        br->publish();
      }
    }
    CHECK(probe.bytes == 20);
    CHECK(std::memcmp(probe.seen, "abababababababababab", 20) == 0);
    CHECK(probe.more);
    ::close(sv[0]);
    ::close(sv[1]);
  }
}
