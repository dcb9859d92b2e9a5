// dialect: a non-stream chat.completion -> a Responses response object or
// an Anthropic message; sluice's own OpenAI-shaped error bodies -> their
// message (for the client's dialect); Anthropic's error shape.
#include <cstring>

#include "../openai/json_writer.hpp"
#include "chat_read.hpp"
#include "sluice/dialect/dialect.hpp"
#include "sluice/dialect/render.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::dialect {

namespace {

using simdjson::dom::element;
using sw = openai::detail::json_writer<openai::detail::string_sink>;

using detail::get_int;
using detail::get_string;

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
  w.raw(detail::anthropic_stop(o.finish_reason, !stop_sequence.empty()));
  w.raw("\",\"stop_sequence\":");
  if (stop_sequence.empty()) {
    w.raw("null");
  } else {
    w.str(stop_sequence);
  }
  w.raw(",\"usage\":");
  detail::write_messages_usage(w, o);
  w.raw("}");
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
  detail::write_responses_usage(w, o);
  w.raw("}");
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
  o.finish_reason = detail::static_finish(get_string(first, "finish_reason"));
  if (o.finish_reason.empty()) o.finish_reason = "stop";
  const std::string_view stop_sequence = get_string(first, "stop_reason");
  element u;
  if (root["usage"].get(u) == simdjson::SUCCESS && u.is_object()) detail::read_chat_usage(u, o);
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
