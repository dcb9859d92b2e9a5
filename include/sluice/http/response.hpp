#pragma once
// http: upstream (backend) response parsing with llhttp in response mode
// (a plain head it is known to read the same way is read without it).
// The proxy forwards the backend's body bytes unchanged (chunk framing
// included); this parser only finds where the head ends, where the message
// ends, and hands the de-chunked payload to a sink for scanning (SSE events,
// usage). A malformed backend reply is an error (502), never passed through.
#include <llhttp.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sluice/core/result.hpp"
#include "sluice/http/chunked.hpp"
#include "sluice/http/request.hpp"

namespace sluice::http {

// The most header fields a backend's response head may have.
inline constexpr uint16_t k_response_headers_max = 64;

struct response_head {
  uint16_t status = 0;
  uint8_t version_minor = 1;
  bool keep_alive = true;          // the backend connection may be reused
  bool chunked = false;
  bool has_content_length = false;
  uint64_t content_length = 0;
  bool event_stream = false;       // Content-Type: text/event-stream
  uint32_t head_bytes = 0;         // bytes up to and including the empty line
  std::string_view reason;
  std::string_view content_type;
  uint16_t header_count = 0;
  std::string_view field_lines;    // every field line with its CRLF; see header_fields
  field_index field_refs;          // the pre-scan's index of field_lines (n = 0: none, they are walked)

  header_fields fields() const noexcept { return header_fields(field_lines, field_refs); }
};

namespace detail {
struct skip_pattern;  // sse.hpp
}

// Receives the de-chunked body payload, piece by piece, in order.
struct body_sink {
  void (*on_data)(void* ctx, const char* data, size_t len) = nullptr;
  void* ctx = nullptr;
  // Chunked bodies: a chunk ended (its data and CRLF) just before `at`,
  // after its data went to on_data. Optional.
  void (*on_chunk_end)(void* ctx, const char* at) = nullptr;
  // With on_chunk_end: a chunk whole in one call, its data and its end in
  // one call (the common case of an event stream). Optional.
  void (*on_chunk)(void* ctx, const char* data, size_t len, const char* end) = nullptr;
  // Chunks that need no scan of their own (an event stream whose backend
  // writes one event per chunk): while *skip_ok, a chunk whole in one call
  // whose payload starts with skip_head, ends with skip_tail (its last two
  // bytes the line ends that end the event) and holds no other CR or LF --
  // one event of one data line -- is only counted, and each run of such
  // chunks goes to on_skipped(ctx, chunks, end of the last) before any other
  // call and at the end of the walk. The sink's callbacks keep *skip_ok.
  // Optional (null: every chunk is handed on).
  const bool* skip_ok = nullptr;
  std::string_view skip_head, skip_tail;
  void (*on_skipped)(void* ctx, uint32_t chunks, const char* end) = nullptr;
  // skip_head and skip_tail as detail::make_skip_pattern() prepares them,
  // made once by the caller (its head and tail are constants); null: made
  // per call, or none (a pattern it cannot hold).
  const detail::skip_pattern* skip_pattern = nullptr;
};

struct body_status {
  errc error = errc::ok;   // ok, or upstream_protocol
  size_t consumed = 0;     // raw bytes used; when complete, the end of the message
  bool complete = false;   // the terminal chunk (or Content-Length end) was reached
  // Chunked bodies: the offset just past the last chunk (data + CRLF) that
  // ended in this call, or 0 when none did. The proxy forwards whole chunks
  // only when it must be able to cut one out (the injected usage chunk).
  size_t chunk_end = 0;
};

// Shard-local, one per upstream exchange; reset() before each response.
class response_parser {
 public:
  response_parser() noexcept;
  response_parser(const response_parser&) = delete;
  response_parser& operator=(const response_parser&) = delete;

  // `head_request`: the request was HEAD (no body follows).
  void reset(bool head_request = false) noexcept;

  // Tests: every head through llhttp (the default reads the plain ones
  // without it, the same facts).
  void set_llhttp_only(bool on) noexcept { _llhttp_only = on; }
  // Whether llhttp parsed the head since the last reset() (tests).
  bool llhttp_ran() const noexcept { return _llhttp_used; }

  // Like request_parser::parse_head, for a status line + headers; 1xx
  // interim responses are an error here (sluice never sends Expect upstream).
  // Errors carry errc::upstream_protocol. Limit: 64 KiB head, 64 headers.
  parse_status parse_head(const char* data, size_t len, response_head& out) noexcept;

  // After parse_head() returned ok: feed raw body bytes in order, as they
  // arrive, starting with the first not yet consumed. Stops at the end of
  // the message (`complete`, `consumed` = the offset just past the terminal
  // chunk and trailers, or the Content-Length end). Bytes past the end are
  // not consumed. A HEAD answer, 204, 304 or Content-Length: 0 is complete
  // at once with consumed 0. Malformed framing (including a terminal chunk
  // not ending in CRLF CRLF) is upstream_protocol and sticky.
  body_status feed_body(const char* data, size_t len, const body_sink& sink) noexcept;

  // A body delimited by the connection close (no length, not chunked) is
  // complete at EOF; any other body is truncated at EOF. Returns: whether
  // the message was complete.
  bool finish_at_eof() noexcept;

 private:
  static int on_status(llhttp_t*, const char*, size_t);
  static const llhttp_settings_t* settings() noexcept;
  static int on_headers_complete(llhttp_t*);
  static int on_body(llhttp_t*, const char*, size_t);
  static int on_message_complete(llhttp_t*);
  // What check_fields() notes when llhttp has not parsed the head.
  struct own_facts {
    uint16_t connections = 0;     // Connection fields
    std::string_view connection;  // the first one's value
    bool ask_llhttp = false;      // Upgrade, Proxy-Connection, or a Connection not read here
  };
  void start_head(const char* data, response_head& out) noexcept;
  // The status line in a form llhttp is known to read the same way: sets
  // the status, version and reason; false: llhttp's to read.
  bool read_status_line(const char* data) noexcept;
  // own: null after llhttp parsed the head (its status and flags are read).
  parse_status check_fields(own_facts* own = nullptr) noexcept;

  llhttp_t _parser;
  detail::head_scan_state _scan;
  field_index _index;             // the field lines as the scan finds them; copied into the head
  response_head* _head = nullptr;
  const body_sink* _sink = nullptr;
  parse_status _pending{errc::need_more, 0, {}};  // sticky once ok or failed
  bool _head_request = false;
  bool _head_done = false;
  bool _message_done = false;
  bool _failed = false;
  bool _paused_at_head = false;    // llhttp paused in on_headers_complete: resume first
  bool _chunked = false;
  bool _until_close = false;       // body delimited by the connection close
  chunk_walker _chunk;             // chunked bodies: walked here, not by llhttp
  bool _llhttp_only = false;
  bool _llhttp_used = true;        // since its last init: reset() inits it again
  bool _own_framing = false;       // the head was read without llhttp: so is the body
  uint64_t _remaining = 0;         // _own_framing, Content-Length: body bytes still to come
};

}  // namespace sluice::http
