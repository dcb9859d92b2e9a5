#include "sluice/metrics/exposition.hpp"
#include "sluice/control/admin.hpp"
#include "sluice/control/cluster.hpp"

#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <optional>
#include <string>

#include <openssl/crypto.h>

#include "sluice/auth/key_verifier.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/http/request.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/control/budgets.hpp"
#include "sluice/control/health.hpp"
#include "sluice/control/status.hpp"
#include "sluice/core/clock.hpp"

namespace sluice::control {

// Control-thread-local. One per admin connection: one request, then close.
// One operation at a time is in flight (a receive, a send, or the timer of
// a drain waiting for the shards); its CQE is what frees the connection.
struct admin_server::conn {
  struct io : shard::completion {
    conn* self = nullptr;
  };
  io recv_op, send_op, settle_op;
  bool settle_timer_armed = false;  // settle_op is the kernel's until its CQE
  std::optional<settle_wait> settling;  // a drain's answer waits for every shard
  bool to_page = false;  // a drain from the status page's form: answered 303 to /
  // The whole request head must come by this time (a trickle of one byte
  // every few seconds would pass every per-receive bound); the receive's
  // own link timeout is cut to what is left of it (the kernel reads it at
  // submission, so it lives here, not on a stack).
  uint64_t head_deadline_ms = 0;
  __kernel_timespec recv_timeout{};
  bool reading = true;   // the head is still coming: this one may be evicted for a newer one
  bool evicted = false;  // shut down for a newer connection; its receive's CQE closes it
  conn* older = nullptr;  // the admin server's connections, oldest first
  conn* newer = nullptr;
  admin_server* srv = nullptr;
  int fd = -1;
  uint32_t len = 0;
  std::string reply;
  size_t sent = 0;
  http::request_parser parser{http::limits{}};
  http::request_head head;
  char buf[8192];
};

admin_server::admin_server(shard::reactor& r, const gateway& g, int listen_fd) noexcept
    : _r(r), _g(g), _listen_fd(listen_fd) {
  if (listen_fd >= 0) _port = net::local_port(listen_fd);
  _accept_op.self = _rearm_op.self = this;
  _accept_op.fn = &admin_server::on_accept;
  _rearm_op.fn = &admin_server::on_rearm_timer;
}

admin_server::~admin_server() {
  if (_listen_fd >= 0) ::close(_listen_fd);
}

void admin_server::start() noexcept {
  io_uring_sqe* s = _r.sqe(&_accept_op);
  io_uring_prep_multishot_accept(s, _listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  _accepting = true;
}

void admin_server::on_rearm_timer(shard::completion* c, const io_uring_cqe*) {
  admin_server* self = static_cast<accept_op*>(c)->self;
  self->_rearm_armed = false;
  if (self->_accepting) self->start();
}

void admin_server::stop_accepting() noexcept {
  if (!_accepting) return;
  _accepting = false;
  io_uring_sqe* s = _r.sqe_untracked();
  io_uring_prep_cancel(s, &_accept_op, 0);
}

void admin_server::on_accept(shard::completion* c, const io_uring_cqe* cqe) {
  admin_server* self = static_cast<accept_op*>(c)->self;
  if ((cqe->flags & IORING_CQE_F_MORE) == 0 && self->_accepting && cqe->res != -ECANCELED) {
    if (cqe->res >= 0) {
      self->start();
    } else if (!self->_rearm_armed) {
      // EMFILE, ENFILE, ENOMEM with a connection still queued: armed again
      // at once it would fail at once, and the control thread would spin.
      static constexpr __kernel_timespec k_rearm_pause{0, 50'000'000};
      io_uring_sqe* s = self->_r.sqe(&self->_rearm_op);
      io_uring_prep_timeout(s, const_cast<__kernel_timespec*>(&k_rearm_pause), 0, 0);
      self->_rearm_armed = true;
    }
  }
  if (cqe->res < 0) return;
  if (self->_open - self->_evicting >= k_conns_max) {
    // The admin port is for scrapes and probes, not load. Full: the oldest
    // connection still sending its head makes room (a probe's request comes
    // in one packet; a slow trickle is what waits), else this one goes.
    conn* o = self->_oldest;
    while (o != nullptr && (!o->reading || o->evicted)) o = o->newer;
    if (o == nullptr) {
      ::close(cqe->res);
      return;
    }
    o->evicted = true;
    ++self->_evicting;
    ::shutdown(o->fd, SHUT_RDWR);  // its receive ends (0 or an error) and closes it
  }
  auto* k = new (std::nothrow) conn();
  if (k == nullptr) {
    ::close(cqe->res);
    return;
  }
  ++self->_open;
  k->srv = self;
  k->fd = cqe->res;
  k->head_deadline_ms = self->_r.now_ms() + k_head_timeout_ms;
  k->older = self->_newest;
  if (self->_newest != nullptr) self->_newest->newer = k;
  self->_newest = k;
  if (self->_oldest == nullptr) self->_oldest = k;
  k->recv_op.self = k->send_op.self = k->settle_op.self = k;
  k->recv_op.fn = &admin_server::on_recv;
  k->send_op.fn = &admin_server::on_send;
  k->settle_op.fn = &admin_server::on_settle_timer;
  self->submit_recv(k);
}

namespace {

// Every admin receive and send is bounded (IORING_OP_LINK_TIMEOUT, Linux
// 5.5): an idle or slow connection is cut after this, so 64 of them cannot
// lock out /metrics and the drain API. Static: the kernel reads it when the
// SQE is submitted.
constexpr __kernel_timespec k_admin_io_timeout{5, 0};

void link_timeout(shard::reactor& r, io_uring_sqe* op, const __kernel_timespec* ts = &k_admin_io_timeout) noexcept {
  op->flags |= IOSQE_IO_LINK;
  io_uring_prep_link_timeout(r.sqe_untracked(), const_cast<__kernel_timespec*>(ts), 0);
}

// A drain's answer looks again this often whether every shard has taken it:
// a woken shard takes its inbox within microseconds, so most answers go out
// at the first look or the next.
constexpr __kernel_timespec k_settle_step{0, 1'000'000};

}  // namespace

void admin_server::submit_recv(conn* c) noexcept {
  const uint64_t now = _r.now_ms();
  if (now >= c->head_deadline_ms) {
    respond(c, 408, "application/json",
            R"({"error":{"message":"The request head did not come in time.","type":"invalid_request_error","param":null,"code":null}})");
    return;
  }
  const uint64_t left_ms = c->head_deadline_ms - now;
  const uint64_t wait_ms = left_ms < 5000 ? left_ms : 5000;
  c->recv_timeout.tv_sec = static_cast<int64_t>(wait_ms / 1000);
  c->recv_timeout.tv_nsec = static_cast<long long>(wait_ms % 1000) * 1'000'000;
  io_uring_sqe* s = _r.sqe(&c->recv_op);
  io_uring_prep_recv(s, c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
  link_timeout(_r, s, &c->recv_timeout);
}

void admin_server::submit_send(conn* c) noexcept {
  io_uring_sqe* s = _r.sqe(&c->send_op);
  io_uring_prep_send(s, c->fd, c->reply.data() + c->sent, c->reply.size() - c->sent, MSG_NOSIGNAL);
  link_timeout(_r, s);
}

void admin_server::close_conn(conn* c) noexcept {
  SLUICE_ASSERT(!c->settle_timer_armed);  // the kernel would complete into freed memory
  ::close(c->fd);
  --_open;
  if (c->evicted) --_evicting;
  (c->older != nullptr ? c->older->newer : _oldest) = c->newer;
  (c->newer != nullptr ? c->newer->older : _newest) = c->older;
  delete c;
}

void admin_server::on_recv(shard::completion* op, const io_uring_cqe* cqe) {
  conn* c = static_cast<conn::io*>(op)->self;
  admin_server* self = c->srv;
  if (cqe->res <= 0) {
    self->close_conn(c);
    return;
  }
  if (c->evicted) {  // a newer connection took its place
    self->close_conn(c);
    return;
  }
  c->len += static_cast<uint32_t>(cqe->res);
  http::parse_status st = c->parser.parse_head(c->buf, c->len, c->head);
  if (!st.need_more()) c->reading = false;
  if (st.need_more()) {
    if (c->len >= sizeof c->buf) {
      self->respond(c, 431, "application/json", R"({"error":{"message":"Request header too large.","type":"invalid_request_error","param":null,"code":null}})");
      return;
    }
    self->submit_recv(c);
    return;
  }
  if (!st.ok()) {
    char body[512];
    openai::error_fields e;
    e.message = st.message;
    size_t n = openai::write_error_body(body, sizeof body, e);
    self->respond(c, st.status, "application/json", std::string_view(body, n));
    return;
  }
  self->handle(c);
}

void admin_server::on_send(shard::completion* op, const io_uring_cqe* cqe) {
  conn* c = static_cast<conn::io*>(op)->self;
  admin_server* self = c->srv;
  if (cqe->res <= 0) {
    self->close_conn(c);
    return;
  }
  c->sent += static_cast<size_t>(cqe->res);
  if (c->sent < c->reply.size()) {
    self->submit_send(c);
    return;
  }
  self->close_conn(c);
}

void admin_server::submit_settle_timer(conn* c) noexcept {
  io_uring_sqe* s = _r.sqe(&c->settle_op);
  io_uring_prep_timeout(s, const_cast<__kernel_timespec*>(&k_settle_step), 0, 0);
  c->settle_timer_armed = true;
}

void admin_server::on_settle_timer(shard::completion* op, const io_uring_cqe*) {
  conn* c = static_cast<conn::io*>(op)->self;
  // -ETIME is the step passing; whatever else ended the timer, looking
  // again is right (the wait is bounded by the clock, not by the CQEs).
  c->settle_timer_armed = false;
  c->srv->answer_when_settled(c);
}

void admin_server::answer_when_settled(conn* c) noexcept {
  if (!c->settling->over(_g, _r.now_ms())) {
    submit_settle_timer(c);
    return;
  }
  c->settling.reset();
  if (c->to_page) {
    respond(c, 303, "text/plain", "", "location: /\r\n");
    return;
  }
  std::string body;
  _health->describe_json(body);
  respond(c, 200, "application/json", body);
}

void admin_server::respond(conn* c, uint16_t status, const char* content_type, std::string_view body,
                           std::string_view extra_headers) noexcept {
  c->reading = false;
  const char* reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 405 ? "Method Not Allowed"
                                            : status == 503 ? "Service Unavailable" : status == 401 ? "Unauthorized"
                                            : status == 303 ? "See Other" : status == 403 ? "Forbidden"
                                            : status == 421 ? "Misdirected Request" : status == 408 ? "Request Timeout"
                                                                                    : "Bad Request";
  c->reply = fmt::format("HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\n{}connection: close\r\n\r\n",
                         status, reason, content_type, body.size(), extra_headers);
  c->reply.append(body);
  c->sent = 0;
  submit_send(c);
}

namespace {

// The value of `name` in a query string, percent-decoded; "" when absent.
std::string query_value(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) != name || eq == std::string_view::npos) continue;
    std::string out;
    const std::string_view v = pair.substr(eq + 1);
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] == '%' && i + 2 < v.size() && hex_digit(v[i + 1]) >= 0 && hex_digit(v[i + 2]) >= 0) {
        out += static_cast<char>(hex_digit(v[i + 1]) * 16 + hex_digit(v[i + 2]));
        i += 2;
      } else {
        out += v[i] == '+' ? ' ' : v[i];
      }
    }
    return out;
  }
  return {};
}

// Whether a POST may change state: a browser names the page it came from
// in Origin, and a page of another origin (which could submit a form to
// this listener) must not drain a backend. No Origin: not a browser's
// cross-origin form (curl, scripts), as before.
bool same_origin(const http::request_head& h) noexcept {
  http::header f;
  for (http::header_fields it = h.fields(); it.next(f);) {
    if (f.name.size() != 6 || strncasecmp(f.name.data(), "origin", 6) != 0) continue;
    const size_t scheme = f.value.find("://");
    return scheme != std::string_view::npos && f.value.substr(scheme + 3) == h.host;
  }
  return true;
}

}  // namespace

// Whether `host` (the request's Host, `name[:port]`) names this listener
// in a way DNS rebinding cannot: an IP literal (v4, or v6 in brackets) or
// localhost, with no port or the listener's own. A rebinding page reaches
// the listener under the attacker's name (evil.example:9090), which a
// browser sends as Host and Origin alike, so comparing the two proves
// nothing; refusing every name but localhost does.
bool own_host(std::string_view host, uint16_t port) noexcept {
  std::string_view name = host;
  std::string_view port_text;
  if (!name.empty() && name.front() == '[') {
    const size_t close = name.find(']');
    if (close == std::string_view::npos) return false;
    port_text = name.substr(close + 1);
    name = name.substr(1, close - 1);
    if (!port_text.empty() && port_text.front() != ':') return false;
    if (!port_text.empty()) port_text.remove_prefix(1);
    in6_addr a6{};
    const std::string n(name);
    if (::inet_pton(AF_INET6, n.c_str(), &a6) != 1) return false;
  } else {
    const size_t colon = name.rfind(':');
    if (colon != std::string_view::npos) {
      port_text = name.substr(colon + 1);
      name = name.substr(0, colon);
    }
    in_addr a4{};
    const std::string n(name);
    if (!iequals(name, "localhost") && ::inet_pton(AF_INET, n.c_str(), &a4) != 1) return false;
  }
  if (port_text.empty()) return true;
  if (port_text.size() > 5) return false;
  uint32_t p = 0;
  for (const char ch : port_text) {
    if (ch < '0' || ch > '9') return false;
    p = p * 10 + static_cast<uint32_t>(ch - '0');
  }
  return p == port;
}

namespace {

// The page's own headers: it loads nothing from anywhere, posts only to
// this listener and is never framed (its drain buttons cannot be
// clickjacked).
constexpr std::string_view k_page_headers =
    "content-security-policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'\r\n"
    "cache-control: no-store\r\nx-content-type-options: nosniff\r\n";

std::string admin_error(std::string_view message) {
  char body[512];
  openai::error_fields e;
  e.message = message;
  return std::string(body, openai::write_error_body(body, sizeof body, e));
}

}  // namespace

void admin_server::handle(conn* c) noexcept {
  const std::string_view path = c->head.path;
  // server.admin_token_env: every endpoint but /healthz (load balancers'
  // probes carry no credentials) wants the bearer token, compared in
  // constant time.
  // The status page's document is served without it, but its data only
  // with it (the page then asks for the token and fetches /status.json).
  const std::string& token = _token;
  // With no token, the Host check is what keeps a page that rebinds its
  // name to this address out (docs/operations.md, "The admin listener").
  // /healthz tells nothing and changes nothing: probes keep their names.
  if (token.empty() && path != "/healthz" && !own_host(c->head.host, _port)) {
    respond(c, 421, "application/json",
            admin_error("Reach this admin listener by its IP address or localhost, or set server.admin_token_env "
                        "to use a name."));
    return;
  }
  bool authorized = true;
  if (!token.empty() && path != "/healthz") {
    const std::string_view given = auth::bearer_token(c->head.authorization);
    authorized = given.size() == token.size() && CRYPTO_memcmp(given.data(), token.data(), token.size()) == 0;
    if (!authorized && !(path == "/" && c->head.meth == http::method::get)) {
      respond(c, 401, "application/json", admin_error("This admin endpoint needs Authorization: Bearer <admin token>."));
      return;
    }
  }
  if ((path == "/backends/drain" || path == "/backends/undrain") && _health != nullptr) {
    if (c->head.meth != http::method::post) {
      respond(c, 405, "application/json", admin_error("Use POST."));
      return;
    }
    const std::string url = query_value(c->head.target, "url");
    if (url.empty()) {
      respond(c, 400, "application/json", admin_error("Missing ?url=BACKEND_URL (as GET /backends lists it)."));
      return;
    }
    if (!same_origin(c->head)) {
      respond(c, 403, "application/json", admin_error("A drain from a page of another origin is refused."));
      return;
    }
    const bool drain = path == "/backends/drain";
    c->to_page = query_value(c->head.target, "then") == "page";
    if (!_health->set_draining(url, drain)) {
      respond(c, 404, "application/json", admin_error("No such backend; GET /backends lists them."));
      return;
    }
    // The answer says the backend is (un)drained: it goes once that is
    // true on every shard, so the next request on any connection sees it.
    c->settling.emplace(_g.mark(), _r.now_ms());
    answer_when_settled(c);
    return;
  }
  if (c->head.meth != http::method::get) {
    respond(c, 405, "text/plain", "method not allowed\n");
    return;
  }
  if ((path == "/" || path == "/status.json") && _status != nullptr) {
    respond_status(c, path == "/", authorized);
    return;
  }
  if (path == "/backends" && _health != nullptr) {
    std::string body;
    _health->describe_json(body);
    respond(c, 200, "application/json", body);
    return;
  }
  if (path == "/healthz") {
    if (_draining) {
      respond(c, 503, "text/plain", "draining\n");
    } else {
      respond(c, 200, "text/plain", "ok\n");
    }
    return;
  }
  if (path == "/metrics") {
    std::string m;
    m.reserve(4096);
    metrics::family reloads(m, "sluice_config_reloads_total", metrics::family_type::counter,
                            "SIGHUP reloads by result (failed: the running config stayed).");
    reloads.add({{"result", "ok"}}, _g.reloads_ok());
    reloads.add({{"result", "failed"}}, _g.reloads_failed());
    metrics::family(m, "sluice_config_last_reload_successful", metrics::family_type::gauge,
                    "1 unless the last reload failed.")
        .add({}, _g.last_reload_ok() ? 1 : 0);
    _g.metrics().render(m);
    if (_health != nullptr) _health->render_metrics(m);
    if (_budgets != nullptr) _budgets->render_metrics(**_cfg, static_cast<int64_t>(realtime_ms()), m);
    if (_cluster != nullptr) _cluster->render_metrics(m);
    respond(c, 200, "text/plain; version=0.0.4", m);
    return;
  }
  if (path.starts_with("/keys/") && _budgets != nullptr) {
    // A key's id, never its secret; an id that is not a live key is 404
    // whatever it looks like (ids are plain names: no decoding needed).
    std::string body;
    const std::string_view id = path.substr(6);
    if (id.empty() || !_budgets->describe_key(**_cfg, _g, id, static_cast<int64_t>(realtime_ms()), body)) {
      char err[512];
      openai::error_fields e;
      e.message = "No such key; GET /keys/{id} takes a key's id as the config names it.";
      e.type = "invalid_request_error";
      e.code = "key_not_found";
      respond(c, 404, "application/json", std::string_view(err, openai::write_error_body(err, sizeof err, e)));
      return;
    }
    if (_cluster != nullptr && !body.empty() && body.back() == '}') {
      // The key's share of the cluster: the shared bucket and this
      // instance's lease ("global" level).
      const config::config& cfg = **_cfg;
      for (uint32_t k = 0; k < cfg.keys.size(); ++k) {
        if (cfg.keys[k].removed || cfg.keys[k].id != id) continue;
        body.pop_back();
        body += ",\"global\":";
        _cluster->describe_key(k, body);
        body += '}';
        break;
      }
    }
    if (!body.empty() && body.back() == '}') {
      // Served tokens and time queued for a slot (fair admission), every
      // row of the id (a reload that re-limits a key makes a new row).
      const config::config& cfg = **_cfg;
      uint64_t sum[metrics::registry::key_usage_width] = {};
      double weight = 1;
      uint32_t priority = 0;
      for (uint32_t k = 0; k < cfg.keys.size(); ++k) {
        if (cfg.keys[k].id != id) continue;
        uint64_t u[metrics::registry::key_usage_width] = {};
        _g.metrics().key_usage(k, u);
        for (size_t i = 0; i < metrics::registry::key_usage_width; ++i) sum[i] += u[i];
        if (!cfg.keys[k].removed) {
          weight = cfg.keys[k].weight;
          priority = cfg.keys[k].priority;
        }
      }
      body.pop_back();
      fmt::format_to(std::back_inserter(body),
                     ",\"served\":{{\"requests\":{},\"prompt_tokens\":{},\"completion_tokens\":{}}},"
                     "\"admission\":{{\"weight\":{},\"priority\":{},\"queued\":{},\"queued_ms\":{}}}}}",
                     sum[0], sum[1], sum[2], weight, priority, sum[3], sum[4]);
    }
    respond(c, 200, "application/json", body);
    return;
  }
  respond(c, 404, "text/plain", "not found\n");
}

void admin_server::respond_status(conn* c, bool page, bool with_data) noexcept {
  const status_view v = _status->view(**_cfg, _health, _budgets, _r.now_ms(), static_cast<int64_t>(realtime_ms()));
  std::string body;
  body.reserve(page ? 32768 : 16384);
  if (page) {
    render_status_page(v, with_data, body);
    respond(c, 200, "text/html; charset=utf-8", body, k_page_headers);
  } else {
    render_status_json(v, body);
    respond(c, 200, "application/json", body, "cache-control: no-store\r\n");
  }
}

}  // namespace sluice::control
