// The transport's part of a translated reply -- one whose client answer is
// sluice's own, not the backend's bytes: an Anthropic backend's (its
// http_reply_reader, anthropic_relay.cpp, translates it into OpenAI's), or
// an OpenAI backend's rendered for a Responses or Messages client
// (rendered_relay.cpp). The head is judged (an error held, a non-stream
// body held whole, a stream opened), and each batch of translated events
// goes out as one chunk of the client's body.
#include "openai_http.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "wire.hpp"

namespace sluice::proxy {

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
  // Each event is read whole, however large (a whole tool call in one
  // delta): by the renderer, or by a reader's translator (each takes up
  // to 4 MiB).
  x.mem->sse->set_event_limit(dialect::stream_renderer::k_large_event_bytes_max);
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

}  // namespace sluice::proxy
