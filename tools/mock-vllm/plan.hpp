#pragma once
// What a request asks for, read from its JSON body: how many tokens to
// answer, whether to stream, and the deterministic prompt token count.
#include <simdjson.h>

#include <cstdint>
#include <string>
#include <vector>

#include "wire.hpp"

namespace mock_vllm {

// One per request; the vector keeps its capacity across requests.
struct plan {
  bool stream = false;
  bool include_usage = false;
  uint32_t tokens = 0;          // completion tokens to produce
  bool ends_by_length = false;  // finish_reason "length" rather than "stop"
  uint32_t prompt_tokens = 0;
  std::vector<uint64_t> input_hashes;  // embeddings: one per input
};

// Number of maximal runs of non-whitespace bytes (space \t \n \v \f \r).
uint32_t count_words(std::string_view text) noexcept;

// Reads `body` (its capacity must leave SIMDJSON_PADDING spare bytes).
// Returns: true with `out` filled, or false with `error` set to a message for
// a 400 BadRequestError.
bool make_plan(simdjson::dom::parser& parser, const std::string& body, endpoint kind,
               uint32_t reply_tokens, plan& out, std::string& error);

}  // namespace mock_vllm
