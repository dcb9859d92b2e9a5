#pragma once
// openai (private): the Anthropic -> OpenAI mappings and reply pieces both
// the body and the stream translators use (the reply pieces serve the
// Triton translators as well).
#include <cstdint>
#include <string_view>

#include "json_writer.hpp"
#include "sluice/openai/anthropic.hpp"

namespace sluice::openai::detail {

// stop_reason -> finish_reason (static strings); empty stays empty.
std::string_view anthropic_finish_reason(std::string_view stop_reason) noexcept;

// An Anthropic error type -> the status sluice answers with; `status` (the
// backend's) decides when the type is unknown.
uint16_t anthropic_error_status(std::string_view type, uint16_t status) noexcept;

// Anthropic's input_tokens leaves out prompt-cache reads and writes, which
// are input all the same: prompt tokens are the three together. `fallback`
// when the usage object has no input_tokens.
int64_t anthropic_prompt_tokens(simdjson::dom::element usage, int64_t fallback) noexcept;

// The fields every reply object opens with, up to the choices array:
// {"id":"<id_prefix><request id>","object":<object>,"created":N,"model":M,"choices":[
// (vLLM's ids: "chatcmpl-" for chat, "cmpl-" for completions). The Triton
// translators use it too.
template <class Sink>
void reply_prefix(json_writer<Sink>& w, std::string_view id_prefix, std::string_view request_id, int64_t created_s,
                  std::string_view model, std::string_view object) {
  w.raw("{\"id\":\"");
  w.raw(id_prefix);
  w.escaped(request_id);
  w.raw("\",\"object\":");
  w.str(object);
  w.raw(",\"created\":");
  w.num(created_s);
  w.raw(",\"model\":");
  w.str(model);
  w.raw(",\"choices\":[");
}

template <class Sink>
void reply_prefix(json_writer<Sink>& w, const anthropic_reply_context& ctx, std::string_view object) {
  reply_prefix(w, "chatcmpl-", ctx.request_id, ctx.created_s, ctx.model, object);
}

// vLLM's usage object (its key order); an unknown count (-1) is 0.
template <class Sink>
void usage_object(json_writer<Sink>& w, int64_t prompt, int64_t completion, bool with_details) {
  prompt = prompt < 0 ? 0 : prompt;
  completion = completion < 0 ? 0 : completion;
  w.raw("{\"prompt_tokens\":");
  w.num(prompt);
  w.raw(",\"total_tokens\":");
  w.num(prompt + completion);
  w.raw(",\"completion_tokens\":");
  w.num(completion);
  w.raw(with_details ? ",\"prompt_tokens_details\":null}" : "}");
}

}  // namespace sluice::openai::detail
