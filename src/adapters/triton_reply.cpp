// The KServe v2 gRPC adapter's request and reply: the ModelInferRequest
// written from the client's (openai/triton.hpp), and each stream's
// messages decoded and translated into the OpenAI reply, sent through the
// exchange's codec; the ends that are not a reply -- a gRPC status, a reply
// that cannot be read, a timeout -- retried, answered or cut (the
// transport is triton_grpc.cpp).
#include <cstring>

#include "triton_grpc.hpp"

#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "exchange_policy.hpp"
#include "wire.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"

namespace sluice::proxy {

// ---------------------------------------------------------------------------
// The request and the reply

bool triton_grpc::prepare(exchange& x, const openai::request_fields& f) noexcept {
  make_attempt<grpc_attempt>(x);
  if (wing_of<triton_memory>(*x.mem, k_triton_wing) == nullptr) {
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return false;
  }
  const config::group_config& g = _cfg->groups[x.group];
  x.rsp.dialect = reply_dialect::triton;
  x.rsp.translated = true;
  x.rsp.cut_usage = false;
  x.rsp.client_usage = f.include_usage;
  openai::triton_request_options o;
  o.flavor = g.flavor == config::triton_flavor::trtllm ? openai::triton_flavor::trtllm : openai::triton_flavor::vllm;
  const config::chat_template_config& ct = g.chat_template;
  openai::chat_template& t = o.prompt_template;
  if (!openai::parse_chat_template_kind(ct.kind, t.kind)) t.kind = openai::chat_template_kind::chatml;
  t.include_bos = ct.include_bos;
  t.custom = {ct.begin,           ct.system_prefix,    ct.system_suffix,   ct.user_prefix,
              ct.user_suffix,     ct.assistant_prefix, ct.assistant_suffix, ct.generation_prefix};
  o.model = g.backend_model.empty() ? f.model : std::string_view(g.backend_model);
  o.request_id = std::string_view(x.request_id, x.request_id_len);
  const uint64_t default_max = g.default_max_tokens != 0 ? g.default_max_tokens : _cfg->quota.default_max_tokens;
  o.default_max_tokens = static_cast<int64_t>(default_max);
  openai::request_error err;
  bool written = false;
  try {
    written = _writer.write(o, f, x.req.endpoint, _request, err);
  } catch (...) {  // the request string's growth: out of memory
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return false;
  }
  if (!written) {
    x.codec->answer_error(x, 400, err.message, "invalid_request_error", err.param, err.code, false);
    return false;
  }
  byte_buf& r = x.mem->up_head;
  if (!r.reserve(_request.size())) {
    x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return false;
  }
  std::memcpy(r.data, _request.data(), _request.size());
  r.len = static_cast<uint32_t>(_request.size());
  return true;
}

void triton_grpc::start_reply(exchange& x) noexcept {
  grpc_attempt& a = grpc_of(x);
  a.messages = true;
  x.rsp.answered_ok = true;
  _x.report_outcome(x.backend_used, false);
  openai::triton_reply_context ctx;
  ctx.request_id = std::string_view(x.request_id, x.request_id_len);
  ctx.created_s = static_cast<int64_t>(x.start_wall_ms / 1000);
  ctx.model = std::string_view(x.req.model, x.req.model_len);
  ctx.kind = x.req.endpoint;
  ctx.include_usage = x.rsp.client_usage;
  triton_mem(x).stream.reset(ctx, x.req.is_stream ? nullptr : &triton_mem(x).text);
  x.mem->frame.len = k_batch_room;
  if (renders(x) && x.req.is_stream && !start_rendering(x)) x.rsp.render_failed = true;
  set_pings(x, _cfg->server.ping_interval_ms);  // from the next stream_wait on
}

bool triton_grpc::stage_stream_head(exchange& x) noexcept {
  x.rsp.dechunk = !x.codec->takes_chunked(x);
  if (!x.codec->stage_response_head(x, translated_stream_head(), x.rsp.dechunk)) return false;
  x.status = 200;
  grpc_of(x).head_pending = true;
  return true;
}

void triton_grpc::take_outcome(exchange& x) noexcept {
  const openai::triton_outcome& o = triton_mem(x).stream.outcome();
  stream_facts& s = x.rsp.facts;
  s.prompt_tokens = o.prompt_tokens;
  s.completion_tokens = o.completion_tokens;
  s.content_events = static_cast<uint32_t>(o.completion_tokens);
  if (o.content_seen && x.first_token_ms == 0) x.first_token_ms = _s.now_ms();
  const size_t n = o.finish_reason.size() < sizeof s.finish_reason ? o.finish_reason.size() : sizeof s.finish_reason;
  // No finish reason yet is an empty view whose data() may be null, which memcpy must not get.
  if (n != 0) std::memcpy(s.finish_reason, o.finish_reason.data(), n);
  s.finish_reason_len = static_cast<uint8_t>(n);
}

size_t triton_grpc::feed_in_place(exchange& x, const char* data, size_t len) noexcept {
  // The common case of a stream under way: whole messages in a DATA chunk,
  // nothing held before them. They are translated from nghttp2's buffer
  // (valid during its callback) instead of copied into the stream's message
  // buffer first; anything else -- a message cut by the chunk's end, one
  // that does not read, an error message, the reply's end -- stops here and
  // goes the general way (advance) from its first byte.
  grpc_attempt& a = grpc_of(x);
  openai::triton_stream& t = triton_mem(x).stream;
  byte_buf& f = x.mem->frame;
  if (x.mem->body.len != 0 || a.sending || !a.messages || !x.req.is_stream || t.done()) return 0;
  size_t at = 0;
  while (at < len && !t.done()) {
    grpc::frame fr;
    if (grpc::read_frame(std::string_view(data + at, len - at), k_message_bytes_max, fr) != grpc::decode_status::ok) break;
    grpc::stream_response r;
    if (grpc::decode_stream_response(fr.message, r, triton_mem(x).memo) != grpc::decode_status::ok || !r.error_message.empty()) break;
    const size_t need = static_cast<size_t>(f.len) + t.event_bytes_max(r) + 16;
    if (need > f.cap && !f.reserve(need)) break;
    const openai::triton_stream_result res = t.feed(r, f.data + f.len, f.cap - f.len - 16);
    if (res.status != openai::triton_stream_status::ok) break;
    f.len += static_cast<uint32_t>(res.written);
    at += fr.consumed;
  }
  return at;
}

void triton_grpc::advance(exchange& x) noexcept {
  grpc_attempt& a = grpc_of(x);
  if (a.sending) return;  // on_sent comes back here
  const config::group_config& g = _cfg->groups[x.group];
  openai::triton_stream& t = triton_mem(x).stream;
  byte_buf& b = x.mem->body;
  byte_buf& f = x.mem->frame;
  if (a.head_seen && a.http_status != 200 && !a.messages && a.grpc_status < 0) {
    // Not a gRPC answer (a proxy's or a server's plain HTTP status): its
    // body (an HTML page, say) is no gRPC message and is not read; the
    // status alone decides (PROTOCOL-HTTP2.md's mapping), at once. The
    // stream lets go before it counts as closed (detach clears its user
    // data and resets it only while open).
    detach(x, true);
    a.closed = true;
    b.len = 0;
    a.grpc_status = a.http_status == 429 || a.http_status == 502 || a.http_status == 503 || a.http_status == 504
                        ? 14
                        : 2;
    char status[8];
    text_writer w(status, sizeof status);
    w.put_int(a.http_status);
    set_message(a, "The backend answered HTTP ", std::string_view(status, static_cast<size_t>(w.p - status)),
                " without a gRPC status.");
  }
  if (a.head_seen && !a.closed) x.codec->stream_wait(x, g.upstream.stream_idle_timeout_ms);
  // Whole messages, in order.
  while (a.parsed < b.len && !t.done()) {
    grpc::frame fr;
    const grpc::decode_status st =
        grpc::read_frame(std::string_view(b.data + a.parsed, b.len - a.parsed), k_message_bytes_max, fr);
    if (st == grpc::decode_status::need_more) break;
    grpc::stream_response r;
    const grpc::decode_status ds = st == grpc::decode_status::ok ? grpc::decode_stream_response(fr.message, r, triton_mem(x).memo) : st;
    if (ds != grpc::decode_status::ok) {
      bad_reply(x, grpc::describe(ds));
      return;
    }
    a.parsed += static_cast<uint32_t>(fr.consumed);
    if (!a.messages) {
      if (!r.error_message.empty()) {
        // The backend refused the request before any token: an error
        // answer, not a stream.
        char msg[192];
        const size_t ml = r.error_message.size() < sizeof msg ? r.error_message.size() : sizeof msg;
        std::memcpy(msg, r.error_message.data(), ml);
        conclude_error(x, 502, std::string_view(msg, ml), false);
        return;
      }
      start_reply(x);
      if (x.req.is_stream && !stage_stream_head(x)) {
        internal_failure(x);
        return;
      }
    }
    const size_t need = static_cast<size_t>(f.len) + t.event_bytes_max(r) + 16;
    if (need > f.cap && !f.reserve(need)) {
      internal_failure(x);
      return;
    }
    openai::triton_stream_result res = t.feed(r, f.data + f.len, f.cap - f.len - 16);
    if (res.status == openai::triton_stream_status::failed) {
      // Accumulate mode: the error ends the reply (a 502, nothing sent yet).
      char msg[192];
      const size_t ml = r.error_message.size() < sizeof msg ? r.error_message.size() : sizeof msg;
      if (ml != 0) std::memcpy(msg, r.error_message.data(), ml);  // failed may come without words
      conclude_error(x, 502, std::string_view(msg, ml), false);
      return;
    }
    if (res.status == openai::triton_stream_status::too_large) {
      conclude_error(x, 502, "The backend's reply is over 4 MiB of text.", false);
      return;
    }
    if (res.status == openai::triton_stream_status::ok) f.len += static_cast<uint32_t>(res.written);
  }
  if (a.parsed != 0) {
    // The undecoded rest (a message still coming) to the front.
    std::memmove(b.data, b.data + a.parsed, b.len - a.parsed);
    b.len -= a.parsed;
    a.parsed = 0;
  }
  if (t.done()) b.len = 0;  // after the reply's end the backend's rest is dropped
  if (a.messages) take_outcome(x);
  // The stream's end, once every message before it is decoded.
  if (a.closed && !t.done()) {
    if (a.grpc_status == 0 && b.len != 0) {
      bad_reply(x, "the stream ended inside a message");
      return;
    }
    if (a.grpc_status != 0) {
      conclude_status(x);
      return;
    }
    if (!a.messages) {
      start_reply(x);
      if (x.req.is_stream && !stage_stream_head(x)) {
        internal_failure(x);
        return;
      }
    }
    if (!f.reserve(static_cast<size_t>(f.len) + 2048 + 24 * (size_t{x.request_id_len} + x.req.model_len))) {
      internal_failure(x);
      return;
    }
    const openai::triton_stream_result res = t.finish(f.data + f.len, f.cap - f.len - 16);
    if (res.status == openai::triton_stream_status::ok) f.len += static_cast<uint32_t>(res.written);
    take_outcome(x);
  }
  if (!a.messages || !x.req.is_stream) {
    // Nothing for the client yet (a message still coming, larger than the
    // window), or a reply gathered whole: what was read is held by sluice,
    // not by a client's pace, so the window opens for the rest at once (the
    // message buffer's bound limits what a backend can make it hold).
    give_back_stream_window(x);
  }
  if (!a.messages) return;  // nothing yet for the client
  if (!x.req.is_stream) {
    if (t.done()) answer_body(x);
    return;
  }
  send_output(x, t.done());
}

void triton_grpc::send_output(exchange& x, bool end_client) noexcept {
  grpc_attempt& a = grpc_of(x);
  byte_buf& f = x.mem->frame;
  const bool with_head = a.head_pending;
  if (f.len == k_batch_room && !with_head && !end_client) {
    give_back_stream_window(x);  // nothing came of those bytes: the backend may send on
    return;
  }
  if (end_client) x.rsp.client_done = true;
  if (renders(x) && (x.rsp.render_failed || !render_batch(x, f, end_client))) {
    internal_failure(x);
    return;
  }
  const iovec piece = frame_translated_batch(f, x.rsp.dechunk, end_client);
  // The codec relays a response now (its send completions come back as
  // on_sent), even when the whole reply came before it waited for one.
  x.codec->stream_wait(x, _cfg->groups[x.group].upstream.stream_idle_timeout_ms);
  a.head_pending = false;
  a.sending = true;
  x.response_started = true;
  if (x.adm.running) _x.fair_progress(x);  // admission = "fair": the key's counter moves as it streams
  x.codec->send_response(x, with_head, &piece, piece.iov_len != 0 ? 1 : 0, nullptr, 0);
}

void triton_grpc::on_sent(exchange& x) noexcept {
  grpc_attempt& a = grpc_of(x);
  a.sending = false;
  x.mem->frame.len = k_batch_room;
  if (x.rsp.client_done) {
    finish(x);
    return;
  }
  give_back_stream_window(x);  // the client took them: the backend may send that much more
  advance(x);
}

void triton_grpc::finish(exchange& x) noexcept {
  detach(x, false);
  x.rsp.complete = true;
  x.codec->response_done(x);
}

void triton_grpc::answer_body(exchange& x) noexcept {
  detach(x, false);
  openai::triton_stream& t = triton_mem(x).stream;
  byte_buf& f = x.mem->frame;
  if (!f.reserve(t.body_bytes_max())) {
    internal_failure(x);
    return;
  }
  const openai::triton_stream_result res = t.write_body(f.data, f.cap);
  if (res.status != openai::triton_stream_status::ok) {
    internal_failure(x);
    return;
  }
  x.rsp.complete = true;
  if (renders(x)) {
    if (!render_body(x, std::string_view(f.data, res.written))) {
      internal_failure(x);
      return;
    }
    x.codec->answer(x, 200, x.mem->dialect_reply, false, {}, {});
    return;
  }
  x.codec->answer(x, 200, std::string_view(f.data, res.written), false, {}, {});
}

void triton_grpc::internal_failure(exchange& x) noexcept {
  detach(x, true);
  if (x.response_started) {
    x.error_code = "internal";
    x.codec->fail(x);
    return;
  }
  x.rsp.answered_ok = false;
  x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, false);
}

void triton_grpc::bad_reply(exchange& x, std::string_view why) noexcept {
  _metrics.at(metrics::stat::upstream_bad_replies).add();
  _x.report_outcome(x.backend_used, true);
  log::warn("backend {}: a gRPC reply sluice cannot read: {}", _cfg->backends[x.backend_used].url, why);
  detach(x, true);
  conclude_error(x, 502, "The backend sent a reply sluice cannot read.", false);
}

void triton_grpc::conclude_status(exchange& x) noexcept {
  grpc_attempt& a = grpc_of(x);
  char body[768];
  const openai::grpc_error_answer e = openai::grpc_status_to_openai(
      static_cast<uint32_t>(a.grpc_status), std::string_view(a.grpc_message, a.grpc_message_len), body, sizeof body);
  if (a.timed_out) {
    conclude_error(x, 504, "The backend did not answer in time.", false);
    return;
  }
  const config::group_config& g = _cfg->groups[x.group];
  // UNAVAILABLE before the backend answered: another backend may take it.
  const bool retry = (e.retryable || a.conn_failed) && !a.messages && !x.response_started &&
                     x.attempts < g.upstream.max_retries &&
                     _routes->pick(x.group, x.route_key,
                                   x.route_position < 64 ? x.tried_mask | uint64_t{1} << x.route_position : x.tried_mask)
                             .backend != route::k_none;
  if (retry) {
    detach(x, true);
    ++x.attempts;
    if (x.route_position < 64) x.tried_mask |= uint64_t{1} << x.route_position;
    _metrics.at(metrics::stat::upstream_retries).add();
    x.mem->body.len = 0;
    start(x);
    return;
  }
  if (a.messages || x.response_started) {
    if (!x.req.is_stream) {
      // Failed after the backend had answered: a non-stream client's 502,
      // with a body written for a 502 (not the shape of the status's own
      // mapping, a 429's for RESOURCE_EXHAUSTED say). The credentials'
      // refusals keep their hidden message.
      const uint32_t code = a.grpc_status == 16 || a.grpc_status == 7 ? static_cast<uint32_t>(a.grpc_status) : 13;
      const openai::grpc_error_answer m = openai::grpc_status_to_openai(
          code, std::string_view(a.grpc_message, a.grpc_message_len), body, sizeof body);
      end_stream_with_error(x, std::string_view(body, m.written), m.status);
      return;
    }
    end_stream_with_error(x, std::string_view(body, e.written));
    return;
  }
  detach(x, true);
  x.rsp.answered_ok = false;
  x.codec->answer(x, e.status, std::string_view(body, e.written), false, {}, "upstream_error");
}

void triton_grpc::conclude_error(exchange& x, uint16_t status, std::string_view message, bool) noexcept {
  if (grpc_of(x).messages || x.response_started) {
    char body[512];
    const size_t n = openai::triton_error_body(message, body, sizeof body);
    end_stream_with_error(x, std::string_view(body, n), status);
    return;
  }
  detach(x, true);
  x.rsp.answered_ok = false;
  char body[512];
  const size_t n = openai::triton_error_body(message, body, sizeof body);
  x.codec->answer(x, status, std::string_view(body, n), false, {}, status == 504 ? "upstream_timeout" : "upstream_error");
}

void triton_grpc::end_stream_with_error(exchange& x, std::string_view error_body, uint16_t status) noexcept {
  // A stream cut after its first token ends as a vLLM stream that fails
  // does: an error event, then [DONE]. A non-stream client that got
  // nothing yet gets the error answer.
  detach(x, true);
  _metrics.at(metrics::stat::upstream_truncated).add();
  x.error_code = "upstream_truncated";
  if (!x.req.is_stream) {
    x.rsp.answered_ok = false;
    x.codec->answer(x, status, error_body, false, {}, status == 504 ? "upstream_timeout" : "upstream_error");
    return;
  }
  byte_buf& f = x.mem->frame;
  if (!f.reserve(static_cast<size_t>(f.len) + error_body.size() + 64)) {
    x.codec->fail(x);
    return;
  }
  auto put = [&](std::string_view s) {
    std::memcpy(f.data + f.len, s.data(), s.size());
    f.len += static_cast<uint32_t>(s.size());
  };
  put("data: ");
  put(error_body);
  put("\n\ndata: [DONE]\n\n");
  x.rsp.facts.error = true;
  send_output(x, true);
}

}  // namespace sluice::proxy
