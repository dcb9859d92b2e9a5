#pragma once
// openai: translation between the OpenAI API and a Triton text model group
// (KServe v2 ModelStreamInfer: Triton's vLLM backend or a TensorRT-LLM
// ensemble), the pure part of the Triton backend adapter: request_fields
// in, a gRPC-framed ModelInferRequest out; decoded ModelStreamInferResponses
// in, the OpenAI SSE events or body out; a gRPC status in, the OpenAI error
// answer out. No I/O. The client sees what the OpenAI adapter passes through
// from vLLM for the same reply (tools/mock-vllm/wire.cpp writes those bytes):
// the same chunk shapes, ids "chatcmpl-<request id>" / "cmpl-<request id>",
// the client's model name.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/grpc/kserve.hpp"
#include "sluice/openai/chat_template.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::openai {

namespace detail {
struct bounded_sink;
}

// Which model's inputs a request is written for (config::triton_flavor;
// config sits below openai only for names, so the proxy maps one to the other).
enum class triton_flavor : uint8_t {
  vllm,    // text_input, stream, sampling_parameters (JSON), exclude_input_in_output, return_* flags
  trtllm,  // the ensemble: text_input, max_tokens, stream, temperature, top_p, stop_words, random_seed
};

struct triton_request_options {
  triton_flavor flavor = triton_flavor::vllm;
  chat_template prompt_template;     // chat completions: how messages become the prompt
  std::string_view model;            // model_name on the wire: the group's backend_model or the client's
  std::string_view request_id;       // the request's id: ModelInferRequest.id
  int64_t default_max_tokens = 256;  // >= 1: when the client gave none (the group's default)
};

// Shard-local, one per shard (once per request). Owns the scratch the
// prompt and the sampling parameters are written into; both, and the
// caller's `out`, grow to the largest request seen and stay: no allocation
// once warm for requests no larger than one already written.
class triton_request_writer {
 public:
  // Stop strings a request may give (OpenAI allows 4; vLLM has no bound).
  static constexpr size_t k_stop_max = 16;

  // `prompt_bytes_max`: the longest rendered prompt accepted (a longer one
  // is a 400); the group's body limit plus some room for the template is
  // enough for any body the reader accepted.
  explicit triton_request_writer(size_t prompt_bytes_max = 8 << 20);
  triton_request_writer(const triton_request_writer&) = delete;
  triton_request_writer& operator=(const triton_request_writer&) = delete;

  // `f`: what request_reader::read took from the client's body for endpoint
  // `e` (its views still valid). Writes into `out` (replaced) the 5-byte
  // gRPC prefix and the ModelInferRequest: what goes on the ModelStreamInfer
  // stream's DATA. Chat: the messages rendered with opts.prompt_template;
  // completions: the one prompt string as it is.
  // Returns: true with `out` filled; false with `err` set, a 400 (an
  // embeddings request, several or token-id prompts, n > 1, a sampling
  // member of the wrong type or range, and what a text model cannot do:
  // tools, tool_choice, response_format json_object/json_schema, logprobs,
  // images). Views in `err` are static or point into this writer.
  bool write(const triton_request_options& opts, const request_fields& f, endpoint e, std::string& out,
             request_error& err);

 private:
  bool render_prompt(const triton_request_options& opts, const request_fields& f, std::string_view& prompt,
                     request_error& err);

  size_t _prompt_bytes_max;
  std::string _prompt;  // the rendered chat prompt
  std::string _params;  // vllm: the sampling_parameters JSON
  char _message[160] = {};
};

// The OpenAI side of one answer: what the client sees in every chunk.
struct triton_reply_context {
  std::string_view request_id;  // the reply id is "chatcmpl-" / "cmpl-" + it
  int64_t created_s = 0;        // unix seconds
  std::string_view model;       // the name the client asked for
  endpoint kind = endpoint::chat_completions;  // chat_completions or completions
  bool include_usage = false;   // stream_options.include_usage (stream only)
  // The stream's own: every chunk's opening bytes, written once at reset()
  // (callers leave it empty).
  std::string_view chunk_head;
};

// What billing and audit need from a reply. Token counts: vLLM's backend
// sends num_input_tokens on every response and num_output_tokens as the
// tokens new since the previous response (its streaming mode), so
// completion_tokens is their sum. TensorRT-LLM's ensemble sends no counts:
// prompt_tokens stays -1 (the caller falls back on its admission estimate)
// and completion_tokens counts the responses with non-empty text, about a
// token each in streaming mode (counted_by_backend false).
struct triton_outcome {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = 0;
  bool counted_by_backend = false;  // completion_tokens came from num_output_tokens
  bool content_seen = false;        // a non-empty text_output arrived (time to first token)
  std::string_view finish_reason;   // OpenAI's, static; "error" after an error_message; empty until the end
  std::string_view error_message;   // the last error_message: a view into that response (valid while it is)
};

enum class triton_stream_status : uint8_t {
  ok,          // `written` bytes of output (maybe 0: nothing to say)
  need_space,  // nothing written, state unchanged: call again with cap >= `needed`
  failed,      // accumulate mode: the backend sent an error_message; answer with triton_error_body
  ended,       // the reply is complete; the response is ignored
  too_large,   // accumulate mode: the text would pass k_reply_text_bytes_max (or could not grow)
};

// Accumulate mode's bound on a reply's text: a backend (or a model that
// ignores max_tokens) must not grow a non-stream reply without limit.
// 32768 tokens of the longest UTF-8 pieces fit many times over.
inline constexpr size_t k_reply_text_bytes_max = 4u << 20;

struct triton_stream_result {
  triton_stream_status status = triton_stream_status::ok;
  size_t written = 0;
  size_t needed = 0;
};

// Shard-local. One per Triton exchange (or reused across them with reset());
// from the first stream response until the reply's end. sluice always asks
// Triton to stream (triton_request_writer); for a stream client feed()
// writes the OpenAI SSE events, for a non-stream client (accumulate mode)
// it appends the text to the caller's buffer and write_body() writes the
// whole body at the end. Nothing here allocates (the accumulated text
// grows the caller's string only while it is longer than ever before).
//
// The reply ends at the first response with an error_message, with the
// final flag (triton_final_response, which triton_enable_empty_final_response
// guarantees), or with a finish_reason other than "None" (vLLM's backend
// writes str(None) on every response before the last); finish() ends it when
// the gRPC stream closes cleanly without any of those.
class triton_stream {
 public:
  triton_stream() = default;
  // Not copied: its context views its own chunk-head buffer.
  triton_stream(const triton_stream&) = delete;
  triton_stream& operator=(const triton_stream&) = delete;

  // Starts a new exchange. `ctx`'s views must outlive it. `accumulate`:
  // null for a stream client; else the non-stream client's text goes there
  // (cleared here).
  void reset(const triton_reply_context& ctx, std::string* accumulate = nullptr) noexcept;

  // One decoded response. Output goes to out[0, cap): a response writes at
  // most five events (role, content or error, finish, usage, [DONE]), so
  // event_bytes_max(r) always fits: 1024 + 6 * (4 * (request id + model) +
  // text_output + error_message bytes) (6: the longest escape, \u00XX, per
  // byte; four events carry the id and model). In accumulate mode nothing
  // is written.
  // Returns: see triton_stream_status. A stream client's error_message is
  // an error event (vLLM's shape for a failure mid-stream) and [DONE],
  // status ok; done() is then true with finish_reason "error".
  triton_stream_result feed(const grpc::stream_response& r, char* out, size_t cap) noexcept;
  size_t event_bytes_max(const grpc::stream_response& r) const noexcept;

  // The gRPC stream ended with status OK before the reply did: writes the
  // finish chunk (finish_reason "stop"), the usage chunk when asked and
  // [DONE], or in accumulate mode just ends the reply. Returns: ok, or
  // need_space as feed(), or ended when the reply had ended already.
  triton_stream_result finish(char* out, size_t cap) noexcept;

  // Accumulate mode, once done(): the chat.completion or text_completion
  // body with the accumulated text and usage, vLLM's shape. Needs at most
  // body_bytes_max(). Returns: ok with `written`, or need_space.
  triton_stream_result write_body(char* out, size_t cap) const noexcept;
  size_t body_bytes_max() const noexcept;

  bool done() const noexcept { return _state.done; }
  const triton_outcome& outcome() const noexcept { return _state.outcome; }

 private:
  // Trivially copyable: feed() saves it and puts it back when the output
  // did not fit, so a retry with more space sees the same state.
  struct state {
    bool role_sent = false;
    bool done = false;
    triton_outcome outcome;
  };

  void role_event(detail::bounded_sink& sink) noexcept;
  void end(detail::bounded_sink& sink, std::string_view finish, bool finish_sent) noexcept;

  triton_reply_context _ctx;
  std::string* _text = nullptr;  // accumulate mode
  state _state;
  // The chunks' opening bytes up to their choices (ctx.chunk_head): the
  // id and model are escaped once per stream, not per event. A longer head
  // than this is written per event.
  char _chunk_head[512] = {};
};

// A Triton error_message (or any backend failure text) as the 502 body a
// non-stream client gets. Returns: bytes written (cap >= 512).
size_t triton_error_body(std::string_view message, char* out, size_t cap) noexcept;

// gRPC status codes (grpc/status.h); the ones mapped by name below.
enum class grpc_status : uint32_t {
  ok = 0, cancelled = 1, unknown = 2, invalid_argument = 3, deadline_exceeded = 4, not_found = 5,
  already_exists = 6, permission_denied = 7, resource_exhausted = 8, failed_precondition = 9,
  aborted = 10, out_of_range = 11, unimplemented = 12, internal = 13, unavailable = 14,
  data_loss = 15, unauthenticated = 16,
};

struct grpc_error_answer {
  uint16_t status = 502;   // the HTTP status to answer the client with
  bool retryable = false;  // another backend may take it (UNAVAILABLE), if nothing was sent yet
  size_t written = 0;      // the OpenAI error body's bytes in `out`
};

// A gRPC status that ended a call (grpc-status, and grpc-message as sent:
// percent-encoded) -> the OpenAI error answer: INVALID_ARGUMENT and
// OUT_OF_RANGE 400, NOT_FOUND 404 (model_not_found), RESOURCE_EXHAUSTED
// 429, DEADLINE_EXCEEDED 504, UNAVAILABLE 503 (retryable), UNAUTHENTICATED
// and PERMISSION_DENIED 502 (sluice's own credentials were refused: the
// backend's message is not shown), everything else 502. The body is
// OpenAI's shape with the decoded message (its first 400 bytes), escaped.
// `out` needs cap >= 512. Cold path (failed calls only).
grpc_error_answer grpc_status_to_openai(uint32_t code, std::string_view grpc_message, char* out,
                                        size_t cap) noexcept;

// grpc-message's percent-encoding (PROTOCOL-HTTP2.md: "%XX" for bytes
// outside 0x20-0x7E and for '%' itself) undone into out[0, cap). A '%' not
// followed by two hex digits stays as it is, as the spec asks of a reader.
// Returns: bytes written; the decoding stops at cap.
size_t percent_decode(std::string_view in, char* out, size_t cap) noexcept;

}  // namespace sluice::openai
