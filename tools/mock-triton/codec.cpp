#include "codec.hpp"


#include "plan.hpp"  // mock-vllm's count_words
#include "wire.hpp"  // mock-vllm's append_token_text

namespace mock_triton {

namespace {

using sluice::grpc::decode_status;
using sluice::grpc::wire_field;
using sluice::grpc::wire_reader;
using sluice::grpc::wire_type;

// --- reading ---------------------------------------------------------------

// A parameters map entry {key = 1, value = 2: InferParameter}: is it
// `key` = bool true?
decode_status read_bool_parameter(std::string_view entry, std::string_view key, bool& is_true) {
  wire_reader r(entry);
  wire_field f;
  std::string_view k;
  bool value = false;
  while (r.next(f)) {
    if (f.number == 1 && f.type == wire_type::len) k = f.bytes;
    if (f.number == 2 && f.type == wire_type::len) {
      wire_reader v(f.bytes);
      wire_field p;
      while (v.next(p)) {
        if (p.number == 1 && p.type == wire_type::varint) value = p.value != 0;  // bool_param
      }
      if (v.status() != decode_status::ok) return v.status();
    }
  }
  if (r.status() != decode_status::ok) return r.status();
  if (k == key) is_true = value;
  return decode_status::ok;
}

decode_status read_input(std::string_view message, input_tensor& out) {
  wire_reader r(message);
  wire_field f;
  while (r.next(f)) {
    if (f.type != wire_type::len) continue;
    if (f.number == 1) out.name = f.bytes;
    if (f.number == 2) out.datatype = f.bytes;
  }
  return r.status();
}

const input_tensor* find_input(const infer_request& r, std::string_view name) {
  for (const auto& in : r.inputs) {
    if (in.name == name) return &in;
  }
  return nullptr;
}

uint32_t read_le32(std::string_view raw) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(raw[i])} << (8 * i);
  return v;
}

// The first element of a BYTES tensor. Returns: false when malformed.
bool first_string(const input_tensor& in, std::string_view& out) {
  if (in.datatype != "BYTES" || !in.has_raw || in.raw.size() < 4) return false;
  uint32_t n = read_le32(in.raw);
  if (n > in.raw.size() - 4) return false;
  out = in.raw.substr(4, n);
  return true;
}

bool read_bool_input(const input_tensor& in, bool& out) {
  if (in.datatype != "BOOL" || !in.has_raw || in.raw.empty()) return false;
  out = in.raw[0] != 0;
  return true;
}

bool read_int32_input(const input_tensor& in, int64_t& out) {
  if (!in.has_raw || in.raw.size() < 4) return false;
  if (in.datatype == "INT32") {
    out = static_cast<int32_t>(read_le32(in.raw));
  } else if (in.datatype == "UINT32") {
    out = read_le32(in.raw);
  } else {
    return false;
  }
  return true;
}

// An optional BOOL input: absent leaves `out`. Returns: false when malformed.
bool optional_bool(const infer_request& r, std::string_view name, bool& out, std::string& error) {
  const input_tensor* in = find_input(r, name);
  if (in == nullptr || read_bool_input(*in, out)) return true;
  error = "input '" + std::string(name) + "' must be a BOOL tensor with one element";
  return false;
}

// --- writing ---------------------------------------------------------------

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_tag(std::string& out, uint32_t field, wire_type t) {
  put_varint(out, (uint64_t{field} << 3) | static_cast<uint64_t>(t));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, wire_type::len);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

// Prefixes the message built in out[from..] with its gRPC frame header.
void frame_from(std::string& out, size_t from) {
  char header[sluice::grpc::k_frame_header_bytes];
  sluice::grpc::write_frame_header(header, static_cast<uint32_t>(out.size() - from));
  out.insert(from, header, sizeof header);
}

struct output {
  std::string_view name;
  std::string_view datatype;
  std::span<const int64_t> shape;
  std::string raw;
};

constexpr int64_t k_shape_one[] = {1};
constexpr int64_t k_shape_one_one[] = {1, 1};

// ModelStreamInferResponse{infer_response = 2: ModelInferResponse{...}}.
void append_infer_response(std::string& out, const response_head& head, std::span<const output> outputs) {
  std::string inner;
  if (!head.model_name.empty()) put_bytes(inner, 1, head.model_name);
  if (!head.model_version.empty()) put_bytes(inner, 2, head.model_version);
  if (!head.id.empty()) put_bytes(inner, 3, head.id);
  if (head.final_flag) {
    // map entry {key = 1, value = 2: InferParameter{bool_param = 1}}; a
    // oneof member is written even when false.
    std::string value;
    put_tag(value, 1, wire_type::varint);
    put_varint(value, head.final ? 1 : 0);
    std::string entry;
    put_bytes(entry, 1, "triton_final_response");
    put_bytes(entry, 2, value);
    put_bytes(inner, 4, entry);
  }
  for (const output& o : outputs) {
    std::string tensor;
    put_bytes(tensor, 1, o.name);
    put_bytes(tensor, 2, o.datatype);
    std::string packed;
    for (int64_t d : o.shape) put_varint(packed, static_cast<uint64_t>(d));
    put_bytes(tensor, 3, packed);
    put_bytes(inner, 5, tensor);
  }
  for (const output& o : outputs) put_bytes(inner, 6, o.raw);
  size_t from = out.size();
  put_bytes(out, 2, inner);
  frame_from(out, from);
}

std::string bytes_element(std::string_view text) {
  std::string raw;
  put_le32(raw, static_cast<uint32_t>(text.size()));
  raw += text;
  return raw;
}

std::string uint32_element(uint32_t v) {
  std::string raw;
  put_le32(raw, v);
  return raw;
}

}  // namespace

decode_status decode_infer_request(std::string_view message, infer_request& out) {
  out.model_name = out.model_version = out.id = {};
  out.empty_final_response = false;
  out.inputs.clear();
  // raw_input_contents pair with inputs by index, whatever their order on
  // the wire; they are paired once the whole message is read.
  std::vector<std::string_view> contents;
  wire_reader r(message);
  wire_field f;
  while (r.next(f)) {
    if (f.type != wire_type::len) continue;
    decode_status s = decode_status::ok;
    switch (f.number) {
      case 1: out.model_name = f.bytes; break;
      case 2: out.model_version = f.bytes; break;
      case 3: out.id = f.bytes; break;
      case 4: s = read_bool_parameter(f.bytes, "triton_enable_empty_final_response", out.empty_final_response); break;
      case 5: s = read_input(f.bytes, out.inputs.emplace_back()); break;
      case 7: contents.push_back(f.bytes); break;
      default: break;
    }
    if (s != decode_status::ok) return s;
  }
  if (r.status() != decode_status::ok) return r.status();
  for (size_t i = 0; i < out.inputs.size() && i < contents.size(); ++i) {
    out.inputs[i].raw = contents[i];
    out.inputs[i].has_raw = true;
  }
  return decode_status::ok;
}

decode_status decode_model_ready_request(std::string_view message, std::string_view& name,
                                         std::string_view& version) {
  name = version = {};
  wire_reader r(message);
  wire_field f;
  while (r.next(f)) {
    if (f.type != wire_type::len) continue;
    if (f.number == 1) name = f.bytes;
    if (f.number == 2) version = f.bytes;
  }
  return r.status();
}

std::string_view flavour_name(flavour f) noexcept { return f == flavour::vllm ? "vllm" : "trtllm"; }

bool make_stream_plan(simdjson::dom::parser& parser, const infer_request& request, uint32_t reply_tokens,
                      stream_plan& out, std::string& error) {
  out = stream_plan{};
  const input_tensor* text = find_input(request, "text_input");
  if (text == nullptr) {
    error = "expected 1 or more inputs, got none named 'text_input'";
    return false;
  }
  if (!first_string(*text, out.text_input)) {
    error = "input 'text_input' must be a BYTES tensor with one element";
    return false;
  }
  out.prompt_tokens = mock_vllm::count_words(out.text_input);
  if (!optional_bool(request, "stream", out.stream, error)) return false;

  int64_t max_tokens = -1;  // -1: no limit from the request
  if (const input_tensor* max = find_input(request, "max_tokens")) {
    out.kind = flavour::trtllm;
    if (!read_int32_input(*max, max_tokens)) {
      error = "input 'max_tokens' must be an INT32 tensor with one element";
      return false;
    }
  } else {
    out.kind = flavour::vllm;
    if (!optional_bool(request, "exclude_input_in_output", out.exclude_input_in_output, error) ||
        !optional_bool(request, "return_finish_reason", out.return_finish_reason, error) ||
        !optional_bool(request, "return_num_input_tokens", out.return_num_input_tokens, error) ||
        !optional_bool(request, "return_num_output_tokens", out.return_num_output_tokens, error)) {
      return false;
    }
    if (const input_tensor* sampling = find_input(request, "sampling_parameters")) {
      std::string_view json;
      if (!first_string(*sampling, json)) {
        error = "input 'sampling_parameters' must be a BYTES tensor with one element";
        return false;
      }
      simdjson::padded_string padded(json);
      simdjson::dom::object params;
      if (parser.parse(padded).get(params) != simdjson::SUCCESS) {
        error = "sampling_parameters is not a JSON object";
        return false;
      }
      simdjson::dom::element limit;
      if (params["max_tokens"].get(limit) == simdjson::SUCCESS && !limit.is_null()) {
        // The vLLM backend accepts numbers and numeric strings alike.
        std::string_view digits;
        if (limit.get(digits) == simdjson::SUCCESS) {
          max_tokens = 0;
          for (char c : digits) {
            if (c < '0' || c > '9' || max_tokens > 100'000'000) {
              max_tokens = -2;
              break;
            }
            max_tokens = max_tokens * 10 + (c - '0');
          }
        } else if (limit.get(max_tokens) != simdjson::SUCCESS) {
          max_tokens = -2;
        }
        if (max_tokens < 1) {
          error = "sampling_parameters: max_tokens must be a positive integer";
          return false;
        }
      }
    }
  }
  if (out.kind == flavour::trtllm && max_tokens < 1) {
    error = "max_tokens must be at least 1";
    return false;
  }
  out.tokens = reply_tokens;
  if (max_tokens > 0 && max_tokens < static_cast<int64_t>(reply_tokens)) {
    out.tokens = static_cast<uint32_t>(max_tokens);
    out.ends_by_length = true;
  }
  return true;
}

uint32_t responses(const stream_plan& plan) noexcept {
  // A stream sends one response per token (at least one, for the extras);
  // otherwise one with the whole text. A vLLM stream that ends by EOS ends
  // with the EOS step, which decodes to no text: a response of its own that
  // carries the finish reason (vLLM's own stream does the same).
  if (!plan.stream) return 1;
  if (plan.kind == flavour::vllm && !plan.ends_by_length) return plan.tokens + 1;
  return plan.tokens > 0 ? plan.tokens : 1;
}

void append_token_response(std::string& out, const stream_plan& plan, const response_head& head,
                           uint32_t index, uint32_t token_pad) {
  std::string text;
  if (!plan.stream) {
    // The vLLM backend puts the prompt before the reply unless told not to.
    if (plan.kind == flavour::vllm && !plan.exclude_input_in_output) text += plan.text_input;
    for (uint32_t i = 0; i < plan.tokens; ++i) mock_vllm::append_token_text(text, i, token_pad);
  } else if (index < plan.tokens) {
    mock_vllm::append_token_text(text, index, token_pad);
  }
  std::span<const int64_t> text_shape = plan.kind == flavour::trtllm ? std::span<const int64_t>(k_shape_one_one)
                                                                     : std::span<const int64_t>(k_shape_one);
  std::vector<output> outputs;
  outputs.push_back(output{"text_output", "BYTES", text_shape, bytes_element(text)});
  bool last = index + 1 == responses(plan);
  if (last && plan.kind == flavour::vllm) {
    if (plan.return_finish_reason) {
      outputs.push_back(output{"finish_reason", "BYTES", k_shape_one, bytes_element(plan.ends_by_length ? "length" : "stop")});
    }
    if (plan.return_num_input_tokens) {
      outputs.push_back(output{"num_input_tokens", "UINT32", k_shape_one, uint32_element(plan.prompt_tokens)});
    }
    if (plan.return_num_output_tokens) {
      outputs.push_back(output{"num_output_tokens", "UINT32", k_shape_one, uint32_element(plan.tokens)});
    }
  }
  append_infer_response(out, head, outputs);
}

void append_empty_final_response(std::string& out, const response_head& head) {
  response_head final_head = head;
  final_head.final_flag = true;
  final_head.final = true;
  append_infer_response(out, final_head, {});
}

void append_error_response(std::string& out, std::string_view message) {
  size_t from = out.size();
  put_bytes(out, 1, message);
  frame_from(out, from);
}

void append_ready_response(std::string& out, bool ready) {
  size_t from = out.size();
  if (ready) {  // proto3 leaves a false bool out
    put_tag(out, 1, wire_type::varint);
    put_varint(out, 1);
  }
  frame_from(out, from);
}

std::string percent_encode(std::string_view text) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c > 0x7e || c == '%') {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace mock_triton
