// grpc: gRPC message framing and the protobuf wire primitives.
#include "sluice/grpc/wire.hpp"

#include <cstring>

namespace sluice::grpc {

std::string_view describe(decode_status s) noexcept {
  switch (s) {
    case decode_status::ok: return "ok";
    case decode_status::need_more: return "truncated gRPC frame";
    case decode_status::truncated: return "protobuf field runs past the end of its message";
    case decode_status::over_long: return "length past the end of its message or the size limit";
    case decode_status::bad_varint: return "malformed protobuf varint";
    case decode_status::bad_wire_type: return "invalid protobuf tag or wire type";
    case decode_status::compressed: return "compressed gRPC message (no compression was offered)";
    case decode_status::bad_frame_flag: return "invalid gRPC frame flag";
    case decode_status::bad_tensor: return "tensor contents shorter than their elements";
  }
  return "unknown decode error";
}

void write_frame_header(char* out, uint32_t message_bytes) noexcept {
  out[0] = 0;  // not compressed
  out[1] = static_cast<char>(message_bytes >> 24);
  out[2] = static_cast<char>(message_bytes >> 16);
  out[3] = static_cast<char>(message_bytes >> 8);
  out[4] = static_cast<char>(message_bytes);
}

decode_status read_frame(std::string_view in, uint32_t message_bytes_max, frame& out) noexcept {
  if (in.size() < k_frame_header_bytes) return decode_status::need_more;
  const auto* u = reinterpret_cast<const unsigned char*>(in.data());
  // The flag is checked before the length so a stray compressed frame is
  // named as such rather than waited on.
  if (u[0] == 1) return decode_status::compressed;
  if (u[0] != 0) return decode_status::bad_frame_flag;
  const uint32_t len = (uint32_t{u[1]} << 24) | (uint32_t{u[2]} << 16) | (uint32_t{u[3]} << 8) |
                       uint32_t{u[4]};
  if (len > message_bytes_max) return decode_status::over_long;
  if (in.size() - k_frame_header_bytes < len) return decode_status::need_more;
  out.message = in.substr(k_frame_header_bytes, len);
  out.consumed = k_frame_header_bytes + len;
  return decode_status::ok;
}

void wire_writer::varint(uint64_t v) noexcept {
  if (static_cast<size_t>(_end - _p) < varint_bytes(v)) {
    _ok = false;
    _p = _end;
    return;
  }
  while (v >= 0x80) {
    *_p++ = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  *_p++ = static_cast<char>(v);
}

void wire_writer::raw(std::string_view bytes) noexcept {
  if (static_cast<size_t>(_end - _p) < bytes.size()) {
    _ok = false;
    _p = _end;
    return;
  }
  if (!bytes.empty()) std::memcpy(_p, bytes.data(), bytes.size());
  _p += bytes.size();
}

void wire_writer::fixed32_le(uint32_t v) noexcept {
  const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 24)};
  raw(std::string_view(b, 4));
}



// Skips to the group_end matching `number`, through nested groups. The
// depth bound keeps hostile input from costing more than a bounded stack.
bool wire_reader::skip_group(uint32_t number) noexcept {
  constexpr unsigned k_depth_max = 32;
  uint32_t open[k_depth_max];
  unsigned depth = 0;
  open[depth++] = number;
  wire_field f;
  while (depth > 0) {
    if (_p == _end) return fail(decode_status::truncated);
    if (!read_one(f)) return false;
    if (f.type == wire_type::group_start) {
      if (depth == k_depth_max) return fail(decode_status::over_long);
      open[depth++] = f.number;
    } else if (f.type == wire_type::group_end) {
      if (open[depth - 1] != f.number) return fail(decode_status::bad_wire_type);
      --depth;
    }
  }
  return true;
}


}  // namespace sluice::grpc
