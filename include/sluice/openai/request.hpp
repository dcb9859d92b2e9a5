#pragma once
// openai: reads the fields sluice needs from an OpenAI request body, after
// validating the whole body (docs/architecture.md §9 "JSON"): well-formed JSON, UTF-8,
// no lone surrogates, depth <= 64, no duplicate keys at any level (compared
// after unescaping), no NaN/Infinity, no BOM, no trailing bytes, top level an
// object. vLLM's parser and sluice's must never disagree about a body, so a
// body that any strict parser could read two ways is refused (400).
#include <simdjson.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace sluice::openai {

enum class endpoint : uint8_t { chat_completions, completions, embeddings };

// Every view below points into the body or into the reader (its parser's
// string buffer): valid until the reader's next read(). An optional field
// sent as JSON null counts as absent, as vLLM's (pydantic) parser reads it.
// The request's text as the admission estimate reads it: message contents
// and their text parts, prompt or input strings, as views into the reader's
// last parse. Owned by the reader (shard-local); valid until its next
// read(). Bounded: past k_pieces_max pieces, the rest is counted in bytes.
struct request_text {
  static constexpr size_t k_pieces_max = 512;
  std::array<std::string_view, k_pieces_max> pieces{};
  uint32_t count = 0;
  uint64_t overflow_bytes = 0;    // text past the bound
  uint64_t token_ids = 0;         // prompt items given as token ids (a token each)
  uint32_t images = 0;            // image content parts
  void add(std::string_view s) noexcept {
    if (s.empty()) return;
    if (count < k_pieces_max) {
      pieces[count++] = s;
    } else {
      overflow_bytes += s.size();
    }
  }
  void clear() noexcept {
    count = 0;
    overflow_bytes = token_ids = 0;
    images = 0;
  }
};

struct request_fields {
  std::string_view model;          // the model name, unescaped
  uint32_t model_token_begin = 0;  // byte span [begin, end) of the model's JSON string
  uint32_t model_token_end = 0;    //   token, quotes and escapes included, in the body
  bool stream = false;
  // The "stream_options" key is present at the top level (its value an object
  // or null); the span [begin, end) covers that value in the body, so a
  // rewrite replaces it instead of adding a second, duplicate key.
  bool has_stream_options = false;
  bool include_usage = false;      // stream_options.include_usage
  bool stream_options_object = false;  // its value is an object (not null)
  bool has_include_usage = false;  // the object names include_usage (true, false or null)
  uint32_t stream_options_begin = 0;
  uint32_t stream_options_end = 0;
  // The output cap the backend will apply; -1 when absent. Chat:
  // max_completion_tokens if set, else max_tokens (vLLM's order; OpenAI
  // deprecates max_tokens). Completions: max_tokens (vLLM ignores the other).
  // Both are validated (integer in 1..cap) wherever they appear.
  int64_t max_tokens = -1;
  bool max_tokens_named_completion = false;  // it came from max_completion_tokens (for a 400's param)
  // The answers the backend generates, each up to max_tokens: "n" or
  // "best_of" (the larger; integers in 1..k_choices_max, 1 when absent),
  // times the prompts of a completions request (an array of strings or of
  // token-id arrays is one prompt each). Admission reserves output for all.
  static constexpr int64_t k_choices_max = 128;
  uint64_t output_sequences = 1;
  uint32_t message_count = 0;      // chat: messages.size()
  // UTF-8 bytes of input text: message content strings and text parts (chat),
  // prompt string(s) (completions), input string(s) (embeddings). A token-id
  // array counts 4 bytes per token, the usual bytes-per-token estimate.
  uint64_t input_bytes = 0;
  // Route-key material (docs/architecture.md §3): the content of the first "system" or
  // "developer" message and of the first "user" message (a string, or the
  // first text part of a content array); for completions first_user_message
  // is the prompt (its first string when an array). Empty if absent.
  std::string_view system_prompt;
  std::string_view first_user_message;
  // Semantic-routing material (route::group_table rules): the content of the
  // last "user" message (chat), or the prompt as first_user_message (completions).
  std::string_view last_user_message;
  // The text of the first min(message_count, 8) messages, in order (chat;
  // same text rule as above): route keys over more than two leading messages.
  static constexpr uint32_t k_leading_messages_max = 8;
  std::array<std::string_view, k_leading_messages_max> leading_messages{};
  // Chat: the "messages" array as parsed, for the chat templates that turn
  // it into one prompt (text-prompt backends); a view into the reader's last
  // parse like the strings above. Left unset (not to be read) for the other
  // endpoints and for a refused body: read it only when message_count > 0.
  simdjson::dom::element messages;
  // Members a backend adapter that writes its own request reads (Triton:
  // sampling parameters, and what a text prompt cannot carry). Each is the
  // value as parsed, a view into the reader's last parse like `messages`;
  // absent or JSON null leaves `present` false. The reader records them as
  // its one pass over the top level meets them and checks no type: the
  // adapter that reads one checks it (the OpenAI adapter passes the body on
  // to a backend that checks them itself).
  struct member {
    simdjson::dom::element value;
    bool present = false;
  };
  member temperature, top_p, stop, seed, presence_penalty, frequency_penalty;
  member tool_choice, function_call, response_format, logprobs, top_logprobs;
  member prompt;                   // completions: the "prompt" value (checked: a string or an array)
  int64_t n = 1;                   // "n" as validated above (1 when absent)
  int64_t best_of = 1;             // "best_of" likewise
  bool has_tools = false;          // a non-empty "tools" or "functions" array
  bool has_images = false;         // a content part of type image_url / input_image
  const request_text* text = nullptr;  // set by read(): the text the estimate reads
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
  // Preallocates for a typical body (64 KiB); the parser grows on demand
  // (doubling, so a shard reaches its steady size after a few large bodies)
  // up to max_body_bytes, never beyond.
  explicit request_reader(size_t max_body_bytes);
  request_reader(const request_reader&) = delete;
  request_reader& operator=(const request_reader&) = delete;

  // `body` must have simdjson::SIMDJSON_PADDING readable bytes past `len`.
  // `max_tokens_cap`: the group's cap; max_tokens outside 1..cap is a 400.
  // Returns: true with `out` filled, or false with `err` filled (a 400;
  // a body over max_body_bytes is refused too, though the HTTP layer should
  // have answered 413 before).
  bool read(endpoint ep, const char* body, size_t len, int64_t max_tokens_cap,
            request_fields& out, request_error& err) noexcept;

  // The keys on the duplicate check's stack: none between reads, whatever
  // the last one found (for the tests).
  size_t keys_held() const noexcept { return _keys.size(); }

 private:
  bool validate(const simdjson::dom::element& e, uint32_t depth, request_error& err) noexcept;
  bool fail_fmt(request_error& err, std::string_view param, const char* what,
                std::string_view detail) noexcept;

  size_t _max_body_bytes;
  simdjson::dom::parser _parser;
  request_text _text;
  simdjson::dom::document _doc;    // the tape and strings the views point into
  // The keys of the objects on the path being checked for duplicates, a
  // stack; grows to the most keys one path has held and stays (no
  // allocation once warm).
  std::vector<std::string_view> _keys;
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
  bool malformed = false;         // not JSON / not an object: nothing above is reliable
  std::string_view finish_reason; // "stop", "length", ... (static or view into payload)
};
// Thread-local scratch (a padded copy buffer and a parser per shard thread,
// grown by doubling from 16 KiB): no allocation per event once warm.
// finish_reason stays valid as long as `payload` does.
// has_content also counts a non-empty delta.reasoning_content or
// delta.tool_calls: any generated output, for time-to-first-token.
stream_event_info scan_stream_event(std::string_view payload) noexcept;

// Usage from a non-stream response body (any JSON object with a "usage"):
// its three counts, each -1 where absent or not an integer. Read from the
// end, where "usage" lies in every backend's reply (only the bytes after it
// are touched); a body that walk cannot vouch for is parsed whole instead.
struct usage {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t total_tokens = -1;
};
usage scan_response_usage(std::string_view body) noexcept;

namespace detail {
// scan_stream_event's two ways: the parse (simdjson's DOM; [DONE] and
// malformed events are its answers), and the walk tried first over the
// JSON vLLM writes. The walk returns false where it does not vouch for its
// answer (`info` is then partial); where it returns true, `info` is the
// parse's answer. Tests compare the two.
stream_event_info scan_stream_event_parsed(std::string_view payload) noexcept;
bool walk_stream_event(std::string_view payload, stream_event_info& info) noexcept;
// The same facts from a full parse (simdjson On-Demand): the fallback of
// scan_response_usage, and the reference its tests compare it with.
usage scan_response_usage_parsed(std::string_view body) noexcept;
// The walk back from the end alone. Returns: false where it cannot vouch
// for the answer (the body is then parsed whole).
bool scan_response_usage_from_end(std::string_view body, usage& u) noexcept;
}  // namespace detail

// Usage from the last bytes of a body too large to keep whole (vLLM writes
// "usage" after "choices", which logprobs or many choices can grow past
// the bound): the last `"usage":` in `tail` -- outside a JSON string that
// sequence is always a key -- and its object up to the matching brace,
// parsed alone. All -1 when the tail holds no whole usage object there.
usage scan_usage_in_tail(std::string_view tail) noexcept;

}  // namespace sluice::openai
