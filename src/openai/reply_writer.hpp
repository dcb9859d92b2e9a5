#pragma once
// openai (private): the pieces of vLLM's replies that sluice writes itself
// when it translates another backend's answer (Anthropic, Triton), so the
// client cannot tell backends apart. The bytes are those of
// tools/mock-vllm/wire.cpp: vLLM's field order; chat chunks have no "usage"
// key, completion chunks "usage":null. `Ctx` is a reply context
// (anthropic_reply_context, triton_reply_context): request_id, created_s,
// model, kind.
#include <cstdint>
#include <string_view>

#include "json_writer.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::openai::detail {

// The fields every reply object opens with, up to the choices array:
// {"id":"<id_prefix><request id>","object":<object>,"created":N,"model":M,"choices":[
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

// vLLM's usage object (its key order); an unknown count (-1) is 0. The
// counts are a backend's (a hostile one's may be near INT64_MAX): their
// total saturates.
template <class Sink>
void usage_object(json_writer<Sink>& w, int64_t prompt, int64_t completion, bool with_details) {
  prompt = prompt < 0 ? 0 : prompt;
  completion = completion < 0 ? 0 : completion;
  int64_t total = 0;
  if (__builtin_add_overflow(prompt, completion, &total)) total = INT64_MAX;
  w.raw("{\"prompt_tokens\":");
  w.num(prompt);
  w.raw(",\"total_tokens\":");
  w.num(total);
  w.raw(",\"completion_tokens\":");
  w.num(completion);
  w.raw(with_details ? ",\"prompt_tokens_details\":null}" : "}");
}

template <class Ctx>
bool is_chat(const Ctx& ctx) noexcept {
  return ctx.kind == endpoint::chat_completions;
}

// vLLM's ids: "chatcmpl-" for chat, "cmpl-" for completions.
template <class Sink, class Ctx>
void reply_prefix(json_writer<Sink>& w, const Ctx& ctx, bool chunk) {
  const bool chat = is_chat(ctx);
  reply_prefix(w, chat ? "chatcmpl-" : "cmpl-", ctx.request_id, ctx.created_s, ctx.model,
               chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
}

// An SSE event's start, up to the chunk's choices array.
template <class Sink, class Ctx>
void chunk_prefix(json_writer<Sink>& w, const Ctx& ctx) {
  if (!ctx.chunk_head.empty()) {  // made once per stream (set_chunk_head)
    w.raw(ctx.chunk_head);
    return;
  }
  w.raw("data: ");
  reply_prefix(w, ctx, true);
}

// A stream's chunk_head: chunk_prefix's bytes for `ctx`, written into
// `buf`; left empty (chunk_prefix writes them per event) when they do not fit.
template <class Ctx, size_t N>
void set_chunk_head(Ctx& ctx, char (&buf)[N]) noexcept {
  ctx.chunk_head = {};
  bounded_sink sink{buf, N};
  json_writer<bounded_sink> w(sink);
  chunk_prefix(w, ctx);
  if (sink.fits()) ctx.chunk_head = std::string_view(buf, sink.size);
}

// Closes a chunk's choices array, the chunk and the event: completion
// chunks carry "usage":null (vLLM dumps them with exclude_unset=False),
// chat chunks not.
template <class Sink, class Ctx>
void chunk_suffix(json_writer<Sink>& w, const Ctx& ctx) {
  w.raw(is_chat(ctx) ? "]}\n\n" : "],\"usage\":null}\n\n");
}

// A finish reason, or null when there is none (empty).
template <class Sink>
void finish_or_null(json_writer<Sink>& w, std::string_view finish) {
  if (finish.empty()) {
    w.raw("null");
  } else {
    w.str(finish);
  }
}

// The chat role chunk, the first of a chat stream; completions have none.
template <class Sink, class Ctx>
void role_chunk(json_writer<Sink>& w, const Ctx& ctx) {
  if (!is_chat(ctx)) return;
  chunk_prefix(w, ctx);
  w.raw("{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
        "\"finish_reason\":null}");
  chunk_suffix(w, ctx);
}

// A content chunk (chat) or a text chunk (completions); `finish` non-empty
// makes it the last one, as vLLM puts the finish reason on the chunk with
// the last text (then "stop_reason" follows in chat chunks too). An empty
// `text` with a finish is vLLM's finish by EOS, which decodes to "".
template <class Sink, class Ctx>
void text_chunk(json_writer<Sink>& w, const Ctx& ctx, std::string_view text, std::string_view finish) {
  const bool chat = is_chat(ctx);
  chunk_prefix(w, ctx);
  w.raw(chat ? "{\"index\":0,\"delta\":{\"content\":" : "{\"index\":0,\"text\":");
  w.str(text);
  w.raw(chat ? "},\"logprobs\":null,\"finish_reason\":" : ",\"logprobs\":null,\"finish_reason\":");
  if (finish.empty()) {
    w.raw(chat ? "null}" : "null,\"stop_reason\":null}");
  } else {
    w.str(finish);
    w.raw(",\"stop_reason\":null}");
  }
  chunk_suffix(w, ctx);
}

// The usage chunk (stream_options.include_usage): no choices; dumped with
// exclude_none by vLLM, so no prompt_tokens_details.
template <class Sink, class Ctx>
void usage_chunk(json_writer<Sink>& w, const Ctx& ctx, int64_t prompt, int64_t completion) {
  chunk_prefix(w, ctx);
  w.raw("],\"usage\":");
  usage_object(w, prompt, completion, false);
  w.raw("}\n\n");
}

// A text_completion body up to its text's value, which the caller writes
// (a JSON string), then completion_body_end.
template <class Sink, class Ctx>
void completion_body_begin(json_writer<Sink>& w, const Ctx& ctx) {
  reply_prefix(w, ctx, false);
  w.raw("{\"index\":0,\"text\":");
}

template <class Sink>
void completion_body_end(json_writer<Sink>& w, std::string_view finish, int64_t prompt, int64_t completion) {
  w.raw(",\"logprobs\":null,\"finish_reason\":");
  finish_or_null(w, finish);
  w.raw(",\"stop_reason\":null,\"prompt_logprobs\":null}],\"service_tier\":null,"
        "\"system_fingerprint\":null,\"usage\":");
  usage_object(w, prompt, completion, true);
  w.raw(",\"kv_transfer_params\":null}");
}

// A chat.completion body's tail, after its message's tool_calls array's
// items: closes the array and the message, then the finish reason and usage.
template <class Sink>
void chat_body_end(json_writer<Sink>& w, std::string_view finish, int64_t prompt, int64_t completion) {
  w.raw("],\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":");
  finish_or_null(w, finish);
  w.raw(",\"stop_reason\":null}],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":");
  usage_object(w, prompt, completion, true);
  w.raw(",\"prompt_logprobs\":null,\"kv_transfer_params\":null}");
}

}  // namespace sluice::openai::detail
