// SSE scanning of the de-chunked body of a streaming response. Runs per body
// piece on the hot path: line ends are found with one SIMD pass (a whole
// event) or memchr (the line state machine), never a byte-by-byte loop over
// the payload, and an event's data is copied only when it has several
// lines or spans two pieces.
#include "sluice/http/sse.hpp"

#include <cstring>
#include <new>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sluice::http {

namespace {

// Whether [p, p + n) holds a CR or an LF: one pass for both, 64 bytes a
// turn (an event's data is ~200 bytes). In place of a memchr for each,
// which read the bytes twice: 6.1 against 8.2 ns per vLLM content event.
bool has_line_end(const char* p, size_t n) noexcept {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i lf = _mm_set1_epi8('\n');
  const __m128i cr = _mm_set1_epi8('\r');
  const auto hits = [&](size_t at) noexcept {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
    return _mm_or_si128(_mm_cmpeq_epi8(v, lf), _mm_cmpeq_epi8(v, cr));
  };
  for (; i + 64 <= n; i += 64) {
    const __m128i any = _mm_or_si128(_mm_or_si128(hits(i), hits(i + 16)), _mm_or_si128(hits(i + 32), hits(i + 48)));
    if (_mm_movemask_epi8(any) != 0) return true;
  }
  for (; i + 16 <= n; i += 16) {
    if (_mm_movemask_epi8(hits(i)) != 0) return true;
  }
  // The last 16 bytes again, overlapping what was read: no byte loop.
  if (i < n && n >= 16) return _mm_movemask_epi8(hits(n - 16)) != 0;
#endif
  for (; i < n; ++i) {
    if (p[i] == '\n' || p[i] == '\r') return true;
  }
  return false;
}

// The first CR or LF in [p, end), or end.
const char* find_eol(const char* p, const char* end) noexcept {
  const auto* lf = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
  const char* limit = lf != nullptr ? lf : end;
  const auto* cr = static_cast<const char*>(std::memchr(p, '\r', static_cast<size_t>(limit - p)));
  return cr != nullptr ? cr : limit;
}

}  // namespace

void sse_scanner::reset() noexcept {
  _events = 0;
  _len = 0;
  _view = nullptr;
  _view_len = 0;
  _truncated = false;
  _has_data = false;
  _after_cr = false;
  _in_event = false;
  _state = line_state::start;
  _name_len = 0;
}

void sse_scanner::end_line(char eol) noexcept {
  _after_cr = eol == '\r';
  _state = line_state::start;
}

void sse_scanner::begin_data_line() noexcept {
  if (_has_data) append("\n", 1);
  _has_data = true;
}

void sse_scanner::append(const char* data, size_t len) noexcept {
  if (_len == 0 && _view == nullptr && !_truncated) {
    // The first bytes of the event: keep a view, copy nothing yet.
    _view = data;
    _view_len = len;
    return;
  }
  if (_view != nullptr) copy_view();
  if (!have_buffer()) {
    _truncated = true;  // out of memory: the bytes still flow, the scan copy is cut
    return;
  }
  const size_t room = k_event_bytes_max - _len;
  const size_t n = len < room ? len : room;
  std::memcpy(_buf.get() + _len, data, n);
  _len += n;
  if (n < len) _truncated = true;
}

bool sse_scanner::have_buffer() noexcept {
  // Made on the first event that needs a copy (several data lines, or one
  // that spans two pieces) and kept: a stream whose events all arrive whole
  // never holds it (an idle stream then costs ~16 KiB less).
  if (!_buf) _buf.reset(new (std::nothrow) char[k_event_bytes_max]);
  return _buf != nullptr;
}

void sse_scanner::copy_view() noexcept {
  // Runs with _len == 0: the view is always the event's first bytes.
  const char* v = _view;
  const size_t len = _view_len;
  _view = nullptr;
  _view_len = 0;
  if (!have_buffer()) {
    _truncated = true;
    return;
  }
  const size_t n = len < k_event_bytes_max ? len : k_event_bytes_max;
  std::memcpy(_buf.get(), v, n);
  _len = n;
  if (n < len) _truncated = true;
}

void sse_scanner::dispatch() noexcept {
  if (_has_data) {
    ++_events;
    if (_cb != nullptr) {
      if (_view != nullptr) {
        _cb(_ctx, sse_event{std::string_view(_view, _view_len), false, true});
      } else {
        _cb(_ctx, sse_event{std::string_view(_buf ? _buf.get() : "", _len), _truncated, false});
      }
    }
  }
  _view = nullptr;
  _view_len = 0;
  _len = 0;
  _truncated = false;
  _has_data = false;
}

void sse_scanner::feed(const char* data, size_t len) noexcept {
  // The common piece is exactly one event, "data: <json>\n\n" (vLLM writes
  // one per chunk, and chunks arrive whole): with nothing pending, it is
  // reported in place after one pass for CR/LF, without the line state
  // machine.
  if (_state == line_state::start && !_after_cr && !_has_data && _view == nullptr && _len == 0 && len >= 7 &&
      std::memcmp(data, "data:", 5) == 0 && data[len - 1] == '\n' && data[len - 2] == '\n') {
    const char* v = data + 5;
    const char* const v_end = data + len - 2;
    if (v < v_end && *v == ' ') ++v;
    const auto n = static_cast<size_t>(v_end - v);
    if (!has_line_end(v, n)) {
      ++_events;
      if (_cb != nullptr) _cb(_ctx, sse_event{std::string_view(v, n), false, true});
      return;
    }
  }
  const char* p = data;
  const char* const end = data + len;
  while (p < end) {
    if (_after_cr) {
      // The LF of a CRLF (possibly in the next piece): the line already ended.
      _after_cr = false;
      if (*p == '\n') {
        ++p;
        continue;
      }
    }
    switch (_state) {
      case line_state::start:
        if (*p == '\r' || *p == '\n') {
          dispatch();  // an empty line ends the event
          _in_event = false;
          end_line(*p++);
          break;
        }
        _in_event = true;
        if (*p == ':') {
          _state = line_state::skip;  // a comment
          ++p;
        } else {
          _name_len = 0;
          _state = line_state::name;
        }
        break;
      case line_state::name: {
        const char c = *p++;
        const bool is_data = _name_len == 4 && std::memcmp(_name, "data", 4) == 0;
        if (c == ':') {
          _state = is_data ? line_state::value_first : line_state::skip;
        } else if (c == '\r' || c == '\n') {
          if (is_data) begin_data_line();  // "data" alone: an empty data line
          end_line(c);
        } else if (_name_len < sizeof(_name)) {
          _name[_name_len++] = c;
        }
        break;
      }
      case line_state::value_first:
        begin_data_line();
        if (*p == ' ') ++p;
        _state = line_state::value;
        break;
      case line_state::value:
      case line_state::skip: {
        const char* eol = find_eol(p, end);
        if (_state == line_state::value) append(p, static_cast<size_t>(eol - p));
        p = eol;
        if (p < end) end_line(*p++);
        break;
      }
    }
  }
  // The caller's bytes go away: an event still open keeps its own copy.
  if (_view != nullptr) copy_view();
}

}  // namespace sluice::http
