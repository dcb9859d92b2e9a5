// Admission against the key's quota slice, 429 answers, rate-limit headers,
// settlement, and the shard mesh that carries quota lending and load
// reports between shards.
#include <cstring>

#include "shard_server.hpp"
#include "client_codec.hpp"
#include "backend_adapter.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/text.hpp"
#include "sluice/quota/duration.hpp"
#include "sluice/quota/estimate.hpp"

namespace sluice::proxy {

namespace {

// A waiter gives up after this long without a grant: the borrow round has
// its own timeout (100 ms), so this only bounds a lost race.
constexpr uint64_t k_quota_wait_max_ms = 250;

int64_t to_ns(uint64_t ms) noexcept { return static_cast<int64_t>(ms) * 1'000'000; }

}  // namespace

void shard_server::admit(exchange& x) noexcept {
  if (x.key_index < 0) {  // every proxied request is authenticated; keep the invariant visible
    x.adapter->start(x);
    return;
  }
  // Budgets: the bits the control thread published (one relaxed load each;
  // see quota/budget.hpp for how far a budget may be overrun).
  const uint8_t key_out = _budgets.key_exhausted(static_cast<uint32_t>(x.key_index));
  const uint8_t group_out = _budgets.group_exhausted(x.group);
  if ((key_out | group_out) != 0) [[unlikely]] {
    answer_budget_exhausted(x, key_out, group_out);
    return;
  }
  const uint64_t now = now_ms();
  const quota::decision q = _quota.try_reserve(static_cast<uint32_t>(x.key_index), x.quota_cost, to_ns(now));
  if (q.result == quota::outcome::admit) {
    x.held = q.held;
    admit_to_slot(x);
    return;
  }
  // `wait`: this shard's slice is short and a borrow round is out to the
  // peers; the request parks until it completes (microseconds on a healthy
  // host). A rejection that clears within the wait bound (a borrow
  // cooldown, a refill of a few tokens) waits too: the key has the budget,
  // the tokens are just not on this core yet.
  const uint64_t since = x.wait_since_ms != 0 ? x.wait_since_ms : now;
  const bool short_wait = !q.too_large && q.retry_after_ms <= k_quota_wait_max_ms &&
                          now + q.retry_after_ms < since + k_quota_wait_max_ms;
  if (q.result != quota::outcome::wait && !short_wait) {
    answer_rate_limited(x, q);
    return;
  }
  x.wait_until_ms = q.result == quota::outcome::wait ? 0 : now + (q.retry_after_ms == 0 ? 1 : q.retry_after_ms);
  x.codec->wait_for_quota(x);
  x.wait_since_ms = since;
  append_waiter(x);
}

void shard_server::append_waiter(exchange& x) noexcept {
  x.wait_hook = {};
  x.waiting = exchange::waiting_in::list;
  x.wait_hook.prev = _waiters_tail;
  if (_waiters_tail != nullptr) {
    _waiters_tail->wait_hook.next = &x;
  } else {
    _waiters = &x;
  }
  _waiters_tail = &x;
}

exchange* shard_server::detach_waiters() noexcept {
  exchange* head = _waiters;
  _waiters = _waiters_tail = nullptr;
  for (exchange* w = head; w != nullptr; w = w->wait_hook.next) w->waiting = exchange::waiting_in::walk;
  return head;
}

exchange* shard_server::take_walked(exchange* w) noexcept {
  // The walk's next is read after w's own work (which may end other
  // waiters: an HTTP/2 connection that fails closes its other streams).
  _walk_next = w->wait_hook.next;
  if (_walk_next != nullptr) _walk_next->wait_hook.prev = nullptr;
  w->wait_hook = {};
  w->waiting = exchange::waiting_in::none;
  return w;
}

void shard_server::unpark(exchange& x) noexcept {
  if (x.waiting == exchange::waiting_in::fair) {
    _fair[x.group]->remove(x.adm.wait);  // a queue is kept while it holds anyone
    x.waiting = exchange::waiting_in::none;
    _metrics.queue_depth_sub(x.group);
    return;
  }
  if (x.waiting == exchange::waiting_in::embeddings) {
    _embed.detach(x);  // the call goes on without it
    return;
  }
  if (x.waiting == exchange::waiting_in::store) {
    // Out of the store's waiters; its answer, when it comes, finds no one.
    if (x.wait_hook.prev != nullptr) {
      x.wait_hook.prev->wait_hook.next = x.wait_hook.next;
    } else {
      _store_waiters = x.wait_hook.next;
    }
    if (x.wait_hook.next != nullptr) x.wait_hook.next->wait_hook.prev = x.wait_hook.prev;
    x.wait_hook = {};
    x.waiting = exchange::waiting_in::none;
    return;
  }
  if (x.waiting == exchange::waiting_in::walk) {
    // In a walk's detached chain: unlinked from it (the walk goes on past it).
    if (x.wait_hook.prev != nullptr) x.wait_hook.prev->wait_hook.next = x.wait_hook.next;
    if (x.wait_hook.next != nullptr) x.wait_hook.next->wait_hook.prev = x.wait_hook.prev;
    if (_walk_next == &x) _walk_next = x.wait_hook.next;
    x.wait_hook = {};
    x.waiting = exchange::waiting_in::none;
    return;
  }
  if (x.waiting != exchange::waiting_in::list) return;
  x.waiting = exchange::waiting_in::none;
  if (x.wait_hook.prev != nullptr) {
    x.wait_hook.prev->wait_hook.next = x.wait_hook.next;
  } else {
    _waiters = x.wait_hook.next;
  }
  if (x.wait_hook.next != nullptr) {
    x.wait_hook.next->wait_hook.prev = x.wait_hook.prev;
  } else {
    _waiters_tail = x.wait_hook.prev;
  }
  x.wait_hook = {};
}

void shard_server::answer_rate_limited(exchange& x, const quota::decision& q) noexcept {
  const bool tokens = q.result == quota::outcome::reject_tokens;
  const bool concurrency = q.result == quota::outcome::reject_concurrency;
  _metrics.quota_rejected(static_cast<uint32_t>(x.key_index),
                          q.too_large ? metrics::reject_reason::too_large
                          : tokens    ? metrics::reject_reason::tokens
                          : concurrency ? metrics::reject_reason::concurrency
                                        : metrics::reject_reason::requests);
  const config::key_config& k = _cfg->keys[static_cast<size_t>(x.key_index)];
  char wait[32];
  const size_t wl = quota::format_duration(q.retry_after_ms, wait);
  const std::string_view kind = tokens ? "tokens" : "requests";
  fmt::format_to_n_result<char*> msg{};
  if (q.too_large) {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                           "Request too large for key {} on tokens per min: Limit {}, Requested {}. "
                           "Reduce max_tokens or the prompt.",
                           k.id, k.tokens_per_minute, x.quota_cost);
  } else if (concurrency) {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                           "Too many concurrent requests for key {}: Limit {}. Please try again in {}.", k.id,
                           k.max_concurrent, std::string_view(wait, wl));
  } else {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                           "Rate limit reached for key {} on {} per min: Limit {}, Requested {}. Please try again in {}.",
                           k.id, kind, tokens ? k.tokens_per_minute : k.requests_per_minute,
                           tokens ? x.quota_cost : 1, std::string_view(wait, wl));
  }
  char extra[160];
  auto e = fmt::format_to_n(extra, sizeof extra, "retry-after: {}\r\nretry-after-ms: {}\r\n{}",
                            quota::retry_after_seconds(q.retry_after_ms), q.retry_after_ms,
                            q.too_large ? "x-should-retry: false\r\n" : "");
  const size_t ml = msg.size < sizeof x.scratch ? msg.size : sizeof x.scratch;
  // Before the answer: answer_error may end the connection that holds x.
  x.error_code = "rate_limit_exceeded";
  x.codec->answer_error(x, 429, std::string_view(x.scratch, ml), kind, {}, "rate_limit_exceeded", false,
               std::string_view(extra, e.size < sizeof extra ? e.size : sizeof extra));
}

void shard_server::answer_budget_exhausted(exchange& x, uint8_t key_out, uint8_t group_out) noexcept {
  // The first budget used up names the answer: the key's own (day before
  // month, tokens before spend), else the group's.
  const uint32_t key = static_cast<uint32_t>(x.key_index);
  const bool of_key = key_out != 0;
  const uint8_t bits = of_key ? key_out : group_out;
  size_t kind = 0;
  for (const size_t k : {0, 2, 1, 3}) {
    if ((bits & (1u << k)) != 0) {
      kind = k;
      break;
    }
  }
  const auto bk = static_cast<quota::budget_kind>(kind);
  _budgets.count_rejection(_index, key, of_key ? kind : quota::budget_kind_count + kind);
  const config::key_config& k = _cfg->keys[key];
  const quota::budget_windows w = quota::windows_at(static_cast<int64_t>(realtime_ms()));
  char reset[quota::k_utc_chars];
  const size_t rl = quota::format_utc(quota::is_daily(bk) ? quota::day_end_ms(w.day) : quota::month_end_ms(w.month), reset);
  const std::string_view period = quota::is_daily(bk) ? "daily" : "monthly";
  fmt::format_to_n_result<char*> msg{};
  if (!of_key) {
    const config::group_config& g = _cfg->groups[x.group];
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                           "The {} token budget of group {} ({} tokens, all keys together) is used up; it resets at {}.",
                           period, g.name, kind == 0 ? g.daily_tokens : g.monthly_tokens, std::string_view(reset, rl));
  } else if (quota::is_spend(bk)) {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch, "The {} spend budget of key {} ({}) is used up; it resets at {}.",
                           period, k.id, quota::is_daily(bk) ? k.daily_spend : k.monthly_spend,
                           std::string_view(reset, rl));
  } else {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch, "The {} token budget of key {} ({} tokens) is used up; it resets at {}.",
                           period, k.id, quota::is_daily(bk) ? k.daily_tokens : k.monthly_tokens,
                           std::string_view(reset, rl));
  }
  const size_t ml = msg.size < sizeof x.scratch ? msg.size : sizeof x.scratch;
  x.error_code = "insufficient_quota";  // before the answer, which may end x's connection
  x.codec->answer_error(x, 429, std::string_view(x.scratch, ml), "insufficient_quota", {}, "insufficient_quota", false,
                        "x-should-retry: false\r\n");
}

size_t shard_server::write_budget_headers(const exchange& x, char* out, size_t cap) noexcept {
  // What is left of each budget set on the key (and on its group, once the
  // model named one), as the control thread last published it: the
  // current request is not in it until it is settled.
  const config::key_config& k = _cfg->keys[static_cast<size_t>(x.key_index)];
  const quota::budget_limits kl = quota::limits_of(k);
  const bool grouped = x.group < _cfg->groups.size();
  const uint64_t gd = grouped ? _cfg->groups[x.group].daily_tokens : 0;
  const uint64_t gm = grouped ? _cfg->groups[x.group].monthly_tokens : 0;
  if ((kl[0] | kl[1] | kl[2] | kl[3] | gd | gm) == 0) return 0;
  static constexpr std::string_view k_names[] = {"daily-tokens", "monthly-tokens", "daily-spend", "monthly-spend"};
  text_writer t(out, cap);
  bool daily = gd != 0, monthly = gm != 0;
  for (size_t i = 0; i < quota::budget_kind_count; ++i) {
    if (kl[i] == 0) continue;
    (i % 2 == 0 ? daily : monthly) = true;
    const uint64_t left = _budgets.key_left(static_cast<uint32_t>(x.key_index), static_cast<quota::budget_kind>(i));
    t.put("x-budget-remaining-");
    t.put(k_names[i]);
    t.put(": ");
    if (i >= 2) {
      char num[32];
      auto r = fmt::format_to_n(num, sizeof num, "{:.6f}", static_cast<double>(left) / 1e9);
      t.put(std::string_view(num, r.size < sizeof num ? r.size : sizeof num));
    } else {
      t.put_int(left);
    }
    t.put("\r\n");
  }
  for (size_t i = 0; i < 2; ++i) {
    if ((i == 0 ? gd : gm) == 0) continue;
    t.put("x-budget-remaining-group-");
    t.put(k_names[i]);
    t.put(": ");
    t.put_int(_budgets.group_left(x.group, static_cast<quota::budget_kind>(i)));
    t.put("\r\n");
  }
  const quota::budget_windows w = quota::windows_at(static_cast<int64_t>(realtime_ms()));
  char reset[quota::k_utc_chars];
  if (daily) {
    t.put("x-budget-reset-daily: ");
    t.put(std::string_view(reset, quota::format_utc(quota::day_end_ms(w.day), reset)));
    t.put("\r\n");
  }
  if (monthly) {
    t.put("x-budget-reset-monthly: ");
    t.put(std::string_view(reset, quota::format_utc(quota::month_end_ms(w.month), reset)));
    t.put("\r\n");
  }
  return static_cast<size_t>(t.p - out);
}

size_t shard_server::write_rate_headers(const exchange& x, char* out, size_t cap) noexcept {
  if (x.key_index < 0) return 0;
  const quota::rate_headers h = _quota.headers(static_cast<uint32_t>(x.key_index), to_ns(now_ms()));
  size_t n = 0;
  auto window = [&](std::string_view what, const quota::rate_window& w) {
    if (w.limit == 0) return;  // unlimited: OpenAI's headers would only mislead
    char reset[32];
    const size_t rl = quota::format_duration(w.reset_ms, reset);
    text_writer t(out + n, cap - n);
    t.put("x-ratelimit-limit-");
    t.put(what);
    t.put(": ");
    t.put_int(w.limit);
    t.put("\r\nx-ratelimit-remaining-");
    t.put(what);
    t.put(": ");
    t.put_int(w.remaining);
    t.put("\r\nx-ratelimit-reset-");
    t.put(what);
    t.put(": ");
    t.put(std::string_view(reset, rl));
    t.put("\r\n");
    n += static_cast<size_t>(t.p - (out + n));
  };
  window("requests", h.requests);
  window("tokens", h.tokens);
  return n + write_budget_headers(x, out + n, cap - n);
}

void shard_server::count_budget(const exchange& x, uint64_t prompt, uint64_t completion) noexcept {
  // Every token the audit line reports is charged (streams cut short
  // included): a load and a store per cell, no allocation.
  if (x.key_index < 0 || (prompt | completion) == 0) return;
  uint64_t spend = 0;
  if (x.group < _cfg->groups.size()) {
    const config::group_config& g = _cfg->groups[x.group];
    if (g.input_cost_per_mtok > 0 || g.output_cost_per_mtok > 0) {
      spend = quota::spend_nano(prompt, completion, g.input_cost_per_mtok, g.output_cost_per_mtok);
    }
  }
  _budgets.count(_index, static_cast<uint32_t>(x.key_index), x.group, prompt + completion, spend);
}

void shard_server::settle_quota(exchange& x, uint64_t prompt, uint64_t completion) noexcept {
  if (!x.held.live) return;
  const uint64_t actual = quota::usage_cost(prompt, completion, _cfg->quota.input_weight, _cfg->quota.output_weight);
  if (_quota.settle(x.held, actual, to_ns(now_ms()))) x.quota_charged = actual;
}

void shard_server::pump_mesh(uint64_t now) noexcept {
  if (now - _last_quota_tick_ms >= 100) {
    _last_quota_tick_ms = now;
    _quota.tick(to_ns(now));
  }
  retry_waiters(now);
  if (!_fair.empty()) pump_admission(now);
  send_quota_messages();
  send_load_reports(now, _report_now);
  _report_now = false;
  if (_wake_peers_after_report) {
    _wake_peers_after_report = false;
    for (uint32_t to = 0; to < _mesh.count; ++to) {
      if (to == _index) continue;
      shard::reactor* r = _mesh.reactors[to].load(std::memory_order_acquire);
      if (r != nullptr) r->wake();
    }
  }
}

void shard_server::take_mesh_messages(uint64_t now) noexcept {
  const uint32_t me = _index;
  const uint32_t n = _mesh.count;
  // Inbound: route messages update this shard's load view; quota messages
  // may complete a borrow round, which re-admits that key's waiters.
  for (uint32_t from = 0; from < n; ++from) {
    if (from == me) continue;
    mesh_queue* q = _mesh.queue(from, me);
    shard_message m;
    while (q->try_pop(m)) {
      if (m.what == shard_message::kind::route) {
        if (m.r.kind == route::message_kind::key_served) {
          if (m.r.group < _fair.size() && _fair[m.r.group]) {
            _fair[m.r.group]->served_remote(m.r.backend, static_cast<int32_t>(m.r.value));
          }
          continue;
        }
        _routes->apply(m.r);
        continue;
      }
      apply_quota_message(m.q, now);
    }
  }
  if (_mesh.from_lender != nullptr) {
    shard_message m;
    while (_mesh.from_lender->try_pop(m)) apply_quota_message(m.q, now);
  }
}

void shard_server::apply_quota_message(const quota::message& q, uint64_t now) noexcept {
  const quota::message_effect fx = _quota.on_message(q, to_ns(now));
  if (!fx.round_complete) return;
  // Re-admit the key's waiters. The list is detached first: a waiter that
  // parks again goes to the new list, not back into this walk.
  _walk_next = detach_waiters();
  while (_walk_next != nullptr) {
    exchange* w = take_walked(_walk_next);
    if (w->key_index == static_cast<int32_t>(fx.key)) {
      w->codec->wait_for_backend(*w, deadline_kind::none, 0);
      admit(*w);
    } else {
      append_waiter(*w);
    }
  }
}

void shard_server::retry_waiters(uint64_t now) noexcept {
  // Waiters whose retry time came try again; those past their bound get
  // the answer the slice gives now.
  _walk_next = detach_waiters();
  while (_walk_next != nullptr) {
    exchange* w = take_walked(_walk_next);
    if (now - w->wait_since_ms < k_quota_wait_max_ms && !(w->wait_until_ms != 0 && now >= w->wait_until_ms)) {
      append_waiter(*w);
      continue;
    }
    w->codec->wait_for_backend(*w, deadline_kind::none, 0);
    if (now - w->wait_since_ms < k_quota_wait_max_ms) {
      w->wait_until_ms = 0;
      admit(*w);
    } else {
      quota::decision q = _quota.try_reserve(static_cast<uint32_t>(w->key_index), w->quota_cost, to_ns(now));
      if (q.result == quota::outcome::admit) {
        w->held = q.held;
        admit_to_slot(*w);
      } else {
        if (q.result == quota::outcome::wait) {
          // Still short after the wait bound (the borrow round is slow):
          // refused, named after the resource it waited for.
          q.result = q.wait_rejection;
          q.retry_after_ms = q.wait_retry_after_ms;
        }
        answer_rate_limited(*w, q);
      }
    }
  }
}

void shard_server::send_quota_messages() noexcept {
  const uint32_t me = _index;
  const uint32_t n = _mesh.count;
  // Outbound quota messages wake the peer: a borrower is waiting on them.
  for (uint32_t to = 0; to < n; ++to) {
    if (to == me || _quota.outbox_size(to) == 0) continue;
    mesh_queue* q = _mesh.queue(me, to);
    const size_t moved = _quota.drain_outbox(to, [&](const quota::message* msgs, size_t count) {
      size_t pushed = 0;
      for (; pushed < count; ++pushed) {
        shard_message m;
        m.what = shard_message::kind::quota;
        m.q = msgs[pushed];
        if (!q->try_push(m)) break;
      }
      return pushed;
    });
    if (moved != 0) {
      shard::reactor* r = _mesh.reactors[to].load(std::memory_order_acquire);
      if (r != nullptr) r->wake();
    }
  }
  // The lender's outbox: the control thread answers a borrow round.
  if (_mesh.to_lender != nullptr && _quota.outbox_size(n) != 0) {
    const size_t moved = _quota.drain_outbox(n, [&](const quota::message* msgs, size_t count) {
      size_t pushed = 0;
      for (; pushed < count; ++pushed) {
        shard_message m;
        m.what = shard_message::kind::quota;
        m.q = msgs[pushed];
        if (!_mesh.to_lender->try_push(m)) break;
      }
      return pushed;
    });
    if (moved != 0) {
      shard::reactor* r = _mesh.lender_reactor->load(std::memory_order_acquire);
      if (r != nullptr) r->wake();
    }
  }
}

void shard_server::send_load_reports(uint64_t now, bool idle) noexcept {
  const uint32_t me = _index;
  const uint32_t n = _mesh.count;
  // Load reports: changed in-flight counts, without a wake-up (the peer
  // reads them at its next iteration; they are advice). Every 10 ms while
  // the shard is busy; at once when it goes idle, so that no peer keeps a
  // load that has ended and spills a session off its backend for it until
  // this shard's next tick. Idle comes rarely under load (requests
  // overlap), and at low load a report per request is cheap. end_request
  // sends the idle report before the request leaves sluice_inflight_requests:
  // a client that saw sluice idle, then sent, reaches a peer that has it.
  const bool changed = _routes->local_version() != _reported_version;
  if (changed && (idle || now - _last_report_ms >= 10 || _metrics.at(metrics::stat::requests_inflight).get() == 0)) {
    _reported_version = _routes->local_version();
    _last_report_ms = now;
    for (uint32_t b = 0; b < _reported.size(); ++b) {
      const route::message rep = _routes->load_report(b);
      if (rep.value == _reported[b]) continue;
      bool sent = true;
      for (uint32_t to = 0; to < n; ++to) {
        if (to == me) continue;
        shard_message m;
        m.what = shard_message::kind::route;
        m.r = rep;
        sent &= _mesh.queue(me, to)->try_push(m);
      }
      // A full queue: the value counts as unsent, and the version is left
      // behind so the next report sends it again (a report is a level: a
      // peer that got it twice loses nothing).
      if (sent) {
        _reported[b] = rep.value;
      } else {
        _reported_version = ~uint64_t{0};
      }
    }
  }
}

}  // namespace sluice::proxy
