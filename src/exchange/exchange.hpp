#pragma once
// exchange (private): one request's exchange and the relay of its response.
//
//   client connection --codec--> exchange --adapter--> backend attempt
//   (src/client:                 (this file;           (src/adapters:
//    downstream_conn,             its policy:           upstream_conn,
//    h1_codec, h2_codec)          exchange_policy)      openai_http, ...)
//                                    |
//                                  relay (src/adapters/relay.cpp: the
//                                    response's framing, SSE facts, usage cut)
//
// The exchange owns the request's policy state: its head, the fields read
// from its body, the route, the quota reservation, the attempts and the
// facts its audit line is made of. Its policy reaches the client only
// through its codec (client_codec.hpp) and the backend only through its
// adapter (backend_adapter.hpp). It is made fresh for every request (its
// codec's reset), so nothing of one request can answer for the next.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

#include "conn_memory.hpp"
#include "wire.hpp"
#include "sluice/http/request.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/dialect/dialect.hpp"
#include "sluice/dialect/native.hpp"
#include "sluice/dialect/render.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/quota/fair_queue.hpp"
#include "sluice/quota/shard_slices.hpp"
#include "sluice/route/groups.hpp"
#include "sluice/route/key.hpp"

namespace sluice::proxy {

struct downstream_conn;
struct upstream_conn;
struct h2_stream;
struct exchange;
class client_codec;
class backend_adapter;

// What the exchange does once the upstream send still reading its request
// bytes has completed (see exchange::up_send_inflight).
enum class after_upstream_send : uint8_t {
  nothing,
  next_request,
  retry,              // decided (a 502/503 answer): start the next attempt
  retry_unless_sent,  // a failed attempt: retry only if the send had not written the whole request
};

// What the scan of a streamed response saw (for billing and audit).
struct stream_facts {
  uint32_t events = 0;
  uint32_t content_events = 0;
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  bool done = false;     // data: [DONE]
  bool error = false;    // data: {"error": ...}
  uint8_t finish_reason_len = 0;
  char finish_reason[23] = {};
};

// How the backend's reply reaches the client: passed through (the OpenAI
// API: its bytes, with at most the usage chunk cut), or translated into the
// OpenAI API by sluice (Anthropic's Messages API, KServe v2 gRPC): then the
// client's head and body are sluice's, and `facts` holds what billing reads.
enum class reply_dialect : uint8_t { openai, anthropic, triton };

// An adapter whose backend speaks an HTTP dialect other than OpenAI's over
// the OpenAI adapter's transport: it reads the reply itself (adapters'
// openai_http.hpp).
class http_reply_reader;

// Shard-local; part of an exchange. The pings of a Messages stream sluice
// renders (server.ping_interval_ms; 0 = none): while the backend is quiet,
// the client codec sends a ping event each ping_ms. The stream's idle
// deadline proper is idle_due_ms (0 = none); its timer falls due at the
// earlier of the two (the codecs' downstream_conn.hpp). Set by the relay
// (set_pings), read by the codecs' stream timer alone.
struct stream_pings {
  uint32_t ping_ms = 0;
  uint64_t idle_due_ms = 0;
};

// Shard-local; part of an exchange. The response of the current attempt on
// its way to the client: the parser of the backend's framing, what the SSE
// scan saw, and the state of the usage cut. Byte offsets are into the
// upstream connection's receive buffer.
struct relay_state {
  http::response_parser parser;
  http::response_head head;
  bool head_seen = false;         // `head` holds this request's response head
  bool complete = false;          // the backend's response ended (terminal chunk, length, EOF)
  bool reusable = false;          // the backend connection may carry another request
  bool cut_usage = false;         // sluice asked for usage: cut that chunk from the stream
  bool hold_error = false;        // a backend error answer is being read whole, to be reshaped
  bool usage_in_batch = false;    // the usage-only event was seen, its chunk not yet cut: in this batch or held at its front
  bool usage_covered = false;     // and a chunk end between events came after it: it lies before aligned_at
  bool body_overflow = false;     // the kept non-stream body is its tail (see on_body_data)
  const char* usage_event_at = nullptr;  // that event's data in the receive buffer, when the scan saw it in place
  // The end of the last chunk of this batch that ended between two SSE
  // events (on_chunk_end): what may go out while a cut may still come.
  const char* aligned_at = nullptr;
  // A chunk end between two events came after [DONE] (in this batch or an
  // earlier one): the chunk that holds [DONE] is whole, so the client's
  // response may end at aligned_at. Until then [DONE] may lie past it.
  bool done_covered = false;
  bool dechunk = false;           // an HTTP/1.0 client and a chunked answer: the payload goes out close-delimited
  bool client_done = false;       // sluice ended the client's response after [DONE]; the backend's rest is dropped
  reply_dialect dialect = reply_dialect::openai;
  http_reply_reader* reader = nullptr;  // set by the adapter at prepare (null: OpenAI's own reply)
  bool translated = false;        // a translated reply began: `facts` has its counts (end_request reads them)
  bool answered_ok = false;       // translated: the backend took the request and answers it (billed as a 200)
  bool hold_reply = false;        // translated, non-stream: the backend's body is read whole, then answered
  bool render_failed = false;     // the renderer could not be had (out of memory)
  bool rendered = false;
  bool sending = false;           // a send of the response's bytes is out (openai_http::send_batch .. on_sent)
  dialect::native_usage native_usage;  // x.req.native: what the reply's events said of usage
  bool client_usage = false;      // the client asked for the usage chunk (stream_options.include_usage)
  uint32_t fwd_from = 0;          // first byte of the receive buffer not yet sent
  uint32_t send_end = 0;          // end of the bytes being sent
  // The skip of an event stream's plain chunks (body_sink::skip_ok): this
  // stream may skip them (upstream.sse_scan), and the scan stands where it
  // may (between two events, past the first).
  bool skip_allowed = false;
  bool skip_ok = false;
  // Past the largest buffer with no event boundary to cut at: the rest of
  // the body is de-chunked as it comes (cursor) and sent re-framed, through
  // mem->usage_filter when the usage event is still to be cut.
  bool reframe = false;
  bool reframe_filter = false;
  dechunk_cursor cursor;
  stream_facts facts;
};

// An adapter's memory that a connection keeps across its exchanges (a
// translator and its buffers): made by the adapter on its first exchange
// there (wing_of), its type the adapter's alone.
struct adapter_memory {
  adapter_memory() = default;
  adapter_memory(const adapter_memory&) = delete;
  adapter_memory& operator=(const adapter_memory&) = delete;
  virtual ~adapter_memory() = default;
};

// Memory an exchange uses that its connection keeps across exchanges (not
// state: grown once, then reused).
struct exchange_memory {
  exchange_memory() = default;
  exchange_memory(const exchange_memory&) = delete;
  exchange_memory& operator=(const exchange_memory&) = delete;
  ~exchange_memory() { account_connection_memory(-counted); }

  byte_buf body;     // a non-stream response body, kept for its usage; a local answer's body; de-chunked bytes
  byte_buf up_head;  // the backend request's head
  byte_buf frame;    // what the relay makes for a send: a re-framed or de-chunked batch
  std::unique_ptr<http::sse_scanner> sse;  // made on the connection's first stream
  // A Responses or Messages client (dialect_relay.hpp): its request written
  // as the canonical chat body (with simdjson's padding after it), the
  // renderer of its stream, its rendered non-stream reply, and the buffer
  // a rendered batch is written in before it takes the frame's place.
  std::string dialect_body;
  std::unique_ptr<dialect::stream_renderer> renderer;
  std::string dialect_reply;
  byte_buf dialect_frame;
  // [responses] store (response_state.cpp): the response id asked for
  // (previous_response_id, or GET / DELETE's), the stored conversation it
  // continues, and this request's conversation so far as items (a put).
  std::string store_id;
  std::string store_history;
  std::string store_items;
  // The usage cut past the largest buffer (relay_state::reframe): made on
  // the connection's first such stream and kept (16 KiB: not on every one).
  std::unique_ptr<usage_event_filter> usage_filter;
  // The adapters' own memory (adapter_memory), one slot each for those that
  // keep some; `tag` says whose type a slot holds (wing_of).
  static constexpr size_t k_wing_slots = 2;
  struct wing {
    const void* tag = nullptr;
    std::unique_ptr<adapter_memory> memory;
  };
  wing wings[k_wing_slots];

  // What the connection memory counts of the objects above that are made
  // on first use (the renderer, the usage filter, the adapters' memory):
  // counted as made, uncounted when this memory goes with its connection.
  int64_t counted = 0;
  void count(int64_t bytes) noexcept {
    counted += bytes;
    account_connection_memory(bytes);
  }

  // Between exchanges, nothing in them in use: a buffer one large reply
  // grew past `keep` (an event of megabytes, a long body) goes back, so a
  // keep-alive connection does not hold what one answer needed.
  static constexpr uint32_t k_keep_buffer_bytes = 256u << 10;
  void trim(uint32_t keep = k_keep_buffer_bytes) noexcept {
    for (byte_buf* b : {&body, &up_head, &frame, &dialect_frame}) {
      if (b->cap > keep) b->release();
    }
  }
};

template <class T>
inline constexpr char k_wing_tag = 0;

// The adapter memory of type T in slot `slot` of `m`: made (and counted,
// with `extra`: what T allocates itself) on first use. Returns: null when
// out of memory.
template <class T>
T* wing_of(exchange_memory& m, size_t slot, int64_t extra = 0) noexcept {
  static_assert(std::is_base_of_v<adapter_memory, T>);
  exchange_memory::wing& w = m.wings[slot];
  if (w.memory == nullptr) {
    w.memory.reset(new (std::nothrow) T());
    if (w.memory == nullptr) return nullptr;
    w.tag = &k_wing_tag<T>;
    m.count(static_cast<int64_t>(sizeof(T)) + extra);
  }
  SLUICE_ASSERT(w.tag == &k_wing_tag<T>);  // two adapters never share a slot
  return static_cast<T*>(w.memory.get());
}

// The adapter memory T that wing_of made in slot `slot` of `m`.
template <class T>
T& made_wing(exchange_memory& m, size_t slot) noexcept {
  exchange_memory::wing& w = m.wings[slot];
  SLUICE_ASSERT(w.memory != nullptr && w.tag == &k_wing_tag<T>);
  return *static_cast<T*>(w.memory.get());
}

// An adapter's own state of one attempt (its wing of the exchange): the
// exchange holds the bytes; the adapter that runs the exchange alone knows
// their type. Made by that adapter (make_attempt) before it reads them,
// and trivially destructible, so the exchange's reset owes the adapter
// nothing.
struct attempt_slot {
  static constexpr size_t k_bytes = 256;
  alignas(8) unsigned char bytes[k_bytes];
  const void* tag = nullptr;  // whose type the bytes hold (null: none yet)
};

template <class T>
inline constexpr char k_attempt_tag = 0;

// The request as policy reads it, whatever dialect the client speaks
// (docs/architecture.md §2b): set from the path and the body, before routing.
struct canonical_request {
  openai::endpoint endpoint = openai::endpoint::chat_completions;
  dialect::client_dialect speaks = dialect::client_dialect::chat;  // the client's dialect (its path)
  bool is_stream = false;
  bool count_tokens = false;       // POST /v1/messages/count_tokens: answered by sluice
  bool continues = false;          // Responses: previous_response_id given (a native group holds the state)
  // The group's backends speak the client's dialect (native_dialects): its
  // own bytes go, the model token [native_model_begin, end) rewritten where
  // the group names a backend model; the reply passes through.
  bool native = false;
  uint32_t native_model_begin = 0;
  uint32_t native_model_end = 0;
  std::string_view body;           // a Responses / Messages request: the canonical chat body, in mem->dialect_body
  bool is_models = false;          // GET /v1/models: answered by sluice
  // [responses] store: GET / DELETE /v1/responses/{id} (mem->store_id); a
  // previous_response_id's conversation fetched (mem->store_history); this
  // response to be kept at the end; the operation parked on.
  enum class store_verb : uint8_t { none, get, remove };
  store_verb store_call = store_verb::none;
  bool history_fetched = false;
  bool store_put = false;
  uint64_t store_seq = 0;
  // A native Responses group's backends hold the conversation: a reply's
  // backend is kept by its id (keep_route), and previous_response_id asks
  // for it (route_asked, then route_fetched) to be routed there (pinned,
  // a global backend index; UINT32_MAX = not known).
  bool keep_route = false;
  bool route_asked = false;
  bool route_fetched = false;
  uint32_t pinned_backend = UINT32_MAX;
  uint8_t model_len = 0;
  char model[128] = {};            // the client's model name, for audit and replies (truncated)
};

// Shard-local; part of an exchange. Its place under admission = "fair"
// (fair_admission.cpp): queued for a slot, then counted running until its
// end, its key's counter moved by what it is served.
struct fair_state {
  struct hook : quota::fair_hook {
    exchange* owner = nullptr;
  };
  hook wait;                       // in its group's fair_queue while queued (waiting_in::fair)
  bool running = false;            // counted running in the group's queue: ended() at end_request
  uint64_t served = 0;             // weighted tokens counted to the key's counter so far
  uint64_t queued_since_ms = 0;    // 0: never queued
  uint64_t queued_ms = 0;          // how long it waited for a slot (audit queued_ms)
};

// Shard-local. One per request: from the first byte of its head until its
// answer is sent or its connection closes. HTTP/1.1 has one at a time per
// connection (embedded in it); a multiplexing codec would hold several.
struct exchange {
  exchange() = default;
  exchange(const exchange&) = delete;
  exchange& operator=(const exchange&) = delete;

  // --- its sides (set by the codec that made it) ------------------------------
  client_codec* codec = nullptr;
  downstream_conn* conn = nullptr;   // the codec's connection (HTTP/1.1: the one that carries it)
  h2_stream* h2 = nullptr;           // HTTP/2: the stream that carries it (conn is null then)
  backend_adapter* adapter = nullptr;
  exchange_memory* mem = nullptr;    // its connection's, kept across exchanges

  // --- the request ---------------------------------------------------------
  http::request_head head;         // views into the connection's request bytes
  bool head_ok = false;            // `head` holds a parsed head (its views are valid)
  bool expect_sent = false;        // 100 Continue went out for this request
  canonical_request req;           // what the client asked, in the canonical request's terms
  uint64_t request_start_ms = 0;   // monotonic: the head's first byte
  uint64_t body_start_ms = 0;
  uint64_t start_wall_ms = 0;
  char request_id[64] = {};
  uint8_t request_id_len = 0;
  char scratch[256] = {};          // messages and the rewritten model token

  // --- policy: key, group, route, quota ------------------------------------
  int32_t key_index = -1;
  uint32_t group = metrics::none;  // index into cfg().groups once the model matched
  route::decision_how route_how = route::decision_how::name;  // how the auto model's group was picked
  float route_confidence = -1;     // the decided label's probability (route::decision); -1 = none
  route::route_key_result route_key;
  uint64_t tried_mask = 0;         // ring positions already tried (retries)
  uint32_t route_position = 0;
  quota::reservation held;         // live from admission to settle()
  uint64_t quota_cost = 0;         // reserved weighted tokens
  uint64_t input_estimate = 0;
  uint64_t reserved_output = 0;    // max_tokens x answers: the output part of the reservation
  uint64_t quota_charged = 0;
  uint64_t wait_since_ms = 0;      // parked for quota: since when (0: not waiting)
  uint64_t wait_until_ms = 0;      // parked on a short retry time: try again then
  list_hook<exchange> wait_hook;   // in the shard's quota waiters
  // Where wait_hook links it: the shard's list, or the chain a walk of the
  // waiters detached (unpark must unlink it from the one it is in).
  // `embeddings`: parked in an embed_router slot (embed_slot), not linked.
  // `fair`: queued for a slot in its group's fair_queue (adm.wait).
  // `store`: in the shard's list of exchanges waiting on a store answer.
  enum class waiting_in : uint8_t { none, list, walk, embeddings, fair, store };
  waiting_in waiting = waiting_in::none;
  // Embeddings mode: a call decided (`decided`: route_group, route_how,
  // route_confidence hold it) or could not (`fallback`: the classifier and
  // the rules decide); dispatch reads the request again either way.
  enum class embed_step : uint8_t { none, decided, fallback };
  embed_step embed = embed_step::none;
  uint8_t embed_slot = 0;
  uint32_t route_group = metrics::none;
  fair_state adm;                  // admission = "fair": its queue place and served tokens

  // --- the upstream attempt -------------------------------------------------
  upstream_conn* up = nullptr;
  uint8_t attempts = 0;
  // The attempt's whole request reached the backend's socket: from then on
  // the backend may have started it, and a failure is never retried.
  bool up_request_sent = false;
  // An upstream send reads this exchange's request bytes (lent by its
  // codec: lend_request_bytes); what waits for its completion.
  bool up_send_inflight = false;
  after_upstream_send after_up_send = after_upstream_send::nothing;
  uint64_t total_deadline_ms = 0;  // upstream.total_timeout_ms for this exchange; 0 = none
  // The forwarded request: head in mem->up_head, then the body
  // from its request bytes with at most two byte edits.
  iovec up_iov[6] = {};            // [1..]: the body, with its byte edits (none: joined to up_head)
  uint8_t up_iov_count = 0;
  iovec up_msg_iov[8] = {};        // what the upstream send sends (advanced on short sends)
  uint8_t up_msg_iov_count = 0;
  uint32_t host_offset = 0;        // where the backend's host goes in up_head
  uint32_t host_len = 0;           // the host now written there
  uint64_t up_body_len = 0;
  msghdr up_msg = {};

  attempt_slot attempt;            // the adapter's own state of the attempt (make_attempt)

  // --- the response ---------------------------------------------------------
  relay_state rsp;
  stream_pings pings;
  bool response_started = false;   // a byte of the response reached the socket

  // --- accounting and audit -------------------------------------------------
  bool request_open = false;       // accounted (audit + metrics) until end_request()
  bool inflight_counted = false;   // in the shard's in-flight count
  bool cancelled = false;          // cut: the client went away, or the drain ended
  uint16_t status = 0;
  uint32_t backend_used = metrics::none;
  uint64_t first_token_ms = 0;     // monotonic; 0 = none yet
  std::string_view error_code;     // static strings only

};

// Makes the attempt state T of `x` (its adapter's, fresh for this attempt).
template <class T>
T& make_attempt(exchange& x) noexcept {
  static_assert(sizeof(T) <= attempt_slot::k_bytes && alignof(T) <= 8 && std::is_trivially_destructible_v<T>);
  x.attempt.tag = &k_attempt_tag<T>;
  return *std::construct_at(reinterpret_cast<T*>(x.attempt.bytes));
}
// The attempt state T of `x`, made before by make_attempt<T>.
template <class T>
T& attempt_of(exchange& x) noexcept {
  SLUICE_ASSERT(x.attempt.tag == &k_attempt_tag<T>);
  return *std::launder(reinterpret_cast<T*>(x.attempt.bytes));
}

}  // namespace sluice::proxy
