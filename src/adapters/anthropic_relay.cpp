// The relay's Anthropic dialect (reply_dialect::anthropic): the backend's
// Messages reply, translated into the OpenAI reply the client would get
// from vLLM for the same text. The transport's parser and SSE scanner read
// the backend's bytes as for any response; what goes to the client is
// sluice's own:
//   - an error answer (any status but 200) is read whole and answered in
//     OpenAI's shape (openai::anthropic_error_to_openai);
//   - a non-stream reply is read whole, then answered as a chat.completion
//     (a text_completion for legacy completions);
//   - a stream's events are fed to openai::anthropic_stream, one at a time;
//     what it writes for a batch of events goes out as one chunk of the
//     client's own chunked body (or bare, to an HTTP/1.0 client).
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

namespace {

// The most one event may need, per the translator's bound (anthropic.hpp).
constexpr size_t event_output_bound(const exchange& x, size_t data_bytes) noexcept {
  return 2 * (256 + 6 * (size_t{x.request_id_len} + x.req.model_len)) + 6 * data_bytes;
}

}  // namespace

bool openai_http::translated_head(exchange& x, bool rendered) noexcept {
  const http::response_head& rh = x.rsp.head;
  relay_state& r = x.rsp;
  r.head_seen = true;
  r.reusable = rh.keep_alive;
  r.facts = stream_facts{};
  set_pings(x, _cfg->server.ping_interval_ms);
  x.codec->stream_wait(x, _cfg->groups[x.group].upstream.stream_idle_timeout_ms);
  r.fwd_from = rh.head_bytes;
  if (rh.status != 200) {
    // The backend's error body, held and answered in the client's shape
    // (answer_backend_error); a body past the hold bound is its tail.
    r.hold_error = true;
    x.status = rh.status;
    relay(x, rh.head_bytes, true);
    return false;
  }
  r.translated = true;
  r.answered_ok = true;
  r.rendered = rendered;
  if (!x.req.is_stream) {
    if (rh.event_stream) {
      upstream_failed(x, errc::upstream_protocol);  // a stream the request did not ask for
      return false;
    }
    r.hold_reply = true;
    x.mem->body.len = 0;
    relay(x, rh.head_bytes, true);
    return false;
  }
  if (!rh.event_stream) {
    upstream_failed(x, errc::upstream_protocol);
    return false;
  }
  if (!x.mem->sse) {
    x.mem->sse.reset(new (std::nothrow) http::sse_scanner(&openai_http::on_sse_event, &x));
    if (x.mem->sse) account_connection_memory(k_sse_scanner_bytes);
  }
  if (!x.mem->sse || !x.mem->frame.reserve(64u << 10) || (renders(x) && !start_rendering(x))) {
    upstream_failed(x, errc::internal);
    return false;
  }
  x.mem->sse->reset();
  // The renderer reads each chat event whole, however large (a whole tool
  // call in one delta); the Anthropic translator takes its own bound.
  if (rendered) x.mem->sse->set_event_limit(dialect::stream_renderer::k_large_event_bytes_max);
  return true;
}

bool openai_http::open_translated_stream(exchange& x) noexcept {
  relay_state& r = x.rsp;
  r.dechunk = !x.codec->takes_chunked(x);
  if (!x.codec->stage_response_head(x, translated_stream_head(), r.dechunk)) {
    upstream_failed(x, errc::internal);
    return false;
  }
  x.status = 200;
  x.response_started = true;
  x.mem->frame.len = k_batch_room;
  return true;
}

void openai_http::on_anthropic_head(exchange& x) noexcept {
  if (!translated_head(x, false)) return;  // answered, held whole, or failed
  anthropic_memory* m = wing_of<anthropic_memory>(*x.mem, k_anthropic_wing, anthropic_memory::k_extra_bytes);
  if (m == nullptr) {
    upstream_failed(x, errc::internal);
    return;
  }
  openai::anthropic_reply_context ctx;
  ctx.request_id = std::string_view(x.request_id, x.request_id_len);
  ctx.created_s = static_cast<int64_t>(x.start_wall_ms / 1000);
  ctx.model = std::string_view(x.req.model, x.req.model_len);
  ctx.include_usage = x.rsp.client_usage;
  ctx.kind = x.req.endpoint;
  m->stream.reset(ctx);
  if (!open_translated_stream(x)) return;
  relay(x, x.rsp.head.head_bytes, true);
}

void openai_http::on_anthropic_event(exchange& x, const http::sse_event& ev) noexcept {
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
    // Room for the worst this event can write, and the chunk's tail (its
    // CRLF, the terminal chunk) after it.
    const size_t need = static_cast<size_t>(f.len) + event_output_bound(x, ev.data.size()) + 16;
    if (need > f.cap && !f.reserve(need)) {
      res.status = openai::anthropic_stream_status::too_large;
    } else {
      res = t.feed({}, ev.data, f.data + f.len, f.cap - f.len - 16);
    }
  }
  switch (res.status) {
    case openai::anthropic_stream_status::ok:
      if (res.written != 0 && x.first_token_ms == 0 && s.events > 1) x.first_token_ms = _s.now_ms();
      f.len += static_cast<uint32_t>(res.written);
      break;
    case openai::anthropic_stream_status::ended:
      break;
    case openai::anthropic_stream_status::need_space:  // the bound above makes this a bug
    case openai::anthropic_stream_status::malformed:
    case openai::anthropic_stream_status::too_large: {
      // The stream cannot be read on: it ends as a vLLM stream that fails
      // does, with an error event, then [DONE]; the backend is cut.
      _metrics.at(metrics::stat::upstream_bad_replies).add();
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

void openai_http::send_translated(exchange& x, bool with_head, uint32_t parsed_end, bool complete) noexcept {
  // Everything parsed was read into the translator: none of the backend's
  // bytes go out, so the receive buffer is not lent.
  relay_state& r = x.rsp;
  byte_buf& f = x.mem->frame;
  r.send_end = parsed_end;
  // The client's response ends with the translator's [DONE] (facts.done),
  // or when the backend's ends without one (truncated, as the backend's was).
  const bool end_client = r.facts.done || complete;
  if (end_client) r.client_done = true;
  // A Responses or Messages client: the chat events rendered in its dialect
  // (an OpenAI backend's were as they came: on_chat_event).
  const bool rendered_ok = !renders(x) ? true : r.rendered ? end_rendering(x, f, end_client) : render_batch(x, f, end_client);
  if (!rendered_ok) {
    f.len = k_batch_room;
    upstream_failed(x, errc::internal);
    return;
  }
  const iovec piece = frame_translated_batch(f, r.dechunk, end_client);
  f.len = k_batch_room;  // the next batch starts afresh once this send completed
  if (end_client && !complete) {
    // The backend's rest is read and dropped for a short while (as after a
    // passed-through [DONE]); then its connection is closed, not pooled.
    const uint64_t idle_ms = _cfg->groups[x.group].upstream.stream_idle_timeout_ms;
    x.codec->stream_wait(x, idle_ms < k_after_done_wait_ms ? idle_ms : k_after_done_wait_ms);
  }
  send_batch(x, with_head, &piece, piece.iov_len != 0 ? 1 : 0, nullptr);
}

void openai_http::answer_anthropic_reply(exchange& x) noexcept {
  relay_state& r = x.rsp;
  r.hold_reply = false;
  end_attempt(x);
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
    _metrics.at(metrics::stat::upstream_bad_replies).add();
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
    answer_rendered(x, _reply);
    return;
  }
  x.codec->answer(x, 200, _reply, false, {}, {});
}

}  // namespace sluice::proxy
