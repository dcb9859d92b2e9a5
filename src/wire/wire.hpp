#pragma once
// wire (private): the pure parts of the HTTP/1.1 wire work -- which header
// fields are hop-by-hop, where the usage chunk sluice asked for lies in a
// batch of whole chunks, iovec bookkeeping for short sends. No state, no
// ring: unit-tested on their own (tests/unit/wire: linked with this library alone).
#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "conn_memory.hpp"
#include "sluice/http/response.hpp"

namespace sluice::proxy {

// Request fields sluice never forwards: hop-by-hop (RFC 9110 §7.6.1) and
// the ones it sets itself (host, authorization, framing, x-request-id,
// x-forwarded-for).
bool drop_request_header(std::string_view name) noexcept;
// Response fields sluice never passes on: hop-by-hop, and x-request-id
// (sluice sets its own).
bool drop_response_header(std::string_view name) noexcept;
// Returns: whether `name` is listed in a Connection header value (those
// fields are hop-by-hop too).
bool named_in_connection(std::string_view connection, std::string_view name) noexcept;

// Finds the HTTP chunk that carries the usage-only SSE event sluice asked
// for, in whole chunks [p, p + n), starting at `from`.
// Returns: whether [begin, end) is that chunk.
bool find_usage_chunk(const char* p, size_t n, size_t from, size_t& begin, size_t& end) noexcept;

// The payload of whole chunks [p, p + n) -- framing the chunk walker has
// already validated: hex size, extensions, CRLFs -- written to `out` (room:
// n bytes always suffices). Stops at the terminal chunk (`last` set; its
// trailers are not copied). Returns: the payload bytes written.
size_t dechunk(const char* p, size_t n, char* out, bool& last) noexcept;

// Copies the SSE stream [p, p + n) to `out` (room: n bytes) event by event,
// leaving out each whole event whose one data line is a usage-only chunk
// (`"choices":[]` with a usage object: what sluice asked for), whatever its
// JSON spacing and line ends. Bytes after the last whole event are copied
// as they are. Returns: the bytes written; `cut` counts the events left out.
size_t drop_usage_events(const char* p, size_t n, char* out, uint32_t& cut) noexcept;

// --- the usage event cut as it streams (relay: past the largest buffer) ----

// What the start of an SSE event's data says of it: a usage-only chunk
// (the top level's "choices" is an empty array: what sluice asked for with
// include_usage), another event, or not yet known (the member is not in the
// prefix). Structural: strings and nesting are walked, so "choices":[]
// inside a string or a nested object does not count.
enum class prefix_verdict : uint8_t { unknown, usage_only, other };
prefix_verdict classify_event_prefix(std::string_view data) noexcept;
// The top-level "usage" object of an event's data, when it lies whole in
// this prefix (a usage event cut short by the scan's bound keeps its counts
// where the large member comes after them). Returns: empty when not.
std::string_view usage_object_in_prefix(std::string_view data) noexcept;

// The payload of a chunked body read across batches that may begin and end
// anywhere in a chunk (its framing already validated by the walker that
// went over the same bytes). Shard-local; one per response that needs it.
struct dechunk_cursor {
  // Copies the payload of [p, p + n) to `out` (room: n bytes). Returns: the
  // bytes written; `last` set once the terminal chunk's size line was read
  // (nothing after it is payload).
  size_t feed(const char* p, size_t n, char* out, bool& last) noexcept;

 private:
  enum class at : uint8_t { size, ext, data, data_end, done };
  at _at = at::size;
  uint8_t _digits = 0;
  uint8_t _end_left = 0;  // of the CRLF after a chunk's data
  uint64_t _size = 0;     // the size being read, then the data left in the chunk
};

// Copies an SSE payload event by event, leaving out every usage-only event
// (classify_event_prefix on its first data line) when told to, whatever its
// size: an event's first bytes are held until they tell, then it goes out
// as it comes, or is dropped as it comes. Undecided after k_hold_bytes_max,
// an event goes out. Nothing after the `[DONE]` event goes out (the
// client's response ends there). Shard-local; one per response that needs
// it, fed its payload in order from an event boundary.
class usage_event_filter {
 public:
  static constexpr size_t k_hold_bytes_max = 16u << 10;
  // Room `out` needs for n input bytes: n + k_hold_bytes_max.
  // Returns: the bytes written.
  size_t feed(const char* p, size_t n, char* out) noexcept;
  uint32_t dropped() const noexcept { return _dropped; }
  bool done() const noexcept { return _done; }  // the [DONE] event went out
  // For the next response (from an event boundary); `drop_usage`: leave
  // the usage-only events out.
  void reset(bool drop_usage = true) noexcept {
    _drop_usage = drop_usage;
    _done = _is_done = _closed = false;
    _mode = mode::between;
    _line_empty = true;
    _after_cr = false;
    _last_kept = true;
    _dropped = 0;
    _held = 0;
  }

 private:
  enum class mode : uint8_t { between, holding, keep, drop };
  // Decides the held event once its bytes tell (or its end or the bound
  // came): returns the bytes of it written to out.
  size_t decide(char* out, bool ended) noexcept;
  mode _mode = mode::between;
  bool _line_empty = true;  // nothing of the current line yet
  bool _after_cr = false;   // the last byte was a CR (an LF next ends nothing more)
  bool _last_kept = true;   // the last event went out (a CRLF's LF after it goes with it)
  bool _drop_usage = true;
  bool _is_done = false;    // the event going out is [DONE]
  bool _done = false;       // [DONE] went out whole: nothing more does
  bool _closed = false;     // and the byte after it came: every later feed is dropped
  uint32_t _dropped = 0;
  size_t _held = 0;
  char _hold[k_hold_bytes_max];
};

// Appends `s` to `b` (the caller reserved the room). An empty view may
// have a null data(), which memcpy must not get.
inline void append(byte_buf& b, std::string_view s) noexcept {
  if (s.empty()) return;
  __builtin_memcpy(b.data + b.len, s.data(), s.size());
  b.len += static_cast<uint32_t>(s.size());
}

// Field lines copied as they came (name through CRLF; the pre-scan proved
// each one `name:value` CRLF): a run of adjacent kept lines is one copy,
// not four per field. keep() each line that goes on, flush() before
// anything else is appended; `b` has room for every kept line.
class line_runs {
 public:
  void keep(byte_buf& b, std::string_view line) noexcept {
    if (_len != 0 && _begin + _len == line.data()) {
      _len += line.size();
      return;
    }
    flush(b);
    _begin = line.data();
    _len = line.size();
  }
  void flush(byte_buf& b) noexcept {
    if (_len == 0) return;
    __builtin_memcpy(b.data + b.len, _begin, _len);
    b.len += static_cast<uint32_t>(_len);
    _len = 0;
  }

 private:
  const char* _begin = nullptr;
  size_t _len = 0;
};

// Drops the first `sent` bytes from an iovec array in place (after a short
// send). Returns: whether bytes remain to be sent.
inline bool advance_iov(iovec* iov, uint8_t& count, size_t sent) noexcept {
  uint8_t i = 0;
  while (i < count && sent >= iov[i].iov_len) {
    sent -= iov[i].iov_len;
    ++i;
  }
  if (i == count) {
    count = 0;
    return false;
  }
  uint8_t k = 0;
  for (uint8_t j = i; j < count; ++j) iov[k++] = iov[j];
  iov[0].iov_base = static_cast<char*>(iov[0].iov_base) + sent;
  iov[0].iov_len -= sent;
  count = k;
  return true;
}

// Prepares the send of iov[0..count): one piece is a plain send, without
// the msghdr and iovec the kernel would copy in; more go as a sendmsg of
// `msg` (which must live until the completion).
inline void prep_send_iov(io_uring_sqe* s, int fd, iovec* iov, uint8_t count, msghdr& msg) noexcept {
  if (count == 1) {
    io_uring_prep_send(s, fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
    return;
  }
  msg = msghdr{};
  msg.msg_iov = iov;
  msg.msg_iovlen = count;
  io_uring_prep_sendmsg(s, fd, &msg, MSG_NOSIGNAL);
}

// An error body in OpenAI's shape (what every codec's answer_error sends).
// Returns: its length in `out`.
size_t write_local_error(char* out, size_t cap, std::string_view message, std::string_view type,
                         std::string_view param, std::string_view code) noexcept;

// --- replies sluice writes itself (a translated protocol) --------------------

// The client's head for a translated stream: sluice's own fields, not the
// backend's (its request ids and rate-limit headers stay behind).
http::response_head translated_stream_head() noexcept;

// A translated batch in `f`: its payload after k_batch_room bytes kept
// free for the chunk size line. Returns: the one piece that goes out -- the
// payload framed as a chunk (and the terminal chunk after it when
// `end_client`), or bare when `dechunk` (an HTTP/1.0 client, whose end is
// the close) -- with len 0 when there is nothing to send. `f` must have 7
// bytes of room past its len.
inline constexpr uint32_t k_batch_room = 20;
iovec frame_translated_batch(byte_buf& f, bool dechunk, bool end_client) noexcept;

}  // namespace sluice::proxy
