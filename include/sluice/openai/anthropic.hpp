#pragma once
// openai: translation between OpenAI chat completions and Anthropic's
// Messages API (`POST /v1/messages`, anthropic-version 2023-06-01), the pure
// part of an Anthropic backend adapter: bodies and SSE events in, bodies and
// SSE events out; no I/O. Legacy completions ride on it as one user turn.
// The client sees what the OpenAI adapter gives for the same reply (vLLM's
// chunk shapes, ids `chatcmpl-...` / `cmpl-...`, the client's model name).
#include <simdjson.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/openai/request.hpp"

namespace sluice::openai {

namespace detail {
struct bounded_sink;
}

struct anthropic_request_options {
  std::string_view model;            // the backend's model name
  int64_t max_tokens_default = 4096;  // Anthropic requires max_tokens; the group's default
};

// Shard-local, one per shard (cold-ish path: once per request). Reuses its
// parsers; `out` is the caller's string, reused across requests.
class anthropic_request_writer {
 public:
  anthropic_request_writer() = default;
  anthropic_request_writer(const anthropic_request_writer&) = delete;
  anthropic_request_writer& operator=(const anthropic_request_writer&) = delete;

  // `body`: an OpenAI chat completions request (already validated by
  // request_reader). Returns: true with `out` replaced by the Anthropic
  // request, or false with `err` filled (a 400: what cannot be carried).
  // Views in `err` are static or point into this writer (until the next call).
  bool write(std::string_view body, const anthropic_request_options& opts, std::string& out,
             request_error& err);

  // `body`: an OpenAI legacy completions request (validated likewise). The
  // prompt (a string, or an array of one string) becomes one user message;
  // max_tokens, temperature, top_p, stop and stream are carried as for
  // chat. Returns: as write(); refused (400): token-id or several prompts,
  // and what a Messages reply cannot give (n or best_of > 1, echo,
  // logprobs, suffix).
  bool write_completion(std::string_view body, const anthropic_request_options& opts, std::string& out,
                        request_error& err);

 private:
  simdjson::dom::parser _parser;     // the body
  simdjson::dom::parser _arguments;  // a tool call's `arguments` string, checked to be an object
  char _param[64] = {};
};

// The OpenAI side of one answer: what the client sees in every chunk.
struct anthropic_reply_context {
  std::string_view request_id;  // sluice's request id; the reply id is "chatcmpl-" / "cmpl-" + it
  int64_t created_s = 0;        // unix seconds
  std::string_view model;       // the name the client asked for
  bool include_usage = false;   // stream_options.include_usage (stream only)
  // The stream's own: every chunk's opening bytes, written once at reset()
  // (callers leave it empty).
  std::string_view chunk_head;
  // chat_completions: chat.completion bodies and chunks; completions:
  // text_completion ones (no role chunk, tool blocks dropped).
  endpoint kind = endpoint::chat_completions;
};

// What billing and audit need from a reply. finish_reason is OpenAI's
// ("stop", "length", "tool_calls", ...), a static string; empty when none.
struct anthropic_outcome {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  std::string_view finish_reason;
};

// A non-stream Anthropic message -> an OpenAI chat.completion body (or
// text_completion, per ctx.kind) in `out`
// (replaced). Returns: false when `body` is not a message (malformed JSON, an
// error body, no content array): then write the error with
// anthropic_error_to_openai instead. Cold path (once per reply).
bool anthropic_response_to_openai(std::string_view body, const anthropic_reply_context& ctx,
                                  std::string& out, anthropic_outcome& outcome);

// An Anthropic error answer ({"type":"error","error":{"type","message"}}) with
// HTTP `status` -> an OpenAI error body in `out` (cap >= 512) and the status
// to answer with: invalid_request_error 400, not_found_error 404,
// request_too_large 413, rate_limit_error 429, overloaded_error (529) 503,
// api_error 502; authentication/permission errors mean sluice's own key was
// refused: 502. An unreadable body falls back on `status`.
// Returns: bytes written.
size_t anthropic_error_to_openai(uint16_t status, std::string_view body, char* out, size_t cap,
                                 uint16_t& status_out) noexcept;

enum class anthropic_stream_status : uint8_t {
  ok,          // `written` bytes of OpenAI SSE events (maybe 0: nothing to say)
  need_space,  // nothing written, state unchanged: call again with cap >= `needed`
  malformed,   // not JSON or not an Anthropic event: the caller ends the stream
  too_large,   // an event over the stream's event capacity: the caller ends the stream
  ended,       // [DONE] was already written; nothing more comes
};

struct anthropic_stream_result {
  anthropic_stream_status status = anthropic_stream_status::ok;
  size_t written = 0;
  size_t needed = 0;
};

// Shard-local. One per streamed Anthropic exchange (or reused across them
// with reset()); from the first SSE event until [DONE]. Fed one SSE event
// at a time, it writes the OpenAI chunk sequence vLLM produces: the role
// chunk, content deltas, tool-call deltas, the finish chunk, the usage chunk
// when asked, `data: [DONE]` (completions: text chunks, the finish chunk,
// the usage chunk, [DONE]). Its parser and padded copy buffer are
// allocated once, at construction, for events up to event_bytes_max: feeding
// such events never allocates (a larger one is read in buffers of its own).
class anthropic_stream {
 public:
  // Anthropic numbers content blocks; tool calls in blocks past this are refused.
  static constexpr uint32_t k_blocks_max = 128;
  // An event past event_bytes_max (a whole tool call's input in one
  // delta) is parsed by a parser made for it and freed after, up to this;
  // a longer one is too_large.
  static constexpr size_t k_large_event_bytes_max = 4u << 20;

  explicit anthropic_stream(size_t event_bytes_max = 64 * 1024);
  anthropic_stream(const anthropic_stream&) = delete;
  anthropic_stream& operator=(const anthropic_stream&) = delete;

  // Starts a new exchange. `ctx`'s views must outlive it.
  void reset(const anthropic_reply_context& ctx) noexcept;

  // `event`: the SSE event name (may be empty; the data's "type" decides),
  // `data`: its data bytes. Output goes to out[0, cap); an event writes at
  // most two chunks, so 2 * (256 + 6 * (request id + model bytes)) + 6 *
  // data bytes always fits (6: the longest escape, \u00XX, per byte).
  // Returns: see anthropic_stream_status. After message_stop or an error
  // event done() is true; outcome() then holds the usage and the finish
  // reason ("error" after an error event) for billing and audit.
  anthropic_stream_result feed(std::string_view event, std::string_view data, char* out,
                               size_t cap) noexcept;

  bool done() const noexcept { return _state.done; }
  anthropic_outcome outcome() const noexcept {
    return {_state.prompt_tokens, _state.completion_tokens, _state.finish_reason};
  }

 private:
  // Trivially copyable: feed() saves it and puts it back when the output did
  // not fit, so a retry with more space sees the same state.
  struct state {
    bool role_sent = false;
    bool done = false;
    int16_t tools = 0;  // tool calls seen so far = the next OpenAI tool index
    int64_t prompt_tokens = -1;
    int64_t completion_tokens = -1;
    std::string_view finish_reason;
    std::array<int16_t, k_blocks_max> block_tool{};  // block index -> tool index, -1 = not a tool
  };

  // The event handlers write into `sink`; feed() puts the state back when
  // the output did not fit. Returns (bool): false when the event is malformed.
  void role_chunk(detail::bounded_sink& sink) noexcept;
  static int64_t block_index(simdjson::dom::element root) noexcept;
  bool on_block_start(simdjson::dom::element root, detail::bounded_sink& sink) noexcept;
  bool on_block_delta(simdjson::dom::element root, detail::bounded_sink& sink) noexcept;
  void on_usage(simdjson::dom::element usage) noexcept;
  void on_message_delta(simdjson::dom::element root, detail::bounded_sink& sink) noexcept;
  void on_message_stop(detail::bounded_sink& sink) noexcept;
  void on_error(simdjson::dom::element root, detail::bounded_sink& sink) noexcept;

  size_t _event_bytes_max;
  std::unique_ptr<char[]> _padded;  // event_bytes_max + SIMDJSON_PADDING
  simdjson::dom::parser _parser;
  anthropic_reply_context _ctx;
  state _state;
  // The chunks' opening bytes up to their choices (ctx.chunk_head): the
  // id and model are escaped once per stream, not per event. A longer head
  // than this is written per event.
  char _chunk_head[512] = {};
};

}  // namespace sluice::openai
