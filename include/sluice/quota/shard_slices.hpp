#pragma once
// quota: every key's token, request and concurrency budget, split into one
// slice per shard (docs/architecture.md §4, "lock-free token-bucket slice").
//
// Shard-local. One shard_slices per shard per config snapshot; from shard
// start (or reload) until the shard stops. Only its shard calls it: no locks,
// no atomics. Shards talk to each other only through `message`s that the
// caller carries over the SPSC queues (outbox → queue → peer's on_message).
//
// Model. For each key and resource (tokens, requests, concurrency slots) the
// global bucket has capacity G (the per-minute limit, or max_concurrent).
// Shard i holds a slice: a token_bucket with capacity c_i and level l_i.
//   - Capacity is conserved: Σ c_i + Σ capacity in messages not yet applied
//     == G, always. Set-up splits G evenly (the "home share" h_i ≈ G/N).
//   - Each slice holds l_i <= c_i, and every message carries level <=
//     capacity, so Σ levels (slices + in transit) <= G: the invariant of
//     docs/architecture.md §4.
//   - A slice refills at c_i per minute (token_bucket), so the slices' rates
//     add up to at most the global rate: refill is owned by the slice that
//     holds the capacity, and lending moves capacity (hence rate) and
//     tokens, never creates either. Concurrency slots do not refill; they
//     come back at settle().
//
// Lending protocol (all messages are answered; none carries a pointer):
//   - try_reserve() on a slice that cannot cover the cost starts a borrow
//     round: a lend_request to every peer, and answers `wait`. At most one
//     round per (key, resource) is in flight; after one ends, the next waits
//     `borrow_cooldown_ns`, and a try in between is rejected with a retry
//     time, so a dry key costs at most one round per cooldown per shard.
//   - A peer answers every lend_request with one grant (possibly empty). An
//     idle peer (no request of that key in flight, none admitted for
//     `idle_ns`) gives all capacity above a small floor (h / floor_divisor);
//     an active peer gives at most what was asked for, and no more capacity
//     than its tokens back (a busy slice near empty keeps its rate).
//     A grant moves capacity plus as many of the lender's tokens as fit in
//     it; for concurrency only free slots move.
//   - Contention: a peer whose own round for the same (key, resource) is
//     in flight (not yet past round_timeout_ns) lends nothing to a borrower
//     it outranks, so that concurrent rounds cannot just swap equal amounts
//     and leave every slice short. The ranking rotates over the shards
//     every 100 ms (one monotonic clock), so a key that stays contended
//     serves every shard's clients in turn.
//   - tick(): an idle slice holding more than its home share hands the
//     surplus back, split evenly over the peers (give_back), so capacity
//     drifts home once a hot connection goes quiet.
//   - The round ends when every peer answered, or after round_timeout_ns
//     (a peer whose outbox was full drops the request instead of answering;
//     nothing carrying capacity is ever dropped, because capacity is only
//     taken out of a slice once its message has a place in the outbox).
//
// Skew: with all of a key's traffic on one shard, idle peers keep only
// h / floor_divisor each, so the hot shard ends up with at least
// 1 - 1/floor_divisor of the capacity and of the rate (93.75% with the
// default 16; measured in tests/unit/quota/simulation_test.cpp).
//
// With a lender (slices_options::lender; [cluster] mode): one more
// peer, index shard_count (the control thread), is the only source of a
// key's tokens, which it leases from a bucket shared by every instance. A
// token slice then starts empty and never refills (the shared bucket does,
// in Redis); a short slice's borrow round asks the lender alone; an idle
// slice gives all its tokens back to the lender on tick(); settlement
// refunds stay in the slice (the instance's pool), and the idle give-back
// takes them home. Requests per minute and concurrency stay per instance,
// lent between shards as above. Capacity is not conserved for leased token
// slices (it is unbounded: the lender bounds what it grants); the
// invariant is Σ levels (slices + in transit) <= what the lender granted.
//
// Time is a parameter everywhere (now_ns from the reactor's clock).
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "sluice/quota/token_bucket.hpp"

namespace sluice::quota {

enum class resource : uint8_t { tokens = 0, requests = 1, concurrency = 2 };
inline constexpr size_t k_resource_count = 3;

// A key's limits, from config::key_config; 0 = unlimited.
struct key_limits {
  uint64_t tokens_per_minute = 0;
  uint64_t requests_per_minute = 0;
  uint32_t max_concurrent = 0;
};

enum class outcome : uint8_t {
  admit,
  // Not enough here, a borrow round is in flight: park the request and call
  // try_reserve() again when on_message() reports the round complete for
  // this key (or treat it as a 429 with retry_after_ms).
  wait,
  reject_tokens,       // 429, OpenAI type "tokens"
  reject_requests,     // 429, type "requests"
  reject_concurrency,  // 429, type "requests" (too many in flight)
};

// What an admitted request holds until settle(). Trivially copyable; keep it
// in the request's state on the shard that admitted it.
struct reservation {
  uint32_t key = 0;
  int64_t tokens = 0;   // reserved tokens (0 when tokens are unlimited)
  bool live = false;    // true from admission until settle()
};

struct decision {
  outcome result = outcome::admit;
  bool too_large = false;       // cost exceeds the whole bucket: never retry (x-should-retry: false)
  uint32_t retry_after_ms = 0;  // for rejections and wait: when a retry may succeed
  reservation held;             // live only when result == admit
  // wait: the answer to give when the caller cannot wait any longer -- the
  // rejection named after the resource the borrow round is for -- and when
  // a retry may succeed at that resource's own rate.
  outcome wait_rejection = outcome::reject_tokens;
  uint32_t wait_retry_after_ms = 0;
};

enum class message_kind : uint8_t {
  lend_request,  // capacity = tokens wanted
  grant,         // answer to lend_request `round`: capacity and level move to the receiver
  give_back,     // unsolicited surplus from an idle slice
};

// 32 bytes, trivially copyable (spsc_queue requirement). Field order packs
// the 64-bit amounts on 8-byte boundaries without padding.
struct message {
  uint32_t epoch = 0;      // shard_slices generation; stale ones are dropped after a reload
  uint32_t key = 0;
  uint32_t round = 0;      // borrower's round number, echoed by the grant
  uint16_t from_shard = 0;
  message_kind kind = message_kind::lend_request;
  resource res = resource::tokens;
  int64_t capacity = 0;
  // grant, give_back: the level that moves (<= capacity). lend_request: the
  // borrower's round start (ns), so that two contending shards take their
  // priority from the same moment (answer()).
  int64_t level = 0;
};
static_assert(sizeof(message) == 32);

struct slices_options {
  int64_t idle_ns = 1'000'000'000;              // no admission this long and none in flight = idle
  int64_t borrow_cooldown_ns = 10'000'000;      // between two borrow rounds of one (key, resource)
  int64_t round_timeout_ns = 100'000'000;       // a round with missing answers ends after this
  uint32_t floor_divisor = 16;                  // idle slices keep home / floor_divisor
  uint32_t outbox_capacity = 256;               // messages per peer; power of two
  uint32_t epoch = 0;                           // bump on every reload
  // Optional: levels published for the rate-limit headers, one cell per
  // (shard, key, tokens|requests) -- [(shard * keys + key) * 2 + r]. Each
  // shard writes only its own cells (single-writer relaxed atomics, like
  // metrics) and headers() sums the key's cells, so "remaining" is the
  // key's, not one shard's. Null: headers() reports this slice plus what
  // peers hold (an upper bound).
  std::atomic<int64_t>* published = nullptr;
  // Keys per shard in `published` (0 = the key count at construction); a
  // process that may add keys on reload sizes it for them up front.
  uint32_t published_stride = 0;
  // Tokens come from a lender, peer `shard_count` (see the top). With a
  // lender, `published` has one more row, the lender's (what it holds,
  // tokens only), which headers() adds to "remaining".
  bool lender = false;
};

// Returned by on_message(): when round_complete, waiters of `key` should
// call try_reserve() again.
struct message_effect {
  bool round_complete = false;
  uint32_t key = 0;
};

// Values for OpenAI's x-ratelimit-* headers, from this shard's view.
struct rate_window {
  uint64_t limit = 0;      // 0 = unlimited: omit the headers
  uint64_t remaining = 0;  // this slice's level plus the capacity peers hold (an upper bound)
  uint64_t reset_ms = 0;   // until this slice is full again
};
struct rate_headers {
  rate_window requests;
  rate_window tokens;
};

class shard_slices {
 public:
  // Allocates everything it will ever use. Refuses (SLUICE_VERIFY) limits
  // above k_capacity_max and shard_count outside 1..65535.
  shard_slices(uint32_t shard, uint32_t shard_count, std::span<const key_limits> keys, int64_t now_ns,
               const slices_options& options = {});

  // Admission for one request of `key` costing `cost_tokens` (see
  // admission_cost()). Takes the tokens, one request and one concurrency
  // slot together, or nothing.
  decision try_reserve(uint32_t key, uint64_t cost_tokens, int64_t now_ns) noexcept;

  // Reconciles a reservation with the real usage: refunds reserved - actual
  // or charges actual - reserved, and frees the concurrency slot. The
  // request itself stays counted. Returns: false (and changes nothing) when
  // `held` was settled already: settlement happens exactly once.
  bool settle(reservation& held, uint64_t actual_tokens, int64_t now_ns) noexcept;

  // Reload (cold path): appends keys `key_count()`.. with fresh buckets at
  // their home shares, as at construction; existing keys keep everything.
  // Then applies the messages peers sent for those keys before this shard
  // knew them (a peer that reloaded first). Refuses (SLUICE_VERIFY) more
  // keys than the published stride.
  void add_keys(std::span<const key_limits> more, int64_t now_ns);

  // Applies a message from a peer (in the order its queue delivers them).
  message_effect on_message(const message& m, int64_t now_ns) noexcept;

  // Hands idle surplus back; call every ~100 ms from a reactor timer.
  void tick(int64_t now_ns) noexcept;

  rate_headers headers(uint32_t key, int64_t now_ns) noexcept;

  // Outbox: messages for peer `to`, in order. The caller moves them into the
  // SPSC queue to that peer (and wakes it), then consumes what it moved.
  // Messages still here count as in transit for the invariant.
  std::span<const message> outbox_peek(uint32_t to) const noexcept;  // contiguous part; may be a prefix
  void outbox_consume(uint32_t to, size_t count) noexcept;
  size_t outbox_size(uint32_t to) const noexcept;
  // The i-th queued message for `to` (i < outbox_size(to)); for tests.
  const message& outbox_at(uint32_t to, size_t i) const noexcept;
  bool outbox_empty() const noexcept { return _outbox_total == 0; }

  // Moves as much of peer `to`'s outbox as push(const message*, size_t) ->
  // size_t accepts (e.g. spsc_queue::try_push_n). Returns: messages moved.
  template <class Push>
  size_t drain_outbox(uint32_t to, Push&& push) {
    size_t moved = 0;
    for (;;) {
      const auto chunk = outbox_peek(to);
      if (chunk.empty()) return moved;
      const size_t n = push(chunk.data(), chunk.size());
      outbox_consume(to, n);
      moved += n;
      if (n < chunk.size()) return moved;
    }
  }

  // Introspection (tests, metrics). Values as of the last refill.
  int64_t capacity(uint32_t key, resource r) const noexcept;
  int64_t level(uint32_t key, resource r) const noexcept;
  int64_t home(uint32_t key, resource r) const noexcept;
  uint32_t shard() const noexcept { return _shard; }
  uint32_t shard_count() const noexcept { return _shard_count; }
  // Outboxes: one per shard, plus the lender's (index shard_count) when
  // there is one.
  uint32_t peer_count() const noexcept { return _peers; }
  bool has_lender() const noexcept { return _peers > _shard_count; }
  // Whether a leased slice holds `key`'s tokens (a lender, and a limit).
  bool leased(uint32_t key) const noexcept { return at(key, resource::tokens).leased; }
  size_t key_count() const noexcept { return _keys.size(); }

 private:
  struct slice {
    token_bucket bucket;
    int64_t global = 0;           // G: the whole bucket's capacity; 0 = unlimited
    int64_t home = 0;             // this shard's share at set-up
    int64_t reserved = 0;         // tokens: reserved by live reservations (kept out of lending)
    int64_t round_want = 0;       // the level the round in flight aims for
    int64_t round_start_ns = 0;
    int64_t round_end_ns = 0;     // when the last round ended (cooldown)
    uint32_t round = 0;
    uint16_t replies_pending = 0;
    bool leased = false;          // tokens from the lender: no refill, no capacity to conserve
  };
  struct key_state {
    slice slices[k_resource_count];
    int64_t last_admit_ns = 0;
    uint32_t inflight = 0;
  };
  // cooldown: short, and a round just came back short; a rejection whose
  // retry time is the end of the cooldown (the peers may hold more by then:
  // a reservation that was live during the round may have settled).
  enum class step : uint8_t { fits, wait, borrow, reject, cooldown };
  // Contention priority (answer()): whether shard a goes before shard b in
  // the priority slot of `at_ns`.
  bool outranks(uint32_t a, uint32_t b, int64_t at_ns) const noexcept;

  slice& at(uint32_t key, resource r) noexcept { return _keys[key].slices[static_cast<size_t>(r)]; }
  const slice& at(uint32_t key, resource r) const noexcept { return _keys[key].slices[static_cast<size_t>(r)]; }
  bool idle(const key_state& k, int64_t now_ns) const noexcept;
  void init_key(key_state& k, const key_limits& limits, int64_t now_ns);
  void publish(uint32_t key) noexcept;
  step evaluate(slice& s, resource r, int64_t need, int64_t now_ns) noexcept;
  uint32_t retry_ms(const slice& s, resource r, int64_t need) const noexcept;
  bool start_round(slice& s, uint32_t key, resource r, int64_t want, int64_t now_ns) noexcept;
  void answer(const message& request, int64_t now_ns) noexcept;
  void give_back(key_state& k, uint32_t key, resource r, int64_t now_ns) noexcept;
  void give_back_to_lender(slice& s, uint32_t key, int64_t now_ns) noexcept;
  // Refill, except for a leased slice and concurrency (neither refills).
  static void refill(slice& s, resource r, int64_t now_ns) noexcept {
    if (r != resource::concurrency && !s.leased) s.bucket.refill(now_ns);
  }
  bool outbox_push(uint32_t to, const message& m) noexcept;
  bool outbox_full(uint32_t to) const noexcept;

  uint32_t _shard;
  uint32_t _shard_count;
  uint32_t _peers;  // outboxes: shard_count, + 1 with a lender
  slices_options _options;
  std::vector<key_state> _keys;
  uint32_t _stride = 0;                // keys per shard in options.published
  // Messages for keys this shard does not know yet (a peer reloaded first);
  // applied by add_keys(). Reserved up front: on_message never allocates.
  std::vector<message> _early;
  // One ring per peer (the slot of this shard stays empty): free-running
  // head/tail, index & mask.
  std::vector<message> _outbox;
  std::vector<uint64_t> _outbox_head;
  std::vector<uint64_t> _outbox_tail;
  size_t _outbox_total = 0;
};

}  // namespace sluice::quota
