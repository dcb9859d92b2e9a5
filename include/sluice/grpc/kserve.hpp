#pragma once
// grpc: the KServe v2 / Triton messages sluice exchanges on
// inference.GRPCInferenceService/ModelStreamInfer, hand-encoded over
// wire.hpp. Field numbers are those of grpc_service.proto in
// triton-inference-server/common; tests/unit/grpc/kserve_test.proto repeats
// the subset used here and the tests check our bytes against protoc's.
// Requests: ModelInferRequest with its inputs as raw_input_contents (the
// form Triton's vLLM and TensorRT-LLM backends read). Responses:
// ModelStreamInferResponse, read into the few values an adapter needs.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sluice/grpc/wire.hpp"

namespace sluice::grpc {

// One entry of a parameters map<string, InferParameter>. Views: the caller's.
struct infer_parameter {
  enum class kind : uint8_t { boolean, int64, string };
  std::string_view key;
  kind type = kind::boolean;
  bool bool_value = false;
  int64_t int64_value = 0;
  std::string_view string_value;

  static infer_parameter of_bool(std::string_view k, bool v) noexcept {
    return {k, kind::boolean, v, 0, {}};
  }
  static infer_parameter of_int64(std::string_view k, int64_t v) noexcept {
    return {k, kind::int64, false, v, {}};
  }
  static infer_parameter of_string(std::string_view k, std::string_view v) noexcept {
    return {k, kind::string, false, 0, v};
  }
};

// The datatypes sluice sends, with their KServe names ("BYTES", "BOOL"...).
enum class tensor_type : uint8_t { bytes, boolean, int32, int64, uint64, fp32 };
std::string_view datatype_name(tensor_type t) noexcept;

// One input tensor and its raw contents. BYTES holds `strings` (each
// element a 4-byte little-endian length, then its bytes); the numeric types
// hold one element, `number` (BOOL one byte, the rest little-endian; fp32 as
// its IEEE bits). `shape` empty means [element count].
struct infer_input {
  std::string_view name;
  tensor_type type = tensor_type::bytes;
  std::span<const int64_t> shape;
  std::span<const infer_parameter> parameters;
  std::span<const std::string_view> strings;
  union {
    bool boolean;
    int32_t int32;
    int64_t int64;
    uint64_t uint64;
    float fp32;
  } number{};

  static infer_input of_bytes(std::string_view n, std::span<const std::string_view> s) noexcept {
    infer_input in;
    in.name = n;
    in.strings = s;
    return in;
  }
  static infer_input of_bool(std::string_view n, bool v) noexcept;
  static infer_input of_int32(std::string_view n, int32_t v) noexcept;
  static infer_input of_fp32(std::string_view n, float v) noexcept;
};

struct infer_request {
  std::string_view model_name;
  std::string_view model_version;  // "" = the server's policy
  std::string_view id;
  std::span<const infer_parameter> parameters;
  std::span<const infer_input> inputs;
};

// The exact protobuf size of the request (no gRPC frame).
size_t encoded_size(const infer_request& r) noexcept;

// Writes the ModelInferRequest into [out, out + cap). Proto3 defaults are
// left out as protoc leaves them (empty strings), so bytes match its own.
// Returns: the bytes written, or 0 when `cap` is below encoded_size(r).
size_t encode(const infer_request& r, char* out, size_t cap) noexcept;

// The same message behind its 5-byte gRPC prefix: what goes on the stream.
// Returns: the bytes written, or 0 when `cap` is below
// k_frame_header_bytes + encoded_size(r) (or the message passes 4 GiB).
size_t encode_frame(const infer_request& r, char* out, size_t cap) noexcept;

// What an adapter needs from one ModelStreamInferResponse. Views point into
// the decoded message. Absent numbers are -1; absent strings empty (the has_
// flags tell an empty text_output from none).
struct stream_response {
  std::string_view error_message;  // non-empty: the server failed this request
  std::string_view model_name;
  std::string_view model_version;
  std::string_view id;
  std::string_view text_output;     // the first BYTES element
  std::string_view finish_reason;
  int64_t num_input_tokens = -1;
  int64_t num_output_tokens = -1;
  // (The flags together, after the views: the struct stays small enough to
  // be cleared with a few stores per message, not a string instruction.)
  bool has_text_output = false;
  bool has_finish_reason = false;
  bool has_final_response = false;  // the triton_final_response parameter was sent
  bool final_response = false;
};

// Reads a ModelStreamInferResponse: unknown fields of every wire type are
// skipped, at every level. Outputs pair with raw_output_contents by index
// (as Triton writes them); the first k_outputs_max outputs are looked at.
// Returns: ok with `out` filled, or why the bytes are malformed.
inline constexpr size_t k_outputs_max = 16;
decode_status decode_stream_response(std::string_view message, stream_response& out) noexcept;

// What the last full decode of a stream's response learnt about the bytes
// before its outputs' contents. A server writes every token's response the
// same way -- model name, version, id, parameters, the outputs' names and
// types, then raw_output_contents -- so from the second response on, the
// bytes up to the first raw_output_contents are usually those of the one
// before. When they are (compared byte for byte: the decode is a function
// of the bytes, so equal bytes decode equal), only the contents are read.
// Anything else is decoded in full, and remembered anew. Per stream (or
// per connection: a memo from another stream's bytes is as right, as the
// bytes decide); not shared between threads.
struct decode_memo {
  static constexpr size_t k_prefix_max = 320;
  enum class output_kind : uint8_t { other, text, finish_reason, num_input_tokens, num_output_tokens };
  struct span16 {
    uint16_t off, len;
  };
  uint16_t prefix_len = 0;           // 0: nothing remembered
  uint8_t outputs = 0;               // outputs in the prefix (at most k_outputs_max looked at)
  bool has_final_response = false;
  bool final_response = false;
  span16 model_name{}, model_version{}, id{};  // offsets into the InferResponse's bytes
  output_kind kind[k_outputs_max] = {};
  uint8_t int_bytes[k_outputs_max] = {};  // integer outputs: 4 or 8 (0: another datatype)
  bool int_signed[k_outputs_max] = {};
  char prefix[k_prefix_max];
  // Counts, for tests and the curious: responses read from the memo, and
  // responses decoded in full.
  uint64_t hits = 0, misses = 0;
};
// The same decode, with `memo`'s help (and kept up to date by it). `out`
// equals what decode_stream_response(message, out) gives, for every input.
decode_status decode_stream_response(std::string_view message, stream_response& out, decode_memo& memo) noexcept;

// --- readiness: ServerReady and ModelReady (the health probe's RPCs) -------

// ServerReadyRequest is empty: its frame is the 5-byte prefix alone.
inline constexpr size_t k_server_ready_frame_bytes = k_frame_header_bytes;
size_t encode_server_ready_frame(char* out, size_t cap) noexcept;

// ModelReadyRequest { name = 1; version = 2; } behind its gRPC prefix
// (empty strings left out, as protoc does). Returns: the bytes written, or
// 0 when `cap` is too small.
size_t model_ready_frame_bytes(std::string_view name, std::string_view version) noexcept;
size_t encode_model_ready_frame(std::string_view name, std::string_view version, char* out, size_t cap) noexcept;

// Reads ServerReadyResponse or ModelReadyResponse (both { bool ready = 1; };
// absent means false, as in proto3). Returns: ok with `ready` set, or why
// the bytes are malformed.
decode_status decode_ready_response(std::string_view message, bool& ready) noexcept;

}  // namespace sluice::grpc
