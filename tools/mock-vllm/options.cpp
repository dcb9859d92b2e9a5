#include "options.hpp"

#include <charconv>
#include <limits>

namespace mock_vllm {

namespace {

constexpr std::string_view k_help = R"(usage: mock-vllm [flags]

A fast stand-in for vLLM's OpenAI-compatible server (wire format of vLLM
0.10.x behind uvicorn) for tests and benchmarks of the gateway.

flags:
  --port N               listen port; 0 = ephemeral (default 8000)
  --host ADDR            listen address (default 127.0.0.1)
  --model NAME           served model name (default mock-model); every answer
                         names this model, whatever the request asked for
  --ttft-ms N            time to first token in ms (default 0)
  --tokens-per-sec N     tokens per second per stream; 0 = at once (default 0)
  --reply-tokens N       reply length in tokens (default 16)
  --fail-after-tokens N  drop the connection after N content tokens (0 = never);
                         a request header "x-mock-fail-after-tokens: N"
                         sets it for that request alone
  --token-pad N          append N filler bytes 'x' to every token's text, so a
                         reply of many MiB needs few tokens (default 0; at
                         most 65536)
  --fail-status N        answer every completion/chat/embedding/messages
                         request with HTTP N and vLLM's error body (Anthropic's
                         on /v1/messages), as an engine that is down or
                         overloaded does: 400, 422, 429, 500, 502, 503, 504 or
                         529 (default 0: never)
  --threads N            event loops, one SO_REUSEPORT listener each (default 1)
  --api-key KEY          require "Authorization: Bearer KEY" on /v1/* (401
                         {"error":"Unauthorized"} otherwise, as vLLM), and
                         "x-api-key: KEY" on /v1/messages (401
                         authentication_error otherwise, as Anthropic)
  --created UNIX         fixed "created" timestamp (default: current time)
  --max-model-len N      max_model_len reported by /v1/models (default 32768)
  --kv-capacity N        requests in flight that make kv_cache_usage_perc 1.0
                         (default 1000)
  --max-running N        a capacity model (vLLM's max_num_seqs): at most N
                         requests generate at once per event loop, each at
                         --tokens-per-sec; the rest wait, first come first
                         served, before their time to first token starts
                         (vllm:num_requests_waiting counts them); 0 =
                         unlimited (default)
  --error-format F       flat (vLLM < 0.10.1, default) or nested (>= 0.10.1)
  --no-record            do not record requests for /debug/requests
  --help                 this text

reply: token i (0-based) is "tok<i>", preceded by one space for i > 0, so the
  text is "tok0 tok1 ... tok<n-1>" (each "tok<i>" followed by --token-pad
  bytes 'x'). n = min(--reply-tokens, max_tokens) where
  max_tokens is max_completion_tokens, else max_tokens, of the request.
  finish_reason is "length" when max_tokens < --reply-tokens, else "stop".
  completion_tokens = n.
prompt_tokens (deterministic, no tokenizer):
  words(s) = number of maximal runs of non-whitespace bytes in s
             (whitespace: space, \t, \n, \v, \f, \r)
  chat:        sum over messages of 4 + words(content), where an array content
               counts the words of each part's "text"; null content counts 0
  completions: words(prompt) for a string; the sum for an array of strings;
               the number of ids for an array of token ids (or of arrays)
  embeddings:  as completions, on "input"; 8 floats per input
stdout: one line "mock-vllm listening on http://HOST:PORT" at start, and
  "abort request_id=<id> tokens=<n>" when a client leaves before its reply is
  complete (<id> is the response id, e.g. chatcmpl-<X-Request-Id>).

Anthropic Messages API (POST /v1/messages, not in vLLM): needs an
  anthropic-version header and max_tokens. prompt_tokens as chat, the system
  prompt counting as one message (text blocks and tool_result contents count
  their words; image and tool_use blocks none); the reply is the chat reply
  (same tokens, n = min(--reply-tokens, max_tokens)), stop_reason "max_tokens"
  when cut, else "end_turn"; id "msg_" + X-Request-Id. Streams send
  message_start, content_block_start, ping, one content_block_delta per
  token, content_block_stop, message_delta, message_stop; --fail-after-tokens
  sends an error event (overloaded_error) before it drops the connection.
  Test knob: with "tools" and "weather" in the last user message, the reply
  is a tool_use block (id "toolu_" + X-Request-Id, the first tool's name,
  input {"city":"Paris"} streamed in 3 input_json_delta pieces, counted as 3
  output tokens), stop_reason "tool_use".

OpenAI Responses API (POST /v1/responses, as vLLM serves it): needs model and
  input. prompt_tokens = words of the instructions and of the input (a string,
  or each item's content and output text); the reply is the chat reply (n =
  min(--reply-tokens, max_output_tokens)), status "incomplete" with
  incomplete_details.reason "max_output_tokens" when cut; id "resp_" +
  X-Request-Id, its message item "msg_" + the same. Streams send
  response.created, response.in_progress, output_item.added,
  content_part.added, one output_text.delta per token, output_text.done,
  content_part.done, output_item.done, response.completed (or .incomplete),
  each with its sequence_number.

mock-only endpoints (not in vLLM):
  GET /debug/requests     the last 1000 requests, oldest first, as a JSON array
                          of {"method","target","headers":[[name,value],...],
                          "body"}; debug endpoints are not recorded or counted
  DELETE /debug/requests  clears the record and the counters
metrics (GET /metrics): vllm:num_requests_running (streaming tokens),
  vllm:num_requests_waiting (before the first token), vllm:kv_cache_usage_perc,
  mock_requests_total, mock_aborts_total, mock_failures_total
)";

}  // namespace

std::string_view help_text() noexcept { return k_help; }

parse_outcome parse_flags(int argc, char** argv, options& out, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    std::string_view value;
    // Accept both "--flag value" and "--flag=value".
    bool inline_value = false;
    if (auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    if (flag == "--help" || flag == "-h") return parse_outcome::help;
    if (flag == "--no-record") {
      out.record = false;
      continue;
    }
    static constexpr std::string_view valued[] = {
        "--port",    "--host",    "--model",   "--ttft-ms",       "--tokens-per-sec", "--reply-tokens",
        "--fail-after-tokens", "--token-pad", "--fail-status", "--threads", "--api-key", "--created", "--max-model-len", "--kv-capacity", "--max-running",
        "--error-format"};
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
    if (parse_shared_flag(flag, value, out, ok)) {
    } else if (flag == "--fail-status") {
      ok = parse_number(value, out.fail_status) &&
           (out.fail_status == 400 || out.fail_status == 422 || out.fail_status == 429 ||
            (out.fail_status >= 500 && out.fail_status <= 504 && out.fail_status != 501) ||
            out.fail_status == 529);
    } else if (flag == "--threads") {
      ok = parse_number(value, out.threads) && out.threads >= 1 && out.threads <= 256;
    } else if (flag == "--api-key") {
      out.api_key = value;
    } else if (flag == "--max-model-len") {
      ok = parse_number(value, out.max_model_len);
    } else if (flag == "--kv-capacity") {
      ok = parse_number(value, out.kv_capacity) && out.kv_capacity >= 1;
    } else if (flag == "--max-running") {
      ok = parse_number(value, out.max_running);
    } else if (flag == "--error-format") {
      if (value == "flat") {
        out.errors = error_format::flat;
      } else if (value == "nested") {
        out.errors = error_format::nested;
      } else {
        ok = false;
      }
    } else {
      error = "unknown flag " + std::string(flag) + " (see --help)";
      return parse_outcome::error;
    }
    if (!ok) {
      error = "bad value for " + std::string(flag) + ": " + std::string(value);
      return parse_outcome::error;
    }
  }
  return parse_outcome::run;
}

}  // namespace mock_vllm
