// The KServe v2 gRPC adapter's transport: HTTP/2 connections to grpc://
// backends, a gRPC client session (grpc::client_session) on each, fed from
// the shard's ring;
// one stream per exchange (see triton_grpc.hpp); the request and the
// reply are triton_reply.cpp.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "triton_grpc.hpp"

#include "client_codec.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/grpc/h2_client.hpp"
#include "sluice/net/socket.hpp"

namespace sluice::proxy {

namespace {

constexpr uint32_t k_recv_bytes = 64u << 10;
constexpr std::string_view k_path = "/inference.GRPCInferenceService/ModelStreamInfer";

// A completion handler's hold on its connection: counted as an operation,
// so nothing the handler sets off (a stream's end, the connection's
// failure) frees the connection under it; let go at the handler's end.
struct conn_hold {
  h2_conn* c;
  explicit conn_hold(h2_conn* conn) noexcept : c(conn) { ++c->ops; }
  conn_hold(const conn_hold&) = delete;
  conn_hold& operator=(const conn_hold&) = delete;
  ~conn_hold() { c->adapter->let_go(c); }
};

}  // namespace

triton_grpc::triton_grpc(shard_context& s, exchange_policy& x) noexcept : _s(s), _x(x) {
  _backend_count = _cfg->backends.size();
  _backends = std::make_unique<backend_conns[]>(_backend_count);
}

triton_grpc::~triton_grpc() {
  for (size_t b = 0; b < _backend_count; ++b) {
    while (h2_conn* c = _backends[b].head) {
      _backends[b].head = c->hook.next;
      // Shut down first: an armed receive completes, no byte lands after the free.
      if (c->fd >= 0) {
        ::shutdown(c->fd, SHUT_RDWR);
        _r.unregister_file(c->slot);
        ::close(c->fd);
      }
      account_connection_memory(-static_cast<int64_t>(sizeof(h2_conn)));
      delete c;  // its session with it
    }
  }
}

void triton_grpc::reload(const config::config& n) noexcept {
  SLUICE_VERIFY(n.backends.size() >= _backend_count);
  auto backends = std::make_unique<backend_conns[]>(n.backends.size());
  for (size_t i = 0; i < _backend_count; ++i) backends[i] = _backends[i];
  _backends = std::move(backends);
  _backend_count = n.backends.size();
  for (size_t b = 0; b < _backend_count; ++b) {
    if (!n.backends[b].removed) continue;
    for (h2_conn* c = _backends[b].head; c != nullptr;) {
      h2_conn* next = c->hook.next;
      c->draining = true;  // no new streams; closed when its last one ends
      if (c->streams == 0) close_conn(c);
      c = next;
    }
  }
}

// ---------------------------------------------------------------------------
// Connections

h2_conn* triton_grpc::acquire(uint32_t backend, uint32_t open_max) noexcept {
  backend_conns& bc = _backends[backend];
  for (h2_conn* c = bc.head, *next = nullptr; c != nullptr; c = next) {
    next = c->hook.next;  // close_conn below may free c
    if (c->closing || c->draining) continue;
    if (!c->session.takes_calls()) {
      // A GOAWAY came: the streams it still serves finish (it is read and
      // written as before), a new one would be refused (and its exchange
      // sent to the next backend, or a 503). It closes once its last
      // stream ends.
      c->draining = true;
      if (c->streams == 0) close_conn(c);
      continue;
    }
    // The backend's SETTINGS_MAX_CONCURRENT_STREAMS (100 until it says).
    if (c->streams < c->session.peer_max_streams()) return c;
  }
  if (bc.open >= open_max) return nullptr;
  return open_conn(backend);
}

h2_conn* triton_grpc::open_conn(uint32_t backend) noexcept {
  auto* c = new (std::nothrow) h2_conn();
  if (c == nullptr) return nullptr;
  const config::backend_config& b = _cfg->backends[backend];
  c->fd = net::upstream_socket(b.address.family());
  // The client preface and SETTINGS go out with the first flush. Stream
  // windows are given back as clients take the bytes (backpressure), the
  // connection's after each receive.
  grpc::session_settings st;
  st.manual_window = true;
  st.stream_window = static_cast<uint32_t>(k_stream_window_bytes);
  st.connection_window = static_cast<uint32_t>(k_connection_window_bytes);
  st.max_frame = 16384;
  if (c->fd < 0 || !c->session.open(*c, st) || !c->in.reserve(k_recv_bytes)) {
    if (c->fd >= 0) ::close(c->fd);
    delete c;
    return nullptr;
  }
  account_connection_memory(sizeof(h2_conn));
  c->slot = _r.register_file(c->fd);
  c->adapter = this;
  c->backend = backend;
  c->peer = b.address.storage;
  c->peer_len = b.address.length;
  c->connect_op.owner = c->send_op.owner = c->recv_op.owner = c;
  c->connect_op.fn = &triton_grpc::on_connect;
  c->send_op.fn = &triton_grpc::on_send;
  c->recv_op.fn = &triton_grpc::on_recv;
  backend_conns& bc = _backends[backend];
  c->hook.next = bc.head;
  if (bc.head != nullptr) bc.head->hook.prev = c;
  bc.head = c;
  ++bc.open;
  submit_connect(c);
  return c;
}

void triton_grpc::submit_connect(h2_conn* c) noexcept {
  io_uring_sqe* s = _r.sqe(&c->connect_op);
  io_uring_prep_connect(s, c->fd, reinterpret_cast<const sockaddr*>(&c->peer), c->peer_len);
  ++c->ops;
}

void triton_grpc::submit_recv(h2_conn* c) noexcept {
  if (c->recv_armed || c->closing) return;
  io_uring_sqe* s = _r.sqe(&c->recv_op);
  io_uring_prep_recv(s, c->fd, c->in.data, c->in.cap, 0);
  shard::aim(s, c->slot);
  c->recv_armed = true;
  ++c->ops;
}

void triton_grpc::flush(h2_conn* c) noexcept {
  if (!c->connected || c->send_busy || c->in_recv || c->fd < 0) return;
  // A session that broke stays broken: whoever saw it fails the connection,
  // once (its streams' detach comes back here).
  if (c->session.failed()) return;
  if (c->closing && c->streams == 0) return;
  c->out.len = 0;
  c->out_sent = 0;
  // The session's frames, gathered into one send (bounded: a big request's
  // DATA goes as the peer's window allows, the rest with the next send).
  constexpr uint32_t k_send_bytes_max = 256u << 10;
  while (c->out.len < k_send_bytes_max) {
    const std::string_view frames = c->session.next_send();
    if (c->session.failed()) {
      fail_conn(c, errc::upstream_protocol);
      return;
    }
    if (frames.empty()) break;
    if (!c->out.reserve(static_cast<size_t>(c->out.len) + frames.size())) {
      fail_conn(c, errc::internal);
      return;
    }
    std::memcpy(c->out.data + c->out.len, frames.data(), frames.size());
    c->out.len += static_cast<uint32_t>(frames.size());
  }
  if (c->out.len == 0) return;
  c->send_busy = true;
  io_uring_sqe* s = _r.sqe(&c->send_op);
  io_uring_prep_send(s, c->fd, c->out.data, c->out.len, MSG_NOSIGNAL);
  shard::aim(s, c->slot);
  ++c->ops;
}

void triton_grpc::close_conn(h2_conn* c) noexcept {
  if (c->fd < 0) return;
  c->closing = true;
  // shutdown() now: pending operations complete, and the backend sees the
  // close at once (every stream on it is cancelled).
  ::shutdown(c->fd, SHUT_RDWR);
  maybe_free(c);
}

void triton_grpc::maybe_free(h2_conn* c) noexcept {
  if (!c->closing || c->ops > 0 || c->streams > 0) return;
  SLUICE_VERIFY(!c->send_busy && !c->recv_armed && c->streams_head == nullptr);
  backend_conns& bc = _backends[c->backend];
  if (c->hook.prev != nullptr) {
    c->hook.prev->hook.next = c->hook.next;
  } else {
    bc.head = c->hook.next;
  }
  if (c->hook.next != nullptr) c->hook.next->hook.prev = c->hook.prev;
  --bc.open;
  _r.unregister_file(c->slot);  // no operation is left on it (ops is 0)
  if (c->fd >= 0) ::close(c->fd);
  account_connection_memory(-static_cast<int64_t>(sizeof(h2_conn)));
  delete c;  // its session with it
}

void triton_grpc::let_go(h2_conn* c) noexcept {
  --c->ops;
  if ((c->closing || c->draining) && c->streams == 0) {
    close_conn(c);
  } else {
    maybe_free(c);
  }
}

bool triton_grpc::conn_gone(h2_conn* c) noexcept {
  --c->ops;
  if (!c->closing) return false;
  if (c->streams == 0) {
    if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
    maybe_free(c);
  }
  return true;
}

void triton_grpc::fail_conn(h2_conn* c, errc why) noexcept {
  conn_hold hold(c);
  c->closing = true;
  if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
  if (c->streams_head != nullptr) _x.report_outcome(c->backend, true);
  // Each exchange on it: its stream ends as if UNAVAILABLE (retried
  // elsewhere while the backend had not answered it; else cut).
  while (exchange* x = c->streams_head) {
    detach(*x, false);
    grpc_attempt& a = grpc_of(*x);
    a.closed = true;
    if (a.grpc_status < 0) {
      a.grpc_status = 14;
      set_message(a, "The backend closed the connection.");
    }
    a.conn_failed = why != errc::ok;
    if (!a.sending) advance(*x);
  }
}

void triton_grpc::on_connect(shard::completion* op, const io_uring_cqe* cqe) {
  auto* c = static_cast<struct op<h2_conn>*>(op)->owner;
  c->adapter->on_connect_cqe(c, cqe->res);
}

void triton_grpc::on_connect_cqe(h2_conn* c, int res) noexcept {
  if (conn_gone(c)) return;
  conn_hold hold(c);
  if (res < 0) {
    _metrics.at(metrics::stat::upstream_connect_errors).add();
    fail_conn(c, errc::upstream_connect);
    return;
  }
  c->connected = true;
  for (exchange* x = c->streams_head; x != nullptr; x = grpc_of(*x).hook.next) {
    const config::group_config& g = _cfg->groups[x->group];
    x->codec->wait_for_backend(*x, deadline_kind::upstream_first_byte, g.upstream.first_byte_timeout_ms);
  }
  submit_recv(c);
  flush(c);
}

void triton_grpc::on_send(shard::completion* op, const io_uring_cqe* cqe) {
  auto* c = static_cast<struct op<h2_conn>*>(op)->owner;
  c->adapter->on_send_cqe(c, cqe->res);
}

void triton_grpc::on_send_cqe(h2_conn* c, int res) noexcept {
  c->send_busy = false;
  if (conn_gone(c)) return;
  conn_hold hold(c);
  if (res < 0) {
    fail_conn(c, errc::upstream_closed);
    return;
  }
  c->out_sent += static_cast<uint32_t>(res);
  if (c->out_sent < c->out.len) {
    // A short send: the rest, from where it stopped (the buffer is unmoved).
    c->send_busy = true;
    io_uring_sqe* s = _r.sqe(&c->send_op);
    io_uring_prep_send(s, c->fd, c->out.data + c->out_sent, c->out.len - c->out_sent, MSG_NOSIGNAL);
    shard::aim(s, c->slot);
    ++c->ops;
    return;
  }
  flush(c);
}

void triton_grpc::on_recv(shard::completion* op, const io_uring_cqe* cqe) {
  auto* c = static_cast<struct op<h2_conn>*>(op)->owner;
  c->recv_armed = false;
  c->adapter->on_recv_cqe(c, cqe->res);
}

void triton_grpc::on_recv_cqe(h2_conn* c, int res) noexcept {
  if (conn_gone(c)) return;
  conn_hold hold(c);
  if (res <= 0) {
    fail_conn(c, errc::upstream_closed);
    return;
  }
  c->in_recv = true;
  const bool ok = c->session.feed(std::string_view(c->in.data, static_cast<size_t>(res)));
  c->in_recv = false;
  if (!ok) {
    log::warn("backend {}: HTTP/2 error: {}", _cfg->backends[c->backend].url, c->session.reason());
    _metrics.at(metrics::stat::upstream_bad_replies).add();
    fail_conn(c, errc::upstream_protocol);
    return;
  }
  run_dirty(c);
  if (c->session.finished()) {
    // GOAWAY and nothing left to read or write: no new streams; it closes
    // with its last one (conn_hold's let_go, or now).
    c->draining = true;
  }
  submit_recv(c);
  flush(c);
}

// ---------------------------------------------------------------------------
// The session's reports: they record; the exchange moves on after the
// receive (run_dirty), never inside it.

void h2_conn::on_field(void* x, std::string_view name, std::string_view value) noexcept {
  adapter->on_field(*static_cast<exchange*>(x), name, value);
}
void h2_conn::on_headers_end(void* x) noexcept { adapter->on_headers_end(*static_cast<exchange*>(x)); }
bool h2_conn::on_data(void* x, std::string_view bytes) noexcept {
  return adapter->on_data(*static_cast<exchange*>(x), bytes);
}
void h2_conn::on_close(void* x, uint32_t error_code) noexcept {
  adapter->on_stream_close(this, *static_cast<exchange*>(x), error_code);
}
size_t h2_conn::read_request(void* x, char* to, size_t room, bool& last) noexcept {
  return adapter->read_request(*static_cast<exchange*>(x), to, room, last);
}

void triton_grpc::on_field(exchange& x, std::string_view n, std::string_view v) noexcept {
  grpc_attempt& a = grpc_of(x);
  if (n == ":status") {
    uint32_t st = 0;
    for (char ch : v) st = ch >= '0' && ch <= '9' && st < 1000 ? st * 10 + static_cast<uint32_t>(ch - '0') : 1000;
    a.http_status = static_cast<uint16_t>(st < 1000 ? st : 0);
  } else if (n == "grpc-status") {
    int32_t st = 0;
    for (char ch : v) st = ch >= '0' && ch <= '9' && st < 1000 ? st * 10 + (ch - '0') : 1000;
    a.grpc_status = v.empty() || st >= 1000 ? 2 : st;  // unparsable: UNKNOWN
  } else if (n == "grpc-message") {
    const size_t k = v.size() < sizeof a.grpc_message ? v.size() : sizeof a.grpc_message;
    std::memcpy(a.grpc_message, v.data(), k);
    a.grpc_message_len = static_cast<uint8_t>(k);
  }
}

bool triton_grpc::on_data(exchange& x, std::string_view bytes) noexcept {
  grpc_of(x).unconsumed += static_cast<uint32_t>(bytes.size());  // the stream's window: given back once the client took them
  mark_dirty(x);
  const size_t used = feed_in_place(x, bytes.data(), bytes.size());
  bytes.remove_prefix(used);
  if (bytes.empty()) return true;
  byte_buf& b = x.mem->body;
  // Bounded by the stream's window (what the client has not yet taken)
  // plus one message at most.
  if (static_cast<uint64_t>(b.len) + bytes.size() > k_message_bytes_max + k_stream_window_bytes ||
      !b.reserve(static_cast<size_t>(b.len) + bytes.size())) {
    // Sluice's reset, not the backend's (the session resets the stream):
    // the status says so before the close.
    grpc_of(x).grpc_status = 13;  // INTERNAL
    set_message(grpc_of(x), "The backend sent more than sluice buffers for one stream.");
    return false;
  }
  std::memcpy(b.data + b.len, bytes.data(), bytes.size());
  b.len += static_cast<uint32_t>(bytes.size());
  return true;
}

void triton_grpc::on_headers_end(exchange& x) noexcept {
  if (grpc_of(x).http_status >= 100 && grpc_of(x).http_status < 200) {
    // An informational (1xx) head: the response's own comes after it.
    grpc_of(x).http_status = 0;
    return;
  }
  grpc_of(x).head_seen = true;
  mark_dirty(x);
}

void triton_grpc::on_stream_close(h2_conn* c, exchange& x, uint32_t error_code) noexcept {
  grpc_attempt& a = grpc_of(x);
  a.closed = true;
  if (a.grpc_status < 0) {
    if (error_code != NGHTTP2_NO_ERROR) {
      // A reset with no status: the backend refused or cancelled the
      // stream (REFUSED_STREAM: it never started; another backend may take it).
      a.grpc_status = error_code == NGHTTP2_REFUSED_STREAM ? 14 : 13;  // UNAVAILABLE : INTERNAL
      set_message(a, "The backend reset the stream (", grpc::h2_error_name(error_code), ").");
      // Passive health, as a reset of an HTTP/1.1 backend counts: a failure
      // (a refusal is a busy backend, not a failing one).
      if (error_code != NGHTTP2_REFUSED_STREAM) _x.report_outcome(c->backend, true);
    } else if (!a.head_seen || a.http_status == 200) {
      // Ended without trailers, or trailers without grpc-status: the call's
      // outcome is unknown, so it failed (PROTOCOL-HTTP2.md: a missing
      // status is an error). A plain HTTP status is mapped in advance().
      a.grpc_status = 13;  // INTERNAL
      set_message(a, "The backend ended the stream without a gRPC status.");
    }
  }
  mark_dirty(x);
}

size_t triton_grpc::read_request(exchange& x, char* out, size_t room, bool& last) noexcept {
  const byte_buf& r = x.mem->up_head;
  const uint32_t left = r.len - grpc_of(x).request_off;
  const size_t n = left < room ? left : room;
  std::memcpy(out, r.data + grpc_of(x).request_off, n);
  grpc_of(x).request_off += static_cast<uint32_t>(n);
  // One request per stream: the client's half of the stream ends with it.
  last = grpc_of(x).request_off == r.len;
  return n;
}

// ---------------------------------------------------------------------------
// Streams

void triton_grpc::start(exchange& x) noexcept {
  const config::group_config& g = _cfg->groups[x.group];
  const route::choice ch = _routes->pick(x.group, x.route_key, x.tried_mask);
  if (ch.backend == route::k_none) {
    x.codec->answer_error(x, 503, "No backend is available for this model right now.", "server_error", {},
                          "no_backend", false);
    return;
  }
  x.route_position = ch.position;
  h2_conn* c = acquire(ch.backend, g.upstream.connections_max);
  if (c == nullptr) {
    const bool pool_full = _backends[ch.backend].open >= g.upstream.connections_max;
    _metrics.at(pool_full ? metrics::stat::shed_upstream_pool : metrics::stat::shed_memory).add();
    x.codec->answer_error(x, 503, pool_full ? "Too many requests to the backend right now. Please try again."
                                            : "The server is overloaded. Please try again.",
                          "server_error", {}, "overloaded", false, "retry-after: 1\r\n");
    return;
  }
  x.backend_used = ch.backend;
  if (!open_stream(x, c)) {
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, false);
    return;
  }
  _routes->on_request_start(ch.backend);
  _metrics.backend_started(ch.backend);
  _metrics.at(metrics::stat::upstream_requests).add();
  if (c->connected) {
    x.codec->wait_for_backend(x, deadline_kind::upstream_first_byte, g.upstream.first_byte_timeout_ms);
  } else {
    x.codec->wait_for_backend(x, deadline_kind::upstream_connect, g.upstream.connect_timeout_ms);
  }
  flush(c);
}

bool triton_grpc::open_stream(exchange& x, h2_conn* c) noexcept {
  grpc_attempt& a = grpc_of(x);
  a = grpc_attempt{};
  x.mem->body.len = 0;
  triton_mem(x).stream.reset({});  // the last exchange's reply is not this one's (start_reply sets it up)
  const config::backend_config& b = _cfg->backends[c->backend];
  char timeout[16];
  size_t tl = 0;
  if (x.total_deadline_ms != 0) {
    const uint64_t now = _s.now_ms();
    tl = grpc::write_timeout(timeout, x.total_deadline_ms > now ? x.total_deadline_ms - now : 1);
  }
  // The session copies the values: the HEADERS frame is encoded later,
  // after `timeout` is gone and a SIGHUP may have freed the config
  // snapshot the :authority lies in.
  const int32_t id = c->session.call(k_path, b.host_header, "sluice", std::string_view(timeout, tl), true, &x);
  if (id < 0) return false;
  a.conn = c;
  a.stream_id = id;
  a.hook.prev = nullptr;
  a.hook.next = c->streams_head;
  if (c->streams_head != nullptr) grpc_of(*c->streams_head).hook.prev = &x;
  c->streams_head = &x;
  ++c->streams;
  return true;
}

void triton_grpc::detach(exchange& x, bool cancel) noexcept {
  grpc_attempt& a = grpc_of(x);
  h2_conn* c = a.conn;
  if (c == nullptr) return;
  if (a.dirty) {
    // Out of the connection's news list (run_dirty walks it afresh).
    exchange** p = &c->dirty_head;
    while (*p != nullptr && *p != &x) p = &grpc_of(**p).dirty_next;
    if (*p == &x) *p = grpc_of(x).dirty_next;
    a.dirty = false;
    a.dirty_next = nullptr;
  }
  if (!a.closed) {
    c->session.forget(a.stream_id);
    if (cancel) c->session.reset(a.stream_id, NGHTTP2_CANCEL);
  }
  // Its unread window goes back at the connection level; the stream's own
  // goes with the stream.
  if (a.hook.prev != nullptr) {
    grpc_of(*a.hook.prev).hook.next = a.hook.next;
  } else {
    c->streams_head = a.hook.next;
  }
  if (a.hook.next != nullptr) grpc_of(*a.hook.next).hook.prev = a.hook.prev;
  a.hook = {};
  a.conn = nullptr;
  --c->streams;
  _routes->on_request_end(c->backend);
  _metrics.backend_ended(c->backend);
  // A flush that fails the connection must not free it under this call.
  conn_hold hold(c);
  if (!c->in_recv) flush(c);
}

void triton_grpc::release(exchange& x) noexcept {
  // The client went: the backend hears RST_STREAM CANCEL at once (Triton
  // cancels the request and frees its slot).
  detach(x, true);
}

void triton_grpc::mark_dirty(exchange& x) noexcept {
  grpc_attempt& a = grpc_of(x);
  if (a.dirty || a.conn == nullptr) return;
  a.dirty = true;
  a.dirty_next = a.conn->dirty_head;
  a.conn->dirty_head = &x;
}

void triton_grpc::run_dirty(h2_conn* c) noexcept {
  while (exchange* x = c->dirty_head) {
    c->dirty_head = grpc_of(*x).dirty_next;
    grpc_of(*x).dirty = false;
    grpc_of(*x).dirty_next = nullptr;
    advance(*x);
  }
}

void triton_grpc::give_back_stream_window(exchange& x) noexcept {
  grpc_attempt& a = grpc_of(x);
  if (a.unconsumed == 0 || a.conn == nullptr || a.closed) {
    a.unconsumed = 0;
    return;
  }
  a.conn->session.consume(a.stream_id, a.unconsumed);
  a.unconsumed = 0;
  if (!a.conn->in_recv) flush(a.conn);
}

void triton_grpc::on_timeout(exchange& x) noexcept {
  _metrics.at(metrics::stat::upstream_timeouts).add();
  grpc_attempt& a = grpc_of(x);
  // Passive health, as an HTTP/1.1 backend's timeout counts: a failure of
  // the backend the stream is open on.
  if (a.conn != nullptr) _x.report_outcome(a.conn->backend, true);
  if (a.sending) {
    // A deadline fell due while the client is still taking a batch (a slow
    // reader at the total deadline): the backend's stream ends now; the
    // send owns mem->frame until its completion. The last batch finishes
    // the exchange there (on_sent); any other, the client is cut.
    detach(x, true);
    if (x.rsp.client_done) return;
    _metrics.at(metrics::stat::upstream_truncated).add();
    x.error_code = "upstream_timeout";
    x.codec->fail(x);
    return;
  }
  if (x.rsp.client_done) {
    finish(x);  // (a send ends every client response; kept for safety)
    return;
  }
  detach(x, true);
  a.closed = true;
  a.grpc_status = 4;  // DEADLINE_EXCEEDED
  a.grpc_message_len = 0;
  a.timed_out = true;
  if (!a.sending) advance(x);
}

}  // namespace sluice::proxy
