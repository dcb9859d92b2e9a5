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

#include "openai_http.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/dialect/native.hpp"
#include "sluice/http/chunked.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::proxy {

void openai_http::on_response_head(exchange& x) noexcept {
  const http::response_head& rh = x.rsp.head;
  const config::group_config& g = _cfg->groups[x.group];
  // It answered: reachable and speaking HTTP, whatever the status. A 5xx
  // says something about the request or the load, not the connection (the
  // control thread judges a rate of them from the metrics).
  if (x.up != nullptr) _x.report_outcome(x.up->backend, false);
  // A backend that says 502/503 before anything reached the client: the
  // next backend on the key's ring gets the request (max_retries).
  const uint64_t tried = x.route_position < 64 ? x.tried_mask | uint64_t{1} << x.route_position : x.tried_mask;
  // Only when another backend can take it: with none, the client gets this
  // backend's own answer (status kept, in OpenAI's shape), not sluice's
  // "no backend".
  // Another dialect's own "overloaded" too (Anthropic's 529).
  const bool unavailable = rh.status == 502 || rh.status == 503 ||
                           (x.rsp.reader != nullptr && x.rsp.reader->overloaded(rh.status));
  if (unavailable && x.attempts < g.upstream.max_retries && x.up != nullptr &&
      _routes->pick(x.group, x.route_key, tried).backend != route::k_none) {
    drop_attempt(x);  // its body is not read: the connection cannot be reused
    ++x.attempts;
    if (x.route_position < 64) x.tried_mask |= uint64_t{1} << x.route_position;
    x.mem->body.len = 0;
    x.rsp.body_overflow = false;
    _metrics.at(metrics::stat::upstream_retries).add();
    start(x);
    return;
  }
  // The skip (chunk_scanned) starts off for every response: never the
  // first chunk, which the scan reads whole (the role chunk).
  x.rsp.skip_allowed = x.rsp.skip_ok = false;
  if (x.rsp.reader != nullptr && !x.req.native) {  // another dialect's reply, translated by its reader
    x.rsp.reader->on_reply_head(x);
    return;
  }
  if (renders(x)) {  // a Responses or Messages client
    on_rendered_head(x);
    return;
  }
  x.rsp.head_seen = true;
  x.rsp.reusable = rh.keep_alive;
  x.rsp.facts = stream_facts{};
  if (rh.event_stream) {
    // One scanner per connection, made on its first stream and kept.
    if (!x.mem->sse) {
      x.mem->sse.reset(new (std::nothrow) http::sse_scanner(&openai_http::on_sse_event, &x));
      if (x.mem->sse) account_connection_memory(k_sse_scanner_bytes);
    }
    if (x.mem->sse) x.mem->sse->reset();
    // A native Responses stream's usage is in its last event, which holds
    // the whole response (all its text): read whole, however large.
    if (x.mem->sse && x.req.native) x.mem->sse->set_event_limit(dialect::stream_renderer::k_large_event_bytes_max);
  }
  x.rsp.skip_allowed = rh.event_stream && rh.chunked && x.mem->sse &&
                       g.upstream.sse_scan == config::sse_scan_mode::boundaries;
  x.rsp.native_usage = dialect::native_usage{};
  x.codec->stream_wait(x, g.upstream.stream_idle_timeout_ms);

  // A backend's error answer is held and answered in OpenAI's shape
  // (docs/architecture.md §8: vLLM's flat body, integer codes): nothing of it goes out
  // until its body is read. vLLM's are a few hundred bytes; a larger one
  // (or one of unknown length) is held up to the body buffer's bound.
  constexpr uint64_t k_error_hold_max = 64u << 10;
  x.rsp.hold_error = rh.status >= 400 && !rh.event_stream &&
                  ((rh.has_content_length && rh.content_length <= k_error_hold_max) || rh.chunked);
  if (x.rsp.hold_error) {
    x.status = rh.status;
    x.rsp.cut_usage = false;
    x.rsp.fwd_from = rh.head_bytes;
    relay(x, rh.head_bytes, true);
    return;
  }

  // An HTTP/1.0 client has no chunked coding: it gets the payload,
  // delimited by the close.
  x.rsp.dechunk = rh.chunked && !x.codec->takes_chunked(x);
  if (!x.codec->stage_response_head(x, rh, x.rsp.dechunk)) {
    upstream_failed(x, errc::internal);
    return;
  }
  x.status = rh.status;

  // The cut of the injected usage chunk needs whole chunks (see relay());
  // any other answer (an error, a non-stream body) is passed on as it is.
  if (x.rsp.cut_usage && !(rh.event_stream && rh.chunked && rh.status == 200)) x.rsp.cut_usage = false;
  x.response_started = true;
  x.rsp.fwd_from = rh.head_bytes;
  relay(x, rh.head_bytes, true);
}

void openai_http::relay(exchange& x, uint32_t parse_from, bool with_head) noexcept {
  upstream_conn* u = x.up;
  relay_state& r = x.rsp;
  const bool sse_chunked = r.head.event_stream && r.head.chunked;
  // The plain content event of vLLM's stream (on_sse_event's fast path),
  // one per chunk: what the skip counts without the scan's calls.
  static constexpr std::string_view k_plain_head = "data: {";
  http::body_sink sink{&openai_http::on_body_data, &x, sse_chunked ? &openai_http::on_chunk_end : nullptr,
                       sse_chunked ? &openai_http::on_sse_chunk : nullptr};
  if (r.skip_allowed) {  // an event stream, chunked (on_response_head)
    sink.skip_ok = &r.skip_ok;
    sink.skip_head = k_plain_head;
    sink.skip_tail = k_plain_chunk_tail;
    // Its vector pattern, made once (not per read).
    static const http::detail::skip_pattern k_plain_pattern = [] {
      http::detail::skip_pattern pat;
      [[maybe_unused]] const bool ok = http::detail::make_skip_pattern(k_plain_head, k_plain_chunk_tail, pat);
      SLUICE_ASSERT(ok);
      return pat;
    }();
    sink.skip_pattern = &k_plain_pattern;
    if (x.req.native) {
      // A natively spoken stream: its one-line text deltas, by their event
      // name (the usage is in other events, which are scanned). Heads longer
      // than a pattern holds: tested byte by byte.
      static constexpr std::string_view k_messages_head = "event: content_block_delta\ndata: {";
      static constexpr std::string_view k_responses_head = "event: response.output_text.delta\ndata: {";
      sink.skip_head = x.req.speaks == dialect::client_dialect::messages ? k_messages_head : k_responses_head;
      sink.skip_tail = "}\n\n";
      sink.skip_pattern = nullptr;
    }
    sink.on_skipped = &openai_http::on_skipped_chunks;
  }
  http::body_status bs{};
  if (with_head) r.usage_in_batch = r.usage_covered = false;
  r.usage_event_at = nullptr;
  r.aligned_at = nullptr;
  // With the head, even no body bytes: an answer without a body (204, 304,
  // Content-Length: 0 -- chunked or not) is complete right there.
  if (parse_from < u->buf.len || with_head) {
    bs = r.parser.feed_body(u->buf.data + parse_from, u->buf.len - parse_from, sink);
  }
  if (bs.error != errc::ok) {
    upstream_failed(x, errc::upstream_protocol);
    return;
  }
  if (!with_head && !r.client_done) {
    x.codec->stream_wait(x, _cfg->groups[x.group].upstream.stream_idle_timeout_ms);
  }
  r.complete = bs.complete;
  if (bs.complete && x.req.keep_route) keep_body_route(x);  // before the reply's last bytes go out
  const uint32_t parsed_end = parse_from + static_cast<uint32_t>(bs.consumed);
  if (bs.complete && parsed_end != u->buf.len) r.reusable = false;  // bytes past the end
  if (r.translated && !r.hold_reply && !r.client_done) {
    send_translated(x, with_head, parsed_end, bs.complete);
    return;
  }
  if (r.reframe && !r.hold_error && !r.client_done) {
    send_reframed(x, with_head, parsed_end, bs.complete);
    return;
  }
  if (r.hold_error || r.hold_reply || r.client_done) {
    // A held error's body went to resp_body (on_body_data), and so does a
    // reply read whole to be translated; after [DONE] the client's response
    // has ended and the backend's rest is dropped. Nothing is sent.
    r.send_end = parsed_end;
    if (r.hold_error && bs.complete) {
      answer_backend_error(x);
    } else if (r.hold_reply && bs.complete) {
      if (r.rendered) {
        answer_chat_reply(x);
      } else {
        SLUICE_ASSERT(x.rsp.reader != nullptr);  // only a translated reply is held whole
        x.rsp.reader->on_whole_reply(x);
      }
    } else {
      after_body_sent(x);
    }
    return;
  }
  uint32_t send_end = parsed_end;
  bool end_client = false;  // sluice ends the client's response here (after [DONE])
  bool aligned = bs.complete;  // send_end lies at a chunk end (or the body's end)
  if (!bs.complete && (r.cut_usage || (sse_chunked && r.facts.done))) {
    // While the usage event may still have to be cut, and once [DONE] was
    // seen: only up to the last chunk end that falls between two events, so
    // no event is ever split between what went out and what is held. The
    // rest waits at the front of the buffer.
    send_end = r.aligned_at != nullptr ? static_cast<uint32_t>(r.aligned_at - u->buf.data) : r.fwd_from;
    // [DONE] seen is not enough: its chunk's end may not have come yet,
    // and aligned_at then lies before it (a receive that ends between the
    // event's blank line and the chunk's CRLF).
    end_client = r.done_covered && r.aligned_at != nullptr;
    aligned = true;
    if (send_end == r.fwd_from && u->buf.len >= u->buf.cap && !grow_upstream_buffer(u)) {
      // Held bytes fill the largest buffer without an event boundary (an
      // event over 1 MiB). While the usage event may still be cut, or for
      // a codec that takes the framing off, fwd_from is a chunk start and
      // an event's: the rest of the body is de-chunked as it comes and
      // re-framed, the usage event dropped as it streams, whatever its size.
      if ((r.cut_usage || r.dechunk) && start_reframe(x, r.cut_usage)) {
        send_reframed(x, with_head, parsed_end, bs.complete);
        return;
      }
      // Else (no memory for the filter; or a chunked client after [DONE])
      // they pass on uncut (counted: it must stay 0). A client that takes
      // the chunks as they came may get them cut anywhere; a codec that
      // takes the framing off gets whole chunks only, never a batch that
      // begins inside a chunk's data.
      if (r.cut_usage) _metrics.at(metrics::stat::usage_cut_failed).add();
      r.cut_usage = false;
      send_end = parsed_end;
      if (r.dechunk) {
        send_end = r.fwd_from + static_cast<uint32_t>(
                                    http::scan_whole_chunks(u->buf.data + r.fwd_from, parsed_end - r.fwd_from).end);
        if (send_end == r.fwd_from) {
          upstream_failed(x, errc::upstream_protocol);  // one chunk over the largest buffer
          return;
        }
      }
    }
  }
  if (r.dechunk) {
    // Whole chunks only (an SSE stream: to an event boundary, as above).
    if (!aligned) {
      send_end = bs.chunk_end != 0 ? parse_from + static_cast<uint32_t>(bs.chunk_end) : r.fwd_from;
      if (sse_chunked) send_end = r.aligned_at != nullptr ? static_cast<uint32_t>(r.aligned_at - u->buf.data) : r.fwd_from;
      if (send_end == r.fwd_from && u->buf.len >= u->buf.cap && !grow_upstream_buffer(u)) {
        // A chunk (or an event) over 1 MiB to a client without chunked
        // framing: its payload goes as it comes.
        if (!start_reframe(x, false)) {
          upstream_failed(x, errc::internal);
          return;
        }
        send_reframed(x, with_head, parsed_end, bs.complete);
        return;
      }
    }
    r.send_end = send_end;
    send_dechunked(x, with_head, end_client);
    return;
  }
  r.send_end = send_end;
  if (r.cut_usage && r.usage_in_batch && (r.usage_covered || send_end == parsed_end) && send_end > r.fwd_from) {
    send_cut(x, with_head, end_client);
    return;
  }
  iovec pieces[2];
  uint8_t n = 0;
  if (send_end > r.fwd_from) pieces[n++] = {u->buf.data + r.fwd_from, send_end - r.fwd_from};
  const bool reads_up = n != 0;  // a piece of the send lies in u->buf
  if (end_client) pieces[n++] = terminal_chunk_iov(x);
  send_batch(x, with_head, pieces, n, reads_up ? u : nullptr);
}

void openai_http::send_batch(exchange& x, bool with_head, const iovec* pieces, uint8_t n, upstream_conn* pin,
                             uint8_t chunked) noexcept {
  if (n == 0 && !with_head) {
    after_body_sent(x);
    return;
  }
  // The send reads u's buffer: u and its buffer stay until it completes,
  // whatever happens to the exchange meanwhile (give_back).
  if (pin != nullptr) {
    SLUICE_VERIFY(!pin->buf_pinned);
    pin->buf_pinned = true;
    ++pin->ops;
  }
  x.rsp.sending = true;
  if (x.adm.running) _x.fair_progress(x);  // admission = "fair": the key's counter moves as it streams
  x.codec->send_response(x, with_head, pieces, n, pin, chunked);
}

void openai_http::give_back(buffer_lender* l) noexcept {
  auto* u = static_cast<upstream_conn*>(l);
  SLUICE_VERIFY(u->buf_pinned);
  u->buf_pinned = false;
  --u->ops;
  if (u->closing) u->adapter->maybe_free(u);
}

iovec openai_http::terminal_chunk_iov(exchange& x) noexcept {
  // The backend sent [DONE] but keeps its response open: the client's
  // response ends now (the OpenAI SDKs finish a stream only when its body
  // ends); the backend's rest is read and dropped until it ends, for a
  // short while (then its connection is closed, not pooled).
  static constexpr std::string_view k_terminal = "0\r\n\r\n";
  relay_state& r = x.rsp;
  r.client_done = true;
  const uint64_t idle_ms = _cfg->groups[x.group].upstream.stream_idle_timeout_ms;
  x.codec->stream_wait(x, idle_ms < k_after_done_wait_ms ? idle_ms : k_after_done_wait_ms);
  return {const_cast<char*>(k_terminal.data()), k_terminal.size()};
}

void openai_http::end_after_done(exchange& x) noexcept {
  // [DONE] came and the backend keeps its response open: without a framing
  // of its own to end it (HTTP/2's END_STREAM, HTTP/1.0's close go with the
  // exchange's end), the client waits for the backend's rest -- the short
  // while a backend takes to end its response after [DONE], then the
  // exchange ends without it (the connection is closed, not pooled).
  x.rsp.client_done = true;
  const uint64_t idle_ms = _cfg->groups[x.group].upstream.stream_idle_timeout_ms;
  x.codec->stream_wait(x, idle_ms < k_unframed_done_wait_ms ? idle_ms : k_unframed_done_wait_ms);
}

void openai_http::send_cut(exchange& x, bool with_head, bool end_client) noexcept {
  upstream_conn* u = x.up;
  relay_state& r = x.rsp;
  const char* const batch = u->buf.data + r.fwd_from;
  const size_t batch_len = r.send_end - r.fwd_from;
  size_t usage_from = 0;
  if (r.usage_event_at != nullptr && r.usage_event_at >= batch && r.usage_event_at < batch + batch_len) {
    usage_from = static_cast<size_t>(r.usage_event_at - batch);
  }
  r.usage_event_at = nullptr;
  r.cut_usage = false;  // one per stream
  r.usage_in_batch = false;
  r.usage_covered = false;
  iovec pieces[3];
  uint8_t n = 0;
  size_t cut_begin = 0, cut_end = 0;
  if (find_usage_chunk(batch, batch_len, usage_from, cut_begin, cut_end)) {
    // vLLM's shape: the usage event is a chunk of its own; the chunks
    // around it go out as they came.
    _metrics.at(metrics::stat::usage_chunks_cut).add();
    if (cut_begin > 0) pieces[n++] = {const_cast<char*>(batch), cut_begin};
    if (cut_end < batch_len) pieces[n++] = {const_cast<char*>(batch) + cut_end, batch_len - cut_end};
    const bool reads_up = n != 0;
    if (end_client) pieces[n++] = terminal_chunk_iov(x);
    send_batch(x, with_head, pieces, n, reads_up ? u : nullptr);
    return;
  }
  // Any other shape (JSON spacing, CRLF events, chunk extensions, several
  // events in a chunk, an event over several chunks): the batch's payload
  // is re-framed as one chunk without the usage event. Rare, so it may
  // copy: de-chunked into mem->body (unused by streams), filtered into
  // mem->frame.
  constexpr size_t k_size_room = 20;  // "<hex>\r\n", written right-aligned before the payload
  if (!x.mem->body.reserve(batch_len) || !x.mem->frame.reserve(k_size_room + batch_len + 2 + 5)) {
    upstream_failed(x, errc::internal);
    return;
  }
  bool last = false;
  const size_t plen = dechunk(batch, batch_len, x.mem->body.data, last);
  char* const payload = x.mem->frame.data + k_size_room;
  uint32_t cut = 0;
  const size_t flen = drop_usage_events(x.mem->body.data, plen, payload, cut);
  x.mem->body.len = 0;
  _metrics.at(cut != 0 ? metrics::stat::usage_chunks_cut : metrics::stat::usage_cut_failed).add();
  char size_line[k_size_room];
  text_writer w(size_line, sizeof size_line);
  w.put_hex_min(flen);
  w.put("\r\n");
  const size_t sl = static_cast<size_t>(w.p - size_line);
  char* const chunk = payload - sl;
  std::memcpy(chunk, size_line, sl);
  size_t chunk_len = sl + flen;
  std::memcpy(payload + flen, "\r\n", 2);
  chunk_len += 2;
  if (flen == 0) chunk_len = 0;  // nothing left of the batch but the usage event
  if (last) {
    std::memcpy(chunk + chunk_len, "0\r\n\r\n", 5);
    chunk_len += 5;
  }
  if (chunk_len != 0) pieces[n++] = {chunk, chunk_len};
  if (end_client && !last) pieces[n++] = terminal_chunk_iov(x);
  send_batch(x, with_head, pieces, n, nullptr);
}

void openai_http::send_dechunked(exchange& x, bool with_head, bool end_client) noexcept {
  // An HTTP/1.0 client: the payload of the whole chunks [fwd_from, send_end)
  // copied into mem->frame (and without the usage event sluice asked for,
  // once it is in), the end of the answer told by the close.
  upstream_conn* u = x.up;
  relay_state& r = x.rsp;
  const char* const batch = u->buf.data + r.fwd_from;
  const size_t batch_len = r.send_end - r.fwd_from;
  if (x.codec->dechunks(x) && batch_len != 0) {
    // HTTP/2: the whole chunks go to the codec as they lie in u's buffer
    // (pinned until the session copied their data into DATA frames); only
    // a usage event of another shape than its own chunk makes a copy.
    iovec pieces[2];
    uint8_t n = 0;
    bool whole = true;
    if (r.cut_usage && r.usage_in_batch && (r.usage_covered || r.complete)) {
      size_t usage_from = 0;
      if (r.usage_event_at != nullptr && r.usage_event_at >= batch && r.usage_event_at < batch + batch_len) {
        usage_from = static_cast<size_t>(r.usage_event_at - batch);
      }
      size_t cut_begin = 0, cut_end = 0;
      whole = find_usage_chunk(batch, batch_len, usage_from, cut_begin, cut_end);
      if (whole) {
        _metrics.at(metrics::stat::usage_chunks_cut).add();
        if (cut_begin > 0) pieces[n++] = {const_cast<char*>(batch), cut_begin};
        if (cut_end < batch_len) pieces[n++] = {const_cast<char*>(batch) + cut_end, batch_len - cut_end};
        r.usage_event_at = nullptr;
        r.cut_usage = r.usage_in_batch = r.usage_covered = false;
      }
    } else {
      pieces[n++] = {const_cast<char*>(batch), batch_len};
    }
    if (whole) {
      if (end_client) end_after_done(x);
      send_batch(x, with_head, pieces, n, n != 0 ? u : nullptr, n == 2 ? 3 : 1);
      return;
    }
  }
  if (!x.mem->frame.reserve(batch_len + 1) || !x.mem->body.reserve(batch_len + 1)) {
    upstream_failed(x, errc::internal);
    return;
  }
  bool last = false;
  size_t n = 0;
  if (r.cut_usage && r.usage_in_batch && (r.usage_covered || r.complete)) {
    size_t usage_from = 0;
    if (r.usage_event_at != nullptr && r.usage_event_at >= batch && r.usage_event_at < batch + batch_len) {
      usage_from = static_cast<size_t>(r.usage_event_at - batch);
    }
    size_t cut_begin = 0, cut_end = 0;
    if (find_usage_chunk(batch, batch_len, usage_from, cut_begin, cut_end)) {
      // vLLM's shape: the usage event is a chunk of its own, which the scan
      // already found; the chunks around it are de-chunked as they are.
      bool last_before = false;
      n = dechunk(batch, cut_begin, x.mem->frame.data, last_before);
      n += dechunk(batch + cut_end, batch_len - cut_end, x.mem->frame.data + n, last);
      last = last || last_before;
      _metrics.at(metrics::stat::usage_chunks_cut).add();
    } else {
      // Any other shape: every event of the payload is read again (rare).
      const size_t plen = dechunk(batch, batch_len, x.mem->body.data, last);
      uint32_t cut = 0;
      n = drop_usage_events(x.mem->body.data, plen, x.mem->frame.data, cut);
      _metrics.at(cut != 0 ? metrics::stat::usage_chunks_cut : metrics::stat::usage_cut_failed).add();
    }
    r.usage_event_at = nullptr;
    r.cut_usage = r.usage_in_batch = r.usage_covered = false;
  } else {
    n = dechunk(batch, batch_len, x.mem->frame.data, last);
  }
  if (end_client) end_after_done(x);  // HTTP/1.0: no terminal chunk, the close ends it
  const iovec payload{x.mem->frame.data, n};
  send_batch(x, with_head, &payload, n != 0 ? 1 : 0, nullptr);
}

bool openai_http::start_reframe(exchange& x, bool drop_usage) noexcept {
  relay_state& r = x.rsp;
  // An event stream goes through the filter (the usage event left out when
  // asked; nothing after [DONE]); any other chunked body as it comes.
  const bool filter = r.head.event_stream;
  if (filter) {
    if (!x.mem->usage_filter) {
      x.mem->usage_filter.reset(new (std::nothrow) usage_event_filter());
      if (!x.mem->usage_filter) return false;
      x.mem->count(static_cast<int64_t>(sizeof(usage_event_filter)));
    }
    x.mem->usage_filter->reset(drop_usage);
  }
  r.reframe = true;
  r.reframe_filter = filter;
  r.cut_usage = false;  // the filter cuts it now
  r.cursor = dechunk_cursor{};
  return true;
}

void openai_http::send_reframed(exchange& x, bool with_head, uint32_t parsed_end, bool complete) noexcept {
  // [fwd_from, parsed_end): the walker's bytes, cut anywhere in a chunk;
  // their payload (less the usage event) goes out framed anew, as a
  // translated reply's does. Rare (an event over the largest buffer), so
  // it copies: de-chunked into mem->body, filtered into mem->frame.
  upstream_conn* u = x.up;
  relay_state& r = x.rsp;
  const size_t n = parsed_end - r.fwd_from;
  byte_buf& f = x.mem->frame;
  if (!f.reserve(k_batch_room + n + usage_event_filter::k_hold_bytes_max + 8) ||
      (r.reframe_filter && !x.mem->body.reserve(n + 1))) {
    upstream_failed(x, errc::internal);
    return;
  }
  char* const payload = f.data + k_batch_room;
  bool last = false;
  size_t w = 0;
  if (r.reframe_filter) {
    const size_t plen = r.cursor.feed(u->buf.data + r.fwd_from, n, x.mem->body.data, last);
    const uint32_t dropped = x.mem->usage_filter->dropped();
    w = x.mem->usage_filter->feed(x.mem->body.data, plen, payload);
    if (x.mem->usage_filter->dropped() != dropped) _metrics.at(metrics::stat::usage_chunks_cut).add();
    x.mem->body.len = 0;
  } else {
    w = r.cursor.feed(u->buf.data + r.fwd_from, n, payload, last);
  }
  f.len = static_cast<uint32_t>(k_batch_room + w);
  r.send_end = parsed_end;
  // The client's response ends with the backend's, or at [DONE] (the
  // backend's rest is then read and dropped a short while, as elsewhere).
  const bool end_client = complete || r.facts.done || (r.reframe_filter && x.mem->usage_filter->done());
  if (end_client) r.client_done = true;
  const iovec piece = frame_translated_batch(f, r.dechunk, end_client);
  if (end_client && !complete) {
    const uint64_t idle_ms = _cfg->groups[x.group].upstream.stream_idle_timeout_ms;
    x.codec->stream_wait(x, idle_ms < k_after_done_wait_ms ? idle_ms : k_after_done_wait_ms);
  }
  send_batch(x, with_head, &piece, piece.iov_len != 0 ? 1 : 0, nullptr);
}

bool openai_http::grow_upstream_buffer(upstream_conn* u) noexcept {
  // Held bytes (a stream's events not yet between two chunk ends) fill the
  // buffer: the connection takes a buffer of its own, twice the size, up to
  // a bound; a ring buffer goes back to the ring.
  constexpr uint32_t k_hold_bytes_max = 1u << 20;
  SLUICE_VERIFY(!u->buf_pinned);
  if (u->buf.cap >= k_hold_bytes_max) return false;
  if (!u->buf_lent) return u->buf.reserve(static_cast<size_t>(u->buf.cap) * 2);
  byte_buf own;
  if (!own.reserve(static_cast<size_t>(u->buf.cap) * 2)) return false;
  std::memcpy(own.data, u->buf.data, u->buf.len);
  own.len = u->buf.len;
  _up_bufs->recycle(u->buf_bid);
  u->buf_lent = false;
  std::swap(u->buf.data, own.data);
  std::swap(u->buf.len, own.len);
  std::swap(u->buf.cap, own.cap);
  own.data = nullptr;  // the ring's buffer: not freed here
  own.cap = own.len = 0;
  return true;
}

void openai_http::after_body_sent(exchange& x) noexcept {
  if (x.rsp.complete) {
    finish_exchange(x);
    return;
  }
  upstream_conn* u = x.up;
  // Keep what was parsed but not sent (a partial chunk) at the front;
  // with nothing left, the buffer goes back until more bytes come.
  const uint32_t left = u->buf.len - x.rsp.send_end;
  if (left != 0) {
    std::memmove(u->buf.data, u->buf.data + x.rsp.send_end, left);
    u->buf.len = left;
  } else {
    drop_upstream_buffer(u);
  }
  x.rsp.fwd_from = 0;
  x.rsp.send_end = 0;
  const http::response_head& rh = x.rsp.head;
  // Everything sent of an event stream: the next event comes with the next
  // token, well after this send, so wait for readiness first. A partial
  // chunk's rest, or a long plain body, is likely there already: try first.
  submit_recv(x.up, rh.event_stream && left == 0);
}

void openai_http::finish_exchange(exchange& x) noexcept {
  end_attempt(x);
  x.codec->response_done(x);
}

void openai_http::keep_body_route(exchange& x) noexcept {
  // The body is kept up to 1 MiB (on_body_data); a larger one's id is not
  // read, and its continuation is routed as any request.
  const relay_state& r = x.rsp;
  x.req.keep_route = false;
  if (r.head.event_stream || r.body_overflow || x.status < 200 || x.status > 299 || x.up == nullptr) return;
  const std::string_view body(x.mem->body.data, x.mem->body.len);
  uint32_t b = 0, e = 0;
  if (dialect::top_level_member(body, "id", b, e) != dialect::member_scan::found || e - b < 3 || body[b] != '"') return;
  const std::string_view id = body.substr(b + 1, e - b - 2);
  if (id.find('\\') != std::string_view::npos) return;  // ids are plain; an escaped one is not kept
  _x.keep_route(x, x.up->backend, id);
}

}  // namespace sluice::proxy
