// grpc: ModelInferRequest encoding and ModelStreamInferResponse decoding.
// Encoding is two passes over the same size functions: sizes first (each
// nested message's length prefix needs its body's size), then bytes.
#include "sluice/grpc/kserve.hpp"

#include <bit>
#include <cstring>

namespace sluice::grpc {
namespace {

// grpc_service.proto field numbers (triton-inference-server/common).
namespace request_field {
constexpr uint32_t model_name = 1, model_version = 2, id = 3, parameters = 4, inputs = 5,
                   raw_input_contents = 7;
}
namespace tensor_field {  // InferInputTensor and InferOutputTensor alike
constexpr uint32_t name = 1, datatype = 2, shape = 3, parameters = 4;
}
namespace param_field {  // InferParameter's oneof
constexpr uint32_t bool_param = 1, int64_param = 2, string_param = 3;
}
namespace entry_field {  // a map entry on the wire: message { key = 1; value = 2; }
constexpr uint32_t key = 1, value = 2;
}
size_t string_field_bytes(uint32_t field, std::string_view s) noexcept {
  return s.empty() ? 0 : len_field_bytes(field, s.size());
}

size_t parameter_value_bytes(const infer_parameter& p) noexcept {
  switch (p.type) {
    case infer_parameter::kind::boolean: return tag_bytes(param_field::bool_param) + 1;
    case infer_parameter::kind::int64:
      return tag_bytes(param_field::int64_param) +
             varint_bytes(static_cast<uint64_t>(p.int64_value));
    case infer_parameter::kind::string:
      // A oneof member has presence: an empty string is still written.
      return len_field_bytes(param_field::string_param, p.string_value.size());
  }
  return 0;
}

size_t parameter_entry_bytes(const infer_parameter& p) noexcept {
  return string_field_bytes(entry_field::key, p.key) +
         len_field_bytes(entry_field::value, parameter_value_bytes(p));
}

size_t parameters_bytes(uint32_t field, std::span<const infer_parameter> ps) noexcept {
  size_t n = 0;
  for (const auto& p : ps) n += len_field_bytes(field, parameter_entry_bytes(p));
  return n;
}

void put_parameters(wire_writer& w, uint32_t field, std::span<const infer_parameter> ps) noexcept {
  for (const auto& p : ps) {
    w.len_prefix(field, parameter_entry_bytes(p));
    if (!p.key.empty()) w.bytes_field(entry_field::key, p.key);
    w.len_prefix(entry_field::value, parameter_value_bytes(p));
    switch (p.type) {
      case infer_parameter::kind::boolean: w.varint_field(param_field::bool_param, p.bool_value); break;
      case infer_parameter::kind::int64:
        w.varint_field(param_field::int64_param, static_cast<uint64_t>(p.int64_value));
        break;
      case infer_parameter::kind::string: w.bytes_field(param_field::string_param, p.string_value); break;
    }
  }
}

size_t element_count(const infer_input& in) noexcept {
  return in.type == tensor_type::bytes ? in.strings.size() : 1;
}

// The packed shape's payload; the implicit shape is [element count].
size_t shape_payload_bytes(const infer_input& in) noexcept {
  if (in.shape.empty()) return varint_bytes(element_count(in));
  size_t n = 0;
  for (int64_t d : in.shape) n += varint_bytes(static_cast<uint64_t>(d));
  return n;
}

size_t raw_contents_bytes(const infer_input& in) noexcept {
  switch (in.type) {
    case tensor_type::bytes: {
      size_t n = 0;
      for (auto s : in.strings) n += 4 + s.size();
      return n;
    }
    case tensor_type::boolean: return 1;
    case tensor_type::int32:
    case tensor_type::fp32: return 4;
    case tensor_type::int64:
    case tensor_type::uint64: return 8;
  }
  return 0;
}

size_t input_bytes(const infer_input& in) noexcept {
  return string_field_bytes(tensor_field::name, in.name) +
         len_field_bytes(tensor_field::datatype, datatype_name(in.type).size()) +
         len_field_bytes(tensor_field::shape, shape_payload_bytes(in)) +
         parameters_bytes(tensor_field::parameters, in.parameters);
}

void put_input(wire_writer& w, const infer_input& in) noexcept {
  w.len_prefix(request_field::inputs, input_bytes(in));
  if (!in.name.empty()) w.bytes_field(tensor_field::name, in.name);
  w.bytes_field(tensor_field::datatype, datatype_name(in.type));
  w.len_prefix(tensor_field::shape, shape_payload_bytes(in));
  if (in.shape.empty()) {
    w.varint(element_count(in));
  } else {
    for (int64_t d : in.shape) w.varint(static_cast<uint64_t>(d));
  }
  put_parameters(w, tensor_field::parameters, in.parameters);
}

void put_le(wire_writer& w, uint64_t v, size_t n) noexcept {
  char b[8];
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(v >> (8 * i));
  w.raw(std::string_view(b, n));
}

void put_raw_contents(wire_writer& w, const infer_input& in) noexcept {
  w.len_prefix(request_field::raw_input_contents, raw_contents_bytes(in));
  switch (in.type) {
    case tensor_type::bytes:
      for (auto s : in.strings) {
        w.fixed32_le(static_cast<uint32_t>(s.size()));
        w.raw(s);
      }
      break;
    case tensor_type::boolean: put_le(w, in.number.boolean ? 1 : 0, 1); break;
    case tensor_type::int32: put_le(w, static_cast<uint32_t>(in.number.int32), 4); break;
    case tensor_type::fp32: put_le(w, std::bit_cast<uint32_t>(in.number.fp32), 4); break;
    case tensor_type::int64: put_le(w, static_cast<uint64_t>(in.number.int64), 8); break;
    case tensor_type::uint64: put_le(w, in.number.uint64, 8); break;
  }
}

}  // namespace

std::string_view datatype_name(tensor_type t) noexcept {
  switch (t) {
    case tensor_type::bytes: return "BYTES";
    case tensor_type::boolean: return "BOOL";
    case tensor_type::int32: return "INT32";
    case tensor_type::int64: return "INT64";
    case tensor_type::uint64: return "UINT64";
    case tensor_type::fp32: return "FP32";
  }
  return "BYTES";
}

infer_input infer_input::of_bool(std::string_view n, bool v) noexcept {
  infer_input in;
  in.name = n;
  in.type = tensor_type::boolean;
  in.number.boolean = v;
  return in;
}
infer_input infer_input::of_int32(std::string_view n, int32_t v) noexcept {
  infer_input in;
  in.name = n;
  in.type = tensor_type::int32;
  in.number.int32 = v;
  return in;
}
infer_input infer_input::of_fp32(std::string_view n, float v) noexcept {
  infer_input in;
  in.name = n;
  in.type = tensor_type::fp32;
  in.number.fp32 = v;
  return in;
}

size_t encoded_size(const infer_request& r) noexcept {
  size_t n = string_field_bytes(request_field::model_name, r.model_name) +
             string_field_bytes(request_field::model_version, r.model_version) +
             string_field_bytes(request_field::id, r.id) +
             parameters_bytes(request_field::parameters, r.parameters);
  for (const auto& in : r.inputs) {
    n += len_field_bytes(request_field::inputs, input_bytes(in)) +
         len_field_bytes(request_field::raw_input_contents, raw_contents_bytes(in));
  }
  return n;
}

// Field-number order, as protoc writes: all inputs (5) before all raw
// contents (7), whose order pairs them with the inputs.
size_t encode(const infer_request& r, char* out, size_t cap) noexcept {
  if (cap < encoded_size(r)) return 0;
  wire_writer w(out, cap);
  if (!r.model_name.empty()) w.bytes_field(request_field::model_name, r.model_name);
  if (!r.model_version.empty()) w.bytes_field(request_field::model_version, r.model_version);
  if (!r.id.empty()) w.bytes_field(request_field::id, r.id);
  put_parameters(w, request_field::parameters, r.parameters);
  for (const auto& in : r.inputs) put_input(w, in);
  for (const auto& in : r.inputs) put_raw_contents(w, in);
  return w.ok() ? w.written() : 0;
}

size_t encode_frame(const infer_request& r, char* out, size_t cap) noexcept {
  const size_t n = encoded_size(r);
  if (n > UINT32_MAX || cap < k_frame_header_bytes + n) return 0;
  write_frame_header(out, static_cast<uint32_t>(n));
  const size_t written = encode(r, out + k_frame_header_bytes, cap - k_frame_header_bytes);
  return written == n ? k_frame_header_bytes + n : 0;
}

}  // namespace sluice::grpc
