// Admission and settlement run per request on a shard: once set up, they
// must not call the allocator. This binary counts every operator new.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>
#include <vector>

#include "../alloc_counter.hpp"
#include "sluice/quota/budget.hpp"
#include "sluice/quota/duration.hpp"
#include "sluice/quota/estimate.hpp"
#include "sluice/quota/shard_slices.hpp"

using namespace sluice::quota;

TEST_SUITE("quota::allocation") {
  TEST_CASE("reserve, settle, lending, ticks, headers and the estimator allocate nothing") {
    const std::vector<key_limits> keys = {key_limits{3000, 60, 4}, key_limits{0, 0, 0}};
    auto* a = new shard_slices(0, 2, keys, 0);
    auto* b = new shard_slices(1, 2, keys, 0);
    const char text[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"你好, hello 123\"}]}";

    // No doctest macro inside the window: they may allocate themselves.
    const size_t before = sluice::test::allocations();
    int admitted = 0, waited = 0;
    uint64_t estimate = 0;
    size_t formatted = 0;
    char duration[k_duration_chars_max];
    for (int64_t i = 0; i < 200; ++i) {
      const int64_t now = i * 1'000'000;
      estimate += estimate_input_tokens(text);
      decision d = a->try_reserve(0, admission_cost(20, 600, 1, 2), now);
      if (d.result == outcome::wait) ++waited;
      if (d.result == outcome::admit) {
        ++admitted;
        a->settle(d.held, 100, now);
      }
      decision u = a->try_reserve(1, 5000, now);
      a->settle(u.held, 10, now);
      // The message pump, both ways.
      message m;
      while (!a->outbox_empty()) {
        m = a->outbox_peek(1)[0];
        a->outbox_consume(1, 1);
        b->on_message(m, now);
      }
      while (!b->outbox_empty()) {
        m = b->outbox_peek(0)[0];
        b->outbox_consume(0, 1);
        a->on_message(m, now);
      }
      a->tick(now);
      b->tick(now + 2'000'000'000);
      const rate_headers h = a->headers(0, now);
      formatted += format_duration(h.tokens.reset_ms, duration);
    }
    const size_t after = sluice::test::allocations();

    CHECK(before > 0);  // the counting operator new is the one in use
    CHECK(after == before);
    CHECK(admitted > 0);
    CHECK(waited > 0);
    CHECK(estimate > 0);
    CHECK(formatted > 0);
    delete b;
    delete a;
  }

  TEST_CASE("budgets on the shard side -- counting, the bits at admission, the reset time -- allocate nothing") {
    auto* board = new budget_board(2, 4, 2);
    const size_t before = sluice::test::allocations();
    uint64_t bits = 0, left = 0;
    size_t formatted = 0;
    char reset[k_utc_chars];
    for (uint32_t i = 0; i < 1000; ++i) {
      bits += board->key_exhausted(i % 4) | board->group_exhausted(i % 2);
      board->count(i % 2, i % 4, i % 2, 17, spend_nano(10, 7, 0.15, 0.6));
      left += board->key_left(i % 4, budget_kind::daily_tokens);
      const budget_windows w = windows_at(1'796'000'000'000 + i);
      formatted += format_utc(day_end_ms(w.day), reset) + format_utc(month_end_ms(w.month), reset);
    }
    const size_t after = sluice::test::allocations();
    CHECK(before > 0);
    CHECK(after == before);
    CHECK(bits == 0);
    CHECK(formatted == 2000 * 20);
    CHECK(board->key_tokens(0) == 250 * 17);
    delete board;
  }
}
