// The relay of a backend's response to the client: the response head
// (retry on 502/503, error answers held, sluice's own fields), the body
// copied from the backend's receive buffer with the usage chunk sluice
// asked for cut out, and the end of the exchange.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "shard_server.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::proxy {

void shard_server::on_response_head(downstream_conn* d) noexcept {
  const http::response_head& rh = d->x.rsp.head;
  const config::group_config& g = _cfg->groups[d->x.group];
  if (d->x.up != nullptr) report_outcome(d->x.up->backend, rh.status >= 500);
  // A backend that says 502/503 before anything reached the client: the
  // next backend on the key's ring gets the request (max_retries).
  if ((rh.status == 502 || rh.status == 503) && d->x.attempts < g.upstream.max_retries && d->x.up != nullptr) {
    upstream_conn* u = d->x.up;
    d->x.up = nullptr;
    u->owner = nullptr;
    _routes->on_request_end(u->backend);
    close_upstream(u);  // its body is not read: the connection cannot be reused
    ++d->x.attempts;
    if (d->x.route_position < 64) d->x.tried_mask |= uint64_t{1} << d->x.route_position;
    d->resp_body.len = 0;
    d->x.rsp.body_overflow = false;
    _metrics.at(metrics::stat::upstream_retries).add();
    start_attempt(d);
    return;
  }
  d->state = conn_state::streaming;
  d->x.rsp.head_seen = true;
  d->x.rsp.reusable = rh.keep_alive;
  d->x.rsp.facts = stream_facts{};
  if (rh.event_stream) {
    // One scanner per connection, made on its first stream and kept.
    if (!d->sse) {
      d->sse.reset(new (std::nothrow) http::sse_scanner(&shard_server::on_sse_event, d));
      if (d->sse) account_connection_memory(k_sse_scanner_bytes);
    }
    if (d->sse) d->sse->reset();
  }
  set_deadline(d, deadline_kind::upstream_idle, g.upstream.stream_idle_timeout_ms);

  // A backend's error answer is held and answered in OpenAI's shape
  // (DESIGN.md §8: vLLM's flat body, integer codes): nothing of it goes out
  // until its body is read. vLLM's are a few hundred bytes; a larger one
  // (or one of unknown length) is held up to the body buffer's bound.
  constexpr uint64_t k_error_hold_max = 64u << 10;
  d->x.rsp.hold_error = rh.status >= 400 && !rh.event_stream &&
                  ((rh.has_content_length && rh.content_length <= k_error_hold_max) || rh.chunked);
  if (d->x.rsp.hold_error) {
    d->x.status = rh.status;
    d->x.rsp.cut_usage = false;
    d->x.rsp.fwd_from = rh.head_bytes;
    relay(d, rh.head_bytes, true);
    return;
  }

  if (!write_response_head(d)) {
    upstream_failed(d, errc::internal);
    return;
  }
  d->x.status = rh.status;

  // The cut of the injected usage chunk needs whole chunks (see relay());
  // any other answer (an error, a non-stream body) is passed on as it is.
  if (d->x.rsp.cut_usage && !(rh.event_stream && rh.chunked && rh.status == 200)) d->x.rsp.cut_usage = false;
  d->x.response_started = true;
  d->x.rsp.fwd_from = rh.head_bytes;
  relay(d, rh.head_bytes, true);
}

bool shard_server::write_response_head(downstream_conn* d) noexcept {
  const http::response_head& rh = d->x.rsp.head;
  // The client's head: the backend's status and end-to-end fields, plus
  // x-request-id; framing (Content-Length / chunked) passes through as is,
  // and so do the body bytes.
  const bool close = !d->x.head.keep_alive || _draining;
  d->close_after_send = close;
  size_t need = rh.head_bytes + 256;
  if (!d->out.reserve(need)) {
    return false;
  }
  byte_buf& o = d->out;
  o.len = 0;
  char line[160];
  text_writer w(line, sizeof line);
  w.put("HTTP/1.1 ");
  w.put_int(rh.status);
  w.put(' ');
  append(o, std::string_view(line, static_cast<size_t>(w.p - line)));
  append(o, rh.reason.size() < 64 ? rh.reason : std::string_view("Unknown"));
  append(o, "\r\n");
  http::header hd;
  for (http::header_fields it = rh.fields(); it.next(hd);) {
    if (drop_response_header(hd.name)) continue;
    append(o, hd.name);
    append(o, ": ");
    append(o, hd.value);
    append(o, "\r\n");
  }
  // sluice's own fields: the request id, the key's rate-limit state and
  // the time sluice and the backend took to the head (as OpenAI sends).
  char rate[512];
  const size_t rl = write_rate_headers(d, rate, sizeof rate);
  if (!o.reserve(static_cast<size_t>(o.len) + rl + 256)) {
    return false;
  }
  w = text_writer(line, sizeof line);
  w.put("x-request-id: ");
  w.put(std::string_view(d->x.request_id, d->x.request_id_len));
  w.put("\r\nopenai-processing-ms: ");
  w.put_int(now_ms() - d->x.request_start_ms);
  w.put("\r\n");
  append(o, std::string_view(line, static_cast<size_t>(w.p - line)));
  append(o, std::string_view(rate, rl));
  append(o, close ? "connection: close\r\n\r\n" : "\r\n");
  return true;
}

void shard_server::relay(downstream_conn* d, uint32_t parse_from, bool with_head) noexcept {
  upstream_conn* u = d->x.up;
  http::body_sink sink{&shard_server::on_body_data, d};
  http::body_status bs{};
  // Set again by the scan when the usage event is in this batch; a batch
  // that held back the chunk of one seen before keeps it (below).
  if (with_head) d->x.rsp.usage_in_batch = false;
  d->x.rsp.usage_event_at = nullptr;
  // With the head, even no body bytes: an answer without a body (204, 304,
  // Content-Length: 0 -- chunked or not) is complete right there.
  if (parse_from < u->buf.len || with_head) {
    bs = d->x.rsp.parser.feed_body(u->buf.data + parse_from, u->buf.len - parse_from, sink);
  }
  if (bs.error != errc::ok) {
    upstream_failed(d, errc::upstream_protocol);
    return;
  }
  if (!with_head) {
    set_deadline(d, deadline_kind::upstream_idle, _cfg->groups[d->x.group].upstream.stream_idle_timeout_ms);
  }
  d->x.rsp.complete = bs.complete;
  const uint32_t parsed_end = parse_from + static_cast<uint32_t>(bs.consumed);
  if (bs.complete && parsed_end != u->buf.len) d->x.rsp.reusable = false;  // bytes past the end
  if (d->x.rsp.hold_error) {
    // The body went to resp_body (on_body_data); nothing is sent yet.
    if (bs.complete) {
      answer_backend_error(d);
    } else {
      d->x.rsp.send_end = parsed_end;
      after_body_sent(d);
    }
    return;
  }
  // What may go out now: everything parsed, or -- while the usage chunk may
  // still have to be cut -- only up to the last whole chunk; a partial chunk
  // waits at the front of the buffer for the rest of its bytes.
  uint32_t send_end = parsed_end;
  if (d->x.rsp.cut_usage && !bs.complete) {
    send_end = bs.chunk_end != 0 ? parse_from + static_cast<uint32_t>(bs.chunk_end) : d->x.rsp.fwd_from;
    if (send_end == d->x.rsp.fwd_from && u->buf.len >= u->buf.cap) {
      d->x.rsp.cut_usage = false;  // one chunk larger than the buffer: forward, no cut
      send_end = parsed_end;
    }
  }
  d->x.rsp.send_end = send_end;
  uint8_t n = 0;
  if (with_head) d->send_iov[n++] = {d->out.data, d->out.len};
  size_t cut_begin = 0, cut_end = 0;
  size_t usage_from = 0;
  bool reads_up = false;  // a piece of the send lies in u->buf
  const char* const batch = u->buf.data + d->x.rsp.fwd_from;
  if (d->x.rsp.usage_event_at != nullptr && d->x.rsp.usage_event_at >= batch && d->x.rsp.usage_event_at < u->buf.data + send_end) {
    usage_from = static_cast<size_t>(d->x.rsp.usage_event_at - batch);
  }
  d->x.rsp.usage_event_at = nullptr;
  if (d->x.rsp.cut_usage && d->x.rsp.usage_in_batch && send_end > d->x.rsp.fwd_from &&
      find_usage_chunk(batch, send_end - d->x.rsp.fwd_from, usage_from, cut_begin, cut_end)) {
    _metrics.at(metrics::stat::usage_chunks_cut).add();
    d->x.rsp.cut_usage = false;  // one per stream
    d->x.rsp.usage_in_batch = false;
    if (cut_begin > 0) d->send_iov[n++] = {u->buf.data + d->x.rsp.fwd_from, cut_begin};
    if (d->x.rsp.fwd_from + cut_end < send_end) {
      d->send_iov[n++] = {u->buf.data + d->x.rsp.fwd_from + cut_end, send_end - d->x.rsp.fwd_from - cut_end};
    }
    reads_up = n > (with_head ? 1 : 0);
  } else if (send_end > d->x.rsp.fwd_from) {
    // The usage event was seen but its chunk is not whole yet (the read
    // ended between the event's blank line and the chunk's CRLF): it waits
    // at the front of the buffer and is looked for in the next batch.
    // Searched whole and not found, it is a shape find_usage_chunk does not
    // know: left alone.
    if (send_end == parsed_end) d->x.rsp.usage_in_batch = false;
    const uint32_t body = send_end - d->x.rsp.fwd_from;
    if (with_head && body <= d->out.cap - d->out.len) {
      // A short body that came with the head (a non-stream answer): joined
      // to the head in `out`, so the client gets one plain send.
      std::memcpy(d->out.data + d->out.len, u->buf.data + d->x.rsp.fwd_from, body);
      d->out.len += body;
      d->send_iov[0].iov_len = d->out.len;
    } else {
      d->send_iov[n++] = {u->buf.data + d->x.rsp.fwd_from, body};
      reads_up = true;
    }
  }
  if (n == 0) {
    after_body_sent(d);
    return;
  }
  d->send_iov_count = n;
  // The send reads u's buffer: u and its buffer stay until it completes,
  // whatever happens to the exchange meanwhile.
  if (reads_up) pin_upstream_buffer(d, u);
  submit_send(d);
}

void shard_server::pin_upstream_buffer(downstream_conn* d, upstream_conn* u) noexcept {
  SLUICE_VERIFY(d->send_pin == nullptr && !u->buf_pinned);
  d->send_pin = u;
  u->buf_pinned = true;
  ++u->ops;
}

void shard_server::unpin_upstream_buffer(downstream_conn* d) noexcept {
  upstream_conn* u = d->send_pin;
  if (u == nullptr) return;
  d->send_pin = nullptr;
  u->buf_pinned = false;
  --u->ops;
  if (u->closing) maybe_free(u);
}

void shard_server::after_body_sent(downstream_conn* d) noexcept {
  if (d->x.rsp.complete) {
    finish_exchange(d);
    return;
  }
  upstream_conn* u = d->x.up;
  // Keep what was parsed but not sent (a partial chunk) at the front;
  // with nothing left, the buffer goes back until more bytes come.
  const uint32_t left = u->buf.len - d->x.rsp.send_end;
  if (left != 0) {
    std::memmove(u->buf.data, u->buf.data + d->x.rsp.send_end, left);
    u->buf.len = left;
  } else {
    drop_upstream_buffer(u);
  }
  d->x.rsp.fwd_from = 0;
  d->x.rsp.send_end = 0;
  const http::response_head& rh = d->x.rsp.head;
  // Everything sent of an event stream: the next event comes with the next
  // token, well after this send, so wait for readiness first. A partial
  // chunk's rest, or a long plain body, is likely there already: try first.
  submit_recv(d->x.up, rh.event_stream && left == 0);
}

void shard_server::finish_exchange(downstream_conn* d) noexcept {
  upstream_conn* u = d->x.up;
  d->x.up = nullptr;
  if (u != nullptr) {
    _routes->on_request_end(u->backend);
    release_upstream(u, d->x.rsp.reusable);
  }
  d->state = conn_state::local;  // so on_response_sent() counts it like any answer
  on_response_sent(d);
}

void shard_server::abort_exchange(downstream_conn* d) noexcept {
  _metrics.at(metrics::stat::downstream_aborts).add();
  d->x.cancelled = true;
  d->x.status = 499;  // nginx's "client closed request"
  d->x.error_code = "client_closed";
  close_downstream(d);  // closes the upstream connection too
}

}  // namespace sluice::proxy
