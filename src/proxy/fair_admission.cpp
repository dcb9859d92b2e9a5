// Fair admission (docs/architecture.md §2c, README "Fair admission"): a group with
// admission = "fair" runs at most max_inflight_per_backend requests per
// backend; the rest wait here, in the group's quota::fair_queue, and are
// released by virtual token counters as slots free.
//
// A slot is a backend's in-flight request as the routing table counts it
// (route::table::slot_state): taken when an adapter starts its attempt,
// given back when the attempt ends, fails or is cancelled. Each loop turn,
// after the completions that may have freed slots, pump_admission releases
// waiters while a slot is free (work-conserving), answers those past
// queue_timeout_ms, and tells the peers when this shard starts or stops
// queueing for a group (so they stop or resume borrowing its slice).
#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "shard_server.hpp"
#include "client_codec.hpp"
#include "backend_adapter.hpp"

namespace sluice::proxy {

namespace {

// A waiter that has waited this share of its group's queue_timeout_ms goes
// first whatever its priority (quota::fair_queue's age limit): the lowest
// level is served before it times out while higher levels saturate.
constexpr uint64_t k_age_limit_share = 2;  // half the timeout

quota::fair_queue* queue_of(std::vector<std::unique_ptr<quota::fair_queue>>& qs, uint32_t group) noexcept {
  return group < qs.size() ? qs[group].get() : nullptr;
}

}  // namespace

void shard_server::reload_admission() {
  // Cold path (start and reload). A group that turned fcfs keeps its queue
  // until it is empty: pump_admission releases its waiters at once (the
  // table no longer counts its slots).
  const config::config& c = *_cfg;
  _fair.resize(c.groups.size());
  _queued_reported.resize(c.groups.size(), 0);
  for (uint32_t g = 0; g < c.groups.size(); ++g) {
    const config::group_config& gc = c.groups[g];
    const bool fair = _routes->fair(g);
    if (fair && !_fair[g]) {
      _fair[g] = std::make_unique<quota::fair_queue>(c.keys.size(), gc.queue_max, gc.queue_timeout_ms / k_age_limit_share);
    }
    if (!_fair[g]) continue;
    _fair[g]->add_keys(c.keys.size());
    _fair[g]->set_limits(gc.queue_max, gc.queue_timeout_ms / k_age_limit_share);
    for (uint32_t k = 0; k < c.keys.size(); ++k) _fair[g]->set_weight(k, c.keys[k].weight);
  }
  // No fair group: the loop's pump skips admission altogether.
  if (std::none_of(_fair.begin(), _fair.end(), [](const auto& q) { return q != nullptr; })) _fair.clear();
}

void shard_server::admit_to_slot(exchange& x) noexcept {
  quota::fair_queue* q = queue_of(_fair, x.group);
  if (q == nullptr) {
    x.adapter->start(x);
    return;
  }
  const uint64_t now = now_ms();
  // Straight on when nobody waits and a slot is free (or none could be:
  // every backend down, and the adapter answers 503).
  const uint32_t key = static_cast<uint32_t>(x.key_index);
  const config::key_config& kc = _cfg->keys[key];
  const auto level = static_cast<uint8_t>(std::min<uint32_t>(kc.priority, quota::fair_queue::k_levels - 1));
  if (q->depth() == 0 && _routes->slot_state(x.group, 0, level) != route::table::slots::full) {
    start_on_slot(x, *q, level);
    return;
  }
  if (!q->push(x.adm.wait, key, static_cast<uint8_t>(kc.priority), now)) {
    answer_queue_refused(x, false);
    return;
  }
  x.adm.wait.owner = &x;
  x.adm.queued_since_ms = now;
  x.waiting = exchange::waiting_in::fair;
  x.codec->wait_for_quota(x);
  _metrics.queue_depth_add(x.group);
  // A slot may be free with others waiting: the queue decides who takes it.
  release_queued(x.group, *q, now);
}

void shard_server::start_on_slot(exchange& x, quota::fair_queue& q, uint8_t level) noexcept {
  const uint32_t key = static_cast<uint32_t>(x.key_index);
  if (!x.adm.running) {
    q.started(key);
    x.adm.running = true;
  }
  // The prompt counts when it is admitted (input x1); the output as it
  // streams (fair_progress), corrected by the real usage at the end.
  if (x.adm.served == 0 && x.input_estimate != 0) {
    x.adm.served = x.input_estimate;
    q.served(key, static_cast<int64_t>(x.input_estimate));
  }
  const uint32_t group = x.group;
  _routes->set_admit_level(level);  // pick() takes a backend slot_state counted at this level
  x.adapter->start(x);  // may answer, and end x: not read after this
  _routes->set_admit_level(0);
  // Past this shard's slice the slot was a peer's: say so now, not at the
  // next 10 ms report, so the peer does not take it too.
  if (_routes->beyond_slice_in(group)) _report_now = true;
}

void shard_server::release_queued(uint32_t group, quota::fair_queue& q, uint64_t now) noexcept {
  for (;;) {
    if (q.depth() == 0) break;
    const uint8_t level = q.next_level(now);
    if (_routes->slot_state(group, 0, level) == route::table::slots::full) break;
    quota::fair_hook* h = q.pop(now);  // counted running by the queue
    exchange& w = *static_cast<fair_state::hook*>(h)->owner;
    w.waiting = exchange::waiting_in::none;
    w.adm.running = true;
    w.adm.queued_ms = now - w.adm.queued_since_ms;
    _metrics.queue_depth_sub(group);
    _metrics.observe_queue_wait_us(group, w.adm.queued_ms * 1000);
    _metrics.key_queued(h->key, w.adm.queued_ms);
    w.codec->wait_for_backend(w, deadline_kind::none, 0);
    // May end other exchanges (an HTTP/2 connection that fails closes its
    // streams): each leaves the queue by unpark, and the loop reads depth
    // afresh.
    start_on_slot(w, q, level);
  }
}

void shard_server::pump_admission(uint64_t now) noexcept {
  bool reported_served = false, wake_peers = false;
  for (uint32_t g = 0; g < _fair.size(); ++g) {
    quota::fair_queue* q = _fair[g].get();
    if (q == nullptr) continue;
    if (q->depth() != 0) {
      const uint64_t timeout = _cfg->groups[g].queue_timeout_ms;
      while (quota::fair_hook* h = q->expired(now, timeout)) {
        exchange& w = *static_cast<fair_state::hook*>(h)->owner;
        unpark(w);
        w.adm.queued_ms = now - w.adm.queued_since_ms;
        _metrics.observe_queue_wait_us(g, w.adm.queued_ms * 1000);
        _metrics.key_queued(static_cast<uint32_t>(w.key_index), w.adm.queued_ms);
        w.codec->wait_for_backend(w, deadline_kind::none, 0);
        answer_queue_refused(w, true);
      }
      release_queued(g, *q, now);
    }
    // The peers borrow this shard's slice only while it queues nothing at
    // their level or above: they are told the highest level queued.
    const uint32_t depth = static_cast<uint32_t>(q->depth());
    const uint32_t top = depth == 0 ? 0 : 1u + q->top_level(now);
    if (top != _queued_reported[g]) {
      bool sent = true;
      for (uint32_t to = 0; to < _mesh.count; ++to) {
        if (to == _index) continue;
        shard_message m;
        m.what = shard_message::kind::route;
        m.r = _routes->queued_report(g, top);
        sent &= _mesh.queue(_index, to)->try_push(m);
      }
      if (sent) _queued_reported[g] = top;  // a full queue: sent again next turn
    }
    // The tokens served here, for the peers' counters (as load reports
    // go: at most every 10 ms; a peer whose queue is full misses a delta,
    // which only loosens the bound across shards).
    if (q->served_pending() && _mesh.count > 1 && now - _last_served_report_ms >= 10) {
      q->drain_served([&](uint32_t key, int64_t tokens) {
        while (tokens != 0) {
          const int64_t part = std::clamp<int64_t>(tokens, INT32_MIN, INT32_MAX);
          tokens -= part;
          shard_message m;
          m.what = shard_message::kind::route;
          m.r = {route::message_kind::key_served, 0, static_cast<uint16_t>(_index), key, g,
                 static_cast<uint32_t>(static_cast<int32_t>(part))};
          for (uint32_t to = 0; to < _mesh.count; ++to) {
            if (to != _index) _mesh.queue(_index, to)->try_push(m);
          }
        }
      });
      reported_served = true;
    }
    // A slot this shard freed and will not use while a peer waits above
    // what it queues (or waits at all, when it queues nothing): the peer
    // hears at once, woken, instead of at the next report and its own tick.
    if (_routes->local_version() != _fair_seen_version &&
        _routes->peer_waits_above(g, depth == 0 ? -1 : static_cast<int>(q->top_level(now)))) {
      _report_now = true;
      wake_peers = true;
    }
    if (depth == 0 && !_routes->fair(g) && q->running_total() == 0) _fair[g].reset();  // turned fcfs, drained
  }
  if (reported_served) _last_served_report_ms = now;
  _fair_seen_version = _routes->local_version();
  if (wake_peers) _wake_peers_after_report = true;
}

void shard_server::fair_progress(exchange& x) noexcept {
  // Per relayed batch, for a request counted under fair admission: its
  // output so far (content events, one token each as vLLM streams them,
  // x2) moves its key's counter while it generates.
  quota::fair_queue* q = queue_of(_fair, x.group);
  if (q == nullptr || x.key_index < 0) return;
  const uint64_t now_served = x.input_estimate + 2 * uint64_t{x.rsp.facts.content_events};
  if (now_served <= x.adm.served) return;
  q->served(static_cast<uint32_t>(x.key_index), static_cast<int64_t>(now_served - x.adm.served));
  x.adm.served = now_served;
}

void shard_server::fair_end(exchange& x, uint64_t prompt, uint64_t completion) noexcept {
  if (!x.adm.running) return;
  x.adm.running = false;
  quota::fair_queue* q = queue_of(_fair, x.group);
  if (q == nullptr) return;
  const uint32_t key = static_cast<uint32_t>(x.key_index);
  // The real usage replaces what was counted as it streamed (an estimate).
  const uint64_t real = prompt + 2 * completion;
  if (real != x.adm.served) q->served(key, static_cast<int64_t>(real) - static_cast<int64_t>(x.adm.served));
  x.adm.served = real;
  q->ended(key);
}

void shard_server::answer_queue_refused(exchange& x, bool timeout) noexcept {
  const config::group_config& g = _cfg->groups[x.group];
  fmt::format_to_n_result<char*> msg{};
  if (timeout) {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                           "The model group {} is saturated: this request waited {} ms for a slot (queue_timeout_ms). "
                           "Please try again.", g.name, x.adm.queued_ms);
  } else {
    msg = fmt::format_to_n(x.scratch, sizeof x.scratch,
                           "The model group {} is saturated and its queue is full ({} requests waiting). Please try again.",
                           g.name, g.queue_max);
  }
  const size_t ml = msg.size < sizeof x.scratch ? msg.size : sizeof x.scratch;
  x.error_code = timeout ? "queue_timeout" : "queue_full";  // before the answer, which may end x's connection
  x.codec->answer_error(x, 429, std::string_view(x.scratch, ml), "requests", {}, x.error_code, false,
                        "retry-after: 1\r\nretry-after-ms: 1000\r\n");
}

}  // namespace sluice::proxy
