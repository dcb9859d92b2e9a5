// Admission against the key's quota slice, 429 answers, rate-limit headers,
// settlement, and the shard mesh that carries quota lending and load
// reports between shards.
#include <cstring>

#include "shard_server.hpp"
#include "sluice/core/log.hpp"
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

void shard_server::admit(downstream_conn* d) noexcept {
  if (d->x.key_index < 0) {  // every proxied request is authenticated; keep the invariant visible
    start_attempt(d);
    return;
  }
  const uint64_t now = now_ms();
  const quota::decision q = _quota.try_reserve(static_cast<uint32_t>(d->x.key_index), d->x.quota_cost, to_ns(now));
  if (q.result == quota::outcome::admit) {
    d->x.held = q.held;
    start_attempt(d);
    return;
  }
  // `wait`: this shard's slice is short and a borrow round is out to the
  // peers; the request parks until it completes (microseconds on a healthy
  // host). A rejection that clears within the wait bound (a borrow
  // cooldown, a refill of a few tokens) waits too: the key has the budget,
  // the tokens are just not on this core yet.
  const uint64_t since = d->x.wait_since_ms != 0 ? d->x.wait_since_ms : now;
  const bool short_wait = !q.too_large && q.retry_after_ms <= k_quota_wait_max_ms &&
                          now + q.retry_after_ms < since + k_quota_wait_max_ms;
  if (q.result != quota::outcome::wait && !short_wait) {
    answer_rate_limited(d, q);
    return;
  }
  d->x.wait_until_ms = q.result == quota::outcome::wait ? 0 : now + (q.retry_after_ms == 0 ? 1 : q.retry_after_ms);
  d->state = conn_state::quota_wait;
  d->x.wait_since_ms = since;
  append_waiter(d);
}

void shard_server::append_waiter(downstream_conn* d) noexcept {
  d->x.wait_hook = {};
  d->x.wait_hook.prev = _waiters_tail;
  if (_waiters_tail != nullptr) {
    _waiters_tail->x.wait_hook.next = d;
  } else {
    _waiters = d;
  }
  _waiters_tail = d;
}

downstream_conn* shard_server::detach_waiters() noexcept {
  downstream_conn* head = _waiters;
  _waiters = _waiters_tail = nullptr;
  return head;
}

void shard_server::unpark(downstream_conn* d) noexcept {
  if (d->x.wait_hook.prev != nullptr) {
    d->x.wait_hook.prev->x.wait_hook.next = d->x.wait_hook.next;
  } else {
    _waiters = d->x.wait_hook.next;
  }
  if (d->x.wait_hook.next != nullptr) {
    d->x.wait_hook.next->x.wait_hook.prev = d->x.wait_hook.prev;
  } else {
    _waiters_tail = d->x.wait_hook.prev;
  }
  d->x.wait_hook = {};
  d->state = conn_state::upstream;
}

void shard_server::answer_rate_limited(downstream_conn* d, const quota::decision& q) noexcept {
  const bool tokens = q.result == quota::outcome::reject_tokens;
  const bool concurrency = q.result == quota::outcome::reject_concurrency;
  _metrics.quota_rejected(static_cast<uint32_t>(d->x.key_index),
                          q.too_large ? metrics::reject_reason::too_large
                          : tokens    ? metrics::reject_reason::tokens
                          : concurrency ? metrics::reject_reason::concurrency
                                        : metrics::reject_reason::requests);
  const config::key_config& k = _cfg->keys[static_cast<size_t>(d->x.key_index)];
  char wait[32];
  const size_t wl = quota::format_duration(q.retry_after_ms, wait);
  const std::string_view kind = tokens ? "tokens" : "requests";
  fmt::format_to_n_result<char*> msg{};
  if (q.too_large) {
    msg = fmt::format_to_n(d->x.scratch, sizeof d->x.scratch,
                           "Request too large for key {} on tokens per min: Limit {}, Requested {}. "
                           "Reduce max_tokens or the prompt.",
                           k.id, k.tokens_per_minute, d->x.quota_cost);
  } else if (concurrency) {
    msg = fmt::format_to_n(d->x.scratch, sizeof d->x.scratch,
                           "Too many concurrent requests for key {}: Limit {}. Please try again in {}.", k.id,
                           k.max_concurrent, std::string_view(wait, wl));
  } else {
    msg = fmt::format_to_n(d->x.scratch, sizeof d->x.scratch,
                           "Rate limit reached for key {} on {} per min: Limit {}, Requested {}. Please try again in {}.",
                           k.id, kind, tokens ? k.tokens_per_minute : k.requests_per_minute,
                           tokens ? d->x.quota_cost : 1, std::string_view(wait, wl));
  }
  char extra[160];
  auto e = fmt::format_to_n(extra, sizeof extra, "retry-after: {}\r\nretry-after-ms: {}\r\n{}",
                            quota::retry_after_seconds(q.retry_after_ms), q.retry_after_ms,
                            q.too_large ? "x-should-retry: false\r\n" : "");
  const size_t ml = msg.size < sizeof d->x.scratch ? msg.size : sizeof d->x.scratch;
  answer_error(d, 429, std::string_view(d->x.scratch, ml), kind, {}, "rate_limit_exceeded", false,
               std::string_view(extra, e.size < sizeof extra ? e.size : sizeof extra));
  d->x.error_code = "rate_limit_exceeded";
}

size_t shard_server::write_rate_headers(downstream_conn* d, char* out, size_t cap) noexcept {
  if (d->x.key_index < 0) return 0;
  const quota::rate_headers h = _quota.headers(static_cast<uint32_t>(d->x.key_index), to_ns(now_ms()));
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
  return n;
}

void shard_server::settle_quota(downstream_conn* d, uint64_t prompt, uint64_t completion) noexcept {
  if (!d->x.held.live) return;
  const uint64_t actual = quota::usage_cost(prompt, completion, _cfg->quota.input_weight, _cfg->quota.output_weight);
  if (_quota.settle(d->x.held, actual, to_ns(now_ms()))) d->x.quota_charged = actual;
}

void shard_server::pump_mesh(uint64_t now) noexcept {
  take_mesh_messages(now);
  if (now - _last_quota_tick_ms >= 100) {
    _last_quota_tick_ms = now;
    _quota.tick(to_ns(now));
  }
  retry_waiters(now);
  send_quota_messages();
  send_load_reports(now);
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
        _routes->apply(m.r);
        continue;
      }
      const quota::message_effect fx = _quota.on_message(m.q, to_ns(now));
      if (!fx.round_complete) continue;
      // Re-admit the key's waiters. The list is detached first: a waiter
      // that parks again goes to the new list, not back into this walk.
      downstream_conn* w = detach_waiters();
      while (w != nullptr) {
        downstream_conn* next = w->x.wait_hook.next;
        if (w->x.key_index == static_cast<int32_t>(fx.key)) {
          w->state = conn_state::upstream;
          admit(w);
        } else {
          append_waiter(w);
        }
        w = next;
      }
    }
  }
}

void shard_server::retry_waiters(uint64_t now) noexcept {
  // Waiters whose retry time came try again; those past their bound get
  // the answer the slice gives now.
  for (downstream_conn* w = detach_waiters(); w != nullptr;) {
    downstream_conn* next = w->x.wait_hook.next;
    if (w->x.wait_until_ms != 0 && now >= w->x.wait_until_ms && now - w->x.wait_since_ms < k_quota_wait_max_ms) {
      w->state = conn_state::upstream;
      w->x.wait_until_ms = 0;
      admit(w);
    } else if (now - w->x.wait_since_ms < k_quota_wait_max_ms) {
      append_waiter(w);
    } else {
      w->state = conn_state::upstream;
      quota::decision q = _quota.try_reserve(static_cast<uint32_t>(w->x.key_index), w->x.quota_cost, to_ns(now));
      if (q.result == quota::outcome::admit) {
        w->x.held = q.held;
        start_attempt(w);
      } else {
        if (q.result == quota::outcome::wait) {
          // Still short after the wait bound (the borrow round is slow):
          // refused, named after the resource it waited for.
          q.result = q.wait_rejection;
          q.retry_after_ms = q.wait_retry_after_ms;
        }
        answer_rate_limited(w, q);
      }
    }
    w = next;
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
}

void shard_server::send_load_reports(uint64_t now) noexcept {
  const uint32_t me = _index;
  const uint32_t n = _mesh.count;
  // Load reports: changed in-flight counts, without a wake-up (the peer
  // reads them at its next iteration; they are advice). Every 10 ms while
  // the shard is busy; at once when it has gone idle, so that no peer keeps
  // a load that has ended and spills a session off its backend for it
  // until this shard's next tick. Idle comes rarely under load (requests
  // overlap), and at low load a report per request is cheap.
  const bool changed = _routes->local_version() != _reported_version;
  if (changed && (now - _last_report_ms >= 10 || _metrics.at(metrics::stat::requests_inflight).get() == 0)) {
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
