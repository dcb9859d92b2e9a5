// The downstream (client) side: receive, parse, authenticate, answer locally
// or hand the request to the upstream side, send, keep-alive, close.
#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <xxhash.h>

#include "shard_server.hpp"
#include "text.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/text.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/quota/estimate.hpp"

namespace sluice::proxy {

namespace {

// Bytes of pipelined input held while a response is in flight before the
// connection stops reading (and so stops the client) until it catches up.
constexpr uint32_t k_pipeline_bytes_max = 64u << 10;


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

bool busy(conn_state s) noexcept {
  return s == conn_state::upstream || s == conn_state::streaming || s == conn_state::local ||
         s == conn_state::quota_wait;
}

}  // namespace

void shard_server::submit_recv(downstream_conn* d) noexcept {
  io_uring_sqe* s = _r.sqe(&d->recv_op);
  io_uring_prep_recv_multishot(s, d->fd, nullptr, 0, 0);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = _bufs->group_id();
  d->recv.on_armed();
  ++d->ops;
}

void shard_server::on_recv(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->srv->on_recv_cqe(d, cqe);
}

void shard_server::on_recv_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept {
  const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
  const int res = cqe->res;
  if (!more) {
    d->recv.on_ended();
    --d->ops;
  }
  if (res > 0 && (cqe->flags & IORING_CQE_F_BUFFER) != 0) {
    const auto bid = static_cast<uint16_t>(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
    const char* src = _bufs->buffer(bid);
    bool ok = true;
    if (d->state != conn_state::closing) {
      // While a response is in flight the request buffer may be referenced
      // by an upstream send: it must not move. Pipelined bytes wait in the
      // stash until the exchange ends.
      byte_buf& dst = busy(d->state) ? d->stash : d->in;
      const char* old = dst.data;
      ok = dst.reserve(static_cast<size_t>(dst.len) + static_cast<size_t>(res) + simdjson::SIMDJSON_PADDING);
      if (ok) {
        std::memcpy(dst.data + dst.len, src, static_cast<size_t>(res));
        dst.len += static_cast<uint32_t>(res);
        if (&dst == &d->in && old != nullptr && old != d->in.data &&
            (d->state == conn_state::body)) {
          d->x.head.rebase(old, d->in.data);
        }
      }
    }
    _bufs->recycle(bid);
    if (!ok) {
      close_downstream(d);
      return;
    }
  }
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res == 0 || (res < 0 && res != -ENOBUFS && res != -ECANCELED)) {
    // The client closed (or reset). Mid-exchange this cancels the backend
    // request at once: vLLM stops generating when its socket closes.
    d->peer_eof = true;
    if (d->state == conn_state::upstream || d->state == conn_state::streaming) {
      abort_exchange(d);
    } else {
      close_downstream(d);
    }
    return;
  }
  // Too much pipelined input held while a response is in flight: stop
  // reading (and so the client) until the exchange ends.
  if (busy(d->state) && d->stash.len > k_pipeline_bytes_max && d->recv.pause()) {
    io_uring_sqe* s = _r.sqe_untracked();
    io_uring_prep_cancel(s, &d->recv_op, 0);
  }
  // A multishot receive ends on its own when the buffer ring runs dry
  // (-ENOBUFS) or the kernel decides so, and with -ECANCELED after our
  // cancel: re-armed unless paused (a cancel whose completion comes after
  // the resume re-arms here; the resume found it still armed).
  if (d->recv.wants_arm()) submit_recv(d);
  if (res > 0) process_input(d);
}

void shard_server::start_request(downstream_conn* d) noexcept {
  d->state = conn_state::head;
  d->x.request_start_ms = now_ms();
  // The exchange is fresh (reset_exchange): nothing of the previous
  // request's head, whose views point at bytes compaction moved or freed,
  // can answer for this one.
  d->parser.reset();
  set_deadline(d, deadline_kind::header, _cfg->server.header_timeout_ms);
}

void shard_server::process_input(downstream_conn* d) noexcept {
  for (;;) {
    switch (d->state) {
      case conn_state::idle:
        if (d->in.len <= d->req_start) return;
        start_request(d);
        [[fallthrough]];
      case conn_state::head: {
        http::parse_status st = d->parser.parse_head(d->in.data + d->req_start, d->in.len - d->req_start, d->x.head);
        if (st.need_more()) return;
        if (!st.ok()) {
          open_request(d);
          answer_error(d, st.status, st.message, "invalid_request_error", {}, {}, true);
          return;
        }
        d->x.head_ok = true;
        make_request_id(d);
        open_request(d);
        d->body_begin = d->req_start + d->x.head.head_bytes;
        // Where this request's bytes end: here when it has no body (an early
        // answer below then moves on to the next request, not to this one
        // again); the body's end once it is read.
        d->raw_end = d->body_begin;
        d->body_len = 0;
        d->chunk_raw_pos = d->body_begin;
        const bool has_body = d->x.head.chunked || d->x.head.content_length > 0;
        // Route by path and method before reading the body, so a request
        // sluice will refuse never makes it send 100 Continue or buffer 8 MiB.
        const std::string_view path = d->x.head.path;
        bool known = true;
        bool method_ok = true;
        if (path == "/v1/chat/completions") {
          d->x.endpoint = openai::endpoint::chat_completions;
          method_ok = d->x.head.meth == http::method::post;
        } else if (path == "/v1/completions") {
          d->x.endpoint = openai::endpoint::completions;
          method_ok = d->x.head.meth == http::method::post;
        } else if (path == "/v1/embeddings") {
          d->x.endpoint = openai::endpoint::embeddings;
          method_ok = d->x.head.meth == http::method::post;
        } else if (path == "/v1/models") {
          method_ok = d->x.head.meth == http::method::get;
          d->x.is_models = true;
        } else {
          known = false;
        }
        if (!known) {
          answer_error(d, 404, "Unknown request URL. Please check the URL and method.", "invalid_request_error", {},
                       "unknown_url", has_body);
          return;
        }
        if (!method_ok) {
          answer_error(d, 405, "Method not allowed for this URL.", "invalid_request_error", {},
                       "method_not_allowed", has_body);
          return;
        }
        d->x.key_index = _keys.find(d->x.head.authorization, _cfg->keys);
        if (d->x.key_index < 0) {
          answer_error(d, 401,
                       d->x.head.authorization.empty()
                           ? "You didn't provide an API key. You need to provide your API key in an Authorization "
                             "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
                           : "Incorrect API key provided.",
                       "invalid_request_error", {}, "invalid_api_key", has_body);
          return;
        }
        if (!has_body) {
          dispatch(d);
          return;
        }
        d->state = conn_state::body;
        d->x.body_start_ms = now_ms();
        set_deadline(d, deadline_kind::body, _cfg->server.body_timeout_ms);
        if (d->x.head.expect_continue && d->in.len < d->body_begin + 1 && !d->send_busy) {
          static constexpr std::string_view k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
          d->send_iov[0] = {const_cast<char*>(k_continue.data()), k_continue.size()};
          d->send_iov_count = 1;
          d->x.expect_sent = true;
          submit_send(d);
        }
        [[fallthrough]];
      }
      case conn_state::body: {
        if (d->send_busy) return;  // 100 Continue still going out
        if (!d->x.head.chunked) {
          const uint64_t have = d->in.len - d->body_begin;
          if (have < d->x.head.content_length) return;
          d->body_len = static_cast<uint32_t>(d->x.head.content_length);
          d->raw_end = d->body_begin + d->body_len;
        } else {
          size_t consumed = 0, produced = 0;
          http::parse_status st =
              d->parser.decode_chunked(d->in.data + d->chunk_raw_pos, d->in.len - d->chunk_raw_pos,
                                       d->in.data + d->body_begin + d->body_len, consumed, produced);
          d->chunk_raw_pos += static_cast<uint32_t>(consumed);
          d->body_len += static_cast<uint32_t>(produced);
          if (st.need_more()) return;
          if (!st.ok()) {
            answer_error(d, st.status, st.message, "invalid_request_error", {}, {}, true);
            return;
          }
          d->raw_end = d->chunk_raw_pos;
        }
        dispatch(d);
        return;
      }
      default:
        return;  // a response is in flight: pipelined bytes wait
    }
  }
}

void shard_server::open_request(downstream_conn* d) noexcept {
  if (d->x.request_open) return;
  d->x.request_open = true;
  d->x.start_wall_ms = realtime_ms();
  _metrics.inflight_add();
}

void shard_server::end_request(downstream_conn* d) noexcept {
  if (!d->x.request_open) return;
  d->x.request_open = false;
  _metrics.inflight_sub();
  const uint64_t now = now_ms();
  // Tokens: the backend's usage when it sent one; for a stream cut short
  // without it, the content events seen (one token each, as vLLM streams).
  uint64_t prompt = 0, completion = 0;
  if (d->x.rsp.head_seen && d->x.rsp.head.event_stream) {
    if (d->x.rsp.facts.prompt_tokens > 0) prompt = static_cast<uint64_t>(d->x.rsp.facts.prompt_tokens);
    completion = d->x.rsp.facts.completion_tokens >= 0 ? static_cast<uint64_t>(d->x.rsp.facts.completion_tokens)
                                                 : d->x.rsp.facts.content_events;
  } else if (d->x.rsp.head_seen && d->resp_body.len != 0) {
    // Past its bound the body is its last 64 KiB (scan.cpp): the usage
    // object is read from there.
    const std::string_view body(d->resp_body.data, d->resp_body.len);
    const openai::usage u =
        d->x.rsp.body_overflow ? openai::scan_usage_in_tail(body) : openai::scan_response_usage(body);
    if (u.prompt_tokens > 0) prompt = static_cast<uint64_t>(u.prompt_tokens);
    if (u.completion_tokens > 0) completion = static_cast<uint64_t>(u.completion_tokens);
    // The first choice's finish_reason. The key followed by `":"` cannot
    // match inside a JSON string, where its quotes would be escaped.
    // memmem, not string_view::find: the latter calls memchr once per '"'
    // before the key (~80 in vLLM's body: 196 ns against 45).
    constexpr std::string_view k_finish = "\"finish_reason\":\"";
    const void* hit = ::memmem(body.data(), body.size(), k_finish.data(), k_finish.size());
    if (hit != nullptr) {
      const size_t from = static_cast<size_t>(static_cast<const char*>(hit) - body.data()) + k_finish.size();
      const size_t to = body.find('"', from);
      if (to != std::string_view::npos && to - from <= sizeof d->x.rsp.facts.finish_reason) {
        std::memcpy(d->x.rsp.facts.finish_reason, body.data() + from, to - from);
        d->x.rsp.facts.finish_reason_len = static_cast<uint8_t>(to - from);
      }
    }
  }
  const bool answered = d->x.rsp.head_seen && d->x.rsp.head.status == 200;
  // A stream cut before its usage chunk: the prompt is the estimate.
  if (answered && prompt == 0) prompt = d->x.input_estimate;
  // Settle exactly once: the backend's usage when it answered 200 (a
  // client gone mid-stream pays the prompt and what was streamed); any
  // failure before an answer is refunded.
  if (d->x.held.live) settle_quota(d, answered ? prompt : 0, answered ? completion : 0);
  const bool grouped = d->x.group != metrics::none;
  _metrics.request_done(d->x.group, d->x.backend_used, d->x.status);
  if (grouped && (prompt | completion) != 0) _metrics.tokens(d->x.group, prompt, completion);
  const uint64_t duration_ms = now - d->x.request_start_ms;
  if (grouped) {
    _metrics.observe_duration_us(d->x.group, duration_ms * 1000);
    if (d->x.first_token_ms != 0) _metrics.observe_ttft_us(d->x.group, (d->x.first_token_ms - d->x.request_start_ms) * 1000);
  }
  if (!_audit) return;
  audit::record r;
  r.time_ms = d->x.start_wall_ms;
  r.request_id = std::string_view(d->x.request_id, d->x.request_id_len);
  if (d->x.key_index >= 0) r.key_id = _cfg->keys[static_cast<size_t>(d->x.key_index)].id;
  if (d->x.head_ok) {
    static constexpr std::string_view k_paths[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"};
    r.endpoint = d->x.is_models ? std::string_view("/v1/models")
                 : d->x.model_len != 0 ? k_paths[static_cast<int>(d->x.endpoint)]
                                     : std::string_view{};
    r.session_id = d->x.head.session_id;
  }
  r.model = std::string_view(d->x.model, d->x.model_len);
  if (grouped) r.group = _cfg->groups[d->x.group].name;
  if (d->x.backend_used != metrics::none) r.backend = _cfg->backends[d->x.backend_used].url;
  r.status = d->x.status;
  r.prompt_tokens = prompt;
  r.completion_tokens = completion;
  r.total_tokens = prompt + completion;
  r.quota_charged = d->x.quota_charged;
  r.ttft_ms = d->x.first_token_ms != 0 ? static_cast<int64_t>(d->x.first_token_ms - d->x.request_start_ms) : -1;
  r.duration_ms = duration_ms;
  r.stream = d->x.is_stream;
  r.cancelled = d->x.cancelled;
  r.finish_reason = std::string_view(d->x.rsp.facts.finish_reason, d->x.rsp.facts.finish_reason_len);
  r.error = d->x.error_code;
  _audit->append(r);
}

void shard_server::make_request_id(downstream_conn* d) noexcept {
  // Keep a client's X-Request-ID when it is a plain token (it reaches logs
  // and the backend); otherwise make one: shard-unique, not guessable.
  std::string_view rid = d->x.head.request_id;
  bool ok = !rid.empty() && rid.size() < sizeof d->x.request_id;
  for (char c : rid) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_' ||
          c == '.' || c == ':')) {
      ok = false;
      break;
    }
  }
  if (ok) {
    std::memcpy(d->x.request_id, rid.data(), rid.size());
    d->x.request_id_len = static_cast<uint8_t>(rid.size());
    return;
  }
  uint64_t x = _id_seed + (++_request_seq) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  text_writer w(d->x.request_id, sizeof d->x.request_id);
  w.put_hex(_index, 2);
  w.put_hex(x, 16);
  w.put_hex(static_cast<uint32_t>(_request_seq), 8);
  d->x.request_id_len = static_cast<uint8_t>(w.p - d->x.request_id);
}

void shard_server::dispatch(downstream_conn* d) noexcept {
  set_deadline(d, deadline_kind::none, 0);
  _stats.requests_total.add();
  _stats.requests_inflight.add();
  d->x.inflight_counted = true;
  if (d->x.is_models) {
    answer_models(d);
    return;
  }
  // The shard's in-flight and memory caps: answered before the body is
  // parsed, so an overloaded shard spends as little as possible on what it
  // refuses, and before the exchange takes upstream buffers.
  const uint64_t memory_max = _cfg->server.memory_max_bytes;
  const bool over_memory = memory_max != 0 && connection_memory_bytes() > static_cast<int64_t>(memory_max);
  if (_stats.requests_inflight.get() > _cfg->server.inflight_max || over_memory) {
    (over_memory ? _stats.shed_memory : _stats.shed_requests).add();
    answer_error(d, 503, "The server is overloaded. Please try again.", "server_error", {}, "overloaded", false,
                 "retry-after: 1\r\n");
    return;
  }
  openai::request_fields f;
  openai::request_error e;
  // max_tokens above this is refused (400); the real bound is the model's
  // context, which the backend enforces.
  const int64_t cap = 1 << 20;
  if (!_reader.read(d->x.endpoint, d->in.data + d->body_begin, d->body_len, cap, f, e)) {
    answer_error(d, 400, e.message, "invalid_request_error", e.param, e.code, false);
    return;
  }
  d->x.model_len = static_cast<uint8_t>(f.model.size() < sizeof d->x.model ? f.model.size() : sizeof d->x.model);
  std::memcpy(d->x.model, f.model.data(), d->x.model_len);
  d->x.is_stream = f.stream;
  // Model -> group (names, patterns, `auto` rules), limited to the groups
  // the key may use: a model outside them reads as unknown (no leak).
  const uint32_t g = _routes->groups().resolve(f, static_cast<uint32_t>(d->x.key_index));
  if (g == route::k_none) {
    const size_t shown = f.model.size() > 128 ? 128 : f.model.size();
    char quoted[160];
    const size_t ql = openai::json_escape(quoted, sizeof quoted, f.model.substr(0, shown));
    auto msg = fmt::format_to_n(d->x.scratch, sizeof d->x.scratch,
                                "The model `{}` does not exist or you do not have access to it.",
                                std::string_view(quoted, ql));
    answer_error(d, 404, std::string_view(d->x.scratch, msg.size < sizeof d->x.scratch ? msg.size : sizeof d->x.scratch),
                 "invalid_request_error", "model", "model_not_found", false);
    return;
  }
  d->x.group = g;
  const config::group_config& grp = _cfg->groups[g];
  d->x.total_deadline_ms = grp.upstream.total_timeout_ms != 0 ? now_ms() + grp.upstream.total_timeout_ms : 0;
  _prng ^= _prng << 13;
  _prng ^= _prng >> 7;
  _prng ^= _prng << 17;
  d->x.route_key = route::route_key(_routes->keys(g), d->x.endpoint, f, grp.name, d->x.head.session_id, _prng);
  // Admission cost: estimated input tokens x input_weight + max_tokens (or
  // the group's default cap) x output_weight (DESIGN.md §4), for each answer
  // the backend generates (n, best_of, prompts of a completions batch).
  const uint64_t max_tokens = f.max_tokens > 0 ? static_cast<uint64_t>(f.max_tokens)
                              : grp.default_max_tokens != 0 ? grp.default_max_tokens
                                                            : _cfg->quota.default_max_tokens;
  uint64_t max_out = 0;
  if (__builtin_mul_overflow(max_tokens, f.output_sequences, &max_out)) max_out = UINT64_MAX;
  d->x.input_estimate = quota::estimate_input_tokens(std::string_view(d->in.data + d->body_begin, d->body_len));
  d->x.quota_cost = quota::admission_cost(d->x.input_estimate, max_out, _cfg->quota.input_weight,
                                        _cfg->quota.output_weight);
  d->state = conn_state::upstream;
  forward(d, f);
}

void shard_server::answer_models(downstream_conn* d) noexcept {
  // The groups' exact model names (patterns are not names a client can list).
  byte_buf& o = d->out;
  size_t need = 256;
  for (const auto& g : _cfg->groups) {
    if (g.removed) continue;
    need += g.name.size() + 96;
    for (const auto& m : g.models) need += m.size() + 96;
  }
  if (!o.reserve(need + 512)) {
    close_downstream(d);
    return;
  }
  // Body first at offset 512, head written in front of it afterwards.
  char* body = o.data + 512;
  size_t n = 0;
  auto put = [&](std::string_view s) {
    std::memcpy(body + n, s.data(), s.size());
    n += s.size();
  };
  put("{\"object\":\"list\",\"data\":[");
  bool first = true;
  auto add_model = [&](std::string_view id) {
    if (!first) put(",");
    first = false;
    put("{\"id\":\"");
    n += openai::json_escape(body + n, id.size() * 6, id);
    put("\",\"object\":\"model\",\"created\":0,\"owned_by\":\"sluice\"}");
  };
  for (const auto& g : _cfg->groups) {
    if (g.removed) continue;
    bool listed_name = false;
    for (const auto& m : g.models) {
      if (m.find_first_of("*?[") != std::string::npos) continue;
      add_model(m);
      if (m == g.name) listed_name = true;
    }
    if (!listed_name) add_model(g.name);
  }
  put("]}");
  char head[512];
  auto h = fmt::format_to_n(head, sizeof head,
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n"
                            "x-request-id: {}\r\n{}\r\n",
                            n, std::string_view(d->x.request_id, d->x.request_id_len),
                            d->x.head.keep_alive && !_draining ? "" : "connection: close\r\n");
  const size_t hl = h.size;
  std::memcpy(o.data + 512 - hl, head, hl);
  d->x.status = 200;
  d->close_after_send = !d->x.head.keep_alive || _draining;
  d->state = conn_state::local;
  d->send_iov[0] = {o.data + 512 - hl, hl + n};
  d->send_iov_count = 1;
  submit_send(d);
}

void shard_server::answer_error(downstream_conn* d, uint16_t status, std::string_view message, std::string_view type,
                                std::string_view param, std::string_view code, bool close,
                                std::string_view extra_headers) noexcept {
  if (d->x.request_id_len == 0) make_request_id(d);
  char body[1024];
  openai::error_fields e;
  e.message = message;
  e.type = type;
  e.param = param;
  e.code = code;
  const size_t bl = openai::write_error_body(body, sizeof body, e);
  _stats.local_errors.add();
  send_answer(d, status, std::string_view(body, bl), close, extra_headers,
              code.empty() ? std::string_view("invalid_request") : code);
}

void shard_server::send_answer(downstream_conn* d, uint16_t status, std::string_view body, bool close,
                               std::string_view extra_headers, std::string_view error_code) noexcept {
  if (d->x.request_id_len == 0) make_request_id(d);
  const size_t bl = body.size();
  close = close || !d->x.head.keep_alive || _draining || d->state == conn_state::idle;
  if (!d->out.reserve(bl + 1024)) {
    close_downstream(d);
    return;
  }
  char rate[512];
  const size_t rl = write_rate_headers(d, rate, sizeof rate);
  auto r = fmt::format_to_n(d->out.data, 1024,
                            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n"
                            "x-request-id: {}\r\n{}{}{}\r\n",
                            status, reason_phrase(status), bl, std::string_view(d->x.request_id, d->x.request_id_len),
                            std::string_view(rate, rl), extra_headers, close ? "connection: close\r\n" : "");
  std::memcpy(d->out.data + r.size, body.data(), bl);
  d->out.len = static_cast<uint32_t>(r.size + bl);
  d->x.status = status;
  d->close_after_send = close;
  if (!d->x.inflight_counted) {
    _stats.requests_total.add();
    _stats.requests_inflight.add();
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
  submit_send(d);
}

void shard_server::submit_send(downstream_conn* d) noexcept {
  d->send_busy = true;
  // One piece (an SSE batch, an answer with its body in `out`) is a plain send.
  prep_send_iov(_r.sqe(&d->send_op), d->fd, d->send_iov, d->send_iov_count, d->down_msg);
  ++d->ops;
}

void shard_server::on_send(shard::completion* c, const io_uring_cqe* cqe) {
  auto* d = static_cast<op<downstream_conn>*>(c)->owner;
  d->srv->on_send_cqe(d, cqe);
}

void shard_server::on_send_cqe(downstream_conn* d, const io_uring_cqe* cqe) noexcept {
  --d->ops;
  d->send_busy = false;
  const int res = cqe->res;
  // A short send resubmits the rest (below), which still reads what the
  // pin holds; anything else ends the send's use of the upstream buffer.
  if (d->state == conn_state::closing || res < 0 ||
      !advance_iov(d->send_iov, d->send_iov_count, static_cast<size_t>(res))) {
    unpin_upstream_buffer(d);
  } else {
    // The client took bytes: a stream's idle time starts again (a slow
    // reader is not a stalled one).
    if (d->state == conn_state::streaming && d->deadline == deadline_kind::upstream_idle) {
      set_deadline(d, deadline_kind::upstream_idle, _cfg->groups[d->x.group].upstream.stream_idle_timeout_ms);
    }
    submit_send(d);
    return;
  }
  if (d->state == conn_state::closing) {
    maybe_free(d);
    return;
  }
  if (res < 0) {
    // EPIPE/ECONNRESET: the client is gone.
    d->peer_eof = true;
    if (d->state == conn_state::upstream || d->state == conn_state::streaming) {
      abort_exchange(d);
    } else {
      close_downstream(d);
    }
    return;
  }
  switch (d->state) {
    case conn_state::body:
      process_input(d);  // 100 Continue is out; read on
      return;
    case conn_state::local:
      if (d->local_pending) {
        d->local_pending = false;
        d->send_iov[0] = {d->out.data, d->out.len};
        d->send_iov_count = 1;
        submit_send(d);
        return;
      }
      on_response_sent(d);
      return;
    case conn_state::streaming:
      after_body_sent(d);
      return;
    default:
      return;
  }
}

void shard_server::on_response_sent(downstream_conn* d) noexcept {
  end_request(d);
  if (d->x.inflight_counted) {
    _stats.requests_inflight.sub();
    d->x.inflight_counted = false;
  }
  if (d->x.status < 300) {
    _stats.responses_2xx.add();
  } else if (d->x.status < 500) {
    _stats.responses_4xx.add();
  } else {
    _stats.responses_5xx.add();
  }
  if (d->close_after_send) {
    close_downstream(d);
    return;
  }
  next_request(d);
}

void shard_server::next_request(downstream_conn* d) noexcept {
  if (d->up_send_inflight) {
    // The backend answered before it read the whole request; the rest of
    // the request bytes are still the kernel's until that send completes
    // (its connection is shut down, so soon).
    d->after_up_send = after_upstream_send::next_request;
    return;
  }
  d->req_start = d->raw_end;
  compact_input(d);
  if (d->stash.len != 0) {
    if (!d->in.reserve(static_cast<size_t>(d->in.len) + d->stash.len + simdjson::SIMDJSON_PADDING)) {
      close_downstream(d);
      return;
    }
    std::memcpy(d->in.data + d->in.len, d->stash.data, d->stash.len);
    d->in.len += d->stash.len;
    d->stash.len = 0;
  }
  d->state = conn_state::idle;
  // The next request starts from a fresh exchange: nothing of this one can
  // answer for it.
  reset_exchange(d);
  d->resp_body.len = 0;
  d->raw_end = d->body_begin = d->body_len = 0;
  if (_draining && d->in.len == 0) {
    close_downstream(d);
    return;
  }
  set_deadline(d, deadline_kind::idle, _cfg->server.idle_timeout_ms);
  d->recv.resume();
  if (d->recv.wants_arm()) submit_recv(d);
  if (d->in.len > 0) process_input(d);
}

void shard_server::reset_exchange(downstream_conn* d) noexcept {
  exchange& x = d->x;
  // Only between exchanges: the last one is accounted, has let go of its
  // backend connection, and waits for no quota.
  SLUICE_VERIFY(!x.request_open && x.up == nullptr && !x.inflight_counted && !x.held.live);
  SLUICE_VERIFY(x.wait_hook.prev == nullptr && x.wait_hook.next == nullptr);
  std::destroy_at(&x);
  std::construct_at(&x);
}

void shard_server::compact_input(downstream_conn* d) noexcept {
  if (d->req_start == 0) return;
  const uint32_t left = d->in.len - d->req_start;
  if (left != 0) std::memmove(d->in.data, d->in.data + d->req_start, left);
  d->in.len = left;
  d->req_start = 0;
  // A connection that once carried a large body gives the memory back.
  if (left == 0 && d->in.cap > (256u << 10)) d->in.release();
}

void shard_server::close_downstream(downstream_conn* d) noexcept {
  if (d->state == conn_state::closing) return;
  if (d->state == conn_state::quota_wait) unpark(d);
  if (d->x.request_open) end_request(d);
  if (d->x.inflight_counted) {
    _stats.requests_inflight.sub();
    d->x.inflight_counted = false;
  }
  d->state = conn_state::closing;
  d->deadline = deadline_kind::none;
  _timers.cancel(d->timer);
  if (d->x.up != nullptr) {
    upstream_conn* u = d->x.up;
    d->x.up = nullptr;
    u->owner = nullptr;
    _routes->on_request_end(u->backend);
    close_upstream(u);
  }
  // shutdown() completes the pending receive (and any send) at once; the
  // fd is closed when the last operation has come back.
  ::shutdown(d->fd, SHUT_RDWR);
  maybe_free(d);
}

void shard_server::maybe_free(downstream_conn* d) noexcept {
  if (d->state != conn_state::closing || d->ops > 0) return;
  SLUICE_VERIFY(!d->up_send_inflight && d->send_pin == nullptr && !d->recv.armed() && !d->send_busy);
  SLUICE_VERIFY(!d->timer.armed());
  ::close(d->fd);
  d->fd = -1;
  if (d->all_hook.prev != nullptr) {
    d->all_hook.prev->all_hook.next = d->all_hook.next;
  } else {
    _conns = d->all_hook.next;
  }
  if (d->all_hook.next != nullptr) d->all_hook.next->all_hook.prev = d->all_hook.prev;
  --_conn_count;
  _stats.connections_open.sub();
  account_connection_memory(-static_cast<int64_t>(sizeof(downstream_conn) + (d->sse ? k_sse_scanner_bytes : 0)));
  delete d;
}

void shard_server::on_deadline(downstream_conn* d) noexcept {
  const deadline_kind k = d->deadline;
  d->deadline = deadline_kind::none;
  switch (k) {
    case deadline_kind::header:
      if (d->state == conn_state::idle && d->in.len == d->req_start) {
        close_downstream(d);  // connected, said nothing
      } else {
        open_request(d);
        answer_error(d, 408, "Request header timeout.", "invalid_request_error", {}, "request_timeout", true);
      }
      return;
    case deadline_kind::body: {
      // After body_timeout_ms a body may go on as long as it keeps a minimum
      // rate: a large upload on a slow link is fine, a trickle is not.
      const uint64_t elapsed_ms = now_ms() - d->x.body_start_ms;
      const uint64_t received = d->in.len - d->body_begin;
      const uint64_t owed = _cfg->server.body_min_rate_bytes_per_s * elapsed_ms / 1000;
      if (_cfg->server.body_min_rate_bytes_per_s != 0 && received >= owed) {
        set_deadline(d, deadline_kind::body, 1000);
        return;
      }
      answer_error(d, 408, "Request body timeout.", "invalid_request_error", {}, "request_timeout", true);
      return;
    }
    case deadline_kind::idle:
    case deadline_kind::send:
      close_downstream(d);
      return;
    case deadline_kind::upstream_idle:
      if (d->state == conn_state::streaming && d->timer.deadline_ms != d->x.total_deadline_ms &&
          d->send_busy) {
        // The backend is not read while bytes wait for the client (a
        // stream goes at its slower side's pace): the client took none for
        // the whole idle time. It is closed as stalled; the backend, which
        // did nothing wrong, is not blamed.
        _stats.client_stalls.add();
        d->x.error_code = "client_timeout";
        close_downstream(d);
        return;
      }
      [[fallthrough]];
    case deadline_kind::upstream_connect:
    case deadline_kind::upstream_first_byte:
      _stats.upstream_timeouts.add();
      upstream_failed(d, errc::upstream_timeout);
      return;
    case deadline_kind::none:
      return;
  }
}

}  // namespace sluice::proxy
