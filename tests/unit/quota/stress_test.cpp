// Real threads, real spsc_queues: each thread is a shard that admits,
// settles, lends and ticks on its own slices only. Afterwards the queues are
// drained and the global bucket must be intact (capacity conserved exactly),
// and what was admitted must fit the bucket over the run's wall time.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "sluice/quota/shard_slices.hpp"
#include "sluice/shard/spsc_queue.hpp"

using namespace sluice::quota;

namespace {
using queue = sluice::shard::spsc_queue<message, 256>;

int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct shard_result {
  int64_t consumed = 0;  // actual usage settled
  int64_t live = 0;      // reservations still held
  int64_t admitted = 0;
  int64_t waited = 0;
  bool local_invariant = true;
};
}  // namespace

TEST_SUITE("quota::stress") {
  TEST_CASE("threads lending over spsc queues never admit more than the global bucket and conserve it") {
    constexpr uint32_t shards = 4;
    const int64_t per_minute = 600'000;  // 10,000 tokens per second
    const std::vector<key_limits> keys = {key_limits{static_cast<uint64_t>(per_minute), 0, 8}};
    const int64_t start_ns = clock_ns();
    std::vector<std::unique_ptr<shard_slices>> slices;
    slices_options o;
    o.idle_ns = 20'000'000;
    o.borrow_cooldown_ns = 200'000;
    for (uint32_t i = 0; i < shards; ++i) {
      slices.push_back(std::make_unique<shard_slices>(i, shards, keys, start_ns, o));
    }
    std::vector<std::unique_ptr<queue>> links(shards * shards);  // [from * shards + to]
    for (auto& l : links) l = std::make_unique<queue>();
    std::atomic<bool> stop{false};
    std::vector<shard_result> results(shards);

    const auto run = [&](uint32_t me) {
      shard_slices& s = *slices[me];
      std::mt19937_64 rng(me + 1);
      shard_result& r = results[me];
      std::vector<reservation> held;
      message in[16];
      uint64_t iteration = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const int64_t now = clock_ns();
        for (uint32_t from = 0; from < shards; ++from) {
          if (from == me) continue;
          const size_t n = links[from * shards + me]->try_pop_n(in, 16);
          for (size_t i = 0; i < n; ++i) s.on_message(in[i], now);
        }
        // Skewed traffic: shard 0 asks every iteration, the others rarely.
        if (me == 0 || rng() % 64 == 0) {
          decision d = s.try_reserve(0, 50 + rng() % 200, now);
          if (d.result == outcome::admit) {
            ++r.admitted;
            ++r.live;
            held.push_back(d.held);
          } else if (d.result == outcome::wait) {
            ++r.waited;
          }
        }
        if (!held.empty() && rng() % 3 == 0) {
          reservation h = held.front();
          held.erase(held.begin());
          // Mostly the full reservation, sometimes less (a refund).
          const uint64_t actual = rng() % 4 == 0 ? rng() % (static_cast<uint64_t>(h.tokens) + 1)
                                                 : static_cast<uint64_t>(h.tokens);
          r.consumed += static_cast<int64_t>(actual);
          --r.live;
          s.settle(h, actual, now);
        }
        if (++iteration % 256 == 0) s.tick(now);
        for (uint32_t to = 0; to < shards; ++to) {
          if (to == me) continue;
          s.drain_outbox(to, [&](const message* m, size_t n) { return links[me * shards + to]->try_push_n(m, n); });
        }
        for (resource res : {resource::tokens, resource::concurrency}) {
          if (s.level(0, res) > s.capacity(0, res)) r.local_invariant = false;
        }
      }
      const int64_t now = clock_ns();
      for (auto& h : held) {
        --r.live;
        s.settle(h, 0, now);  // cancelled before any output: full refund
      }
    };

    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < shards; ++i) threads.emplace_back(run, i);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the workload's length, not a synchronisation
    stop.store(true);
    for (auto& t : threads) t.join();
    const int64_t end_ns = clock_ns();

    // Quiesce: deliver everything left (answers may produce more messages).
    for (int round = 0; round < 100; ++round) {
      size_t moved = 0;
      for (uint32_t me = 0; me < shards; ++me) {
        for (uint32_t to = 0; to < shards; ++to) {
          if (to == me) continue;
          moved += slices[me]->drain_outbox(
              to, [&](const message* m, size_t n) { return links[me * shards + to]->try_push_n(m, n); });
        }
      }
      message m;
      for (uint32_t from = 0; from < shards; ++from) {
        for (uint32_t to = 0; to < shards; ++to) {
          if (from == to) continue;
          while (links[from * shards + to]->try_pop(m)) {
            slices[to]->on_message(m, end_ns);
            ++moved;
          }
        }
      }
      if (moved == 0) break;
    }

    int64_t capacity = 0, slots = 0, live = 0, consumed = 0, admitted = 0, waited = 0;
    for (uint32_t i = 0; i < shards; ++i) {
      CHECK(results[i].local_invariant);
      CHECK(slices[i]->outbox_empty());
      CHECK(slices[i]->level(0, resource::tokens) <= slices[i]->capacity(0, resource::tokens));
      capacity += slices[i]->capacity(0, resource::tokens);
      slots += slices[i]->capacity(0, resource::concurrency);
      CHECK(slices[i]->level(0, resource::concurrency) == slices[i]->capacity(0, resource::concurrency));
      live += results[i].live;
      consumed += results[i].consumed;
      admitted += results[i].admitted;
      waited += results[i].waited;
    }
    CHECK(capacity == per_minute);
    CHECK(slots == 8);
    CHECK(live == 0);  // everything was settled
    // Usage charged never exceeds the burst plus the rate over the run.
    const int64_t budget = per_minute + per_minute * (end_ns - start_ns) / k_ns_per_minute;
    CHECK(consumed <= budget);
    CHECK(admitted > 100);
    CHECK(waited > 0);  // lending really happened across threads
    MESSAGE("stress: ", consumed, " of ", budget, " tokens consumed, ", admitted, " admitted, ", waited, " wait answers while borrowing, ",
            (end_ns - start_ns) / 1'000'000, " ms");
  }
}
