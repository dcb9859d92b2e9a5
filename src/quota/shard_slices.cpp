#include "sluice/quota/shard_slices.hpp"

#include <algorithm>

#include "sluice/core/assert.hpp"

namespace sluice::quota {
namespace {

// Checked in this order; the first that cannot be met names the rejection,
// so a key at its concurrency cap is told so even when its tokens are short
// too.
constexpr resource k_order[] = {resource::concurrency, resource::requests, resource::tokens};

constexpr size_t index_of(resource r) { return static_cast<size_t>(r); }

outcome rejection_for(resource r) {
  switch (r) {
    case resource::tokens: return outcome::reject_tokens;
    case resource::requests: return outcome::reject_requests;
    case resource::concurrency: return outcome::reject_concurrency;
  }
  return outcome::reject_tokens;
}

// A slot comes back when some request of the key finishes, which nothing
// here can predict; one second keeps the OpenAI SDK's retries spaced.
constexpr uint32_t k_concurrency_retry_ms = 1000;

// Between two shards borrowing for one key at once, the one nearer this
// slot's leader has priority; the leader moves on every slot.
constexpr int64_t k_priority_slot_ns = 100'000'000;

}  // namespace

shard_slices::shard_slices(uint32_t shard, uint32_t shard_count, std::span<const key_limits> keys,
                           int64_t now_ns, const slices_options& options)
    : _shard(shard), _shard_count(shard_count), _peers(shard_count + (options.lender ? 1 : 0)), _options(options) {
  SLUICE_VERIFY(shard_count >= 1 && shard_count <= 65535 && shard < shard_count);
  SLUICE_VERIFY(options.outbox_capacity >= 2 && (options.outbox_capacity & (options.outbox_capacity - 1)) == 0);
  SLUICE_VERIFY(options.floor_divisor >= 1);
  _stride = options.published_stride != 0 ? options.published_stride : static_cast<uint32_t>(keys.size());
  SLUICE_VERIFY(keys.size() <= _stride);
  _keys.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) init_key(_keys[i], keys[i], now_ns);
  _early.reserve(1024);
  for (uint32_t key = 0; key < _keys.size(); ++key) publish(key);
  _outbox.resize(size_t{_peers} * options.outbox_capacity);
  _outbox_head.assign(_peers, 0);
  _outbox_tail.assign(_peers, 0);
}

bool shard_slices::outranks(uint32_t a, uint32_t b, int64_t at_ns) const noexcept {
  const auto leader = static_cast<uint32_t>(static_cast<uint64_t>(at_ns / k_priority_slot_ns) % _shard_count);
  return (a + _shard_count - leader) % _shard_count < (b + _shard_count - leader) % _shard_count;
}

bool shard_slices::idle(const key_state& k, int64_t now_ns) const noexcept {
  return k.inflight == 0 && now_ns - k.last_admit_ns >= _options.idle_ns;
}

shard_slices::step shard_slices::evaluate(slice& s, resource r, int64_t need, int64_t now_ns) noexcept {
  if (s.global == 0) return step::fits;
  refill(s, r, now_ns);
  if (s.bucket.level() >= need) return step::fits;
  if (s.replies_pending > 0) {
    if (now_ns - s.round_start_ns < _options.round_timeout_ns) return step::wait;
    s.replies_pending = 0;  // a peer dropped our request (full outbox): give up on it
    s.round_end_ns = now_ns;
  }
  if (_shard_count == 1 && !s.leased) return step::reject;
  if (now_ns - s.round_end_ns < _options.borrow_cooldown_ns) return step::cooldown;
  return step::borrow;
}

uint32_t shard_slices::retry_ms(const slice& s, resource r, int64_t need) const noexcept {
  if (r == resource::concurrency) return k_concurrency_retry_ms;
  // The whole key refills at `global` per minute and a short slice borrows
  // what its peers refill, so the wait is the deficit at the key's rate.
  const int64_t rate = std::max(s.global, int64_t{1});
  const int64_t deficit = std::max<int64_t>(need - s.bucket.level(), 0);
  __extension__ typedef unsigned __int128 u128;
  const u128 wide = (u128(static_cast<uint64_t>(deficit)) * 60'000'000'000u + static_cast<uint64_t>(rate) - 1) /
                    static_cast<uint64_t>(rate);
  const int64_t ns = wide > u128(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(wide);
  const int64_t ms = (ns + 999'999) / 1'000'000;
  return static_cast<uint32_t>(std::clamp<int64_t>(ms, 1, UINT32_MAX));
}

decision shard_slices::try_reserve(uint32_t key, uint64_t cost_tokens, int64_t now_ns) noexcept {
  SLUICE_ASSERT(key < _keys.size());
  key_state& k = _keys[key];
  decision d;
  // Above any limit: treat as "larger than the bucket" without overflowing.
  const auto cost = static_cast<int64_t>(std::min<uint64_t>(cost_tokens, uint64_t{k_capacity_max} + 1));
  const slice& tokens = k.slices[index_of(resource::tokens)];
  if (tokens.global > 0 && cost > tokens.global) {
    d.result = outcome::reject_tokens;
    d.too_large = true;
    return d;
  }

  step steps[k_resource_count];
  for (resource r : k_order) {
    const int64_t need = r == resource::tokens ? cost : 1;
    steps[index_of(r)] = evaluate(k.slices[index_of(r)], r, need, now_ns);
  }
  for (resource r : k_order) {
    const step st = steps[index_of(r)];
    if (st != step::reject && st != step::cooldown) continue;
    const int64_t need = r == resource::tokens ? cost : 1;
    if (d.result == outcome::admit) d.result = rejection_for(r);
    const slice& s = k.slices[index_of(r)];
    const uint32_t wait_ms =
        st == step::cooldown
            ? static_cast<uint32_t>((_options.borrow_cooldown_ns - (now_ns - s.round_end_ns) + 999'999) / 1'000'000)
            : retry_ms(s, r, need);
    d.retry_after_ms = std::max(d.retry_after_ms, std::max<uint32_t>(wait_ms, 1));
  }
  if (d.result != outcome::admit) return d;

  bool waiting = false;
  for (resource r : k_order) {
    slice& s = k.slices[index_of(r)];
    const int64_t need = r == resource::tokens ? cost : 1;
    const step st = steps[index_of(r)];
    if (st != step::wait && st != step::borrow) continue;
    if (st == step::borrow && !start_round(s, key, r, need - s.bucket.level(), now_ns)) {
      d.result = rejection_for(r);
      d.retry_after_ms = retry_ms(s, r, need);
      return d;
    }
    if (!waiting) {  // the first resource waited for names a rejection after the wait
      d.wait_rejection = rejection_for(r);
      d.wait_retry_after_ms = retry_ms(s, r, need);
    }
    waiting = true;
  }
  if (waiting) {
    d.result = outcome::wait;
    d.retry_after_ms = 1;  // grants take microseconds; for a caller that cannot park
    return d;
  }

  for (resource r : k_order) {
    slice& s = k.slices[index_of(r)];
    if (s.global == 0) continue;
    const bool taken = s.bucket.try_take(r == resource::tokens ? cost : 1);
    SLUICE_ASSERT(taken);
    static_cast<void>(taken);
  }
  ++k.inflight;
  k.last_admit_ns = now_ns;
  d.held = reservation{key, tokens.global > 0 ? cost : 0, true};
  k.slices[index_of(resource::tokens)].reserved += d.held.tokens;
  publish(key);
  return d;
}

void shard_slices::publish(uint32_t key) noexcept {
  if (_options.published == nullptr) return;
  const size_t base = (size_t{_shard} * _stride + key) * 2;
  const key_state& k = _keys[key];
  _options.published[base].store(k.slices[index_of(resource::tokens)].bucket.level(), std::memory_order_relaxed);
  _options.published[base + 1].store(k.slices[index_of(resource::requests)].bucket.level(), std::memory_order_relaxed);
}

bool shard_slices::settle(reservation& held, uint64_t actual_tokens, int64_t now_ns) noexcept {
  if (!held.live) return false;
  held.live = false;
  SLUICE_ASSERT(held.key < _keys.size());
  key_state& k = _keys[held.key];
  slice& tokens = k.slices[index_of(resource::tokens)];
  tokens.reserved -= held.tokens;
  if (tokens.global > 0) {
    refill(tokens, resource::tokens, now_ns);
    const auto actual = static_cast<int64_t>(std::min<uint64_t>(actual_tokens, uint64_t{k_capacity_max}));
    if (actual < held.tokens) tokens.bucket.refund(held.tokens - actual);
    if (actual > held.tokens) tokens.bucket.charge(actual - held.tokens);
  }
  slice& slots = k.slices[index_of(resource::concurrency)];
  // Only free slots are ever lent, so the slot taken at admission is still
  // counted in this slice's capacity and the refund always fits.
  if (slots.global > 0) slots.bucket.refund(1);
  SLUICE_ASSERT(k.inflight > 0);
  --k.inflight;
  publish(held.key);
  return true;
}

bool shard_slices::start_round(slice& s, uint32_t key, resource r, int64_t want, int64_t now_ns) noexcept {
  ++s.round;
  message m;
  m.epoch = _options.epoch;
  m.key = key;
  m.round = s.round;
  m.from_shard = static_cast<uint16_t>(_shard);
  m.kind = message_kind::lend_request;
  m.res = r;
  m.capacity = want;
  m.level = now_ns;  // the round's start: see answer()
  uint16_t sent = 0;
  if (s.leased) {
    if (outbox_push(_shard_count, m)) ++sent;  // the lender alone has tokens to give
  } else {
    for (uint32_t peer = 0; peer < _shard_count; ++peer) {
      if (peer != _shard && outbox_push(peer, m)) ++sent;
    }
  }
  if (sent == 0) {
    s.round_end_ns = now_ns;
    return false;
  }
  s.replies_pending = sent;
  s.round_start_ns = now_ns;
  s.round_want = s.bucket.level() + want;
  return true;
}

void shard_slices::answer(const message& request, int64_t now_ns) noexcept {
  const uint32_t to = request.from_shard;
  // No room for the answer: drop the request; the borrower's round times
  // out. Capacity is only taken out once its message has a place.
  if (outbox_full(to)) return;
  key_state& k = _keys[request.key];
  slice& s = k.slices[index_of(request.res)];
  message g;
  g.epoch = _options.epoch;
  g.key = request.key;
  g.round = request.round;
  g.from_shard = static_cast<uint16_t>(_shard);
  g.kind = message_kind::grant;
  g.res = request.res;
  // A leased slice lends nothing to a peer shard (they borrow from the
  // lender), and the lender never asks: an empty grant.
  if (s.global > 0 && !s.leased) {
    const bool is_idle = idle(k, now_ns);
    refill(s, request.res, now_ns);
    // Capacity backing reservations still in flight stays: their refunds
    // must fit when they settle, or those tokens would vanish until refill.
    // An active lender gives what was asked (not more) down to the same
    // floor as an idle one -- one request may need most of the key's bucket
    // (max_tokens x output_weight), and a lender keeping half its share
    // would leave the bucket split in two halves too small for it -- but
    // only as much capacity as its tokens back: a busy slice near empty
    // would otherwise hand its rate to whichever peer asks most often.
    const int64_t keep = s.home / _options.floor_divisor + s.reserved;
    int64_t capacity = s.bucket.capacity() - keep;
    // Contention: this shard's own round for the same key and resource is
    // in flight. Lending each other what each asked for would swap equal
    // amounts and leave every slice as short as before (nobody admitted),
    // so one of the borrowers has priority and lends nothing to the others.
    // Priority rotates over the shards every k_priority_slot_ns (all shards
    // read one monotonic clock), so that a key that stays contended serves
    // every shard's clients in turn. Both sides take the slot of the earlier
    // of their two rounds' starts, not of the moment each answers: answers
    // on either side of a slot's end would otherwise each see the other
    // first (both lend nothing) or each see itself first.
    const bool contended = s.replies_pending > 0 && now_ns - s.round_start_ns < _options.round_timeout_ns;
    if (contended && outranks(_shard, request.from_shard, std::min(s.round_start_ns, request.level))) {
      capacity = 0;
    } else if (!is_idle) {
      capacity = std::min({capacity, request.capacity, std::max<int64_t>(s.bucket.level(), 0)});
    }
    if (capacity > 0) {
      const int64_t level = std::clamp<int64_t>(s.bucket.level(), 0, capacity);
      if (request.res == resource::concurrency) capacity = level;  // slots in use stay where they are
      if (capacity > 0) {
        s.bucket.remove(capacity, level, now_ns);
        g.capacity = capacity;
        g.level = level;
      }
    }
  }
  const bool pushed = outbox_push(to, g);
  SLUICE_ASSERT(pushed);
  static_cast<void>(pushed);
}

void shard_slices::init_key(key_state& k, const key_limits& limits, int64_t now_ns) {
  const uint64_t globals[k_resource_count] = {limits.tokens_per_minute, limits.requests_per_minute,
                                              limits.max_concurrent};
  k.last_admit_ns = now_ns - _options.idle_ns;  // idle from the start: nothing to protect yet
  for (size_t r = 0; r < k_resource_count; ++r) {
    SLUICE_VERIFY(globals[r] <= static_cast<uint64_t>(k_capacity_max));
    slice& s = k.slices[r];
    s.global = static_cast<int64_t>(globals[r]);
    s.round_end_ns = now_ns - _options.borrow_cooldown_ns;
    if (s.global == 0) continue;
    if (_options.lender && r == index_of(resource::tokens)) {
      // Empty, and without a capacity of its own to refill from or to
      // conserve: what it holds is what the lender granted.
      s.leased = true;
      s.bucket = token_bucket(k_capacity_max, now_ns);
      s.bucket.charge(k_capacity_max);
      continue;
    }
    // The remainder goes to the lowest shards, so the homes add up to G.
    s.home = s.global / _shard_count + (static_cast<int64_t>(_shard) < s.global % _shard_count ? 1 : 0);
    s.bucket = token_bucket(s.home, now_ns);
  }
}

void shard_slices::add_keys(std::span<const key_limits> more, int64_t now_ns) {
  const size_t first = _keys.size();
  SLUICE_VERIFY(first + more.size() <= _stride);
  _keys.resize(first + more.size());
  for (size_t i = 0; i < more.size(); ++i) {
    init_key(_keys[first + i], more[i], now_ns);
    publish(static_cast<uint32_t>(first + i));
  }
  std::vector<message> early;
  early.swap(_early);
  _early.reserve(1024);
  for (const message& m : early) on_message(m, now_ns);
}

message_effect shard_slices::on_message(const message& m, int64_t now_ns) noexcept {
  message_effect effect;
  effect.key = m.key;
  // A message from before a reload: the capacity it carries belonged to the
  // old generation, whose slices are gone.
  if (m.epoch != _options.epoch) return effect;
  if (m.key >= _keys.size()) {
    // A key a peer added by reload before this shard did: kept for
    // add_keys(), so the capacity it may carry is not lost. A full stash
    // (a reload racing a thousand borrow rounds) drops it.
    if (_early.size() < _early.capacity()) _early.push_back(m);
    return effect;
  }
  SLUICE_ASSERT(m.from_shard < _peers && m.from_shard != _shard);
  SLUICE_ASSERT(index_of(m.res) < k_resource_count);
  SLUICE_ASSERT(m.kind == message_kind::lend_request || (m.level >= 0 && m.level <= m.capacity));
  slice& s = at(m.key, m.res);
  switch (m.kind) {
    case message_kind::lend_request:
      answer(m, now_ns);
      break;
    case message_kind::grant:
      if (s.leased) {
        s.bucket.refund(m.level);  // a late grant (after its round timed out) counts all the same
      } else if (m.capacity > 0) {
        s.bucket.add(m.capacity, m.level, now_ns);
      }
      if (m.round == s.round && s.replies_pending > 0 && --s.replies_pending == 0) {
        // The cooldown holds off a new round only after one that came back
        // short: after a round that got what it asked for, the next request
        // may borrow at once (sequential requests alternate shards).
        s.round_end_ns = s.bucket.level() >= s.round_want ? now_ns - _options.borrow_cooldown_ns : now_ns;
        effect.round_complete = true;
      }
      break;
    case message_kind::give_back:
      if (s.leased) {
        s.bucket.refund(m.level);
      } else if (m.capacity > 0) {
        s.bucket.add(m.capacity, m.level, now_ns);
      }
      break;
  }
  publish(m.key);
  return effect;
}

void shard_slices::tick(int64_t now_ns) noexcept {
  if (_peers == 1) return;
  for (uint32_t key = 0; key < _keys.size(); ++key) {
    key_state& k = _keys[key];
    if (!idle(k, now_ns)) continue;
    for (size_t r = 0; r < k_resource_count; ++r) {
      slice& s = k.slices[r];
      if (s.leased) {
        give_back_to_lender(s, key, now_ns);
      } else if (_shard_count > 1) {
        give_back(k, key, static_cast<resource>(r), now_ns);
      }
    }
    publish(key);
  }
}

void shard_slices::give_back_to_lender(slice& s, uint32_t key, int64_t now_ns) noexcept {
  // Idle: every token goes home, where other shards (and, through Redis,
  // other instances) can use them. A debt (usage beyond a reservation)
  // stays: the next grant repays it.
  const int64_t level = s.bucket.level();
  if (level <= 0 || s.replies_pending > 0 || outbox_full(_shard_count)) return;
  message m;
  m.epoch = _options.epoch;
  m.key = key;
  m.from_shard = static_cast<uint16_t>(_shard);
  m.kind = message_kind::give_back;
  m.res = resource::tokens;
  m.capacity = level;
  m.level = level;
  const bool taken = s.bucket.try_take(level);
  SLUICE_ASSERT(taken);
  static_cast<void>(taken);
  const bool pushed = outbox_push(_shard_count, m);
  SLUICE_ASSERT(pushed);
  static_cast<void>(pushed);
  static_cast<void>(now_ns);
}

void shard_slices::give_back(key_state& k, uint32_t key, resource r, int64_t now_ns) noexcept {
  slice& s = k.slices[index_of(r)];
  if (s.global == 0 || s.replies_pending > 0) return;
  refill(s, r, now_ns);
  int64_t surplus = s.bucket.capacity() - s.home - s.reserved;
  // Small differences are not worth the messages.
  if (surplus < std::max<int64_t>(1, s.home / 4)) return;
  if (r == resource::concurrency) surplus = std::min(surplus, std::max<int64_t>(s.bucket.level(), 0));
  if (surplus <= 0) return;
  for (uint32_t peer = 0; peer < _shard_count; ++peer) {
    if (peer != _shard && outbox_full(peer)) return;  // all or nothing: retry next tick
  }
  const int64_t peers = _shard_count - 1;
  const int64_t share = surplus / peers;
  int64_t extra = surplus % peers;
  message m;
  m.epoch = _options.epoch;
  m.key = key;
  m.from_shard = static_cast<uint16_t>(_shard);
  m.kind = message_kind::give_back;
  m.res = r;
  for (uint32_t peer = 0; peer < _shard_count; ++peer) {
    if (peer == _shard) continue;
    const int64_t capacity = share + (extra > 0 ? 1 : 0);
    if (extra > 0) --extra;
    if (capacity == 0) continue;
    const int64_t level = std::clamp<int64_t>(s.bucket.level(), 0, capacity);
    s.bucket.remove(capacity, level, now_ns);
    m.capacity = capacity;
    m.level = level;
    const bool pushed = outbox_push(peer, m);
    SLUICE_ASSERT(pushed);
    static_cast<void>(pushed);
  }
}

rate_headers shard_slices::headers(uint32_t key, int64_t now_ns) noexcept {
  SLUICE_ASSERT(key < _keys.size());
  rate_headers h;
  const auto fill = [&](slice& s, rate_window& w, size_t r) {
    if (s.global == 0) return;
    refill(s, static_cast<resource>(r), now_ns);
    const int64_t level = std::max<int64_t>(s.bucket.level(), 0);
    w.limit = static_cast<uint64_t>(s.global);
    int64_t others = s.leased ? 0 : s.global - s.bucket.capacity();
    if (_options.published != nullptr) {
      // The peers' levels as they last published them (a peer's refill
      // since then is not counted: "remaining" errs low, never high); with
      // a lender, what it holds for this instance too.
      others = 0;
      const uint32_t rows = r == index_of(resource::tokens) ? _peers : _shard_count;
      for (uint32_t peer = 0; peer < rows; ++peer) {
        if (peer == _shard) continue;
        const size_t cell = (size_t{peer} * _stride + key) * 2 + r;
        others += std::max<int64_t>(_options.published[cell].load(std::memory_order_relaxed), 0);
      }
    }
    w.remaining = static_cast<uint64_t>(std::clamp<int64_t>(level + others, 0, s.global));
    if (s.leased) {
      // Until the key's whole limit could be back, at its rate (the shared
      // bucket refills at the limit per minute; other instances may use it).
      const uint64_t missing = static_cast<uint64_t>(s.global) - w.remaining;
      w.reset_ms = (missing * 60'000 + static_cast<uint64_t>(s.global) - 1) / static_cast<uint64_t>(s.global);
      return;
    }
    const int64_t ns = s.bucket.ns_until(s.bucket.capacity(), s.home);
    w.reset_ms = static_cast<uint64_t>((ns + 999'999) / 1'000'000);
  };
  fill(at(key, resource::requests), h.requests, 1);
  fill(at(key, resource::tokens), h.tokens, 0);
  return h;
}

bool shard_slices::outbox_full(uint32_t to) const noexcept {
  return _outbox_head[to] - _outbox_tail[to] == _options.outbox_capacity;
}

bool shard_slices::outbox_push(uint32_t to, const message& m) noexcept {
  SLUICE_ASSERT(to < _peers && to != _shard);
  if (outbox_full(to)) return false;
  const uint64_t mask = _options.outbox_capacity - 1;
  _outbox[size_t{to} * _options.outbox_capacity + (_outbox_head[to] & mask)] = m;
  ++_outbox_head[to];
  ++_outbox_total;
  return true;
}

std::span<const message> shard_slices::outbox_peek(uint32_t to) const noexcept {
  SLUICE_ASSERT(to < _peers);
  const uint64_t count = _outbox_head[to] - _outbox_tail[to];
  const uint64_t start = _outbox_tail[to] & (_options.outbox_capacity - 1);
  const uint64_t contiguous = std::min<uint64_t>(count, _options.outbox_capacity - start);
  return {_outbox.data() + size_t{to} * _options.outbox_capacity + start, static_cast<size_t>(contiguous)};
}

void shard_slices::outbox_consume(uint32_t to, size_t count) noexcept {
  SLUICE_ASSERT(count <= _outbox_head[to] - _outbox_tail[to]);
  _outbox_tail[to] += count;
  _outbox_total -= count;
}

size_t shard_slices::outbox_size(uint32_t to) const noexcept {
  return static_cast<size_t>(_outbox_head[to] - _outbox_tail[to]);
}

const message& shard_slices::outbox_at(uint32_t to, size_t i) const noexcept {
  SLUICE_ASSERT(i < outbox_size(to));
  const uint64_t mask = _options.outbox_capacity - 1;
  return _outbox[size_t{to} * _options.outbox_capacity + ((_outbox_tail[to] + i) & mask)];
}

int64_t shard_slices::capacity(uint32_t key, resource r) const noexcept { return at(key, r).bucket.capacity(); }
int64_t shard_slices::level(uint32_t key, resource r) const noexcept { return at(key, r).bucket.level(); }
int64_t shard_slices::home(uint32_t key, resource r) const noexcept { return at(key, r).home; }

}  // namespace sluice::quota
