#include "sluice/audit/record.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>

#include "sluice/core/text.hpp"

namespace sluice::audit {
namespace {

using out_cursor = text_writer;

inline bool is_cont(unsigned char c) noexcept { return (c & 0xC0) == 0x80; }

// Length of the well-formed UTF-8 sequence at s[0, n) (Unicode Table 3-7:
// no overlongs, no surrogates, nothing above U+10FFFF).
// Returns: the sequence length (1..4), or -k where k >= 1 is the length of
// the maximal ill-formed prefix to replace with one U+FFFD (as WHATWG and
// Unicode §3.9 recommend).
int utf8_sequence(const unsigned char* s, size_t n) noexcept {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  unsigned char lo = 0x80, hi = 0xBF;
  int len;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // U+D800..U+DFFF are surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= n) return -i;
    const unsigned char b = s[i];
    if (i == 1 ? (b < lo || b > hi) : !is_cont(b)) return -i;
  }
  return len;
}

// Bytes that go into a JSON string as they are: printable ASCII but '"'
// and '\\' (one table load per byte instead of four compares).
constexpr std::array<bool, 256> k_plain = [] {
  std::array<bool, 256> t{};
  for (unsigned c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}();

// Writes `"escaped"`, or null for an empty view. The escaped content is cut
// at max_field_bytes, always between characters.
void put_string(out_cursor& o, std::string_view v) noexcept {
  if (v.empty()) {
    o.put("null");
    return;
  }
  static constexpr char hex[] = "0123456789abcdef";
  static constexpr std::string_view replacement = "\xEF\xBF\xBD";
  o.put('"');
  size_t emitted = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(v.data());
  size_t i = 0;
  while (i < v.size() && o.ok) {
    // A run of bytes that need no escape goes out in one copy.
    size_t plain = i;
    while (plain < v.size() && k_plain[s[plain]]) ++plain;
    if (plain > i) {
      const size_t n = std::min(plain - i, max_field_bytes - emitted);
      o.put(std::string_view(v.data() + i, n));
      emitted += n;
      i += n;
      if (emitted == max_field_bytes) break;
      continue;
    }
    char esc[8];
    std::string_view piece;
    size_t consumed;
    const unsigned char c = s[i];
    if (c < 0x80) {
      consumed = 1;
      if (c == '"' || c == '\\') {
        esc[0] = '\\';
        esc[1] = static_cast<char>(c);
        piece = std::string_view(esc, 2);
      } else if (c < 0x20) {
        esc[0] = '\\';
        const char short_form = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\b' ? 'b' : c == '\f' ? 'f' : 0;
        if (short_form != 0) {
          esc[1] = short_form;
          piece = std::string_view(esc, 2);
        } else {
          esc[1] = 'u';
          esc[2] = '0';
          esc[3] = '0';
          esc[4] = hex[c >> 4];
          esc[5] = hex[c & 0xF];
          piece = std::string_view(esc, 6);
        }
      } else {
        piece = std::string_view(v.data() + i, 1);
      }
    } else {
      const int len = utf8_sequence(s + i, v.size() - i);
      if (len > 0) {
        consumed = static_cast<size_t>(len);
        piece = std::string_view(v.data() + i, consumed);
      } else {
        consumed = static_cast<size_t>(-len);
        piece = replacement;
      }
    }
    if (emitted + piece.size() > max_field_bytes) break;
    o.put(piece);
    emitted += piece.size();
    i += consumed;
  }
  o.put('"');
}

void put_bool(out_cursor& o, bool b) noexcept { o.put(b ? std::string_view("true") : std::string_view("false")); }

}  // namespace

size_t format_line(const record& r, char* out, size_t cap) noexcept {
  out_cursor o(out, cap);
  // Field order is part of the format: tools that read the log by column
  // (cut, awk on a fixed prefix) and diff-based tests rely on it.
  o.put("{\"time_ms\":");
  o.put_int(r.time_ms);
  o.put(",\"request_id\":");
  put_string(o, r.request_id);
  o.put(",\"key_id\":");
  put_string(o, r.key_id);
  o.put(",\"endpoint\":");
  put_string(o, r.endpoint);
  o.put(",\"model\":");
  put_string(o, r.model);
  o.put(",\"group\":");
  put_string(o, r.group);
  o.put(",\"backend\":");
  put_string(o, r.backend);
  o.put(",\"session_id\":");
  put_string(o, r.session_id);
  o.put(",\"status\":");
  o.put_int(r.status);
  o.put(",\"prompt_tokens\":");
  o.put_int(r.prompt_tokens);
  o.put(",\"completion_tokens\":");
  o.put_int(r.completion_tokens);
  o.put(",\"total_tokens\":");
  o.put_int(r.total_tokens);
  o.put(",\"quota_charged\":");
  o.put_int(r.quota_charged);
  o.put(",\"ttft_ms\":");
  if (r.ttft_ms < 0) {
    o.put("null");
  } else {
    o.put_int(r.ttft_ms);
  }
  o.put(",\"duration_ms\":");
  o.put_int(r.duration_ms);
  o.put(",\"stream\":");
  put_bool(o, r.stream);
  o.put(",\"finish_reason\":");
  put_string(o, r.finish_reason);
  o.put(",\"cancelled\":");
  put_bool(o, r.cancelled);
  o.put(",\"error\":");
  put_string(o, r.error);
  if (!r.dialect.empty()) {
    o.put(",\"dialect\":");
    put_string(o, r.dialect);
  }
  if (r.queued_ms >= 0) {
    o.put(",\"queued_ms\":");
    o.put_int(r.queued_ms);
  }
  if (!r.route_how.empty()) {
    o.put(",\"route\":");
    put_string(o, r.route_how);
    o.put(",\"route_confidence\":");
    if (r.route_confidence < 0) {
      o.put("null");
    } else {
      // Thousandths, as "0.934" (no float formatting on the hot path).
      const auto milli = static_cast<uint64_t>(r.route_confidence * 1000.0 + 0.5);
      o.put_int(milli / 1000);
      o.put(milli % 1000 < 100 ? (milli % 1000 < 10 ? ".00" : ".0") : ".");
      o.put_int(milli % 1000);
    }
  }
  o.put("}\n");
  return o.ok ? static_cast<size_t>(o.p - out) : 0;
}

}  // namespace sluice::audit
