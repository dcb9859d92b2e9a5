#pragma once
// Command-line options of mock-triton. Parsed once in main(); read-only after.
#include <cstdint>
#include <string>
#include <string_view>

namespace mock_triton {

// How --fail-after-tokens ends a stream.
enum class fail_mode : uint8_t {
  message,  // a ModelStreamInferResponse with error_message, then grpc-status 0 (Triton's model error)
  status,   // trailers with grpc-status 13 INTERNAL
};

struct options {
  std::string host = "127.0.0.1";
  uint16_t port = 8001;  // Triton's gRPC port; 0 = ephemeral
  std::string model = "mock-model";
  uint64_t ttft_ms = 0;
  uint64_t tokens_per_sec = 0;  // per stream; 0 = as fast as possible
  uint32_t reply_tokens = 16;
  uint32_t fail_after_tokens = 0;  // 0 = never
  fail_mode fail = fail_mode::message;
  uint32_t fail_status = 0;  // answer every ModelStreamInfer with this grpc-status (0 = never)
  uint32_t token_pad = 0;
  int64_t created = -1;  // accepted as mock-vllm's; KServe responses carry no time
  bool not_ready = false;
};

enum class parse_outcome : uint8_t { run, help, error };

// Returns: run with `out` filled, help for --help, or error with `error` set.
parse_outcome parse_flags(int argc, char** argv, options& out, std::string& error);

std::string_view help_text() noexcept;

}  // namespace mock_triton
