#pragma once
// control: budgets, run from the control thread's loop (README "Budgets").
// Owns the board the shards count on and the ledger over it: every ~50 ms it
// sums the shards' counters and publishes which budgets are used up; about
// once a second (and at shutdown) it keeps the usage in the state file --
// or, with [cluster] redis, every 100 ms in Redis, whose answer brings the
// other instances' usage. Also renders the budget metrics and GET /keys/{id}.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/config/config.hpp"
#include "sluice/quota/budget.hpp"

namespace sluice::cluster {
class redis_budget_store;
}
namespace sluice::shard {
class reactor;
}

namespace sluice::control {

class gateway;

// Control-thread-local. One per process, made before the gateway (the
// shards get its board) and destroyed after the shards are joined.
class budget_keeper {
 public:
  static constexpr uint64_t k_period_ms = 50;

  // Sizes the board for `shards` and the config's reload room, and loads
  // the usage: from Redis with [cluster] redis (at most 2 x [cluster]
  // timeout_ms; unreachable: logged, started from 0 and synced later),
  // else from the state file (quota.budget_state_file; "" = none). Throws
  // std::runtime_error naming the file when it is refused.
  budget_keeper(const config::config& cfg, size_t shards);
  ~budget_keeper();
  quota::budget_board& board() noexcept { return *_board; }

  // With [cluster]: Redis's connection on the control thread's reactor,
  // which must run (on_iteration) until shutdown(). No-op without.
  void attach(shard::reactor& r);

  // Each loop turn: the Redis client's deadlines; every k_period_ms the
  // last push's answer, a ledger step, and a push when the store's period
  // is due (state file: once a second while usage changes; Redis: every
  // 100 ms). `unix_ms`: the wall clock.
  void on_iteration(const config::config& cfg, uint64_t mono_ms, int64_t unix_ms);
  // After every shard stopped, before the reactor goes: the last step and
  // a save, whatever changed (Redis: waited for, at most [cluster]
  // timeout_ms), then the connection ends.
  void shutdown(const config::config& cfg, int64_t unix_ms);
  // SIGUSR2, once the new process serves: from here this process's view
  // goes where the new one takes it (budget_file_store's hand-over).
  void hand_over();

  // Prometheus families sluice_budget_*; appended to `out`.
  void render_metrics(const config::config& cfg, int64_t unix_ms, std::string& out) const;
  // GET /keys/{id}: the key's limits, levels and budgets as JSON. Returns:
  // false when no live key has that id.
  bool describe_key(const config::config& cfg, const gateway& g, std::string_view id, int64_t unix_ms,
                    std::string& out) const;
  // The status page: what key `id` used in its current windows (by
  // quota::budget_kind), budget or not.
  quota::budget_usage key_usage(std::string_view id, int64_t unix_ms) const;

 private:
  std::unique_ptr<quota::budget_board> _board;
  std::unique_ptr<quota::budget_ledger> _ledger;
  cluster::redis_budget_store* _redis = nullptr;  // the ledger's store, with [cluster]
  uint64_t _last_step_ms = 0;
};

}  // namespace sluice::control
