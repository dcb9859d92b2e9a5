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

namespace sluice::openai::detail {

// Cold path (per request): appends to a caller-reused string.
struct string_sink {
  std::string& s;
  void append(const char* p, size_t n) { s.append(p, n); }
};

// Hot path (per SSE event): writes while the bytes fit and counts all of
// them, so `size > cap` says the output did not fit and how much it needs.
// Once past cap nothing more is written (size only grows).
struct bounded_sink {
  char* out;
  size_t cap;
  size_t size = 0;
  void append(const char* p, size_t n) noexcept {
    // An empty view's data() may be null, which memcpy must not see.
    if (n != 0 && size + n <= cap) std::memcpy(out + size, p, n);
    size += n;
  }
  bool fits() const noexcept { return size <= cap; }
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
  void escaped(std::string_view v) {
    static constexpr char hex[] = "0123456789abcdef";
    size_t run = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      auto c = static_cast<unsigned char>(v[i]);
      if (c != '"' && c != '\\' && c >= 0x20) continue;
      _sink.append(v.data() + run, i - run);
      run = i + 1;
      char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
      switch (c) {
        case '"': raw("\\\""); break;
        case '\\': raw("\\\\"); break;
        case '\n': raw("\\n"); break;
        case '\r': raw("\\r"); break;
        case '\t': raw("\\t"); break;
        default: _sink.append(esc, sizeof(esc)); break;
      }
    }
    _sink.append(v.data() + run, v.size() - run);
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
