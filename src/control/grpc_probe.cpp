// control: the grpc:// health probe's HTTP/2 session (see grpc_probe.hpp).
// gRPC over HTTP/2 (grpc/grpc PROTOCOL-HTTP2.md): a POST with
// content-type application/grpc and te: trailers; the answer is HEADERS,
// DATA holding length-prefixed messages, then trailers with grpc-status --
// or, for an error, Trailers-Only: grpc-status in the one HEADERS frame.
#include "grpc_probe.hpp"


#include <charconv>
#include <cstring>

#include "sluice/grpc/h2_client.hpp"
#include "sluice/grpc/kserve.hpp"

namespace sluice::control {
namespace {

constexpr std::string_view k_server_ready_path = "/inference.GRPCInferenceService/ServerReady";
constexpr std::string_view k_model_ready_path = "/inference.GRPCInferenceService/ModelReady";

// A small non-negative decimal; -1 for anything else.
int parse_status(std::string_view v) noexcept {
  int n = 0;
  if (v.empty() || v.size() > 6) return -1;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || end != v.data() + v.size() || n < 0) return -1;
  return n;
}

}  // namespace

void grpc_ready_probe::set_target(std::string_view authority, std::string_view model, uint32_t timeout_ms) {
  _authority.assign(authority);
  _model.assign(model);
  // grpc-timeout: at most 8 digits, then the unit; the probe's own timeout,
  // so a server may give up when sluice does.
  _grpc_timeout_len = grpc::write_timeout(_grpc_timeout, timeout_ms);
}

bool grpc_ready_probe::begin() noexcept {
  end();
  _calls[0] = call{};
  _calls[1] = call{};
  _current = 0;
  _received = 0;
  _outcome = outcome::pending;
  _why = {};
  _why_call = {};

  nghttp2_session_callbacks* cbs = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0) {
    decide(outcome::failed, "out of memory");
    return false;
  }
  nghttp2_session_callbacks_set_on_header_callback(cbs, &on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &on_stream_close);
  nghttp2_option* opt = grpc::new_client_options(false);
  if (opt == nullptr) {
    nghttp2_session_callbacks_del(cbs);
    decide(outcome::failed, "out of memory");
    return false;
  }
  const int rv = nghttp2_session_client_new2(&_session, cbs, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    _session = nullptr;
    decide(outcome::failed, "out of memory");
    return false;
  }
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 0},  // the server opens none
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 8192},
  };
  if (nghttp2_submit_settings(_session, NGHTTP2_FLAG_NONE, settings, std::size(settings)) != 0) {
    decide(outcome::failed, "out of memory");
    return false;
  }
  const size_t n = grpc::encode_server_ready_frame(_server_frame, sizeof _server_frame);
  return submit(_calls[0], k_server_ready_path, _server_frame, n);
}

bool grpc_ready_probe::submit(call& c, std::string_view path, const char* request, size_t request_len) noexcept {
  c.request = request;
  c.request_len = request_len;
  nghttp2_nv nva[grpc::k_call_head_fields_max];
  const size_t fields = grpc::call_head(nva, path, _authority, "sluice-health",
                                        std::string_view(_grpc_timeout, _grpc_timeout_len), false);
  nghttp2_data_provider body;
  body.source.ptr = &c;
  body.read_callback = &read_request;
  const int32_t id = nghttp2_submit_request(_session, nullptr, nva, fields, &body, &c);
  if (id < 0) {
    decide(outcome::failed, "out of memory");
    return false;
  }
  c.stream_id = id;
  return true;
}

ssize_t grpc_ready_probe::read_request(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* data_flags,
                                       nghttp2_data_source* source, void*) {
  call& c = *static_cast<call*>(source->ptr);
  size_t n = c.request_len - c.request_sent;
  if (n > length) n = length;
  std::memcpy(buf, c.request + c.request_sent, n);
  c.request_sent += n;
  if (c.request_sent == c.request_len) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

grpc_ready_probe::call* grpc_ready_probe::find(int32_t stream_id) noexcept {
  for (call& c : _calls) {
    if (c.stream_id == stream_id) return &c;
  }
  return nullptr;
}

int grpc_ready_probe::on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                                const uint8_t* value, size_t valuelen, uint8_t, void* user_data) {
  auto& self = *static_cast<grpc_ready_probe*>(user_data);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  call* c = self.find(frame->hd.stream_id);
  if (c == nullptr) return 0;
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  // Headers and trailers alike: grpc-status may come in either
  // (Trailers-Only puts it in the response headers).
  if (n == ":status") {
    c->http_status = parse_status(v);
  } else if (n == "grpc-status") {
    c->grpc_status = parse_status(v);
  }
  return 0;
}

int grpc_ready_probe::on_data_chunk(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                                    void* user_data) {
  auto& self = *static_cast<grpc_ready_probe*>(user_data);
  call* c = self.find(stream_id);
  if (c == nullptr) return 0;
  if (len > k_body_bytes_max - c->body_len) {
    c->body_overflow = true;
    return 0;
  }
  std::memcpy(c->body + c->body_len, data, len);
  c->body_len += len;
  return 0;
}

int grpc_ready_probe::on_stream_close(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* user_data) {
  auto& self = *static_cast<grpc_ready_probe*>(user_data);
  call* c = self.find(stream_id);
  if (c == nullptr) return 0;
  c->closed = true;
  c->error_code = error_code;
  return 0;
}

bool grpc_ready_probe::judge(const call& c) noexcept {
  if (c.error_code != NGHTTP2_NO_ERROR) {
    _why = "stream reset";
    return false;
  }
  if (c.http_status != 200) {
    _why = "HTTP status not 200";
    return false;
  }
  if (c.grpc_status != 0) {
    _why = c.grpc_status < 0 ? "no grpc-status" : "grpc-status not 0";
    return false;
  }
  if (c.body_overflow) {
    _why = "response too long";
    return false;
  }
  grpc::frame f;
  const std::string_view body(c.body, c.body_len);
  if (grpc::read_frame(body, k_body_bytes_max, f) != grpc::decode_status::ok || f.consumed != body.size()) {
    _why = "not one gRPC message";
    return false;
  }
  bool ready = false;
  if (grpc::decode_ready_response(f.message, ready) != grpc::decode_status::ok) {
    _why = "malformed response";
    return false;
  }
  if (!ready) {
    _why = "ready = false";
    return false;
  }
  return true;
}

void grpc_ready_probe::decide(outcome o, std::string_view why) noexcept {
  if (_outcome != outcome::pending) return;
  _outcome = o;
  _why = why;
}

void grpc_ready_probe::advance() noexcept {
  if (_outcome != outcome::pending) return;
  const call& c = _calls[_current];
  if (c.closed) {
    if (!judge(c)) {
      _outcome = outcome::not_ready;
      _why_call = _current == 0 ? "ServerReady" : "ModelReady";
      return;
    }
    if (_current == 0 && !_model.empty()) {
      const size_t need = grpc::model_ready_frame_bytes(_model, "");
      _model_frame.resize(need);
      const size_t n = grpc::encode_model_ready_frame(_model, "", _model_frame.data(), need);
      _current = 1;
      submit(_calls[1], k_model_ready_path, _model_frame.data(), n);
      return;
    }
    _outcome = outcome::ready;
    return;
  }
  if (nghttp2_session_want_read(_session) == 0 && nghttp2_session_want_write(_session) == 0) {
    decide(outcome::failed, "connection closed by GOAWAY");
  }
}

std::string_view grpc_ready_probe::next_send() noexcept {
  if (_session == nullptr || _outcome != outcome::pending) return {};
  const uint8_t* data = nullptr;
  const ssize_t n = nghttp2_session_mem_send(_session, &data);
  if (n < 0) {
    decide(outcome::failed, nghttp2_strerror(static_cast<int>(n)));
    return {};
  }
  // A connection error (bytes that are not HTTP/2, a flood) makes nghttp2
  // queue a GOAWAY rather than fail mem_recv; once that is out, the
  // session wants nothing more and no answer can come.
  if (n == 0 && nghttp2_session_want_read(_session) == 0 && nghttp2_session_want_write(_session) == 0) {
    decide(outcome::failed, "connection closed by GOAWAY");
  }
  return {reinterpret_cast<const char*>(data), static_cast<size_t>(n)};
}

void grpc_ready_probe::on_recv(std::string_view bytes) noexcept {
  if (_session == nullptr || _outcome != outcome::pending) return;
  _received += bytes.size();
  if (_received > k_recv_bytes_max) {
    decide(outcome::failed, "too many bytes received");
    return;
  }
  const ssize_t n = nghttp2_session_mem_recv(_session, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (n < 0) {
    decide(outcome::failed, nghttp2_strerror(static_cast<int>(n)));
    return;
  }
  advance();
}

void grpc_ready_probe::on_peer_closed() noexcept { decide(outcome::failed, "connection closed"); }

void grpc_ready_probe::end() noexcept {
  if (_session != nullptr) {
    nghttp2_session_del(_session);
    _session = nullptr;
  }
}

}  // namespace sluice::control
