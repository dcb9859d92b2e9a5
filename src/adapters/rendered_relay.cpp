// The relay of an OpenAI backend's chat reply to a Responses or Messages
// client (dialect_relay.hpp): the transport's parser and SSE scanner read
// the backend's bytes as for any response, and what goes to the client is
// rendered by sluice --
//   - an error answer is held and answered in the client's shape
//     (answer_backend_error, then the codec's in_client_dialect);
//   - a non-stream chat.completion is read whole, then rendered;
//   - a stream's events are fed to the exchange's dialect::stream_renderer
//     one at a time; what it writes for a batch goes out as one chunk of the
//     client's own chunked body (or bare, to an HTTP/1.0 client).
#include <cstring>

#include "openai_http.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"

namespace sluice::proxy {

void openai_http::on_rendered_head(exchange& x) noexcept {
  x.rsp.cut_usage = false;  // the renderer reads the usage event; none of the backend's bytes go out
  if (!translated_head(x, true) || !open_translated_stream(x)) return;  // answered, held whole, or failed
  // The client's stream opens with the head, before the first token (the
  // backend may be at a long prefill): response.created, or message_start
  // and a ping.
  byte_buf& f = x.mem->frame;
  size_t n = 0;
  if (x.mem->renderer->start(f.data + f.len, f.cap - f.len - 16, n) == dialect::render_status::ok) {
    f.len += static_cast<uint32_t>(n);
  }
  relay(x, x.rsp.head.head_bytes, true);
}

void openai_http::on_chat_event(exchange& x, const http::sse_event& ev) noexcept {
  relay_state& r = x.rsp;
  stream_facts& s = r.facts;
  if (s.done) return;  // after the dialect's last event: the backend's rest is dropped
  ++s.events;
  dialect::stream_renderer& t = *x.mem->renderer;
  byte_buf& f = x.mem->frame;
  dialect::render_status st = dialect::render_status::too_large;
  size_t n = 0;
  if (!ev.truncated) {
    // 16 bytes kept for the chunk's tail (its CRLF, the terminal chunk).
    // What the frame has is enough for a token's delta; any other event
    // asks for the worst it can write (more_room) and is fed again.
    st = dialect::render_status::more_room;
    if (f.cap >= f.len + 16u) st = t.feed(ev.data, f.data + f.len, f.cap - f.len - 16, n);
    if (st == dialect::render_status::more_room) {
      const size_t need = static_cast<size_t>(f.len) + t.bound(ev.data.size()) + 16;
      st = f.reserve(need) ? t.feed(ev.data, f.data + f.len, f.cap - f.len - 16, n) : dialect::render_status::too_large;
    }
  }
  if (st == dialect::render_status::ok) {
    rendered(x, n);
  } else {
    // The stream cannot be read on: it ends with the dialect's failure
    // events, and the backend is cut.
    _metrics.at(metrics::stat::upstream_bad_replies).add();
    const size_t need = static_cast<size_t>(f.len) + t.bound(0) + 16;
    if (need <= f.cap || f.reserve(need)) {
      if (t.finish(true, f.data + f.len, f.cap - f.len - 16, n) == dialect::render_status::ok) {
        f.len += static_cast<uint32_t>(n);
      }
    }
    r.reusable = false;
    s.done = true;
  }
  if (t.done()) take_outcome(x);
}

void openai_http::rendered(exchange& x, size_t n) noexcept {
  // An event's `n` bytes rendered into the frame.
  stream_facts& s = x.rsp.facts;
  if (n != 0 && x.first_token_ms == 0 && s.events > 1) x.first_token_ms = _s.now_ms();
  x.mem->frame.len += static_cast<uint32_t>(n);
  s.content_events = x.mem->renderer->outcome().deltas;
}

bool openai_http::rendered_plain_chunk(exchange& x, std::string_view chunk) noexcept {
  // "data: " + the event + "\n\n", after the first event and between two:
  // the scan would call on_chat_event once with it (feed_plain's check
  // leaves no CR or LF in a plain event), so the scan is not needed.
  stream_facts& s = x.rsp.facts;
  if (s.done || s.events == 0 || chunk.size() < 8 || !chunk.starts_with("data: ") || !chunk.ends_with("\n\n") ||
      !x.mem->sse->between_events()) {
    return false;
  }
  byte_buf& f = x.mem->frame;
  size_t n = 0;
  if (f.cap < f.len + 16u ||
      !x.mem->renderer->feed_plain(chunk.substr(6, chunk.size() - 8), f.data + f.len, f.cap - f.len - 16, n)) {
    return false;
  }
  ++s.events;
  rendered(x, n);
  return true;
}

bool openai_http::end_failed_stream(exchange& x) noexcept {
  relay_state& r = x.rsp;
  byte_buf& f = x.mem->frame;
  if (r.sending || r.client_done || f.len < k_batch_room || !x.mem->renderer) return false;
  // What an OpenAI backend's events rendered so far, or the chat events an
  // adapter wrote (rendered now), then the failure events.
  if (!(r.rendered ? end_rendering(x, f, true) : render_batch(x, f, true))) return false;
  r.client_done = true;
  r.complete = true;  // the send's completion ends the exchange (after_body_sent)
  r.reusable = false;
  const iovec piece = frame_translated_batch(f, r.dechunk, true);
  f.len = k_batch_room;
  send_batch(x, false, &piece, piece.iov_len != 0 ? 1 : 0, nullptr);
  return true;
}

void openai_http::answer_chat_reply(exchange& x) noexcept {
  relay_state& r = x.rsp;
  r.hold_reply = false;
  end_attempt(x);
  if (r.body_overflow) {
    _metrics.at(metrics::stat::upstream_bad_replies).add();
    r.answered_ok = false;
    x.mem->body.len = 0;
    x.codec->answer_error(x, 502, "The backend's answer is too large to translate.", "server_error", {},
                          "upstream_error", false);
    return;
  }
  const std::string_view chat(x.mem->body.data, x.mem->body.len);
  answer_rendered(x, chat);
}

void openai_http::answer_rendered(exchange& x, std::string_view chat) noexcept {
  relay_state& r = x.rsp;
  const bool ok = render_body(x, chat);
  x.mem->body.len = 0;  // not scanned again at the end: `facts` has the counts
  if (!ok) {
    _metrics.at(metrics::stat::upstream_bad_replies).add();
    r.answered_ok = false;
    x.codec->answer_error(x, 502, "The backend sent an answer sluice cannot read.", "server_error", {},
                          "upstream_error", false);
    return;
  }
  x.codec->answer(x, 200, x.mem->dialect_reply, false, {}, {});
}

}  // namespace sluice::proxy
