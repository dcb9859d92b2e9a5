// dialect: a non-stream chat.completion -> a Responses response object or
// an Anthropic message; sluice's own OpenAI-shaped error bodies -> their
// message (for the client's dialect); Anthropic's error shape.
#include <cstring>

#include "../openai/json_writer.hpp"
#include "sluice/dialect/dialect.hpp"
#include "sluice/dialect/render.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::dialect {

namespace {

using simdjson::dom::element;
using sw = openai::detail::json_writer<openai::detail::string_sink>;

std::string_view get_string(element obj, std::string_view key) noexcept {
  std::string_view v;
  return obj[key].get_string().get(v) == simdjson::SUCCESS ? v : std::string_view{};
}

int64_t get_int(element obj, std::string_view key) noexcept {
  int64_t v = -1;
  return obj[key].get_int64().get(v) == simdjson::SUCCESS ? v : -1;
}

std::string_view static_finish(std::string_view f) noexcept {
  if (f == "length") return "length";
  if (f == "tool_calls" || f == "function_call") return "tool_calls";
  if (f == "content_filter") return "content_filter";
  return "stop";
}

void messages_body(sw& w, element msg, std::string_view stop_sequence, const reply_context& ctx,
                   reply_outcome& o, simdjson::dom::parser& args_parser) {
  w.raw("{\"id\":\"msg_");
  w.escaped(ctx.request_id);
  w.raw("\",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
  w.str(ctx.model);
  w.raw(",\"content\":[");
  uint32_t blocks = 0;
  auto next = [&] { w.raw(blocks++ == 0 ? "" : ","); };
  std::string_view reasoning = get_string(msg, "reasoning_content");
  if (reasoning.empty()) reasoning = get_string(msg, "reasoning");
  if (!reasoning.empty()) {
    next();
    w.raw("{\"type\":\"thinking\",\"thinking\":");
    w.str(reasoning);
    w.raw(",\"signature\":\"\"}");
  }
  const std::string_view text = get_string(msg, "content");
  if (!text.empty()) {
    next();
    w.raw("{\"type\":\"text\",\"text\":");
    w.str(text);
    w.raw("}");
  }
  simdjson::dom::array calls;
  if (msg["tool_calls"].get_array().get(calls) == simdjson::SUCCESS) {
    for (element tc : calls) {
      element fn;
      if (tc["function"].get(fn) != simdjson::SUCCESS) continue;
      next();
      w.raw("{\"type\":\"tool_use\",\"id\":");
      w.str(get_string(tc, "id"));
      w.raw(",\"name\":");
      w.str(get_string(fn, "name"));
      w.raw(",\"input\":");
      // The arguments string is JSON text; Anthropic's input is the object.
      const std::string_view args = get_string(fn, "arguments");
      element input;
      if (!args.empty() && args_parser.parse(args.data(), args.size(), true).get(input) == simdjson::SUCCESS &&
          input.is_object()) {
        w.raw(simdjson::minify(input));
      } else {
        w.raw("{}");
      }
      w.raw("}");
    }
  }
  w.raw("],\"stop_reason\":\"");
  const std::string_view f = o.finish_reason;
  w.raw(f == "length" ? "max_tokens" : f == "tool_calls" ? "tool_use" : f == "content_filter" ? "refusal"
        : !stop_sequence.empty() ? "stop_sequence" : "end_turn");
  w.raw("\",\"stop_sequence\":");
  if (stop_sequence.empty()) {
    w.raw("null");
  } else {
    w.str(stop_sequence);
  }
  const int64_t cached = o.cached_tokens < 0 ? 0 : o.cached_tokens;
  w.raw(",\"usage\":{\"input_tokens\":");
  w.num(o.prompt_tokens < 0 ? int64_t{0} : o.prompt_tokens - cached);
  w.raw(",\"cache_read_input_tokens\":");
  w.num(cached);
  w.raw(",\"output_tokens\":");
  w.num(o.completion_tokens < 0 ? int64_t{0} : o.completion_tokens);
  w.raw("}}");
}

void responses_body(sw& w, element msg, const reply_context& ctx, const reply_outcome& o) {
  const bool incomplete = o.finish_reason == "length";
  w.raw("{\"id\":\"resp_");
  w.escaped(ctx.request_id);
  w.raw("\",\"object\":\"response\",\"created_at\":");
  w.num(ctx.created_s);
  w.raw(incomplete ? ",\"status\":\"incomplete\",\"error\":null,\"incomplete_details\":{\"reason\":\"max_output_tokens\"}"
                   : ",\"status\":\"completed\",\"error\":null,\"incomplete_details\":null");
  w.raw(",\"model\":");
  w.str(ctx.model);
  w.raw(",\"output\":[");
  uint32_t items = 0;
  std::string_view reasoning = get_string(msg, "reasoning_content");
  if (reasoning.empty()) reasoning = get_string(msg, "reasoning");
  if (!reasoning.empty()) {
    w.raw("{\"id\":\"rs_");
    w.escaped(ctx.request_id);
    w.raw("_0\",\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":");
    w.str(reasoning);
    w.raw("}]}");
    ++items;
  }
  const std::string_view text = get_string(msg, "content");
  if (!text.empty()) {
    w.raw(items == 0 ? "{\"id\":\"msg_" : ",{\"id\":\"msg_");
    w.escaped(ctx.request_id);
    w.raw("_");
    w.num(static_cast<int64_t>(items++));
    w.raw("\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
          "\"output_text\",\"text\":");
    w.str(text);
    w.raw(",\"annotations\":[]}]}");
  }
  simdjson::dom::array calls;
  if (msg["tool_calls"].get_array().get(calls) == simdjson::SUCCESS) {
    for (element tc : calls) {
      element fn;
      if (tc["function"].get(fn) != simdjson::SUCCESS) continue;
      w.raw(items == 0 ? "{\"id\":\"fc_" : ",{\"id\":\"fc_");
      w.escaped(ctx.request_id);
      w.raw("_");
      w.num(static_cast<int64_t>(items++));
      w.raw("\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":");
      w.str(get_string(tc, "id"));
      w.raw(",\"name\":");
      w.str(get_string(fn, "name"));
      w.raw(",\"arguments\":");
      w.str(get_string(fn, "arguments"));
      w.raw("}");
    }
  }
  w.raw("],\"parallel_tool_calls\":true,\"tool_choice\":\"auto\",\"tools\":[],\"usage\":");
  if (o.prompt_tokens < 0) {
    w.raw("null}");
    return;
  }
  const int64_t out = o.completion_tokens < 0 ? 0 : o.completion_tokens;
  w.raw("{\"input_tokens\":");
  w.num(o.prompt_tokens);
  w.raw(",\"input_tokens_details\":{\"cached_tokens\":");
  w.num(o.cached_tokens < 0 ? int64_t{0} : o.cached_tokens);
  w.raw("},\"output_tokens\":");
  w.num(out);
  w.raw(",\"output_tokens_details\":{\"reasoning_tokens\":");
  w.num(o.reasoning_tokens < 0 ? int64_t{0} : o.reasoning_tokens);
  w.raw("},\"total_tokens\":");
  w.num(o.prompt_tokens + out);
  w.raw("}}");
}

}  // namespace

namespace detail {
bool parse_object(simdjson::dom::parser& parser, std::string_view body, element& root) noexcept {
  try {
    return parser.parse(body.data(), body.size(), false).get(root) == simdjson::SUCCESS && root.is_object();
  } catch (...) {  // the parser's growth: out of memory
    return false;
  }
}
}  // namespace detail

bool render_reply(client_dialect d, std::string_view body, const reply_context& ctx, std::string& out,
                  reply_outcome& o) {
  thread_local simdjson::dom::parser parser;
  thread_local simdjson::dom::parser args_parser;
  o = {};
  out.clear();
  element root;
  if (parser.parse(body.data(), body.size(), true).get(root) != simdjson::SUCCESS || !root.is_object()) return false;
  simdjson::dom::array choices;
  if (root["choices"].get_array().get(choices) != simdjson::SUCCESS) return false;
  element first, msg;
  if (choices.at(0).get(first) != simdjson::SUCCESS || first["message"].get(msg) != simdjson::SUCCESS ||
      !msg.is_object()) {
    return false;
  }
  o.finish_reason = static_finish(get_string(first, "finish_reason"));
  const std::string_view stop_sequence = get_string(first, "stop_reason");
  element u, det;
  if (root["usage"].get(u) == simdjson::SUCCESS && u.is_object()) {
    o.prompt_tokens = get_int(u, "prompt_tokens");
    o.completion_tokens = get_int(u, "completion_tokens");
    if (u["prompt_tokens_details"].get(det) == simdjson::SUCCESS && det.is_object()) {
      o.cached_tokens = get_int(det, "cached_tokens");
    }
    if (u["completion_tokens_details"].get(det) == simdjson::SUCCESS && det.is_object()) {
      o.reasoning_tokens = get_int(det, "reasoning_tokens");
    }
  }
  openai::detail::string_sink sink{out};
  sw w(sink);
  if (d == client_dialect::messages) {
    messages_body(w, msg, stop_sequence, ctx, o, args_parser);
  } else {
    responses_body(w, msg, ctx, o);
  }
  return true;
}

std::string_view error_message_of(std::string_view body, char* scratch, size_t cap) noexcept {
  thread_local simdjson::dom::parser parser;
  element root, err;
  std::string_view msg;
  try {
    if (parser.parse(body.data(), body.size(), true).get(root) != simdjson::SUCCESS) return {};
  } catch (...) {
    return {};
  }
  if (root["error"].get(err) != simdjson::SUCCESS || err["message"].get_string().get(msg) != simdjson::SUCCESS) return {};
  // The view points into the parser's strings: copied out, as the caller keeps it.
  const size_t n = msg.size() < cap ? msg.size() : cap;
  if (n != 0) std::memcpy(scratch, msg.data(), n);
  return std::string_view(scratch, n);
}

std::string_view anthropic_error_type(uint16_t status) noexcept {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

size_t write_anthropic_error(char* out, size_t cap, uint16_t status, std::string_view message) noexcept {
  static constexpr std::string_view k_a = "{\"type\":\"error\",\"error\":{\"type\":\"";
  static constexpr std::string_view k_b = "\",\"message\":\"";
  static constexpr std::string_view k_c = "\"}}";
  const std::string_view type = anthropic_error_type(status);
  const size_t fixed = k_a.size() + type.size() + k_b.size() + k_c.size();
  if (cap < fixed) return 0;
  size_t n = 0;
  auto put = [&](std::string_view s) {
    std::memcpy(out + n, s.data(), s.size());
    n += s.size();
  };
  put(k_a);
  put(type);
  put(k_b);
  n += openai::json_escape(out + n, cap - fixed, message);
  put(k_c);
  return n;
}

}  // namespace sluice::dialect
