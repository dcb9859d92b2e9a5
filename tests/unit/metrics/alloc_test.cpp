// The metrics writers run per request and per loop iteration on a shard:
// they must not call the allocator. This binary counts every operator new.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>

#include "sluice/metrics/registry.hpp"

namespace {
size_t g_allocations = 0;
}  // namespace

void* operator new(size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

TEST_SUITE("metrics::allocation") {
  TEST_CASE("hot-path increments and observations allocate nothing") {
    using namespace sluice::metrics;
    registry reg(2, registry::names{{"g0", "g1"}, {"b0", "b1", "b2"}, {"alice", "bob"}});
    shard_metrics& m = reg.shard(1);

    // No doctest macro inside the window: they may allocate themselves.
    const size_t before = g_allocations;
    for (uint32_t i = 0; i < 10000; ++i) {
      m.inflight_add();
      m.request_done(i % 3 == 0 ? none : i % 2, i % 4 == 0 ? none : i % 3, static_cast<uint16_t>(200 + i % 400));
      m.tokens(i % 2, i, 2 * i);
      m.quota_rejected(i % 2, static_cast<reject_reason>(i % reject_reason_count));
      m.observe_ttft_us(i % 2, i * 100);
      m.observe_duration_us(none, i * 1000);
      m.set_loop(i, 2 * i);
      m.inflight_sub();
    }
    const size_t after = g_allocations;

    CHECK(before > 0);  // the counting operator new is the one in use
    CHECK(after == before);
  }
}
