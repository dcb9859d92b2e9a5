#include "sluice/metrics/exposition.hpp"
#include "sluice/control/health.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "grpc_probe.hpp"
#include "labels.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::control {

// One backend's prober: one probe in flight at a time, each on a fresh
// connection (a probe must see what a new request would: refused, slow to
// accept, or answering). An http:// backend gets GET /health (and a
// /metrics scrape every other round); a grpc:// one gets KServe's
// ServerReady and ModelReady over HTTP/2 (grpc_probe.hpp).
struct health_checker::probe {
  struct io : shard::completion {
    probe* self = nullptr;
    uint8_t step = 0;  // 0 connect, 1 send, 2 recv
  };
  health_checker* owner = nullptr;
  uint32_t backend = 0;
  route::backend_health health;
  config::health_config params;
  int fd = -1;
  int ops = 0;
  bool running = false;
  bool done = false;      // the outcome of this probe is decided
  uint64_t next_ms = 0;
  uint64_t rounds = 0;
  // The 5xx rate's window: answers and 5xx counted at its start.
  uint64_t window_start_ms = 0;
  uint64_t window_answers = 0;
  uint64_t window_errors = 0;
  uint64_t deadline_ms = 0;
  io op;
  char request[320];
  size_t request_len = 0;
  char reply[512];
  size_t reply_len = 0;
  // Every other round is a scrape of the backend's /metrics (vLLM's
  // queue length feeds the load view) instead of a /health probe.
  bool scrape = false;
  char scrape_request[320];
  size_t scrape_request_len = 0;
  std::string body;  // the scrape's reply (cold path: the control thread)
  // The last scrape's vLLM gauges (-1: absent) and the last health change,
  // for the status page.
  double vllm_waiting = -1, vllm_running = -1, vllm_kv_cache = -1;
  const char* last_change = "";
  int64_t last_change_unix_ms = 0;
  // grpc:// backends only: the HTTP/2 session, and what of its current
  // output the kernel has sent (the view stays valid until the next
  // next_send(), which waits for the send's CQE).
  std::unique_ptr<grpc_ready_probe> grpc;
  std::string_view grpc_out;

  explicit probe(const config::health_config& h) : health(h), params(h) {}
};

namespace {

// The status page's "last change" of a backend: what and when.
void note_change(health_checker::probe& p, const char* what) noexcept {
  p.last_change = what;
  p.last_change_unix_ms = static_cast<int64_t>(realtime_ms());
}

// A backend shared by several groups uses the first group's settings.
const config::health_config& health_params(const config::config& cfg, uint32_t b) {
  for (const config::group_config& grp : cfg.groups) {
    if (grp.removed) continue;
    for (uint32_t gb : grp.backends) {
      if (gb == b) return grp.health;
    }
  }
  return cfg.health;
}

// The model a grpc:// backend's ModelReady asks about: the first group's
// backend_model ("" = ServerReady alone).
std::string_view probe_model(const config::config& cfg, uint32_t b) {
  for (const config::group_config& grp : cfg.groups) {
    if (grp.removed) continue;
    for (uint32_t gb : grp.backends) {
      if (gb == b) return grp.backend_model;
    }
  }
  return {};
}

void set_grpc_target(grpc_ready_probe& g, const config::config& cfg, uint32_t b, const config::health_config& h) {
  g.set_target(cfg.backends[b].host_header, probe_model(cfg, b), h.timeout_ms);
}

}  // namespace

health_checker::health_checker(shard::reactor& r, gateway& g, std::shared_ptr<const config::config> cfg)
    : _r(r), _g(g), _cfg(std::move(cfg)) {
  for (uint32_t b = 0; b < _cfg->backends.size(); ++b) add_probe(b);
}

void health_checker::add_probe(uint32_t b) {
  auto p = std::make_unique<probe>(health_params(*_cfg, b));
  p->owner = this;
  p->backend = b;
  p->op.self = p.get();
  p->op.fn = &health_checker::on_cqe;
  auto r2 = fmt::format_to_n(p->request, sizeof p->request,
                             "GET /health HTTP/1.1\r\nhost: {}\r\nuser-agent: sluice-health\r\nconnection: close\r\n\r\n",
                             _cfg->backends[b].host_header);
  p->request_len = r2.size < sizeof p->request ? r2.size : sizeof p->request;
  auto r3 = fmt::format_to_n(p->scrape_request, sizeof p->scrape_request,
                             "GET /metrics HTTP/1.1\r\nhost: {}\r\nuser-agent: sluice-health\r\nconnection: close\r\n\r\n",
                             _cfg->backends[b].host_header);
  p->scrape_request_len = r3.size < sizeof p->scrape_request ? r3.size : sizeof p->scrape_request;
  if (_cfg->backends[b].transport == config::backend_transport::grpc) {
    p->grpc = std::make_unique<grpc_ready_probe>();
    set_grpc_target(*p->grpc, *_cfg, b, p->params);
  }
  _probes.push_back(std::move(p));
}

void health_checker::reload(std::shared_ptr<const config::config> next) {
  const size_t known = _probes.size();
  std::vector<uint32_t> readded;
  for (uint32_t b = 0; b < known; ++b) {
    if (_cfg->backends[b].removed && !next->backends[b].removed) readded.push_back(b);
  }
  _cfg = std::move(next);
  for (uint32_t b = 0; b < known; ++b) {
    probe& p = *_probes[b];
    p.params = health_params(*_cfg, b);
    p.health.set_params(p.params);
    // Read when the next call is made; a call already made keeps its bytes.
    if (p.grpc) set_grpc_target(*p.grpc, *_cfg, b, p.params);
  }
  // A backend back in the file starts afresh, as a new one does: up until
  // its probes or requests say otherwise (the shards had it down).
  for (uint32_t b : readded) {
    _probes[b]->health = route::backend_health(_probes[b]->params);
    _probes[b]->next_ms = 0;
    apply(b, route::health_event::became_up);
  }
  for (uint32_t b = static_cast<uint32_t>(known); b < _cfg->backends.size(); ++b) add_probe(b);
}

bool health_checker::set_draining(std::string_view url, bool draining) noexcept {
  for (uint32_t b = 0; b < _cfg->backends.size(); ++b) {
    if (_cfg->backends[b].removed || _cfg->backends[b].url != url) continue;
    probe& p = *_probes[b];
    if (p.health.draining() != draining) {
      p.health.set_draining(draining);
      note_change(p, draining ? "drained by the operator" : "undrained by the operator");
      log::info("backend {}: {}", url, draining ? "draining (no new requests)" : "no longer draining");
    }
    route::message m;
    m.kind = route::message_kind::backend_drain;
    m.backend = b;
    m.value = draining ? 1 : 0;
    _g.broadcast(m);
    return true;
  }
  return false;
}

void health_checker::describe_json(std::string& out) const {
  out += "{\"backends\":[";
  bool first = true;
  for (uint32_t b = 0; b < _cfg->backends.size(); ++b) {
    if (_cfg->backends[b].removed) continue;
    const probe& p = *_probes[b];
    if (!first) out += ',';
    first = false;
    out += "{\"url\":";
    openai::append_json_string(out, _cfg->backends[b].url);
    fmt::format_to(std::back_inserter(out), ",\"up\":{},\"draining\":{},\"takes_requests\":{}}}",
                   p.health.state() == route::health_state::up, p.health.draining(), p.health.takes_requests());
  }
  out += "]}\n";
}

void health_checker::status_rows(std::vector<backend_view>& out) const {
  for (uint32_t b = 0; b < _cfg->backends.size(); ++b) {
    if (_cfg->backends[b].removed) continue;
    const probe& p = *_probes[b];
    backend_view v;
    v.backend = b;
    v.url = _cfg->backends[b].url;
    const route::health_state st = p.health.state();
    v.state = st == route::health_state::down      ? "down"
              : st == route::health_state::ejected ? "ejected"
              : p.health.draining()                ? "draining"
                                                   : "up";
    v.probation = p.health.on_probation();
    v.waiting = p.vllm_waiting;
    v.running = p.vllm_running;
    v.kv_cache = p.vllm_kv_cache;
    v.last_change = p.last_change;
    v.last_change_unix_ms = p.last_change_unix_ms;
    out.push_back(v);
  }
}

void health_checker::render_metrics(std::string& out) const {
  metrics::family draining(out, "sluice_backend_draining", metrics::family_type::gauge,
                           "1 while an operator drains the backend (no new requests).");
  for (uint32_t b = 0; b < _cfg->backends.size(); ++b) {
    if (_cfg->backends[b].removed) continue;
    draining.add({{"backend", _cfg->backends[b].url}, {"protocol", backend_protocol_label(*_cfg, b)}},
                 _probes[b]->health.draining() ? 1 : 0);
  }
}

health_checker::~health_checker() {
  for (auto& p : _probes) {
    if (p->fd >= 0) ::close(p->fd);
  }
}

void health_checker::apply(uint32_t backend, route::health_event e) noexcept {
  if (_cfg->backends[backend].removed) return;  // no longer routed to: nothing to say
  route::message m;
  m.backend = backend;
  switch (e) {
    case route::health_event::none:
      return;
    case route::health_event::became_up:
    case route::health_event::readmitted:
      m.kind = route::message_kind::backend_up;
      note_change(*_probes[backend], e == route::health_event::readmitted ? "readmitted" : "up");
      log::info("backend {} is up", _cfg->backends[backend].url);
      _g.metrics().set_backend_up(backend, true);
      break;
    case route::health_event::became_down:
    case route::health_event::ejected:
      m.kind = route::message_kind::backend_down;
      note_change(*_probes[backend], e == route::health_event::ejected ? "ejected (request failures)"
                                                                       : "down (probes failing)");
      log::warn("backend {} is {}", _cfg->backends[backend].url,
                e == route::health_event::ejected ? "ejected (request failures)" : "down (probes failing)");
      _g.metrics().set_backend_up(backend, false);
      break;
  }
  _g.broadcast(m);
}

void health_checker::start_probe(probe& p, uint64_t now_ms) noexcept {
  const config::backend_config& b = _cfg->backends[p.backend];
  p.fd = net::stream_socket(b.address.family());
  if (p.fd < 0) {
    p.next_ms = now_ms + p.params.interval_ms;
    return;
  }
  p.running = true;
  p.done = false;
  p.reply_len = 0;
  p.body.clear();
  p.grpc_out = {};
  p.deadline_ms = now_ms + p.params.timeout_ms;
  p.op.step = 0;
  io_uring_sqe* s = _r.sqe(&p.op);
  io_uring_prep_connect(s, p.fd, reinterpret_cast<const sockaddr*>(&b.address.storage), b.address.length);
  ++p.ops;
}


void health_checker::finish_probe(probe& p, bool ok, uint64_t now_ms) noexcept {
  if (p.done) return;
  p.done = true;
  // shutdown() completes whatever is still pending on the socket; the fd is
  // closed when the last operation is back.
  ::shutdown(p.fd, SHUT_RDWR);
  if (p.scrape) {
    // A scrape says nothing about health; it only updates the queue length.
    const int64_t waiting = ok ? route::vllm_waiting_requests(p.body) : -1;
    p.vllm_waiting = static_cast<double>(waiting);
    p.vllm_running = ok ? route::prometheus_gauge_sum(p.body, "vllm:num_requests_running") : -1;
    p.vllm_kv_cache = ok ? route::prometheus_gauge_sum(p.body, "vllm:kv_cache_usage_perc") : -1;
    if (waiting >= 0) {
      route::message m;
      m.kind = route::message_kind::backend_waiting;
      m.backend = p.backend;
      m.value = static_cast<uint32_t>(waiting > UINT32_MAX ? UINT32_MAX : waiting);
      _g.broadcast(m);
    }
    p.scrape = false;
    p.next_ms = now_ms;  // the health probe goes on at its own pace
    if (p.ops == 0) close_probe(p);
    return;
  }
  if (p.grpc && !ok) {
    log::debug("backend {}: probe failed: {}{}{}", _cfg->backends[p.backend].url, p.grpc->why_call(),
               p.grpc->why_call().empty() ? "" : ": ", p.grpc->result() == grpc_ready_probe::outcome::pending
                                                       ? std::string_view("timed out or connection failed")
                                                       : p.grpc->why());
  }
  apply(p.backend, p.health.on_probe(ok, now_ms));
  p.next_ms = now_ms + p.params.interval_ms;
  // A healthy backend's queue length is read right after every second
  // probe (vLLM's /metrics; a grpc:// backend has none to scrape).
  p.scrape = ok && !p.grpc && (p.rounds++ % 2 == 1);
  if (p.scrape) p.next_ms = now_ms;
  if (p.ops == 0) close_probe(p);
}

void health_checker::close_probe(probe& p) noexcept {
  ::close(p.fd);
  p.fd = -1;
  p.running = false;
  // Every send is back from the kernel: the session's buffers may go.
  if (p.grpc) p.grpc->end();
  p.grpc_out = {};
}

void health_checker::on_cqe(shard::completion* c, const io_uring_cqe* cqe) {
  probe& p = *static_cast<probe::io*>(c)->self;
  health_checker& h = *p.owner;
  --p.ops;
  const uint64_t now = h._r.now_ms();
  if (p.done) {
    if (p.ops == 0) h.close_probe(p);
    return;
  }
  if (cqe->res < 0) {
    h.finish_probe(p, false, now);
    return;
  }
  if (p.grpc) {
    h.on_grpc_step(p, cqe->res, now);
    return;
  }
  switch (p.op.step) {
    case 0: {  // connected: send the request
      p.op.step = 1;
      io_uring_sqe* s = h._r.sqe(&p.op);
      if (p.scrape) {
        io_uring_prep_send(s, p.fd, p.scrape_request, p.scrape_request_len, MSG_NOSIGNAL);
      } else {
        io_uring_prep_send(s, p.fd, p.request, p.request_len, MSG_NOSIGNAL);
      }
      ++p.ops;
      return;
    }
    case 1: {  // sent: read the status line
      p.op.step = 2;
      io_uring_sqe* s = h._r.sqe(&p.op);
      io_uring_prep_recv(s, p.fd, p.reply, sizeof p.reply - 1, 0);
      ++p.ops;
      return;
    }
    default: {
      if (p.scrape) {
        // Read to the close (the request said connection: close), at most 1 MiB.
        if (cqe->res > 0 && p.body.size() < (1u << 20)) {
          p.body.append(p.reply, static_cast<size_t>(cqe->res));
          io_uring_sqe* s = h._r.sqe(&p.op);
          io_uring_prep_recv(s, p.fd, p.reply, sizeof p.reply - 1, 0);
          ++p.ops;
          return;
        }
        const bool ok = p.body.size() >= 12 && p.body.compare(0, 7, "HTTP/1.") == 0 && p.body[9] == '2';
        h.finish_probe(p, ok, now);
        return;
      }
      p.reply_len += static_cast<size_t>(cqe->res);
      // "HTTP/1.1 200" is all a probe needs to read.
      const bool ok = p.reply_len >= 12 && std::memcmp(p.reply, "HTTP/1.", 7) == 0 && p.reply[9] == '2';
      if (p.reply_len < 12 && cqe->res > 0) {
        io_uring_sqe* s = h._r.sqe(&p.op);
        io_uring_prep_recv(s, p.fd, p.reply + p.reply_len, sizeof p.reply - 1 - p.reply_len, 0);
        ++p.ops;
        return;
      }
      h.finish_probe(p, ok, now);
      return;
    }
  }
}

void health_checker::on_grpc_step(probe& p, int res, uint64_t now_ms) noexcept {
  grpc_ready_probe& g = *p.grpc;
  switch (p.op.step) {
    case 0:  // connected: preface, SETTINGS, ServerReady
      if (!g.begin()) {
        finish_probe(p, false, now_ms);
        return;
      }
      break;
    case 1:  // sent: the rest of this output, if the kernel took part of it
      p.grpc_out.remove_prefix(static_cast<size_t>(res) < p.grpc_out.size() ? static_cast<size_t>(res)
                                                                             : p.grpc_out.size());
      if (!p.grpc_out.empty()) {
        io_uring_sqe* s = _r.sqe(&p.op);
        io_uring_prep_send(s, p.fd, p.grpc_out.data(), p.grpc_out.size(), MSG_NOSIGNAL);
        ++p.ops;
        return;
      }
      break;
    default:  // received
      if (res == 0) {
        g.on_peer_closed();
      } else {
        g.on_recv(std::string_view(p.reply, static_cast<size_t>(res)));
      }
      break;
  }
  // One operation at a time: everything the session has to say is sent
  // before the next recv (a few small frames: the socket buffer takes them
  // at once), and the answer is read until the outcome is decided.
  if (g.result() == grpc_ready_probe::outcome::pending) {
    p.grpc_out = g.next_send();
    if (!p.grpc_out.empty()) {
      p.op.step = 1;
      io_uring_sqe* s = _r.sqe(&p.op);
      io_uring_prep_send(s, p.fd, p.grpc_out.data(), p.grpc_out.size(), MSG_NOSIGNAL);
      ++p.ops;
      return;
    }
  }
  if (g.result() == grpc_ready_probe::outcome::pending) {
    p.op.step = 2;
    io_uring_sqe* s = _r.sqe(&p.op);
    io_uring_prep_recv(s, p.fd, p.reply, sizeof p.reply, 0);
    ++p.ops;
    return;
  }
  finish_probe(p, g.result() == grpc_ready_probe::outcome::ready, now_ms);
}

bool health_checker::may_eject(uint32_t backend) const noexcept {
  // Envoy's max_ejection_percent, per group that has the backend: never
  // more than that share of the group ejected (rounded down: a group of one
  // is never ejected passively).
  for (const config::group_config& g : _cfg->groups) {
    if (g.removed) continue;
    bool member = false;
    uint32_t ejected = 0;
    for (uint32_t b : g.backends) {
      member |= b == backend;
      if (b < _probes.size() && _probes[b]->health.state() == route::health_state::ejected) ++ejected;
    }
    if (!member) continue;
    const uint64_t allowed = uint64_t{g.backends.size()} * g.health.max_ejection_percent / 100;
    if (ejected + 1 > allowed) return false;
  }
  return true;
}

void health_checker::judge_server_errors(probe& p, uint64_t now_ms) noexcept {
  // A rate, not a streak: a vLLM that answers 500 to a few bad prompts, or
  // 503 under load, keeps serving the rest; one that answers (nearly)
  // nothing but 5xx over a window with enough answers is ejected.
  constexpr uint64_t k_window_ms = 10000;
  constexpr uint64_t k_min_answers = 20;
  constexpr uint64_t k_error_percent = 90;
  if (now_ms - p.window_start_ms < k_window_ms) return;
  uint64_t answers = 0, errors = 0;
  _g.metrics().backend_answers(p.backend, answers, errors);
  const uint64_t da = answers - p.window_answers, de = errors - p.window_errors;
  p.window_start_ms = now_ms;
  p.window_answers = answers;
  p.window_errors = errors;
  if (da >= k_min_answers && de * 100 >= k_error_percent * da) {
    log::warn("backend {}: {} of its last {} answers were 5xx", _cfg->backends[p.backend].url, de, da);
    apply(p.backend, p.health.on_server_errors(now_ms, may_eject(p.backend)));
  }
}

void health_checker::on_iteration(uint64_t now_ms) noexcept {
  // Passive reports from the shards.
  struct ctx_t {
    health_checker* self;
    uint64_t now;
  } ctx{this, now_ms};
  _g.drain_outcomes(
      [](void* c, uint32_t backend, bool failure) {
        auto* x = static_cast<ctx_t*>(c);
        if (backend < x->self->_probes.size()) {
          x->self->apply(backend, x->self->_probes[backend]->health.on_request(failure, x->now, x->self->may_eject(backend)));
        }
      },
      &ctx);
  for (auto& pp : _probes) {
    probe& p = *pp;
    apply(p.backend, p.health.tick(now_ms));
    judge_server_errors(p, now_ms);
    if (p.params.interval_ms == 0 || _stopping) continue;
    if (_cfg->backends[p.backend].removed && !p.running) continue;
    if (p.running) {
      if (!p.done && now_ms >= p.deadline_ms) finish_probe(p, false, now_ms);  // timed out
      continue;
    }
    if (now_ms >= p.next_ms) start_probe(p, now_ms);
  }
}

}  // namespace sluice::control
