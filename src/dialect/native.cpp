// dialect: pass-through of a natively spoken dialect (native.hpp).
#include "sluice/dialect/native.hpp"

#include "chat_read.hpp"
#include "sluice/core/text.hpp"

#include <simdjson.h>

#include <cstring>
#include <memory>

namespace sluice::dialect {

namespace {

bool is_ws(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Past the string whose opening quote is at body[i]; `escaped` says whether
// it held a backslash. Returns: the index after its closing quote, or npos.
size_t skip_string(std::string_view body, size_t i, bool& escaped) noexcept {
  escaped = false;
  for (++i; i < body.size(); ++i) {
    if (body[i] == '\\') {
      escaped = true;
      ++i;
    } else if (body[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// Past the value that starts at body[i] (whitespace skipped before).
size_t skip_value(std::string_view body, size_t i) noexcept {
  if (i >= body.size()) return std::string_view::npos;
  bool esc = false;
  if (body[i] == '"') return skip_string(body, i, esc);
  if (body[i] == '{' || body[i] == '[') {
    uint32_t depth = 0;
    while (i < body.size()) {
      const char c = body[i];
      if (c == '"') {
        i = skip_string(body, i, esc);
        if (i == std::string_view::npos) return i;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') {
        if (--depth == 0) return i + 1;
      }
      ++i;
    }
    return std::string_view::npos;
  }
  while (i < body.size() && body[i] != ',' && body[i] != '}' && !is_ws(body[i])) ++i;
  return i;
}

struct scratch {
  simdjson::dom::parser parser;
  std::unique_ptr<char[]> padded;
  size_t cap = 0;
  // A padded copy of `s` (grown by doubling, kept).
  const char* copy(std::string_view s) {
    if (s.size() + simdjson::SIMDJSON_PADDING > cap) {
      size_t n = cap == 0 ? 16384 : cap;
      while (n < s.size() + simdjson::SIMDJSON_PADDING) n *= 2;
      padded.reset(new char[n]);
      cap = n;
    }
    std::memcpy(padded.get(), s.data(), s.size());
    return padded.get();
  }
};

scratch& local() noexcept {
  thread_local scratch s;
  return s;
}

using detail::get_int;

// A usage object's counts into `u`, in the dialect's names.
void read_usage(client_dialect d, simdjson::dom::element usage, native_usage& u, bool output_only) noexcept {
  const int64_t in = get_int(usage, "input_tokens");
  const int64_t out = get_int(usage, "output_tokens");
  if (out >= 0) u.completion_tokens = out;
  if (output_only && in < 0) return;
  if (d == client_dialect::messages) {
    // Anthropic's input_tokens leave out the cache's reads and writes.
    const int64_t read = get_int(usage, "cache_read_input_tokens");
    const int64_t made = get_int(usage, "cache_creation_input_tokens");
    if (in >= 0) u.prompt_tokens = in + (read > 0 ? read : 0) + (made > 0 ? made : 0);
  } else if (in >= 0) {
    u.prompt_tokens = in;
  }
}

// The event's "type", read without a parse where it stands first (Anthropic,
// sluice) or last (pydantic's field order, as vLLM writes Responses events);
// empty when it is elsewhere (then the event is parsed).
std::string_view type_of(std::string_view data) noexcept {
  constexpr std::string_view k_first = "{\"type\":\"";
  if (data.starts_with(k_first)) {
    const size_t end = data.find('"', k_first.size());
    return end == std::string_view::npos ? std::string_view{} : data.substr(k_first.size(), end - k_first.size());
  }
  constexpr std::string_view k_last = "\"type\":\"";
  if (!data.ends_with("\"}") || data.size() < k_last.size() + 3) return {};
  const size_t open = data.rfind('"', data.size() - 3);
  if (open == std::string_view::npos || open < k_last.size() - 1 ||
      data.substr(open + 1 - k_last.size(), k_last.size()) != k_last) {
    return {};
  }
  return data.substr(open + 1, data.size() - 2 - open - 1);
}

// Event types that carry no usage and no error: output, or nothing.
bool plain_type(client_dialect d, std::string_view t) noexcept {
  if (d == client_dialect::messages) {
    return t == "content_block_delta" || t == "content_block_start" || t == "content_block_stop" || t == "ping";
  }
  return t.starts_with("response.") && t != "response.completed" && t != "response.incomplete" &&
         t != "response.failed" && t != "response.created" && t != "response.in_progress";
}

}  // namespace

member_scan top_level_member(std::string_view body, std::string_view key, uint32_t& begin, uint32_t& end) noexcept {
  constexpr size_t k_names_max = 256;
  std::string_view names[k_names_max];
  size_t count = 0;
  member_scan result = member_scan::absent;
  size_t i = 0;
  while (i < body.size() && is_ws(body[i])) ++i;
  if (i >= body.size() || body[i] != '{') return member_scan::malformed;
  ++i;
  for (;;) {
    while (i < body.size() && (is_ws(body[i]) || body[i] == ',')) ++i;
    if (i >= body.size()) return member_scan::malformed;
    if (body[i] == '}') return result;
    if (body[i] != '"') return member_scan::malformed;
    bool escaped = false;
    const size_t name_end = skip_string(body, i, escaped);
    if (name_end == std::string_view::npos) return member_scan::malformed;
    if (escaped) return member_scan::escaped;
    const std::string_view name = body.substr(i + 1, name_end - i - 2);
    for (size_t k = 0; k < count; ++k) {
      if (names[k] == name) return member_scan::duplicate;
    }
    if (count < k_names_max) names[count++] = name;
    i = name_end;
    while (i < body.size() && (is_ws(body[i]) || body[i] == ':')) ++i;
    const size_t value_end = skip_value(body, i);
    if (value_end == std::string_view::npos) return member_scan::malformed;
    if (name == key) {
      begin = static_cast<uint32_t>(i);
      end = static_cast<uint32_t>(value_end);
      result = member_scan::found;
    }
    i = value_end;
  }
}

void scan_native_event(client_dialect d, std::string_view data, native_usage& u, std::string_view* response_id) noexcept {
  u.content = false;
  const bool messages = d == client_dialect::messages;
  const std::string_view fast = type_of(data);
  if (plain_type(d, fast)) {
    if (fast.ends_with("delta")) {
      ++u.content_events;
      u.content = true;
    }
    return;
  }
  scratch& s = local();
  simdjson::dom::element root;
  try {
    const char* p = s.copy(data);
    if (s.parser.parse(p, data.size(), false).get(root) != simdjson::SUCCESS || !root.is_object()) return;
  } catch (...) {
    return;
  }
  std::string_view type;
  if (root["type"].get_string().get(type) != simdjson::SUCCESS) return;
  simdjson::dom::element e;
  if (type == "error" || type == "response.failed") u.error = true;
  if (messages) {
    if (type == "message_start" && root["message"]["usage"].get(e) == simdjson::SUCCESS) read_usage(d, e, u, false);
    if (type == "message_delta" && root["usage"].get(e) == simdjson::SUCCESS) read_usage(d, e, u, true);
    return;
  }
  if (root["response"]["usage"].get(e) == simdjson::SUCCESS && e.is_object()) read_usage(d, e, u, false);
  std::string_view id;
  if (response_id != nullptr && type == "response.created" && root["response"]["id"].get_string().get(id) == simdjson::SUCCESS) {
    *response_id = id;
  }
}

native_usage native_body_usage(client_dialect d, std::string_view body) noexcept {
  native_usage u;
  constexpr std::string_view k_key = "\"usage\"";
  // The last "usage" key: outside a string its quotes cannot be escaped.
  size_t at = std::string_view::npos;
  for (size_t from = 0;;) {
    const char* hit = find_bytes(body.data() + from, body.size() - from, k_key);
    if (hit == nullptr) break;
    at = static_cast<size_t>(hit - body.data());
    from = at + k_key.size();
  }
  if (at == std::string_view::npos) return u;
  size_t i = at + k_key.size();
  while (i < body.size() && (is_ws(body[i]) || body[i] == ':')) ++i;
  if (i >= body.size() || body[i] != '{') return u;
  const size_t end = skip_value(body, i);
  if (end == std::string_view::npos) return u;
  const std::string_view obj = body.substr(i, end - i);
  scratch& s = local();
  simdjson::dom::element root;
  try {
    const char* p = s.copy(obj);
    if (s.parser.parse(p, obj.size(), false).get(root) != simdjson::SUCCESS || !root.is_object()) return u;
  } catch (...) {
    return u;
  }
  read_usage(d, root, u, false);
  return u;
}

}  // namespace sluice::dialect
