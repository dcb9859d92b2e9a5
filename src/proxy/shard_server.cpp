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
thread_local int64_t t_connection_memory = 0;
}  // namespace

int64_t connection_memory_bytes() noexcept { return t_connection_memory; }
void account_connection_memory(int64_t delta) noexcept { t_connection_memory += delta; }

byte_buf::~byte_buf() { release(); }

bool byte_buf::reserve(size_t n) noexcept {
  if (n <= cap) return true;
  if (n > (1u << 30)) return false;
  // 1 KiB first: a request head, a response head and most chat bodies fit;
  // an idle stream then holds ~3 KiB of buffers, not ~12.
  size_t next = cap == 0 ? 1024 : cap;
  while (next < n) next *= 2;
  void* p = std::realloc(data, next);
  if (p == nullptr) return false;
  data = static_cast<char*>(p);
  t_connection_memory += static_cast<int64_t>(next) - cap;
  cap = static_cast<uint32_t>(next);
  return true;
}

void byte_buf::release() noexcept {
  t_connection_memory -= cap;
  std::free(data);
  data = nullptr;
  len = cap = 0;
}

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
  return o;
}

// Over a per-shard cap, or out of memory before a connection object exists:
// shed at once rather than degrade everyone, with an answer the client can
// act on. One non-blocking send on a fresh socket (its buffer is empty).
constexpr std::string_view k_shed =
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 122\r\n"
    "retry-after: 1\r\nconnection: close\r\n\r\n"
    "{\"error\":{\"message\":\"The server is overloaded. Please try again.\",\"type\":\"server_error\","
    "\"param\":null,\"code\":\"overloaded\"}}";
static_assert(k_shed.size() - k_shed.find("\r\n\r\n") - 4 == 122, "content-length of the shed answer");

http::limits limits_from(const config::server_config& s) {
  http::limits l;
  l.head_bytes_max = s.max_head_bytes;
  l.line_bytes_max = s.max_line_bytes;
  l.header_count_max = static_cast<uint16_t>(s.max_header_count);
  l.body_bytes_max = s.max_body_bytes;
  return l;
}
}  // namespace

shard_server::shard_server(uint32_t index, std::shared_ptr<const config::config> cfg, shard::reactor& r,
                           int listen_fd, metrics::shard_metrics& m, const shard_mesh& mesh)
    : _index(index),
      _cfg(std::move(cfg)),
      _r(r),
      _metrics(m),
      _mesh(mesh),
      _routes(std::make_unique<route::table>(*_cfg, index, mesh.count)),
      _quota(index, mesh.count, key_limits_of(*_cfg), static_cast<int64_t>(monotonic_ns()),
             slices_options_of(mesh)),
      _listen_fd(listen_fd),
      _limits(limits_from(_cfg->server)),
      _reader(_cfg->server.max_body_bytes),
      _timers(r.now_ms()) {
  _accept_op.owner = this;
  _accept_op.fn = &shard_server::on_accept;
  _backends = std::make_unique<backend_state[]>(_cfg->backends.size());
  for (size_t i = 0; i < _cfg->backends.size(); ++i) _backends[i].cfg = &_cfg->backends[i];
  _id_seed = (static_cast<uint64_t>(index) << 56) ^ (monotonic_ns() * 0x9E3779B97F4A7C15ull);
  _prng = _id_seed | 1;
  _reported.assign(_cfg->backends.size(), 0);
  _last_failed.assign(_cfg->backends.size(), 0);
}

shard_server::~shard_server() {
  while (_conns != nullptr) {
    downstream_conn* d = _conns;
    _conns = d->all_hook.next;
    _timers.cancel(d->timer);
    if (d->fd >= 0) ::close(d->fd);
    delete d;
  }
  for (size_t i = 0; i < _cfg->backends.size(); ++i) {
    while (upstream_conn* u = _backends[i].idle_head) {
      _backends[i].idle_head = u->pool_hook.next;
      // Its armed receive ends with the shutdown (no byte can land in the
      // buffer after it is freed); the ring goes right after.
      if (u->fd >= 0) {
        ::shutdown(u->fd, SHUT_RDWR);
        ::close(u->fd);
      }
      drop_upstream_buffer(u);
      account_connection_memory(-static_cast<int64_t>(sizeof(upstream_conn)));
      delete u;
    }
  }
  if (_listen_fd >= 0) ::close(_listen_fd);
}

bool shard_server::init() noexcept {
  // 512 x 16 KiB provided buffers per shard: a receive lands in one buffer
  // and is copied into the connection's request buffer at once, so buffers
  // turn over quickly; 8 MiB per shard bounds what the kernel may fill.
  _bufs = net::buffer_ring::create(_r.ring(), 0, 512, 16 * 1024);
  if (!_bufs) return false;
  // server.upstream_buffers (64) x 64 KiB for the backends' responses:
  // lent from a receive's completion until its bytes are sent (a 41 KB SSE
  // burst fits one), so idle streams and pooled connections hold no receive
  // buffer. The kernel takes them in turn, so all are touched in time (4 MiB
  // by default): a fixed cost per shard. With every one lent, a connection
  // allocates its own.
  _up_bufs = net::buffer_ring::create(_r.ring(), 1, _cfg->server.upstream_buffers, 64 * 1024);
  if (!_up_bufs) return false;
  if (!_cfg->audit.path.empty()) {
    audit::writer::options o;
    o.shard = _index;
    o.fsync_interval_ms = _cfg->audit.fsync_interval_ms;
    _audit = audit::writer::open(_r, _cfg->audit.path, o);
    if (!_audit) return false;
  }
  submit_accept();
  return true;
}

void shard_server::submit_accept() noexcept {
  io_uring_sqe* s = _r.sqe(&_accept_op);
  io_uring_prep_multishot_accept(s, _listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  _accept_armed = true;
}

void shard_server::on_accept(shard::completion* c, const io_uring_cqe* cqe) {
  static_cast<op<shard_server>*>(c)->owner->on_accept_cqe(cqe);
}

void shard_server::on_accept_cqe(const io_uring_cqe* cqe) noexcept {
  const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
  if (!more) _accept_armed = false;
  if (cqe->res >= 0) {
    int fd = cqe->res;
    if (_draining) {
      ::close(fd);
    } else if (_conn_count >= _cfg->server.connections_max) {
      _metrics.at(metrics::stat::shed_connections).add();
      ssize_t sent = ::send(fd, k_shed.data(), k_shed.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)sent;  // best effort: the close says the rest
      ::close(fd);
    } else {
      auto* d = new (std::nothrow) downstream_conn(_limits);
      if (d == nullptr) {
        _metrics.at(metrics::stat::shed_memory).add();
        ssize_t sent = ::send(fd, k_shed.data(), k_shed.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)sent;
        ::close(fd);
      } else {
        account_connection_memory(sizeof(downstream_conn));
        d->srv = this;
        d->fd = fd;
        d->recv_op.owner = d->send_op.owner = d;
        d->timer.owner = d;
        d->recv_op.fn = &shard_server::on_recv;
        d->send_op.fn = &shard_server::on_send;
        net::set_nodelay(fd);
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
          d->peer_ip_len = static_cast<uint8_t>(net::format_ip(ss, d->peer_ip, sizeof d->peer_ip));
        }
        d->all_hook.next = _conns;
        if (_conns != nullptr) _conns->all_hook.prev = d;
        _conns = d;
        ++_conn_count;
        _metrics.at(metrics::stat::connections_accepted).add();
        _metrics.at(metrics::stat::connections_open).add();
        d->state = conn_state::idle;
        set_deadline(d, deadline_kind::header, _cfg->server.header_timeout_ms);
        submit_recv(d);
      }
    }
  } else if (cqe->res != -ECANCELED) {
    // EMFILE/ENFILE/ENOMEM: out of resources; the multishot ends. Re-arm on
    // the next tick rather than spin.
    log::warn("shard {}: accept: {}", _index, std::strerror(-cqe->res));
  }
  if (!more && !_draining && cqe->res != -ECANCELED) {
    // Re-armed from on_iteration (a tick later) to avoid a hot loop on EMFILE.
  }
}

void shard_server::set_deadline(downstream_conn* d, deadline_kind k, uint64_t ms) noexcept {
  const uint64_t at = deadline_at(k, now_ms(), ms, d->x.total_deadline_ms);
  if (at == 0) {
    d->deadline = deadline_kind::none;
    _timers.cancel(d->timer);
    return;
  }
  d->deadline = k;
  _timers.arm(d->timer, at);
}

void shard_server::on_iteration(uint64_t now) noexcept {
  _bufs->publish();
  _up_bufs->publish();
  if (!_accept_armed && !_draining) submit_accept();
  // Deadlines whose time has come (timeouts are seconds long: a loop
  // turn's precision is plenty). on_deadline may close and free any
  // connection, whose timer then leaves the wheel with it.
  _timers.expire(now, [this](shard::timer& t) { on_deadline(static_cast<downstream_conn*>(t.owner)); });
  if (_draining && _drain_deadline_ms != 0 && now >= _drain_deadline_ms) {
    // Drain time is up: cut whatever is left. A request cut here is
    // audited as cancelled, with what it had generated so far.
    downstream_conn* d = _conns;
    while (d != nullptr) {
      downstream_conn* next = d->all_hook.next;
      if (d->state != conn_state::closing) {
        if (d->x.request_open) {
          d->x.cancelled = true;
          d->x.error_code = "drain_timeout";
          if (d->x.status == 0) d->x.status = 503;
        }
        close_downstream(d);
      }
      d = next;
    }
    _drain_deadline_ms = 0;
  }
  pump_mesh(now);
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
  // Poll before sleeping only while few requests are open: then the next
  // completion (a backend's answer, a client's next request) is often
  // microseconds away and a wake-up costs more than the poll. Under load
  // completions come back to back and a poll would only fill the gaps.
  _r.allow_poll(_metrics.at(metrics::stat::requests_inflight).get() <= k_poll_open_max);
  const shard::reactor::poll_stats& ps = _r.polls();
  _metrics.set_loop(_r.iterations(), _r.cqes(), ps.caught, ps.missed, ps.ns);
  _metrics.at(metrics::stat::memory_bytes).set(static_cast<uint64_t>(std::max<int64_t>(t_connection_memory, 0)));
  _bufs->publish();
  _up_bufs->publish();
}

void shard_server::report_outcome(uint32_t backend, bool failure) noexcept {
  if (!failure && _last_failed[backend] == 0) return;
  _last_failed[backend] = failure ? 1 : 0;
  if (_mesh.to_control != nullptr) _mesh.to_control->try_push(upstream_outcome{backend, failure ? uint8_t{1} : uint8_t{0}});
}

void shard_server::reload(std::shared_ptr<const config::config> next) {
  const config::config& n = *next;
  SLUICE_VERIFY(n.backends.size() >= _cfg->backends.size() && n.keys.size() >= _cfg->keys.size());
  _routes = std::make_unique<route::table>(n, *_routes);
  // Backends keep their positions: pools and in-flight counts carry over.
  auto backends = std::make_unique<backend_state[]>(n.backends.size());
  for (size_t i = 0; i < _cfg->backends.size(); ++i) backends[i] = _backends[i];
  for (size_t i = 0; i < n.backends.size(); ++i) backends[i].cfg = &n.backends[i];
  _backends = std::move(backends);
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
  // Idle connections to removed backends go now; busy ones when released.
  for (size_t i = 0; i < _cfg->backends.size(); ++i) {
    if (!_cfg->backends[i].removed) continue;
    while (upstream_conn* u = _backends[i].idle_head) close_upstream(u);
  }
}

void shard_server::reopen_audit() noexcept {
  if (_audit) _audit->reopen();
}

void shard_server::close_audit() noexcept {
  if (_audit) _audit->close(5000);
}

void shard_server::begin_drain(uint64_t deadline_ms) noexcept {
  if (_draining) {
    // A second signal: the deadline only comes closer (drain(0) cuts now).
    if (_drain_deadline_ms == 0 || deadline_ms < _drain_deadline_ms) _drain_deadline_ms = deadline_ms;
    return;
  }
  _draining = true;
  _drain_deadline_ms = deadline_ms;
  if (_accept_armed) {
    io_uring_sqe* s = _r.sqe_untracked();
    io_uring_prep_cancel(s, &_accept_op, 0);
  }
  if (_listen_fd >= 0) {
    // Connections still in this listener's queue are reset; with
    // SO_REUSEPORT the kernel stops routing new ones here at once.
    ::shutdown(_listen_fd, SHUT_RDWR);
  }
  // Pooled backend connections stay in their pools: the destructor shuts
  // them down and frees them (closing them here would leave them waiting
  // for their receive's completion, which may come after the loop ends).
  // Idle keep-alive connections close now; busy ones after their response.
  downstream_conn* d = _conns;
  while (d != nullptr) {
    downstream_conn* next = d->all_hook.next;
    if (d->state == conn_state::idle && d->in.len == d->req_start) close_downstream(d);
    d = next;
  }
}

}  // namespace sluice::proxy
