// grpc: the HTTP/2 client session both gRPC clients drive, its options
// and a call's request head (h2_client.hpp).
#include "sluice/grpc/h2_client.hpp"

#include <cstring>
#include <iterator>

#include "sluice/core/text.hpp"

namespace sluice::grpc {

namespace {

template <size_t N>
nghttp2_nv field(const char (&name)[N], std::string_view value) noexcept {
  // nghttp2 never writes through these pointers; the value is copied at
  // submit (the HEADERS frame is encoded later, in mem_send).
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name)), reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())),
          N - 1, value.size(), NGHTTP2_NV_FLAG_NO_COPY_NAME};
}

}  // namespace

nghttp2_option* new_client_options(bool manual_window) noexcept {
  nghttp2_option* opt = nullptr;
  if (nghttp2_option_new(&opt) != 0) return nullptr;
  nghttp2_option_set_max_settings(opt, 32);
  nghttp2_option_set_max_continuations(opt, 8);
  if (manual_window) nghttp2_option_set_no_auto_window_update(opt, 1);
  return opt;
}

size_t write_timeout(char* out, uint64_t ms) noexcept {
  text_writer w(out, 16);
  if (ms < 100'000'000) {
    w.put_int(ms);
    w.put('m');
  } else {
    w.put_int(ms / 1000 < 100'000'000 ? ms / 1000 : 99'999'999);
    w.put('S');
  }
  return static_cast<size_t>(w.p - out);
}

size_t call_head(nghttp2_nv (&nv)[k_call_head_fields_max], std::string_view path, std::string_view authority,
                 std::string_view user_agent, std::string_view timeout, bool identity_only) noexcept {
  size_t n = 0;
  nv[n++] = field(":method", "POST");
  nv[n++] = field(":scheme", "http");
  nv[n++] = field(":path", path);
  nv[n++] = field(":authority", authority);
  nv[n++] = field("content-type", "application/grpc");
  nv[n++] = field("te", "trailers");
  nv[n++] = field("user-agent", user_agent);
  if (identity_only) nv[n++] = field("grpc-accept-encoding", "identity");
  if (!timeout.empty()) nv[n++] = field("grpc-timeout", timeout);
  return n;
}

// ---------------------------------------------------------------------------
// client_session

namespace {

client_session& self_of(void* user) noexcept { return *static_cast<client_session*>(user); }

}  // namespace

bool client_session::open(session_events& events, const session_settings& st) noexcept {
  close();
  _events = &events;
  _manual_window = st.manual_window;
  _unconsumed = 0;
  _error = 0;
  nghttp2_session_callbacks* cbs = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0) return false;
  nghttp2_session_callbacks_set_on_header_callback(cbs, &client_session::on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &client_session::on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &client_session::on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &client_session::on_stream_close);
  nghttp2_option* opt = new_client_options(st.manual_window);
  // The session copies both: they go at once.
  const int rv = opt == nullptr ? NGHTTP2_ERR_NOMEM : nghttp2_session_client_new2(&_session, cbs, this, opt);
  if (opt != nullptr) nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    _session = nullptr;
    return false;
  }
  nghttp2_settings_entry settings[5];
  size_t n = 0;
  settings[n++] = {NGHTTP2_SETTINGS_ENABLE_PUSH, 0};
  settings[n++] = {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 0};  // the server opens none
  if (st.stream_window != 0) settings[n++] = {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, st.stream_window};
  if (st.max_frame != 0) settings[n++] = {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, st.max_frame};
  if (st.max_header_list != 0) settings[n++] = {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, st.max_header_list};
  if (nghttp2_submit_settings(_session, NGHTTP2_FLAG_NONE, settings, n) != 0 ||
      (st.connection_window != 0 &&
       nghttp2_session_set_local_window_size(_session, NGHTTP2_FLAG_NONE, 0,
                                             static_cast<int32_t>(st.connection_window)) != 0)) {
    close();
    return false;
  }
  return true;
}

void client_session::close() noexcept {
  if (_session == nullptr) return;
  nghttp2_session_del(_session);
  _session = nullptr;
}

int32_t client_session::call(std::string_view path, std::string_view authority, std::string_view user_agent,
                             std::string_view timeout, bool identity_only, void* owner_call) noexcept {
  if (!takes_calls()) return -1;  // (nghttp2 would queue it, to refuse it at the send)
  // The values are copied at submit: the HEADERS frame is encoded later, in
  // next_send, after the caller's strings may be gone.
  nghttp2_nv nva[k_call_head_fields_max];
  const size_t fields = call_head(nva, path, authority, user_agent, timeout, identity_only);
  nghttp2_data_provider body{};
  body.read_callback = &client_session::read_body;
  const int32_t id = nghttp2_submit_request(_session, nullptr, nva, fields, &body, owner_call);
  return id < 0 ? -1 : id;
}

void client_session::forget(int32_t stream_id) noexcept {
  if (_session != nullptr) nghttp2_session_set_stream_user_data(_session, stream_id, nullptr);
}

void client_session::reset(int32_t stream_id, uint32_t code) noexcept {
  if (_session != nullptr) nghttp2_submit_rst_stream(_session, NGHTTP2_FLAG_NONE, stream_id, code);
}

void client_session::consume(int32_t stream_id, size_t bytes) noexcept {
  if (_session != nullptr && _manual_window && bytes != 0) nghttp2_session_consume_stream(_session, stream_id, bytes);
}

bool client_session::feed(std::string_view bytes) noexcept {
  if (_session == nullptr || failed()) return false;
  const ssize_t n =
      nghttp2_session_mem_recv(_session, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (n < 0) {
    _error = static_cast<int>(n);
    return false;
  }
  if (_unconsumed != 0) {
    // The connection's window goes back after each receive; the streams'
    // as their clients take the bytes.
    nghttp2_session_consume_connection(_session, _unconsumed);
    _unconsumed = 0;
  }
  return true;
}

std::string_view client_session::next_send() noexcept {
  if (_session == nullptr || failed()) return {};
  const uint8_t* data = nullptr;
  const ssize_t n = nghttp2_session_mem_send(_session, &data);
  if (n < 0) {
    _error = static_cast<int>(n);
    return {};
  }
  return {reinterpret_cast<const char*>(data), static_cast<size_t>(n)};
}

std::string_view client_session::reason() const noexcept {
  return _error == 0 ? std::string_view() : std::string_view(nghttp2_strerror(_error));
}

bool client_session::finished() const noexcept {
  return _session == nullptr ||
         (nghttp2_session_want_read(_session) == 0 && nghttp2_session_want_write(_session) == 0);
}

bool client_session::takes_calls() const noexcept {
  return _session != nullptr && !failed() && nghttp2_session_check_request_allowed(_session) != 0;
}

uint32_t client_session::peer_max_streams() const noexcept {
  return _session == nullptr ? 0
                             : nghttp2_session_get_remote_settings(_session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
}

int client_session::on_header(nghttp2_session* s, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                              const uint8_t* value, size_t valuelen, uint8_t, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  void* call = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
  if (call == nullptr) return 0;
  self_of(user)._events->on_field(call, std::string_view(reinterpret_cast<const char*>(name), namelen),
                                  std::string_view(reinterpret_cast<const char*>(value), valuelen));
  return 0;
}

int client_session::on_frame_recv(nghttp2_session* s, const nghttp2_frame* frame, void* user) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  void* call = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
  if (call != nullptr) self_of(user)._events->on_headers_end(call);
  return 0;
}

int client_session::on_data_chunk(nghttp2_session* s, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                                  void* user) {
  client_session& self = self_of(user);
  if (self._manual_window) self._unconsumed += len;  // forgotten streams' bytes too
  void* call = nghttp2_session_get_stream_user_data(s, stream_id);
  if (call == nullptr) return 0;
  if (self._events->on_data(call, std::string_view(reinterpret_cast<const char*>(data), len))) return 0;
  return nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_INTERNAL_ERROR) == 0
             ? 0
             : NGHTTP2_ERR_CALLBACK_FAILURE;
}

int client_session::on_stream_close(nghttp2_session* s, int32_t stream_id, uint32_t error_code, void* user) {
  void* call = nghttp2_session_get_stream_user_data(s, stream_id);
  if (call != nullptr) self_of(user)._events->on_close(call, error_code);
  return 0;
}

ssize_t client_session::read_body(nghttp2_session* s, int32_t stream_id, uint8_t* buf, size_t length,
                                  uint32_t* data_flags, nghttp2_data_source*, void* user) {
  void* call = nghttp2_session_get_stream_user_data(s, stream_id);
  if (call == nullptr) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // forgotten: the stream is reset
  bool last = false;
  const size_t n = self_of(user)._events->read_request(call, reinterpret_cast<char*>(buf), length, last);
  if (last) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

std::string_view h2_error_name(uint32_t code) noexcept { return nghttp2_http2_strerror(code); }

}  // namespace sluice::grpc
