#pragma once
// cluster: the lender -- the control thread's seat in the shards' lending
// mesh (quota::shard_slices with slices_options::lender). Every shard's
// token slice borrows from it alone; it hands out what its key_lease holds
// of the key's shared bucket, and keeps that lease topped up through Redis
// (key_lease::begin, sent by a lease_calls). Pure: no I/O, no clock; the
// caller moves messages between its outboxes and the SPSC queues.
//
// Control-thread-local. One per process in [cluster] mode, from start-up to
// shutdown; keys are added on reload (limits of existing keys never change,
// as in shard_slices).
//
// What a shard's lend_request gets:
//   - held covers what was asked: at once, what was asked plus a top-up of
//     up to 1 / (2 * shards) of the lease target (so that a steady shard
//     asks a few times per lease, not per request);
//   - else it waits (one per shard and key: a newer round replaces an
//     older one) for the next lease reply, at most defer_ms, then gets what
//     is there (possibly nothing: the shard answers 429 with a retry time).
// A shard's give_back (idle) and every token a shard returns go into the
// lease (key_lease::refund); the surplus goes on to Redis with the next
// give_back call.
//
// Invariant (with shard_slices'): the tokens this instance's shards hold or
// have admitted never exceed what the lender granted, and what it granted
// never exceeds what key_lease took from the shared bucket or its fallback
// allowance (cluster.hpp states the bound across instances).
#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "sluice/cluster/lease.hpp"
#include "sluice/config/config.hpp"
#include "sluice/quota/shard_slices.hpp"

namespace sluice::cluster {

struct bucket_reply;

// Where the lender's calls go (a redis_client in production, a model of the
// shared bucket in tests).
class lease_calls {
 public:
  virtual ~lease_calls() = default;
  // Sends `rq` for `key`. Returns: false when it cannot be sent (nothing
  // will answer); else lender::on_reply(key, rq, ...) follows exactly once.
  virtual bool send(uint32_t key, const key_lease::request& rq) = 0;
};

class lender {
 public:
  struct options {
    uint32_t shard_count = 1;
    uint32_t epoch = 0;      // the shards' slices_options::epoch
    uint32_t defer_ms = 50;  // the longest a lend_request waits for a lease (< the shards' round timeout)
    // The lender's row of the shards' published levels, or null: in the
    // tokens cell, what it holds plus its estimate of the shared bucket's
    // level (what "remaining" adds to the shards' own levels).
    std::atomic<int64_t>* published = nullptr;
    uint32_t published_stride = 0;
  };

  // `limits`: each key's tokens per minute (0 = unlimited: never asked).
  // The keys start apart (no lease until the first connected step).
  lender(const options& o, const config::cluster_config& c, std::span<const uint64_t> limits, uint64_t now_ms);

  // Reload: keys key_count().. with these limits.
  void add_keys(std::span<const uint64_t> limits, uint64_t now_ms);

  // A message from a shard (lend_request or give_back for tokens).
  void on_message(const quota::message& m, uint64_t now_ms);
  // Each loop turn: follows the connection (apart / rejoin), sends each
  // active key's next lease call, serves waiting requests whose wait is
  // over, and publishes what it holds.
  void step(uint64_t now_ms, bool connected, lease_calls& calls);
  // The answer to a call sent for `key`: the script's reply, or null when
  // the call failed.
  void on_reply(uint32_t key, const key_lease::request& rq, const bucket_reply* reply, uint64_t now_ms);

  // Grants for shard `s`, in order; the caller moves what fits into the
  // shard's queue and consumes that many.
  std::span<const quota::message> outbox(uint32_t s) const noexcept { return _outbox[s]; }
  void consume(uint32_t s, size_t n);
  bool outbox_empty() const noexcept;

  // For /keys/{id}, metrics and tests.
  struct key_view {
    uint64_t limit = 0;
    double held = 0;           // in the lease (not at the shards)
    double owed = 0;           // admitted while apart, not yet charged
    bool apart = true;
    uint64_t granted = 0;      // to shards, since the start
    uint64_t returned = 0;     // from shards, since the start
    int64_t global_level = -1;   // the shared bucket's level at the last reply (-1: none yet)
    int64_t outstanding = -1;    // the instances' lease records then
    uint64_t leases = 0;       // lease calls answered
  };
  key_view view(uint32_t key) const noexcept;
  size_t key_count() const noexcept { return _keys.size(); }
  bool connected() const noexcept { return _connected; }

 private:
  struct waiting {
    int64_t want = 0;       // 0: none
    uint32_t round = 0;
    uint64_t since_ms = 0;
  };
  struct key_state {
    uint64_t limit = 0;
    key_lease lease;
    bool active = false;    // a shard has asked: keep its lease topped up
    uint32_t waiters = 0;
    std::vector<waiting> wait;  // by shard
    uint64_t granted = 0, returned = 0, leases = 0;
    int64_t global_level = -1, outstanding = -1;
    uint64_t reply_ms = 0;  // when global_level was read
    key_state(uint64_t l, const key_lease::params& p, uint64_t now_ms, uint32_t shards)
        : limit(l), lease(p, now_ms), wait(shards) {}
  };

  void serve(uint32_t key, uint64_t now_ms, bool deadline_only);
  void grant(uint32_t key, uint32_t to, uint32_t round, int64_t tokens, uint64_t now_ms);
  void publish(uint32_t key, uint64_t now_ms) noexcept;
  int64_t top_up(const key_state& k, uint64_t now_ms) const noexcept;

  options _o;
  config::cluster_config _c;
  std::vector<key_state> _keys;
  std::vector<std::vector<quota::message>> _outbox;  // by shard
  bool _connected = false;
};

}  // namespace sluice::cluster
