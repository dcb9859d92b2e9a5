#pragma once
// adapters (private): the KServe v2 gRPC backend adapter (Triton Inference
// Server's vLLM and TensorRT-LLM backends: GRPCInferenceService/
// ModelStreamInfer). HTTP/2 cleartext to grpc:// backends with libnghttp2 as
// a client session (grpc::client_session) driven from the shard's own ring (feed / next_send:
// no threads, no blocking call). Many exchanges share one connection per
// backend and shard, one stream each; the stream's flow-control window is
// given back only as the client takes the bytes (backpressure to a slow
// client), the connection's at once (one slow stream never stalls the
// others).
//
// The request is the client's, rendered into a prompt and written as a
// ModelInferRequest (openai/triton.hpp); the reply's messages are
// translated into the OpenAI reply vLLM would give (reply_dialect::triton),
// sent through the exchange's codec as the anthropic relay sends its own.
//
// Lifetimes: an h2_conn lives from socket() until it is closed AND its last
// io_uring operation completed (`ops`); its `out` buffer is the kernel's
// while `send_busy`, its `in` buffer while `recv_armed`. An exchange holds
// its stream from start() until its end or release(); nghttp2 names it by
// the call's owner object, forgotten when the exchange lets go (a late
// report finds none and is dropped).
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend_adapter.hpp"
#include "conn_memory.hpp"
#include "exchange.hpp"
#include "shard_context.hpp"
#include "sluice/core/text.hpp"
#include "sluice/grpc/h2_client.hpp"
#include "sluice/grpc/kserve.hpp"
#include "sluice/openai/triton.hpp"

namespace sluice::proxy {

class exchange_policy;
class triton_grpc;
struct h2_conn;

// Shard-local; the triton adapter's state of an exchange's attempt
// (exchange::attempt: made in prepare, fresh again as a stream opens): one
// HTTP/2 stream of a connection many exchanges share.
struct grpc_attempt {
  h2_conn* conn = nullptr;          // null: no stream open
  int32_t stream_id = -1;
  list_hook<exchange> hook;         // in conn's streams
  exchange* dirty_next = nullptr;   // in conn's list of streams with news after a receive
  bool dirty = false;
  bool head_seen = false;           // the response's HEADERS came
  bool closed = false;              // the stream closed (trailers, RST, or the connection went)
  bool sending = false;             // a client send of this stream's output is out
  bool messages = false;            // a message came: the backend took the request
  bool head_pending = false;        // the client's head is staged, not yet sent
  bool conn_failed = false;         // the connection went (the stream never ended by itself)
  bool timed_out = false;           // a deadline of the attempt fell due
  int32_t grpc_status = -1;         // from the trailers (or a Trailers-Only answer); -1: none
  uint16_t http_status = 0;
  uint32_t request_off = 0;         // bytes of the framed request (mem->up_head) given to nghttp2
  uint32_t parsed = 0;              // bytes of mem->body decoded into messages
  uint32_t unconsumed = 0;          // stream bytes decoded whose output has not yet reached the client
  uint8_t grpc_message_len = 0;
  char grpc_message[160] = {};      // grpc-message, still percent-encoded (truncated)
};
inline grpc_attempt& grpc_of(exchange& x) noexcept { return attempt_of<grpc_attempt>(x); }

// Shard-local; the triton adapter's memory of a client connection (its
// wing of exchange_memory, kept across exchanges): the reply's translation
// (no buffers of its own), the layout of the last response decoded there,
// and a non-stream reply's text as it accumulates.
struct triton_memory final : adapter_memory {
  openai::triton_stream stream;
  grpc::decode_memo memo;
  std::string text;
};
inline constexpr size_t k_triton_wing = 1;  // exchange_memory::wings (anthropic_http.hpp has 0)
// Made in prepare (which answers 500 when it cannot be had).
inline triton_memory& triton_mem(exchange& x) noexcept { return made_wing<triton_memory>(*x.mem, k_triton_wing); }

// Shard-local. One HTTP/2 connection to a gRPC backend. Its session's
// reports name the exchange whose stream they are about; they go on to
// the adapter.
struct h2_conn final : grpc::session_events {
  triton_grpc* adapter = nullptr;
  int fd = -1;
  shard::file_slot slot;  // fd in the ring's registered-file table: the receive and sends use it
  uint32_t backend = 0;
  int ops = 0;                 // SQEs in flight that name it
  bool connected = false;
  bool draining = false;       // takes no new streams (GOAWAY, a reload removed its backend); its own go on
  bool closing = false;        // shut down: what is in flight completes, then it goes
  bool send_busy = false;      // `out` is the kernel's until the send's completion
  bool recv_armed = false;     // `in` is the kernel's until the receive's completion
  bool in_recv = false;        // inside mem_recv: callbacks run, no flush
  uint32_t streams = 0;        // exchanges on it
  grpc::client_session session;
  op<h2_conn> connect_op, send_op, recv_op;
  sockaddr_storage peer{};
  socklen_t peer_len = 0;
  byte_buf out;                // the send in flight
  uint32_t out_sent = 0;       // of `out`, already written (a short send)
  byte_buf in;                 // the receive buffer
  list_hook<h2_conn> hook;     // in its backend's connections
  exchange* streams_head = nullptr;  // the exchanges on it (grpc_attempt::hook)
  exchange* dirty_head = nullptr;    // those with news from this receive

  // --- grpc::session_events: `x` is an exchange* ---
  void on_field(void* x, std::string_view name, std::string_view value) noexcept override;
  void on_headers_end(void* x) noexcept override;
  bool on_data(void* x, std::string_view bytes) noexcept override;
  void on_close(void* x, uint32_t error_code) noexcept override;
  size_t read_request(void* x, char* to, size_t room, bool& last) noexcept override;
};

// Sluice's own words for an end that carried none (a reset, a missing
// status, a plain HTTP status), in grpc-message's place: what the client's
// error says. The parts are ASCII without '%' (nothing to percent-decode).
inline void set_message(grpc_attempt& a, std::string_view first, std::string_view second = {},
                 std::string_view third = {}) noexcept {
  text_writer w(a.grpc_message, sizeof a.grpc_message);
  w.put(first);
  w.put(second);
  w.put(third);
  a.grpc_message_len = static_cast<uint8_t>(w.p - a.grpc_message);
}

// Shard-local; a part of the shard's server.
class triton_grpc final : public backend_adapter {
 public:
  triton_grpc(shard_context& s, exchange_policy& x) noexcept;
  ~triton_grpc() override;
  triton_grpc(const triton_grpc&) = delete;
  triton_grpc& operator=(const triton_grpc&) = delete;

  // SIGHUP: connections to removed backends close once their streams end.
  void reload(const config::config& next) noexcept;

  // --- backend_adapter ---
  bool prepare(exchange& x, const openai::request_fields& f) noexcept override;
  void start(exchange& x) noexcept override;
  void release(exchange& x) noexcept override;
  void on_timeout(exchange& x) noexcept override;
  void on_sent(exchange& x) noexcept override;

  // The largest gRPC message a backend may send (a non-stream reply's text).
  static constexpr uint32_t k_message_bytes_max = 4u << 20;
  static constexpr int32_t k_stream_window_bytes = 64 << 10;
  static constexpr int32_t k_connection_window_bytes = 16 << 20;

 private:
  struct backend_conns {
    h2_conn* head = nullptr;
    uint32_t open = 0;
  };

  h2_conn* acquire(uint32_t backend, uint32_t open_max) noexcept;
  h2_conn* open_conn(uint32_t backend) noexcept;
  void close_conn(h2_conn* c) noexcept;
  void maybe_free(h2_conn* c) noexcept;
  // Every stream of a connection that failed (reset, EOF, a protocol
  // error): each exchange retries or ends.
  void fail_conn(h2_conn* c, errc why) noexcept;
  void submit_connect(h2_conn* c) noexcept;
  void submit_recv(h2_conn* c) noexcept;
  // What nghttp2 has to send goes out (one send at a time).
  void flush(h2_conn* c) noexcept;
  static void on_connect(shard::completion* op, const io_uring_cqe* cqe);
  static void on_send(shard::completion* op, const io_uring_cqe* cqe);
  static void on_recv(shard::completion* op, const io_uring_cqe* cqe);
  void on_connect_cqe(h2_conn* c, int res) noexcept;
  void on_send_cqe(h2_conn* c, int res) noexcept;
  void on_recv_cqe(h2_conn* c, int res) noexcept;
  // Returns: whether c no longer serves (then handled).
  bool conn_gone(h2_conn* c) noexcept;

 public:
  // A handler's hold ends (conn_hold): c closes or goes if it should.
  void let_go(h2_conn* c) noexcept;

 private:

  // Streams
  bool open_stream(exchange& x, h2_conn* c) noexcept;
  // The exchange lets go of its stream (RST_STREAM CANCEL when still open).
  void detach(exchange& x, bool cancel) noexcept;
  void mark_dirty(exchange& x) noexcept;
  // Whole messages at the front of a DATA chunk, translated where they lie
  // (nghttp2's callback). Returns: the bytes taken; the rest is buffered.
  size_t feed_in_place(exchange& x, const char* data, size_t len) noexcept;
  // After a receive: each stream with news decodes what came.
  void run_dirty(h2_conn* c) noexcept;
  // Decodes the stream's whole messages into the reply and sends it on;
  // at the stream's end, ends the exchange.
  void advance(exchange& x) noexcept;
  // The first message: the backend took the request; the translation starts.
  void start_reply(exchange& x) noexcept;
  bool stage_stream_head(exchange& x) noexcept;
  void take_outcome(exchange& x) noexcept;
  // The batch in mem->frame goes to the client (with the staged head).
  void send_output(exchange& x, bool end_client) noexcept;
  void finish(exchange& x) noexcept;
  void answer_body(exchange& x) noexcept;
  void give_back_stream_window(exchange& x) noexcept;
  // The ends that are not a reply: the stream's gRPC status (retried,
  // answered, or the stream cut with an error event), a reply that cannot
  // be read, an error message, a failure of sluice's own.
  void conclude_status(exchange& x) noexcept;
  void conclude_error(exchange& x, uint16_t status, std::string_view message, bool retryable) noexcept;
  // `status`: a non-stream client's answer (a stream's is its error event).
  void end_stream_with_error(exchange& x, std::string_view error_body, uint16_t status = 502) noexcept;
  void bad_reply(exchange& x, std::string_view why) noexcept;
  void internal_failure(exchange& x) noexcept;

  // The session's reports on an exchange's stream (h2_conn passes them on):
  // they record; the exchange moves on after the receive (run_dirty).
  friend struct h2_conn;
  void on_field(exchange& x, std::string_view name, std::string_view value) noexcept;
  void on_headers_end(exchange& x) noexcept;
  bool on_data(exchange& x, std::string_view bytes) noexcept;
  void on_stream_close(h2_conn* c, exchange& x, uint32_t error_code) noexcept;
  size_t read_request(exchange& x, char* out, size_t room, bool& last) noexcept;

  shard_context& _s;
  exchange_policy& _x;
  std::shared_ptr<const config::config>& _cfg = _s.cfg;
  shard::reactor& _r = _s.r;
  metrics::shard_metrics& _metrics = _s.metrics;
  std::unique_ptr<route::table>& _routes = _s.routes;
  std::unique_ptr<backend_conns[]> _backends;
  size_t _backend_count = 0;
  openai::triton_request_writer _writer;
  std::string _request;  // the framed ModelInferRequest (reused)
};

}  // namespace sluice::proxy
