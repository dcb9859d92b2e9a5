// grpc: ModelStreamInferResponse decoding. One pass over the bytes, views
// only: outputs and raw_output_contents are remembered by index in fixed
// arrays and paired at the end, since the proto allows either order.
#include <cstring>

#include "sluice/grpc/kserve.hpp"

namespace sluice::grpc {
namespace {

namespace stream_field {
constexpr uint32_t error_message = 1, infer_response = 2;
}
namespace response_field {
constexpr uint32_t model_name = 1, model_version = 2, id = 3, parameters = 4, outputs = 5,
                   raw_output_contents = 6;
}
namespace tensor_field {
constexpr uint32_t name = 1, datatype = 2;
}
namespace entry_field {
constexpr uint32_t key = 1, value = 2;
}
namespace param_field {
constexpr uint32_t bool_param = 1;
}

// A known field sent with another wire type is skipped as unknown, as
// protobuf's own parsers do.
bool is_len(const wire_field& f, uint32_t number) noexcept { return f.is(number, wire_type::len); }

// A view without a constructor: the slots below are filled before they are
// read (by count), so a message's decode does not zero ~800 bytes first.
struct bytes_ref {
  const char* p;
  size_t n;
  std::string_view view() const noexcept { return {p, n}; }
};

struct output_slots {
  bytes_ref name[k_outputs_max];      // [0, outputs) set
  bytes_ref datatype[k_outputs_max];
  bytes_ref raw[k_outputs_max];       // [0, raws) set
  size_t outputs = 0;
  size_t raws = 0;
};

decode_status read_output(std::string_view msg, output_slots& s) noexcept {
  wire_reader r(msg);
  wire_field f;
  std::string_view name, datatype;
  while (r.next(f)) {
    if (is_len(f, tensor_field::name)) name = f.bytes;
    else if (is_len(f, tensor_field::datatype)) datatype = f.bytes;
    // shape, parameters, contents: not needed (Triton sends raw contents)
  }
  if (r.status() != decode_status::ok) return r.status();
  if (s.outputs < k_outputs_max) {
    s.name[s.outputs] = {name.data(), name.size()};
    s.datatype[s.outputs] = {datatype.data(), datatype.size()};
  }
  ++s.outputs;
  return decode_status::ok;
}

// A map<string, InferParameter> entry: only triton_final_response matters.
decode_status read_parameter(std::string_view msg, stream_response& out) noexcept {
  wire_reader r(msg);
  wire_field f;
  std::string_view key, value;
  bool has_value = false;
  while (r.next(f)) {
    if (is_len(f, entry_field::key)) key = f.bytes;
    else if (is_len(f, entry_field::value)) {
      value = f.bytes;
      has_value = true;
    }
  }
  if (r.status() != decode_status::ok) return r.status();
  if (key != "triton_final_response" || !has_value) return decode_status::ok;
  wire_reader v(value);
  while (v.next(f)) {
    if (f.is(param_field::bool_param, wire_type::varint)) {
      out.has_final_response = true;
      out.final_response = f.value != 0;
    }
  }
  return v.status();
}

uint64_t read_le(std::string_view b, size_t n) noexcept {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
  return v;
}

// The first element of a BYTES tensor's raw contents: a 4-byte
// little-endian length, then that many bytes. No bytes at all is an empty
// tensor (shape [0]): an empty text.
decode_status first_bytes_element(std::string_view raw, std::string_view& out) noexcept {
  if (raw.empty()) {
    out = {};
    return decode_status::ok;
  }
  if (raw.size() < 4) return decode_status::bad_tensor;
  const uint64_t len = read_le(raw, 4);
  if (len > raw.size() - 4) return decode_status::bad_tensor;
  out = raw.substr(4, static_cast<size_t>(len));
  return decode_status::ok;
}

// The first element of an integer tensor (Triton's vLLM backend sends the
// token counts as UINT32). Another datatype leaves `out` at -1.
decode_status first_integer(std::string_view datatype, std::string_view raw,
                            int64_t& out) noexcept {
  size_t n = 0;
  if (datatype == "UINT32" || datatype == "INT32") {
    n = 4;
  } else if (datatype == "UINT64" || datatype == "INT64") {
    n = 8;
  } else {
    return decode_status::ok;
  }
  const bool is_signed = datatype[0] == 'I';
  if (raw.size() < n) return decode_status::bad_tensor;
  const uint64_t v = read_le(raw, n);
  if (n == 4) {
    out = is_signed ? int64_t{static_cast<int32_t>(v)} : static_cast<int64_t>(v);
  } else {
    out = is_signed || v <= INT64_MAX ? static_cast<int64_t>(v) : INT64_MAX;
  }
  return decode_status::ok;
}

decode_status pair_outputs(const output_slots& s, stream_response& out) noexcept {
  size_t n = s.outputs < k_outputs_max ? s.outputs : k_outputs_max;
  if (s.raws < n) n = s.raws;  // an output without its raw contents has nothing to read
  for (size_t i = 0; i < n; ++i) {
    decode_status st = decode_status::ok;
    const std::string_view name = s.name[i].view();
    const std::string_view raw = s.raw[i].view();
    if (name == "text_output") {
      out.has_text_output = true;
      st = first_bytes_element(raw, out.text_output);
    } else if (name == "finish_reason") {
      out.has_finish_reason = true;
      st = first_bytes_element(raw, out.finish_reason);
    } else if (name == "num_input_tokens") {
      st = first_integer(s.datatype[i].view(), raw, out.num_input_tokens);
    } else if (name == "num_output_tokens") {
      st = first_integer(s.datatype[i].view(), raw, out.num_output_tokens);
    }
    if (st != decode_status::ok) return st;
  }
  return decode_status::ok;
}

decode_status read_infer_response(std::string_view msg, stream_response& out) noexcept {
  output_slots slots;
  wire_reader r(msg);
  wire_field f;
  while (r.next(f)) {
    decode_status st = decode_status::ok;
    if (is_len(f, response_field::model_name)) out.model_name = f.bytes;
    else if (is_len(f, response_field::model_version)) out.model_version = f.bytes;
    else if (is_len(f, response_field::id)) out.id = f.bytes;
    else if (is_len(f, response_field::parameters)) st = read_parameter(f.bytes, out);
    else if (is_len(f, response_field::outputs)) st = read_output(f.bytes, slots);
    else if (is_len(f, response_field::raw_output_contents)) {
      if (slots.raws < k_outputs_max) slots.raw[slots.raws] = {f.bytes.data(), f.bytes.size()};
      ++slots.raws;
    }
    if (st != decode_status::ok) return st;
  }
  if (r.status() != decode_status::ok) return r.status();
  return pair_outputs(slots, out);
}

}  // namespace

decode_status decode_stream_response(std::string_view message, stream_response& out) noexcept {
  // Field by field: a cleared temporary copied in costs a string store.
  out.error_message = out.model_name = out.model_version = out.id = out.text_output = out.finish_reason = {};
  out.num_input_tokens = out.num_output_tokens = -1;
  out.has_text_output = out.has_finish_reason = out.has_final_response = out.final_response = false;
  wire_reader r(message);
  wire_field f;
  while (r.next(f)) {
    if (is_len(f, stream_field::error_message)) {
      out.error_message = f.bytes;
    } else if (is_len(f, stream_field::infer_response)) {
      const decode_status st = read_infer_response(f.bytes, out);
      if (st != decode_status::ok) return st;
    }
  }
  return r.status();
}

}  // namespace sluice::grpc
