// openai: the cheap scans of backend responses that billing and framing need
// (usage, finish_reason, content, [DONE]).
//
// Stream events are read by a walk over the JSON vLLM writes where it can
// vouch for its answer (event_walk below), and otherwise by simdjson's DOM
// parser: the DOM lives in the shared library, which picks the CPU's
// fastest kernel at run time, while On-Demand is header-only and compiled
// for the build's -march (the scalar fallback without one), and on a vLLM
// chunk the DOM's parse and walk measured cheaper than On-Demand, with or
// without -march=native (bench/RESULTS.md, "Figures behind choices in the
// code"). The DOM also validates the whole event, so `malformed` is exact.
// A non-stream body may be large (embeddings: megabytes of floats); there
// On-Demand wins because it skips "data" without converting a single
// number, so scan_response_usage uses it.
#include <algorithm>
#include <cstring>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "sluice/openai/request.hpp"

namespace sluice::openai {

namespace {

using simdjson::dom::element;

// Shard-thread-local: the padded copy a payload is parsed from and the
// parsers. All grow to the largest payload seen and stay.
struct response_scratch {
  static constexpr size_t initial_capacity = 16 * 1024;  // SSE events are ~200 bytes

  std::unique_ptr<char[]> buf;
  size_t capacity = 0;
  simdjson::dom::parser dom;
  simdjson::dom::document dom_doc;
  simdjson::ondemand::parser ondemand;

  // Copies `s` with zeroed padding after it, growing the buffer and both
  // parsers by doubling: left to themselves the parsers would reallocate to
  // the exact size of every slightly larger payload. Returns: false when out
  // of memory.
  bool pad(std::string_view s) noexcept {
    if (capacity < s.size() + simdjson::SIMDJSON_PADDING) {
      size_t want = std::max<size_t>(initial_capacity, 2 * (s.size() + simdjson::SIMDJSON_PADDING));
      buf.reset(new (std::nothrow) char[want]);
      capacity = buf ? want : 0;
      if (!buf) return false;
      if (dom.allocate(want) != simdjson::SUCCESS) return false;
      if (dom_doc.allocate(want) != simdjson::SUCCESS) return false;
      if (ondemand.allocate(want) != simdjson::SUCCESS) return false;
    }
    std::memcpy(buf.get(), s.data(), s.size());
    std::memset(buf.get() + s.size(), 0, simdjson::SIMDJSON_PADDING);
    return true;
  }
};

response_scratch& scratch() noexcept {
  thread_local response_scratch s;
  return s;
}

bool is_ws(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// A finish_reason as a view that outlives the parser: the values vLLM and
// OpenAI send are static strings; any other is found verbatim (quoted) in the
// payload, or reported as "unknown" when it was written with escapes.
std::string_view stable_finish_reason(std::string_view value, std::string_view payload) noexcept {
  static constexpr std::string_view known[] = {"stop",          "length", "tool_calls",
                                               "content_filter", "function_call", "abort",
                                               "error"};
  for (std::string_view k : known) {
    if (value == k) return k;
  }
  for (size_t at = payload.find(value); at != std::string_view::npos;
       at = payload.find(value, at + 1)) {
    if (at > 0 && payload[at - 1] == '"' && at + value.size() < payload.size() &&
        payload[at + value.size()] == '"') {
      return payload.substr(at, value.size());
    }
  }
  return "unknown";
}

bool non_empty_string(const element& v) noexcept {
  return v.is_string() && !std::string_view(v).empty();
}

void read_choice(simdjson::dom::object choice, std::string_view payload,
                 stream_event_info& info) noexcept {
  for (auto kv : choice) {
    if (kv.key == "delta") {
      simdjson::dom::object delta;
      if (kv.value.get(delta) != simdjson::SUCCESS) continue;
      for (auto d : delta) {
        if ((d.key == "content" || d.key == "reasoning_content") && non_empty_string(d.value)) {
          info.has_content = true;
        } else if (d.key == "tool_calls" && d.value.is_array() &&
                   simdjson::dom::array(d.value).size() > 0) {
          info.has_content = true;
        }
      }
    } else if (kv.key == "text") {  // text_completion chunks
      if (non_empty_string(kv.value)) info.has_content = true;
    } else if (kv.key == "finish_reason") {
      if (kv.value.is_string() && info.finish_reason.empty()) {
        info.finish_reason = stable_finish_reason(std::string_view(kv.value), payload);
      }
    }
  }
}

void read_usage(simdjson::dom::object u, int64_t& prompt_tokens,
                int64_t& completion_tokens) noexcept {
  for (auto kv : u) {
    int64_t n = 0;
    if (kv.value.get(n) != simdjson::SUCCESS) continue;
    if (kv.key == "prompt_tokens") {
      prompt_tokens = n;
    } else if (kv.key == "completion_tokens") {
      completion_tokens = n;
    }
  }
}

// One pass over an event in the JSON vLLM writes, reading the facts the
// parse below reads, in its order: printable ASCII strings without
// escapes, integers of at most 18 digits, true, false and null, objects
// and arrays at most k_depth_max deep, whitespace where JSON allows it.
// Anything else -- an escape, a byte past 0x7F or below 0x20 in a string,
// a fraction, an exponent, -0 or a longer integer, any syntax error -- it
// does not vouch for, and the event is parsed instead: every answer is the
// parse's. A parse costs ~2,400 instructions on a vLLM finish or usage
// event (most of it the parser's fixed cost), this walk a fraction of that.
class event_walk {
 public:
  explicit event_walk(std::string_view payload) noexcept
      : _p(payload.data()), _end(payload.data() + payload.size()), _payload(payload) {}

  // Returns: false where it does not vouch (`info` is then partial).
  bool run(stream_event_info& info) noexcept {
    ws();
    if (!at('{')) return false;
    bool empty_choices = false;
    const bool ok = object(1, [&](std::string_view key) {
      if (key == "choices") {
        if (!at('[')) return value(1);
        size_t n = 0;
        const bool r = array(2, [&] {
          ++n;
          return at('{') ? choice(3, info) : value(2);
        });
        empty_choices = n == 0;
        return r;
      }
      if (key == "usage") {
        if (!at('{')) return value(1);  // "usage": null on plain chunks
        info.has_usage = true;
        return object(2, [&](std::string_view name) {
          int64_t n = 0;
          if (!at_integer()) return value(2);
          if (!integer(n)) return false;
          if (name == "prompt_tokens") {
            info.prompt_tokens = n;
          } else if (name == "completion_tokens") {
            info.completion_tokens = n;
          }
          return true;
        });
      }
      if (key == "error") {
        info.error = true;
        return value(1);
      }
      if (key == "object" && at('"')) {
        // Some vLLM versions send the ErrorResponse itself: {"object":"error",...}.
        std::string_view v;
        if (!string(v)) return false;
        if (v == "error") info.error = true;
        return true;
      }
      return value(1);
    });
    if (!ok) return false;
    ws();
    if (_p != _end) return false;
    info.usage_only = empty_choices && info.has_usage;
    return true;
  }

 private:
  static constexpr unsigned k_depth_max = 64;

  bool at(char c) const noexcept { return _p < _end && *_p == c; }
  bool at_integer() const noexcept { return _p < _end && (*_p == '-' || (*_p >= '0' && *_p <= '9')); }
  void ws() noexcept {
    while (_p < _end && is_ws(*_p)) ++_p;
  }

  // At '"': the string's bytes, _p past its closing quote.
  bool string(std::string_view& out) noexcept {
    const char* const b = ++_p;
#if defined(__SSE2__)
    // Sixteen bytes a turn to the first that is '"', '\\', below 0x20 or
    // past 0x7F (signed, below 0x20).
    while (_end - _p >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(_p));
      const int m = _mm_movemask_epi8(_mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
                                                   _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                                                _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')))));
      if (m != 0) {
        _p += __builtin_ctz(static_cast<unsigned>(m));
        break;
      }
      _p += 16;
    }
#endif
    while (_p < _end) {
      const auto c = static_cast<unsigned char>(*_p);
      if (c == '"' || c == '\\' || c < 0x20 || c > 0x7f) break;
      ++_p;
    }
    if (!at('"')) return false;  // an escape, a byte to validate, or the end
    out = std::string_view(b, static_cast<size_t>(_p - b));
    ++_p;
    return true;
  }

  // At '-' or a digit: -?(0|[1-9][0-9]{0,17}), and no fraction or exponent.
  bool integer(int64_t& out) noexcept {
    const bool negative = *_p == '-';
    if (negative) ++_p;
    const char* const b = _p;
    int64_t v = 0;
    while (_p < _end && *_p >= '0' && *_p <= '9' && _p - b < 18) v = v * 10 + (*_p++ - '0');
    const auto digits = _p - b;
    if (digits == 0 || (digits > 1 && *b == '0') || (negative && v == 0)) return false;
    // A 19th digit, a fraction or an exponent: the parse's to read.
    if (_p < _end && (*_p == '.' || *_p == 'e' || *_p == 'E' || (*_p >= '0' && *_p <= '9'))) return false;
    out = negative ? -v : v;
    return true;
  }

  bool literal(std::string_view word) noexcept {
    if (static_cast<size_t>(_end - _p) < word.size() || std::memcmp(_p, word.data(), word.size()) != 0) return false;
    _p += word.size();
    return true;
  }

  // Any value at _p, at `depth` (its containers' members one deeper).
  bool value(unsigned depth) noexcept {
    if (_p == _end) return false;
    switch (*_p) {
      case '{': return object(depth + 1, [this, depth](std::string_view) { return value(depth + 1); });
      case '[': return array(depth + 1, [this, depth] { return value(depth + 1); });
      case '"': {
        std::string_view v;
        return string(v);
      }
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default: {
        int64_t n = 0;
        return at_integer() && integer(n);
      }
    }
  }

  // At '{' (an object: each member's key to `item`, which reads its
  // value) or '[' (an array: `item` reads each element), to the close.
  template <bool object_, class Item>
  bool container(unsigned depth, Item&& item) noexcept {
    constexpr char close = object_ ? '}' : ']';
    if (depth > k_depth_max) return false;
    ++_p;
    ws();
    if (at(close)) {
      ++_p;
      return true;
    }
    for (;;) {
      if constexpr (object_) {
        std::string_view key;
        if (!at('"') || !string(key)) return false;
        ws();
        if (!at(':')) return false;
        ++_p;
        ws();
        if (!item(key)) return false;
      } else {
        if (!item()) return false;
      }
      ws();
      if (!at(',')) break;
      ++_p;
      ws();
    }
    if (!at(close)) return false;
    ++_p;
    return true;
  }
  template <class Member>
  bool object(unsigned depth, Member&& member) noexcept {
    return container<true>(depth, member);
  }
  template <class Element>
  bool array(unsigned depth, Element&& element) noexcept {
    return container<false>(depth, element);
  }

  // At a choice's '{': read_choice's facts.
  bool choice(unsigned depth, stream_event_info& info) noexcept {
    return object(depth, [&](std::string_view key) {
      if (key == "delta") {
        if (!at('{')) return value(depth);
        return object(depth + 1, [&](std::string_view name) {
          if ((name == "content" || name == "reasoning_content") && at('"')) {
            std::string_view v;
            if (!string(v)) return false;
            if (!v.empty()) info.has_content = true;
            return true;
          }
          if (name == "tool_calls" && at('[')) {
            const char* q = _p + 1;
            while (q < _end && is_ws(*q)) ++q;
            if (q < _end && *q != ']') info.has_content = true;  // an element (or no JSON: not vouched)
          }
          return value(depth + 1);
        });
      }
      if (key == "text" && at('"')) {  // text_completion chunks
        std::string_view v;
        if (!string(v)) return false;
        if (!v.empty()) info.has_content = true;
        return true;
      }
      if (key == "finish_reason" && at('"')) {
        std::string_view v;
        if (!string(v)) return false;
        if (info.finish_reason.empty()) info.finish_reason = stable_finish_reason(v, _payload);
        return true;
      }
      return value(depth);
    });
  }

  const char* _p;
  const char* const _end;
  const std::string_view _payload;
};

}  // namespace

namespace detail {

bool walk_stream_event(std::string_view payload, stream_event_info& info) noexcept {
  return event_walk(trim(payload)).run(info);
}

stream_event_info scan_stream_event_parsed(std::string_view payload) noexcept {
  stream_event_info info;
  payload = trim(payload);
  if (payload == "[DONE]") {
    info.done = true;
    return info;
  }
  response_scratch& s = scratch();
  element root;
  simdjson::dom::object obj;
  if (!s.pad(payload) ||
      s.dom.parse_into_document(s.dom_doc, s.buf.get(), payload.size(), false).get(root) != simdjson::SUCCESS ||
      root.get(obj) != simdjson::SUCCESS) {
    info.malformed = true;
    return info;
  }
  bool empty_choices = false;
  for (auto kv : obj) {
    if (kv.key == "choices") {
      simdjson::dom::array choices;
      if (kv.value.get(choices) != simdjson::SUCCESS) continue;
      size_t n = 0;
      for (element c : choices) {
        ++n;
        simdjson::dom::object choice;
        if (c.get(choice) == simdjson::SUCCESS) read_choice(choice, payload, info);
      }
      empty_choices = n == 0;
    } else if (kv.key == "usage") {
      simdjson::dom::object u;
      if (kv.value.get(u) != simdjson::SUCCESS) continue;  // "usage": null on plain chunks
      info.has_usage = true;
      read_usage(u, info.prompt_tokens, info.completion_tokens);
    } else if (kv.key == "error") {
      info.error = true;
    } else if (kv.key == "object") {
      // Some vLLM versions send the ErrorResponse itself: {"object":"error",...}.
      if (kv.value.is_string() && std::string_view(kv.value) == "error") info.error = true;
    }
  }
  info.usage_only = empty_choices && info.has_usage;
  return info;
}

}  // namespace detail

stream_event_info scan_stream_event(std::string_view payload) noexcept {
  // [DONE] and anything but an object the walk leaves to the parse too.
  stream_event_info info;
  if (detail::walk_stream_event(payload, info)) return info;
  return detail::scan_stream_event_parsed(payload);
}

namespace {

using simdjson::ondemand::json_type;

// Returns: false on a malformed document.
bool read_usage_ondemand(simdjson::ondemand::object uo, usage& u) noexcept {
  for (auto field : uo) {
    simdjson::ondemand::raw_json_string key;
    if (field.key().get(key) != simdjson::SUCCESS) return false;
    simdjson::ondemand::value v;
    if (field.value().get(v) != simdjson::SUCCESS) return false;
    int64_t n = 0;
    if (v.get_int64().get(n) != simdjson::SUCCESS) continue;
    if (key == "prompt_tokens") {
      u.prompt_tokens = n;
    } else if (key == "completion_tokens") {
      u.completion_tokens = n;
    } else if (key == "total_tokens") {
      u.total_tokens = n;
    }
  }
  return true;
}

}  // namespace

usage scan_usage_in_tail(std::string_view tail) noexcept {
  constexpr std::string_view k_key = "\"usage\":";
  const size_t key = tail.rfind(k_key);
  if (key == std::string_view::npos) return usage{};
  size_t open = key + k_key.size();
  while (open < tail.size() && (tail[open] == ' ' || tail[open] == '\t' || tail[open] == '\n' || tail[open] == '\r')) ++open;
  if (open == tail.size() || tail[open] != '{') return usage{};  // "usage": null
  // The object's end: braces counted outside strings (a string skipped to
  // its closing quote, escapes included).
  size_t depth = 0, end = std::string_view::npos;
  for (size_t i = open; i < tail.size() && end == std::string_view::npos; ++i) {
    const char c = tail[i];
    if (c == '"') {
      for (++i; i < tail.size() && tail[i] != '"'; ++i) {
        if (tail[i] == '\\') ++i;
      }
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      end = i + 1;
    }
  }
  if (end == std::string_view::npos) return usage{};
  const std::string_view object = tail.substr(open, end - open);
  response_scratch& s = scratch();
  if (!s.pad(object)) return usage{};
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  usage found;
  if (s.ondemand.iterate(s.buf.get(), object.size(), s.capacity).get(doc) != simdjson::SUCCESS ||
      doc.get_object().get(obj) != simdjson::SUCCESS || !read_usage_ondemand(obj, found)) {
    return usage{};
  }
  return found;
}

namespace detail {

usage scan_response_usage_parsed(std::string_view body) noexcept {
  if (body.empty()) return usage{};
  response_scratch& s = scratch();
  if (!s.pad(body)) return usage{};
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  if (s.ondemand.iterate(s.buf.get(), body.size(), s.capacity).get(doc) != simdjson::SUCCESS ||
      doc.get_object().get(obj) != simdjson::SUCCESS) {
    return usage{};
  }
  usage found;
  for (auto field : obj) {
    simdjson::ondemand::raw_json_string key;
    if (field.key().get(key) != simdjson::SUCCESS) return usage{};
    simdjson::ondemand::value v;
    if (field.value().get(v) != simdjson::SUCCESS) return usage{};
    if (key != "usage") continue;
    json_type t;
    if (v.type().get(t) != simdjson::SUCCESS) return usage{};
    if (t != json_type::object) continue;  // "usage": null
    simdjson::ondemand::object uo;
    if (v.get_object().get(uo) != simdjson::SUCCESS) return usage{};
    if (!read_usage_ondemand(uo, found)) return usage{};
  }
  return found;
}

}  // namespace detail

namespace {

// The tail-first read of a non-stream body. A body is an object whose
// "usage" member comes last or nearly (vLLM, SGLang, OpenAI: after
// "choices", which holds the content): walking back from the closing brace
// to that member reads ~150 bytes of a reply of any length, where a parse
// would index all of it (and copy it, for the padding). The walk is exact
// for valid JSON: outside a string, a `"` closes one, and the string opens
// at the previous `"` that an even number of backslashes precedes (inside a
// string a quote is always escaped). Anything it does not expect answers
// `unsure`, and the whole body is parsed instead.
enum class tail_read : uint8_t { found, absent, unsure };

// Returns: the index of the quote that opens the string closed at `close`,
// or npos.
size_t string_open(std::string_view b, size_t close) noexcept {
  size_t at = close;
  while (at > 0) {
    const void* q = ::memrchr(b.data(), '"', at);
    if (q == nullptr) return std::string_view::npos;
    at = static_cast<size_t>(static_cast<const char*>(q) - b.data());
    size_t slashes = 0;
    while (slashes < at && b[at - 1 - slashes] == '\\') ++slashes;
    if (slashes % 2 == 0) return at;
  }
  return std::string_view::npos;
}

// Returns: the index just past the string opening at `open` (b[open] is
// '"'), or npos.
size_t string_end(std::string_view b, size_t open) noexcept {
  for (size_t at = open + 1; at < b.size();) {
    const void* q = std::memchr(b.data() + at, '"', b.size() - at);
    if (q == nullptr) return std::string_view::npos;
    const size_t quote = static_cast<size_t>(static_cast<const char*>(q) - b.data());
    size_t slashes = 0;
    while (quote - slashes > open + 1 && b[quote - 1 - slashes] == '\\') ++slashes;
    if (slashes % 2 == 0) return quote + 1;
    at = quote + 1;
  }
  return std::string_view::npos;
}

// Returns: the index just past the value starting at `at`, or npos. Only
// its extent: a string, a nested object or array (brackets counted outside
// strings), or a scalar up to its delimiter.
size_t value_end(std::string_view b, size_t at) noexcept {
  if (at >= b.size()) return std::string_view::npos;
  if (b[at] == '"') return string_end(b, at);
  if (b[at] == '{' || b[at] == '[') {
    size_t depth = 0;
    for (size_t i = at; i < b.size(); ++i) {
      const char c = b[i];
      if (c == '"') {
        const size_t e = string_end(b, i);
        if (e == std::string_view::npos) return e;
        i = e - 1;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return i + 1;
      }
    }
    return std::string_view::npos;
  }
  size_t i = at;
  while (i < b.size() && b[i] != ',' && b[i] != '}' && b[i] != ']' && !is_ws(b[i])) ++i;
  return i == at ? std::string_view::npos : i;
}

// A JSON integer exactly filling [from, to), as simdjson's get_int64 takes
// it: an optional minus, no leading zero, in range. Returns: false if not.
bool json_int(std::string_view b, size_t from, size_t to, int64_t& out) noexcept {
  size_t i = from;
  const bool negative = i < to && b[i] == '-';
  if (negative) ++i;
  if (i == to || (b[i] == '0' && to - i > 1)) return false;
  uint64_t v = 0;
  for (; i < to; ++i) {
    const auto d = static_cast<unsigned>(b[i] - '0');
    if (d > 9) return false;
    if (v > (uint64_t{1} << 63) / 10) return false;
    v = v * 10 + d;
  }
  if (v > (negative ? uint64_t{1} << 63 : uint64_t{INT64_MAX})) return false;
  out = negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

// Reads the usage object whose '{' is at `at` (the three counts; other
// members are skipped, an integer that is not one is left at -1).
tail_read read_usage_object(std::string_view b, size_t at, usage& u) noexcept {
  const auto skip_ws = [&](size_t i) noexcept {
    while (i < b.size() && is_ws(b[i])) ++i;
    return i;
  };
  usage found;
  size_t i = skip_ws(at + 1);
  if (i < b.size() && b[i] == '}') {
    u = found;
    return tail_read::found;
  }
  for (;;) {
    if (i >= b.size() || b[i] != '"') return tail_read::unsure;
    const size_t key_end = string_end(b, i);
    if (key_end == std::string_view::npos) return tail_read::unsure;
    const std::string_view key = b.substr(i + 1, key_end - i - 2);
    i = skip_ws(key_end);
    if (i >= b.size() || b[i] != ':') return tail_read::unsure;
    const size_t v = skip_ws(i + 1);
    const size_t v_end = value_end(b, v);
    if (v_end == std::string_view::npos) return tail_read::unsure;
    int64_t* slot = key == "prompt_tokens"       ? &found.prompt_tokens
                    : key == "completion_tokens" ? &found.completion_tokens
                    : key == "total_tokens"      ? &found.total_tokens
                                                 : nullptr;
    int64_t n = 0;
    if (slot != nullptr && json_int(b, v, v_end, n)) *slot = n;
    i = skip_ws(v_end);
    if (i >= b.size()) return tail_read::unsure;
    if (b[i] == '}') break;
    if (b[i] != ',') return tail_read::unsure;
    i = skip_ws(i + 1);
  }
  u = found;
  return tail_read::found;
}

// The last byte before `i` that is '"' or a bracket, or npos: the walk
// below looks at nothing else. Sixteen bytes a turn, back from i: between
// a body's last members its bytes are numbers, nulls, commas and colons.
size_t prev_structural(std::string_view b, size_t i) noexcept {
#if defined(__SSE2__)
  while (i >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.data() + i - 16));
    const __m128i folded = _mm_or_si128(v, _mm_set1_epi8(0x20));  // '[' -> '{', ']' -> '}'
    const __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                     _mm_or_si128(_mm_cmpeq_epi8(folded, _mm_set1_epi8('{')),
                                                  _mm_cmpeq_epi8(folded, _mm_set1_epi8('}'))));
    const auto m = static_cast<unsigned>(_mm_movemask_epi8(hit));
    if (m != 0) return i - 16 + static_cast<size_t>(31 - __builtin_clz(m));
    i -= 16;
  }
#endif
  while (i > 0) {
    const char c = b[--i];
    if (c == '"' || c == '{' || c == '}' || c == '[' || c == ']') return i;
  }
  return std::string_view::npos;
}

tail_read read_usage_from_end(std::string_view b, usage& u) noexcept {
  size_t end = b.size();
  while (end > 0 && is_ws(b[end - 1])) --end;
  if (end == 0 || b[end - 1] != '}') return tail_read::unsure;
  // Walk back from the last byte inside the top-level object; `depth` counts
  // the brackets closed since (1: a member of the top level).
  size_t depth = 1;
  for (size_t i = end - 1; (i = prev_structural(b, i)) != std::string_view::npos;) {
    const char c = b[i];
    if (c == '"') {
      const size_t open = string_open(b, i);
      if (open == std::string_view::npos) return tail_read::unsure;
      if (depth == 1) {
        size_t after = i + 1;
        while (after < end && is_ws(b[after])) ++after;
        if (after < end && b[after] == ':' && b.substr(open + 1, i - open - 1) == "usage") {
          // The top level's last "usage" member.
          size_t v = after + 1;
          while (v < end && is_ws(b[v])) ++v;
          if (v < end && b[v] == '{') return read_usage_object(b.substr(0, end), v, u);
          if (b.substr(v, 4) == "null") return tail_read::absent;
          return tail_read::unsure;
        }
      }
      i = open;
    } else if (c == '}' || c == ']') {
      ++depth;
    } else if (c == '{' || c == '[') {
      if (--depth == 0) {
        // The top level's opening brace: no "usage" member in it.
        for (size_t j = 0; j < i; ++j) {
          if (!is_ws(b[j])) return tail_read::unsure;
        }
        return tail_read::absent;
      }
    }
  }
  return tail_read::unsure;
}

}  // namespace

bool detail::scan_response_usage_from_end(std::string_view body, usage& u) noexcept {
  switch (read_usage_from_end(body, u)) {
    case tail_read::found: return true;
    case tail_read::absent: u = usage{}; return true;
    case tail_read::unsure: break;
  }
  return false;
}

usage scan_response_usage(std::string_view body) noexcept {
  usage u;
  if (detail::scan_response_usage_from_end(body, u)) return u;
  return detail::scan_response_usage_parsed(body);
}

}  // namespace sluice::openai
