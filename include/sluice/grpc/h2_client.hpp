#pragma once
// grpc: the HTTP/2 client session both of sluice's gRPC clients -- the
// Triton adapter and the health probe's readiness RPCs -- drive
// (client_session), and its parts: the session's options (the bounds on
// what a server can make it hold), a call's request head, and the
// grpc-timeout field.
#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <sys/types.h>

namespace sluice::grpc {

// The options of a client session: few SETTINGS entries and few
// CONTINUATION frames per header block from the server; `manual_window`:
// the owner gives stream windows back as its clients take the bytes
// (backpressure). Returns: null when out of memory (nghttp2_option_del it).
nghttp2_option* new_client_options(bool manual_window) noexcept;

// grpc-timeout's value: at most 8 digits and a unit (gRPC's PROTOCOL-HTTP2),
// milliseconds while they fit, else seconds (capped), into out[0, 16).
// Returns: its length (at most 9).
size_t write_timeout(char* out, uint64_t ms) noexcept;

// A gRPC call's request head: POST `path` to `authority`, the gRPC content
// type, te: trailers, `user_agent`, then grpc-accept-encoding (when
// `identity_only`) and grpc-timeout (when not empty). Names are literals
// (NO_COPY_NAME); values are copied by nghttp2 at submit. Returns: the
// fields written into nv.
inline constexpr size_t k_call_head_fields_max = 9;
size_t call_head(nghttp2_nv (&nv)[k_call_head_fields_max], std::string_view path, std::string_view authority,
                 std::string_view user_agent, std::string_view timeout, bool identity_only) noexcept;

}  // namespace sluice::grpc

namespace sluice::grpc {

// What a client session reports to its owner, one call at a time. `call`
// is the owner's object for the call (client_session::call's `owner_call`);
// a call forgotten (client_session::forget) reports nothing more. Every
// report comes from inside feed() or next_send(), never later.
class session_events {
 public:
  // A field of one of the call's HEADERS blocks: the response head, an
  // informational head, or the trailers (Trailers-Only puts grpc-status in
  // the head).
  virtual void on_field(void* call, std::string_view name, std::string_view value) noexcept = 0;
  // One of those HEADERS blocks ended.
  virtual void on_headers_end(void*) noexcept {}
  // Bytes of the response's DATA. Returns: false when the owner takes no
  // more: the stream is reset (INTERNAL_ERROR).
  virtual bool on_data(void* call, std::string_view bytes) noexcept = 0;
  // The stream closed: `error_code` NO_ERROR (0), or the reset's code.
  virtual void on_close(void* call, uint32_t error_code) noexcept = 0;
  // The request's next bytes: up to `room` into `out`; `last` set with the
  // last of them. Returns: the bytes written.
  virtual size_t read_request(void* call, char* out, size_t room, bool& last) noexcept = 0;

 protected:
  session_events() = default;
  ~session_events() = default;
  session_events(const session_events&) = default;
  session_events& operator=(const session_events&) = default;
};

// What a client session tells its server at the start (SETTINGS), besides
// no push and no streams of the server's own.
struct session_settings {
  // The owner gives each stream's window back as its client takes the
  // bytes (consume); the connection's goes back after each feed, so one
  // slow stream never stalls the others. Else nghttp2 gives both back at once.
  bool manual_window = false;
  uint32_t stream_window = 0;      // SETTINGS_INITIAL_WINDOW_SIZE; 0: not said (65,535)
  uint32_t connection_window = 0;  // the connection's receive window; 0: 65,535
  uint32_t max_frame = 0;          // SETTINGS_MAX_FRAME_SIZE; 0: not said
  uint32_t max_header_list = 0;    // SETTINGS_MAX_HEADER_LIST_SIZE; 0: not said
};

// Single-threaded. One gRPC client's HTTP/2 session with no socket of its
// own: the owner moves the bytes (next_send, feed) on its own loop, so
// nothing here blocks or reads a clock. The Triton adapter and the health
// probe are its two owners. Calls are unary or server-streaming POSTs with
// the request written from read_request.
class client_session {
 public:
  client_session() = default;
  ~client_session() { close(); }
  client_session(const client_session&) = delete;
  client_session& operator=(const client_session&) = delete;

  // A fresh session reporting to `events`: the client preface and SETTINGS
  // go out with the first next_send(). Returns: false when out of memory.
  bool open(session_events& events, const session_settings& s) noexcept;
  // Frees the session. Call only when no send of next_send()'s bytes is
  // still with the kernel.
  void close() noexcept;
  bool is_open() const noexcept { return _session != nullptr; }

  // A call: POST `path` (call_head's fields). `owner_call` is what the
  // reports name. Returns: the stream id, or -1 (out of memory, or no new
  // stream may be opened).
  int32_t call(std::string_view path, std::string_view authority, std::string_view user_agent,
               std::string_view timeout, bool identity_only, void* owner_call) noexcept;
  // The call reports nothing more; its request is not read again (a
  // request not yet all sent resets the stream).
  void forget(int32_t stream_id) noexcept;
  // RST_STREAM with `code` goes out with the next send.
  void reset(int32_t stream_id, uint32_t code) noexcept;
  // manual_window: the owner's client took `bytes` of the stream's DATA.
  void consume(int32_t stream_id, size_t bytes) noexcept;

  // Bytes from the server. Returns: false when the session broke (not
  // HTTP/2, a protocol error nghttp2 cannot answer): reason() says why.
  bool feed(std::string_view bytes) noexcept;
  // The next bytes to send: a view into the session's own buffer, valid
  // until the next next_send() or close(), so the kernel may hold it for
  // one send. Empty when there is nothing to send, or the session broke
  // (failed()).
  std::string_view next_send() noexcept;

  bool failed() const noexcept { return _error != 0; }
  std::string_view reason() const noexcept;
  // Nothing more to read or write: a GOAWAY came (or went) and every
  // stream it lets finish is done.
  bool finished() const noexcept;
  // Whether a new call may be made (no GOAWAY).
  bool takes_calls() const noexcept;
  // The server's SETTINGS_MAX_CONCURRENT_STREAMS (100 until it says).
  uint32_t peer_max_streams() const noexcept;

 private:
  static int on_header(nghttp2_session*, const nghttp2_frame*, const uint8_t*, size_t, const uint8_t*, size_t,
                       uint8_t, void*);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame*, void*);
  static int on_data_chunk(nghttp2_session*, uint8_t, int32_t, const uint8_t*, size_t, void*);
  static int on_stream_close(nghttp2_session*, int32_t, uint32_t, void*);
  static ssize_t read_body(nghttp2_session*, int32_t, uint8_t*, size_t, uint32_t*, nghttp2_data_source*, void*);

  nghttp2_session* _session = nullptr;
  session_events* _events = nullptr;
  bool _manual_window = false;
  uint64_t _unconsumed = 0;  // manual_window: the connection's DATA bytes read, not yet given back
  int _error = 0;            // nghttp2's error code once the session broke
};

// An HTTP/2 error code's name ("CANCEL", "REFUSED_STREAM", ...).
std::string_view h2_error_name(uint32_t code) noexcept;

}  // namespace sluice::grpc
