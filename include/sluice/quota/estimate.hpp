#pragma once
// quota: admission cost and the input-token estimator.
//
// Stateless; runs per request on the shard that parsed it.
//
// The estimator approximates the Qwen2.5 tokenizer (byte-level BPE whose
// pre-tokenizer splits letter runs, single digits, punctuation runs,
// whitespace and newlines) from one pass over the bytes, with no allocation
// and no vocabulary. It walks the text as runs of one script class and adds
// a fixed cost per run and per character, in 1/64 tokens:
//
//   class                          cost
//   letter run (ASCII letters and  62 per run (+5 per letter beyond the 5th):
//     2-byte UTF-8 letters)        a common word is one token, long ones more
//   digit                          64 each: the pre-tokenizer splits digits
//   punctuation run (ASCII)        75 per run + 9 per extra byte; a run's last
//                                  byte is free when a letter follows ("name)
//   whitespace run                 75 when it holds a newline, is 2+ wide or
//                                  ends the text; a single space is free (it
//                                  joins the next word)
//   CJK ideograph, kana, hangul    36 each (Qwen merges common pairs)
//   CJK / full-width punctuation   79 each
//   other 3- and 4-byte characters 64 each (symbols, emoji)
//
// The sum is rounded down to whole tokens, at least 1 for a non-empty text.
// The weights were fitted on tests/fixtures/tokenizer/corpus.json (English,
// Chinese, code, JSON; counts from the real tokenizer) and hold ±25% per
// text there; the test prints the error distribution per class.
#include <cstdint>
#include <string_view>

#include "sluice/openai/request.hpp"

namespace sluice::quota {

// Returns: estimated Qwen2.5 tokens in `text` (0 only for empty text).
uint64_t estimate_input_tokens(std::string_view text) noexcept;

namespace detail {
// The ASCII path of estimate_input_tokens in either build: with the POPCNT
// instruction (what runs where the CPU has it) or without. For the tests,
// which hold both to the same rules. `text` must be ASCII.
uint64_t ascii_estimate(std::string_view text, bool popcnt) noexcept;
bool has_popcnt() noexcept;
}  // namespace detail

// Returns: estimated input tokens of a request from its text (not its raw
// body: JSON syntax and an image's base64 are not text the model reads):
// each piece estimated as above, plus a few tokens per message for the chat
// template, one per prompt token id, and `image_tokens` per image part.
uint64_t estimate_request_tokens(const openai::request_text& text, uint32_t messages, uint32_t image_tokens) noexcept;

// Returns: input × input_weight + max_output × output_weight, saturating.
uint64_t admission_cost(uint64_t input_tokens, uint64_t max_output_tokens, uint32_t input_weight,
                        uint32_t output_weight) noexcept;

// Returns: the weighted cost of what a request really used (settle()).
inline uint64_t usage_cost(uint64_t prompt_tokens, uint64_t completion_tokens, uint32_t input_weight,
                           uint32_t output_weight) noexcept {
  return admission_cost(prompt_tokens, completion_tokens, input_weight, output_weight);
}

}  // namespace sluice::quota
