#pragma once
// OpenAI's Responses API (POST /v1/responses) in mock-vllm, as vLLM serves
// it: what a request asks for, and the bytes of the answer (a response
// object, or the streamed events from response.created to
// response.completed / response.incomplete, with sequence numbers). The
// texts are those of the chat path ("tok0 tok1 ..."); the prompt is counted
// in words of the instructions and the input's text.
#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace mock_vllm {

struct responses_plan {
  bool stream = false;
  uint32_t tokens = 0;
  bool ends_by_length = false;  // status "incomplete" (max_output_tokens)
  uint32_t prompt_tokens = 0;
};

// Reads `body` (its capacity must leave SIMDJSON_PADDING spare bytes).
// Returns: true with `out` filled, or false with `error` set (a 400).
bool make_responses_plan(simdjson::dom::parser& parser, const std::string& body, uint32_t reply_tokens,
                         responses_plan& out, std::string& error);

// The non-stream answer: a response object with one message item.
void append_response_body(std::string& out, std::string_view id, int64_t created, std::string_view model,
                          const responses_plan& p, uint32_t token_pad);

// Stream events, each "event: <type>\ndata: <json>\n\n" framed as one HTTP
// chunk; `seq` is the next sequence number (advanced).
void append_response_start_events(std::string& out, std::string& scratch, std::string_view id, int64_t created,
                                  std::string_view model, uint32_t& seq);
void append_output_text_delta_event(std::string& out, std::string& scratch, std::string_view id, uint32_t index,
                                    uint32_t token_pad, uint32_t& seq);
// The .done events, response.completed (or .incomplete), the terminal chunk.
void append_response_end_events(std::string& out, std::string& scratch, std::string_view id, int64_t created,
                                std::string_view model, const responses_plan& p, uint32_t token_pad, uint32_t& seq);

}  // namespace mock_vllm
