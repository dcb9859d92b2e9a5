// What the response scan sees: the body of a non-stream answer (kept for
// its usage), the SSE events of a stream (usage, finish, errors, first
// token) and a backend's error answer, read whole and answered in OpenAI's
// shape. Runs inside the relay (relay.cpp) on the hot path.
#include <cstring>
#include <string_view>

#include "openai_http.hpp"

#include "client_codec.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/text.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/openai/request.hpp"

namespace sluice::proxy {

void openai_http::on_body_data(void* ctx, const char* data, size_t len) {
  exchange& x = *static_cast<exchange*>(ctx);
  if (x.rsp.head.event_stream) {
    if (x.mem->sse) x.mem->sse->feed(data, len);
    return;
  }
  // A non-stream body is kept (up to 1 MiB) to read its usage at the end;
  // past that, its last 64 KiB, where vLLM writes the usage (after the
  // choices, which logprobs or a large `n` can grow past the bound).
  constexpr size_t k_body_keep_max = 1u << 20;
  constexpr size_t k_tail_keep = 64u << 10;
  byte_buf& b = x.mem->body;
  if (!x.rsp.body_overflow) {
    if (b.len + len <= k_body_keep_max && b.reserve(b.len + len)) {
      std::memcpy(b.data + b.len, data, len);
      b.len += static_cast<uint32_t>(len);
      return;
    }
    x.rsp.body_overflow = true;
  }
  if (!b.reserve(k_tail_keep)) {
    b.len = 0;  // out of memory: no usage to read
    return;
  }
  if (len >= k_tail_keep) {
    std::memcpy(b.data, data + len - k_tail_keep, k_tail_keep);
    b.len = static_cast<uint32_t>(k_tail_keep);
    return;
  }
  const size_t keep = b.len < k_tail_keep - len ? b.len : k_tail_keep - len;
  std::memmove(b.data, b.data + b.len - keep, keep);
  std::memcpy(b.data + keep, data, len);
  b.len = static_cast<uint32_t>(keep + len);
}

void openai_http::on_sse_chunk(void* ctx, const char* data, size_t len, const char* end) {
  // A whole chunk of an event stream: the scan and the boundary check in one
  // call (the walker's fast path; on_body_data + on_chunk_end otherwise).
  exchange& x = *static_cast<exchange*>(ctx);
  if (!x.mem->sse) return;
  if (!x.rsp.rendered || !x.up->adapter->rendered_plain_chunk(x, std::string_view(data, len))) {
    x.mem->sse->feed(data, len);
  }
  chunk_scanned(x, end);
}

void openai_http::on_chunk_end(void* ctx, const char* at) {
  exchange& x = *static_cast<exchange*>(ctx);
  if (x.mem->sse) chunk_scanned(x, at);
}

void openai_http::chunk_scanned(exchange& x, const char* end) noexcept {
  // A chunk of an event stream ended, its bytes scanned: cut here, no event
  // is split. And the next whole chunk may be counted without the scan
  // (body_sink::skip_ok) once the scan stands between two events and the
  // first event (the role chunk, read whole) is behind.
  relay_state& r = x.rsp;
  const bool between = x.mem->sse->between_events();
  if (between) {
    r.aligned_at = end;
    r.usage_covered = r.usage_in_batch;
    r.done_covered = r.facts.done;
  }
  r.skip_ok = r.skip_allowed && between && r.facts.events > 0;
}

void openai_http::on_skipped_chunks(void* ctx, uint32_t chunks, const char* end) {
  // `chunks` whole chunks, each one plain content event (one data line,
  // vLLM's content tail): the facts the scan and on_sse_event's fast path
  // would have counted for them.
  exchange& x = *static_cast<exchange*>(ctx);
  relay_state& r = x.rsp;
  r.facts.events += chunks;
  r.facts.content_events += chunks;
  if (x.first_token_ms == 0) x.first_token_ms = x.up->adapter->_s.now_ms();
  r.aligned_at = end;
  r.usage_covered = r.usage_in_batch;
  x.up->adapter->_metrics.at(metrics::stat::sse_chunks_skipped).add(chunks);
}

namespace {

// The facts of a usage event known by its prefix alone (see on_sse_event).
openai::stream_event_info usage_only_from_prefix(std::string_view data) noexcept {
  openai::stream_event_info info;
  const std::string_view u = usage_object_in_prefix(data);
  constexpr std::string_view k_open = "{\"choices\":[],\"usage\":";
  char small[1024];
  if (!u.empty() && u.size() + k_open.size() + 1 <= sizeof small) {
    std::memcpy(small, k_open.data(), k_open.size());
    std::memcpy(small + k_open.size(), u.data(), u.size());
    small[k_open.size() + u.size()] = '}';
    info = openai::scan_stream_event(std::string_view(small, k_open.size() + u.size() + 1));
  }
  info.malformed = false;
  info.usage_only = true;
  return info;
}

}  // namespace

void openai_http::on_sse_event(void* ctx, const http::sse_event& ev) {
  exchange& x = *static_cast<exchange*>(ctx);
  if (x.rsp.reader != nullptr && !x.req.native) {  // another dialect's events, translated by its reader
    x.rsp.reader->on_reply_event(x, ev);
    return;
  }
  if (x.rsp.rendered) {  // a Responses or Messages client
    x.up->adapter->on_chat_event(x, ev);
    return;
  }
  if (x.req.native) {  // a Responses or Messages stream passed through: its usage read in place
    stream_facts& s = x.rsp.facts;
    dialect::native_usage& u = x.rsp.native_usage;
    ++s.events;
    std::string_view id;
    if (!ev.truncated) dialect::scan_native_event(x.req.speaks, ev.data, u, x.req.keep_route ? &id : nullptr);
    if (!id.empty()) x.up->adapter->_x.keep_route(x, x.up->backend, id);  // before this event goes out
    if (u.content && x.first_token_ms == 0) x.first_token_ms = x.up->adapter->_s.now_ms();
    s.prompt_tokens = u.prompt_tokens;
    s.completion_tokens = u.completion_tokens;
    if (u.content) ++s.content_events;  // (skipped chunks are counted by on_skipped_chunks)
    s.error = u.error;
    return;
  }
  stream_facts& s = x.rsp.facts;
  // Nearly every event of a stream is one content delta that vLLM ends with
  // `"finish_reason":null}]}`: no usage, no error, no finish. Those are
  // counted without a parse, by a compare of their tail (a parse per event
  // costs far more: bench/RESULTS.md, "Figures behind choices in the
  // code"). The role chunk that opens the stream ends the same way but
  // carries no content: it is known by its whole one-choice tail and
  // counted as an event only. Any other shape -- a finish, usage or error
  // chunk, other backends' layouts, a first event that is not vLLM's role
  // chunk -- gets the full scan. vLLM writes compact JSON, so the tails
  // are exact.
  std::string_view p = ev.data;
  while (!p.empty() && (p.back() == ' ' || p.back() == '\n' || p.back() == '\r')) p.remove_suffix(1);
  if (s.events == 0 && !ev.truncated && p.size() > k_role_tail.size() &&
      p.substr(p.size() - k_role_tail.size()) == k_role_tail) {
    ++s.events;
    return;
  }
  if (s.events > 0 && !ev.truncated && p.size() > k_plain_tail.size() &&
      p.substr(p.size() - k_plain_tail.size()) == k_plain_tail) {
    ++s.events;
    ++s.content_events;
    if (x.first_token_ms == 0) x.first_token_ms = x.up->adapter->_s.now_ms();
    return;
  }
  openai::stream_event_info info = openai::scan_stream_event(ev.data);
  if (ev.truncated && info.malformed && classify_event_prefix(ev.data) == prefix_verdict::usage_only) {
    // A usage event longer than the scan keeps (a large extra member): its
    // start says what it is, and its counts are read when they lie whole
    // in what was kept.
    info = usage_only_from_prefix(ev.data);
  }
  ++s.events;
  if (info.done) s.done = true;
  if (info.error) s.error = true;
  if (info.has_content) {
    ++s.content_events;
    if (x.first_token_ms == 0) x.first_token_ms = x.up->adapter->_s.now_ms();
  }
  if (info.usage_only) {
    x.rsp.usage_in_batch = true;
    // In place, the event lies in the batch being relayed: relay() cuts
    // its chunk starting from here instead of searching the batch.
    x.rsp.usage_event_at = ev.in_place ? ev.data.data() : nullptr;
  }
  if (info.has_usage) {
    s.prompt_tokens = info.prompt_tokens;
    s.completion_tokens = info.completion_tokens;
  }
  if (!info.finish_reason.empty()) {
    const size_t n = info.finish_reason.size() < sizeof s.finish_reason ? info.finish_reason.size()
                                                                       : sizeof s.finish_reason;
    std::memcpy(s.finish_reason, info.finish_reason.data(), n);
    s.finish_reason_len = static_cast<uint8_t>(n);
  }
}

void openai_http::answer_backend_error(exchange& x) noexcept {
  // The backend's own retry advice (a 429's or 503's retry-after) goes on
  // to the client: the SDKs wait for it. Copied now, while the head's views
  // into the receive buffer are valid.
  char extra[160];
  size_t el = 0;
  http::header hd;
  for (http::header_fields it = x.rsp.head.fields(); it.next(hd);) {
    if (!iequals(hd.name, "retry-after") && !iequals(hd.name, "retry-after-ms")) continue;
    if (hd.value.size() > 64 || el + hd.name.size() + hd.value.size() + 4 > sizeof extra) continue;
    for (std::string_view part : {hd.name, std::string_view(": "), hd.value, std::string_view("\r\n")}) {
      std::memcpy(extra + el, part.data(), part.size());
      el += part.size();
    }
  }
  x.rsp.hold_error = false;
  end_attempt(x);
  char body[1024];
  uint16_t status = x.status;
  const std::string_view held(x.mem->body.data, x.mem->body.len);
  const size_t bl =
      x.rsp.reader != nullptr
          ? x.rsp.reader->error_to_openai(x.status, held, x.rsp.body_overflow, body, sizeof body, status)
          : openai::normalize_backend_error(x.status, held, x.rsp.body_overflow, body, sizeof body, status);
  x.codec->answer(x, status, std::string_view(body, bl), false, std::string_view(extra, el), "upstream_error");
}

}  // namespace sluice::proxy
