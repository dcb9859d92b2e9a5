// The metrics writers run per request and per loop iteration on a shard:
// they must not call the allocator. This binary counts every operator new.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>

#include "../alloc_counter.hpp"
#include "sluice/metrics/registry.hpp"

TEST_SUITE("metrics::allocation") {
  TEST_CASE("hot-path increments and observations allocate nothing") {
    using namespace sluice::metrics;
    registry reg(2, registry::names{{"g0", "g1"}, {"b0", "b1", "b2"}, {"alice", "bob"}});
    shard_metrics& m = reg.shard(1);

    // No doctest macro inside the window: they may allocate themselves.
    const size_t before = sluice::test::allocations();
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
    const size_t after = sluice::test::allocations();

    CHECK(before > 0);  // the counting operator new is the one in use
    CHECK(after == before);
  }
}
