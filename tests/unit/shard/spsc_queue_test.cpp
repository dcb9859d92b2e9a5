#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "sluice/shard/spsc_queue.hpp"

using sluice::shard::spsc_queue;

namespace {

// Trivially copyable but not default constructible: the queue must not need
// a default constructor.
struct message {
  explicit message(uint64_t s) : seq(s), check(~s * 0x9e3779b97f4a7c15ull) {}
  uint64_t seq;
  uint64_t check;  // derived from seq: a torn or stale copy fails the check
};

bool intact(const message& m) { return m.check == ~m.seq * 0x9e3779b97f4a7c15ull; }

// Sanitizers slow the stress test 10-50x; SLUICE_SPSC_STRESS_MESSAGES
// overrides the count either way.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint64_t k_default_stress_messages = 1'000'000;
#else
constexpr uint64_t k_default_stress_messages = 10'000'000;
#endif

uint64_t stress_messages() {
  if (const char* env = std::getenv("SLUICE_SPSC_STRESS_MESSAGES")) return std::strtoull(env, nullptr, 10);
  return k_default_stress_messages;
}

// Waiting side of the stress test: spin briefly, then give the CPU away
// (the test machine may have fewer cores than threads).
void backoff(unsigned& misses) {
  if (++misses % 64 == 0) std::this_thread::yield();
}

// Producer and consumer on two threads, mixing single and batched calls with
// batch sizes that do not divide the capacity, so that batches straddle the
// wrap. The consumer checks every sequence number arrives exactly once, in
// order, with intact contents.
template <size_t Capacity>
void run_stress(uint64_t total) {
  auto q = std::make_unique<spsc_queue<message, Capacity>>();
  // Set by the consumer when it gives up, so that a broken queue fails the
  // test instead of leaving the producer waiting on a full queue forever.
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    uint64_t next = 0;
    unsigned misses = 0;
    std::vector<message> batch;
    while (next < total && !stop.load(std::memory_order_relaxed)) {
      if (next % 3 == 0) {
        if (q->try_push(message(next))) {
          ++next;
        } else {
          backoff(misses);
        }
        continue;
      }
      const uint64_t want = std::min<uint64_t>(1 + next % 37, total - next);
      batch.clear();
      for (uint64_t i = 0; i < want; ++i) batch.emplace_back(next + i);
      size_t pushed = q->try_push_n(batch.data(), batch.size());
      if (pushed == 0) backoff(misses);
      next += pushed;
    }
  });

  uint64_t expected = 0;
  uint64_t errors = 0;
  unsigned misses = 0;
  std::vector<message> out(64, message(0));
  while (expected < total && errors == 0) {
    size_t got = 0;
    if (expected % 2 == 0) {
      got = q->try_pop(out[0]) ? 1 : 0;
    } else {
      got = q->try_pop_n(out.data(), 1 + expected % 53);
    }
    if (got == 0) backoff(misses);
    for (size_t i = 0; i < got; ++i) {
      if (out[i].seq != expected || !intact(out[i])) ++errors;
      ++expected;
    }
  }
  stop.store(true, std::memory_order_relaxed);
  producer.join();
  CHECK(errors == 0);
  CHECK(expected == total);
  message extra(0);
  CHECK_FALSE(q->try_pop(extra));
}

}  // namespace

TEST_SUITE("shard::spsc_queue") {
  TEST_CASE("items come out in the order they went in") {
    spsc_queue<int, 8> q;
    for (int i = 0; i < 5; ++i) CHECK(q.try_push(i));
    for (int i = 0; i < 5; ++i) {
      int v = -1;
      REQUIRE(q.try_pop(v));
      CHECK(v == i);
    }
  }

  TEST_CASE("an empty queue pops nothing and leaves the output untouched") {
    spsc_queue<int, 4> q;
    int v = 42;
    CHECK(q.empty());
    CHECK(q.size_approx() == 0);
    CHECK_FALSE(q.try_pop(v));
    CHECK(v == 42);
    int batch[3] = {7, 7, 7};
    CHECK(q.try_pop_n(batch, 3) == 0);
    CHECK(batch[0] == 7);
  }

  TEST_CASE("a full queue refuses pushes until one slot is freed") {
    spsc_queue<int, 4> q;
    static_assert(spsc_queue<int, 4>::capacity() == 4);
    for (int i = 0; i < 4; ++i) CHECK(q.try_push(i));
    CHECK(q.size_approx() == 4);
    CHECK_FALSE(q.try_push(99));
    int more[2] = {98, 99};
    CHECK(q.try_push_n(more, 2) == 0);
    int v = -1;
    REQUIRE(q.try_pop(v));
    CHECK(v == 0);
    CHECK(q.try_push(4));
    CHECK_FALSE(q.try_push(5));
    for (int i = 1; i <= 4; ++i) {
      REQUIRE(q.try_pop(v));
      CHECK(v == i);
    }
    CHECK(q.empty());
  }

  TEST_CASE("indices wrap around the slots many times without losing order") {
    spsc_queue<uint32_t, 4> q;
    uint32_t pushed = 0, popped = 0;
    for (int round = 0; round < 1000; ++round) {
      for (int i = 0; i < 3; ++i) REQUIRE(q.try_push(pushed++));
      for (int i = 0; i < 3; ++i) {
        uint32_t v = 0;
        REQUIRE(q.try_pop(v));
        REQUIRE(v == popped++);
      }
    }
    CHECK(q.empty());
  }

  TEST_CASE("a batch push takes what fits and a batch pop takes what is there") {
    spsc_queue<int, 8> q;
    int in[12];
    for (int i = 0; i < 12; ++i) in[i] = i;
    CHECK(q.try_push_n(in, 5) == 5);
    CHECK(q.try_push_n(in + 5, 7) == 3);  // only 3 slots left
    CHECK(q.size_approx() == 8);
    int out[12] = {};
    CHECK(q.try_pop_n(out, 6) == 6);
    for (int i = 0; i < 6; ++i) CHECK(out[i] == i);
    // This batch crosses the end of the slot array.
    CHECK(q.try_push_n(in + 8, 4) == 4);
    CHECK(q.try_pop_n(out, 12) == 6);  // asks for more than there is
    CHECK(out[0] == 6);
    CHECK(out[1] == 7);
    for (int i = 2; i < 6; ++i) CHECK(out[i] == i + 6);
    CHECK(q.try_pop_n(out, 12) == 0);
    CHECK(q.try_push_n(in, 0) == 0);
    CHECK(q.empty());
  }

  TEST_CASE("single and batched calls mix in one stream") {
    spsc_queue<message, 16> q;
    uint64_t next = 0, expected = 0;
    std::vector<message> batch;
    std::vector<message> out(16, message(0));
    for (int round = 0; round < 200; ++round) {
      REQUIRE(q.try_push(message(next++)));
      batch.clear();
      for (int i = 0; i < round % 7; ++i) batch.emplace_back(next + static_cast<uint64_t>(i));
      next += q.try_push_n(batch.data(), batch.size());
      message one(0);
      REQUIRE(q.try_pop(one));
      CHECK(one.seq == expected++);
      size_t got = q.try_pop_n(out.data(), 1 + static_cast<size_t>(round % 5));
      for (size_t i = 0; i < got; ++i) CHECK(out[i].seq == expected++);
    }
    message rest(0);
    while (q.try_pop(rest)) CHECK(rest.seq == expected++);
    CHECK(expected == next);
  }

  TEST_CASE("the queue is laid out on whole cache lines") {
    using q = spsc_queue<message, 64>;
    CHECK(alignof(q) == 64);
    CHECK(sizeof(q) % 64 == 0);
    // two index lines + the slots
    CHECK(sizeof(q) == 2 * 64 + 64 * sizeof(message));
  }

  TEST_CASE("two threads pass every message exactly once and in order") {
    const uint64_t total = stress_messages();
    SUBCASE("capacity 1024") { run_stress<1024>(total); }
    SUBCASE("capacity 2: the queue is almost always full or empty") { run_stress<2>(total / 50); }
  }
}
