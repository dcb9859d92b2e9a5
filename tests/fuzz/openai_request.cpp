// Fuzz target: OpenAI request extraction (openai::request_reader) on
// arbitrary bodies, for each endpoint. When read() accepts:
//  - the model token and stream_options spans lie inside the body and hold
//    what they claim (a JSON string; an object or null);
//  - reading the same bytes again gives the same fields;
//  - simdjson's DOM parser, on its own, accepts the body, and a plain
//    RFC 8259 checker written here agrees it is one JSON object with valid
//    UTF-8, no lone surrogate escape, depth <= 64 and no repeated key;
// and when read() refuses for a duplicate key, the DOM accepts the body and
// the key does repeat in some object.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "sluice/openai/request.hpp"

namespace {

using namespace sluice::openai;

constexpr size_t k_max_body_bytes = 1u << 20;
constexpr int64_t k_max_tokens_cap = 32768;
constexpr uint32_t k_depth_max = 64;

// ---- A plain, strict RFC 8259 checker (no speed, no cleverness). ----
class strict_json {
 public:
  explicit strict_json(std::string_view s) noexcept : _s(s) {}

  // One value, surrounded by optional whitespace, and nothing else.
  bool document() {
    ws();
    if (!value(1)) return false;
    ws();
    return _i == _s.size();
  }

 private:
  bool at_end() const noexcept { return _i >= _s.size(); }
  unsigned char peek() const noexcept { return static_cast<unsigned char>(_s[_i]); }
  void ws() noexcept {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++_i;
  }
  bool lit(std::string_view w) noexcept {
    if (_s.substr(_i, w.size()) != w) return false;
    _i += w.size();
    return true;
  }

  bool value(uint32_t depth) {
    if (at_end()) return false;
    switch (peek()) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': {
        std::string ignored;
        return string(ignored);
      }
      case 't': return lit("true");
      case 'f': return lit("false");
      case 'n': return lit("null");
      default: return number();
    }
  }

  bool object(uint32_t depth) {
    if (depth > k_depth_max) return false;
    ++_i;
    ws();
    std::vector<std::string> keys;
    if (!at_end() && peek() == '}') {
      ++_i;
      return true;
    }
    while (true) {
      ws();
      if (at_end() || peek() != '"') return false;
      std::string key;
      if (!string(key)) return false;
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) return false;
      keys.push_back(std::move(key));
      ws();
      if (at_end() || peek() != ':') return false;
      ++_i;
      ws();
      if (!value(depth + 1)) return false;
      ws();
      if (at_end()) return false;
      if (peek() == '}') {
        ++_i;
        return true;
      }
      if (peek() != ',') return false;
      ++_i;
    }
  }

  bool array(uint32_t depth) {
    if (depth > k_depth_max) return false;
    ++_i;
    ws();
    if (!at_end() && peek() == ']') {
      ++_i;
      return true;
    }
    while (true) {
      ws();
      if (!value(depth + 1)) return false;
      ws();
      if (at_end()) return false;
      if (peek() == ']') {
        ++_i;
        return true;
      }
      if (peek() != ',') return false;
      ++_i;
    }
  }

  bool hex4(uint32_t& out) noexcept {
    if (_s.size() - _i < 4) return false;
    out = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = _s[_i++];
      out <<= 4;
      if (c >= '0' && c <= '9') out |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') out |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') out |= static_cast<uint32_t>(c - 'A' + 10);
      else return false;
    }
    return true;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // One UTF-8 sequence (RFC 3629: shortest form, no surrogates, <= U+10FFFF).
  bool utf8(std::string& out) noexcept {
    const unsigned char c = peek();
    size_t n;
    uint32_t cp;
    if (c < 0x80) { n = 1; cp = c; }
    else if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return false;
    if (_s.size() - _i < n) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(_s[_i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return false;
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;
    out.append(_s.data() + _i, n);
    _i += n;
    return true;
  }

  bool string(std::string& out) {
    ++_i;  // the opening quote
    while (true) {
      if (at_end()) return false;
      const unsigned char c = peek();
      if (c == '"') {
        ++_i;
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') {
        if (!utf8(out)) return false;
        continue;
      }
      ++_i;
      if (at_end()) return false;
      const char e = _s[_i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // a lone low surrogate
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low;
            if (!lit("\\u") || !hex4(low) || low < 0xDC00 || low > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: return false;
      }
    }
  }

  bool digits() noexcept {
    const size_t from = _i;
    while (!at_end() && peek() >= '0' && peek() <= '9') ++_i;
    return _i > from;
  }

  bool number() noexcept {
    if (!at_end() && peek() == '-') ++_i;
    if (at_end()) return false;
    if (peek() == '0') {
      ++_i;
    } else if (!digits()) {
      return false;
    }
    if (!at_end() && peek() == '.') {
      ++_i;
      if (!digits()) return false;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++_i;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++_i;
      if (!digits()) return false;
    }
    return true;
  }

  std::string_view _s;
  size_t _i = 0;
};

// Some object of the DOM holds the same (unescaped) key twice.
bool has_repeated_key(simdjson::dom::element e) {
  if (e.is_array()) {
    for (simdjson::dom::element child : simdjson::dom::array(e)) {
      if (has_repeated_key(child)) return true;
    }
    return false;
  }
  if (!e.is_object()) return false;
  std::vector<std::string_view> keys;
  for (auto kv : simdjson::dom::object(e)) {
    if (std::find(keys.begin(), keys.end(), kv.key) != keys.end()) return true;
    keys.push_back(kv.key);
  }
  for (auto kv : simdjson::dom::object(e)) {
    if (has_repeated_key(kv.value)) return true;
  }
  return false;
}

// The fields that outlive a read, as owned copies.
struct fields_copy {
  std::string model, system_prompt, first_user, last_user;
  uint32_t model_token_begin, model_token_end;
  bool stream, has_stream_options, include_usage, has_tools, has_images;
  uint32_t stream_options_begin, stream_options_end, message_count;
  int64_t max_tokens;
  uint64_t input_bytes;
  bool operator==(const fields_copy&) const = default;
};

fields_copy copy_of(const request_fields& f) {
  return {std::string(f.model), std::string(f.system_prompt), std::string(f.first_user_message),
          std::string(f.last_user_message), f.model_token_begin, f.model_token_end, f.stream,
          f.has_stream_options, f.include_usage, f.has_tools, f.has_images,
          f.stream_options_begin, f.stream_options_end, f.message_count, f.max_tokens,
          f.input_bytes};
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size > k_max_body_bytes) return 0;
  // The body with simdjson's padding after it, as the proxy's buffers have.
  std::vector<char> padded(size + simdjson::SIMDJSON_PADDING, '\0');
  if (size > 0) std::memcpy(padded.data(), bytes, size);
  const char* body = padded.data();
  const std::string_view text(body, size);

  static request_reader reader(k_max_body_bytes);
  static simdjson::dom::parser dom;

  for (endpoint ep : {endpoint::chat_completions, endpoint::completions, endpoint::embeddings}) {
    request_fields f;
    request_error err;
    const bool ok = reader.read(ep, body, size, k_max_tokens_cap, f, err);
    if (!ok) {
      SLUICE_FUZZ_CHECK(!err.message.empty());
      if (starts_with(err.message, "Duplicate key")) {
        simdjson::dom::element root;
        SLUICE_FUZZ_CHECK(dom.parse(body, size, false).get(root) == simdjson::SUCCESS);
        SLUICE_FUZZ_CHECK(has_repeated_key(root));
      }
      continue;
    }
    SLUICE_FUZZ_CHECK(!f.model.empty());
    SLUICE_FUZZ_CHECK(f.model_token_begin < f.model_token_end && f.model_token_end <= size);
    SLUICE_FUZZ_CHECK(f.model_token_end - f.model_token_begin >= 3);  // "x" at least
    SLUICE_FUZZ_CHECK(body[f.model_token_begin] == '"' && body[f.model_token_end - 1] == '"');
    if (f.has_stream_options) {
      SLUICE_FUZZ_CHECK(f.stream_options_begin < f.stream_options_end && f.stream_options_end <= size);
      const char first = body[f.stream_options_begin];
      const char last = body[f.stream_options_end - 1];
      SLUICE_FUZZ_CHECK((first == '{' && last == '}') ||
                 text.substr(f.stream_options_begin, f.stream_options_end - f.stream_options_begin) ==
                     "null");
    }
    SLUICE_FUZZ_CHECK(!f.include_usage || f.has_stream_options);
    SLUICE_FUZZ_CHECK(f.max_tokens == -1 || (f.max_tokens >= 1 && f.max_tokens <= k_max_tokens_cap));
    if (ep != endpoint::chat_completions) SLUICE_FUZZ_CHECK(f.message_count == 0);

    // The same bytes again, through the same (now warm) reader.
    const fields_copy first = copy_of(f);
    request_fields g;
    request_error err2;
    SLUICE_FUZZ_CHECK(reader.read(ep, body, size, k_max_tokens_cap, g, err2));
    SLUICE_FUZZ_CHECK(copy_of(g) == first);

    // Differential: simdjson's DOM alone, and the plain strict checker.
    simdjson::dom::element root;
    SLUICE_FUZZ_CHECK(dom.parse(body, size, false).get(root) == simdjson::SUCCESS);
    SLUICE_FUZZ_CHECK(root.is_object());
    SLUICE_FUZZ_CHECK(!has_repeated_key(root));
    SLUICE_FUZZ_CHECK(strict_json(text).document());
  }
  return 0;
}
