#include "embed_router.hpp"

#include "client_codec.hpp"
#include "shard_server.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::proxy {

bool embed_router::start(exchange& x, const route::embed_input& in) noexcept {
  const config::config& cfg = *_ctx.cfg;
  const uint32_t eg = cfg.router.embeddings_group_index;
  std::shared_ptr<const config::embedding_centroids> centroids = _ctx.routes->groups().centroids_shared();
  if (eg >= cfg.groups.size() || centroids == nullptr) return false;
  slot* free = nullptr;
  for (slot& s : _slots) {
    if (s.call == nullptr || s.call->idle()) {
      free = &s;
      break;
    }
  }
  if (free == nullptr) {
    _ctx.metrics.at(metrics::stat::router_embeddings_busy).add();
    return false;
  }
  const route::choice c = _ctx.routes->pick(eg, route::route_key_result{in.hash, route::key_source::prefix});
  if (c.backend == route::k_none) {
    _ctx.metrics.at(metrics::stat::router_embeddings_failed).add();
    return false;
  }
  const config::group_config& g = cfg.groups[eg];
  const config::backend_config& b = cfg.backends[c.backend];
  if (free->call == nullptr) free->call = std::make_unique<net::http_call>(k_reply_max);  // once per slot
  free->owner = this;
  // The request owns copies of the texts: the exchange's request bytes are
  // not read again until the call ends.
  std::string_view inputs[1];
  std::string joined;
  if (in.system.empty()) {
    inputs[0] = in.user;
  } else {
    joined.reserve(in.system.size() + 1 + in.user.size());
    joined.append(in.system).append("\n").append(in.user);
    inputs[0] = joined;
  }
  route::write_embeddings_request(free->call->request(), b.host_header, config::embeddings_model(g), g.api_key,
                                  inputs);
  const uint64_t deadline = _ctx.now_ms() + cfg.router.embeddings_timeout_ms;
  if (!free->call->start(_ctx.r, b.address, deadline, &on_done, free, &route::embeddings_reply_whole)) {
    _ctx.metrics.at(metrics::stat::router_embeddings_failed).add();
    return false;
  }
  free->waiter = &x;
  free->in = route::embed_input{{}, {}, in.hash, in.later_turn};
  free->centroids = std::move(centroids);
  x.waiting = exchange::waiting_in::embeddings;
  x.embed_slot = static_cast<uint8_t>(free - _slots.data());
  ++_running;
  return true;
}

void embed_router::detach(exchange& x) noexcept {
  if (x.waiting != exchange::waiting_in::embeddings) return;
  slot& s = _slots[x.embed_slot];
  if (s.waiter == &x) s.waiter = nullptr;
  x.waiting = exchange::waiting_in::none;
}

embed_router::~embed_router() {
  // The shard ends only once drained() (every call idle); a call still in
  // the kernel here would be written into after it is freed.
  SLUICE_VERIFY(idle());
}

bool embed_router::idle() const noexcept {
  for (const slot& s : _slots) {
    if (s.call != nullptr && !s.call->idle()) return false;
  }
  return true;
}

void embed_router::cancel_all() noexcept {
  for (slot& s : _slots) {
    if (s.call != nullptr && s.call->running()) s.call->expire(UINT64_MAX);
  }
}

void embed_router::on_iteration(uint64_t now_ms) noexcept {
  if (_running == 0) return;
  for (slot& s : _slots) {
    if (s.call != nullptr && s.call->running()) s.call->expire(now_ms);
  }
}

bool embed_router::warn_now() noexcept {
  const uint64_t now = _ctx.now_ms();
  if (_last_warn_ms != 0 && now - _last_warn_ms < k_warn_interval_ms) return false;
  _last_warn_ms = now;
  return true;
}

void embed_router::on_done(void* ctx, net::http_call&, net::http_call::outcome o) {
  auto* s = static_cast<slot*>(ctx);
  s->owner->finish(*s, o);
}

void embed_router::finish(slot& s, net::http_call::outcome o) noexcept {
  --_running;
  exchange* x = s.waiter;
  s.waiter = nullptr;
  std::shared_ptr<const config::embedding_centroids> centroids = std::move(s.centroids);
  route::decision d;
  uint32_t dim = 0;
  bool ok = false;
  if (o == net::http_call::outcome::ok) {
    ok = _reader.read(s.call->reply(), 1, _vec, dim, _why);
  } else {
    _why = net::http_call::to_string(o);
  }
  if (ok) {
    _ctx.metrics.at(metrics::stat::router_embeddings_ok).add();
    d = _ctx.routes->groups().embedding_decision(*centroids, _vec, s.in,
                                                 x != nullptr && x->key_index >= 0
                                                     ? static_cast<uint32_t>(x->key_index)
                                                     : route::k_none);
    if (dim != centroids->dim && warn_now()) {
      log::warn("router: the embeddings group answered {} dimensions; its examples had {}", dim, centroids->dim);
    }
  } else {
    _ctx.metrics.at(o == net::http_call::outcome::timeout ? metrics::stat::router_embeddings_timeouts
                                                           : metrics::stat::router_embeddings_failed)
        .add();
    if (warn_now()) log::warn("router: an embeddings call failed ({}); the classifier decides", _why);
  }
  if (x == nullptr) return;  // its client went: the decision stays in the cache
  x->waiting = exchange::waiting_in::none;
  x->codec->wait_for_backend(*x, deadline_kind::none, 0);  // as dispatch left it (the quota walk does the same)
  if (d.group != route::k_none) {
    x->embed = exchange::embed_step::decided;
    x->route_group = d.group;
    x->route_how = d.how;
    x->route_confidence = d.confidence;
  } else {
    x->embed = exchange::embed_step::fallback;
  }
  _srv.route_request(*x);
}

}  // namespace sluice::proxy
