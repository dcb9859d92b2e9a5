#pragma once
// control: the admin listener, served by the control thread's reactor:
// GET /healthz and GET /metrics (Prometheus text, shard counters summed at
// scrape time), GET /backends and the drain API, GET /keys/{id} (limits and
// budgets), the status page GET / and GET /status.json (status.hpp). One
// request per connection; never on a shard's core path.
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/control/gateway.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::control {

class health_checker;
class budget_keeper;
class cluster_keeper;
class status_sampler;

// Whether a request's Host (`name[:port]`) names the admin listener in a
// way DNS rebinding cannot forge: an IP literal or localhost, with no port
// or `port`. Used when no admin token is set.
bool own_host(std::string_view host, uint16_t port) noexcept;

class admin_server {
 public:
  // Takes ownership of listen_fd.
  admin_server(shard::reactor& r, const gateway& g, int listen_fd) noexcept;
  ~admin_server();
  admin_server(const admin_server&) = delete;
  admin_server& operator=(const admin_server&) = delete;

  void start() noexcept;
  void stop_accepting() noexcept;
  void set_draining(bool d) noexcept { _draining = d; }
  // Backend state and operator drain (GET /backends, POST /backends/drain
  // and /backends/undrain ?url=URL) go through the health checker.
  void set_health(health_checker* h) noexcept { _health = h; }
  // [cluster] mode: its metrics, and the "global" part of GET /keys/{id}.
  void set_cluster(const cluster_keeper* c) noexcept { _cluster = c; }
  // server.admin_token_env's value: every endpoint but /healthz then wants
  // it as a bearer token. Empty: none.
  void set_token(std::string token) { _token = std::move(token); }
  // GET /keys/{id} and the budget metrics: the keeper, and the running
  // snapshot as the control thread keeps it (updated on reload).
  void set_budgets(const budget_keeper* b, const std::shared_ptr<const config::config>* cfg) noexcept {
    _budgets = b;
    _cfg = cfg;
  }

  // GET / and /status.json: the sampler's history.
  void set_status(const status_sampler* s) noexcept { _status = s; }

  struct conn;

 private:
  struct accept_op : shard::completion {
    admin_server* self = nullptr;
  };
  static void on_accept(shard::completion* c, const io_uring_cqe* cqe);
  static void on_rearm_timer(shard::completion* c, const io_uring_cqe* cqe);
  static void on_recv(shard::completion* c, const io_uring_cqe* cqe);
  static void on_send(shard::completion* c, const io_uring_cqe* cqe);
  static void on_settle_timer(shard::completion* c, const io_uring_cqe* cqe);
  void submit_recv(conn* c) noexcept;
  void submit_send(conn* c) noexcept;
  void submit_settle_timer(conn* c) noexcept;
  // A drain or undrain is answered once every shard has taken it (or its
  // wait's bound passed); until then it looks again every millisecond.
  void answer_when_settled(conn* c) noexcept;
  // `extra_headers`: whole field lines, each ending in CRLF.
  void respond(conn* c, uint16_t status, const char* content_type, std::string_view body,
               std::string_view extra_headers = {}) noexcept;
  // GET / and GET /status.json.
  void respond_status(conn* c, bool page, bool with_data) noexcept;
  void handle(conn* c) noexcept;
  void close_conn(conn* c) noexcept;

  shard::reactor& _r;
  const gateway& _g;
  health_checker* _health = nullptr;
  const budget_keeper* _budgets = nullptr;
  const cluster_keeper* _cluster = nullptr;
  const status_sampler* _status = nullptr;
  const std::shared_ptr<const config::config>* _cfg = nullptr;
  std::string _token;
  int _listen_fd;
  uint16_t _port = 0;  // the listener's own port, for the Host check (own_host)
  accept_op _accept_op;
  accept_op _rearm_op;       // a failed accept is armed again after a pause, not at once
  bool _rearm_armed = false;  // _rearm_op is the kernel's until its CQE
  bool _draining = false;
  bool _accepting = false;
  uint32_t _open = 0;
  uint32_t _evicting = 0;  // of _open: shut down for newer ones, their last CQE still to come
  conn* _oldest = nullptr;
  conn* _newest = nullptr;
  static constexpr uint32_t k_conns_max = 64;
  static constexpr uint64_t k_head_timeout_ms = 5000;  // the whole head, from accept
};

}  // namespace sluice::control
