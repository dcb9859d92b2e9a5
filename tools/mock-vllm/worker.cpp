#include "worker.hpp"

#include <arpa/inet.h>
#include <llhttp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>

#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "connection.hpp"

namespace mock_vllm {

namespace {

constexpr size_t k_read_size = 64 * 1024;
constexpr size_t k_input_max = 64 * 1024 * 1024;  // a client that never stops sending
constexpr size_t k_free_max = 4096;
constexpr int k_events_max = 512;
constexpr uint32_t k_read_events = EPOLLIN | EPOLLRDHUP;

}  // namespace


namespace {

using connection = worker::connection;

connection& owner(llhttp_t* p) { return *static_cast<connection*>(p->data); }

int on_message_begin(llhttp_t* p) {
  connection& c = owner(p);
  c.url.clear();
  c.headers.clear();
  c.body.clear();
  c.in_value = false;
  return 0;
}

int on_url(llhttp_t* p, const char* at, size_t n) {
  owner(p).url.append(at, n);
  return 0;
}

int on_header_field(llhttp_t* p, const char* at, size_t n) {
  connection& c = owner(p);
  if (c.in_value || c.headers.empty()) c.headers.emplace_back();
  c.in_value = false;
  c.headers.back().first.append(at, n);
  return 0;
}

int on_header_value(llhttp_t* p, const char* at, size_t n) {
  connection& c = owner(p);
  c.in_value = true;
  c.headers.back().second.append(at, n);
  return 0;
}

int on_headers_complete(llhttp_t* p) {
  connection& c = owner(p);
  const std::string* expect = find_header(c.headers, "expect");
  bool has_body = (p->flags & F_CHUNKED) != 0 || ((p->flags & F_CONTENT_LENGTH) != 0 && p->content_length > 0);
  if (expect != nullptr && iequals(*expect, "100-continue") && has_body) {
    c.out += status_line(100);
    c.out += "\r\n";
  }
  return 0;
}

int on_body(llhttp_t* p, const char* at, size_t n) {
  owner(p).body.append(at, n);
  return 0;
}

int on_message_complete(llhttp_t* p) {
  owner(p).request_ready = true;
  // Stop after each request: the next one (pipelined) waits until this
  // reply is complete, so replies go out in order.
  return HPE_PAUSED;
}

const llhttp_settings_t& parser_settings() {
  static const llhttp_settings_t settings = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_message_begin = on_message_begin;
    s.on_url = on_url;
    s.on_header_field = on_header_field;
    s.on_header_value = on_header_value;
    s.on_headers_complete = on_headers_complete;
    s.on_body = on_body;
    s.on_message_complete = on_message_complete;
    return s;
  }();
  return settings;
}

}  // namespace

int open_listener(const std::string& host, uint16_t port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    error = "cannot resolve " + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0 ||
      bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
    error = "cannot listen on " + host + ":" + service + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

worker::worker(const options& opts, shared_state& state, int listen_fd, unsigned index)
    : _opts(opts), _state(state), _listen_fd(listen_fd), _random(std::random_device{}() ^ index) {
  _epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  SLUICE_VERIFY(_epoll_fd >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = _listen_fd;
  SLUICE_VERIFY(epoll_ctl(_epoll_fd, EPOLL_CTL_ADD, _listen_fd, &ev) == 0);
  _interval_ns = opts.tokens_per_sec > 0 ? 1'000'000'000ull / opts.tokens_per_sec : 0;
  _ttft_ns = opts.ttft_ms * 1'000'000ull;
  _read_buffer.resize(k_read_size);
}

worker::~worker() {
  for (connection* c : _connections) {
    if (c != nullptr) {
      close(c->fd);
      delete c;
    }
  }
  for (connection* c : _free) delete c;
  close(_epoll_fd);
}

void worker::run() {
  epoll_event events[k_events_max];
  bool have_pwait2 = true;
  for (;;) {
    timespec timeout{};
    timespec* timeout_ptr = nullptr;
    if (!_timers.empty()) {
      uint64_t now = sluice::monotonic_ns();
      uint64_t due = _timers.top().due_ns;
      uint64_t wait_ns = due > now ? due - now : 0;
      timeout.tv_sec = static_cast<time_t>(wait_ns / 1'000'000'000ull);
      timeout.tv_nsec = static_cast<long>(wait_ns % 1'000'000'000ull);
      timeout_ptr = &timeout;
    }
    int n;
    if (have_pwait2) {
      // epoll_pwait2 (Linux 5.11): a nanosecond timeout keeps token pacing exact.
      n = epoll_pwait2(_epoll_fd, events, k_events_max, timeout_ptr, nullptr);
      if (n < 0 && errno == ENOSYS) {
        have_pwait2 = false;
        continue;
      }
    } else {
      int ms = -1;
      if (timeout_ptr != nullptr) {
        ms = static_cast<int>(timeout.tv_sec * 1000 + (timeout.tv_nsec + 999'999) / 1'000'000);
      }
      n = epoll_wait(_epoll_fd, events, k_events_max, ms);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    _now_ns = sluice::monotonic_ns();
    _date = _dates.at(time(nullptr));
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == _listen_fd) {
        accept_all();
        continue;
      }
      connection* c = static_cast<size_t>(fd) < _connections.size() ? _connections[static_cast<size_t>(fd)] : nullptr;
      if (c != nullptr && !c->dead) on_event(*c, events[i].events);
    }
    fire_timers();
    for (connection* c : _graveyard) {
      close(c->fd);
      _connections[static_cast<size_t>(c->fd)] = nullptr;
      if (_free.size() < k_free_max) {
        _free.push_back(c);
      } else {
        delete c;
      }
    }
    _graveyard.clear();
  }
}

void worker::accept_all() {
  for (;;) {
    int fd = accept4(_listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // EAGAIN: drained. EMFILE/ENFILE/ENOBUFS: the connection stays queued
      // and is retried on the next readiness of the listener.
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    connection* c;
    if (!_free.empty()) {
      c = _free.back();
      _free.pop_back();
    } else {
      c = new connection();
    }
    c->fd = fd;
    c->in.clear();
    c->in_parsed = 0;
    c->out.clear();
    c->out_sent = 0;
    c->request_ready = false;
    c->want_write = c->closing = c->dead = c->peer_eof = c->busy = c->waiting = c->blocked = false;
    c->timer_serial = 0;
    llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings());
    c->parser.data = c;
    if (static_cast<size_t>(fd) >= _connections.size()) _connections.resize(static_cast<size_t>(fd) + 1024, nullptr);
    _connections[static_cast<size_t>(fd)] = c;
    epoll_event ev{};
    ev.events = k_read_events;
    ev.data.fd = fd;
    if (epoll_ctl(_epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) destroy(*c);
  }
}

void worker::on_event(connection& c, uint32_t events) {
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) on_readable(c);
  if (!c.dead && (events & EPOLLOUT) != 0) flush(c);
}

void worker::on_readable(connection& c) {
  for (int i = 0; i < 4; ++i) {
    ssize_t n = recv(c.fd, _read_buffer.data(), _read_buffer.size(), 0);
    if (n > 0) {
      if (c.in.size() + static_cast<size_t>(n) > k_input_max) {
        destroy(c);
        return;
      }
      c.in.append(_read_buffer.data(), static_cast<size_t>(n));
      if (static_cast<size_t>(n) < _read_buffer.size()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.peer_eof = true;  // 0: the client closed (or half-closed); < 0: reset
    break;
  }
  process_input(c);
  if (c.dead) return;
  flush(c);
  if (c.dead) return;
  // Like uvicorn, EOF from the client ends the connection, and with it any
  // generation in progress (vLLM aborts the request).
  if (c.peer_eof) peer_gone(c);
}

void worker::process_input(connection& c) {
  while (!c.busy && !c.closing && !c.dead) {
    if (c.in_parsed >= c.in.size()) {
      c.in.clear();
      c.in_parsed = 0;
      return;
    }
    const char* start = c.in.data() + c.in_parsed;
    llhttp_errno_t err = llhttp_execute(&c.parser, start, c.in.size() - c.in_parsed);
    if (err == HPE_OK) {
      // Everything consumed; a partial request lives on in url/headers/body.
      c.in.clear();
      c.in_parsed = 0;
      return;
    }
    if (err == HPE_PAUSED && c.request_ready) {
      c.in_parsed = static_cast<size_t>(llhttp_get_error_pos(&c.parser) - c.in.data());
      llhttp_resume(&c.parser);
      c.request_ready = false;
      handle_request(c);
      continue;
    }
    append_invalid_http_response(c.out, _date);
    c.closing = true;
    c.in.clear();
    c.in_parsed = 0;
    return;
  }
}

void worker::handle_request(connection& c) {
  auto method = static_cast<llhttp_method_t>(c.parser.method);
  std::string_view method_name = llhttp_method_name(method);
  c.keep_alive = llhttp_should_keep_alive(&c.parser) != 0;
  c.close_header = false;
  for (const auto& h : c.headers) {
    if (iequals(h.first, "connection") && h.second == "close") c.close_header = true;
  }
  std::string_view path = c.url;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);

  if (path == "/debug/requests") {
    // Test hooks: neither recorded nor counted.
    if (method == HTTP_GET) {
      _scratch.clear();
      _state.log.append_json(_scratch);
      respond_json(c, 200, _scratch);
    } else if (method == HTTP_DELETE) {
      _state.log.clear();
      _state.reset_counters();
      respond_json(c, 200, "{\"cleared\":true}");
    } else {
      respond_json(c, 405, "{\"detail\":\"Method Not Allowed\"}", "allow: GET, DELETE\r\n");
    }
  } else {
    _state.requests_total.fetch_add(1, std::memory_order_relaxed);
    if (_opts.record) _state.log.record(method_name, c.url, c.headers, c.body);
    route(c, method_name, path);
  }
  if (!c.busy && !c.keep_alive) c.closing = true;
}

void worker::route(connection& c, std::string_view method, std::string_view path) {
  if (path == "/v1/messages") {
    // Anthropic's headers, checked before the route like vLLM's key is.
    const std::string* key = find_header(c.headers, "x-api-key");
    if (!_opts.api_key.empty() && (key == nullptr || *key != _opts.api_key)) {
      respond_anthropic_error(c, 401, "invalid x-api-key");
      return;
    }
    if (find_header(c.headers, "anthropic-version") == nullptr) {
      respond_anthropic_error(c, 400, "anthropic-version: header is required");
      return;
    }
  } else if (!_opts.api_key.empty() && path.starts_with("/v1")) {
    // vLLM's AuthenticationMiddleware: an exact "Bearer <key>" on /v1 paths.
    const std::string* auth = find_header(c.headers, "authorization");
    if (auth == nullptr || auth->size() != _opts.api_key.size() + 7 || !auth->starts_with("Bearer ") ||
        std::string_view(*auth).substr(7) != _opts.api_key) {
      respond_json(c, 401, "{\"error\":\"Unauthorized\"}");
      return;
    }
  }
  struct route_entry {
    std::string_view path;
    std::string_view method;
    std::string_view allow;
  };
  static constexpr route_entry routes[] = {
      {"/v1/chat/completions", "POST", "allow: POST\r\n"}, {"/v1/completions", "POST", "allow: POST\r\n"},
      {"/v1/embeddings", "POST", "allow: POST\r\n"},       {"/v1/models", "GET", "allow: GET\r\n"},
      {"/health", "GET", "allow: GET\r\n"},                {"/metrics", "GET", "allow: GET\r\n"},
      {"/v1/messages", "POST", "allow: POST\r\n"},         {"/v1/responses", "POST", "allow: POST\r\n"},
  };
  const route_entry* found = nullptr;
  for (const auto& r : routes) {
    if (r.path == path) found = &r;
  }
  if (found == nullptr) {
    respond_json(c, 404, "{\"detail\":\"Not Found\"}");
    return;
  }
  if (found->method != method) {
    respond_json(c, 405, "{\"detail\":\"Method Not Allowed\"}", found->allow);
    return;
  }
  if (path == "/v1/chat/completions") {
    start_generation(c, endpoint::chat);
  } else if (path == "/v1/completions") {
    start_generation(c, endpoint::completion);
  } else if (path == "/v1/embeddings") {
    start_generation(c, endpoint::embedding);
  } else if (path == "/v1/messages") {
    start_messages(c);
  } else if (path == "/v1/responses") {
    start_responses(c);
  } else if (path == "/v1/models") {
    int64_t created = _opts.created >= 0 ? _opts.created : time(nullptr);
    _error.clear();
    append_uuid_hex(_error);
    _scratch.clear();
    append_models_body(_scratch, _opts.model, created, _opts.max_model_len, _error);
    respond_json(c, 200, _scratch);
  } else if (path == "/health") {
    append_empty_response(c.out, _date, c.close_header);
  } else {
    _scratch.clear();
    _state.append_metrics(_scratch, _opts.model, _opts.kv_capacity);
    append_response(c.out, 200, _date, _scratch, "text/plain; version=0.0.4; charset=utf-8", c.close_header);
  }
}

void worker::start_generation(connection& c, endpoint kind) {
  // simdjson reads up to SIMDJSON_PADDING bytes past the end.
  c.body.reserve(c.body.size() + simdjson::SIMDJSON_PADDING);
  _error.clear();
  if (_opts.fail_status != 0) {
    respond_error(c, static_cast<int>(_opts.fail_status),
                  _opts.fail_status >= 500 ? "ServiceUnavailableError" : "BadRequestError",
                  "The engine cannot take requests right now (mock-vllm --fail-status).");
    return;
  }
  if (!make_plan(_json, c.body, kind, _opts.reply_tokens, _plan, _error)) {
    respond_error(c, 400, "BadRequestError", _error);
    return;
  }
  // vLLM: "<prefix>-" + the X-Request-Id header, else a random uuid4 hex.
  c.id.clear();
  c.id += kind == endpoint::chat ? "chatcmpl-" : kind == endpoint::completion ? "cmpl-" : "embd-";
  if (const std::string* rid = find_header(c.headers, "x-request-id")) {
    c.id += *rid;
  } else {
    append_uuid_hex(c.id);
  }
  c.created = _opts.created >= 0 ? _opts.created : time(nullptr);
  if (kind == endpoint::embedding) {
    _scratch.clear();
    append_embedding_body(_scratch, c.id, c.created, _opts.model, _plan.input_hashes, _plan.prompt_tokens);
    respond_json(c, 200, _scratch);
    return;
  }
  c.kind = kind;
  c.stream = _plan.stream;
  c.include_usage = _plan.include_usage;
  c.tokens = _plan.tokens;
  c.ends_by_length = _plan.ends_by_length;
  c.prompt_tokens = _plan.prompt_tokens;
  c.sent = 0;
  c.fail_after = fail_after_tokens(_opts, c.headers);
  c.role_sent = kind != endpoint::chat;  // completions have no role chunk
  c.busy = true;
  c.waiting = true;
  _state.waiting.fetch_add(1, std::memory_order_relaxed);
  if (c.stream) {
    // StreamingResponse sends its head at once; the data waits for prefill.
    append_stream_head(c.out, _date, c.close_header);
    c.prefix.clear();
    append_chunk_prefix(c.prefix, kind, c.id, c.created, _opts.model);
  }
  schedule(c);
}

void worker::advance(connection& c) {
  if (c.kind == endpoint::messages) {
    advance_messages(c);
    return;
  }
  if (c.kind == endpoint::responses) {
    advance_responses(c);
    return;
  }
  if (c.waiting) {
    c.waiting = false;
    _state.waiting.fetch_sub(1, std::memory_order_relaxed);
    _state.running.fetch_add(1, std::memory_order_relaxed);
  }
  if (c.stream && !c.role_sent) {
    append_role_event(c.out, _scratch, c.prefix);
    c.role_sent = true;
  }
  if (!generate(c)) return;  // a timer or the socket calls again (or it failed)
  usage_counts usage{c.prompt_tokens, c.tokens};
  if (c.stream) {
    if (!c.ends_by_length) append_stop_event(c.out, _scratch, c.kind, c.prefix);
    if (c.include_usage) append_usage_event(c.out, _scratch, c.prefix, usage);
    append_done_events(c.out);
  } else {
    _scratch.clear();
    if (c.kind == endpoint::chat) {
      append_chat_body(_scratch, c.id, c.created, _opts.model, c.tokens, c.ends_by_length, usage, _opts.token_pad);
    } else {
      append_completion_body(_scratch, c.id, c.created, _opts.model, c.tokens, c.ends_by_length, usage,
                             _opts.token_pad);
    }
    respond_json(c, 200, _scratch);
  }
  finish_generation(c);
}

void worker::emit_token(connection& c, uint32_t index) {
  if (!c.stream) return;
  switch (c.kind) {
    case endpoint::messages:
      if (c.tool_use) {
        append_json_delta_event(c.out, _scratch, index);
      } else {
        append_text_delta_event(c.out, _scratch, index, _opts.token_pad);
      }
      return;
    case endpoint::responses:
      append_output_text_delta_event(c.out, _scratch, c.id, index, _opts.token_pad, c.seq);
      return;
    default:
      append_token_event(c.out, _scratch, c.kind, c.prefix, index, c.ends_by_length && index + 1 == c.tokens,
                         _opts.token_pad);
  }
}

bool worker::generate(connection& c) {
  // Token k is due at first_token + k * interval; a late loop catches up.
  while (c.sent < c.tokens) {
    emit_token(c, c.sent);
    ++c.sent;
    if (c.fail_after != 0 && c.sent == c.fail_after && c.sent < c.tokens) {
      fail_connection(c);
      return false;
    }
    if (c.sent < c.tokens && _interval_ns != 0) {
      uint64_t due = c.first_token_ns + c.sent * _interval_ns;
      if (due > _now_ns) {
        arm_timer(c, due);
        return false;
      }
    }
    if (c.sent < c.tokens && _interval_ns == 0 && c.out.size() - c.out_sent > k_output_high) {
      c.blocked = true;  // flush() resumes once the socket took it all
      return false;
    }
  }
  return true;
}

void worker::schedule(connection& c) {
  if (_opts.max_running != 0 && _slots_used >= _opts.max_running) {
    c.queued = true;
    c.queue_serial = _next_serial++;
    _slot_queue.emplace_back(c.fd, c.queue_serial);
    return;
  }
  ++_slots_used;
  c.has_slot = true;
  c.first_token_ns = _now_ns + _ttft_ns;
  if (_ttft_ns == 0) {
    advance(c);
  } else {
    arm_timer(c, c.first_token_ns);
  }
}

void worker::release_slot(connection& c) {
  c.queued = false;  // a waiter that leaves is skipped when its entry comes up
  if (!c.has_slot) return;
  c.has_slot = false;
  --_slots_used;
  while (!_slot_queue.empty() && _slots_used < _opts.max_running) {
    const auto [fd, serial] = _slot_queue.front();
    _slot_queue.pop_front();
    connection* n = static_cast<size_t>(fd) < _connections.size() ? _connections[static_cast<size_t>(fd)] : nullptr;
    if (n == nullptr || n->dead || !n->queued || n->queue_serial != serial) continue;
    n->queued = false;
    schedule(*n);
  }
}

void worker::finish_generation(connection& c) {
  _state.running.fetch_sub(1, std::memory_order_relaxed);
  c.busy = false;
  c.timer_serial = 0;
  release_slot(c);
  if (!c.keep_alive) c.closing = true;
}

void worker::fail_connection(connection& c) {
  // A backend that dies mid-generation: what was produced goes out, then
  // the connection closes with no terminal chunk. Anthropic's API says why
  // in an error event first.
  if (c.kind == endpoint::messages && c.stream) {
    append_stream_error_event(c.out, _scratch, "overloaded_error", "Overloaded (mock-vllm --fail-after-tokens)");
  }
  _state.running.fetch_sub(1, std::memory_order_relaxed);
  _state.failures_total.fetch_add(1, std::memory_order_relaxed);
  c.busy = false;
  release_slot(c);
  c.closing = true;
}

void worker::arm_timer(connection& c, uint64_t due_ns) {
  c.timer_serial = _next_serial++;
  _timers.push(timer_entry{due_ns, c.fd, c.timer_serial});
}

void worker::fire_timers() {
  _now_ns = sluice::monotonic_ns();
  while (!_timers.empty() && _timers.top().due_ns <= _now_ns) {
    timer_entry t = _timers.top();
    _timers.pop();
    connection* c = static_cast<size_t>(t.fd) < _connections.size() ? _connections[static_cast<size_t>(t.fd)] : nullptr;
    if (c == nullptr || c->dead || !c->busy || c->timer_serial != t.serial) continue;
    c->timer_serial = 0;
    advance(*c);
    if (!c->busy) process_input(*c);  // a pipelined request may be waiting
    if (!c->dead) flush(*c);
  }
}

void worker::flush(connection& c) {
  for (int rounds = 0;; ++rounds) {
    while (c.out_sent < c.out.size()) {
      ssize_t n = send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        set_write_interest(c, true);
        return;
      }
      peer_gone(c);  // EPIPE, ECONNRESET: the client is gone
      return;
    }
    c.out.clear();
    c.out_sent = 0;
    if (!c.blocked || !c.busy) break;
    if (rounds == 8) {
      // A fast reader of a long reply: let the other connections of this
      // loop have a turn; the socket's writability brings us back.
      set_write_interest(c, true);
      return;
    }
    // The socket took everything: produce the next part of the reply.
    c.blocked = false;
    advance(c);
    if (!c.busy) process_input(c);  // a pipelined request may be waiting
    if (c.dead) return;
  }
  if (c.want_write) set_write_interest(c, false);
  if (c.closing) destroy(c);
}

void worker::peer_gone(connection& c) {
  if (c.busy) {
    if (c.waiting) {
      _state.waiting.fetch_sub(1, std::memory_order_relaxed);
    } else {
      _state.running.fetch_sub(1, std::memory_order_relaxed);
    }
    _state.aborts_total.fetch_add(1, std::memory_order_relaxed);
    c.busy = false;
    release_slot(c);
    _line.clear();
    _line += "abort request_id=";
    _line += c.id;
    _line += " tokens=";
    append_uint(_line, c.sent);
    _line += '\n';
    // One write(2) per line keeps lines of several loops from interleaving.
    [[maybe_unused]] ssize_t ignored = write(STDOUT_FILENO, _line.data(), _line.size());
  }
  destroy(c);
}

void worker::destroy(connection& c) {
  if (c.dead) return;
  if (c.busy) {
    // Dropped while generating for a reason other than the client (input
    // overflow): keep the gauges right.
    if (c.waiting) {
      _state.waiting.fetch_sub(1, std::memory_order_relaxed);
    } else {
      _state.running.fetch_sub(1, std::memory_order_relaxed);
    }
    c.busy = false;
    release_slot(c);
  }
  c.dead = true;
  epoll_ctl(_epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  _graveyard.push_back(&c);
}

void worker::set_write_interest(connection& c, bool on) {
  if (c.want_write == on) return;
  c.want_write = on;
  epoll_event ev{};
  ev.events = on ? (k_read_events | EPOLLOUT) : k_read_events;
  ev.data.fd = c.fd;
  epoll_ctl(_epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
}

void worker::respond_json(connection& c, int status, std::string_view body, std::string_view extra_headers) {
  append_response(c.out, status, _date, body, "application/json", c.close_header, extra_headers);
}

void worker::respond_error(connection& c, int status, std::string_view type, std::string_view message) {
  _scratch.clear();
  append_error_body(_scratch, _opts.errors, status, type, message);
  respond_json(c, status, _scratch);
}

void worker::append_uuid_hex(std::string& out) {
  // uuid.uuid4().hex: 32 lowercase hex digits, version 4, RFC 4122 variant.
  uint64_t hi = (_random() & ~0xf000ull) | 0x4000ull;
  uint64_t lo = (_random() & ~(3ull << 62)) | (2ull << 62);
  static constexpr char hex[] = "0123456789abcdef";
  char buf[32];
  for (int i = 0; i < 16; ++i) {
    buf[i] = hex[(hi >> (60 - 4 * i)) & 15];
    buf[16 + i] = hex[(lo >> (60 - 4 * i)) & 15];
  }
  out.append(buf, sizeof buf);
}

}  // namespace mock_vllm
