#pragma once
// vLLM's wire format, byte for byte: what uvicorn puts on the socket for the
// pydantic models of vllm/entrypoints/openai/protocol.py (vLLM 0.10.x).
// Everything appends to a caller-owned std::string whose capacity is reused
// from request to request, so the hot path does not allocate once warm.
#include <cstdint>
#include <ctime>
#include <span>
#include <string>
#include <string_view>

#include "options.hpp"

namespace mock_vllm {

// messages: Anthropic's /v1/messages (anthropic.hpp); the others are vLLM's.
enum class endpoint : uint8_t { chat, completion, embedding, messages, responses };

struct usage_counts {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
};

// JSON string with quotes, escaped as Python's json / pydantic do with
// ensure_ascii=False: `"` `\` and control bytes only; UTF-8 passes through.
void append_json_string(std::string& out, std::string_view s);
// Same, for bytes that may not be UTF-8 (recorded request bodies): invalid
// input has every byte >= 0x80 written as \u00XX, so the JSON stays valid.
void append_json_bytes(std::string& out, std::string_view s);
void append_uint(std::string& out, uint64_t v);
void append_int(std::string& out, int64_t v);
// Token i of every reply: "tok<i>", with a leading space for i > 0, then
// `pad` filler bytes 'x' (--token-pad: long replies in few tokens).
void append_token_text(std::string& out, uint32_t i, uint32_t pad = 0);

// The `date` header value, formatted once per second (per event loop).
class http_date {
 public:
  std::string_view at(time_t now_s) noexcept;

 private:
  time_t _second = -1;
  char _text[40] = {};
  size_t _length = 0;
};

// "HTTP/1.1 200 OK\r\n" and friends, with Python's http.HTTPStatus phrases.
std::string_view status_line(int status) noexcept;

// A complete response with a body. `extra_headers` are whole lines
// ("allow: POST\r\n") that Starlette puts before content-length.
void append_response(std::string& out, int status, std::string_view date, std::string_view body,
                     std::string_view content_type, bool connection_close,
                     std::string_view extra_headers = {});
// 200 with no body and no content-type (vLLM's /health).
void append_empty_response(std::string& out, std::string_view date, bool connection_close);
// uvicorn's own answer to bytes that are not HTTP; the connection closes.
void append_invalid_http_response(std::string& out, std::string_view date);
// Head of a StreamingResponse: no content-length, so uvicorn chunks it.
void append_stream_head(std::string& out, std::string_view date, bool connection_close);
// One HTTP chunk: "<hex size>\r\n<payload>\r\n" (uvicorn: lowercase hex, no padding).
void append_chunk(std::string& out, std::string_view payload);

// {"object":"error",...} or {"error":{...}} depending on `format`.
void append_error_body(std::string& out, error_format format, int code, std::string_view type,
                       std::string_view message);

// `{"id":"<id>","object":"<object>","created":<t>,"model":"<model>","choices":[`:
// the constant head of every chunk of one stream, built once per request.
void append_chunk_prefix(std::string& out, endpoint kind, std::string_view id, int64_t created,
                         std::string_view model);

// SSE events of a stream; `scratch` is reused to build the event before it is
// framed as one HTTP chunk, as vLLM yields one chunk per event.
void append_role_event(std::string& out, std::string& scratch, std::string_view prefix);
void append_token_event(std::string& out, std::string& scratch, endpoint kind,
                        std::string_view prefix, uint32_t index, bool ends_by_length,
                        uint32_t token_pad = 0);
void append_stop_event(std::string& out, std::string& scratch, endpoint kind, std::string_view prefix);
void append_usage_event(std::string& out, std::string& scratch, std::string_view prefix, usage_counts u);
// "data: [DONE]\n\n" and the terminal zero-length chunk.
void append_done_events(std::string& out);

// Non-stream bodies (JSONResponse(model_dump()): every field, nulls included).
void append_chat_body(std::string& out, std::string_view id, int64_t created, std::string_view model,
                      uint32_t tokens, bool ends_by_length, usage_counts u, uint32_t token_pad = 0);
void append_completion_body(std::string& out, std::string_view id, int64_t created,
                            std::string_view model, uint32_t tokens, bool ends_by_length,
                            usage_counts u, uint32_t token_pad = 0);
// One vector of 8 floats per input; each float is (nibble - 8) / 8 of the
// input's hash, so its Python repr is short and exact.
void append_embedding_body(std::string& out, std::string_view id, int64_t created,
                           std::string_view model, std::span<const uint64_t> input_hashes,
                           uint32_t prompt_tokens);
void append_models_body(std::string& out, std::string_view model, int64_t created,
                        uint32_t max_model_len, std::string_view permission_id);

}  // namespace mock_vllm
