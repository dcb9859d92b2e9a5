#pragma once
// shard: how long a loop polls for its next completion before it sleeps.
//
// Sleeping costs a wake-up when the completion comes: the peer's IPI, the
// idle core's exit, the scheduler's switch (tens of µs a hop on a virtual
// machine: bench/RESULTS.md, "Figures behind choices in the code").
// Polling costs the core while it polls. So a loop polls only
// while polling pays, and the window adapts the way KVM adapts its halt
// polling, from how long each wait for a completion took (poll and sleep):
//   - within the window: the poll caught it; the window stays;
//   - longer than the largest window: no poll would have caught it, the
//     window halves (below k_start_ns it is 0: the loop sleeps at once);
//   - in between: a longer poll would have caught it, the window doubles
//     (from k_start_ns), up to the largest.
// Traffic whose next event is microseconds away (a fast backend, a client
// that sends its next request at once) keeps the window open; a GPU backend
// whose tokens are milliseconds apart closes it after a few waits.
#include <algorithm>
#include <cstdint>

namespace sluice::shard {

class poll_window {
 public:
  static constexpr uint64_t k_start_ns = 8'000;

  // max_ns 0: never poll.
  explicit poll_window(uint64_t max_ns = 0) noexcept : _max_ns(max_ns), _ns(max_ns) {}

  uint64_t ns() const noexcept { return _ns; }
  uint64_t max_ns() const noexcept { return _max_ns; }

  // A wait for a completion (the poll, then the sleep if the poll missed)
  // took `waited_ns`.
  void on_wait(uint64_t waited_ns) noexcept {
    if (_max_ns == 0 || waited_ns <= _ns) return;
    if (waited_ns > _max_ns) {
      _ns /= 2;
      if (_ns < k_start_ns) _ns = 0;
    } else {
      _ns = std::min(_max_ns, std::max(k_start_ns, _ns * 2));
    }
  }

 private:
  uint64_t _max_ns;
  uint64_t _ns;
};

}  // namespace sluice::shard
