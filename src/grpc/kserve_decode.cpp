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

using output_kind = decode_memo::output_kind;

// What an output is, by its name (and, for the counts, its datatype: the
// integer width; another datatype is not read).
struct output_class {
  output_kind kind = output_kind::other;
  uint8_t int_bytes = 0;
  bool int_signed = false;
};

output_class classify(std::string_view name, std::string_view datatype) noexcept {
  output_class c;
  if (name == "text_output") c.kind = output_kind::text;
  else if (name == "finish_reason") c.kind = output_kind::finish_reason;
  else if (name == "num_input_tokens") c.kind = output_kind::num_input_tokens;
  else if (name == "num_output_tokens") c.kind = output_kind::num_output_tokens;
  if (c.kind == output_kind::num_input_tokens || c.kind == output_kind::num_output_tokens) {
    if (datatype == "UINT32" || datatype == "INT32") c.int_bytes = 4;
    else if (datatype == "UINT64" || datatype == "INT64") c.int_bytes = 8;
    c.int_signed = c.int_bytes != 0 && datatype[0] == 'I';
  }
  return c;
}

// The first element of an integer tensor (Triton's vLLM backend sends the
// token counts as UINT32).
decode_status first_integer(const output_class& c, std::string_view raw, int64_t& out) noexcept {
  const size_t n = c.int_bytes;
  if (n == 0) return decode_status::ok;  // another datatype: left at -1
  if (raw.size() < n) return decode_status::bad_tensor;
  const uint64_t v = read_le(raw, n);
  if (n == 4) {
    out = c.int_signed ? int64_t{static_cast<int32_t>(v)} : static_cast<int64_t>(v);
  } else {
    out = c.int_signed || v <= INT64_MAX ? static_cast<int64_t>(v) : INT64_MAX;
  }
  return decode_status::ok;
}

// One output's raw contents into `out`, by what the output is.
decode_status read_contents(const output_class& c, std::string_view raw, stream_response& out) noexcept {
  switch (c.kind) {
    case output_kind::text:
      out.has_text_output = true;
      return first_bytes_element(raw, out.text_output);
    case output_kind::finish_reason:
      out.has_finish_reason = true;
      return first_bytes_element(raw, out.finish_reason);
    case output_kind::num_input_tokens: return first_integer(c, raw, out.num_input_tokens);
    case output_kind::num_output_tokens: return first_integer(c, raw, out.num_output_tokens);
    case output_kind::other: break;
  }
  return decode_status::ok;
}

// Outputs pair with raw contents by index; an output without its raw
// contents has nothing to read. `classes` gets each output's class (for a
// memo).
decode_status pair_outputs(const output_slots& s, stream_response& out, output_class* classes) noexcept {
  size_t n = s.outputs < k_outputs_max ? s.outputs : k_outputs_max;
  for (size_t i = 0; i < n; ++i) classes[i] = classify(s.name[i].view(), s.datatype[i].view());
  if (s.raws < n) n = s.raws;
  for (size_t i = 0; i < n; ++i) {
    const decode_status st = read_contents(classes[i], s.raw[i].view(), out);
    if (st != decode_status::ok) return st;
  }
  return decode_status::ok;
}

decode_memo::span16 span_in(std::string_view whole, std::string_view part) noexcept {
  if (part.empty()) return {0, 0};
  return {static_cast<uint16_t>(part.data() - whole.data()), static_cast<uint16_t>(part.size())};
}

std::string_view view_at(std::string_view whole, decode_memo::span16 s) noexcept {
  return whole.substr(s.off, s.len);
}

// `memo`: when given, what this decode learnt is remembered there (or the
// memo emptied, when these bytes have no prefix to remember).
decode_status read_infer_response(std::string_view msg, stream_response& out, decode_memo* memo) noexcept {
  output_slots slots;
  wire_reader r(msg);
  wire_field f;
  const char* first_raw = nullptr;  // where the first raw_output_contents field starts
  bool other_after_raw = false;     // a field other than raw contents follows it
  for (;;) {
    const char* at = r.pos();
    if (!r.next(f)) break;
    decode_status st = decode_status::ok;
    if (is_len(f, response_field::raw_output_contents)) {
      if (first_raw == nullptr) first_raw = at;
      if (slots.raws < k_outputs_max) slots.raw[slots.raws] = {f.bytes.data(), f.bytes.size()};
      ++slots.raws;
      continue;
    }
    if (first_raw != nullptr) other_after_raw = true;
    if (is_len(f, response_field::model_name)) out.model_name = f.bytes;
    else if (is_len(f, response_field::model_version)) out.model_version = f.bytes;
    else if (is_len(f, response_field::id)) out.id = f.bytes;
    else if (is_len(f, response_field::parameters)) st = read_parameter(f.bytes, out);
    else if (is_len(f, response_field::outputs)) st = read_output(f.bytes, slots);
    if (st != decode_status::ok) return st;
  }
  if (r.status() != decode_status::ok) return r.status();
  output_class classes[k_outputs_max];
  const decode_status st = pair_outputs(slots, out, classes);
  if (memo == nullptr || st != decode_status::ok) return st;
  const size_t prefix = first_raw == nullptr ? 0 : static_cast<size_t>(first_raw - msg.data());
  memo->prefix_len = 0;
  if (prefix == 0 || prefix > decode_memo::k_prefix_max || other_after_raw) return st;
  std::memcpy(memo->prefix, msg.data(), prefix);
  memo->prefix_len = static_cast<uint16_t>(prefix);
  memo->has_final_response = out.has_final_response;
  memo->final_response = out.final_response;
  memo->model_name = span_in(msg, out.model_name);
  memo->model_version = span_in(msg, out.model_version);
  memo->id = span_in(msg, out.id);
  const size_t n = slots.outputs < k_outputs_max ? slots.outputs : k_outputs_max;
  memo->outputs = static_cast<uint8_t>(n);
  for (size_t i = 0; i < n; ++i) {
    memo->kind[i] = classes[i].kind;
    memo->int_bytes[i] = classes[i].int_bytes;
    memo->int_signed[i] = classes[i].int_signed;
  }
  return st;
}

void clear(stream_response& out) noexcept {
  // Field by field, each from its own empty view: a cleared temporary
  // copied in costs a string store, and a chain of assignments makes GCC
  // store one view and read it back whole (a stalled store forward).
  constexpr std::string_view none;
  out.error_message = none;
  out.model_name = none;
  out.model_version = none;
  out.id = none;
  out.text_output = none;
  out.finish_reason = none;
  out.num_input_tokens = out.num_output_tokens = -1;
  out.has_text_output = out.has_finish_reason = out.has_final_response = out.final_response = false;
}

decode_status decode_outer(std::string_view message, stream_response& out) noexcept {
  wire_reader r(message);
  wire_field f;
  while (r.next(f)) {
    if (is_len(f, stream_field::error_message)) {
      out.error_message = f.bytes;
    } else if (is_len(f, stream_field::infer_response)) {
      const decode_status st = read_infer_response(f.bytes, out, nullptr);
      if (st != decode_status::ok) return st;
    }
  }
  return r.status();
}

// The InferResponse of a message that is that one field and nothing else
// (what a server writes for every token), or none.
bool only_infer_response(std::string_view message, std::string_view& inner) noexcept {
  wire_reader r(message);
  wire_field f;
  if (!r.next(f) || !is_len(f, stream_field::infer_response) || r.pos() != message.data() + message.size()) {
    return false;
  }
  inner = f.bytes;
  return true;
}

// The memo's prefix matched `inner`: the rest must be raw contents only.
// Returns: false when it is not (the full decode decides).
bool read_from_memo(std::string_view inner, const decode_memo& m, stream_response& out) noexcept {
  bytes_ref raw[k_outputs_max];
  size_t raws = 0;
  wire_reader r(inner.substr(m.prefix_len));
  wire_field f;
  while (r.next(f)) {
    if (!is_len(f, response_field::raw_output_contents)) return false;
    if (raws < k_outputs_max) raw[raws] = {f.bytes.data(), f.bytes.size()};
    ++raws;
  }
  if (r.status() != decode_status::ok) return false;
  out.model_name = view_at(inner, m.model_name);
  out.model_version = view_at(inner, m.model_version);
  out.id = view_at(inner, m.id);
  out.has_final_response = m.has_final_response;
  out.final_response = m.final_response;
  const size_t n = raws < m.outputs ? raws : m.outputs;
  for (size_t i = 0; i < n; ++i) {
    const output_class c{m.kind[i], m.int_bytes[i], m.int_signed[i]};
    if (read_contents(c, raw[i].view(), out) != decode_status::ok) return false;
  }
  return true;
}

}  // namespace

decode_status decode_stream_response(std::string_view message, stream_response& out) noexcept {
  clear(out);
  return decode_outer(message, out);
}

decode_status decode_stream_response(std::string_view message, stream_response& out, decode_memo& memo) noexcept {
  clear(out);
  std::string_view inner;
  if (!only_infer_response(message, inner)) return decode_outer(message, out);
  if (memo.prefix_len != 0 && inner.size() > memo.prefix_len &&
      std::memcmp(inner.data(), memo.prefix, memo.prefix_len) == 0) {
    if (read_from_memo(inner, memo, out)) {
      ++memo.hits;
      return decode_status::ok;
    }
    clear(out);
  }
  ++memo.misses;
  return read_infer_response(inner, out, &memo);
}

}  // namespace sluice::grpc
