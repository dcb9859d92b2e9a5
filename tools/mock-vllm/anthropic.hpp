#pragma once
// Anthropic's Messages API (POST /v1/messages) in mock-vllm: what a request
// asks for, and the bytes of the answer (a message object, or the SSE events
// of a stream as Anthropic's "Messages streaming" documents them). The token
// counts and texts are those of the OpenAI chat path for the same
// conversation, so a gateway translating between the two can be checked
// against either.
#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace mock_vllm {

// One per request (the worker keeps one and reuses its string's capacity).
struct anthropic_plan {
  bool stream = false;
  uint32_t tokens = 0;          // text deltas to produce (or tool JSON pieces)
  bool ends_by_length = false;  // stop_reason "max_tokens" rather than "end_turn"
  uint32_t prompt_tokens = 0;
  // The test knob: `tools` given and the last user message says "weather".
  bool tool_use = false;
  std::string tool_name;  // the first tool's name
};

// The tool call's input, {"city":"Paris"}, is streamed in this many pieces.
inline constexpr uint32_t k_tool_json_pieces = 3;

// Reads `body` (its capacity must leave SIMDJSON_PADDING spare bytes).
// Returns: true with `out` filled, or false with `error` set to the message
// of a 400 invalid_request_error.
bool make_anthropic_plan(simdjson::dom::parser& parser, const std::string& body,
                         uint32_t reply_tokens, anthropic_plan& out, std::string& error);

// The error type Anthropic's API names for an HTTP status.
std::string_view anthropic_error_type(int status) noexcept;

// {"type":"error","error":{"type":...,"message":...}}
void append_anthropic_error_body(std::string& out, std::string_view type, std::string_view message);

// Non-stream answers: a message with one text block, or one tool_use block.
void append_message_body(std::string& out, std::string_view id, std::string_view model, uint32_t tokens,
                         bool ends_by_length, uint32_t prompt_tokens, uint32_t token_pad = 0);
void append_tool_message_body(std::string& out, std::string_view id, std::string_view model,
                              std::string_view tool_id, std::string_view tool_name,
                              uint32_t prompt_tokens, uint32_t output_tokens);

// Stream events, each "event: <type>\ndata: <json>\n\n" framed as one HTTP
// chunk (built in `scratch`, as the OpenAI events are).
void append_message_start_event(std::string& out, std::string& scratch, std::string_view id,
                                std::string_view model, uint32_t prompt_tokens);
void append_text_block_start_event(std::string& out, std::string& scratch);
void append_tool_block_start_event(std::string& out, std::string& scratch, std::string_view tool_id,
                                   std::string_view tool_name);
void append_ping_event(std::string& out, std::string& scratch);
void append_text_delta_event(std::string& out, std::string& scratch, uint32_t index, uint32_t token_pad = 0);
// Piece `index` (< k_tool_json_pieces) of the tool input JSON.
void append_json_delta_event(std::string& out, std::string& scratch, uint32_t index);
void append_block_stop_event(std::string& out, std::string& scratch);
void append_message_delta_event(std::string& out, std::string& scratch, std::string_view stop_reason,
                                uint32_t output_tokens);
// message_stop and the terminal zero-length chunk.
void append_message_stop_event(std::string& out, std::string& scratch);
void append_stream_error_event(std::string& out, std::string& scratch, std::string_view type,
                               std::string_view message);

// The tool input JSON whole, and piece `index` of it.
std::string_view tool_input_json() noexcept;
std::string_view tool_input_piece(uint32_t index) noexcept;

}  // namespace mock_vllm
