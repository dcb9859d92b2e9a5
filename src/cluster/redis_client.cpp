// The hiredis adapter and the connection's life (redis_client.hpp).
//
// hiredis 0.14 frees a context in one place (__redisAsyncFree): it first
// calls every pending callback with a NULL reply, then the cleanup hook,
// then closes the fd (1.x calls the hook earlier too, before the callbacks:
// nothing here depends on that order). The cleanup hook is therefore the one signal that a
// connection is over, whoever ended it (our drop, the server, a failed
// connect). It also takes the fd from hiredis (c.fd = -1, so redisFree does
// not close it): an fd closed under an in-flight POLL_ADD would keep the
// socket alive inside the ring, so it is closed only once both polls are
// back (cancelled with POLL_REMOVE).
#include "sluice/cluster/redis_client.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"

namespace sluice::cluster {

// One per connection attempt; from redisAsyncConnect until the context is
// gone and both polls are back (possibly after the client).
struct redis_client::io {
  struct poll_op : shard::completion {
    io* self = nullptr;
    bool in_flight = false;  // a POLL_ADD SQE is in the ring
    bool wanted = false;     // hiredis asked for this direction
  };

  shard::reactor* r = nullptr;
  redis_client* owner = nullptr;  // nullptr once the context is gone
  redisAsyncContext* ac = nullptr;
  int fd = -1;
  bool dispatching = false;       // inside redisAsyncHandleRead/Write
  poll_op rd;
  poll_op wr;

  io(shard::reactor& reactor, redis_client* client, redisAsyncContext* context)
      : r(&reactor), owner(client), ac(context), fd(context->c.fd) {
    rd.self = wr.self = this;
    rd.fn = wr.fn = &io::on_poll;
  }

  void arm(poll_op& op) {
    io_uring_sqe* s = r->sqe(&op);
    io_uring_prep_poll_add(s, fd, &op == &rd ? POLLIN : POLLOUT);
    op.in_flight = true;
  }
  void want(poll_op& op, bool yes) {
    op.wanted = yes;
    // A poll already in flight that fires unwanted is ignored (one-shot).
    if (yes && !op.in_flight && owner != nullptr) arm(op);
  }

  static void on_poll(shard::completion* c, const io_uring_cqe* /*cqe*/) {
    auto* op = static_cast<poll_op*>(c);
    io* self = op->self;
    op->in_flight = false;
    if (self->owner == nullptr) {
      self->release_if_idle();
      return;
    }
    // res > 0: the ready mask (POLLERR / POLLHUP included, unasked); < 0: a
    // poll error. Either way hiredis's read or write meets the condition
    // itself and disconnects when it is one.
    if (op->wanted) {
      self->dispatching = true;
      if (op == &self->rd) {
        redisAsyncHandleRead(self->ac);
      } else {
        redisAsyncHandleWrite(self->ac);
      }
      self->dispatching = false;
      if (self->owner == nullptr) {
        self->release_if_idle();
        return;
      }
    }
    if (op->wanted && !op->in_flight) self->arm(*op);
  }

  // The context is gone: cancel what is in flight; the fd closes when the
  // last poll is back (now, if none is).
  void detach() {
    owner = nullptr;
    ac = nullptr;
    for (poll_op* op : {&rd, &wr}) {
      if (!op->in_flight) continue;
      io_uring_sqe* s = r->sqe_untracked();
      io_uring_prep_poll_remove(s, reinterpret_cast<uint64_t>(static_cast<shard::completion*>(op)));
    }
    if (!dispatching) release_if_idle();
  }

  void release_if_idle() {
    if (rd.in_flight || wr.in_flight) return;
    close_fd();
    delete this;
  }

  void close_fd() {
    // Never under an in-flight poll: the ring would hold the socket open.
    SLUICE_VERIFY(!rd.in_flight && !wr.in_flight);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct redis_client::pending {
  enum class kind : uint8_t { auth, load, call, command };
  redis_client* owner = nullptr;
  pending* prev = nullptr;
  pending* next = nullptr;
  uint64_t deadline_ms = 0;
  kind k = kind::call;
  script s = script::lease;
  bool by_sha = true;
  uint32_t keys = 1;              // how many of args are KEYS
  std::vector<std::string> args;  // call: KEYS, then ARGV
  bucket_fn fn;                   // the bucket scripts' answer
  budget_fn budget_done;          // script::budget's
  command_fn command_done;        // kind::command's (args: the whole argv)
};

namespace {

redis_client::io* io_of(void* privdata) { return static_cast<redis_client::io*>(privdata); }

void ev_add_read(void* p) { io_of(p)->want(io_of(p)->rd, true); }
void ev_del_read(void* p) { io_of(p)->want(io_of(p)->rd, false); }
void ev_add_write(void* p) { io_of(p)->want(io_of(p)->wr, true); }
void ev_del_write(void* p) { io_of(p)->want(io_of(p)->wr, false); }

const redisReply* as_reply(const void* r) { return static_cast<const redisReply*>(r); }

}  // namespace

result<std::unique_ptr<redis_client>> redis_client::create(shard::reactor& r, redis_options o) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(o.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    log::error("cluster: redis host \"{}\" does not resolve: {}", o.host, gai_strerror(rc));
    return errc::upstream_connect;
  }
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = found->ai_family == AF_INET6
                         ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
                         : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
  ::inet_ntop(found->ai_family, addr, text, sizeof text);
  ::freeaddrinfo(found);
  return std::unique_ptr<redis_client>(new redis_client(r, std::move(o), text));
}

redis_client::redis_client(shard::reactor& r, redis_options o, std::string address)
    : _r(r), _o(std::move(o)), _address(std::move(address)) {}

redis_client::~redis_client() {
  _destroying = true;
  // Pending commands are dropped unanswered (on_reply sees _destroying);
  // the cleanup hook detaches the polls, which finish on the reactor.
  if (_ac != nullptr) redisAsyncFree(_ac);
  SLUICE_VERIFY(_ac == nullptr && _head == nullptr);
}

std::string redis_client::bucket_key(std::string_view key_id) const {
  return fmt::format("{}bucket:{}", _o.key_prefix, key_id);
}

std::string redis_client::budget_key(std::string_view subject, std::string_view window, int64_t n,
                                     std::string_view name) const {
  return fmt::format("{}budget:{}:{}:{}:{}", _o.key_prefix, window, n, subject, name);
}

void redis_client::start() {
  if (_started) return;
  _started = true;
  connect();
}

void redis_client::connect() {
  SLUICE_VERIFY(_ac == nullptr);
  _ac = redisAsyncConnect(_address.c_str(), _o.port);
  if (_ac == nullptr || _ac->err != 0) {
    // Before any hook is attached: hiredis closes its own fd.
    std::string why = _ac != nullptr ? _ac->errstr : "out of memory";
    if (_ac != nullptr) redisAsyncFree(_ac);
    _ac = nullptr;
    _last_error = std::move(why);
    on_context_gone();
    return;
  }
  _io = new io(_r, this, _ac);
  _ac->data = this;
  _ac->ev.data = _io;
  _ac->ev.addRead = &ev_add_read;
  _ac->ev.delRead = &ev_del_read;
  _ac->ev.addWrite = &ev_add_write;
  _ac->ev.delWrite = &ev_del_write;
  _ac->ev.cleanup = [](void* p) {
    io* self = io_of(p);
    redis_client* owner = self->owner;
    redisAsyncContext* ac = self->ac;
    ac->c.fd = -1;  // ours now: closed once no poll is in flight
    // Nothing of hiredis reaches the io again (hiredis 1.x calls cleanup
    // twice on an error and runs the pending callbacks after it).
    ac->ev = {};
    if (owner != nullptr && !owner->_dropping) {
      owner->_last_error = ac->err != 0 ? std::string(ac->errstr) : "connection closed by the server";
    }
    self->detach();
    if (owner != nullptr) owner->on_context_gone();
  };
  // The first writable event reports the connect's outcome.
  redisAsyncSetConnectCallback(_ac, [](const redisAsyncContext* ac, int status) {
    auto* self = static_cast<redis_client*>(ac->data);
    if (status != REDIS_OK) self->_last_error = ac->errstr;  // hiredis frees the context next
  });
  _connect_deadline_ms = _r.now_ms() + _o.connect_timeout_ms;
  _setup_left = 0;
  _drop_reason = errc::upstream_closed;  // what a close we did not ask for reads as
  // Pipelined behind the connect: AUTH, then the scripts.
  if (!_o.password.empty()) {
    auto* p = new pending;
    p->k = pending::kind::auth;
    if (!send_setup(p, {"AUTH", _o.password})) return;
  }
  for (unsigned i = 0; i < k_script_count; ++i) {
    auto* p = new pending;
    p->k = pending::kind::load;
    p->s = static_cast<script>(i);
    if (!send_setup(p, {"SCRIPT", "LOAD", std::string(script_source(p->s))})) return;
  }
}

bool redis_client::send_setup(pending* p, std::vector<std::string> argv) {
  p->owner = this;
  p->deadline_ms = _connect_deadline_ms;
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAsyncCommandArgv(_ac, &redis_client::on_reply, p, static_cast<int>(argv.size()), ptrs.data(), lens.data()) !=
      REDIS_OK) {
    delete p;
    drop(errc::upstream_connect, "could not queue the connection's setup");
    return false;
  }
  link(p);
  ++_setup_left;
  return true;
}

void redis_client::link(pending* p) {
  p->prev = _tail;
  p->next = nullptr;
  if (_tail != nullptr) {
    _tail->next = p;
  } else {
    _head = p;
  }
  _tail = p;
}

void redis_client::unlink(pending* p) {
  if (p->prev != nullptr) {
    p->prev->next = p->next;
  } else {
    _head = p->next;
  }
  if (p->next != nullptr) {
    p->next->prev = p->prev;
  } else {
    _tail = p->prev;
  }
  p->prev = p->next = nullptr;
}

void redis_client::drop(errc why, std::string_view what) {
  if (_ac == nullptr || _dropping) return;
  _dropping = true;
  _ready = false;
  _drop_reason = why;
  _last_error = std::string(what);
  // Pending callbacks get `why` from inside this call (or, inside a hiredis
  // callback, right after it returns); then the cleanup hook.
  redisAsyncFree(_ac);
}

void redis_client::on_context_gone() {
  _ac = nullptr;
  _io = nullptr;
  _ready = false;
  _dropping = false;
  _setup_left = 0;
  if (_destroying) return;
  ++_stats.errors;
  log_state(false, _last_error);
  _backoff_ms = _backoff_ms == 0 ? _o.backoff_min_ms : std::min(_o.backoff_max_ms, _backoff_ms * 2);
  _next_connect_ms = _r.now_ms() + _backoff_ms;
}

void redis_client::log_state(bool up, std::string_view why) {
  if (_o.quiet) return;
  if (up && _logged != logged::up) {
    log::info("cluster: redis {}:{} connected", _o.host, _o.port);
    _logged = logged::up;
  } else if (!up && _logged != logged::down) {
    log::warn("cluster: redis {}:{} unreachable: {}; retrying every {}-{} ms ({})", _o.host, _o.port, why,
              _o.backoff_min_ms, _o.backoff_max_ms, _o.fallback_note);
    _logged = logged::down;
  }
}

void redis_client::on_iteration(uint64_t now_ms) {
  if (!_started || _destroying || _dropping) return;
  if (_ac == nullptr) {
    if (now_ms >= _next_connect_ms) {
      ++_stats.reconnects;
      connect();
    }
    return;
  }
  if (!_ready) {
    if (now_ms >= _connect_deadline_ms) {
      drop(errc::upstream_timeout, fmt::format("no ready connection within {} ms", _o.connect_timeout_ms));
    }
    return;
  }
  // Replies come in send order: the oldest command has the first deadline.
  if (_head != nullptr && now_ms >= _head->deadline_ms) {
    drop(errc::upstream_timeout, fmt::format("a command got no reply within {} ms", _o.timeout_ms));
  }
}

void redis_client::on_reply(redisAsyncContext* /*ac*/, void* reply, void* privdata) {
  auto* p = static_cast<pending*>(privdata);
  redis_client* self = p->owner;
  self->unlink(p);
  if (self->_destroying) {
    delete p;
    return;
  }
  if (p->k == pending::kind::command) {
    self->on_command_reply(p, reply);
  } else if (p->k == pending::kind::call) {
    self->on_script_reply(p, reply);
  } else {
    self->on_setup_reply(p, reply);
  }
}

void redis_client::on_setup_reply(pending* p, const void* reply) {
  const pending::kind k = p->k;
  const script s = p->s;
  delete p;
  if (reply == nullptr || _dropping) return;  // the drop's state change says it
  const redisReply* r = as_reply(reply);
  const char* what = k == pending::kind::auth ? "AUTH" : "SCRIPT LOAD";
  if (r->type == REDIS_REPLY_ERROR) {
    drop(errc::upstream_protocol, fmt::format("{}: {}", what, std::string_view(r->str, r->len)));
    return;
  }
  if (k == pending::kind::load) {
    if (r->type != REDIS_REPLY_STRING) {
      drop(errc::upstream_protocol, fmt::format("{}: unexpected reply type {}", what, r->type));
      return;
    }
    _sha[static_cast<unsigned>(s)].assign(r->str, r->len);
  }
  if (--_setup_left == 0) {
    _ready = true;
    _backoff_ms = 0;
    log_state(true, {});
  }
}

void redis_client::fail(pending* p, errc why) {
  ++_stats.errors;
  if (p->k == pending::kind::command) {
    command_fn fn = std::move(p->command_done);
    delete p;
    fn(why);
    return;
  }
  if (p->s == script::budget) {
    budget_fn fn = std::move(p->budget_done);
    delete p;
    fn(why);
    return;
  }
  bucket_fn fn = std::move(p->fn);
  delete p;
  fn(why);
}

void redis_client::on_script_reply(pending* p, const void* reply) {
  if (reply != nullptr && p->s == script::budget && as_reply(reply)->type != REDIS_REPLY_ERROR) {
    on_budget_reply(p, reply);
    return;
  }
  if (reply == nullptr) {
    fail(p, _drop_reason);
    return;
  }
  const redisReply* r = as_reply(reply);
  if (r->type == REDIS_REPLY_ERROR) {
    std::string_view text(r->str, r->len);
    // Redis lost its script cache (restart, SCRIPT FLUSH, failover): the
    // same call as EVAL, which also caches the script again.
    if (p->by_sha && text.substr(0, 8) == "NOSCRIPT") {
      ++_stats.noscript;
      if (!send_script(p, false)) fail(p, errc::upstream_closed);
      return;
    }
    _last_error = fmt::format("{}: {}", script_name(p->s), text);
    fail(p, errc::upstream_protocol);
    return;
  }
  bool shaped = r->type == REDIS_REPLY_ARRAY && r->elements == 4;
  for (size_t i = 0; shaped && i < 4; ++i) shaped = r->element[i]->type == REDIS_REPLY_INTEGER;
  if (!shaped) {
    _last_error = fmt::format("{}: unexpected reply type {}", script_name(p->s), r->type);
    fail(p, errc::upstream_protocol);
    return;
  }
  bucket_reply out;
  out.tokens = r->element[0]->integer;
  out.level = r->element[1]->integer;
  out.server_now_ms = r->element[2]->integer;
  out.outstanding = r->element[3]->integer;
  bucket_fn fn = std::move(p->fn);
  delete p;
  fn(out);
}

namespace {

// A field's value as the budget script wrote it (a decimal uint64).
// Returns: false on anything else.
bool parse_u64(const redisReply* r, uint64_t& out) {
  if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < r->len; ++i) {
    const char c = r->str[i];
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  out = v;
  return true;
}

uint64_t saturating_add(uint64_t a, uint64_t b) noexcept { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

// One array per hash, each its HGETALL (field, value, ...): the t: and s:
// fields summed; a field of another shape is ignored, a value that is not a
// number makes the whole answer a protocol error (someone else's data).
void redis_client::on_budget_reply(pending* p, const void* reply) {
  const redisReply* r = as_reply(reply);
  std::vector<budget_sums> out;
  bool shaped = r->type == REDIS_REPLY_ARRAY && r->elements == p->keys;
  for (size_t i = 0; shaped && i < r->elements; ++i) {
    const redisReply* h = r->element[i];
    shaped = h->type == REDIS_REPLY_ARRAY && h->elements % 2 == 0;
    budget_sums sums;
    for (size_t f = 0; shaped && f + 1 < h->elements; f += 2) {
      const redisReply* name = h->element[f];
      if (name->type != REDIS_REPLY_STRING || name->len < 2 || name->str[1] != ':') continue;
      uint64_t v = 0;
      if (name->str[0] == 't') {
        shaped = parse_u64(h->element[f + 1], v);
        sums.tokens = saturating_add(sums.tokens, v);
      } else if (name->str[0] == 's') {
        shaped = parse_u64(h->element[f + 1], v);
        sums.spend_nano = saturating_add(sums.spend_nano, v);
      }
    }
    out.push_back(sums);
  }
  if (!shaped) {
    _last_error = fmt::format("{}: unexpected reply", script_name(p->s));
    fail(p, errc::upstream_protocol);
    return;
  }
  budget_fn fn = std::move(p->budget_done);
  delete p;
  fn(std::move(out));
}

void redis_client::on_command_reply(pending* p, const void* reply) {
  if (reply == nullptr) {
    fail(p, _drop_reason);
    return;
  }
  const redisReply* r = as_reply(reply);
  command_reply out;
  switch (r->type) {
    case REDIS_REPLY_NIL: out.nil = true; break;
    case REDIS_REPLY_INTEGER: out.integer = r->integer; break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS: out.text.assign(r->str, r->len); break;
    default:
      _last_error = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len)
                                                 : fmt::format("unexpected reply type {}", r->type);
      fail(p, errc::upstream_protocol);
      return;
  }
  command_fn fn = std::move(p->command_done);
  delete p;
  fn(std::move(out));
}

bool redis_client::command(std::vector<std::string> argv, command_fn fn) {
  if (!_ready || _ac == nullptr || _dropping || argv.empty()) return false;
  auto* p = new pending;
  p->owner = this;
  p->k = pending::kind::command;
  p->args = std::move(argv);
  p->command_done = std::move(fn);
  if (!send_argv(p, {})) {
    delete p;
    return false;
  }
  return true;
}

bool redis_client::send_script(pending* p, bool by_sha) {
  if (_ac == nullptr || _dropping) return false;
  p->by_sha = by_sha;
  const unsigned i = static_cast<unsigned>(p->s);
  const std::string keys = std::to_string(p->keys);
  return send_argv(p, {by_sha ? "EVALSHA" : "EVAL", by_sha ? std::string_view(_sha[i]) : script_source(p->s), keys});
}

bool redis_client::send_argv(pending* p, std::initializer_list<std::string_view> head) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (std::string_view h : head) {
    ptrs.push_back(h.data());
    lens.push_back(h.size());
  }
  for (const std::string& a : p->args) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAsyncCommandArgv(_ac, &redis_client::on_reply, p, static_cast<int>(ptrs.size()), ptrs.data(), lens.data()) !=
      REDIS_OK) {
    return false;
  }
  p->deadline_ms = _r.now_ms() + _o.timeout_ms;
  link(p);
  ++_stats.commands;
  return true;
}

bool redis_client::send(pending* p) {
  p->owner = this;
  if (!_ready || !send_script(p, true)) {
    delete p;
    return false;
  }
  return true;
}

bool redis_client::call(script s, std::vector<std::string> args, bucket_fn fn) {
  if (!_ready) return false;
  auto* p = new pending;
  p->s = s;
  p->args = std::move(args);
  p->fn = std::move(fn);
  return send(p);
}

bool redis_client::budget(const std::vector<budget_counter>& hashes, std::string_view instance_id, budget_fn fn) {
  if (!_ready) return false;
  auto* p = new pending;
  p->s = script::budget;
  p->keys = static_cast<uint32_t>(hashes.size());
  p->args.reserve(1 + hashes.size() * 4);
  for (const budget_counter& c : hashes) p->args.push_back(c.key);
  p->args.emplace_back(instance_id);
  for (const budget_counter& c : hashes) {
    p->args.push_back(std::to_string(c.tokens));
    p->args.push_back(std::to_string(c.spend_nano));
    p->args.push_back(std::to_string(c.expire_at_ms));
  }
  p->budget_done = std::move(fn);
  return send(p);
}

bool redis_client::lease(std::string_view key_id, uint64_t limit_per_minute, uint64_t want,
                         std::string_view instance_id, uint32_t ttl_ms, bucket_fn fn) {
  return call(script::lease,
              {bucket_key(key_id), std::to_string(limit_per_minute), std::to_string(want), std::string(instance_id), std::to_string(ttl_ms)},
              std::move(fn));
}

bool redis_client::give_back(std::string_view key_id, uint64_t limit_per_minute, uint64_t amount,
                             std::string_view instance_id, bucket_fn fn) {
  return call(script::give_back,
              {bucket_key(key_id), std::to_string(limit_per_minute), std::to_string(amount), std::string(instance_id)}, std::move(fn));
}

bool redis_client::charge(std::string_view key_id, uint64_t limit_per_minute, uint64_t amount,
                          std::string_view instance_id, bucket_fn fn) {
  return call(script::charge,
              {bucket_key(key_id), std::to_string(limit_per_minute), std::to_string(amount), std::string(instance_id)}, std::move(fn));
}

}  // namespace sluice::cluster
