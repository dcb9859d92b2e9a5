// openai: request body validation and field extraction (docs/architecture.md §1 step 3,
// §9 "JSON" / "max_tokens"). The scans of backend responses are in
// response.cpp.
//
// The body is parsed once with simdjson's DOM parser, which validates all of
// it (structure, UTF-8, escapes, numbers, trailing bytes, depth) before a
// single field is read. simdjson 3.0.1 already refuses lone or mismatched
// surrogate escapes (\ud800, \udc00, \ud800\u0041, \ud800\ud800), NaN and
// Infinity, and trailing bytes, so sluice adds only what it lets through:
// duplicate keys (compared after unescaping, as the DOM stores keys) and a
// BOM / empty body with a clearer message. The DOM has no byte positions, so
// the spans sluice rewrites ("model", "stream_options") come from a small
// scanner over the already-validated body (find_top_level_spans).
#include "sluice/openai/request.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "sluice/core/assert.hpp"
#include "sluice/core/text.hpp"

namespace sluice::openai {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// A member name (or a short value) against a literal: the length first,
// then a memcmp of a known size, which the compiler inlines (string_view's
// operator== calls compare() and memcmp out of line, many times a request).
template <size_t N>
inline bool is(std::string_view s, const char (&literal)[N]) noexcept {
  return s.size() == N - 1 && std::memcmp(s.data(), literal, N - 1) == 0;
}

constexpr uint32_t depth_max = 64;                // docs/architecture.md §9
constexpr size_t initial_capacity = 64 * 1024;    // a typical chat body fits
constexpr size_t pairwise_keys_max = 16;          // above: sort, then compare neighbours
constexpr size_t quoted_key_max = 64;             // bytes of a key quoted in a message

bool fail(request_error& err, std::string_view message, std::string_view param = {},
          std::string_view code = {}) noexcept {
  err.message = message;
  err.param = param;
  err.code = code;
  return false;
}

bool is_ws(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_ws(const char* p, size_t len, size_t i) noexcept {
  while (i < len && is_ws(p[i])) ++i;
  return i;
}

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t max) noexcept {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// --- the top-level scanner (valid JSON only) -------------------------------

// p[i] is the opening quote. Returns: the index just past the closing quote.
// A quote closes the string when an even number of backslashes precede it;
// every backslash run is counted once, so the scan stays linear.
size_t skip_string(const char* p, size_t len, size_t i) noexcept {
  const size_t start = i + 1;
  i = start;
  while (i < len) {
    const void* q = std::memchr(p + i, '"', len - i);
    if (q == nullptr) return len;
    size_t j = static_cast<size_t>(static_cast<const char*>(q) - p);
    size_t k = j;
    while (k > start && p[k - 1] == '\\') --k;
    if ((j - k) % 2 == 0) return j + 1;
    i = j + 1;
  }
  return len;
}

// Returns: the index just past the value starting at p[i].
size_t skip_value(const char* p, size_t len, size_t i) noexcept {
  if (i >= len) return len;
  char c = p[i];
  if (c == '"') return skip_string(p, len, i);
  if (c == '{' || c == '[') {
    uint32_t depth = 0;
    while (i < len) {
      c = p[i];
      if (c == '"') {
        i = skip_string(p, len, i);
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return i + 1;
      }
      ++i;
    }
    return len;
  }
  while (i < len && !is_ws(p[i]) && p[i] != ',' && p[i] != '}' && p[i] != ']') ++i;
  return i;
}

// Whether the raw (still escaped) key text equals the ASCII `name` once
// unescaped: {"\u006dodel": ...} is the "model" key.
bool key_equals(std::string_view raw, std::string_view name) noexcept {
  if (raw.find('\\') == std::string_view::npos) return raw == name;
  size_t n = 0;
  for (size_t i = 0; i < raw.size(); ++n) {
    if (n >= name.size()) return false;
    char c = raw[i];
    if (c != '\\') {
      ++i;
    } else {
      if (i + 1 >= raw.size()) return false;
      char e = raw[i + 1];
      i += 2;
      switch (e) {
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
          if (i + 4 > raw.size()) return false;
          int cp = 0;
          for (int k = 0; k < 4; ++k) cp = cp * 16 + hex_digit(raw[i + static_cast<size_t>(k)]);
          i += 4;
          if (cp <= 0 || cp >= 0x80) return false;  // `name` is ASCII
          c = static_cast<char>(cp);
          break;
        }
        default: c = e; break;  // \" \\ \/
      }
    }
    if (c != name[n]) return false;
  }
  return n == name.size();
}

struct span {
  uint32_t begin = 0;
  uint32_t end = 0;
  bool found = false;
};

// Walks the members of the top-level object of an already validated body and
// records the value spans of "model" and, when wanted, "stream_options".
// Nested values are skipped whole, so a "model" key inside messages or tools
// is never taken. Duplicates were refused before, so each key occurs once;
// the walk stops as soon as it has what it was asked for.
void find_top_level_spans(const char* p, size_t len, bool want_stream_options, span& model,
                          span& stream_options) noexcept {
  size_t i = skip_ws(p, len, 0);
  if (i >= len || p[i] != '{') return;
  ++i;
  while (i < len) {
    i = skip_ws(p, len, i);
    if (i >= len || p[i] != '"') return;  // '}' ends the object
    size_t key_begin = i;
    i = skip_string(p, len, i);
    std::string_view raw_key(p + key_begin + 1, i - key_begin - 2);
    i = skip_ws(p, len, i);
    if (i >= len || p[i] != ':') return;
    i = skip_ws(p, len, i + 1);
    size_t value_begin = i;
    i = skip_value(p, len, i);
    span* target = nullptr;
    if (key_equals(raw_key, "model")) {
      target = &model;
    } else if (want_stream_options && key_equals(raw_key, "stream_options")) {
      target = &stream_options;
    }
    if (target != nullptr) {
      target->begin = static_cast<uint32_t>(value_begin);
      target->end = static_cast<uint32_t>(i);
      target->found = true;
      if (model.found && (!want_stream_options || stream_options.found)) return;
    }
    i = skip_ws(p, len, i);
    if (i < len && p[i] == ',') ++i;
  }
}

// --- messages for bodies simdjson refused ----------------------------------

// Error path only. Returns: the first bare word outside strings that is not
// true/false/null (NaN, Infinity, undefined, ...), or empty.
std::string_view find_bare_word(const char* p, size_t len) noexcept {
  size_t i = 0;
  while (i < len) {
    char c = p[i];
    if (c == '"') {
      i = skip_string(p, len, i);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      ++i;
      while (i < len && ((p[i] >= '0' && p[i] <= '9') || p[i] == '.' || p[i] == 'e' ||
                         p[i] == 'E' || p[i] == '+' || p[i] == '-')) {
        ++i;
      }
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      size_t b = i;
      while (i < len && ((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z'))) ++i;
      std::string_view w(p + b, i - b);
      if (w != "true" && w != "false" && w != "null") return w;
    } else {
      ++i;
    }
  }
  return {};
}

constexpr std::string_view msg_not_json =
    "We could not parse the JSON body of your request: it is not valid JSON.";

}  // namespace

// --- request_reader ---------------------------------------------------------

request_reader::request_reader(size_t max_body_bytes)
    : _max_body_bytes(max_body_bytes), _parser(max_body_bytes), _scratch{} {
  // Spans are uint32_t offsets.
  SLUICE_VERIFY(max_body_bytes < (size_t{1} << 32));
  const size_t capacity = std::min(initial_capacity, std::max<size_t>(max_body_bytes, 1));
  SLUICE_VERIFY(_parser.allocate(capacity, depth_max) == simdjson::SUCCESS);
  SLUICE_VERIFY(_doc.allocate(capacity) == simdjson::SUCCESS);
  _keys.reserve(256);
}

bool request_reader::fail_fmt(request_error& err, std::string_view param, const char* what,
                              std::string_view detail) noexcept {
  auto r = fmt::format_to_n(_scratch, sizeof(_scratch), fmt::runtime(what),
                            utf8_prefix(detail, quoted_key_max));
  size_t n = std::min(r.size, sizeof(_scratch));
  return fail(err, utf8_prefix(std::string_view(_scratch, n), sizeof(_scratch)), param);
}

// Depth and duplicate keys, everywhere in the document. The DOM's keys are
// already unescaped, so {"a":1,"\u0061":2} compares equal here.
bool request_reader::validate(const element& e, uint32_t depth, request_error& err) noexcept {
  // Only containers are walked: a scalar member or element costs no call.
  const auto container = [](const element& v) noexcept {
    const element_type t = v.type();
    return t == element_type::ARRAY || t == element_type::OBJECT;
  };
  switch (e.type()) {
    case element_type::ARRAY: {
      if (depth > depth_max) break;
      for (element child : simdjson::dom::array(e)) {
        if (container(child) && !validate(child, depth + 1, err)) return false;
      }
      return true;
    }
    case element_type::OBJECT: {
      if (depth > depth_max) break;
      // _keys is a stack: this object's keys go on as one pass over its
      // members meets them, a child object's above them (popped before
      // the child returns); then this object's are compared and popped.
      // A child's refusal (depth, a duplicate below) is the one reported
      // when both it and this object have one.
      const size_t base = _keys.size();
      for (auto kv : simdjson::dom::object(e)) {
        _keys.push_back(kv.key);
        if (container(kv.value) && !validate(kv.value, depth + 1, err)) {
          _keys.resize(base);
          return false;
        }
      }
      const size_t n = _keys.size() - base;
      std::string_view* keys = _keys.data() + base;
      std::string_view duplicate;
      bool has_duplicate = false;
      if (n <= pairwise_keys_max) {
        for (size_t a = 0; a < n && !has_duplicate; ++a) {
          for (size_t b = a + 1; b < n; ++b) {
            if (keys[a] == keys[b]) {
              duplicate = keys[a];
              has_duplicate = true;
              break;
            }
          }
        }
      } else {
        std::sort(keys, keys + n);
        auto it = std::adjacent_find(keys, keys + n);
        if (it != keys + n) {
          duplicate = *it;
          has_duplicate = true;
        }
      }
      _keys.resize(base);
      if (has_duplicate) {
        return fail_fmt(err, {},
                        "Duplicate key '{}' in a JSON object: the request is ambiguous, so it "
                        "is refused.",
                        duplicate);
      }
      return true;
    }
    default:
      return true;
  }
  return fail(err, "The JSON body nests objects and arrays deeper than 64 levels.");
}

namespace {

enum class int_member : uint8_t { absent, value, refused };

// An optional integer member: null is absent; a value above INT64_MAX reads
// as INT64_MAX (too large whatever the bound); any other type is refused
// with `err` set.
int_member read_integer(const element& v, std::string_view name, int64_t& n, char* scratch, size_t scratch_size,
                        request_error& err) noexcept {
  switch (v.type()) {
    case element_type::NULL_VALUE:
      return int_member::absent;
    case element_type::INT64:
      n = int64_t(v);
      return int_member::value;
    case element_type::UINT64:
      n = INT64_MAX;
      return int_member::value;
    default: {
      const char* got = "a string";
      switch (v.type()) {
        case element_type::DOUBLE: got = "a decimal number"; break;
        case element_type::BOOL: got = "a boolean"; break;
        case element_type::ARRAY: got = "an array"; break;
        case element_type::OBJECT: got = "an object"; break;
        default: break;
      }
      auto r = fmt::format_to_n(scratch, scratch_size,
                                "Invalid type for '{}': expected an integer, but got {} instead.",
                                name, got);
      fail(err, std::string_view(scratch, std::min(r.size, scratch_size)), name);
      return int_member::refused;
    }
  }
}

// Reads max_tokens / max_completion_tokens. Returns: false with `err` set when
// present and not an integer in 1..cap; `out` stays -1 for null.
bool read_token_cap(const element& v, std::string_view name, int64_t cap, int64_t& out,
                    char* scratch, size_t scratch_size, request_error& err) noexcept {
  int64_t n = 0;
  switch (read_integer(v, name, n, scratch, scratch_size, err)) {
    case int_member::absent: return true;
    case int_member::refused: return false;
    case int_member::value: break;
  }
  if (n < 1) {
    auto r = fmt::format_to_n(scratch, scratch_size,
                              "Invalid '{}': integer below minimum value. Expected a value >= 1, "
                              "but got {} instead.",
                              name, n);
    return fail(err, std::string_view(scratch, std::min(r.size, scratch_size)), name);
  }
  if (n > cap) {
    auto r = fmt::format_to_n(scratch, scratch_size,
                              "{} is too large: {}. This model supports at most {} completion "
                              "tokens, whereas you provided {}.",
                              name, v.type() == element_type::UINT64 ? uint64_t(v) : uint64_t(n),
                              cap, v.type() == element_type::UINT64 ? uint64_t(v) : uint64_t(n));
    return fail(err, std::string_view(scratch, std::min(r.size, scratch_size)), name);
  }
  out = n;
  return true;
}

// "n" or "best_of": an integer in 1..request_fields::k_choices_max (OpenAI's
// bound on n); null is absent (out unchanged).
bool read_choices(const element& v, std::string_view name, int64_t& out, char* scratch, size_t scratch_size,
                  request_error& err) noexcept {
  int64_t n = 0;
  switch (read_integer(v, name, n, scratch, scratch_size, err)) {
    case int_member::absent: return true;
    case int_member::refused: return false;
    case int_member::value: break;
  }
  if (n < 1 || n > request_fields::k_choices_max) {
    auto r = fmt::format_to_n(scratch, scratch_size,
                              "Invalid '{}': expected an integer from 1 to {}, but got {} instead.", name,
                              request_fields::k_choices_max,
                              v.type() == element_type::UINT64 ? std::to_string(uint64_t(v)) : std::to_string(n));
    return fail(err, std::string_view(scratch, std::min(r.size, scratch_size)), name);
  }
  out = n;
  return true;
}

// The text of one message's content: a string, or the text parts of an
// array. Adds their bytes to `bytes`; `first` becomes the string or the first
// text part.
void read_content(const element& content, uint64_t& bytes, std::string_view& first,
                  request_text& text_out) noexcept {
  if (content.is_string()) {
    first = std::string_view(content);
    bytes += first.size();
    text_out.add(first);
    return;
  }
  if (!content.is_array()) return;  // null (assistant with tool_calls) or other
  bool have_first = false;
  for (element part : simdjson::dom::array(content)) {
    if (part.is_string()) {  // tolerated by some servers: a bare string part
      std::string_view s(part);
      bytes += s.size();
      text_out.add(s);
      if (!have_first) first = s, have_first = true;
      continue;
    }
    if (!part.is_object()) continue;
    std::string_view type;
    std::string_view text;
    bool has_text = false;
    for (auto kv : simdjson::dom::object(part)) {
      if (is(kv.key, "type") && kv.value.is_string()) {
        type = std::string_view(kv.value);
      } else if (is(kv.key, "text") && kv.value.is_string()) {
        text = std::string_view(kv.value);
        has_text = true;
      }
    }
    if (is(type, "image_url") || is(type, "input_image") || is(type, "image")) {
      ++text_out.images;
    } else if (has_text && (is(type, "text") || is(type, "input_text"))) {
      bytes += text.size();
      text_out.add(text);
      if (!have_first) first = text, have_first = true;
    }
  }
}

// Prompt or input text: a string, or an array of strings / token ids / token
// id arrays. Returns: the bytes; `first` is the string or the first string.
uint64_t read_prompt_bytes(const element& v, std::string_view& first, request_text& text_out) noexcept {
  if (v.is_string()) {
    first = std::string_view(v);
    text_out.add(first);
    return first.size();
  }
  uint64_t bytes = 0;
  constexpr uint64_t bytes_per_token = 4;
  for (element item : simdjson::dom::array(v)) {
    if (item.is_string()) {
      std::string_view s(item);
      if (first.empty()) first = s;
      bytes += s.size();
      text_out.add(s);
    } else if (item.is_array()) {
      const size_t ids = simdjson::dom::array(item).size();
      bytes += bytes_per_token * ids;
      text_out.token_ids += ids;
    } else {
      bytes += bytes_per_token;
      ++text_out.token_ids;
    }
  }
  return bytes;
}

// The prompts of a completions request: a string or an array of token ids
// is one; an array of strings or of token-id arrays is one per item.
uint64_t count_prompts(const element& v) noexcept {
  if (!v.is_array()) return 1;
  uint64_t prompts = 0;
  for (element item : simdjson::dom::array(v)) {
    if (item.is_string() || item.is_array()) ++prompts;
  }
  return prompts == 0 ? 1 : prompts;
}

}  // namespace

bool request_reader::read(endpoint ep, const char* body, size_t len, int64_t max_tokens_cap,
                          request_fields& out, request_error& err) noexcept {
  SLUICE_ASSERT(max_tokens_cap >= 1);
  out = request_fields{};
  err = request_error{};
  _text.clear();

  if (len > _max_body_bytes) {
    return fail(err, "The request body is larger than this server accepts.");
  }
  if (skip_ws(body, len, 0) == len) {
    return fail(err, "We could not parse the JSON body of your request: the body is empty.");
  }
  if (len >= 3 && static_cast<unsigned char>(body[0]) == 0xEF &&
      static_cast<unsigned char>(body[1]) == 0xBB && static_cast<unsigned char>(body[2]) == 0xBF) {
    // RFC 8259 §8.1: a JSON text must not begin with a BOM; parsers that skip
    // it and parsers that refuse it disagree, so refuse.
    return fail(err,
                "We could not parse the JSON body of your request: it starts with a UTF-8 "
                "byte order mark.");
  }

  // Grow by doubling so a shard reaches its steady size after a few large
  // bodies; left to itself simdjson reallocates to the exact size of every
  // slightly larger body. The document is ours for the same reason.
  if (_parser.capacity() < len || _doc.capacity() < len) {
    size_t want = std::min(std::max(len, _parser.capacity() * 2), _max_body_bytes);
    if (_parser.allocate(want, depth_max) != simdjson::SUCCESS ||
        _doc.allocate(want) != simdjson::SUCCESS) {
      return fail(err, "The request body is larger than this server accepts.");
    }
  }

  element root;
  simdjson::error_code code = _parser.parse_into_document(_doc, body, len, false).get(root);
  if (code != simdjson::SUCCESS) {
    switch (code) {
      case simdjson::DEPTH_ERROR:
        return fail(err, "The JSON body nests objects and arrays deeper than 64 levels.");
      case simdjson::UTF8_ERROR:
        return fail(err, "We could not parse the JSON body of your request: it is not valid UTF-8.");
      case simdjson::STRING_ERROR:
        return fail(err,
                    "We could not parse the JSON body of your request: a string has an invalid "
                    "escape or a lone UTF-16 surrogate (\\ud800-\\udfff must come as a high/low "
                    "pair).");
      case simdjson::UNESCAPED_CHARS:
        return fail(err,
                    "We could not parse the JSON body of your request: a string holds an "
                    "unescaped control character.");
      default:
        break;
    }
    // Valid JSON followed by more bytes: the first value parses on its own.
    size_t first_end = skip_value(body, len, skip_ws(body, len, 0));
    if (skip_ws(body, len, first_end) < len) {
      element ignored;
      if (_parser.parse_into_document(_doc, body, first_end, false).get(ignored) ==
          simdjson::SUCCESS) {
        return fail(err,
                    "We could not parse the JSON body of your request: there are bytes after "
                    "the JSON object.");
      }
    }
    std::string_view word = find_bare_word(body, len);
    if (!word.empty()) {
      return fail_fmt(err, {},
                      "We could not parse the JSON body of your request: '{}' is not a JSON "
                      "value (NaN and Infinity are not JSON).",
                      word);
    }
    if (code == simdjson::NUMBER_ERROR || code == simdjson::NUMBER_OUT_OF_RANGE) {
      return fail(err,
                  "We could not parse the JSON body of your request: a number is malformed or "
                  "out of range.");
    }
    return fail(err, msg_not_json);
  }
  if (!root.is_object()) {
    return fail(err, "The JSON body of your request must be an object.");
  }
  if (!validate(root, 1, err)) return false;

  // Top-level members, one pass.
  bool has_model = false;
  element messages;
  bool has_messages = false;
  element prompt;
  bool has_prompt = false;
  element input;
  bool has_input = false;
  int64_t max_tokens = -1;
  int64_t max_completion_tokens = -1;
  int64_t choices = 1;
  int64_t best_of = 1;
  for (auto kv : simdjson::dom::object(root)) {
    const std::string_view key = kv.key;
    const element& v = kv.value;
    if (is(key, "model")) {
      if (!v.is_string()) {
        return fail(err, "Invalid type for 'model': expected a non-empty string.", "model");
      }
      out.model = std::string_view(v);
      if (out.model.empty()) {
        return fail(err, "Invalid 'model': empty string. Expected a non-empty string.", "model");
      }
      has_model = true;
    } else if (is(key, "stream")) {
      if (v.is_bool()) {
        out.stream = bool(v);
      } else if (!v.is_null()) {
        return fail(err, "Invalid type for 'stream': expected a boolean.", "stream");
      }
    } else if (is(key, "stream_options")) {
      if (v.is_object()) {
        out.stream_options_object = true;
        for (auto so : simdjson::dom::object(v)) {
          if (!is(so.key, "include_usage")) continue;
          out.has_include_usage = true;
          if (so.value.is_bool()) {
            out.include_usage = bool(so.value);
          } else if (!so.value.is_null()) {
            return fail(err,
                        "Invalid type for 'stream_options.include_usage': expected a boolean.",
                        "stream_options.include_usage");
          }
        }
      } else if (!v.is_null()) {
        return fail(err, "Invalid type for 'stream_options': expected an object.",
                    "stream_options");
      }
      out.has_stream_options = true;
    } else if (is(key, "max_tokens")) {
      if (!read_token_cap(v, "max_tokens", max_tokens_cap, max_tokens, _scratch, sizeof(_scratch),
                          err)) {
        return false;
      }
    } else if (is(key, "max_completion_tokens")) {
      if (!read_token_cap(v, "max_completion_tokens", max_tokens_cap, max_completion_tokens,
                          _scratch, sizeof(_scratch), err)) {
        return false;
      }
    } else if (is(key, "n")) {
      if (!read_choices(v, "n", choices, _scratch, sizeof(_scratch), err)) return false;
    } else if (is(key, "best_of")) {
      if (!read_choices(v, "best_of", best_of, _scratch, sizeof(_scratch), err)) return false;
    } else if (is(key, "messages")) {
      messages = v;
      has_messages = true;
    } else if (is(key, "prompt")) {
      prompt = v;
      has_prompt = true;
    } else if (is(key, "input")) {
      input = v;
      has_input = true;
    } else if (is(key, "tools") || is(key, "functions")) {
      if (v.is_array() && simdjson::dom::array(v).size() > 0) out.has_tools = true;
    } else {
      // Recorded, not read: a position per member the loop visits anyway.
      request_fields::member* m = nullptr;
      if (is(key, "temperature")) {
        m = &out.temperature;
      } else if (is(key, "top_p")) {
        m = &out.top_p;
      } else if (is(key, "stop")) {
        m = &out.stop;
      } else if (is(key, "seed")) {
        m = &out.seed;
      } else if (is(key, "presence_penalty")) {
        m = &out.presence_penalty;
      } else if (is(key, "frequency_penalty")) {
        m = &out.frequency_penalty;
      } else if (is(key, "tool_choice")) {
        m = &out.tool_choice;
      } else if (is(key, "function_call")) {
        m = &out.function_call;
      } else if (is(key, "response_format")) {
        m = &out.response_format;
      } else if (is(key, "logprobs")) {
        m = &out.logprobs;
      } else if (is(key, "top_logprobs")) {
        m = &out.top_logprobs;
      }
      if (m != nullptr && !v.is_null()) *m = {v, true};
    }
  }
  if (!has_model) return fail(err, "you must provide a model parameter", "model");

  switch (ep) {
    case endpoint::chat_completions: {
      out.max_tokens = max_completion_tokens >= 0 ? max_completion_tokens : max_tokens;
      out.max_tokens_named_completion = max_completion_tokens >= 0;
      if (!has_messages) return fail(err, "Missing required parameter: 'messages'.", "messages");
      if (!messages.is_array()) {
        return fail(err, "Invalid type for 'messages': expected an array of objects.", "messages");
      }
      simdjson::dom::array list(messages);
      bool seen_system = false;
      bool seen_user = false;
      uint32_t index = 0;
      for (element m : list) {
        if (!m.is_object()) {
          auto r = fmt::format_to_n(_scratch, sizeof(_scratch),
                                    "Invalid type for 'messages[{}]': expected an object.", index);
          return fail(err, std::string_view(_scratch, std::min(r.size, sizeof(_scratch))),
                      "messages");
        }
        std::string_view role;
        element content;
        bool has_content = false;
        for (auto kv : simdjson::dom::object(m)) {
          if (is(kv.key, "role") && kv.value.is_string()) {
            role = std::string_view(kv.value);
          } else if (is(kv.key, "content")) {
            content = kv.value;
            has_content = true;
          }
        }
        std::string_view text;
        if (has_content) read_content(content, out.input_bytes, text, _text);
        if (index < request_fields::k_leading_messages_max) out.leading_messages[index] = text;
        if (is(role, "user")) out.last_user_message = text;
        if (!seen_system && (is(role, "system") || is(role, "developer"))) {
          seen_system = true;
          out.system_prompt = text;
        } else if (!seen_user && is(role, "user")) {
          seen_user = true;
          out.first_user_message = text;
        }
        ++index;
      }
      if (index == 0) {
        return fail(err,
                    "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                    "but got an empty array instead.",
                    "messages");
      }
      out.message_count = index;
      out.messages = messages;
      break;
    }
    case endpoint::completions: {
      out.max_tokens = max_tokens;
      if (!has_prompt) return fail(err, "Missing required parameter: 'prompt'.", "prompt");
      if (!prompt.is_string() && !prompt.is_array()) {
        return fail(err, "Invalid type for 'prompt': expected a string or an array.", "prompt");
      }
      out.prompt = {prompt, true};
      out.input_bytes = read_prompt_bytes(prompt, out.first_user_message, _text);
      out.last_user_message = out.first_user_message;
      out.output_sequences = count_prompts(prompt);
      break;
    }
    case endpoint::embeddings: {
      if (!has_input) return fail(err, "Missing required parameter: 'input'.", "input");
      if (!input.is_string() && !input.is_array()) {
        return fail(err, "Invalid type for 'input': expected a string or an array.", "input");
      }
      std::string_view ignored;
      out.input_bytes = read_prompt_bytes(input, ignored, _text);
      break;
    }
  }

  out.n = choices;
  out.best_of = best_of;
  if (ep != endpoint::embeddings) out.output_sequences *= static_cast<uint64_t>(std::max(choices, best_of));

  span model_span;
  span stream_options_span;
  find_top_level_spans(body, len, out.has_stream_options, model_span, stream_options_span);
  SLUICE_ASSERT(model_span.found);
  SLUICE_ASSERT(stream_options_span.found == out.has_stream_options);
  out.model_token_begin = model_span.begin;
  out.model_token_end = model_span.end;
  out.stream_options_begin = stream_options_span.begin;
  out.stream_options_end = stream_options_span.end;
  out.has_images = _text.images != 0;
  out.text = &_text;
  return true;
}

}  // namespace sluice::openai
