#pragma once
// mock-triton's pure part: the KServe v2 messages of
// inference.GRPCInferenceService as Triton's vLLM backend and TensorRT-LLM
// ensemble exchange them. Requests are read with sluice's grpc::wire_reader
// (views into the message); responses are written whole, behind their
// 5-byte gRPC prefix, into a caller's std::string.
#include <simdjson.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/grpc/wire.hpp"

namespace mock_triton {

// One input tensor with the raw_input_contents entry of the same index.
struct input_tensor {
  std::string_view name;
  std::string_view datatype;
  std::string_view raw;
  bool has_raw = false;
};

// One per ModelInferRequest; views into the decoded message.
struct infer_request {
  std::string_view model_name;
  std::string_view model_version;
  std::string_view id;
  bool empty_final_response = false;  // parameter triton_enable_empty_final_response
  std::vector<input_tensor> inputs;
};

// Returns: ok with `out` filled, or why the bytes are malformed.
sluice::grpc::decode_status decode_infer_request(std::string_view message, infer_request& out);

// ModelReadyRequest{name = 1, version = 2}.
sluice::grpc::decode_status decode_model_ready_request(std::string_view message, std::string_view& name,
                                                       std::string_view& version);

enum class flavour : uint8_t { vllm, trtllm };
std::string_view flavour_name(flavour f) noexcept;

// What a stream asks for, from its inputs.
struct stream_plan {
  flavour kind = flavour::vllm;
  bool stream = false;
  std::string_view text_input;
  uint32_t prompt_tokens = 0;  // words of text_input
  uint32_t tokens = 0;         // min(--reply-tokens, max_tokens)
  bool ends_by_length = false;
  // vLLM backend only.
  bool exclude_input_in_output = false;
  bool return_finish_reason = false;
  bool return_num_input_tokens = false;
  bool return_num_output_tokens = false;
};

// The TensorRT-LLM ensemble is told by its INT32 max_tokens input, the vLLM
// backend by everything else. Returns: true with `out` set, or false with
// `error` set to what Triton would put in error_message.
bool make_stream_plan(simdjson::dom::parser& parser, const infer_request& request, uint32_t reply_tokens,
                      stream_plan& out, std::string& error);

// The head every response of one stream repeats.
struct response_head {
  std::string_view model_name;
  std::string_view model_version;
  std::string_view id;
  bool final_flag = false;  // send the triton_final_response parameter
  bool final = false;       // its value
};

// Response i of a stream plan (i < responses(plan)), framed: the token's
// text (or, not streaming, the whole reply), with the finish reason and
// counts on the last one when asked.
uint32_t responses(const stream_plan& plan) noexcept;
void append_token_response(std::string& out, const stream_plan& plan, const response_head& head,
                           uint32_t index, uint32_t token_pad = 0);
// The empty response that ends a stream with triton_final_response = true.
void append_empty_final_response(std::string& out, const response_head& head);
// ModelStreamInferResponse{error_message}: a model's error, the stream goes on.
void append_error_response(std::string& out, std::string_view message);
// ServerReadyResponse / ModelReadyResponse: {bool ready = 1}.
void append_ready_response(std::string& out, bool ready);

// grpc-message's percent-encoding (PROTOCOL-HTTP2.md): bytes outside
// 0x20..0x7e and '%' itself as %XX.
std::string percent_encode(std::string_view text);

}  // namespace mock_triton
