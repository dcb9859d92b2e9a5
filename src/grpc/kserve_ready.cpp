// grpc: the readiness RPCs' messages (ServerReady, ModelReady), which the
// control thread's health probe sends to grpc:// backends.
#include "sluice/grpc/kserve.hpp"

namespace sluice::grpc {
namespace {

namespace model_ready_field {
constexpr uint32_t name = 1, version = 2;
}
namespace ready_field {
constexpr uint32_t ready = 1;
}

size_t string_field_bytes(uint32_t field, std::string_view s) noexcept {
  return s.empty() ? 0 : len_field_bytes(field, s.size());
}

}  // namespace

size_t encode_server_ready_frame(char* out, size_t cap) noexcept {
  if (cap < k_server_ready_frame_bytes) return 0;
  write_frame_header(out, 0);
  return k_server_ready_frame_bytes;
}

size_t model_ready_frame_bytes(std::string_view name, std::string_view version) noexcept {
  return k_frame_header_bytes + string_field_bytes(model_ready_field::name, name) +
         string_field_bytes(model_ready_field::version, version);
}

size_t encode_model_ready_frame(std::string_view name, std::string_view version, char* out, size_t cap) noexcept {
  const size_t total = model_ready_frame_bytes(name, version);
  if (cap < total || total - k_frame_header_bytes > UINT32_MAX) return 0;
  write_frame_header(out, static_cast<uint32_t>(total - k_frame_header_bytes));
  wire_writer w(out + k_frame_header_bytes, cap - k_frame_header_bytes);
  if (!name.empty()) w.bytes_field(model_ready_field::name, name);
  if (!version.empty()) w.bytes_field(model_ready_field::version, version);
  return w.ok() ? total : 0;
}

decode_status decode_ready_response(std::string_view message, bool& ready) noexcept {
  ready = false;
  wire_reader r(message);
  wire_field f;
  while (r.next(f)) {
    // Last one wins, as protobuf's parsers do; another wire type under
    // the same number is an unknown field.
    if (f.number == ready_field::ready && f.type == wire_type::varint) ready = f.value != 0;
  }
  return r.status();
}

}  // namespace sluice::grpc
