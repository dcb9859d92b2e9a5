// The scripted gRPC backend and the shard around the triton adapter (see
// triton_fixture.hpp), and the KServe v2 messages the tests write and read.
#include "triton_fixture.hpp"

#include <sys/ioctl.h>

#include <algorithm>
#include <cstring>

#include "sluice/grpc/wire.hpp"

namespace sluice::adapters_test {

namespace {

nghttp2_nv nv(std::string_view name, std::string_view value) {
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

grpc_peer& peer_of(void* user) { return *static_cast<grpc_peer*>(user); }

}  // namespace

std::string grpc_stream::field(std::string_view name) const {
  std::string found = "<absent>";
  int n = 0;
  for (const auto& [k, v] : fields) {
    if (k == name) {
      found = v;
      ++n;
    }
  }
  return n > 1 ? "<repeated>" : found;
}

// --- grpc_peer -------------------------------------------------------------------

grpc_peer::grpc_peer(scripted_backend& b, size_t c) : backend(b), conn(c) {
  nghttp2_session_callbacks* cbs = nullptr;
  REQUIRE(nghttp2_session_callbacks_new(&cbs) == 0);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &on_data_chunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &on_stream_close);
  const int rv = nghttp2_session_server_new(&_session, cbs, this);
  nghttp2_session_callbacks_del(cbs);
  REQUIRE(rv == 0);
  const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100}};
  REQUIRE(nghttp2_submit_settings(_session, NGHTTP2_FLAG_NONE, settings, 1) == 0);
  flush();
}

grpc_peer::~grpc_peer() { nghttp2_session_del(_session); }

bool grpc_peer::service() {
  if (_gone) return false;
  if (fd() < 0) {
    _gone = true;
    return false;
  }
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd(), buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      _gone = true;
      return false;
    }
    if (n < 0) break;  // EAGAIN: all that came is read
    const ssize_t used = nghttp2_session_mem_recv(_session, reinterpret_cast<const uint8_t*>(buf), static_cast<size_t>(n));
    CAPTURE(nghttp2_strerror(static_cast<int>(used)));
    REQUIRE(used == n);  // sluice speaks well-formed HTTP/2
  }
  flush();
  return !_gone;
}

bool grpc_peer::idle() const { return _gone || _pending.empty(); }

void grpc_peer::flush() {
  for (;;) {
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(_session, &data);
    REQUIRE(n >= 0);
    if (n == 0) break;
    _pending.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
  if (_gone || fd() < 0) {
    _pending.clear();
    return;
  }
  while (!_pending.empty()) {
    const ssize_t n = ::send(fd(), _pending.data(), _pending.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN) return;  // the rest with the next service()
      _gone = true;                 // EPIPE, ECONNRESET: sluice closed it
      _pending.clear();
      return;
    }
    _pending.erase(0, static_cast<size_t>(n));
  }
}

void grpc_peer::submit_head(grpc_stream& s) {
  if (s.head_sent) return;
  s.head_sent = true;
  const nghttp2_nv head[] = {nv(":status", "200"), nv("content-type", "application/grpc")};
  nghttp2_data_provider provider{};
  provider.source.ptr = &s;
  provider.read_callback = &read_answer;
  REQUIRE(nghttp2_submit_response(_session, s.id, head, 2, &provider) == 0);
}

void grpc_peer::wake(grpc_stream& s) {
  if (!s.deferred) return;
  s.deferred = false;
  REQUIRE(nghttp2_session_resume_data(_session, s.id) == 0);
}

void grpc_peer::head(int32_t id) {
  submit_head(stream(id));
  flush();
}

void grpc_peer::message(int32_t id, std::string_view framed) {
  grpc_stream& s = stream(id);
  submit_head(s);
  s.out.append(framed);
  wake(s);
  flush();
}

void grpc_peer::trailers(int32_t id, uint32_t grpc_status, std::string_view grpc_message) {
  grpc_stream& s = stream(id);
  submit_head(s);
  s.ending = true;
  s.status = std::to_string(grpc_status);
  s.message = std::string(grpc_message);
  wake(s);
  flush();
}

void grpc_peer::trailers_only(int32_t id, uint32_t grpc_status, std::string_view grpc_message) {
  grpc_stream& s = stream(id);
  REQUIRE_FALSE(s.head_sent);
  s.head_sent = true;
  const std::string code = std::to_string(grpc_status);
  const nghttp2_nv head[] = {nv(":status", "200"), nv("content-type", "application/grpc"), nv("grpc-status", code),
                             nv("grpc-message", grpc_message)};
  REQUIRE(nghttp2_submit_response(_session, id, head, grpc_message.empty() ? 3 : 4, nullptr) == 0);
  flush();
}

void grpc_peer::http_head(int32_t id, std::string_view status, bool end_stream) {
  grpc_stream& s = stream(id);
  REQUIRE_FALSE(s.head_sent);
  REQUIRE(end_stream);  // (a body after it is not needed here)
  s.head_sent = true;
  const nghttp2_nv head[] = {nv(":status", status), nv("content-type", "text/html")};
  REQUIRE(nghttp2_submit_response(_session, id, head, 2, nullptr) == 0);
  flush();
}

void grpc_peer::reset(int32_t id, uint32_t error_code) {
  REQUIRE(nghttp2_submit_rst_stream(_session, NGHTTP2_FLAG_NONE, id, error_code) == 0);
  flush();
}

int grpc_peer::on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                         const uint8_t* value, size_t valuelen, uint8_t, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  grpc_peer& p = peer_of(user);
  auto [it, fresh] = p.streams.try_emplace(frame->hd.stream_id);
  if (fresh) {
    it->second.id = frame->hd.stream_id;
    p.order.push_back(frame->hd.stream_id);
  }
  it->second.fields.emplace_back(std::string(reinterpret_cast<const char*>(name), namelen),
                                 std::string(reinterpret_cast<const char*>(value), valuelen));
  return 0;
}

int grpc_peer::on_data_chunk(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len, void* user) {
  auto it = peer_of(user).streams.find(id);
  if (it != peer_of(user).streams.end()) it->second.body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int grpc_peer::on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* user) {
  auto it = peer_of(user).streams.find(frame->hd.stream_id);
  if (it == peer_of(user).streams.end()) return 0;
  grpc_stream& s = it->second;
  if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
      (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    s.request_ended = true;
  }
  if (frame->hd.type == NGHTTP2_RST_STREAM) {
    s.reset_by_sluice = true;
    s.reset_code = frame->rst_stream.error_code;
  }
  return 0;
}

int grpc_peer::on_stream_close(nghttp2_session*, int32_t id, uint32_t, void* user) {
  auto it = peer_of(user).streams.find(id);
  if (it != peer_of(user).streams.end()) it->second.closed = true;
  return 0;
}

ssize_t grpc_peer::read_answer(nghttp2_session* session, int32_t id, uint8_t* buf, size_t length, uint32_t* flags,
                               nghttp2_data_source* source, void*) {
  auto* s = static_cast<grpc_stream*>(source->ptr);
  const size_t n = std::min(length, s->out.size() - s->out_sent);
  std::memcpy(buf, s->out.data() + s->out_sent, n);
  s->out_sent += n;
  if (s->out_sent < s->out.size()) return static_cast<ssize_t>(n);
  if (!s->ending) {
    if (n != 0) return static_cast<ssize_t>(n);
    s->deferred = true;  // message() or trailers() resumes it
    return NGHTTP2_ERR_DEFERRED;
  }
  // The end: the trailers carry END_STREAM, not this DATA frame.
  *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
  const nghttp2_nv trailers[] = {nv("grpc-status", s->status), nv("grpc-message", s->message)};
  if (nghttp2_submit_trailer(session, id, trailers, s->message.empty() ? 1 : 2) != 0) {
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return static_cast<ssize_t>(n);
}

// --- triton_shard ------------------------------------------------------------------

triton_shard::triton_shard(std::string_view groups, std::vector<bool> listening) {
  for (const bool l : listening) backends.push_back(std::make_unique<scripted_backend>(l));
  std::vector<std::string> urls;
  for (const auto& be : backends) urls.push_back("grpc://127.0.0.1:" + std::to_string(be->port));
  shard_parts parts = make_shard_parts(groups, "g", urls);
  config = std::move(parts.config);
  ring = std::move(parts.ring);
  registry = std::move(parts.registry);
  ctx = std::move(parts.ctx);
  triton = std::make_unique<proxy::triton_grpc>(*ctx, policy);
  fds_after_setup = open_fds();
}

triton_shard::~triton_shard() {
  // Whatever is still out is let go: sends dropped, streams released; the
  // peers go, every backend socket closes, which ends the receive each
  // connection keeps armed, and the turns run until each connection is
  // freed (its fd closed).
  for (auto& c : calls) c->codec.send_for = nullptr;
  for (auto& c : calls) {
    if (proxy::grpc_of(c->x).conn != nullptr) triton->release(c->x);
  }
  peers.clear();
  for (auto& b : backends) b->close_all();
  const int want = fds_after_setup - static_cast<int>(backends.size());
  CHECK(pump([&] { return open_fds() == want; }));
}

uint32_t triton_shard::backend_index(size_t i) const {
  const std::string url = "grpc://127.0.0.1:" + std::to_string(backends[i]->port);
  for (uint32_t k = 0; k < config->backends.size(); ++k) {
    if (config->backends[k].url == url) return k;
  }
  FAIL("no such backend");
  return 0;
}

call& triton_shard::start(std::string_view body, const call_options& o) {
  return start_call(calls, body, o, triton.get(), reader, ring->now_ms());
}

void triton_shard::complete_sends() { adapters_test::complete_sends(calls); }

void triton_shard::service_peers() {
  for (auto& b : backends) {
    if (b->listen_fd < 0) continue;
    while (b->try_accept()) peers.push_back(std::make_unique<grpc_peer>(*b, b->conns.size() - 1));
  }
  for (auto& p : peers) p->service();
}

bool triton_shard::settled() {
  for (auto& p : peers) {
    if (!p->idle()) return false;
  }
  for (auto& c : calls) {
    if (c->codec.send_for != nullptr) return false;
    const proxy::h2_conn* u = proxy::grpc_of(c->x).conn;
    if (u == nullptr || u->fd < 0) continue;
    int queued = 0;
    REQUIRE(::ioctl(u->fd, FIONREAD, &queued) == 0);
    if (queued != 0) return false;
  }
  return io_uring_cq_ready(ring->ring()) == 0;
}

grpc_request triton_shard::await_request() {
  grpc_request got;
  REQUIRE(pump([&] {
    for (auto& p : peers) {
      for (const int32_t id : p->order) {
        grpc_stream& s = p->stream(id);
        if (s.request_ended && !s.taken) {
          s.taken = true;
          got = {p.get(), id};
          return true;
        }
      }
    }
    return false;
  }));
  return got;
}

// --- the gRPC messages -------------------------------------------------------------

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_varint(out, uint64_t{field} << 3 | uint64_t(grpc::wire_type::len));
  put_varint(out, bytes.size());
  out += bytes;
}

std::string le32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string framed(const std::string& message) { return frame_header(static_cast<uint32_t>(message.size())) + message; }

}  // namespace

std::string frame_header(uint32_t bytes) {
  char header[grpc::k_frame_header_bytes];
  grpc::write_frame_header(header, bytes);
  return std::string(header, sizeof header);
}

std::string token_message(std::string_view text, std::string_view finish, int64_t input_tokens, int64_t output_tokens) {
  struct output {
    std::string_view name, datatype;
    std::string raw;
  };
  std::vector<output> outputs;
  outputs.push_back({"text_output", "BYTES", le32(static_cast<uint32_t>(text.size())) + std::string(text)});
  if (!finish.empty()) outputs.push_back({"finish_reason", "BYTES", le32(static_cast<uint32_t>(finish.size())) + std::string(finish)});
  if (input_tokens >= 0) outputs.push_back({"num_input_tokens", "UINT32", le32(static_cast<uint32_t>(input_tokens))});
  if (output_tokens >= 0) outputs.push_back({"num_output_tokens", "UINT32", le32(static_cast<uint32_t>(output_tokens))});
  // ModelInferResponse: model_name 1, id 3, outputs 5 (name 1, datatype 2,
  // shape 3), raw_output_contents 6 -- Triton's order.
  std::string inner;
  put_bytes(inner, 1, "tri-backend");
  put_bytes(inner, 3, "resp");
  for (const output& o : outputs) {
    std::string tensor;
    put_bytes(tensor, 1, o.name);
    put_bytes(tensor, 2, o.datatype);
    put_bytes(tensor, 3, std::string(1, '\x01'));  // shape [1], packed
    put_bytes(inner, 5, tensor);
  }
  for (const output& o : outputs) put_bytes(inner, 6, o.raw);
  std::string message;
  put_bytes(message, 2, inner);  // ModelStreamInferResponse.infer_response
  return framed(message);
}

std::string error_message(std::string_view text) {
  std::string message;
  put_bytes(message, 1, text);  // ModelStreamInferResponse.error_message
  return framed(message);
}

std::string infer_request_seen::bytes_input(const std::string& name) const {
  auto it = inputs.find(name);
  if (it == inputs.end() || it->second.size() < 4) return "<absent>";
  const std::string& raw = it->second;
  uint32_t n = 0;
  for (size_t i = 0; i < 4; ++i) n |= uint32_t{static_cast<unsigned char>(raw[i])} << (8 * i);
  if (n > raw.size() - 4) return "<absent>";
  return raw.substr(4, n);
}

bool infer_request_seen::bool_input(const std::string& name) const {
  auto it = inputs.find(name);
  return it != inputs.end() && !it->second.empty() && it->second[0] != 0;
}

bool read_infer_request(std::string_view bytes, infer_request_seen& out) {
  grpc::frame f;
  if (grpc::read_frame(bytes, 64u << 20, f) != grpc::decode_status::ok || f.consumed != bytes.size()) return false;
  // ModelInferRequest: model_name 1, id 3, inputs 5 (name 1),
  // raw_input_contents 7, paired with the inputs by index.
  std::vector<std::string> names, contents;
  grpc::wire_reader r(f.message);
  grpc::wire_field w;
  while (r.next(w)) {
    if (w.type != grpc::wire_type::len) continue;
    if (w.number == 1) out.model_name = std::string(w.bytes);
    if (w.number == 3) out.id = std::string(w.bytes);
    if (w.number == 7) contents.emplace_back(w.bytes);
    if (w.number == 5) {
      grpc::wire_reader t(w.bytes);
      grpc::wire_field tf;
      std::string name;
      while (t.next(tf)) {
        if (tf.number == 1 && tf.type == grpc::wire_type::len) name = std::string(tf.bytes);
      }
      if (t.status() != grpc::decode_status::ok) return false;
      names.push_back(name);
    }
  }
  if (r.status() != grpc::decode_status::ok || names.size() != contents.size()) return false;
  for (size_t i = 0; i < names.size(); ++i) out.inputs[names[i]] = contents[i];
  return true;
}

}  // namespace sluice::adapters_test
