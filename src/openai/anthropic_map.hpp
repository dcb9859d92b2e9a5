#pragma once
// openai (private): the Anthropic -> OpenAI mappings both the body and the
// stream translators use; the reply pieces they write are reply_writer.hpp's.
#include <cstdint>
#include <string_view>

#include "reply_writer.hpp"
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

}  // namespace sluice::openai::detail
