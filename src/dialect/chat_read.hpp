#pragma once
// dialect (private): what both renderers read from a chat reply (its
// members, finish reason and usage) and write of it (the usage objects of
// Messages and Responses), so a stream and a body say the same.
#include <simdjson.h>

#include <cstdint>
#include <string_view>

#include "sluice/dialect/render.hpp"

namespace sluice::dialect::detail {

inline std::string_view get_string(simdjson::dom::element obj, std::string_view key) noexcept {
  std::string_view v;
  return obj[key].get_string().get(v) == simdjson::SUCCESS ? v : std::string_view{};
}

inline int64_t get_int(simdjson::dom::element obj, std::string_view key) noexcept {
  int64_t v = -1;
  return obj[key].get_int64().get(v) == simdjson::SUCCESS ? v : -1;
}

// chat's finish reason as a static string (the view into the reply dies
// with it); empty when none was given.
inline std::string_view static_finish(std::string_view f) noexcept {
  if (f == "length") return "length";
  if (f == "tool_calls" || f == "function_call") return "tool_calls";
  if (f == "content_filter") return "content_filter";
  return f.empty() ? std::string_view{} : std::string_view("stop");
}

// Anthropic's stop_reason for chat's finish reason.
inline std::string_view anthropic_stop(std::string_view f, bool stop_sequence) noexcept {
  if (f == "length") return "max_tokens";
  if (f == "tool_calls") return "tool_use";
  if (f == "content_filter") return "refusal";
  return stop_sequence ? "stop_sequence" : "end_turn";
}

// A chat usage object's counts (cached and reasoning tokens where given).
inline void read_chat_usage(simdjson::dom::element u, reply_outcome& o) noexcept {
  o.prompt_tokens = get_int(u, "prompt_tokens");
  o.completion_tokens = get_int(u, "completion_tokens");
  simdjson::dom::element det;
  if (u["prompt_tokens_details"].get(det) == simdjson::SUCCESS && det.is_object()) {
    o.cached_tokens = get_int(det, "cached_tokens");
  }
  if (u["completion_tokens_details"].get(det) == simdjson::SUCCESS && det.is_object()) {
    o.reasoning_tokens = get_int(det, "reasoning_tokens");
  }
}

// Messages' usage object: input_tokens leave out the cache's reads.
template <class W>
void write_messages_usage(W& w, const reply_outcome& o) {
  const int64_t cached = o.cached_tokens < 0 ? 0 : o.cached_tokens;
  w.raw("{\"input_tokens\":");
  w.num(o.prompt_tokens < cached ? int64_t{0} : o.prompt_tokens - cached);  // (a backend's counts need not agree)
  w.raw(",\"cache_read_input_tokens\":");
  w.num(cached);
  w.raw(",\"output_tokens\":");
  w.num(o.completion_tokens < 0 ? int64_t{0} : o.completion_tokens);
  w.raw("}");
}

// Responses' usage value: null until the reply said its counts.
template <class W>
void write_responses_usage(W& w, const reply_outcome& o) {
  if (o.prompt_tokens < 0) {
    w.raw("null");
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
  int64_t total = 0;  // a backend's counts: the total saturates
  if (__builtin_add_overflow(o.prompt_tokens, out, &total)) total = INT64_MAX;  // (both >= 0 here)
  w.num(total);
  w.raw("}");
}

}  // namespace sluice::dialect::detail
