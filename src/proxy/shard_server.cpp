// Shard lifecycle: accept, the connection list, deadlines, drain.
#include "shard_server.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <new>

#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/net/socket.hpp"

namespace sluice::proxy {

namespace {
std::vector<quota::key_limits> key_limits_of(const config::config& c) {
  std::vector<quota::key_limits> v;
  v.reserve(c.keys.size());
  for (const auto& k : c.keys) v.push_back({k.tokens_per_minute, k.requests_per_minute, k.max_concurrent});
  return v;
}

quota::slices_options slices_options_of(const shard_mesh& mesh) {
  quota::slices_options o;
  o.published = mesh.quota_levels;
  o.published_stride = mesh.quota_keys_max;
  o.lender = mesh.to_lender != nullptr;
  return o;
}

}  // namespace

shard_server::shard_server(uint32_t index, std::shared_ptr<const config::config> cfg, shard::reactor& r,
                           int listen_fd, int tls_listen_fd, metrics::shard_metrics& m, const shard_mesh& mesh)
    : _ctx(index, std::move(cfg), r, m, mesh.count),
      _index(index),
      _mesh(mesh),
      _quota(index, mesh.count, key_limits_of(*_cfg), static_cast<int64_t>(monotonic_ns()),
             slices_options_of(mesh)),
      _budgets(*mesh.budgets),
      _reader(_cfg->server.max_body_bytes),
      _embed(_ctx, *this),
      _openai(_ctx, *this),
      _anthropic(_ctx, _openai),
      _triton(_ctx, *this),
      _client(_ctx, listen_fd, tls_listen_fd),
      _h1(_ctx, *this, _client),
      _h2(_ctx, *this, _client) {
  _client.set_protocols(&_h1, &_h2);
  _id_seed = (static_cast<uint64_t>(index) << 56) ^ (monotonic_ns() * 0x9E3779B97F4A7C15ull);
  _prng = _id_seed | 1;
  _reported.assign(_cfg->backends.size(), 0);
  reload_admission();
  _last_failed.assign(_cfg->backends.size(), 0);
}

shard_server::~shard_server() = default;

bool shard_server::init() noexcept {
  if (!_openai.init() || !_client.init()) return false;
  if (!_cfg->audit.path.empty()) {
    audit::writer::options o;
    o.shard = _index;
    o.fsync_interval_ms = _cfg->audit.fsync_interval_ms;
    _audit = audit::writer::open(_r, _cfg->audit.path, o);
    if (!_audit) return false;
  }
  return true;
}

void shard_server::on_iteration(uint64_t now) noexcept {
  _openai.on_iteration();
  _client.on_iteration(now);
  _h2.on_iteration(now);
  if (_draining && _ctx.drain_deadline_ms != 0 && now >= _ctx.drain_deadline_ms) {
    _client.cut_drain();  // drain time is up: cut whatever is left
    _embed.cancel_all();
    _ctx.drain_deadline_ms = 0;
  }
  pump_mesh(now);
  _embed.on_iteration(now);
  if (_audit) {
    _audit->tick(now);
    const audit::writer_stats& a = _audit->stats();
    _metrics.at(metrics::stat::audit_written).set(a.lines_written.get());
    _metrics.at(metrics::stat::audit_dropped).set(a.lines_dropped.get());
    _metrics.at(metrics::stat::audit_lost).set(a.lines_lost.get());
    _metrics.at(metrics::stat::audit_write_errors).set(a.write_errors.get());
    _metrics.at(metrics::stat::audit_fsyncs).set(a.fsyncs.get());
    _metrics.at(metrics::stat::audit_fsync_errors).set(a.fsync_errors.get());
  }
  // Poll before sleeping only while few requests are open from few clients:
  // then the next completion (a backend's answer, the client's next
  // request) is often microseconds away and a wake-up costs more than the
  // poll. Under load completions come back to back and a poll would only
  // fill the gaps; with many clients the loop dips to 2 open requests and
  // back all the time, each wake-up serves several of them, and the polls
  // in the dips cost more than the wake-ups they save (bench/RESULTS.md,
  // "Figures behind choices in the code").
  const uint64_t open = _metrics.at(metrics::stat::requests_inflight).get();
  _r.allow_poll(open <= k_poll_open_max && _client.connection_count() <= k_poll_connections_max);
  // The other end (server.batch_wait_us, off by default): with many
  // requests open, a wait that holds out for as many completions as there
  // are open requests (or that long, whichever ends first) can serve them
  // in one wake-up instead of one each. It pays on a saturated core of the
  // shard's own, not on shared cores or with slow streams (README
  // "Batched waits", bench/RESULTS.md); the reactor ignores it when off.
  _r.batch(open >= k_batch_open_min ? static_cast<unsigned>(std::min<uint64_t>(open, k_batch_max)) : 1);
  const shard::reactor::poll_stats& ps = _r.polls();
  _metrics.set_loop(_r.iterations(), _r.cqes(), ps.caught, ps.missed, ps.ns, _r.batched_waits());
  _metrics.at(metrics::stat::memory_bytes).set(static_cast<uint64_t>(std::max<int64_t>(connection_memory_bytes(), 0)));
  _openai.on_iteration();
  _client.on_iteration(now);
}

void shard_server::report_outcome(uint32_t backend, bool failure) noexcept {
  if (failure) _metrics.backend_failed(backend);
  if (!failure && _last_failed[backend] == 0) return;
  _last_failed[backend] = failure ? 1 : 0;
  if (_mesh.to_control != nullptr) _mesh.to_control->try_push(upstream_outcome{backend, failure ? uint8_t{1} : uint8_t{0}});
}

void shard_server::reload(std::shared_ptr<const config::config> next) {
  const config::config& n = *next;
  SLUICE_VERIFY(n.backends.size() >= _cfg->backends.size() && n.keys.size() >= _cfg->keys.size());
  _routes = std::make_unique<route::table>(n, *_routes);
  _openai.reload(n);
  _triton.reload(n);
  _reported.resize(n.backends.size(), 0);
  _reported_version = ~uint64_t{0};  // a new table counts afresh: compare at the next report
  _last_failed.resize(n.backends.size(), 0);
  if (n.keys.size() > _cfg->keys.size()) {
    std::vector<quota::key_limits> more;
    for (size_t k = _cfg->keys.size(); k < n.keys.size(); ++k) {
      more.push_back({n.keys[k].tokens_per_minute, n.keys[k].requests_per_minute, n.keys[k].max_concurrent});
    }
    _quota.add_keys(more, static_cast<int64_t>(monotonic_ns()));
  }
  // A removed or re-keyed key must not stay verified.
  _keys.forget();
  _cfg = std::move(next);
  reload_admission();
}

void shard_server::reopen_audit() noexcept {
  if (_audit) _audit->reopen();
}

void shard_server::close_audit() noexcept {
  if (_audit) _audit->close(5000);
}

void shard_server::begin_drain(uint64_t deadline_ms, bool handover) noexcept {
  if (_draining) {
    // A second signal: the deadline only comes closer (drain(0) cuts now).
    if (_ctx.drain_deadline_ms == 0 || deadline_ms < _ctx.drain_deadline_ms) _ctx.drain_deadline_ms = deadline_ms;
    return;
  }
  _draining = true;
  _ctx.drain_deadline_ms = deadline_ms;
  // Pooled backend connections stay in their pools: the adapter's
  // destructor shuts them down and frees them (closing them here would leave
  // them waiting for their receive's completion, which may come after the
  // loop ends).
  _client.begin_drain(handover);
}

}  // namespace sluice::proxy
