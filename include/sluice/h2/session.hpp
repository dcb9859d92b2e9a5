#pragma once
// h2: HTTP/2 server sessions for the client edge (libnghttp2 1.52), with no
// I/O of their own. An h2::server_session keeps one nghttp2 server session
// and a fixed-size output ring; the client codec that owns the connection
// does every recv and send through the shard's io_uring:
//
//   recv CQE (plaintext, after TLS if any)
//                          -> session.feed(bytes, now_ms)  events to the owner,
//                             synchronously, from inside feed (request heads,
//                             body pieces, resets, GOAWAY); give the provided
//                             buffer back after feed returns
//   owner answers          -> submit_response(), send_body() (from inside an
//                             event or later, e.g. from a backend's CQE)
//   after ANY call         -> if session.has_output():
//                               v = session.pending_output();
//                               send SQE on v (v stays put, see below)
//   send CQE (res = n > 0) -> session.consume_output(n): frees ring space,
//                             which the session refills at once (more DATA
//                             as the client's windows allow); send again
//   session.done()         -> close the socket (after the last send CQE)
//
// Output lifetime, for io_uring: pending_output() views bytes inside the
// session's output ring. They do not move and are not overwritten until
// consume_output() releases them: every later call only appends behind
// them. A send SQE may point at the view until its CQE arrives, as long as
// the session stays alive meanwhile (it cannot move: nghttp2 holds its
// address). Keep one send in flight: until consume_output(), pending_output()
// shows the same bytes again.
//
// Nothing here reads a clock: `now_ms` comes with each feed (the rapid-reset
// window). The owner's events run inside the session's calls; an event may
// call any submit_* / send_body / reset_stream / consume, but must not
// destroy the session (do that after the call returns, when done()).
//
// Memory: every allocation of nghttp2's and of ours (stream states, the
// header copies, the output ring) goes through a counting allocator with a
// per-connection cap (options::memory_bytes_max). Past the cap the
// allocation fails and the connection ends with GOAWAY ENHANCE_YOUR_CALM:
// a client cannot make one connection hold more than the cap.
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sluice/http/request.hpp"

struct nghttp2_session;

namespace sluice::h2 {

// RFC 9113 §7 error codes (the ones sluice sends or reports).
enum error_code : uint32_t {
  no_error = 0x0,
  protocol_error = 0x1,
  internal_error = 0x2,
  flow_control_error = 0x3,
  stream_closed = 0x5,
  frame_size_error = 0x6,
  refused_stream = 0x7,
  cancel = 0x8,
  compression_error = 0x9,
  enhance_your_calm = 0xb,
};

struct options {
  // SETTINGS_MAX_CONCURRENT_STREAMS. A stream past it: RST_STREAM
  // REFUSED_STREAM while the SETTINGS is unacknowledged, GOAWAY
  // PROTOCOL_ERROR after (nghttp2).
  uint32_t max_concurrent_streams = 100;
  // SETTINGS_INITIAL_WINDOW_SIZE (the request body a stream may send before
  // the owner consume()s it) and the connection's receive window. Sized for
  // chat bodies and for SSE.
  uint32_t stream_window_bytes = 64u << 10;
  uint32_t connection_window_bytes = 1u << 20;
  // SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 §6.5.2: names + values + 32
  // per field), enforced here: a request over it is answered 431 by the
  // session itself. Decoded lists past 4x the limit (an HPACK bomb) end
  // the connection with ENHANCE_YOUR_CALM.
  uint32_t header_list_bytes_max = 32u << 10;
  // SETTINGS_HEADER_TABLE_SIZE (our HPACK decoder's dynamic table) and the
  // table our encoder uses for responses.
  uint32_t hpack_table_bytes = 4096;
  uint32_t hpack_encoder_table_bytes = 4096;
  // Rapid reset (CVE-2023-44487) and server-provoked resets (CVE-2025-8671,
  // "MadeYouReset"): client RST_STREAMs plus RST_STREAMs the server had to
  // send for a client's error on a stream, together, more than
  // resets_per_window_max within reset_window_ms -> GOAWAY ENHANCE_YOUR_CALM.
  uint32_t resets_per_window_max = 100;
  uint32_t reset_window_ms = 1000;
  // CONTINUATION frames after one HEADERS (CVE-2024-27316 family; counted
  // by the session, and by nghttp2's backported limit where it has one)
  // -> GOAWAY ENHANCE_YOUR_CALM.
  uint32_t max_continuations = 8;
  // Entries in one SETTINGS frame (nghttp2_option_set_max_settings).
  uint32_t max_settings_entries = 32;
  // SETTINGS ACKs and PING ACKs queued and not yet sent: a client that
  // sends SETTINGS or PINGs and does not read -> GOAWAY ENHANCE_YOUR_CALM.
  uint32_t max_outbound_acks = 1000;
  // PING and SETTINGS frames (not ACKs) from a client that does read its
  // ACKs: more than this within control_window_ms -> GOAWAY
  // ENHANCE_YOUR_CALM (nghttp2 1.52 has no rate of its own for them).
  uint32_t control_frames_per_window_max = 200;
  uint32_t control_window_ms = 1000;
  // Everything one connection may allocate (nghttp2's state, HPACK tables,
  // queued frames, our stream states and header copies, the output ring).
  uint32_t memory_bytes_max = 4u << 20;
  // The output ring (allocated once). Must hold a whole frame header.
  uint32_t output_buffer_bytes = 64u << 10;
};

// What the defences saw. Monotonic, per connection.
struct counters {
  uint64_t streams_opened = 0;          // request heads reported to the owner
  uint64_t streams_refused = 0;         // RST_STREAM REFUSED_STREAM (over max_concurrent_streams)
  uint64_t client_resets = 0;           // RST_STREAM frames from the client
  uint64_t provoked_resets = 0;         // RST_STREAMs sent for a client's error on a stream
  uint64_t malformed_requests = 0;      // heads reset PROTOCOL_ERROR by the session (part of provoked_resets)
  uint64_t header_lists_too_large = 0;  // requests answered 431
  uint64_t rapid_reset_goaways = 0;     // the reset window overflowed
  uint64_t continuation_floods = 0;
  uint64_t ack_floods = 0;              // SETTINGS / PING ACKs piled up
  uint64_t control_floods = 0;          // PING / SETTINGS over control_frames_per_window_max
  uint64_t hpack_bombs = 0;             // decoded header list past 4x the limit
  uint64_t memory_refusals = 0;         // allocations refused by memory_bytes_max
  uint64_t invalid_frames = 0;          // frames nghttp2 rejected (stream or connection errors)
  uint64_t connection_errors = 0;       // GOAWAYs sent with an error code
};

using field = http::header;

// A request head, complete (END_HEADERS seen and checked: pseudo-headers as
// RFC 9113 §8.3.1 wants, names lower case, no connection-specific fields,
// a content-length that matches the DATA -- nghttp2's HTTP messaging --
// and no second authorization, content-type, content-length, host,
// x-session-id or x-request-id -- ours, as http::request_parser).
//
// Every view (here and in `head`, and the field lines head.fields() walks)
// points into the stream's own copy: valid until the owner's
// on_stream_closed for this stream returns, across feeds.
struct request {
  int32_t stream_id = 0;
  std::string_view method;
  std::string_view scheme;
  std::string_view authority;  // :authority, else the host field
  std::string_view path;       // :path, the target as sent
  // The same request as HTTP/1.1 would have given it, for a codec that
  // hands the exchange an http::request_head: version 2.0, keep_alive,
  // never chunked; host = authority; field_lines holds the regular fields
  // as "name:value\r\n" lines (pseudo-headers left out).
  http::request_head head;
  std::string_view expect;     // the expect field as sent ("" when none)
  bool end_stream = false;     // no body follows (END_STREAM on the HEADERS)
};

// How a stream ended, for on_stream_closed.
enum class close_cause : uint8_t {
  done,              // the response went out whole (END_STREAM sent) and the request ended
  client_reset,      // RST_STREAM from the client (error_code is the client's)
  server_reset,      // reset_stream() by the owner, or by the session for the client's error
  connection_closed, // the connection ended (GOAWAY, fatal error) with the stream open
};

// Whether a response field's value is one no later response repeats (the
// request id, openai-processing-ms, the key's remaining quota and its
// reset): submit_response() sends those as literals never indexed, so the
// HPACK encoder's table keeps the fields that do repeat. `name` lower case.
bool unique_per_response(std::string_view name) noexcept;
// Returns: the data bytes of the whole chunks in p[0, n), up to a terminal
// chunk or the first thing that is not a whole chunk (http::scan_whole_chunks:
// bounded, whatever the bytes).
size_t chunked_payload_bytes(const char* p, size_t n) noexcept;

// The events of one connection. Implemented by the client codec.
class session_owner {
 public:
  virtual ~session_owner() = default;
  // A stream's request head is complete. Answer with submit_response() now
  // or later.
  virtual void on_request_head(const request& r) = 0;
  // A piece of the request body. `bytes` views the buffer given to feed():
  // valid only during this call (copy what is kept). Give the window back
  // with consume(stream_id, bytes.size()) as the bytes are used. The end of
  // the body comes as a call with end_stream = true (bytes may be empty).
  virtual void on_request_data(int32_t stream_id, std::span<const char> bytes, bool end_stream) = 0;
  // Every piece given to send_body() so far has been copied into DATA
  // frames: the caller's buffers are free (an exchange is "sent").
  virtual void on_body_drained(int32_t stream_id) = 0;
  // The stream is over (its last event; only for streams whose head was
  // reported). After this returns, its request views are gone.
  virtual void on_stream_closed(int32_t stream_id, close_cause cause, uint32_t code) = 0;
  // A GOAWAY was received (from_client) or sent: no new streams after it;
  // with an error code the connection ends (done() once the output drains).
  virtual void on_goaway(uint32_t code, bool from_client) = 0;
};

// Shard-local, one per downstream HTTP/2 connection: from the preface (ALPN
// h2, or h2c prior knowledge) until the socket is closed. Neither copyable
// nor movable (nghttp2 and the allocator hold its address).
class server_session {
 public:
  // Submits the server's SETTINGS (in pending_output() at once). `owner`
  // must outlive the session. failed() when nghttp2 could not be set up
  // (memory_bytes_max too small).
  server_session(session_owner& owner, const options& o);
  ~server_session();  // calls no owner event
  server_session(const server_session&) = delete;
  server_session& operator=(const server_session&) = delete;

  // Hands the client's bytes to nghttp2, starting with the 24-byte client
  // preface. Returns: false when the connection is over (a GOAWAY with an
  // error code, now or before; later bytes are not read): send what
  // pending_output() holds (the GOAWAY), then close.
  bool feed(std::span<const char> bytes, uint64_t now_ms);

  // A response head for a stream whose head was reported. `end_stream`: no
  // body (HEADERS with END_STREAM); else the body follows with send_body().
  // nghttp2 copies the fields; unique_per_response() ones are never
  // indexed. Returns: false when the stream is gone, was
  // already answered, or out of memory.
  bool submit_response(int32_t stream_id, uint16_t status, std::span<const field> fields, bool end_stream);
  // Queues body pieces read from the caller's buffers, which must stay until
  // on_body_drained or on_stream_closed (at most 8 pieces waiting per
  // stream). The pieces go
  // out as DATA frames as the client's stream and connection windows open;
  // pieces queued together share frames. `end_stream`: these are the last
  // (may be empty). Returns: false when the stream is gone, has no
  // response head, already ended, or the pieces do not fit.
  // `chunked`: bit i set when piece i holds whole chunks of HTTP/1.1
  // framing (a backend's chunked body as it came): only the chunks' data
  // goes out, copied from the piece into DATA frames (a terminal chunk ends
  // the piece's data).
  // `queued` (optional): set to the bytes these pieces add to the body.
  bool send_body(int32_t stream_id, std::span<const iovec> pieces, bool end_stream, uint8_t chunked = 0,
                 size_t* queued = nullptr);
  // An interim 100 response (HEADERS, :status 100) for a request that sent
  // `expect: 100-continue`: its client may send the body now. Returns:
  // false when the stream is gone or already answered.
  bool submit_continue(int32_t stream_id);
  // RST_STREAM with `code` (e.g. cancel: the backend failed mid-response).
  bool reset_stream(int32_t stream_id, uint32_t code);
  // The owner used n bytes of a stream's request body: the window opens again
  // (WINDOW_UPDATEs when half of it is used).
  void consume(int32_t stream_id, size_t n);
  // Graceful close: GOAWAY NO_ERROR naming the last stream seen; streams in
  // flight finish, then done().
  void drain();

  // Bytes to send: the first contiguous piece of the output ring (the ring
  // may wrap: after consume_output() there may be more).
  std::span<const char> pending_output() const noexcept;
  bool has_output() const noexcept { return _out_size != 0; }
  size_t output_size() const noexcept { return _out_size; }
  // Releases the first n bytes of pending_output() after their send
  // completed (n <= pending_output().size()), and refills the ring.
  void consume_output(size_t n);

  // Returns: true when nothing more will be read or sent: close the socket.
  bool done() const noexcept;
  bool failed() const noexcept { return _fatal; }
  // The error code of the GOAWAY sent, when one was (else no_error).
  uint32_t goaway_code() const noexcept { return _goaway_code; }
  bool goaway_sent() const noexcept { return _goaway_sent; }
  // A static reason for the end, for logs ("" while it runs).
  std::string_view reason() const noexcept { return _reason; }

  const counters& stats() const noexcept { return _counters; }
  size_t memory_bytes() const noexcept { return _mem_used; }
  size_t memory_bytes_peak() const noexcept { return _mem_peak; }
  size_t open_streams() const noexcept { return _streams_live; }

  // Internal (called from the nghttp2 callbacks in src/h2/session.cpp).
  struct stream_state;
  struct callbacks;

 private:
  friend struct callbacks;
  void* alloc(size_t n) noexcept;
  void dealloc(void* p) noexcept;
  void* realloc_bytes(void* p, size_t n) noexcept;
  static void* mem_malloc(size_t n, void* self);
  static void mem_free(void* p, void* self);
  static void* mem_calloc(size_t count, size_t n, void* self);
  static void* mem_realloc(void* p, size_t n, void* self);

  bool over() const noexcept;
  void fill_output();
  void pump();
  size_t append_output(const uint8_t* p, size_t n) noexcept;
  void fatal(uint32_t code, std::string_view why) noexcept;
  void fatal_from_nghttp2(long rv) noexcept;
  void count_reset() noexcept;
  void close_all_streams(uint32_t code);
  stream_state* find(int32_t stream_id) const noexcept;
  void free_stream(stream_state* st) noexcept;
  void deliver_drained();

  session_owner& _owner;
  options _opt;
  nghttp2_session* _session = nullptr;
  counters _counters;
  // The output ring: [_out_head, _out_head + _out_size) modulo _out_cap.
  char* _out = nullptr;
  uint32_t _out_cap = 0;
  uint32_t _out_head = 0;
  uint32_t _out_size = 0;
  // The rest of the chunk nghttp2_session_mem_send returned that did not fit
  // in the ring: valid until the next mem_send, so it is copied first.
  const uint8_t* _carry = nullptr;
  size_t _carry_len = 0;
  stream_state* _streams = nullptr;   // every stream with our state (a list)
  stream_state* _drained = nullptr;   // streams owed on_body_drained (a list)
  size_t _streams_live = 0;
  size_t _mem_used = 0;
  size_t _mem_peak = 0;
  uint64_t _now_ms = 0;
  uint64_t _reset_window_start_ms = 0;
  uint32_t _resets_in_window = 0;
  uint64_t _control_window_start_ms = 0;
  uint32_t _control_in_window = 0;
  uint32_t _continuations = 0;  // CONTINUATIONs since the last HEADERS
  uint32_t _depth = 0;       // inside an nghttp2 call: no mem_send now
  bool _filling = false;
  bool _refill = false;
  bool _fatal = false;       // nghttp2 is done with; our own GOAWAY goes out
  bool _fatal_goaway_written = false;
  bool _goaway_sent = false;
  bool _goaway_announced = false;
  bool _closed_all = false;
  int32_t _max_stream_id = 0;   // the highest stream id a client HEADERS named
  // The streams we sent RST_STREAM for last: a client's trailers may still
  // be on their way (ignored, not an error).
  int32_t _recent_resets[16] = {};
  uint32_t _recent_reset_next = 0;
  int32_t _last_stream_id = 0;  // for our GOAWAY, kept from nghttp2 before it goes
  uint32_t _fatal_code = 0;  // set by a callback that returns NGHTTP2_ERR_CALLBACK_FAILURE
  uint32_t _goaway_code = 0;
  std::string_view _reason;
};

// Edge detection for the plaintext listener (h2c with prior knowledge,
// RFC 9113 §3.3): the 24-byte client preface "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".
enum class sniff : uint8_t { no, yes, need_more };
// Returns: yes when the bytes start with the whole preface; need_more while
// they are a proper prefix of it; no otherwise (an HTTP/1.1 request).
sniff looks_like_h2_preface(std::span<const char> bytes) noexcept;
inline constexpr std::string_view k_client_preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

}  // namespace sluice::h2
