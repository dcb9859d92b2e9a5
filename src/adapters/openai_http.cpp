// The OpenAI-over-HTTP/1.1 backend adapter (vLLM, SGLang, trtllm-serve,
// llama.cpp): pooled keep-alive connections per backend, the forwarded
// request (the client's body with at most two byte edits), connect, send
// and receive, retries, and the failures a client is answered for.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "openai_http.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::proxy {

namespace {

constexpr uint32_t k_upstream_buf_bytes = 64u << 10;
// Room kept for the backend's host value when a body joins the head: an
// address with its port or a short name fits; a longer one grows the buffer.
constexpr uint32_t k_host_room = 64;





}  // namespace

openai_http::openai_http(shard_context& s, exchange_policy& x) noexcept : _s(s), _x(x) {
  _backend_count = _cfg->backends.size();
  _backends = std::make_unique<backend_state[]>(_backend_count);
  for (size_t i = 0; i < _backend_count; ++i) _backends[i].cfg = &_cfg->backends[i];
}

openai_http::~openai_http() {
  for (size_t i = 0; i < _backend_count; ++i) {
    while (upstream_conn* u = _backends[i].idle_head) {
      _backends[i].idle_head = u->pool_hook.next;
      // Its armed receive ends with the shutdown (no byte can land in the
      // buffer after it is freed); the ring goes right after.
      if (u->fd >= 0) {
        ::shutdown(u->fd, SHUT_RDWR);
        _r.unregister_file(u->slot);
        ::close(u->fd);
      }
      drop_upstream_buffer(u);
      account_connection_memory(-static_cast<int64_t>(sizeof(upstream_conn)));
      delete u;
    }
  }
}

bool openai_http::init() noexcept {
  // server.upstream_buffers (64) x 64 KiB for the backends' responses:
  // lent from a receive's completion until its bytes are sent (a 41 KB SSE
  // burst fits one), so idle streams and pooled connections hold no receive
  // buffer. The kernel takes them in turn, so all are touched in time (4 MiB
  // by default): a fixed cost per shard. With every one lent, a connection
  // allocates its own.
  _up_bufs = net::buffer_ring::create(_r.ring(), 1, _cfg->server.upstream_buffers, 64 * 1024);
  return _up_bufs != nullptr;
}

void openai_http::reload(const config::config& n) noexcept {
  // Backends keep their positions: pools and in-flight counts carry over.
  SLUICE_VERIFY(n.backends.size() >= _backend_count);
  auto backends = std::make_unique<backend_state[]>(n.backends.size());
  for (size_t i = 0; i < _backend_count; ++i) backends[i] = _backends[i];
  for (size_t i = 0; i < n.backends.size(); ++i) backends[i].cfg = &n.backends[i];
  _backends = std::move(backends);
  _backend_count = n.backends.size();
  // Idle connections to removed backends go now; busy ones when released.
  for (size_t i = 0; i < _backend_count; ++i) {
    if (!n.backends[i].removed) continue;
    while (upstream_conn* u = _backends[i].idle_head) close_upstream(u);
  }
}

void openai_http::release(exchange& x) noexcept {
  if (x.up != nullptr) drop_attempt(x);
}

void openai_http::drop_attempt(exchange& x) noexcept {
  upstream_conn* u = x.up;
  x.up = nullptr;
  u->owner = nullptr;
  _routes->on_request_end(u->backend);
  _metrics.backend_ended(u->backend);
  close_upstream(u);  // shut down at once: the backend stops the request
}

void openai_http::end_attempt(exchange& x) noexcept {
  upstream_conn* u = x.up;
  if (u == nullptr) return;
  x.up = nullptr;
  _routes->on_request_end(u->backend);
  _metrics.backend_ended(u->backend);
  release_upstream(u, x.rsp.reusable);
}

void openai_http::on_timeout(exchange& x) noexcept {
  _metrics.at(metrics::stat::upstream_timeouts).add();
  upstream_failed(x, errc::upstream_timeout);
}

// ---------------------------------------------------------------------------
// The forwarded request

uint64_t openai_http::plan_upstream_body(exchange& x, const openai::request_fields& f) noexcept {
  const config::group_config& g = _cfg->groups[x.group];
  const std::string_view client_body = request_body(x);
  const char* body = client_body.data();
  const uint32_t body_bytes = static_cast<uint32_t>(client_body.size());
  // Body: the client's bytes with at most two byte edits, in body order:
  // `model` replaced when the group names its backend model, and usage
  // requested for a stream whose client did not ask for it (sluice bills
  // from it and cuts that chunk out again on the way back). Nothing else is
  // re-encoded.
  struct edit {
    uint32_t begin, end;  // replaced span of the body
    const char* text;
    size_t text_len;
  };
  edit edits[2];
  size_t edit_count = 0;
  static constexpr std::string_view k_usage_object = "{\"include_usage\":true}";
  static constexpr std::string_view k_usage_member = "\"stream_options\":{\"include_usage\":true},";
  static constexpr std::string_view k_usage_first = "\"include_usage\":true";
  static constexpr std::string_view k_usage_first_of_more = "\"include_usage\":true,";
  x.rsp.cut_usage = false;
  if (g.inject_usage && f.stream && !f.include_usage && x.req.endpoint != openai::endpoint::embeddings &&
      body_bytes != 0 && !x.req.native) {
    x.rsp.cut_usage = true;
    if (f.stream_options_object && !f.has_include_usage) {
      // The client's other stream_options (vLLM's continuous_usage_stats)
      // stay: the member goes in first, after the object's brace.
      uint32_t at = f.stream_options_begin + 1;
      while (at < f.stream_options_end && (body[at] == ' ' || body[at] == '\t' || body[at] == '\r' || body[at] == '\n')) ++at;
      const bool empty = at < f.stream_options_end && body[at] == '}';
      edits[edit_count++] = {f.stream_options_begin + 1, f.stream_options_begin + 1,
                             empty ? k_usage_first.data() : k_usage_first_of_more.data(),
                             empty ? k_usage_first.size() : k_usage_first_of_more.size()};
    } else if (f.has_stream_options) {
      // null, or an explicit include_usage false/null: replaced whole (with
      // a false one, the client's other options go too; the cut keeps the
      // stream as the client would have seen it without usage).
      edits[edit_count++] = {f.stream_options_begin, f.stream_options_end, k_usage_object.data(), k_usage_object.size()};
    } else {
      uint32_t brace = 0;  // the validated body starts with optional whitespace, then '{'
      while (brace < body_bytes && body[brace] != '{') ++brace;
      edits[edit_count++] = {brace + 1, brace + 1, k_usage_member.data(), k_usage_member.size()};
    }
  }
  // A natively spoken Responses / Messages request: the client's own bytes
  // (its model token found by dialect::top_level_member), never usage
  // injected (their streams carry it).
  const uint32_t model_begin = x.req.native ? x.req.native_model_begin : f.model_token_begin;
  const uint32_t model_end = x.req.native ? x.req.native_model_end : f.model_token_end;
  if (!g.backend_model.empty() && model_end > model_begin) {
    size_t n = 0;
    x.scratch[n++] = '"';
    n += openai::json_escape(x.scratch + n, sizeof x.scratch - 2, g.backend_model);
    x.scratch[n++] = '"';
    edits[edit_count++] = {model_begin, model_end, x.scratch, n};
  }
  if (edit_count == 2 && edits[1].begin < edits[0].begin) std::swap(edits[0], edits[1]);
  uint64_t body_len = body_bytes;
  x.up_iov_count = 1;  // [0] is the head
  uint32_t at = 0;
  for (size_t i = 0; i < edit_count; ++i) {
    if (edits[i].begin > at) x.up_iov[x.up_iov_count++] = {const_cast<char*>(body) + at, edits[i].begin - at};
    x.up_iov[x.up_iov_count++] = {const_cast<char*>(edits[i].text), edits[i].text_len};
    body_len = body_len - (edits[i].end - edits[i].begin) + edits[i].text_len;
    at = edits[i].end;
  }
  if (at < body_bytes) x.up_iov[x.up_iov_count++] = {const_cast<char*>(body) + at, body_bytes - at};
  return body_len;
}

bool openai_http::build_upstream_request(exchange& x, const openai::request_fields& f) noexcept {
  const config::group_config& g = _cfg->groups[x.group];
  const http::request_head& h = x.head;
  const uint64_t body_len = plan_upstream_body(x, f);

  const std::string_view peer_ip = x.codec->peer_ip(x);
  size_t need = h.head_bytes + 512 + peer_ip.size();
  if (!x.mem->up_head.reserve(need)) return false;
  byte_buf& o = x.mem->up_head;
  o.len = 0;
  append(o, h.method_name);
  append(o, " ");
  // A Responses or Messages client's request goes as the chat body it was
  // written as (its query, if any, is not carried).
  append(o, renders(x) ? std::string_view("/v1/chat/completions") : h.target);
  append(o, " HTTP/1.1\r\nhost: ");
  x.host_offset = o.len;  // the backend's host goes here, per attempt (start_attempt)
  append(o, "\r\n");
  std::string_view xff_prior;
  http::header hd;
  std::string_view raw;
  line_runs kept;
  for (http::header_fields it = h.fields(); it.next(hd, raw);) {
    if (iequals(hd.name, "x-forwarded-for")) xff_prior = hd.value;
    if (drop_request_header(hd.name)) continue;
    if (!h.connection.empty() && named_in_connection(h.connection, hd.name)) continue;
    kept.keep(o, raw);
  }
  kept.flush(o);
  char line[256];
  text_writer w(line, sizeof line);
  w.put("content-length: ");
  w.put_int(body_len);
  w.put("\r\nx-request-id: ");
  w.put(std::string_view(x.request_id, x.request_id_len));
  w.put("\r\nx-forwarded-for: ");
  append(o, std::string_view(line, static_cast<size_t>(w.p - line)));
  if (!xff_prior.empty() && xff_prior.size() < 1024) {
    if (!o.reserve(static_cast<size_t>(o.len) + xff_prior.size() + 128)) return false;
    append(o, xff_prior);
    append(o, ", ");
  }
  append(o, peer_ip);
  append(o, "\r\n");
  if (!g.api_key.empty()) {
    // The group's own backend credential; the client's key never leaves.
    if (!o.reserve(static_cast<size_t>(o.len) + g.api_key.size() + 32)) return false;
    append(o, "authorization: Bearer ");
    append(o, g.api_key);
    append(o, "\r\n");
  }
  append(o, "\r\n");
  x.up_body_len = body_len;
  x.host_len = 0;
  // A body that fits in the head's buffer as it is (most chat bodies: the
  // buffer starts at 1 KiB) joins the head there, so the request goes out
  // as one plain send; a larger one is sent from the client's buffer.
  if (static_cast<uint64_t>(o.len) + body_len + k_host_room <= o.cap) {
    for (uint8_t i = 1; i < x.up_iov_count; ++i) {
      std::memcpy(o.data + o.len, x.up_iov[i].iov_base, x.up_iov[i].iov_len);
      o.len += static_cast<uint32_t>(x.up_iov[i].iov_len);
    }
    x.up_iov_count = 1;
  }
  return true;
}

bool openai_http::prepare(exchange& x, const openai::request_fields& f) noexcept {
  x.rsp.dialect = reply_dialect::openai;
  x.rsp.reader = nullptr;
  if (build_upstream_request(x, f)) return true;
  x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
  return false;
}

void openai_http::start(exchange& x) noexcept {
  if (x.up_send_inflight) {
    // The last attempt's send still reads the request bytes this one would
    // rewrite (the host) and send again: go on at its completion.
    x.after_up_send = after_upstream_send::retry;
    return;
  }
  x.up_request_sent = false;
  const config::group_config& g = _cfg->groups[x.group];
  const route::choice c = _routes->pick(x.group, x.route_key, x.tried_mask);
  if (c.backend == route::k_none) {
    x.codec->answer_error(x, 503, "No backend is available for this model right now.", "server_error", {}, "no_backend",
                 false);
    return;
  }
  const uint32_t backend = c.backend;
  x.route_position = c.position;
  // This attempt's backend goes in as the host value at host_offset (a
  // retry swaps it, moving what follows when the length differs).
  const std::string_view host = _cfg->backends[backend].host_header;
  byte_buf& o = x.mem->up_head;
  if (host.size() != x.host_len) {
    if (!o.reserve(static_cast<size_t>(o.len) - x.host_len + host.size())) {
      x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, false);
      return;
    }
    char* tail = o.data + x.host_offset + x.host_len;
    std::memmove(o.data + x.host_offset + host.size(), tail, o.len - x.host_offset - x.host_len);
    o.len = static_cast<uint32_t>(o.len - x.host_len + host.size());
    x.host_len = static_cast<uint32_t>(host.size());
  }
  std::memcpy(o.data + x.host_offset, host.data(), host.size());
  x.up_msg_iov[0] = {o.data, o.len};
  uint8_t n = 1;
  for (uint8_t i = 1; i < x.up_iov_count; ++i) x.up_msg_iov[n++] = x.up_iov[i];
  x.up_msg_iov_count = n;

  upstream_conn* u = acquire_upstream(backend, g.upstream.connections_max);
  if (u == nullptr) {
    // The backend's pool is at upstream.connections_max on this shard (or
    // a socket/allocation failed): shed, with a time to come back.
    const bool pool_full = _backends[backend].open - _backends[backend].closing >= g.upstream.connections_max;
    _metrics.at(pool_full ? metrics::stat::shed_upstream_pool : metrics::stat::shed_memory).add();
    x.codec->answer_error(x, 503, pool_full ? "Too many requests to the backend right now. Please try again."
                                   : "The server is overloaded. Please try again.",
                 "server_error", {}, "overloaded", false, "retry-after: 1\r\n");
    return;
  }
  u->owner = &x;
  x.up = u;
  x.backend_used = backend;
  _routes->on_request_start(backend);
  _metrics.backend_started(backend);
  _metrics.at(metrics::stat::upstream_requests).add();
  x.rsp.parser.reset(false);
  x.rsp.complete = false;
  u->buf.len = 0;
  if (u->connected) {
    x.codec->wait_for_backend(x, deadline_kind::upstream_first_byte, g.upstream.first_byte_timeout_ms);
    submit_upstream_send(x);
  } else {
    x.codec->wait_for_backend(x, deadline_kind::upstream_connect, g.upstream.connect_timeout_ms);
    submit_connect(u);
  }
}

upstream_conn* openai_http::acquire_upstream(uint32_t backend, uint32_t open_max) noexcept {
  backend_state& bs = _backends[backend];
  const uint64_t idle_max_ms = _cfg->upstream.pool_idle_timeout_ms;
  while (upstream_conn* u = bs.idle_head) {
    if (idle_max_ms != 0 && _s.now_ms() - u->idle_since_ms >= idle_max_ms) {
      // Idle past the pool's timeout, the backend may be closing it now
      // (pool_idle_timeout_ms): closed, not reused. The pool is newest
      // first, so all behind it are as old.
      close_upstream(u);
      continue;
    }
    bs.idle_head = u->pool_hook.next;
    if (bs.idle_head != nullptr) bs.idle_head->pool_hook.prev = nullptr;
    u->pool_hook = {};
    u->in_pool = false;
    --bs.idle_count;
    // Its idle receive stays armed: it will take the response.
    u->reused = true;
    return u;
  }
  if (bs.open - bs.closing >= open_max) return nullptr;
  auto* u = new (std::nothrow) upstream_conn();
  if (u == nullptr) return nullptr;
  const config::backend_config& b = _cfg->backends[backend];
  u->fd = net::upstream_socket(b.address.family());
  if (u->fd < 0) {
    delete u;
    return nullptr;
  }
  account_connection_memory(sizeof(upstream_conn));
  u->slot = _r.register_file(u->fd);
  u->peer = b.address.storage;
  u->peer_len = b.address.length;
  ++bs.open;
  u->adapter = this;
  u->give_back = &openai_http::give_back;
  u->backend = backend;
  u->connect_op.owner = u->send_op.owner = u->recv_op.owner = u;
  u->connect_op.fn = &openai_http::on_up_connect;
  u->send_op.fn = &openai_http::on_up_send;
  u->recv_op.fn = &openai_http::on_up_recv;
  return u;
}

void openai_http::release_upstream(upstream_conn* u, bool reusable) noexcept {
  u->owner = nullptr;
  // A backend that answered before it read the whole request: the rest of
  // the request is still going out, so the connection's byte stream is in
  // the middle of a request and cannot carry another.
  if (u->send_for != nullptr) reusable = false;
  backend_state& bs = _backends[u->backend];
  const uint32_t pool_max = _cfg->upstream.pool_idle_max;
  if (!reusable || _draining || bs.idle_count >= pool_max || u->closing || bs.cfg->removed) {
    close_upstream(u);
    return;
  }
  u->in_pool = true;
  u->reused = false;
  u->idle_since_ms = _s.now_ms();
  u->pool_hook.prev = nullptr;
  u->pool_hook.next = bs.idle_head;
  if (bs.idle_head != nullptr) bs.idle_head->pool_hook.prev = u;
  bs.idle_head = u;
  ++bs.idle_count;
  // An idle pooled connection keeps a receive armed: it completes at once
  // if the backend closes the connection (uvicorn closes idle keep-alive
  // connections after 5 s) or sends bytes nobody asked for -- either way
  // the connection leaves the pool -- and otherwise it is the receive of the
  // next request's response, so reuse costs no extra ring operation (a
  // POLLIN watch would need a poll_remove and a new recv per request). It
  // holds no buffer until bytes come.
  drop_upstream_buffer(u);
  submit_recv(u, true);
  SLUICE_VERIFY(u->ops == 1 && u->recv_armed);  // pooled: only its idle receive is in flight
}

void openai_http::submit_recv(upstream_conn* u, bool poll_first) noexcept {
  if (u->recv_armed) return;
  io_uring_sqe* s = _r.sqe(&u->recv_op);
  if (u->buf.data == nullptr) {
    io_uring_prep_recv(s, u->fd, nullptr, _up_bufs->buffer_bytes(), 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = _up_bufs->group_id();
  } else {
    io_uring_prep_recv(s, u->fd, u->buf.data + u->buf.len, u->buf.cap - u->buf.len, 0);
  }
  shard::aim(s, u->slot);
  // A response not yet asked for (pooled) or just asked for cannot be
  // there yet: wait for readiness without a receive attempt that would
  // only find the socket empty (IORING_RECVSEND_POLL_FIRST, Linux 5.19).
  if (poll_first) s->ioprio |= IORING_RECVSEND_POLL_FIRST;
  u->recv_armed = true;
  ++u->ops;
}

void openai_http::drop_upstream_buffer(upstream_conn* u) noexcept {
  SLUICE_ASSERT(!u->buf_pinned);
  if (u->buf_lent) {
    _up_bufs->recycle(u->buf_bid);
    u->buf_lent = false;
    u->buf.data = nullptr;
    u->buf.len = u->buf.cap = 0;
  } else if (u->buf.data != nullptr) {
    u->buf.release();
  }
}

void openai_http::close_upstream(upstream_conn* u) noexcept {
  if (u->closing) return;
  u->closing = true;
  ++_backends[u->backend].closing;
  if (u->in_pool) {
    backend_state& bs = _backends[u->backend];
    if (u->pool_hook.prev != nullptr) {
      u->pool_hook.prev->pool_hook.next = u->pool_hook.next;
    } else {
      bs.idle_head = u->pool_hook.next;
    }
    if (u->pool_hook.next != nullptr) u->pool_hook.next->pool_hook.prev = u->pool_hook.prev;
    u->in_pool = false;
    --bs.idle_count;
  }
  // shutdown() sends the FIN now even while io_uring operations still hold
  // the file: the backend sees the close at once (vLLM aborts the request).
  ::shutdown(u->fd, SHUT_RDWR);  // also completes an armed receive
  maybe_free(u);
}

void openai_http::maybe_free(upstream_conn* u) noexcept {
  if (!u->closing || u->ops > 0) return;
  SLUICE_VERIFY(u->send_for == nullptr && !u->buf_pinned && !u->recv_armed);
  drop_upstream_buffer(u);
  _r.unregister_file(u->slot);  // no operation is left on it (ops is 0)
  ::close(u->fd);
  --_backends[u->backend].open;
  --_backends[u->backend].closing;
  account_connection_memory(-static_cast<int64_t>(sizeof(upstream_conn)));
  delete u;
}

bool openai_http::upstream_gone(upstream_conn* u) noexcept {
  --u->ops;
  if (!u->closing && u->owner != nullptr) return false;
  // The exchange ended (client gone, timeout) while this operation was in
  // flight, or the receive a pooled connection keeps armed completed (the
  // backend closed it): the connection is of no further use. close_upstream
  // frees it itself when no operation is left.
  if (!u->closing) {
    close_upstream(u);
  } else {
    maybe_free(u);
  }
  return true;
}

void openai_http::submit_connect(upstream_conn* u) noexcept {
  // The address is the connection's own copy: the kernel reads it when the
  // SQE is submitted (the next loop turn), and a reload may drop the config
  // snapshot in between.
  io_uring_sqe* s = _r.sqe(&u->connect_op);
  io_uring_prep_connect(s, u->fd, reinterpret_cast<const sockaddr*>(&u->peer), u->peer_len);
  ++u->ops;
}

void openai_http::on_up_connect(shard::completion* c, const io_uring_cqe* cqe) {
  auto* u = static_cast<op<upstream_conn>*>(c)->owner;
  u->adapter->on_up_connect_cqe(u, cqe->res);
}

void openai_http::on_up_connect_cqe(upstream_conn* u, int res) noexcept {
  if (upstream_gone(u)) return;
  exchange& x = *u->owner;
  if (res < 0) {
    _metrics.at(metrics::stat::upstream_connect_errors).add();
    upstream_failed(x, errc::upstream_connect);
    return;
  }
  u->connected = true;
  x.codec->wait_for_backend(x, deadline_kind::upstream_first_byte, _cfg->groups[x.group].upstream.first_byte_timeout_ms);
  submit_upstream_send(x);
  // The answer is read while the request goes out, as on a pooled
  // connection: a backend may answer (413, 400) before it reads a large
  // body, and would wait for sluice to read while sluice waits to write.
  submit_recv(u, true);
}

void openai_http::submit_upstream_send(exchange& x) noexcept {
  upstream_conn* u = x.up;
  SLUICE_VERIFY(!x.up_send_inflight && u->send_for == nullptr);
  io_uring_sqe* s = _r.sqe(&u->send_op);
  prep_send_iov(s, u->fd, x.up_msg_iov, x.up_msg_iov_count, x.up_msg);
  shard::aim(s, u->slot);
  // The send uses u's socket and reads the exchange's bytes: it holds both.
  ++u->ops;
  x.codec->lend_request_bytes(x);
  u->send_for = &x;
}

void openai_http::after_upstream_send_done(exchange& x) noexcept {
  const after_upstream_send next = x.after_up_send;
  x.after_up_send = after_upstream_send::nothing;
  switch (next) {
    case after_upstream_send::nothing:
      return;
    case after_upstream_send::next_request:
      x.codec->request_bytes_free(x);
      return;
    case after_upstream_send::retry:
      start(x);
      return;
    case after_upstream_send::retry_unless_sent:
      // The failed attempt's send turned out to have written the whole
      // request: the backend may have started it.
      if (x.up_request_sent) {
        answer_upstream_failure(x, errc::upstream_connect);
      } else {
        start(x);
      }
      return;
  }
}

void openai_http::on_up_send(shard::completion* c, const io_uring_cqe* cqe) {
  auto* u = static_cast<op<upstream_conn>*>(c)->owner;
  u->adapter->on_up_send_cqe(u, cqe->res);
}

void openai_http::on_up_send_cqe(upstream_conn* u, int res) noexcept {
  SLUICE_VERIFY(u->send_for != nullptr);
  exchange& x = *u->send_for;
  u->send_for = nullptr;
  const bool more = res >= 0 && advance_iov(x.up_msg_iov, x.up_msg_iov_count, static_cast<size_t>(res));
  if (res >= 0 && !more) x.up_request_sent = true;
  const bool gone = upstream_gone(u);
  // The request bytes go back to the codec; a client side that closed
  // meanwhile goes with them (and the exchange: nothing more to do).
  if (!x.codec->return_request_bytes(x)) return;
  if (gone) {
    // The exchange let go of the connection while this send was out (an
    // early answer, a failure, the client gone): what waited for the send
    // to give back the request bytes goes on now.
    after_upstream_send_done(x);
    return;
  }
  SLUICE_ASSERT(u->owner == &x);
  if (res < 0) {
    if (res == -ETIMEDOUT) u->reused = false;  // unreachable or wedged, not stale (see on_up_recv_cqe)
    upstream_failed(x, errc::upstream_connect);  // not written whole: the backend cannot have started it
    return;
  }
  if (more) {
    submit_upstream_send(x);
    return;
  }
  // A pooled connection's receive is armed already, and its completion may
  // even have come first (then the exchange has moved on): only a request
  // still waiting for its head needs one.
  if (!x.rsp.head_seen) submit_recv(u, true);
}

void openai_http::on_up_recv(shard::completion* c, const io_uring_cqe* cqe) {
  auto* u = static_cast<op<upstream_conn>*>(c)->owner;
  openai_http* srv = u->adapter;
  u->recv_armed = false;
  if ((cqe->flags & IORING_CQE_F_BUFFER) != 0) {
    // A buffer from the ring: it holds the bytes from now on (the receive
    // was armed with nothing held, so u->buf had no storage).
    const auto bid = static_cast<uint16_t>(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
    if (u->buf.data != nullptr) {
      srv->_up_bufs->recycle(bid);  // cannot happen: submit_recv selects only with no storage
    } else {
      u->buf.data = srv->_up_bufs->buffer(bid);
      u->buf.cap = srv->_up_bufs->buffer_bytes();
      u->buf.len = 0;
      u->buf_lent = true;
      u->buf_bid = bid;
    }
  }
  if (cqe->res == -ENOBUFS && !u->closing && u->buf.data == nullptr) {
    // Every ring buffer is lent (that many responses are waiting for slow
    // clients): this connection takes its own, and goes back to the ring
    // once its bytes are sent.
    srv->_metrics.at(metrics::stat::upstream_own_buffers).add();
    if (u->buf.reserve(k_upstream_buf_bytes)) {
      --u->ops;
      srv->submit_recv(u);
      return;
    }
  }
  srv->on_up_recv_cqe(u, cqe->res);
}

void openai_http::on_up_recv_cqe(upstream_conn* u, int res) noexcept {
  if (upstream_gone(u)) return;
  exchange& x = *u->owner;
  if (res <= 0) {
    if (x.rsp.head_seen && res == 0 && x.rsp.parser.finish_at_eof()) {
      // A body delimited by the close: complete.
      x.rsp.complete = true;
      x.rsp.reusable = false;
      after_body_sent(x);
      return;
    }
    if (res == -ETIMEDOUT && !x.rsp.head_seen && !x.up_send_inflight) {
      // TCP_USER_TIMEOUT / keepalive (net::upstream_socket): the request's
      // bytes went unacknowledged that long (a black-holed pooled
      // connection: it cannot have started), or the host stopped answering
      // keepalive probes (it is gone, and what it started with it): retried
      // elsewhere, before anything reached the client.
      x.up_request_sent = false;
    }
    // A timed-out socket is no stale pooled one: the backend is unreachable
    // or wedged; it counts as an attempt, and the retry walks on the ring.
    if (res == -ETIMEDOUT) u->reused = false;
    upstream_failed(x, !x.rsp.head_seen && u->buf.len == 0 ? errc::upstream_connect : errc::upstream_closed);
    return;
  }
  const uint32_t before = u->buf.len;
  u->buf.len += static_cast<uint32_t>(res);
  if (!x.rsp.head_seen) {
    http::parse_status st = x.rsp.parser.parse_head(u->buf.data, u->buf.len, x.rsp.head);
    if (st.need_more()) {
      if (u->buf.len >= u->buf.cap) {
        upstream_failed(x, errc::upstream_protocol);
        return;
      }
      submit_recv(x.up);
      return;
    }
    if (!st.ok()) {
      upstream_failed(x, errc::upstream_protocol);
      return;
    }
    on_response_head(x);
    return;
  }
  // Copy path: relay what arrived.
  relay(x, before, false);
}

void openai_http::upstream_failed(exchange& x, errc why) noexcept {
  if (x.rsp.client_done) {
    // The client has its whole answer (sluice ended it after [DONE]): the
    // backend's rest did not come in time, or not as it should. Nothing
    // failed for the client; the connection is closed, not pooled.
    x.rsp.reusable = false;
    x.rsp.complete = true;
    finish_exchange(x);
    return;
  }
  upstream_conn* u = x.up;
  bool stale = false;
  if (u != nullptr) {
    stale = u->reused;
    // A stale pooled socket says nothing about the backend's health.
    if (!stale || why != errc::upstream_connect) _x.report_outcome(u->backend, true);
    drop_attempt(x);
  }
  if (x.response_started) {
    // Something already reached the client: never retry, never fake an end.
    // Closing without the terminal chunk tells the client it was cut; a
    // Responses or Messages client is told in its own events instead.
    _metrics.at(metrics::stat::upstream_truncated).add();
    x.error_code = "upstream_truncated";
    if (renders(x) && x.req.is_stream && x.rsp.translated && end_failed_stream(x)) return;
    x.codec->fail(x);
    return;
  }
  const config::group_config& g = _cfg->groups[x.group];
  // Retried only while the backend cannot have started the request: the
  // connect failed, or the connection failed before the request was
  // written whole. A POST the backend may be running is never sent twice.
  const bool retryable = why == errc::upstream_connect && !x.up_request_sent;
  // A pooled connection the backend had just closed does not count as an
  // attempt: nothing was wrong with the backend.
  if (retryable && (stale || x.attempts < g.upstream.max_retries)) {
    if (!stale) {
      ++x.attempts;
      // The next attempt walks on along the key's ring.
      if (x.route_position < 64) x.tried_mask |= uint64_t{1} << x.route_position;
    }
    _metrics.at(metrics::stat::upstream_retries).add();
    if (x.up_send_inflight) {
      // Its send (shut down with the connection) completes soon; whether
      // it had written everything decides.
      x.after_up_send = after_upstream_send::retry_unless_sent;
      return;
    }
    start(x);
    return;
  }
  answer_upstream_failure(x, why);
}

void openai_http::answer_upstream_failure(exchange& x, errc why) noexcept {
  if (why == errc::upstream_connect && x.up_request_sent) {
    _metrics.at(metrics::stat::upstream_reset_after_send).add();
    x.codec->answer_error(x, 502, "The backend closed the connection before answering.", "server_error", {},
                 "upstream_reset", false);
  } else if (why == errc::upstream_timeout) {
    x.codec->answer_error(x, 504, "The backend did not answer in time.", "server_error", {}, "upstream_timeout", false);
  } else if (why == errc::upstream_protocol) {
    x.codec->answer_error(x, 502, "The backend sent an invalid response.", "server_error", {}, "bad_gateway", false);
  } else {
    x.codec->answer_error(x, 502, "The backend is unavailable.", "server_error", {}, "bad_gateway", false);
  }
}

}  // namespace sluice::proxy
