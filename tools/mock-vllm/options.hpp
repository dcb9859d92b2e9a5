#pragma once
// Command-line options of mock-vllm. Parsed once in main(); read-only after.
#include <charconv>
#include <cstdint>
#include <limits>
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
  uint32_t max_running = 0;     // requests generating at once per event loop; 0 = unlimited
  bool record = true;
  error_format errors = error_format::flat;
};

enum class parse_outcome : uint8_t { run, help, error };

// Returns: run with `out` filled, help for --help, or error with `error` set.
parse_outcome parse_flags(int argc, char** argv, options& out, std::string& error);

// --- pieces mock-triton's flags share ----------------------------------------

template <class T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc{} && ptr == end;
}

// The knobs every mock has, by the same flags and member names (host, port,
// model, pacing, reply length, padding, failure point, clock). Returns:
// whether `flag` is one of them; `ok` says whether its value was good.
template <class Options>
bool parse_shared_flag(std::string_view flag, std::string_view value, Options& out, bool& ok) {
  uint64_t n = 0;
  if (flag == "--port") {
    ok = parse_number(value, n) && n <= std::numeric_limits<uint16_t>::max();
    out.port = static_cast<uint16_t>(n);
  } else if (flag == "--host") {
    out.host = value;
  } else if (flag == "--model") {
    ok = !value.empty();
    out.model = value;
  } else if (flag == "--ttft-ms") {
    ok = parse_number(value, out.ttft_ms);
  } else if (flag == "--tokens-per-sec") {
    ok = parse_number(value, out.tokens_per_sec);
  } else if (flag == "--reply-tokens") {
    ok = parse_number(value, out.reply_tokens) && out.reply_tokens <= 1'000'000;
  } else if (flag == "--fail-after-tokens") {
    ok = parse_number(value, out.fail_after_tokens);
  } else if (flag == "--token-pad") {
    ok = parse_number(value, out.token_pad) && out.token_pad <= 65536;
  } else if (flag == "--created") {
    ok = parse_number(value, out.created) && out.created >= 0;
  } else {
    return false;
  }
  return true;
}

std::string_view help_text() noexcept;

}  // namespace mock_vllm
