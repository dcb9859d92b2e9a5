#include <string_view>
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "sluice/shard/reactor.hpp"

using sluice::shard::completion;
using sluice::shard::reactor;

namespace {
struct nop_probe : completion {
  int calls = 0;
  int res = -1;
};
}  // namespace

TEST_SUITE("shard::reactor") {
  TEST_CASE("a completion's handler runs with its own CQE") {
    auto r = reactor::create(reactor::options{});
    REQUIRE(r != nullptr);
    nop_probe p;
    p.fn = [](completion* c, const io_uring_cqe* cqe) {
      auto* self = static_cast<nop_probe*>(c);
      ++self->calls;
      self->res = cqe->res;
    };
    io_uring_prep_nop(r->sqe(&p));
    for (int i = 0; i < 50 && p.calls == 0; ++i) r->run_once(100);
    CHECK(p.calls == 1);
    CHECK(p.res == 0);
  }

  TEST_CASE("another thread's wake() ends a loop that waits with nothing to do") {
    reactor::options o;
    o.tick_ms = 60000;  // without the wake-up the loop would sleep a minute
    auto r = reactor::create(o);
    REQUIRE(r != nullptr);
    std::atomic<bool> stop{false};
    struct ctx_t {
      reactor* r;
      std::atomic<bool>* stop;
      int iterations = 0;
    } ctx{r.get(), &stop};
    reactor::hooks h;
    h.ctx = &ctx;
    h.on_iteration = [](void* p, uint64_t) {
      auto* c = static_cast<ctx_t*>(p);
      ++c->iterations;
      if (c->stop->load()) c->r->stop();
    };
    std::thread waker([&] {
      stop = true;
      r->wake();
    });
    r->run(h);
    waker.join();
    CHECK(ctx.iterations >= 1);
    CHECK(r->stopping());
  }

  TEST_CASE("the ring falls back to plain flags when asked not to use the newer ones") {
    reactor::options o;
    o.single_issuer = false;
    o.defer_taskrun = false;
    auto r = reactor::create(o);
    REQUIRE(r != nullptr);
    CHECK(std::string_view(r->setup_mode()).find("single_issuer") == std::string_view::npos);
  }
}
