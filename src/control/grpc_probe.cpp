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

  grpc::session_settings st;
  st.max_header_list = 8192;
  if (!_session.open(*this, st)) {
    decide(outcome::failed, "out of memory");
    return false;
  }
  const size_t n = grpc::encode_server_ready_frame(_server_frame, sizeof _server_frame);
  return submit(_calls[0], k_server_ready_path, _server_frame, n);
}

bool grpc_ready_probe::submit(call& c, std::string_view path, const char* request, size_t request_len) noexcept {
  c.request = request;
  c.request_len = request_len;
  const int32_t id = _session.call(path, _authority, "sluice-health",
                                   std::string_view(_grpc_timeout, _grpc_timeout_len), false, &c);
  if (id < 0) {
    // A GOAWAY that came with the last answer refuses the next call.
    decide(outcome::failed, _session.takes_calls() ? "out of memory" : "connection closed by GOAWAY");
    return false;
  }
  c.stream_id = id;
  return true;
}

size_t grpc_ready_probe::read_request(void* call_ptr, char* out, size_t room, bool& last) noexcept {
  call& c = *static_cast<call*>(call_ptr);
  size_t n = c.request_len - c.request_sent;
  if (n > room) n = room;
  std::memcpy(out, c.request + c.request_sent, n);
  c.request_sent += n;
  last = c.request_sent == c.request_len;
  return n;
}

void grpc_ready_probe::on_field(void* call_ptr, std::string_view n, std::string_view v) noexcept {
  call& c = *static_cast<call*>(call_ptr);
  // Headers and trailers alike: grpc-status may come in either
  // (Trailers-Only puts it in the response headers).
  if (n == ":status") {
    c.http_status = parse_status(v);
  } else if (n == "grpc-status") {
    c.grpc_status = parse_status(v);
  }
}

bool grpc_ready_probe::on_data(void* call_ptr, std::string_view bytes) noexcept {
  call& c = *static_cast<call*>(call_ptr);
  if (bytes.size() > k_body_bytes_max - c.body_len) {
    c.body_overflow = true;  // judged at the close: "response too long"
    return true;
  }
  std::memcpy(c.body + c.body_len, bytes.data(), bytes.size());
  c.body_len += bytes.size();
  return true;
}

void grpc_ready_probe::on_close(void* call_ptr, uint32_t error_code) noexcept {
  call& c = *static_cast<call*>(call_ptr);
  c.closed = true;
  c.error_code = error_code;
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
  if (_session.finished()) decide(outcome::failed, "connection closed by GOAWAY");
}

std::string_view grpc_ready_probe::next_send() noexcept {
  if (!_session.is_open() || _outcome != outcome::pending) return {};
  const std::string_view out = _session.next_send();
  if (_session.failed()) {
    decide(outcome::failed, _session.reason());
    return {};
  }
  // A connection error (bytes that are not HTTP/2, a flood) makes nghttp2
  // queue a GOAWAY rather than fail mem_recv; once that is out, the
  // session wants nothing more and no answer can come.
  if (out.empty() && _session.finished()) decide(outcome::failed, "connection closed by GOAWAY");
  return out;
}

void grpc_ready_probe::on_recv(std::string_view bytes) noexcept {
  if (!_session.is_open() || _outcome != outcome::pending) return;
  _received += bytes.size();
  if (_received > k_recv_bytes_max) {
    decide(outcome::failed, "too many bytes received");
    return;
  }
  if (!_session.feed(bytes)) {
    decide(outcome::failed, _session.reason());
    return;
  }
  advance();
}

void grpc_ready_probe::on_peer_closed() noexcept { decide(outcome::failed, "connection closed"); }

void grpc_ready_probe::end() noexcept { _session.close(); }

}  // namespace sluice::control
