#include "server.hpp"

#include <nghttp2/nghttp2.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "codec.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/grpc/wire.hpp"
#include "wire.hpp"  // mock-vllm's append_uint

namespace mock_triton {

namespace {

constexpr size_t k_read_size = 64 * 1024;
constexpr int k_events_max = 256;
constexpr uint32_t k_read_events = EPOLLIN | EPOLLRDHUP;
constexpr uint32_t k_message_bytes_max = 64 * 1024 * 1024;
// Stop asking nghttp2 for frames while this much waits for the socket: a
// slow reader holds back the sessions' output, not our memory.
constexpr size_t k_output_high = 1024 * 1024;

constexpr std::string_view k_service = "/inference.GRPCInferenceService/";

}  // namespace

// Connection-local. One per HTTP/2 stream, from its request HEADERS until
// nghttp2 closes it (or the connection goes).
struct server::stream {
  int32_t id = 0;
  std::string path;
  std::string in;  // the request's gRPC bytes; not appended to once decoded
  bool dispatched = false;
  bool request_ended = false;

  // The response: headers once, then `body` through the data provider.
  bool head_sent = false;
  std::string body;
  size_t body_sent = 0;
  bool body_done = false;  // no more body: the provider ends with the trailers
  bool deferred = false;   // the provider returned NGHTTP2_ERR_DEFERRED
  uint32_t grpc_status = 0;
  std::string grpc_message;
  bool finished = false;  // trailers submitted (or Trailers-Only sent)

  // ModelStreamInfer in progress.
  bool generating = false;
  infer_request request;
  stream_plan plan;
  std::string request_id;
  std::string model_name;
  std::string model_version;
  uint32_t sent = 0;
  uint64_t first_token_ns = 0;
  uint64_t timer_serial = 0;
};

// Loop-local. One per accepted socket, from accept until close.
struct server::connection {
  server* owner = nullptr;
  uint64_t serial = 0;
  int fd = -1;
  nghttp2_session* session = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<stream>> streams;
  std::string out;  // serialized frames not yet taken by the socket
  size_t out_sent = 0;
  bool want_write = false;
  bool dead = false;
};

namespace {

using connection = server::connection;
using stream = server::stream;

connection& conn_of(void* user_data) { return *static_cast<connection*>(user_data); }

stream* stream_of(nghttp2_session* session, int32_t id) {
  return static_cast<stream*>(nghttp2_session_get_stream_user_data(session, id));
}

int on_begin_headers(nghttp2_session* session, const nghttp2_frame* frame, void* user_data) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  connection& c = conn_of(user_data);
  auto s = std::make_unique<stream>();
  s->id = frame->hd.stream_id;
  nghttp2_session_set_stream_user_data(session, s->id, s.get());
  c.streams[s->id] = std::move(s);
  return 0;
}

int on_header(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
              const uint8_t* value, size_t valuelen, uint8_t, void*) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  stream* s = stream_of(session, frame->hd.stream_id);
  if (s == nullptr) return 0;
  std::string_view n(reinterpret_cast<const char*>(name), namelen);
  if (n == ":path") s->path.assign(reinterpret_cast<const char*>(value), valuelen);
  return 0;
}

int on_frame_recv(nghttp2_session* session, const nghttp2_frame* frame, void* user_data) {
  connection& c = conn_of(user_data);
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  stream* s = stream_of(session, frame->hd.stream_id);
  if (s == nullptr) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    c.owner->on_request_headers(c, *s);
  }
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0 && !s->request_ended) {
    s->request_ended = true;
    c.owner->on_request_end(c, *s);
  }
  return 0;
}

int on_data_chunk(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                  void* user_data) {
  connection& c = conn_of(user_data);
  stream* s = stream_of(session, stream_id);
  if (s == nullptr || s->dispatched) return 0;  // a second message is ignored
  if (s->in.size() + len > k_message_bytes_max + sluice::grpc::k_frame_header_bytes) {
    return NGHTTP2_ERR_CALLBACK_FAILURE;  // a client that never stops sending
  }
  s->in.append(reinterpret_cast<const char*>(data), len);
  c.owner->on_request_data(c, *s);
  return 0;
}

int on_stream_close(nghttp2_session* session, int32_t stream_id, uint32_t, void* user_data) {
  connection& c = conn_of(user_data);
  stream* s = stream_of(session, stream_id);
  if (s != nullptr) c.owner->on_stream_closed(c, *s);
  return 0;
}

ssize_t read_body(nghttp2_session* session, int32_t stream_id, uint8_t* buf, size_t length,
                  uint32_t* data_flags, nghttp2_data_source* source, void*) {
  auto* s = static_cast<stream*>(source->ptr);
  size_t n = std::min(length, s->body.size() - s->body_sent);
  std::memcpy(buf, s->body.data() + s->body_sent, n);
  s->body_sent += n;
  if (s->body_sent == s->body.size()) {
    s->body.clear();
    s->body_sent = 0;
    if (!s->body_done) {
      if (n > 0) return static_cast<ssize_t>(n);
      s->deferred = true;  // wake() resumes it when more is produced
      return NGHTTP2_ERR_DEFERRED;
    }
    // The end: the trailers carry END_STREAM, not this DATA frame.
    *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    std::string status;
    mock_vllm::append_uint(status, s->grpc_status);
    std::string message = percent_encode(s->grpc_message);
    nghttp2_nv trailers[2] = {
        {const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>("grpc-status")),
         reinterpret_cast<uint8_t*>(status.data()), 11, status.size(), NGHTTP2_NV_FLAG_NONE},
        {const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>("grpc-message")),
         reinterpret_cast<uint8_t*>(message.data()), 12, message.size(), NGHTTP2_NV_FLAG_NONE},
    };
    nghttp2_submit_trailer(session, stream_id, trailers, message.empty() ? 1 : 2);
    s->finished = true;
  }
  return static_cast<ssize_t>(n);
}

nghttp2_session_callbacks* callbacks() {
  static nghttp2_session_callbacks* cbs = [] {
    nghttp2_session_callbacks* c = nullptr;
    SLUICE_VERIFY(nghttp2_session_callbacks_new(&c) == 0);
    nghttp2_session_callbacks_set_on_begin_headers_callback(c, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(c, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(c, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(c, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(c, on_stream_close);
    return c;
  }();
  return cbs;
}

nghttp2_nv header(std::string_view name, std::string_view value) {
  return {const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(name.data())),
          const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

}  // namespace

server::server(const options& opts, int listen_fd) : _opts(opts), _listen_fd(listen_fd) {
  _epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  SLUICE_VERIFY(_epoll_fd >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // serial 0: the listener
  SLUICE_VERIFY(epoll_ctl(_epoll_fd, EPOLL_CTL_ADD, _listen_fd, &ev) == 0);
  _interval_ns = opts.tokens_per_sec > 0 ? 1'000'000'000ull / opts.tokens_per_sec : 0;
  _ttft_ns = opts.ttft_ms * 1'000'000ull;
  _read_buffer.resize(k_read_size);
}

server::~server() {
  for (auto& [serial, c] : _connections) {
    nghttp2_session_del(c->session);
    close(c->fd);
  }
  close(_epoll_fd);
}

void server::run() {
  epoll_event events[k_events_max];
  for (;;) {
    int timeout_ms = -1;
    if (!_timers.empty()) {
      uint64_t now = sluice::monotonic_ns();
      uint64_t due = _timers.top().due_ns;
      timeout_ms = due > now ? static_cast<int>((due - now + 999'999) / 1'000'000) : 0;
    }
    int n = epoll_wait(_epoll_fd, events, k_events_max, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    _now_ns = sluice::monotonic_ns();
    for (int i = 0; i < n; ++i) {
      uint64_t serial = events[i].data.u64;
      if (serial == 0) {
        accept_all();
        continue;
      }
      auto it = _connections.find(serial);
      if (it == _connections.end() || it->second->dead) continue;
      connection& c = *it->second;
      if ((events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) on_readable(c);
      if (!c.dead) flush(c);
    }
    fire_timers();
    for (uint64_t serial : _graveyard) {
      auto it = _connections.find(serial);
      if (it == _connections.end()) continue;
      nghttp2_session_del(it->second->session);
      close(it->second->fd);
      _connections.erase(it);
    }
    _graveyard.clear();
  }
}

void server::accept_all() {
  for (;;) {
    int fd = accept4(_listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: drained; EMFILE & co: retried on the next readiness
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<connection>();
    c->owner = this;
    c->serial = _next_serial++;
    c->fd = fd;
    if (nghttp2_session_server_new(&c->session, callbacks(), c.get()) != 0) {
      close(fd);
      continue;
    }
    // The gateway multiplexes many requests on one connection.
    nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100000}};
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 1);
    epoll_event ev{};
    ev.events = k_read_events;
    ev.data.u64 = c->serial;
    if (epoll_ctl(_epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      nghttp2_session_del(c->session);
      close(fd);
      continue;
    }
    connection& ref = *c;
    _connections[c->serial] = std::move(c);
    flush(ref);  // our SETTINGS
  }
}

void server::on_readable(connection& c) {
  for (int round = 0; round < 8; ++round) {
    ssize_t n = recv(c.fd, _read_buffer.data(), _read_buffer.size(), 0);
    if (n > 0) {
      ssize_t used = nghttp2_session_mem_recv(c.session, reinterpret_cast<const uint8_t*>(_read_buffer.data()),
                                              static_cast<size_t>(n));
      if (used < 0) {
        destroy(c);  // not HTTP/2 (or a protocol error nghttp2 could not answer)
        return;
      }
      if (c.dead) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    destroy(c);  // 0: the client closed; < 0: reset
    return;
  }
}

void server::flush(connection& c) {
  for (;;) {
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
      destroy(c);
      return;
    }
    c.out.clear();
    c.out_sent = 0;
    // nghttp2 hands out frames as flow control allows; the loop ends when
    // it has none (or the socket is full).
    while (c.out.size() < k_output_high) {
      const uint8_t* data = nullptr;
      ssize_t n = nghttp2_session_mem_send(c.session, &data);
      if (n < 0) {
        destroy(c);
        return;
      }
      if (n == 0) break;
      c.out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (c.dead) return;
    if (c.out.empty()) break;
  }
  set_write_interest(c, false);
  if (nghttp2_session_want_read(c.session) == 0 && nghttp2_session_want_write(c.session) == 0) destroy(c);
}

void server::destroy(connection& c) {
  if (c.dead) return;
  c.dead = true;
  // The client went with streams still producing: each is an abort.
  for (auto& [id, s] : c.streams) {
    if (s->generating && !s->finished) {
      std::string line = "abort id=" + s->request_id + " tokens=";
      mock_vllm::append_uint(line, s->sent);
      print_line(line);
    }
    s->generating = false;
  }
  epoll_ctl(_epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  _graveyard.push_back(c.serial);
}

void server::set_write_interest(connection& c, bool on) {
  if (c.want_write == on) return;
  c.want_write = on;
  epoll_event ev{};
  ev.events = on ? (k_read_events | EPOLLOUT) : k_read_events;
  ev.data.u64 = c.serial;
  epoll_ctl(_epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
}

void server::print_line(const std::string& line) {
  std::string text = line + '\n';
  // One write(2) per line: a test reading stdout never sees half a line.
  [[maybe_unused]] ssize_t ignored = write(STDOUT_FILENO, text.data(), text.size());
}

void server::on_request_headers(connection& c, stream& s) {
  if (!s.path.starts_with(k_service)) {
    submit_trailers_only(c, s, 12, "unknown service");
    return;
  }
  std::string_view method = std::string_view(s.path).substr(k_service.size());
  if (method != "ServerLive" && method != "ServerReady" && method != "ModelReady" && method != "ModelStreamInfer") {
    submit_trailers_only(c, s, 12, "unknown method " + std::string(method));
    return;
  }
  if (method == "ModelStreamInfer" && _opts.fail_status != 0) {
    submit_trailers_only(c, s, _opts.fail_status, "mock-triton --fail-status");
  }
}

void server::on_request_data(connection& c, stream& s) {
  if (s.finished || s.dispatched || !s.path.ends_with("/ModelStreamInfer")) return;
  sluice::grpc::frame f;
  if (sluice::grpc::read_frame(s.in, k_message_bytes_max, f) == sluice::grpc::decode_status::need_more) return;
  start_infer(c, s);
}

void server::on_request_end(connection& c, stream& s) {
  if (s.finished || s.dispatched) return;
  if (s.path.ends_with("/ModelStreamInfer")) {
    start_infer(c, s);  // ended before one whole message: refused there
  } else {
    respond_unary(c, s);
  }
}

void server::on_stream_closed(connection& c, stream& s) {
  if (s.generating && !s.finished) {
    // RST_STREAM from the client (a cancelled call) before our trailers.
    std::string line = "abort id=" + s.request_id + " tokens=";
    mock_vllm::append_uint(line, s.sent);
    print_line(line);
  }
  nghttp2_session_set_stream_user_data(c.session, s.id, nullptr);
  c.streams.erase(s.id);  // destroys `s`; stale timers find nothing
}

void server::submit_head(connection& c, stream& s) {
  if (s.head_sent) return;
  s.head_sent = true;
  nghttp2_nv head[] = {header(":status", "200"), header("content-type", "application/grpc")};
  nghttp2_data_provider provider{};
  provider.source.ptr = &s;
  provider.read_callback = read_body;
  nghttp2_submit_response(c.session, s.id, head, 2, &provider);
}

void server::submit_trailers_only(connection& c, stream& s, uint32_t status, std::string_view message) {
  // PROTOCOL-HTTP2.md's Trailers-Only: one HEADERS with END_STREAM.
  s.dispatched = true;
  s.finished = true;
  s.head_sent = true;
  std::string code;
  mock_vllm::append_uint(code, status);
  std::string text = percent_encode(message);
  nghttp2_nv head[] = {header(":status", "200"), header("content-type", "application/grpc"),
                       header("grpc-status", code), header("grpc-message", text)};
  nghttp2_submit_response(c.session, s.id, head, 4, nullptr);
}

void server::end_body(connection& c, stream& s, uint32_t status, std::string_view message) {
  s.body_done = true;
  s.grpc_status = status;
  s.grpc_message.assign(message);
  wake(c, s);
}

void server::wake(connection& c, stream& s) {
  submit_head(c, s);
  if (s.deferred) {
    s.deferred = false;
    nghttp2_session_resume_data(c.session, s.id);
  }
}

void server::respond_unary(connection& c, stream& s) {
  s.dispatched = true;
  sluice::grpc::frame f;
  auto status = sluice::grpc::read_frame(s.in, k_message_bytes_max, f);
  if (status != sluice::grpc::decode_status::ok) {
    submit_trailers_only(c, s, 13, sluice::grpc::describe(status));
    return;
  }
  // ServerLiveResponse{bool live = 1} has ServerReadyResponse's bytes; a
  // server that is not ready is still live.
  bool ready = s.path.ends_with("/ServerLive") || !_opts.not_ready;
  if (s.path.ends_with("/ModelReady")) {
    std::string_view name, version;
    if (decode_model_ready_request(f.message, name, version) != sluice::grpc::decode_status::ok) {
      submit_trailers_only(c, s, 3, "malformed ModelReadyRequest");
      return;
    }
    ready = ready && name == _opts.model;
  }
  append_ready_response(s.body, ready);
  end_body(c, s, 0, {});
}

void server::start_infer(connection& c, stream& s) {
  s.dispatched = true;
  sluice::grpc::frame f;
  auto status = sluice::grpc::read_frame(s.in, k_message_bytes_max, f);
  if (status != sluice::grpc::decode_status::ok) {
    submit_trailers_only(c, s, status == sluice::grpc::decode_status::need_more ? 3 : 13,
                         status == sluice::grpc::decode_status::need_more ? "the stream ended before a request"
                                                                          : sluice::grpc::describe(status));
    return;
  }
  if (decode_infer_request(f.message, s.request) != sluice::grpc::decode_status::ok) {
    submit_trailers_only(c, s, 3, "malformed ModelInferRequest");
    return;
  }
  s.request_id.assign(s.request.id);
  s.model_name.assign(s.request.model_name);
  s.model_version.assign(s.request.model_version.empty() ? std::string_view("1") : s.request.model_version);
  std::string error;
  bool planned = make_stream_plan(_json, s.request, _opts.reply_tokens, s.plan, error);
  std::string line = "request id=" + s.request_id + " model=" + s.model_name + " flavour=" +
                     std::string(flavour_name(s.plan.kind)) + " prompt_tokens=";
  mock_vllm::append_uint(line, s.plan.prompt_tokens);
  print_line(line);
  if (s.model_name != _opts.model) {
    error = "Request for unknown model: '" + s.model_name + "' is not found";
    planned = false;
  }
  if (!planned) {
    // Triton reports a request's error in the stream; the call succeeds.
    append_error_response(s.body, error);
    end_body(c, s, 0, {});
    return;
  }
  s.generating = true;
  s.sent = 0;
  s.first_token_ns = _now_ns + _ttft_ns;
  submit_head(c, s);
  if (_ttft_ns == 0) {
    produce(c, s);
  } else {
    arm_timer(c, s, s.first_token_ns);
  }
}

void server::produce(connection& c, stream& s) {
  response_head head{s.model_name, s.model_version, s.request_id, s.request.empty_final_response, false};
  uint32_t total = responses(s.plan);
  // Response k is due at first_token + k * interval; a late loop catches up.
  while (s.sent < total) {
    append_token_response(s.body, s.plan, head, s.sent, _opts.token_pad);
    ++s.sent;
    if (_opts.fail_after_tokens != 0 && s.sent == _opts.fail_after_tokens && s.sent < total) {
      if (_opts.fail == fail_mode::message) {
        append_error_response(s.body, "mock-triton --fail-after-tokens: the model failed mid-generation");
        end_body(c, s, 0, {});
      } else {
        end_body(c, s, 13, "mock-triton --fail-after-tokens: the model failed mid-generation");
      }
      s.generating = false;
      return;
    }
    if (s.sent < total && _interval_ns != 0) {
      uint64_t due = s.first_token_ns + s.sent * _interval_ns;
      if (due > _now_ns) {
        wake(c, s);
        arm_timer(c, s, due);
        return;
      }
    }
  }
  if (s.request.empty_final_response) append_empty_final_response(s.body, head);
  s.generating = false;
  end_body(c, s, 0, {});
}

void server::arm_timer(connection& c, stream& s, uint64_t due_ns) {
  s.timer_serial = _next_serial++;
  _timers.push(timer_entry{due_ns, c.serial, s.id, s.timer_serial});
}

void server::fire_timers() {
  _now_ns = sluice::monotonic_ns();
  while (!_timers.empty() && _timers.top().due_ns <= _now_ns) {
    timer_entry t = _timers.top();
    _timers.pop();
    auto it = _connections.find(t.connection_serial);
    if (it == _connections.end() || it->second->dead) continue;
    connection& c = *it->second;
    auto st = c.streams.find(t.stream_id);
    if (st == c.streams.end() || st->second->timer_serial != t.serial || !st->second->generating) continue;
    st->second->timer_serial = 0;
    produce(c, *st->second);
    if (!c.dead) flush(c);
  }
}

}  // namespace mock_triton
