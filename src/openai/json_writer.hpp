#pragma once
// openai (private): a small JSON writer over a sink, shared by the Anthropic
// translators. Strings from simdjson are valid UTF-8 already, so escaping
// only has to cover quotes, backslashes and control characters.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "sluice/openai/error.hpp"

namespace sluice::openai::detail {

// Cold path (per request): appends to a caller-reused string.
struct string_sink {
  std::string& s;
  void append(const char* p, size_t n) { s.append(p, n); }
};

// The C library's memcpy, out of line (see bounded_sink::append).
void copy_bytes(char* to, const char* from, size_t n) noexcept;

// Hot path (per SSE event): writes while the bytes fit and counts all of
// them, so `size > cap` says the output did not fit and how much it needs.
// Once past cap nothing more is written (size only grows).
struct bounded_sink {
  char* out;
  size_t cap;
  size_t size = 0;
  void append(const char* p, size_t n) noexcept {
    // An empty view's data() may be null, which memcpy must not see. A
    // literal's few bytes are copied inline; any other length goes to the
    // C library's memcpy (GCC would inline a `rep movs`, slow to start for
    // the ~150-byte chunk heads every event copies).
    if (n != 0 && size + n <= cap) {
      if (__builtin_constant_p(n)) {
        std::memcpy(out + size, p, n);
      } else {
        copy_bytes(out + size, p, n);
      }
    }
    size += n;
  }
  bool fits() const noexcept { return size <= cap; }
  // Where the next bytes go and how many fit (json_writer escapes into it
  // directly); then `advance(n)` counts what was written there.
  char* room(size_t& avail) noexcept {
    avail = size < cap ? cap - size : 0;
    return out + (size < cap ? size : cap);
  }
  void advance(size_t n) noexcept { size += n; }
};

template <class Sink>
class json_writer {
 public:
  explicit json_writer(Sink& sink) noexcept : _sink(sink) {}

  void raw(std::string_view v) { _sink.append(v.data(), v.size()); }
  void str(std::string_view v) {
    raw("\"");
    escaped(v);
    raw("\"");
  }
  // openai::json_escape's escapes (whole UTF-8 characters; invalid bytes
  // become U+FFFD): straight into a bounded sink's room (the per-event
  // path), else -- a string sink, or what did not fit, only counted then --
  // in pieces through a stack buffer.
  void escaped(std::string_view v) {
    if constexpr (requires(Sink& k, size_t& a) { k.room(a); }) {
      size_t avail = 0;
      char* at = _sink.room(avail);
      size_t used = 0;
      _sink.advance(json_escape(at, avail, v, used));
      v.remove_prefix(used);
    }
    char buf[256];
    while (!v.empty()) {
      size_t used = 0;
      const size_t n = json_escape(buf, sizeof buf, v, used);
      _sink.append(buf, n);
      v.remove_prefix(used);
    }
  }
  void num(int64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    _sink.append(buf, static_cast<size_t>(r.ptr - buf));
  }
  void num(double v) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    _sink.append(buf, static_cast<size_t>(r.ptr - buf));
  }

 private:
  Sink& _sink;
};

}  // namespace sluice::openai::detail
