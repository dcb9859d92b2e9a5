#pragma once
// cluster: budgets kept in Redis, shared by every instance (README
// "Budgets") -- the ledger's store (quota::budget_store) when
// [cluster] redis is set.
//
// Layout (scripts.hpp, "budget"): per subject (key id, group name) and
// calendar window (UTC day number, month number) one hash, whose field per
// instance holds that instance's own total in that window; the window's
// usage is the sum of the fields. An instance only ever raises its own
// fields, so a push repeated after a timeout, or one arriving late, counts
// nothing twice; and a new process (a new instance id) never takes an
// earlier one's usage for its own: what it loads at start is the rest, its
// own starts at 0. A hash expires k_expiry_margin_ms after its window ends
// (every instance computes the same moment from the window's number).
//
// Redis away: push() fails, the ledger enforces what it last knew plus its
// own usage, and the next push that gets through carries this process's
// whole own totals (nothing lost, nothing twice). The client logs the
// outage once; a script error (someone else's data under the prefix) is
// logged once by the store. Not covered: Redis losing its data (a restart
// without persistence) forgets every instance's usage but the running
// processes' own.
//
// Control thread. Made before the shards start; load() talks to Redis on a
// connection and reactor of its own (for at most 2 x [cluster] timeout_ms:
// connect, then the answer), then attach() puts the long-lived connection
// on the control thread's reactor, where one push is in flight at a time,
// at most every k_period_ms. detach() before that reactor goes.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/cluster/redis_client.hpp"
#include "sluice/quota/budget.hpp"

namespace sluice::cluster {

class redis_budget_store final : public quota::budget_store {
 public:
  // How late another instance's usage is seen, at most (plus a round trip).
  static constexpr uint32_t k_period_ms = 100;
  static constexpr int64_t k_expiry_margin_ms = 3 * 86'400'000LL;

  // `instance_id`: this process's name in Redis (cluster::instance_id()).
  redis_budget_store(redis_options o, std::string instance_id);
  ~redis_budget_store() override;
  redis_budget_store(const redis_budget_store&) = delete;
  redis_budget_store& operator=(const redis_budget_store&) = delete;

  bool load(const config::config& cfg, int64_t unix_ms, quota::budget_state& out, std::string& error) override;
  quota::push_state push(const quota::budget_state& own, const quota::budget_state& view, int64_t unix_ms) override;
  quota::push_state poll(quota::budget_state& totals) override;
  quota::push_state wait(quota::budget_state& totals) override;
  bool shared() const noexcept override { return true; }
  uint32_t period_ms() const noexcept override { return k_period_ms; }
  std::string_view describe() const override { return _describe; }

  // The long-lived connection, on `r` (the control thread's). Before it,
  // and after detach(), push() fails.
  void attach(shard::reactor& r);
  // Ends the connection while `r` still runs (its cancelled polls finish on
  // it). A push in flight is abandoned.
  void detach();
  // Each loop turn: the client's deadlines and reconnects.
  void on_iteration(uint64_t now_ms);
  const redis_client* client() const noexcept { return _client.get(); }

 private:
  // What one push asked, to read its answer back: per subject two
  // counters (day, month) in this order.
  struct asked {
    quota::subject_kind kind;
    std::string name;
    quota::budget_windows at;
  };
  // Sends `own` on `c`. Returns: whether it went (on_answer follows).
  bool send(redis_client& c, const quota::budget_state& own);
  void on_answer(result<std::vector<budget_sums>> r);

  redis_options _o;
  std::string _instance;
  std::string _describe;
  shard::reactor* _r = nullptr;
  std::unique_ptr<redis_client> _client;
  std::vector<asked> _asked;
  quota::push_state _state = quota::push_state::failed;  // of the last push; in_flight while awaited
  quota::budget_state _totals;                            // its answer
  bool _answered = false;                                 // poll() has not yet taken it
  bool _script_error_logged = false;
};

}  // namespace sluice::cluster
