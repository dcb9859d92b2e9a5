#pragma once
// openai: reads the fields sluice needs from an OpenAI request body, after
// validating the whole body (DESIGN.md §9 "JSON"): well-formed JSON, UTF-8,
// no lone surrogates, depth <= 64, no duplicate keys at any level (compared
// after unescaping), no NaN/Infinity, no BOM, no trailing bytes, top level an
// object. vLLM's parser and sluice's must never disagree about a body, so a
// body that any strict parser could read two ways is refused (400).
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::openai {

enum class endpoint : uint8_t { chat_completions, completions, embeddings };

struct request_fields {
  std::string_view model;          // the model name, unescaped (view into the body or the reader)
  uint32_t model_token_begin = 0;  // byte span of the model's JSON string token,
  uint32_t model_token_end = 0;    //   quotes included, in the body (for a byte edit)
  bool stream = false;
  bool has_stream_options = false;
  bool include_usage = false;      // stream_options.include_usage
  uint32_t stream_options_begin = 0;  // byte span of the stream_options value, when present
  uint32_t stream_options_end = 0;
  int64_t max_tokens = -1;         // max_tokens, else max_completion_tokens; -1 when absent
  uint32_t message_count = 0;      // chat: messages.size()
  uint64_t input_bytes = 0;        // UTF-8 bytes of prompt text (message contents / prompt / input)
  // Route-key material (DESIGN.md §3): views of the system prompt and the
  // first user message (chat), or the prompt (completions); empty if absent.
  std::string_view system_prompt;
  std::string_view first_user_message;
  bool has_tools = false;
  bool has_images = false;
};

// A 400 answer: OpenAI's error fields. Views are static strings or point into
// the reader's scratch space (valid until the next read()).
struct request_error {
  std::string_view message;
  std::string_view param;   // empty = null
  std::string_view code;    // empty = null
};

// Shard-local, one per shard: reuses one simdjson parser and scratch space.
class request_reader {
 public:
  explicit request_reader(size_t max_body_bytes);
  request_reader(const request_reader&) = delete;
  request_reader& operator=(const request_reader&) = delete;

  // `body` must have simdjson::SIMDJSON_PADDING readable bytes past `len`.
  // `max_tokens_cap`: the group's cap; max_tokens outside 1..cap is a 400.
  // Returns: true with `out` filled, or false with `err` filled.
  bool read(endpoint ep, const char* body, size_t len, int64_t max_tokens_cap,
            request_fields& out, request_error& err) noexcept;

 private:
  simdjson::dom::parser _parser;
  char _scratch[512];
};

// One streamed SSE event from a chat/completions backend, as far as billing
// and framing care. `payload` is the `data:` value.
struct stream_event_info {
  bool done = false;              // "[DONE]"
  bool error = false;             // {"error":...}
  bool has_usage = false;         // a non-null "usage" object
  bool usage_only = false;        // "choices":[] with usage (the include_usage chunk)
  bool has_content = false;       // at least one non-empty delta content / text
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  std::string_view finish_reason; // "stop", "length", ... (static or view into payload)
};
stream_event_info scan_stream_event(std::string_view payload) noexcept;

// Usage from a non-stream response body (any JSON object with a "usage").
struct usage {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t total_tokens = -1;
};
usage scan_response_usage(std::string_view body) noexcept;

}  // namespace sluice::openai
