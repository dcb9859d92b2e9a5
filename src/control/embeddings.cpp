#include "sluice/control/embeddings.hpp"

#include <algorithm>

#include "sluice/core/log.hpp"

namespace sluice::control {

embeddings_loader::embeddings_loader(shard::reactor& r, std::shared_ptr<const config::config> cfg) : _r(r) {
  reload(std::move(cfg));
}

void embeddings_loader::reload(std::shared_ptr<const config::config> next) {
  _cfg = std::move(next);
  const config::router_config& rc = _cfg->router;
  if (rc.semantic != config::semantic_mode::embeddings || rc.centroids == nullptr) {
    _call.cancel();
    _job_cfg = nullptr;
    return;
  }
  if (_published != nullptr && _published->fingerprint == config::embeddings_fingerprint(*_cfg)) {
    _call.cancel();
    _job_cfg = nullptr;
    rc.centroids->publish(_published);
    log::info("router: embeddings centroids kept (examples and embeddings group unchanged)");
    return;
  }
  begin(_r.now_ms());
}

void embeddings_loader::begin(uint64_t now_ms) {
  _call.cancel();  // a call for an older snapshot: its answer is not wanted
  _job_cfg = _cfg;
  const config::config& cfg = *_job_cfg;
  _inputs.clear();
  for (uint32_t g = 0; g < cfg.groups.size(); ++g) {
    const config::group_config& grp = cfg.groups[g];
    if (grp.removed || g == cfg.router.embeddings_group_index) continue;
    for (const std::string& e : grp.examples) {
      _inputs.push_back({g, config::utf8_prefix(e, cfg.router.semantic_bytes)});
    }
  }
  _next = 0;
  _batch = 0;
  _dim = 0;
  _sums.clear();
  _counts.assign(cfg.groups.size(), 0);
  _next_try_ms = now_ms;
  _backoff_ms = k_backoff_first_ms;
  _started_ms = now_ms;
  _logged_failure = false;
}

void embeddings_loader::on_iteration(uint64_t now_ms) noexcept {
  if (_call.running()) {
    _call.expire(now_ms);
    return;
  }
  if (_job_cfg == nullptr || _stopping || !_call.idle() || now_ms < _next_try_ms) return;
  send_batch(now_ms);
}

void embeddings_loader::send_batch(uint64_t now_ms) noexcept {
  const config::config& cfg = *_job_cfg;
  const config::group_config& eg = cfg.groups[cfg.router.embeddings_group_index];
  if (eg.backends.empty()) return fail(now_ms, "the embeddings group has no backends");
  const config::backend_config& b = cfg.backends[eg.backends[_backend_turn % eg.backends.size()]];
  _batch = std::min(k_batch, _inputs.size() - _next);
  std::string_view texts[k_batch];
  for (size_t i = 0; i < _batch; ++i) texts[i] = _inputs[_next + i].text;
  // Two or more inputs: the request's "input" is a list (one is a string).
  if (_batch == 1) {
    route::write_embeddings_request(_call.request(), b.host_header, config::embeddings_model(eg), eg.api_key,
                                    std::span<const std::string_view>(texts, 1));
  } else {
    route::write_embeddings_request(_call.request(), b.host_header, config::embeddings_model(eg), eg.api_key,
                                    std::span<const std::string_view>(texts, _batch));
  }
  if (!_call.start(_r, b.address, now_ms + k_call_timeout_ms, &on_done, this, &route::embeddings_reply_whole)) {
    fail(now_ms, "no socket");
  }
}

void embeddings_loader::on_done(void* ctx, net::http_call&, net::http_call::outcome o) {
  static_cast<embeddings_loader*>(ctx)->done(o);
}

void embeddings_loader::done(net::http_call::outcome o) noexcept {
  const uint64_t now = _r.now_ms();
  if (_job_cfg == nullptr) return;
  if (o != net::http_call::outcome::ok) return fail(now, std::string(net::http_call::to_string(o)));
  uint32_t dim = 0;
  if (!_reader.read(_call.reply(), _batch, _vecs, dim, _why)) return fail(now, _why);
  if (_dim == 0) {
    _dim = dim;
    _sums.assign(_counts.size() * size_t{dim}, 0.0f);
  } else if (dim != _dim) {
    begin(now);  // the model changed under us: start over
    return;
  }
  for (size_t i = 0; i < _batch; ++i) {
    const input& in = _inputs[_next + i];
    const std::span<const float> v(_vecs.data() + i * dim, dim);
    if (config::add_unit(std::span<float>(_sums.data() + size_t{in.group} * dim, dim), v)) ++_counts[in.group];
  }
  _next += _batch;
  _batch = 0;
  _backoff_ms = k_backoff_first_ms;
  _next_try_ms = now;
  if (_next == _inputs.size()) publish();
}

void embeddings_loader::fail(uint64_t now_ms, const std::string& why) noexcept {
  ++_failures;
  ++_backend_turn;
  _next_try_ms = now_ms + _backoff_ms;
  if (!_logged_failure || _backoff_ms == k_backoff_max_ms) {
    log::warn("router: embeddings group \"{}\" did not answer the examples ({}); the classifier decides until it "
              "does (next try in {} ms)",
              _job_cfg->router.embeddings_group, why, _backoff_ms);
    _logged_failure = true;
  }
  _backoff_ms = std::min(_backoff_ms * 2, k_backoff_max_ms);
}

void embeddings_loader::publish() noexcept {
  const config::config& cfg = *_job_cfg;
  auto c = std::make_shared<config::embedding_centroids>();
  c->dim = _dim;
  c->fingerprint = config::embeddings_fingerprint(cfg);
  c->examples = _inputs.size();
  for (uint32_t g = 0; g < _counts.size(); ++g) {
    if (_counts[g] == 0) continue;
    const float* sum = _sums.data() + size_t{g} * _dim;
    const size_t at = c->rows.size();
    c->rows.insert(c->rows.end(), sum, sum + _dim);
    config::normalize(std::span<float>(c->rows.data() + at, _dim));
    c->groups.push_back(g);
  }
  log::info("router: embeddings centroids ready: {} groups from {} examples, {} dimensions, in {} ms",
            c->groups.size(), c->examples, c->dim, _r.now_ms() - _started_ms);
  _published = c;
  cfg.router.centroids->publish(std::move(c));
  _job_cfg = nullptr;
}

bool embeddings_loader::stop() noexcept {
  _stopping = true;
  _call.cancel();
  return _call.idle();
}

}  // namespace sluice::control
