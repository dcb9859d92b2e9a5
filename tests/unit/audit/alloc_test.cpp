// Recording a request's audit line runs once per request on a shard: it must
// not call the allocator. This binary counts every operator new and checks
// the count does not move while records are formatted and appended.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>

#include "../alloc_counter.hpp"
#include "sluice/audit/writer.hpp"

TEST_SUITE("audit::allocation") {
  TEST_CASE("formatting and appending records, batch hand-offs included, allocates nothing") {
    auto r = sluice::shard::reactor::create(sluice::shard::reactor::options{});
    REQUIRE(r != nullptr);
    sluice::audit::writer::options o;
    o.buffer_bytes = 32 * 1024;
    o.max_buffer_bytes = o.buffer_bytes;  // steady state: no burst growth (that path allocates, by design)
    auto w = sluice::audit::writer::open(*r, "/dev/null", o);
    REQUIRE(w != nullptr);
    sluice::audit::record rec;
    rec.request_id = "req-\"1\"\n";
    rec.key_id = "alice";
    rec.model = "qwen\xFF";
    rec.status = 429;
    rec.error = "rate_limit_exceeded";
    char line[sluice::audit::max_line_bytes];

    // No doctest macro inside the window: they may allocate themselves.
    const size_t before = sluice::test::allocations();
    size_t formatted = 0;
    unsigned appended = 0;
    for (int i = 0; i < 5000; ++i) {
      formatted += sluice::audit::format_line(rec, line, sizeof line);
      // Both buffers busy: wait for the write in flight (an io-wq hop), so
      // batches really are handed over inside the window.
      // A failed try counts as dropped: that path is exercised too.
      bool ok = w->append(rec);
      for (int spins = 0; spins < 1000 && !ok; ++spins) {
        r->run_once(1);
        ok = w->append(rec);
      }
      appended += ok ? 1u : 0u;
      w->tick(static_cast<uint64_t>(i));
    }
    const size_t after = sluice::test::allocations();

    CHECK(before > 0);  // the counting operator new is the one in use
    CHECK(after == before);
    CHECK(formatted > 0);
    CHECK(appended > 0);
    CHECK(w->stats().batches_written.get() > 0);  // hand-offs happened inside the window
    CHECK(w->close());
  }
}
