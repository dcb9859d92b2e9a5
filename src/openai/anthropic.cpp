// openai: Anthropic Messages replies -> OpenAI chat completions replies, the
// non-stream body (chat.completion, or text_completion for legacy
// completions) and error bodies (cold path: once per reply). The body takes
// vLLM's field order and shape so the client cannot tell backends apart.
#include "anthropic_map.hpp"
#include "sluice/openai/anthropic.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::openai {

namespace {

using simdjson::dom::element;

std::string_view get_string(element obj, std::string_view key) {
  std::string_view v;
  return obj[key].get_string().get(v) == simdjson::SUCCESS ? v : std::string_view{};
}

}  // namespace

namespace detail {

std::string_view anthropic_finish_reason(std::string_view stop_reason) noexcept {
  if (stop_reason == "end_turn" || stop_reason == "stop_sequence") return "stop";
  if (stop_reason == "max_tokens") return "length";
  if (stop_reason == "tool_use") return "tool_calls";
  if (stop_reason == "refusal") return "content_filter";
  return stop_reason.empty() ? std::string_view{} : "stop";  // pause_turn and future values
}

int64_t anthropic_prompt_tokens(element usage, int64_t fallback) noexcept {
  int64_t input = 0;
  if (usage["input_tokens"].get_int64().get(input) != simdjson::SUCCESS) return fallback;
  for (std::string_view key : {"cache_creation_input_tokens", "cache_read_input_tokens"}) {
    int64_t cached = 0;
    if (usage[key].get_int64().get(cached) == simdjson::SUCCESS && cached > 0) input += cached;
  }
  return input;
}

uint16_t anthropic_error_status(std::string_view type, uint16_t status) noexcept {
  struct mapping {
    std::string_view anthropic_type;
    uint16_t status;
  };
  // authentication/permission: the group's key was refused, not the client's.
  static constexpr mapping table[] = {
      {"invalid_request_error", 400}, {"authentication_error", 502}, {"permission_error", 502},
      {"not_found_error", 404},       {"request_too_large", 413},    {"rate_limit_error", 429},
      {"api_error", 502},             {"overloaded_error", 503},
  };
  for (const mapping& m : table) {
    if (m.anthropic_type == type) return m.status;
  }
  if (status == 529) return 503;  // Anthropic's "overloaded"
  if (status == 401 || status == 403 || status >= 500 || status < 400) return 502;
  return status;
}

}  // namespace detail

using detail::anthropic_finish_reason;

bool anthropic_response_to_openai(std::string_view body, const anthropic_reply_context& ctx,
                                  std::string& out, anthropic_outcome& outcome) {
  out.clear();
  outcome = {};
  simdjson::dom::parser parser;
  element root;
  simdjson::dom::array content;
  if (parser.parse(body.data(), body.size(), true).get(root) != simdjson::SUCCESS || !root.is_object() ||
      get_string(root, "type") != "message" || root["content"].get_array().get(content) != simdjson::SUCCESS) {
    return false;
  }
  element usage;
  if (root["usage"].get(usage) == simdjson::SUCCESS) {
    int64_t tokens = 0;
    outcome.prompt_tokens = detail::anthropic_prompt_tokens(usage, -1);
    if (usage["output_tokens"].get_int64().get(tokens) == simdjson::SUCCESS) outcome.completion_tokens = tokens;
  }
  outcome.finish_reason = anthropic_finish_reason(get_string(root, "stop_reason"));

  detail::string_sink sink{out};
  detail::json_writer w(sink);
  if (!detail::is_chat(ctx)) {
    // A completion has text only: tool_use blocks (which a request without
    // tools does not get) are dropped.
    detail::completion_body_begin(w, ctx);
    w.raw("\"");
    for (element block : content) {
      if (get_string(block, "type") == "text") w.escaped(get_string(block, "text"));
    }
    w.raw("\"");
    detail::completion_body_end(w, outcome.finish_reason, outcome.prompt_tokens, outcome.completion_tokens);
    return true;
  }
  detail::reply_prefix(w, ctx, false);
  w.raw("{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
  uint32_t texts = 0;
  for (element block : content) {
    if (get_string(block, "type") != "text") continue;
    w.raw(texts++ == 0 ? "\"" : "");
    w.escaped(get_string(block, "text"));
  }
  w.raw(texts > 0 ? "\"" : "null");
  w.raw(",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[");
  uint32_t calls = 0;
  for (element block : content) {
    if (get_string(block, "type") != "tool_use") continue;
    element input;
    w.raw(calls++ == 0 ? "{\"id\":" : ",{\"id\":");
    w.str(get_string(block, "id"));
    w.raw(",\"type\":\"function\",\"function\":{\"name\":");
    w.str(get_string(block, "name"));
    w.raw(",\"arguments\":");
    w.str(block["input"].get(input) == simdjson::SUCCESS ? simdjson::to_string(input) : "{}");
    w.raw("}}");
  }
  detail::chat_body_end(w, outcome.finish_reason, outcome.prompt_tokens, outcome.completion_tokens);
  return true;
}

size_t anthropic_error_to_openai(uint16_t status, std::string_view body, char* out, size_t cap,
                                 uint16_t& status_out) noexcept {
  std::string_view type;
  std::string_view message;
  simdjson::dom::parser parser;  // cold path: backend errors only
  element root;
  element error;
  if (parser.parse(body.data(), body.size(), true).get(root) == simdjson::SUCCESS &&
      root["error"].get(error) == simdjson::SUCCESS) {
    type = get_string(error, "type");
    message = get_string(error, "message");
  }
  status_out = detail::anthropic_error_status(type, status);
  error_fields fields = default_error_for_status(status_out, message);
  return write_error_body(out, cap, fields);
}

}  // namespace sluice::openai
