#pragma once
// http: Server-Sent Events scanner over a de-chunked text/event-stream body.
// Bounded: one event is buffered up to k_event_bytes_max; a longer event is
// reported with `truncated` set (the bytes still flow to the client; only
// the scan copy is cut). No allocation.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::http {

struct sse_event {
  std::string_view data;   // the `data:` field value(s) of one event, lines joined by '\n'
  bool truncated = false;
};

// Shard-local, one per streaming response.
class sse_scanner {
 public:
  static constexpr size_t k_event_bytes_max = 16u << 10;

  using callback = void (*)(void* ctx, const sse_event& ev);
  sse_scanner(callback cb, void* ctx) noexcept : _cb(cb), _ctx(ctx) {}

  void reset() noexcept;
  // Feeds body bytes in any split; calls back once per complete event
  // (an event ends at an empty line: "\n\n", "\r\n\r\n" or "\r\r").
  void feed(const char* data, size_t len) noexcept;
  uint64_t events() const noexcept { return _events; }

 private:
  callback _cb;
  void* _ctx;
  uint64_t _events = 0;
  size_t _len = 0;
  bool _truncated = false;
  char _line_state = 0;     // tracks CR/LF across feeds
  bool _line_start = true;
  char _buf[k_event_bytes_max];
};

}  // namespace sluice::http
