#pragma once
// adapters (private): the OpenAI-over-HTTP/1.1 backend adapter (vLLM, SGLang,
// trtllm-serve, llama.cpp). Owns the backends' connection pools and the
// upstream connections: the forwarded request (the client's body with at
// most two byte edits), connect / send / receive, retries, the failures a
// client is answered for (openai_http.cpp), and the relay of the response
// (relay.cpp, relay_scan.cpp: the backend's framing passed through to a
// client codec that takes it, else de-chunked; SSE facts; the usage cut),
// or a reply translated (translated_relay.cpp): rendered for a Responses or
// Messages client (rendered_relay.cpp), or read by an adapter whose backend
// speaks another HTTP dialect (an http_reply_reader: anthropic_http).
// It reaches the client only through the exchange's codec (client_codec).
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend_adapter.hpp"
#include "exchange.hpp"
#include "shard_context.hpp"
#include "upstream_conn.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/net/buffer_ring.hpp"

namespace sluice::proxy {

class exchange_policy;

// What an adapter whose backend speaks another HTTP dialect (Anthropic's
// Messages API) adds to this transport: the transport connects, sends,
// parses the framing and scans the events; the reader turns the reply into
// the client's answer. Set per exchange in relay_state::reader.
class http_reply_reader {
 public:
  // Whether `status` is the backend's own "overloaded", retried on another
  // backend as a 502 or 503 is.
  virtual bool overloaded(uint16_t status) const noexcept = 0;
  // A held error answer's body in OpenAI's shape (normalize_backend_error's
  // contract; `overflow`: the body was past the hold bound).
  virtual size_t error_to_openai(uint16_t status, std::string_view body, bool overflow, char* out, size_t cap,
                                 uint16_t& status_out) const noexcept = 0;
  // The reply translated (not called when the client's dialect is the
  // backend's own, x.req.native: its bytes pass): its head, each of its
  // SSE events, a non-stream reply held and read whole.
  virtual void on_reply_head(exchange& x) noexcept = 0;
  virtual void on_reply_event(exchange& x, const http::sse_event& ev) noexcept = 0;
  virtual void on_whole_reply(exchange& x) noexcept = 0;

 protected:
  ~http_reply_reader() = default;
};

// Shard-local; a part of the shard's server.
class openai_http final : public backend_adapter {
 public:
  openai_http(shard_context& s, exchange_policy& x) noexcept;
  ~openai_http() override;
  openai_http(const openai_http&) = delete;
  openai_http& operator=(const openai_http&) = delete;

  bool init() noexcept;
  void on_iteration() noexcept { _up_bufs->publish(); }
  // SIGHUP: backends keep their positions (pools carry over); idle
  // connections to removed backends close.
  void reload(const config::config& next) noexcept;

  // --- backend_adapter ---
  bool prepare(exchange& x, const openai::request_fields& f) noexcept override;
  void start(exchange& x) noexcept override;
  void release(exchange& x) noexcept override;
  void on_timeout(exchange& x) noexcept override;
  void on_sent(exchange& x) noexcept override {
    x.rsp.sending = false;
    after_body_sent(x);
  }

  // --- what an http_reply_reader calls: the transport's part of a translated reply ---
  // The response was read: the exchange lets go of its attempt's connection
  // (if it still holds one), pooled when x.rsp.reusable.
  void end_attempt(exchange& x) noexcept;
  void upstream_failed(exchange& x, errc why) noexcept;
  // Parses u->buf[parse_from, len) and sends [fwd_from, send_end) (with
  // the response head first when with_head).
  void relay(exchange& x, uint32_t parse_from, bool with_head) noexcept;
  // A translated reply's head (translated_relay.cpp): a reader's, or an
  // OpenAI backend's rendered for a Responses / Messages client
  // (`rendered`). An error is held, a non-stream body held whole, or an
  // event stream readied to translate (scanner and renderer). Returns: true
  // only in the last case; else it answered, relayed or failed.
  bool translated_head(exchange& x, bool rendered) noexcept;
  // The client's translated stream head staged; the frame ready for its
  // first batch. Returns: false when it failed the exchange.
  bool open_translated_stream(exchange& x) noexcept;
  // `chat`, a chat.completion body, answered in the client's dialect (a 502
  // when it is not one).
  void answer_rendered(exchange& x, std::string_view chat) noexcept;

 private:
  // The forwarded body as iovecs (x.up_iov[1..]): the client's bytes with at
  // most two byte edits (model, include_usage). Returns: its length.
  uint64_t plan_upstream_body(exchange& x, const openai::request_fields& f) noexcept;
  bool build_upstream_request(exchange& x, const openai::request_fields& f) noexcept;
  // Writes this attempt's backend as the host; returns false out of memory.
  bool set_upstream_host(exchange& x, uint32_t backend) noexcept;
  // Returns: a pooled connection, else a new one while the backend has
  // fewer than `open_max` on this shard; null when at the cap or out of
  // resources.
  upstream_conn* acquire_upstream(uint32_t backend, uint32_t open_max) noexcept;
  void release_upstream(upstream_conn* u, bool reusable) noexcept;
  // The exchange lets go of its attempt's connection (closed, not pooled).
  void drop_attempt(exchange& x) noexcept;
  void close_upstream(upstream_conn* u) noexcept;
  void maybe_free(upstream_conn* u) noexcept;
  // An upstream CQE's first step: counts the operation done. Returns:
  // whether the connection no longer serves an exchange (then handled).
  bool upstream_gone(upstream_conn* u) noexcept;
  void submit_connect(upstream_conn* u) noexcept;
  void submit_upstream_send(exchange& x) noexcept;
  // No-op while one is armed. With no bytes held (u->buf empty) the
  // receive takes a buffer from _up_bufs; else it appends to u->buf.
  // `poll_first`: no bytes can be there yet (skip the first attempt).
  void submit_recv(upstream_conn* u, bool poll_first = false) noexcept;
  // Gives u->buf's storage back (to _up_bufs when lent). Only while no
  // operation writes to it.
  void drop_upstream_buffer(upstream_conn* u) noexcept;
  static void on_up_connect(shard::completion* c, const io_uring_cqe* cqe);
  static void on_up_send(shard::completion* c, const io_uring_cqe* cqe);
  static void on_up_recv(shard::completion* c, const io_uring_cqe* cqe);
  void on_up_connect_cqe(upstream_conn* u, int res) noexcept;
  void on_up_send_cqe(upstream_conn* u, int res) noexcept;
  void on_up_recv_cqe(upstream_conn* u, int res) noexcept;
  // The client's answer to an attempt that failed and is not retried.
  void answer_upstream_failure(exchange& x, errc why) noexcept;
  // The upstream send that read x's request bytes has completed: what
  // waited for it (the next request, a retry) goes on.
  void after_upstream_send_done(exchange& x) noexcept;

  // The relay (relay.cpp, relay_scan.cpp)
  void on_response_head(exchange& x) noexcept;
  // The batch [fwd_from, send_end) holds the usage event sluice asked for:
  // sent without it (its chunk cut out, or the batch re-framed).
  void send_cut(exchange& x, bool with_head, bool end_client) noexcept;
  // The client's terminal chunk, sent by sluice after [DONE]; marks the
  // response ended for the client.
  iovec terminal_chunk_iov(exchange& x) noexcept;
  // Sends the staged head (with_head) and pieces[0..n) through the codec
  // (neither: on to after_body_sent); `pin`: the upstream connection whose
  // buffer the pieces read, lent until the send completes (give_back).
  void send_batch(exchange& x, bool with_head, const iovec* pieces, uint8_t n, upstream_conn* pin,
                  uint8_t chunked = 0) noexcept;
  static void give_back(buffer_lender* l) noexcept;
  // A send of the response's bytes completed: the relay goes on.
  void after_body_sent(exchange& x) noexcept;
  // A native Responses reply read whole (x.req.keep_route): its backend
  // kept by the body's top-level "id" (exchange_policy::keep_route).
  void keep_body_route(exchange& x) noexcept;
  // An HTTP/1.0 client: the batch's payload, de-chunked, after the head.
  void send_dechunked(exchange& x, bool with_head, bool end_client) noexcept;
  void end_after_done(exchange& x) noexcept;
  // Returns: whether u->buf could double (own allocation, up to 1 MiB).
  bool grow_upstream_buffer(upstream_conn* u) noexcept;
  // The rest of a body past the largest buffer, de-chunked and re-framed
  // (relay_state::reframe); `drop_usage`: the usage event is left out.
  // Returns: false when the filter's memory cannot be had.
  bool start_reframe(exchange& x, bool drop_usage) noexcept;
  void send_reframed(exchange& x, bool with_head, uint32_t parsed_end, bool complete) noexcept;
  // After [DONE] on a response the backend keeps open: how long its rest is
  // waited for before the connection is closed instead of pooled.
  static constexpr uint64_t k_after_done_wait_ms = 1000;
  // The same when the client's response can only end with the exchange
  // (HTTP/2, HTTP/1.0): the client is waiting too.
  static constexpr uint64_t k_unframed_done_wait_ms = 100;
  // A held backend error (hold_error), read whole: answered in OpenAI's shape.
  void answer_backend_error(exchange& x) noexcept;

  // The batch's translated events, in x.mem->frame after its size room,
  // sent as one chunk (the terminal chunk after it once the client's
  // response ends).
  void send_translated(exchange& x, bool with_head, uint32_t parsed_end, bool complete) noexcept;

  // A Responses or Messages client of an OpenAI backend (rendered_relay.cpp):
  // the chat reply rendered in the client's dialect as it comes.
  void on_rendered_head(exchange& x) noexcept;
  void on_chat_event(exchange& x, const http::sse_event& ev) noexcept;
  // A chunk that is vLLM's plain token event alone, between two events of
  // the scan: rendered from the chunk, without the scan. Returns: false,
  // nothing done, for any other chunk (it is scanned).
  bool rendered_plain_chunk(exchange& x, std::string_view chunk) noexcept;
  void rendered(exchange& x, size_t n) noexcept;
  // A held chat.completion, read whole: answered in the client's dialect.
  void answer_chat_reply(exchange& x) noexcept;
  // The backend failed after a Responses or Messages stream began: the
  // events rendered so far, the dialect's failure events (response.failed,
  // an error event) and the terminal chunk go out, so the client reads a
  // failed answer rather than a cut one. Returns: false when it cannot (a
  // send is out, no memory): then the connection is cut as for chat.
  bool end_failed_stream(exchange& x) noexcept;
  // The response ended: the connection goes back to its pool (or closes),
  // and the exchange is accounted as any answer.
  void finish_exchange(exchange& x) noexcept;
  static void on_body_data(void* ctx, const char* data, size_t len);
  static void on_sse_event(void* ctx, const http::sse_event& ev);
  static void on_chunk_end(void* ctx, const char* at);
  static void on_sse_chunk(void* ctx, const char* data, size_t len, const char* end);
  static void on_skipped_chunks(void* ctx, uint32_t chunks, const char* end);
  // The end of vLLM's plain content event (`"finish_reason":null}]}`) and
  // of its chunk: what on_sse_event counts without a parse, and what the
  // skip counts without the scan.
  static constexpr std::string_view k_plain_chunk_tail = "\"finish_reason\":null}]}\n\n";
  static constexpr std::string_view k_plain_tail = k_plain_chunk_tail.substr(0, k_plain_chunk_tail.size() - 2);
  // vLLM's role chunk, one choice and nothing after it: no content, no
  // finish, no usage.
  static constexpr std::string_view k_role_tail =
      "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
      "\"finish_reason\":null}]}";
  static void chunk_scanned(exchange& x, const char* end) noexcept;

  shard_context& _s;
  exchange_policy& _x;
  // Aliases of the context's members, by the names the code reads.
  std::shared_ptr<const config::config>& _cfg = _s.cfg;
  shard::reactor& _r = _s.r;
  metrics::shard_metrics& _metrics = _s.metrics;
  std::unique_ptr<route::table>& _routes = _s.routes;
  const bool& _draining = _s.draining;

  std::string _reply;                           // a translated non-stream reply (reused)
  std::unique_ptr<net::buffer_ring> _up_bufs;   // upstream receives with nothing held
  std::unique_ptr<backend_state[]> _backends;
  size_t _backend_count = 0;
};

}  // namespace sluice::proxy
