#pragma once
// openai: chat templates. A backend that takes one prompt string (Triton's
// vLLM and TensorRT-LLM models) gets the chat messages rendered here, the
// way the model's own tokenizer template would render them: built-in
// chatml (Qwen2.5), llama3 and mistral, or an operator-defined template of
// per-role prefix and suffix strings. Pure: the request in, bytes into a
// caller's buffer out; no allocation.
#include <cstdint>
#include <string_view>

#include "sluice/core/text.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::openai {

enum class chat_template_kind : uint8_t { chatml, llama3, mistral, custom };

// The config's names ("chatml", "llama3", "mistral", "custom").
// Returns: false for any other name.
bool parse_chat_template_kind(std::string_view name, chat_template_kind& out) noexcept;
std::string_view to_string(chat_template_kind k) noexcept;

// Filled by the config from a group's TOML strings (which own the bytes, for
// the snapshot's life). Each message is prefix + content + suffix of its
// role ("developer" counts as system); `begin` comes once before the first
// message (a BOS token, say) and `generation_prefix` after the last, where
// the model starts its answer.
struct custom_chat_template {
  std::string_view begin;
  std::string_view system_prefix;
  std::string_view system_suffix;
  std::string_view user_prefix;
  std::string_view user_suffix;
  std::string_view assistant_prefix;
  std::string_view assistant_suffix;
  std::string_view generation_prefix;
};

struct chat_template {
  chat_template_kind kind = chat_template_kind::chatml;
  // The BOS token as text (llama3 "<|begin_of_text|>", mistral "<s>"), as the
  // model's template writes it. A backend that tokenizes the prompt with
  // special tokens added (vLLM's default for a prompt string) adds its own
  // BOS, and a second one changes the model's output: turn this off there.
  bool include_bos = true;
  custom_chat_template custom;  // kind == custom only
};

// Renders a chat request's messages (`fields` from request_reader::read of
// a chat completion, its views still valid) into `out`. A text content part
// list is joined with "\n", as vLLM joins it for a text-only model. What a
// text prompt cannot carry -- tools, tool calls and tool messages, image or
// other non-text parts -- is refused, as is an unknown role and (mistral)
// turns that do not alternate user/assistant.
// Returns: true with the prompt written to `out`; false with `err` set, a
// 400 (also when `out` has no room for the prompt).
bool render_chat_prompt(const chat_template& t, const request_fields& fields, text_writer& out,
                        request_error& err) noexcept;

}  // namespace sluice::openai
