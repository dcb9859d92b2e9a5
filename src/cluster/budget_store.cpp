// Budgets in Redis: the start-up load, the pushes and their answers
// (sluice/cluster/budget_store.hpp).
#include "sluice/cluster/budget_store.hpp"

#include <fmt/format.h>

#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"

namespace sluice::cluster {

namespace {

using quota::budget_kind;
using quota::push_state;
using quota::subject_kind;

constexpr size_t idx(budget_kind k) noexcept { return static_cast<size_t>(k); }

// The subjects with a budget in `cfg`, at `now`, with nothing of their own:
// what the load asks for.
quota::budget_state budgeted(const config::config& cfg, quota::budget_windows now) {
  quota::budget_state s;
  quota::budget_usage zero;
  zero.at = now;
  for (const config::key_config& k : cfg.keys) {
    const quota::budget_limits l = quota::limits_of(k);
    if (!k.removed && (l[0] | l[1] | l[2] | l[3]) != 0) s.keys.emplace(k.id, zero);
  }
  for (const config::group_config& g : cfg.groups) {
    if (!g.removed && (g.daily_tokens | g.monthly_tokens) != 0) s.groups.emplace(g.name, zero);
  }
  return s;
}

// Runs `r` (and `c`'s deadlines) until `done()` or `ms` pass. Returns: done().
template <class Done>
bool run_until(shard::reactor& r, redis_client* c, uint64_t ms, Done done) {
  const uint64_t end = monotonic_ms() + ms;
  while (!done()) {
    if (monotonic_ms() >= end) return false;
    r.run_once(5);
    if (c != nullptr) c->on_iteration(r.now_ms());
  }
  return true;
}

// A client's last cancelled polls complete on its reactor (which frees their
// state); a handful of short turns is plenty on a live ring.
void drain(shard::reactor& r) {
  for (int i = 0; i < 10; ++i) r.run_once(1);
}

}  // namespace

redis_budget_store::redis_budget_store(redis_options o, std::string instance_id)
    : _o(std::move(o)), _instance(std::move(instance_id)) {
  _describe = fmt::format("redis {}:{} ({}budget:*)", _o.host, _o.port, _o.key_prefix);
  _o.fallback_note = "budgets are enforced on this instance's last view plus its own usage";
}

redis_budget_store::~redis_budget_store() {
  // A client still attached is the owner's mistake (its reactor may be
  // gone); destroying it here is the best left to do.
  _client.reset();
}

bool redis_budget_store::send(redis_client& c, const quota::budget_state& own) {
  std::vector<budget_counter> counters;
  _asked.clear();
  counters.reserve((own.keys.size() + own.groups.size()) * 2);
  for (subject_kind kind : {subject_kind::key, subject_kind::group}) {
    const std::string_view subject = kind == subject_kind::key ? "key" : "group";
    for (const auto& [name, u] : kind == subject_kind::key ? own.keys : own.groups) {
      // A subject never charged still has its windows at -1: nothing to ask.
      if (u.at.day < 0 || u.at.month < 0) continue;
      _asked.push_back({kind, name, u.at});
      counters.push_back({c.budget_key(subject, "day", u.at.day, name), u.used[idx(budget_kind::daily_tokens)],
                          u.used[idx(budget_kind::daily_spend)], quota::day_end_ms(u.at.day) + k_expiry_margin_ms});
      counters.push_back({c.budget_key(subject, "month", u.at.month, name), u.used[idx(budget_kind::monthly_tokens)],
                          u.used[idx(budget_kind::monthly_spend)], quota::month_end_ms(u.at.month) + k_expiry_margin_ms});
    }
  }
  _totals = {};
  _answered = false;
  if (counters.empty()) {
    _state = push_state::kept;
    _answered = true;
    return true;
  }
  // The callback never runs after the client is gone (redis_client.hpp),
  // and the client goes before this store.
  if (!c.budget(counters, _instance, [this](result<std::vector<budget_sums>> r) { on_answer(std::move(r)); })) {
    _state = push_state::failed;
    return false;
  }
  _state = push_state::in_flight;
  return true;
}

void redis_budget_store::on_answer(result<std::vector<budget_sums>> r) {
  _answered = true;
  if (!r.ok() || r.value().size() != _asked.size() * 2) {
    _state = push_state::failed;
    // Connection trouble is the client's to log (once per outage); an
    // error reply keeps the connection, so it is logged here, once.
    if (!r.ok() && r.error() == errc::upstream_protocol && !_script_error_logged && _client != nullptr) {
      log::warn("budgets: {} refused the budget counters: {}; enforcing this instance's view until it accepts them",
                _describe, _client->last_error());
      _script_error_logged = true;
    }
    return;
  }
  if (_script_error_logged) log::info("budgets: {} accepts the budget counters again", _describe);
  _script_error_logged = false;
  const std::vector<budget_sums>& sums = r.value();
  for (size_t i = 0; i < _asked.size(); ++i) {
    const asked& a = _asked[i];
    quota::budget_usage u;
    u.at = a.at;
    u.used[idx(budget_kind::daily_tokens)] = sums[i * 2].tokens;
    u.used[idx(budget_kind::daily_spend)] = sums[i * 2].spend_nano;
    u.used[idx(budget_kind::monthly_tokens)] = sums[i * 2 + 1].tokens;
    u.used[idx(budget_kind::monthly_spend)] = sums[i * 2 + 1].spend_nano;
    (a.kind == subject_kind::key ? _totals.keys : _totals.groups)[a.name] = u;
  }
  _state = push_state::kept;
}

bool redis_budget_store::load(const config::config& cfg, int64_t unix_ms, quota::budget_state& out,
                              std::string& /*error*/) {
  out = {};
  const quota::budget_state ask = budgeted(cfg, quota::windows_at(unix_ms));
  if (ask.keys.empty() && ask.groups.empty()) return true;
  // A ring and a connection of their own: the control reactor does not
  // exist yet, and the shards must not start before the flags are right.
  shard::reactor::options ro;
  ro.entries = 64;
  ro.tick_ms = 5;
  std::unique_ptr<shard::reactor> r = shard::reactor::create(ro);
  std::string why = "no io_uring ring for the start-up load";
  if (r != nullptr) {
    redis_options o = _o;
    o.quiet = true;  // this function says what came of it
    o.connect_timeout_ms = o.timeout_ms;
    auto made = redis_client::create(*r, o);
    if (made.ok()) {
      std::unique_ptr<redis_client> c = std::move(made.value());
      c->start();
      // The client itself gives up on the connect after connect_timeout_ms
      // and on the answer after timeout_ms; the loop's bound adds a margin.
      const bool connected = run_until(*r, c.get(), o.connect_timeout_ms + 50, [&] { return c->connected(); });
      if (connected && send(*c, ask)) {
        run_until(*r, c.get(), o.timeout_ms + 50, [&] { return _state != push_state::in_flight; });
      }
      if (_state == push_state::kept) {
        out = std::move(_totals);
      } else {
        why = c->last_error().empty() ? fmt::format("no answer within {} ms", o.connect_timeout_ms + o.timeout_ms)
                                      : c->last_error();
      }
      c.reset();
      drain(*r);
    } else {
      why = "the host does not resolve";
      _state = push_state::failed;
    }
  }
  _totals = {};
  _answered = false;
  if (_state == push_state::kept) {
    log::info("budgets: kept in {}; loaded every instance's usage ({} keys and {} groups have a budget)", _describe,
              ask.keys.size(), ask.groups.size());
  } else {
    _state = push_state::failed;
    log::warn("budgets: {} not reachable at start ({}); starting from this instance's own usage, every "
              "instance's comes with the first push that gets through",
              _describe, why);
  }
  return true;
}

void redis_budget_store::attach(shard::reactor& r) {
  if (_client != nullptr) return;
  _r = &r;
  auto made = redis_client::create(r, _o);
  if (!made.ok()) return;  // logged; pushes fail, the local view holds
  _client = std::move(made.value());
  _client->start();
}

void redis_budget_store::detach() {
  if (_client == nullptr) return;
  _client.reset();
  if (_state == push_state::in_flight) _state = push_state::failed;
  _answered = true;
  drain(*_r);
}

void redis_budget_store::on_iteration(uint64_t now_ms) {
  if (_client != nullptr) _client->on_iteration(now_ms);
}

push_state redis_budget_store::push(const quota::budget_state& own, const quota::budget_state& /*view*/,
                                    int64_t /*unix_ms*/) {
  if (_client == nullptr || !_client->connected()) return push_state::failed;
  if (_state == push_state::in_flight) return push_state::in_flight;  // one at a time (the ledger waits anyway)
  if (!send(*_client, own)) return push_state::failed;
  return push_state::in_flight;
}

push_state redis_budget_store::poll(quota::budget_state& totals) {
  if (_state == push_state::in_flight) return push_state::in_flight;
  if (!_answered) return push_state::failed;
  _answered = false;
  if (_state == push_state::kept) totals = std::move(_totals);
  _totals = {};
  return _state;
}

push_state redis_budget_store::wait(quota::budget_state& totals) {
  if (_state == push_state::in_flight && _client != nullptr && _r != nullptr) {
    run_until(*_r, _client.get(), _o.timeout_ms + 50, [&] { return _state != push_state::in_flight; });
  }
  return poll(totals);
}

}  // namespace sluice::cluster
