#include "options.hpp"

#include "../mock-vllm/options.hpp"  // the flags both mocks share

#include <charconv>
#include <limits>

namespace mock_triton {

namespace {

constexpr std::string_view k_help = R"(usage: mock-triton [flags]

A stand-in for Triton Inference Server's KServe v2 gRPC endpoint
(inference.GRPCInferenceService over HTTP/2 cleartext, prior knowledge) in
front of its vLLM backend or a TensorRT-LLM ensemble, for tests and
benchmarks of the gateway.

flags:
  --port N               listen port; 0 = ephemeral (default 8001)
  --host ADDR            listen address (default 127.0.0.1)
  --model NAME           the one ready model (default mock-model); every
                         response names the model the request named
  --ttft-ms N            time to first token in ms (default 0)
  --tokens-per-sec N     tokens per second per stream; 0 = at once (default 0)
  --reply-tokens N       reply length in tokens (default 16)
  --token-pad N          append N filler bytes 'x' to every token's text
  --fail-after-tokens N  fail a stream after N token responses (0 = never)
  --fail-mode M          how it fails: message (a response with error_message,
                         then grpc-status 0, as Triton reports a model's
                         error; default) or status (grpc-status 13 INTERNAL)
  --fail-status CODE     answer every ModelStreamInfer Trailers-Only with
                         grpc-status CODE (1..16; default 0: never)
  --not-ready            ServerReady and ModelReady answer ready=false
  --created UNIX         accepted as mock-vllm's; unused (no timestamps here)
  --help                 this text

methods (/inference.GRPCInferenceService/...): ServerLive (always true),
  ServerReady, ModelReady (true for --model only, any version),
  ModelStreamInfer (one ModelInferRequest per stream; a model other than
  --model gets Triton's "unknown model" error_message); anything else is
  grpc-status 12 UNIMPLEMENTED.
ModelStreamInfer inputs: text_input (BYTES) and stream (BOOL) always; an INT32
  max_tokens input makes it the TensorRT-LLM ensemble (flavour trtllm: output
  text_output only, shape [1,1]); otherwise the vLLM backend (flavour vllm:
  sampling_parameters JSON with max_tokens, exclude_input_in_output,
  return_finish_reason, return_num_input_tokens, return_num_output_tokens;
  outputs text_output shape [1], and on the last response finish_reason
  BYTES "stop"/"length", num_input_tokens and num_output_tokens UINT32 when
  asked).
reply: as mock-vllm's: token i is "tok<i>", with a space before it for i > 0;
  n = min(--reply-tokens, max_tokens); "length" when max_tokens cut it.
  stream=true: one response per token; stream=false: one response with the
  whole text (the vLLM flavour puts text_input before it unless
  exclude_input_in_output). With parameter triton_enable_empty_final_response
  = true every response carries triton_final_response=false and an empty one
  with true ends the stream. Then trailers grpc-status 0.
prompt tokens: the number of whitespace-separated words of text_input.
stdout: "mock-triton listening on grpc://HOST:PORT" at start;
  "request id=<id> model=<name> flavour=<vllm|trtllm> prompt_tokens=<n>" per
  ModelStreamInfer request; "abort id=<id> tokens=<n>" when the client
  cancels a stream (RST_STREAM, or the connection closes) before its end.
)";

}  // namespace

std::string_view help_text() noexcept { return k_help; }

parse_outcome parse_flags(int argc, char** argv, options& out, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    std::string_view value;
    bool inline_value = false;
    if (auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    if (flag == "--help" || flag == "-h") return parse_outcome::help;
    if (flag == "--not-ready") {
      out.not_ready = true;
      continue;
    }
    static constexpr std::string_view valued[] = {
        "--port", "--host", "--model", "--ttft-ms", "--tokens-per-sec", "--reply-tokens", "--token-pad",
        "--fail-after-tokens", "--fail-mode", "--fail-status", "--created"};
    bool known = false;
    for (std::string_view v : valued) known = known || v == flag;
    if (!known) {
      error = "unknown flag " + std::string(flag) + " (see --help)";
      return parse_outcome::error;
    }
    if (!inline_value) {
      if (i + 1 >= argc) {
        error = std::string(flag) + " needs a value";
        return parse_outcome::error;
      }
      value = argv[++i];
    }
    bool ok = true;
    if (mock_vllm::parse_shared_flag(flag, value, out, ok)) {
    } else if (flag == "--fail-mode") {
      if (value == "message") {
        out.fail = fail_mode::message;
      } else if (value == "status") {
        out.fail = fail_mode::status;
      } else {
        ok = false;
      }
    } else if (flag == "--fail-status") {
      ok = mock_vllm::parse_number(value, out.fail_status) && out.fail_status >= 1 && out.fail_status <= 16;
    }
    if (!ok) {
      error = "bad value for " + std::string(flag) + ": " + std::string(value);
      return parse_outcome::error;
    }
  }
  return parse_outcome::run;
}

}  // namespace mock_triton
