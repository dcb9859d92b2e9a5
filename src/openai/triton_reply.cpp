// openai: Triton's ModelStreamInfer responses -> the OpenAI reply vLLM's
// own server writes for the same text: for a stream client, one response
// at a time,
//   the first response        the role chunk (chat only)
//   a non-empty text_output   a content chunk (chat) / a text chunk (completions)
//   the end                   the finish reason on the last content chunk, or an
//                             empty finish chunk when the last response has no
//                             text; the usage chunk when asked; [DONE]
//   an error_message          an error event, [DONE]
// and for a non-stream client the text collected, then one body. The chunk
// and body bytes are those of tools/mock-vllm/wire.cpp (vLLM's field order;
// chat chunks have no "usage" key, completion chunks "usage":null).
// Also the gRPC status -> OpenAI error mapping (cold path).
#include <cstring>

#include "json_writer.hpp"
#include "reply_writer.hpp"
#include "sluice/core/text.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/openai/triton.hpp"

namespace sluice::openai {

namespace {

using writer = detail::json_writer<detail::bounded_sink>;

// vLLM's finish reasons as its server passes them on (stop, length, abort);
// anything else a backend says ends the reply as a stop. Empty and "None"
// (vLLM's backend writes str(None) until the last response): not finished.
std::string_view finish_reason_of(const grpc::stream_response& r) noexcept {
  if (!r.has_finish_reason) return {};
  const std::string_view f = r.finish_reason;
  if (f.empty() || f == "None") return {};
  if (f == "length") return "length";
  if (f == "abort") return "abort";
  return "stop";
}

size_t escaped_bound(size_t n) noexcept { return 6 * n; }

}  // namespace

void triton_stream::reset(const triton_reply_context& ctx, std::string* accumulate) noexcept {
  _ctx = ctx;
  detail::set_chunk_head(_ctx, _chunk_head);
  _text = accumulate;
  if (_text != nullptr) _text->clear();
  _state = state{};
}

size_t triton_stream::event_bytes_max(const grpc::stream_response& r) const noexcept {
  return 1024 + escaped_bound(4 * (_ctx.request_id.size() + _ctx.model.size()) + r.text_output.size() +
                              r.error_message.size());
}

size_t triton_stream::body_bytes_max() const noexcept {
  const size_t text = _text != nullptr ? _text->size() : 0;
  return 1024 + escaped_bound(_ctx.request_id.size() + _ctx.model.size() + text);
}

// The end of a reply: the finish chunk (unless the last content chunk
// carried the finish reason: `finish_sent`), the usage chunk when asked,
// [DONE]. An empty-content finish chunk is what vLLM writes when the last
// token (EOS) decodes to nothing.
void triton_stream::end(detail::bounded_sink& sink, std::string_view finish, bool finish_sent) noexcept {
  _state.done = true;
  _state.outcome.finish_reason = finish;
  if (_text != nullptr) return;
  writer w(sink);
  if (!finish_sent) detail::text_chunk(w, _ctx, "", finish);
  if (_ctx.include_usage) detail::usage_chunk(w, _ctx, _state.outcome.prompt_tokens, _state.outcome.completion_tokens);
  w.raw("data: [DONE]\n\n");
}

void triton_stream::role_event(detail::bounded_sink& sink) noexcept {
  if (_state.role_sent || _text != nullptr) return;
  _state.role_sent = true;
  writer w(sink);
  detail::role_chunk(w, _ctx);  // chat only
}

triton_stream_result triton_stream::feed(const grpc::stream_response& r, char* out, size_t cap) noexcept {
  using status = triton_stream_status;
  if (_state.done) return {status::ended, 0, 0};
  const state saved = _state;
  triton_outcome& o = _state.outcome;
  detail::bounded_sink sink{out, cap};

  if (!r.error_message.empty()) {
    o.error_message = r.error_message;
    _state.done = true;
    o.finish_reason = "error";
    if (_text != nullptr) return {status::failed, 0, 0};
    // vLLM's server, failing mid-stream: {"error":{...}} with an integer
    // code, then [DONE]. The backend failed, not the request: 502.
    role_event(sink);
    writer w(sink);
    w.raw("data: {\"error\":{\"message\":");
    w.str(r.error_message);
    w.raw(",\"type\":\"server_error\",\"param\":null,\"code\":502}}\n\ndata: [DONE]\n\n");
  } else {
    if (r.num_input_tokens >= 0) o.prompt_tokens = r.num_input_tokens;
    if (r.num_output_tokens >= 0) {
      // Deltas in vLLM's streaming mode: the tokens since the last response.
      if (!o.counted_by_backend) o.completion_tokens = 0;
      o.counted_by_backend = true;
      o.completion_tokens += r.num_output_tokens;
    }
    const std::string_view text = r.has_text_output ? r.text_output : std::string_view{};
    if (!text.empty()) {
      o.content_seen = true;
      if (!o.counted_by_backend) ++o.completion_tokens;
    }
    std::string_view finish = finish_reason_of(r);
    const bool ending = !finish.empty() || (r.has_final_response && r.final_response);
    if (ending && finish.empty()) finish = "stop";  // TensorRT-LLM says none
    role_event(sink);
    if (!text.empty()) {
      if (_text != nullptr) {
        // Caller's buffer: grows only past its largest reply so far, and
        // never past the bound (nor throws out of this noexcept function).
        if (text.size() > k_reply_text_bytes_max - _text->size()) {
          _state = saved;
          return {status::too_large, 0, 0};
        }
        try {
          _text->append(text.data(), text.size());
        } catch (...) {
          _state = saved;
          return {status::too_large, 0, 0};
        }
      } else {
        writer w(sink);
        detail::text_chunk(w, _ctx, text, ending ? finish : std::string_view{});
      }
    }
    if (ending) end(sink, finish, !text.empty());
  }
  if (!sink.fits()) {
    // Only a stream client's events reach here (accumulate mode writes no
    // bytes), so the text buffer needs no undoing.
    _state = saved;
    return {status::need_space, 0, sink.size};
  }
  return {status::ok, sink.size, sink.size};
}

triton_stream_result triton_stream::finish(char* out, size_t cap) noexcept {
  using status = triton_stream_status;
  if (_state.done) return {status::ended, 0, 0};
  const state saved = _state;
  detail::bounded_sink sink{out, cap};
  role_event(sink);
  end(sink, "stop", false);
  if (!sink.fits()) {
    _state = saved;
    return {status::need_space, 0, sink.size};
  }
  return {status::ok, sink.size, sink.size};
}

triton_stream_result triton_stream::write_body(char* out, size_t cap) const noexcept {
  using status = triton_stream_status;
  detail::bounded_sink sink{out, cap};
  writer w(sink);
  const std::string_view text = _text != nullptr ? std::string_view(*_text) : std::string_view{};
  const std::string_view finish = _state.outcome.finish_reason.empty() ? "stop" : _state.outcome.finish_reason;
  const triton_outcome& o = _state.outcome;
  if (detail::is_chat(_ctx)) {
    detail::reply_prefix(w, _ctx, false);
    w.raw("{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    w.str(text);
    w.raw(",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[");
    detail::chat_body_end(w, finish, o.prompt_tokens, o.completion_tokens);
  } else {
    detail::completion_body_begin(w, _ctx);
    w.str(text);
    detail::completion_body_end(w, finish, o.prompt_tokens, o.completion_tokens);
  }
  if (!sink.fits()) return {status::need_space, 0, sink.size};
  return {status::ok, sink.size, sink.size};
}

size_t triton_error_body(std::string_view message, char* out, size_t cap) noexcept {
  return write_error_body(out, cap, default_error_for_status(502, message));
}

// --- gRPC status -> OpenAI error -------------------------------------------

size_t percent_decode(std::string_view in, char* out, size_t cap) noexcept {
  size_t n = 0;
  for (size_t i = 0; i < in.size() && n < cap; ++i) {
    char c = in[i];
    if (c == '%' && i + 2 < in.size()) {
      const int hi = hex_digit(in[i + 1]);
      const int lo = hex_digit(in[i + 2]);
      if (hi >= 0 && lo >= 0) {
        c = static_cast<char>((hi << 4) | lo);
        i += 2;
      }
    }
    out[n++] = c;
  }
  return n;
}

grpc_error_answer grpc_status_to_openai(uint32_t code, std::string_view grpc_message, char* out,
                                        size_t cap) noexcept {
  // The message as the client reads it: decoded, its first bytes (a
  // backend's stack trace is not the client's business past that).
  char decoded[400];
  const std::string_view message(decoded, percent_decode(grpc_message, decoded, sizeof decoded));
  grpc_error_answer a;
  std::string_view shown = message;
  switch (static_cast<grpc_status>(code)) {
    case grpc_status::invalid_argument:
    case grpc_status::out_of_range: a.status = 400; break;
    case grpc_status::not_found: a.status = 404; break;
    case grpc_status::resource_exhausted: a.status = 429; break;
    case grpc_status::deadline_exceeded: a.status = 504; break;
    case grpc_status::unavailable:
      a.status = 503;
      a.retryable = true;
      break;
    case grpc_status::unauthenticated:
    case grpc_status::permission_denied:
      // sluice's own credentials for the backend: nothing the client can fix.
      a.status = 502;
      shown = "The backend refused this gateway's credentials.";
      break;
    case grpc_status::ok:
      a.status = 502;
      shown = "The backend ended the call without an answer.";
      break;
    default: a.status = 502; break;
  }
  a.written = write_error_body(out, cap, default_error_for_status(a.status, shown));
  return a;
}

}  // namespace sluice::openai
