#pragma once
// http: Server-Sent Events scanner over a de-chunked text/event-stream body.
// Zero-copy for the common case: an event with one data line that lies whole
// in one feed() call is reported in place. Otherwise it is assembled in a
// bounded buffer of k_event_bytes_max, allocated on the first such event
// and kept; a longer one is reported with `truncated` set (the bytes still
// flow to the client; only the scan copy is cut) -- unless the stream's
// events must be read whole (set_event_limit: a stream sluice renders, or
// whose usage lies in a large last event): then the buffer grows by
// doubling up to that limit for the event, and goes back to its size after it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace sluice::http {

// Whether [p, p + n) holds a CR or an LF (a line end of the event stream).
// AVX2 where the CPU has it (found at start), else SSE2.
bool has_line_end(const char* p, size_t n) noexcept;
namespace detail {
bool line_end_sse2(const char* p, size_t n) noexcept;  // the SSE2 one, for the tests
// has_line_end's implementation for this CPU: a loop that asks per chunk
// calls it once, not through has_line_end too.
using line_end_fn = bool (*)(const char* p, size_t n) noexcept;
line_end_fn line_end_impl() noexcept;

// body_sink's skip test (a chunk that is one plain event: its payload
// starts with `head`, ends with `tail`, and holds no CR or LF but the
// tail's last two bytes), prepared once per walk as byte patterns so that
// each chunk costs a few vector compares and one pass for CR and LF.
struct skip_pattern {
  alignas(16) char head[16] = {};  // the head, zero-padded
  alignas(32) char tail[32] = {};  // the tail, right-aligned
  alignas(16) unsigned char head_mask[16] = {};  // 0xff at the bytes of head[] compared
  alignas(32) unsigned char tail_mask[32] = {};  // of tail[]
  uint8_t head_n = 0, tail_n = 0;
  uint8_t scan_cut = 2;            // payload bytes at the end the CR/LF pass skips (the tail's, when
                                   // only its last two are line ends)
};
// Prepares `out` for head <= 16 bytes and 2 <= tail <= 32 bytes ending in
// "\n\n" (what the relay's streams use). Returns: false for any other
// pattern (the walk then tests bytes as before).
bool make_skip_pattern(std::string_view head, std::string_view tail, skip_pattern& out) noexcept;
// Whether the payload p[0, n) passes, for n >= k_skip_pattern_min (the
// vector loads stay inside it). Exact: the same answer as comparing head
// and tail byte by byte and has_line_end(p + head_n, n - head_n - 2).
inline constexpr size_t k_skip_pattern_min = 48;
using skip_fn = bool (*)(const skip_pattern& s, const char* p, size_t n) noexcept;
skip_fn skip_impl() noexcept;   // a chunk at a time (SSE2); AVX2's is the run's, below
bool skip_sse2(const skip_pattern& s, const char* p, size_t n) noexcept;  // for the tests
// The skip test over a run of whole chunks (chunk_walker::walk's `run`):
// from data[i, len), each chunk whole_chunk_at reads whose payload of at
// least k_skip_pattern_min bytes passes the test; body_left and
// framing_left (what the limits leave) are taken down by what it takes.
// Stops before the first that is not such a chunk. Takes none where the
// limits leave less than `len` (the walk then tests each chunk against
// them). Returns: where the run ended (i when it took none), `chunks`
// counted up by the chunks taken.
using skip_run_fn = size_t (*)(const skip_pattern& s, const char* data, size_t len, size_t i, uint64_t& body_left,
                               uint64_t& framing_left, uint32_t& chunks) noexcept;
// With AVX2 (the test inlined in the loop); null where the CPU has not,
// and the walk tests chunk by chunk with skip_impl().
skip_run_fn skip_run_impl() noexcept;
}

struct sse_event {
  std::string_view data;   // the `data:` field value(s) of one event, lines joined by '\n'
  bool truncated = false;
  // `data` points into the bytes given to feed() (not a copy): the event
  // had one data line and lay whole in that call, as nearly every event
  // of a stream does.
  bool in_place = false;
};

// Shard-local, one per streaming response.
class sse_scanner {
 public:
  static constexpr size_t k_event_bytes_max = 16u << 10;

  using callback = void (*)(void* ctx, const sse_event& ev);
  sse_scanner(callback cb, void* ctx) noexcept : _cb(cb), _ctx(ctx) {}

  // Forgets the stream; the event limit goes back to k_event_bytes_max.
  void reset() noexcept;
  // Events up to `bytes` (at least k_event_bytes_max) are assembled whole.
  void set_event_limit(size_t bytes) noexcept { _limit = bytes > k_event_bytes_max ? bytes : k_event_bytes_max; }
  // Feeds body bytes in any split; calls back once per complete event
  // (an event ends at an empty line: "\n\n", "\r\n\r\n" or "\r\r").
  // As the WHATWG EventSource parser does: several data lines are joined with
  // '\n', one space after "data:" is dropped, comments (":...") and the
  // event/id/retry fields are skipped, and an event without data is not
  // reported. `ev.data` is valid during the callback only.
  void feed(const char* data, size_t len) noexcept;
  uint64_t events() const noexcept { return _events; }
  // Returns: whether the bytes fed so far end between two events (nothing
  // of a next event seen yet): a cut there splits no event.
  bool between_events() const noexcept {
    return _state == line_state::start && !_in_event && !_after_cr;
  }

 private:
  // Where the scan stands within the current line.
  enum class line_state : uint8_t {
    start,        // first byte of a line
    name,         // reading the field name
    value_first,  // just after "data:": one optional space
    value,        // inside a data value
    skip,         // a comment or a field sluice ignores (event, id, retry, ...)
  };
  void end_line(char eol) noexcept;
  void begin_data_line() noexcept;
  void append(const char* data, size_t len) noexcept;
  void copy_view() noexcept;
  bool have_buffer() noexcept;
  // Room for `need` bytes in all (up to _limit): the buffer doubled, its
  // bytes kept. Returns: false at the limit or out of memory.
  bool grow(size_t need) noexcept;
  void dispatch() noexcept;

  callback _cb;
  void* _ctx;
  uint64_t _events = 0;
  size_t _len = 0;            // bytes of _buf holding the event's data
  const char* _view = nullptr;  // the event's data in place (in the current feed() bytes), else null
  size_t _view_len = 0;
  bool _truncated = false;
  bool _has_data = false;     // the event has a data line (else nothing is dispatched)
  bool _after_cr = false;     // the last byte was CR: an LF right after it ends nothing
  bool _in_event = false;     // a line of the current event was seen (any field, a comment)
  line_state _state = line_state::start;
  uint8_t _name_len = 0;
  char _name[5] = {};         // enough to tell "data" from anything else
  std::unique_ptr<char[]> _buf;  // _cap bytes: k_event_bytes_max, made on first need; more only for one event
  size_t _cap = k_event_bytes_max;
  size_t _limit = k_event_bytes_max;
};

}  // namespace sluice::http
