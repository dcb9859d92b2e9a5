// The Anthropic adapter's reader of its replies (http_reply_reader): the
// backend's Messages reply, translated into the OpenAI reply the client
// would get from vLLM for the same text. The HTTP/1.1 transport
// (openai_http) parses the backend's bytes and scans its events as for any
// response; what goes to the client is sluice's own:
//   - an error answer (any status but 200) is read whole and answered in
//     OpenAI's shape (openai::anthropic_error_to_openai);
//   - a non-stream reply is read whole, then answered as a chat.completion
//     (a text_completion for legacy completions);
//   - a stream's events are fed to openai::anthropic_stream, one at a time;
//     what it writes for a batch of events goes out as one chunk of the
//     client's own chunked body (or bare, to an HTTP/1.0 client:
//     translated_relay.cpp).
#include <cstring>

#include "anthropic_http.hpp"
#include "openai_http.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::proxy {

void anthropic_http::on_reply_head(exchange& x) noexcept {
  if (!_http.translated_head(x, false)) return;  // answered, held whole, or failed
  anthropic_memory* m = wing_of<anthropic_memory>(*x.mem, k_anthropic_wing, anthropic_memory::k_extra_bytes);
  if (m == nullptr) {
    _http.upstream_failed(x, errc::internal);
    return;
  }
  openai::anthropic_reply_context ctx;
  ctx.request_id = std::string_view(x.request_id, x.request_id_len);
  ctx.created_s = static_cast<int64_t>(x.start_wall_ms / 1000);
  ctx.model = std::string_view(x.req.model, x.req.model_len);
  ctx.include_usage = x.rsp.client_usage;
  ctx.kind = x.req.endpoint;
  m->stream.reset(ctx);
  if (!_http.open_translated_stream(x)) return;
  _http.relay(x, x.rsp.head.head_bytes, true);
}

void anthropic_http::on_reply_event(exchange& x, const http::sse_event& ev) noexcept {
  relay_state& r = x.rsp;
  openai::anthropic_stream& t = made_wing<anthropic_memory>(*x.mem, k_anthropic_wing).stream;
  stream_facts& s = r.facts;
  if (s.done) return;  // after [DONE] (or an event it could not read): the backend's rest is dropped
  ++s.events;
  byte_buf& f = x.mem->frame;
  openai::anthropic_stream_result res;
  if (ev.truncated) {
    res.status = openai::anthropic_stream_status::too_large;
  } else {
    // Into the room the frame has (16 bytes kept for the chunk's tail: its
    // CRLF, the terminal chunk); when the output does not fit, the
    // translator says what it needs and is fed again with exactly that
    // (it changed nothing).
    if (f.cap >= f.len + 16u) {
      res = t.feed({}, ev.data, f.data + f.len, f.cap - f.len - 16);
    } else {
      res.status = openai::anthropic_stream_status::need_space;
      res.needed = 0;
    }
    if (res.status == openai::anthropic_stream_status::need_space) {
      const size_t need = static_cast<size_t>(f.len) + (res.needed != 0 ? res.needed : 4096) + 16;
      if (!f.reserve(need)) {
        res.status = openai::anthropic_stream_status::too_large;
      } else {
        res = t.feed({}, ev.data, f.data + f.len, f.cap - f.len - 16);
        if (res.status == openai::anthropic_stream_status::need_space && f.reserve(f.len + res.needed + 16u)) {
          res = t.feed({}, ev.data, f.data + f.len, f.cap - f.len - 16);  // the 4096 guess was short
        }
      }
    }
  }
  switch (res.status) {
    case openai::anthropic_stream_status::ok:
      if (res.written != 0 && x.first_token_ms == 0 && s.events > 1) x.first_token_ms = _s.now_ms();
      f.len += static_cast<uint32_t>(res.written);
      break;
    case openai::anthropic_stream_status::ended:
      break;
    case openai::anthropic_stream_status::need_space:  // it said what it needs and got it: a bug
    case openai::anthropic_stream_status::malformed:
    case openai::anthropic_stream_status::too_large: {
      // The stream cannot be read on: it ends as a vLLM stream that fails
      // does, with an error event, then [DONE]; the backend is cut.
      _s.metrics.at(metrics::stat::upstream_bad_replies).add();
      static constexpr std::string_view k_error =
          "data: {\"error\":{\"message\":\"The backend sent an event sluice cannot read.\",\"type\":\"server_error\","
          "\"param\":null,\"code\":502}}\n\ndata: [DONE]\n\n";
      if (f.reserve(static_cast<size_t>(f.len) + k_error.size() + 16)) {
        std::memcpy(f.data + f.len, k_error.data(), k_error.size());
        f.len += static_cast<uint32_t>(k_error.size());
      }
      s.error = true;
      s.done = true;
      r.reusable = false;
      return;
    }
  }
  if (t.done()) {
    const openai::anthropic_outcome o = t.outcome();
    s.done = true;
    s.prompt_tokens = o.prompt_tokens;
    s.completion_tokens = o.completion_tokens;
    if (o.finish_reason == "error") s.error = true;
    const size_t n = o.finish_reason.size() < sizeof s.finish_reason ? o.finish_reason.size() : sizeof s.finish_reason;
    if (n != 0) std::memcpy(s.finish_reason, o.finish_reason.data(), n);  // an empty view may be null
    s.finish_reason_len = static_cast<uint8_t>(n);
  }
}

size_t anthropic_http::error_to_openai(uint16_t status, std::string_view body, bool overflow, char* out, size_t cap,
                                       uint16_t& status_out) const noexcept {
  return openai::anthropic_error_to_openai(status, overflow ? std::string_view{} : body, out, cap, status_out);
}

void anthropic_http::on_whole_reply(exchange& x) noexcept {
  relay_state& r = x.rsp;
  r.hold_reply = false;
  _http.end_attempt(x);
  openai::anthropic_reply_context ctx;
  ctx.request_id = std::string_view(x.request_id, x.request_id_len);
  ctx.created_s = static_cast<int64_t>(x.start_wall_ms / 1000);
  ctx.model = std::string_view(x.req.model, x.req.model_len);
  ctx.kind = x.req.endpoint;
  openai::anthropic_outcome o;
  bool ok = false;
  if (!r.body_overflow && x.mem->body.reserve(static_cast<size_t>(x.mem->body.len) + simdjson::SIMDJSON_PADDING)) {
    try {
      ok = openai::anthropic_response_to_openai(std::string_view(x.mem->body.data, x.mem->body.len), ctx, _reply, o);
    } catch (...) {  // the reply string's growth: out of memory
      ok = false;
    }
  }
  if (!ok) {
    _s.metrics.at(metrics::stat::upstream_bad_replies).add();
    r.answered_ok = false;
    x.mem->body.len = 0;
    x.codec->answer_error(x, 502,
                          r.body_overflow ? "The backend's answer is too large to translate."
                                          : "The backend sent an answer sluice cannot read.",
                          "server_error", {}, "upstream_error", false);
    return;
  }
  stream_facts& s = r.facts;
  s.prompt_tokens = o.prompt_tokens;
  s.completion_tokens = o.completion_tokens;
  const size_t n = o.finish_reason.size() < sizeof s.finish_reason ? o.finish_reason.size() : sizeof s.finish_reason;
  if (n != 0) std::memcpy(s.finish_reason, o.finish_reason.data(), n);
  s.finish_reason_len = static_cast<uint8_t>(n);
  x.mem->body.len = 0;  // not scanned again at the end: `facts` has the counts
  if (renders(x)) {
    _http.answer_rendered(x, _reply);
    return;
  }
  x.codec->answer(x, 200, _reply, false, {}, {});
}

}  // namespace sluice::proxy
