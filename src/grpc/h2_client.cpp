// grpc: the HTTP/2 client session's options and a call's request head
// (h2_client.hpp).
#include "sluice/grpc/h2_client.hpp"

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

}  // namespace sluice::grpc
