// The client's dialect on the exchange's way (dialect_relay.hpp).
#include "dialect_relay.hpp"

#include <cstring>
#include <new>

#include "client_codec.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/dialect/dialect.hpp"

namespace sluice::proxy {

namespace {

dialect::reply_context context_of(const exchange& x) noexcept {
  dialect::reply_context ctx;
  ctx.request_id = std::string_view(x.request_id, x.request_id_len);
  ctx.created_s = static_cast<int64_t>(x.start_wall_ms / 1000);
  ctx.model = std::string_view(x.req.model, x.req.model_len);
  return ctx;
}

void set_facts(stream_facts& s, const dialect::reply_outcome& o) noexcept {
  s.prompt_tokens = o.prompt_tokens;
  s.completion_tokens = o.completion_tokens;
  if (o.error) s.error = true;
  const size_t n = o.finish_reason.size() < sizeof s.finish_reason ? o.finish_reason.size() : sizeof s.finish_reason;
  if (n != 0) std::memcpy(s.finish_reason, o.finish_reason.data(), n);
  s.finish_reason_len = static_cast<uint8_t>(n);
}

}  // namespace

std::string_view request_body(const exchange& x) noexcept {
  return renders(x) ? x.req.body : x.codec->request_body(x);
}

bool start_rendering(exchange& x) noexcept {
  if (!x.mem->renderer) {
    x.mem->renderer.reset(new (std::nothrow) dialect::stream_renderer(http::sse_scanner::k_event_bytes_max));
    if (!x.mem->renderer) return false;
    x.mem->count(static_cast<int64_t>(sizeof(dialect::stream_renderer) + http::sse_scanner::k_event_bytes_max));
  }
  x.mem->renderer->reset(x.req.speaks, context_of(x));
  return true;
}

void take_outcome(exchange& x) noexcept {
  const dialect::stream_renderer& r = *x.mem->renderer;
  stream_facts& s = x.rsp.facts;
  if (r.done()) s.done = true;
  set_facts(s, r.outcome());
  s.content_events = r.outcome().deltas;
  // Kept before its last bytes go out, so a client's next request never
  // comes before the store has it.
  if (r.done() && x.req.store_put && x.codec->policy() != nullptr) x.codec->policy()->keep_response(x);
}

bool render_batch(exchange& x, byte_buf& f, bool end_client) noexcept {
  dialect::stream_renderer& r = *x.mem->renderer;
  byte_buf& g = x.mem->dialect_frame;
  // The chat events are sluice's own translators' ("data: X\n\n" each).
  std::string_view in(f.data + k_batch_room, f.len - k_batch_room);
  if (!g.reserve(k_batch_room + r.bound(in.size()) + 16)) return false;
  g.len = k_batch_room;
  while (!in.empty()) {
    const size_t end = in.find("\n\n");
    std::string_view ev = in.substr(0, end);
    in.remove_prefix(end == std::string_view::npos ? in.size() : end + 2);
    if (!ev.starts_with("data: ")) continue;
    ev.remove_prefix(6);
    const size_t need = static_cast<size_t>(g.len) + r.bound(ev.size()) + 16;
    if (need > g.cap && !g.reserve(need)) return false;
    size_t n = 0;
    const dialect::render_status st = r.feed(ev, g.data + g.len, g.cap - g.len - 16, n);
    // cap >= bound(): never more_room; were it, the event would be lost.
    if (st == dialect::render_status::too_large || st == dialect::render_status::more_room) return false;
    if (st == dialect::render_status::malformed) break;  // finish(true) below
    g.len += static_cast<uint32_t>(n);
  }
  if (end_client && !r.done()) {
    const size_t need = static_cast<size_t>(g.len) + r.bound(0) + 16;
    if (need > g.cap && !g.reserve(need)) return false;
    size_t n = 0;
    if (r.finish(true, g.data + g.len, g.cap - g.len - 16, n) != dialect::render_status::ok) return false;
    g.len += static_cast<uint32_t>(n);
  }
  // The rendered batch takes the frame's place (the buffers trade: no copy).
  std::swap(f.data, g.data);
  std::swap(f.len, g.len);
  std::swap(f.cap, g.cap);
  g.len = 0;
  take_outcome(x);
  return true;
}

bool end_rendering(exchange& x, byte_buf& f, bool end_client) noexcept {
  dialect::stream_renderer& r = *x.mem->renderer;
  if (end_client && !r.done()) {
    const size_t need = static_cast<size_t>(f.len) + r.bound(0) + 16;
    if (need > f.cap && !f.reserve(need)) return false;
    size_t n = 0;
    if (r.finish(true, f.data + f.len, f.cap - f.len - 16, n) != dialect::render_status::ok) return false;
    f.len += static_cast<uint32_t>(n);
  }
  take_outcome(x);
  return true;
}

bool render_body(exchange& x, std::string_view chat) noexcept {
  dialect::reply_outcome o;
  bool ok = false;
  try {
    ok = dialect::render_reply(x.req.speaks, chat, context_of(x), x.mem->dialect_reply, o);
  } catch (...) {  // the reply string's growth: out of memory
    ok = false;
  }
  if (ok) set_facts(x.rsp.facts, o);
  if (ok && !o.error && x.req.store_put && x.codec->policy() != nullptr) x.codec->policy()->keep_response(x);
  return ok;
}

std::string_view in_client_dialect(const exchange& x, uint16_t status, std::string_view body, char* buf,
                                   size_t cap) noexcept {
  if (status < 400 || !dialect::anthropic_errors(x.req.speaks)) return body;
  char message[768];
  std::string_view m = dialect::error_message_of(body, message, sizeof message);
  if (m.empty()) m = "The request failed.";
  return std::string_view(buf, dialect::write_anthropic_error(buf, cap, status, m));
}

}  // namespace sluice::proxy
