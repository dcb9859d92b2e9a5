// [cluster] mode on the control thread (sluice/control/cluster.hpp).
#include "sluice/metrics/exposition.hpp"
#include "sluice/control/cluster.hpp"

#include <stdexcept>

#include "sluice/control/gateway.hpp"
#include "sluice/core/log.hpp"

namespace sluice::control {

// The lender's calls, sent through the Redis client. The reply is handed
// back with the loop's clock; a call that cannot be sent is answered by the
// lender itself (send() returns false).
struct cluster_keeper::calls final : cluster::lease_calls {
  cluster_keeper& k;
  explicit calls(cluster_keeper& owner) : k(owner) {}

  bool send(uint32_t key, const cluster::key_lease::request& rq) override {
    if (key >= k._ids.size() || k._client == nullptr) return false;
    auto done = [this, key, rq](result<cluster::bucket_reply> r) {
      k._lender->on_reply(key, rq, r ? &*r : nullptr, k._r.now_ms());
    };
    const auto amount = static_cast<uint64_t>(rq.tokens);
    const std::string& id = k._ids[key];
    switch (rq.kind) {
      case cluster::key_lease::op::lease:
        return k._client->lease(id, k._limits[key], amount, cluster::instance_id(), k._ttl_ms, std::move(done));
      case cluster::key_lease::op::give_back:
        return k._client->give_back(id, k._limits[key], amount, cluster::instance_id(), std::move(done));
      case cluster::key_lease::op::charge:
        return k._client->charge(id, k._limits[key], amount, cluster::instance_id(), std::move(done));
      case cluster::key_lease::op::none:
        return false;
    }
    return false;
  }
};

cluster_keeper::cluster_keeper(shard::reactor& r, gateway& g, const config::config& cfg)
    : _r(r), _g(g), _ttl_ms(cfg.cluster.lease_ttl_ms) {
  SLUICE_VERIFY(g.lending());
  for (const config::key_config& k : cfg.keys) {
    _ids.push_back(k.id);
    _limits.push_back(k.tokens_per_minute);
  }
  cluster::lender::options o;
  o.shard_count = static_cast<uint32_t>(g.shard_count());
  o.published = g.quota_cells();
  o.published_stride = g.quota_stride();
  // The lender answers a waiting round within defer_ms plus one loop tick
  // (50 ms): under the shards' 100 ms round timeout.
  o.defer_ms = 30;
  _lender = std::make_unique<cluster::lender>(o, cfg.cluster, _limits, r.now_ms());
  _calls = std::make_unique<calls>(*this);
  auto client = cluster::redis_client::create(r, cluster::redis_options_from(cfg.cluster));
  if (!client) throw std::runtime_error(fmt::format("[cluster] redis {}: the host does not resolve", cfg.cluster.redis));
  _client = std::move(*client);
  _client->start();
  g.set_control_reactor(&r);
  log::info("cluster: instance {} leases keys' tokens from {} (prefix \"{}\")", cluster::instance_id(),
            cfg.cluster.redis, cfg.cluster.key_prefix);
}

cluster_keeper::~cluster_keeper() {
  _g.set_control_reactor(nullptr);
  _client.reset();  // before the lender: no reply reaches it after this
}

void cluster_keeper::move_messages(uint64_t now_ms) {
  struct ctx {
    cluster::lender* l;
    uint64_t now;
  } c{_lender.get(), now_ms};
  _g.take_lender_messages([](void* p, const quota::message& m) {
    auto* x = static_cast<ctx*>(p);
    x->l->on_message(m, x->now);
  }, &c);
}

void cluster_keeper::on_iteration(uint64_t now_ms) {
  _client->on_iteration(now_ms);
  move_messages(now_ms);
  _lender->step(now_ms, _client->connected(), *_calls);
  for (uint32_t s = 0; s < _g.shard_count(); ++s) {
    const auto out = _lender->outbox(s);
    if (out.empty()) continue;
    _lender->consume(s, _g.send_from_lender(s, out));
  }
}

void cluster_keeper::reload(const config::config& next) {
  if (next.keys.size() <= _ids.size()) return;
  std::vector<uint64_t> more;
  for (size_t k = _ids.size(); k < next.keys.size(); ++k) {
    _ids.push_back(next.keys[k].id);
    _limits.push_back(next.keys[k].tokens_per_minute);
    more.push_back(next.keys[k].tokens_per_minute);
  }
  _lender->add_keys(more, _r.now_ms());
}

void cluster_keeper::render_metrics(std::string& out) const {
  const cluster::redis_client::counters& st = _client->stats();
  metrics::family(out, "sluice_cluster_connected", metrics::family_type::gauge,
                  "1 while the Redis of [cluster] answers (leases are shared), 0 while this instance serves on its "
                  "fallback share.")
      .add({}, _client->connected() ? 1 : 0);
  metrics::family(out, "sluice_cluster_redis_errors_total", metrics::family_type::counter,
                  "Failed Redis calls and connection attempts.")
      .add({}, st.errors);
  metrics::family(out, "sluice_cluster_redis_calls_total", metrics::family_type::counter,
                  "Lease, give-back and charge calls sent to Redis.")
      .add({}, st.commands);
  metrics::family held(out, "sluice_cluster_lease_tokens", metrics::family_type::gauge,
                       "Tokens this instance holds of a key's shared bucket (not yet at a shard).");
  for (uint32_t k = 0; k < _lender->key_count() && k < _ids.size(); ++k) {
    if (_limits[k] == 0) continue;
    const double h = _lender->view(k).held;
    held.add({{"key", _ids[k]}}, h > 0 ? static_cast<uint64_t>(h + 0.5) : 0);
  }
  metrics::family granted(out, "sluice_cluster_granted_tokens_total", metrics::family_type::counter,
                          "Tokens the lease lent to this instance's shards.");
  for (uint32_t k = 0; k < _lender->key_count() && k < _ids.size(); ++k) {
    if (_limits[k] == 0) continue;
    granted.add({{"key", _ids[k]}}, _lender->view(k).granted);
  }
}

void cluster_keeper::describe_key(uint32_t key, std::string& out) const {
  const cluster::lender::key_view v = _lender->view(key);
  if (v.limit == 0) {
    out += "null";
    return;
  }
  auto opt = [](int64_t x) { return x < 0 ? std::string("null") : fmt::format("{}", x); };
  fmt::format_to(std::back_inserter(out),
                 "{{\"connected\":{},\"instance\":\"{}\",\"tokens_per_minute\":{},\"bucket_level\":{},"
                 "\"leased_outstanding\":{},\"held_here\":{:.0f},\"owed\":{:.0f},\"apart\":{},\"granted_to_shards\":{},"
                 "\"returned_by_shards\":{},\"leases\":{}}}",
                 _client->connected() ? "true" : "false", cluster::instance_id(), v.limit, opt(v.global_level),
                 opt(v.outstanding), v.held, v.owed, v.apart ? "true" : "false", v.granted, v.returned, v.leases);
}

}  // namespace sluice::control
