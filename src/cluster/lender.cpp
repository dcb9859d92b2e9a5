// The control thread's seat in the lending mesh (lender.hpp).
#include "sluice/cluster/lender.hpp"

#include <algorithm>
#include <cmath>

#include "sluice/cluster/cluster.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::cluster {

lender::lender(const options& o, const config::cluster_config& c, std::span<const uint64_t> limits, uint64_t now_ms)
    : _o(o), _c(c), _outbox(o.shard_count) {
  SLUICE_VERIFY(o.shard_count >= 1 && o.shard_count < 65535);
  add_keys(limits, now_ms);
}

void lender::add_keys(std::span<const uint64_t> limits, uint64_t now_ms) {
  _keys.reserve(_keys.size() + limits.size());
  for (uint64_t limit : limits) {
    key_state& k = _keys.emplace_back(limit, lease_params_from(_c, static_cast<double>(limit)), now_ms,
                                      _o.shard_count);
    if (!_connected) k.lease.on_apart(now_ms);
    publish(static_cast<uint32_t>(_keys.size() - 1), now_ms);
  }
}

int64_t lender::top_up(const key_state& k, uint64_t now_ms) const noexcept {
  return static_cast<int64_t>(k.lease.target(now_ms) / (2.0 * _o.shard_count));
}

void lender::grant(uint32_t key, uint32_t to, uint32_t round, int64_t tokens, uint64_t now_ms) {
  quota::message g;
  g.epoch = _o.epoch;
  g.key = key;
  g.round = round;
  g.from_shard = static_cast<uint16_t>(_o.shard_count);
  g.kind = quota::message_kind::grant;
  g.res = quota::resource::tokens;
  g.capacity = tokens;
  g.level = tokens;
  _outbox[to].push_back(g);
  key_state& k = _keys[key];
  k.granted += static_cast<uint64_t>(tokens);
  // Demand is what the shards take (a grant is spent before they ask
  // again), not what each ask lacks: sized by the asks, the lease and the
  // top-ups would shrink toward one ask and Redis see a call per ask.
  if (tokens > 0 && k.limit > 0) k.lease.note_demand(static_cast<double>(tokens), now_ms);
}

void lender::on_message(const quota::message& m, uint64_t now_ms) {
  if (m.epoch != _o.epoch || m.key >= _keys.size() || m.from_shard >= _o.shard_count) return;
  key_state& k = _keys[m.key];
  if (m.res != quota::resource::tokens || k.limit == 0) {
    // Not the lender's to answer (shards ask it for tokens only): an empty
    // grant, so that a round never hangs on it.
    if (m.kind == quota::message_kind::lend_request) grant(m.key, m.from_shard, m.round, 0, now_ms);
    return;
  }
  switch (m.kind) {
    case quota::message_kind::lend_request: {
      k.active = true;
      const int64_t want = std::max<int64_t>(m.capacity, 1);
      if (k.lease.held() >= static_cast<double>(want)) {
        grant(m.key, m.from_shard, m.round,
              static_cast<int64_t>(k.lease.take_available(static_cast<double>(want + top_up(k, now_ms)), now_ms)),
              now_ms);
      } else {
        k.lease.need(static_cast<double>(want));
        waiting& w = k.wait[m.from_shard];
        if (w.want == 0) ++k.waiters;
        w = waiting{want, m.round, now_ms};
      }
      break;
    }
    case quota::message_kind::give_back:
    case quota::message_kind::grant:  // never sent to the lender; its tokens are not lost either
      if (m.level > 0) {
        k.lease.refund(static_cast<double>(m.level));
        k.returned += static_cast<uint64_t>(m.level);
      }
      break;
  }
  publish(m.key, now_ms);
}

void lender::serve(uint32_t key, uint64_t now_ms, bool deadline_only) {
  key_state& k = _keys[key];
  if (k.waiters == 0) return;
  for (uint32_t s = 0; s < _o.shard_count; ++s) {
    waiting& w = k.wait[s];
    if (w.want == 0) continue;
    const bool over = now_ms - w.since_ms >= _o.defer_ms;
    int64_t tokens = 0;
    if (!deadline_only && k.lease.held() >= static_cast<double>(w.want)) {
      tokens = static_cast<int64_t>(k.lease.take_available(static_cast<double>(w.want + top_up(k, now_ms)), now_ms));
    } else if (over) {
      // Waited long enough: what there is (possibly nothing; the shard
      // answers 429 with a retry time, and asks again after it).
      tokens = static_cast<int64_t>(k.lease.take_available(static_cast<double>(w.want), now_ms));
    } else {
      continue;
    }
    grant(key, s, w.round, tokens, now_ms);
    w = waiting{};
    --k.waiters;
  }
  publish(key, now_ms);
}

void lender::step(uint64_t now_ms, bool connected, lease_calls& calls) {
  if (connected != _connected) {
    _connected = connected;
    for (key_state& k : _keys) {
      if (connected) {
        k.lease.on_rejoin(now_ms);
      } else {
        k.lease.on_apart(now_ms);
      }
    }
  }
  for (uint32_t key = 0; key < _keys.size(); ++key) {
    key_state& k = _keys[key];
    if (!k.active) {
      publish(key, now_ms);
      continue;
    }
    if (k.lease.apart()) k.lease.refill(now_ms);
    const key_lease::request rq = k.lease.begin(now_ms);
    if (rq.kind != key_lease::op::none && !calls.send(key, rq)) k.lease.on_reply(rq, false, 0, now_ms);
    // Apart, the allowance accrues with time: waiters may be served now.
    serve(key, now_ms, false);
  }
}

void lender::on_reply(uint32_t key, const key_lease::request& rq, const bucket_reply* reply, uint64_t now_ms) {
  SLUICE_ASSERT(key < _keys.size());
  key_state& k = _keys[key];
  k.lease.on_reply(rq, reply != nullptr, reply != nullptr ? static_cast<double>(reply->tokens) : 0, now_ms);
  if (reply != nullptr) {
    k.global_level = reply->level;
    k.outstanding = reply->outstanding;
    k.reply_ms = now_ms;
    if (rq.kind == key_lease::op::lease) ++k.leases;
  }
  serve(key, now_ms, false);
}

void lender::consume(uint32_t s, size_t n) {
  SLUICE_ASSERT(s < _outbox.size() && n <= _outbox[s].size());
  _outbox[s].erase(_outbox[s].begin(), _outbox[s].begin() + static_cast<std::ptrdiff_t>(n));
}

bool lender::outbox_empty() const noexcept {
  return std::all_of(_outbox.begin(), _outbox.end(), [](const auto& o) { return o.empty(); });
}

void lender::publish(uint32_t key, uint64_t now_ms) noexcept {
  if (_o.published == nullptr || key >= _o.published_stride) return;
  const key_state& k = _keys[key];
  // What this instance could still admit: its lease, plus the shared
  // bucket as of the last reply, refilled since at the limit's rate (other
  // instances may have taken some: an estimate, capped at the limit).
  double level = k.lease.held();
  if (_connected && k.global_level >= 0) {
    const double since = now_ms > k.reply_ms ? static_cast<double>(now_ms - k.reply_ms) : 0.0;
    level += std::min(static_cast<double>(k.limit),
                      static_cast<double>(k.global_level) + since * static_cast<double>(k.limit) / 60000.0);
  }
  const size_t cell = (size_t{_o.shard_count} * _o.published_stride + key) * 2;
  _o.published[cell].store(static_cast<int64_t>(level), std::memory_order_relaxed);
}

lender::key_view lender::view(uint32_t key) const noexcept {
  key_view v;
  if (key >= _keys.size()) return v;
  const key_state& k = _keys[key];
  v.limit = k.limit;
  v.held = k.lease.held();
  v.owed = k.lease.owed();
  v.apart = k.lease.apart();
  v.granted = k.granted;
  v.returned = k.returned;
  v.global_level = k.global_level;
  v.outstanding = k.outstanding;
  v.leases = k.leases;
  return v;
}

}  // namespace sluice::cluster
