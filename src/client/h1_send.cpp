// The HTTP/1.1 client codec's output: the answers sluice writes itself, the
// response relayed from a backend (its head written here, its body in the
// backend's framing or de-chunked by the relay), and what follows each
// send's completion (the transport sends).
#include <cstring>

#include "h1_codec.hpp"

#include "dialect_relay.hpp"

#include "backend_adapter.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"

namespace sluice::proxy {

namespace {

std::string_view reason_phrase(uint16_t status) noexcept {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace

void h1_codec::answer(exchange& x, uint16_t status, std::string_view body, bool close,
                      std::string_view extra_headers, std::string_view error_code) noexcept {
  downstream_conn* d = x.conn;
  if (d->x.request_id_len == 0) _x.make_request_id(d->x);
  char reshaped[1024];  // an error in a Messages client's shape
  body = in_client_dialect(x, status, body, reshaped, sizeof reshaped);
  const size_t bl = body.size();
  close = close || !d->x.head.keep_alive || _draining || d->state == conn_state::idle;
  // The head's room: the rate-limit and budget fields (up to 1 KiB), the
  // caller's extra fields and the fixed ones.
  constexpr size_t k_head_room = 2048;
  if (!d->out.reserve(bl + k_head_room)) {
    _t.close_conn(d);
    return;
  }
  char rate[1024];
  const size_t rl = _x.write_response_headers(d->x, rate, sizeof rate);
  auto r = fmt::format_to_n(d->out.data, k_head_room,
                            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n"
                            "x-request-id: {}\r\n{}{}{}\r\n",
                            status, reason_phrase(status), bl, std::string_view(d->x.request_id, d->x.request_id_len),
                            std::string_view(rate, rl), extra_headers, close ? "connection: close\r\n" : "");
  // format_to_n reports the untruncated size: past the room the head was
  // cut, and the size is no offset to write the body at.
  if (r.size > k_head_room) {
    _t.close_conn(d);
    return;
  }
  if (bl != 0) std::memcpy(d->out.data + r.size, body.data(), bl);
  d->out.len = static_cast<uint32_t>(r.size + bl);
  d->x.status = status;
  d->close_after_send = close;
  if (!d->x.inflight_counted) {
    _metrics.at(metrics::stat::requests_total).add();
    _metrics.at(metrics::stat::requests_inflight).add();
    d->x.inflight_counted = true;
  }
  d->x.error_code = error_code;
  d->state = conn_state::local;
  set_deadline(d, deadline_kind::send, _cfg->server.idle_timeout_ms);
  if (d->send_busy) {
    // A 100 Continue is still going out and owns send_iov until its CQE:
    // the answer follows it (on_send_cqe).
    d->local_pending = true;
    return;
  }
  d->send_iov[0] = {d->out.data, d->out.len};
  d->send_iov_count = 1;
  _t.send_output(d);
}

void h1_codec::on_progress(downstream_conn* d, size_t) noexcept {
  // The client took bytes: a stream's idle time starts again (a slow
  // reader is not a stalled one).
  if (d->state == conn_state::streaming && d->deadline == deadline_kind::upstream_idle) {
    set_deadline(d, deadline_kind::upstream_idle, _cfg->groups[d->x.group].upstream.stream_idle_timeout_ms);
  }
}

void h1_codec::on_sent(downstream_conn* d, int res) noexcept {
  // The send is over: it no longer reads the upstream buffer it was lent
  // (a ping's: none, and what is held stays held unless closing).
  give_back_lent_buffer(d);
  const bool ping = d->ping_busy;
  d->ping_busy = false;
  if (d->state == conn_state::closing) return;
  if (res < 0) {
    // EPIPE/ECONNRESET: the client is gone.
    drop_held(d);
    d->peer_eof = true;
    on_peer_gone(d);
    return;
  }
  if (ping && d->state == conn_state::streaming) {
    resume_held(d);
    return;
  }
  if (ping) drop_held(d);  // (the exchange left the stream meanwhile: nothing held is owed)
  switch (d->state) {
    case conn_state::body:
      process_input(d);  // 100 Continue is out; read on
      return;
    case conn_state::local:
      if (d->local_pending) {
        d->local_pending = false;
        d->send_iov[0] = {d->out.data, d->out.len};
        d->send_iov_count = 1;
        _t.send_output(d);
        return;
      }
      on_response_sent(d);
      return;
    case conn_state::streaming:
      d->x.adapter->on_sent(d->x);
      return;
    default:
      return;
  }
}

void h1_codec::on_response_sent(downstream_conn* d) noexcept {
  _x.end_request(d->x);
  if (d->x.inflight_counted) {
    _metrics.at(metrics::stat::requests_inflight).sub();
    d->x.inflight_counted = false;
  }
  if (d->x.status < 300) {
    _metrics.at(metrics::stat::responses_2xx).add();
  } else if (d->x.status < 500) {
    _metrics.at(metrics::stat::responses_4xx).add();
  } else {
    _metrics.at(metrics::stat::responses_5xx).add();
  }
  if (d->close_after_send) {
    if (d->x.status >= 400 && !d->peer_eof) {
      // A client that sent its whole body with its head (every SDK does)
      // would turn a close with unread input into an RST, which destroys
      // the answer before the client reads it.
      _t.linger(d);
      return;
    }
    _t.close_conn(d);
    return;
  }
  next_request(d);
}

bool h1_codec::takes_chunked(const exchange& x) const noexcept {
  return !(x.head.version_major == 1 && x.head.version_minor == 0);
}

bool h1_codec::stage_response_head(exchange& x, const http::response_head& rh, bool dechunked) noexcept {
  downstream_conn* d = x.conn;
  // The client's head: the backend's status and end-to-end fields, plus
  // x-request-id; framing (Content-Length / chunked) passes through as is,
  // and so do the body bytes -- except de-chunked, when the close ends it.
  const bool close = !x.head.keep_alive || _draining || dechunked;
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
  std::string_view raw;
  line_runs kept;
  for (http::header_fields it = rh.fields(); it.next(hd, raw);) {
    if (drop_response_header(hd.name)) continue;
    if (dechunked && iequals(hd.name, "transfer-encoding")) continue;
    kept.keep(o, raw);
  }
  kept.flush(o);
  // sluice's own fields: the request id, the key's rate-limit state and
  // the time sluice and the backend took to the head (as OpenAI sends).
  char rate[1024];
  const size_t rl = _x.write_response_headers(x, rate, sizeof rate);
  if (!o.reserve(static_cast<size_t>(o.len) + rl + 256)) {
    return false;
  }
  w = text_writer(line, sizeof line);
  w.put("x-request-id: ");
  w.put(std::string_view(x.request_id, x.request_id_len));
  w.put("\r\nopenai-processing-ms: ");
  w.put_int(now_ms() - x.request_start_ms);
  w.put("\r\n");
  append(o, std::string_view(line, static_cast<size_t>(w.p - line)));
  append(o, std::string_view(rate, rl));
  append(o, close ? "connection: close\r\n\r\n" : "\r\n");
  return true;
}

void h1_codec::stream_wait(exchange& x, uint64_t idle_ms) noexcept {
  x.conn->state = conn_state::streaming;
  set_deadline(x.conn, deadline_kind::upstream_idle, idle_ms);
}

void h1_codec::send_response(exchange& x, bool with_head, const iovec* body, uint8_t n, buffer_lender* lender,
                             uint8_t chunked) noexcept {
  downstream_conn* d = x.conn;
  if (d->ping_busy) {
    // A ping is going out: this send follows it (resume_held).
    SLUICE_VERIFY(!d->held.live && !d->held.done && n <= 3);
    d->held.live = true;
    d->held.with_head = with_head;
    d->held.n = n;
    d->held.chunked = chunked;
    for (uint8_t i = 0; i < n; ++i) d->held.body[i] = body[i];
    d->held.lender = lender;
    return;
  }
  SLUICE_VERIFY(!d->send_busy && d->send_pin == nullptr && n <= 3 && (with_head || n != 0) && chunked == 0);
  uint8_t k = 0;
  if (with_head) {
    d->send_iov[k++] = {d->out.data, d->out.len};
    size_t body_len = 0;
    for (uint8_t i = 0; i < n; ++i) body_len += body[i].iov_len;
    if (body_len <= d->out.cap - d->out.len) {
      // A short body that came with the head (a non-stream answer): joined
      // to the head in `out`, so the client gets one plain send, and the
      // lender has its buffer back at once.
      for (uint8_t i = 0; i < n; ++i) {
        std::memcpy(d->out.data + d->out.len, body[i].iov_base, body[i].iov_len);
        d->out.len += static_cast<uint32_t>(body[i].iov_len);
      }
      d->send_iov[0].iov_len = d->out.len;
      n = 0;
      if (lender != nullptr) lender->give_back(lender);
      lender = nullptr;
    }
  }
  for (uint8_t i = 0; i < n; ++i) d->send_iov[k++] = body[i];
  d->send_iov_count = k;
  d->send_pin = lender;  // given back at this send's completion
  _t.send_output(d);
}

void h1_codec::response_done(exchange& x) noexcept {
  if (x.conn->ping_busy) {
    x.conn->held.done = true;  // after the ping (resume_held)
    return;
  }
  x.conn->state = conn_state::local;  // so on_response_sent() counts it like any answer
  on_response_sent(x.conn);
}

void h1_codec::send_ping(downstream_conn* d) noexcept {
  SLUICE_VERIFY(!d->send_busy && !d->ping_busy && !d->held.live && !d->held.done);
  const std::string_view ping = takes_chunked(d->x) ? k_ping_chunk : k_ping_event;
  d->send_iov[0] = {const_cast<char*>(ping.data()), ping.size()};
  d->send_iov_count = 1;
  d->ping_busy = true;
  _t.send_output(d);
}

void h1_codec::resume_held(downstream_conn* d) noexcept {
  downstream_conn::held_send h = d->held;
  d->held = {};
  if (h.live) {
    send_response(d->x, h.with_head, h.body, h.n, h.lender, h.chunked);
  } else if (h.done) {
    response_done(d->x);
  }
}

void h1_codec::drop_held(downstream_conn* d) noexcept {
  buffer_lender* l = d->held.live ? d->held.lender : nullptr;
  d->held = {};
  if (l != nullptr) l->give_back(l);
}

void h1_codec::give_back_lent_buffer(downstream_conn* d) noexcept {
  if (d->state == conn_state::closing) drop_held(d);
  buffer_lender* l = d->send_pin;
  if (l == nullptr) return;
  d->send_pin = nullptr;
  l->give_back(l);
}

}  // namespace sluice::proxy
