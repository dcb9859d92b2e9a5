#pragma once
// Command-line options of mock-vllm. Parsed once in main(); read-only after.
#include <cstdint>
#include <string>
#include <string_view>

namespace mock_vllm {

// vLLM changed its error body in 0.10.1: before it was flat
// {"object":"error","message",...}, since then {"error":{"message",...}}.
// Both exist in the field, so the gateway is tested against both.
enum class error_format : uint8_t { flat, nested };

struct options {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0 = ephemeral
  std::string model = "mock-model";
  uint64_t ttft_ms = 0;
  uint64_t tokens_per_sec = 0;  // per stream; 0 = as fast as possible
  uint32_t reply_tokens = 16;
  uint32_t fail_after_tokens = 0;  // 0 = never
  uint32_t token_pad = 0;          // filler bytes after each token's text
  uint32_t fail_status = 0;        // answer every generation request with this error status (0 = never)
  uint32_t threads = 1;
  std::string api_key;  // empty = no authentication
  int64_t created = -1;  // < 0 = the current time per request
  uint32_t max_model_len = 32768;
  uint32_t kv_capacity = 1000;  // requests that fill the simulated KV cache
  bool record = true;
  error_format errors = error_format::flat;
};

enum class parse_outcome : uint8_t { run, help, error };

// Returns: run with `out` filled, help for --help, or error with `error` set.
parse_outcome parse_flags(int argc, char** argv, options& out, std::string& error);

std::string_view help_text() noexcept;

}  // namespace mock_vllm
