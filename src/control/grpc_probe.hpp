#pragma once
// control: the health probe of a grpc:// backend, as an HTTP/2 client
// session with no socket of its own. KServe v2's ServerReady, then
// ModelReady for the backend's model, on one prior-knowledge h2c
// connection; the prober (health.cpp) moves the bytes with its io_uring
// connect/send/recv steps, so nothing here blocks or reads a clock.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/grpc/h2_client.hpp"

namespace sluice::control {

// Control-thread-local. One per grpc:// backend's prober, reused by every
// probe; its client session lives from begin() (connected) to end() (the
// socket closed and every buffer back from the kernel).
class grpc_ready_probe final : grpc::session_events {
 public:
  enum class outcome : uint8_t {
    pending,    // more bytes to send or receive
    ready,      // every call answered grpc-status 0 with ready = true
    not_ready,  // a call answered, but not that
    failed,     // the HTTP/2 exchange broke (protocol error, reset, peer close, too many bytes)
  };

  grpc_ready_probe() = default;
  ~grpc_ready_probe() { end(); }
  grpc_ready_probe(const grpc_ready_probe&) = delete;
  grpc_ready_probe& operator=(const grpc_ready_probe&) = delete;

  // What the calls ask for; kept across probes, read at begin(). `model`
  // empty: ServerReady alone.
  void set_target(std::string_view authority, std::string_view model, uint32_t timeout_ms);

  // A fresh session: client preface, SETTINGS, the ServerReady call.
  // Returns: false when nghttp2 refused (out of memory); result() says failed.
  bool begin() noexcept;

  // The next bytes to send: a view into the session's own buffer, valid
  // until the next next_send() or end(), so the kernel may hold it for one
  // send. Empty when there is nothing to send (then receive), or when the
  // session failed (see result()).
  std::string_view next_send() noexcept;

  // Bytes received from the backend; may start the ModelReady call and
  // decide the outcome.
  void on_recv(std::string_view bytes) noexcept;
  // The backend closed the connection (a recv of 0).
  void on_peer_closed() noexcept;

  outcome result() const noexcept { return _outcome; }
  // A short reason for a decided outcome other than ready (for logs).
  std::string_view why() const noexcept { return _why; }
  // The call that answered not ready ("ServerReady", "ModelReady"); empty
  // for the other outcomes.
  std::string_view why_call() const noexcept { return _why_call; }

  // Frees the session. Call only when no send of next_send()'s bytes is
  // still with the kernel.
  void end() noexcept;

  // More received bytes than this in one probe fail it: readiness answers
  // are a few dozen bytes, so a backend sending more is broken or hostile.
  static constexpr size_t k_recv_bytes_max = 64 * 1024;
  // A ready response's DATA (its 5-byte prefix and a bool) fits many
  // times over; more fails the call.
  static constexpr size_t k_body_bytes_max = 256;

  // One unary call's state, from its HEADERS to its stream's close.
  struct call {
    int32_t stream_id = -1;
    int http_status = 0;
    int grpc_status = -1;  // -1: none seen (in headers or trailers)
    bool closed = false;
    uint32_t error_code = 0;  // RST_STREAM / GOAWAY code at close
    char body[k_body_bytes_max];
    size_t body_len = 0;
    bool body_overflow = false;
    // The request message, sent from here by the data provider.
    const char* request = nullptr;
    size_t request_len = 0;
    size_t request_sent = 0;
  };

 private:
  bool submit(call& c, std::string_view path, const char* request, size_t request_len) noexcept;
  // Whether the closed call answered ready; sets _why when not.
  bool judge(const call& c) noexcept;
  void advance() noexcept;
  void decide(outcome o, std::string_view why) noexcept;

  // --- the session's reports (grpc::session_events); `c` is a call* ---
  void on_field(void* c, std::string_view name, std::string_view value) noexcept override;
  bool on_data(void* c, std::string_view bytes) noexcept override;
  void on_close(void* c, uint32_t error_code) noexcept override;
  size_t read_request(void* c, char* out, size_t room, bool& last) noexcept override;

  std::string _authority;
  std::string _model;
  char _grpc_timeout[16] = {};
  size_t _grpc_timeout_len = 0;
  // The ModelReady request frame; its capacity is reused probe after probe.
  std::string _model_frame;
  char _server_frame[8] = {};

  grpc::client_session _session;
  call _calls[2];  // ServerReady, ModelReady
  size_t _current = 0;
  size_t _received = 0;
  outcome _outcome = outcome::pending;
  std::string_view _why;
  std::string_view _why_call;
};

}  // namespace sluice::control
