#include "sluice/audit/record.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>

#include "sluice/core/json_string.hpp"
#include "sluice/core/text.hpp"

namespace sluice::audit {
namespace {

using out_cursor = text_writer;

// Writes `"escaped"` (the core escaper's rules), or null for an empty view.
// The escaped content is cut at max_field_bytes, always between characters.
void put_string(out_cursor& o, std::string_view v) noexcept {
  if (v.empty()) {
    o.put("null");
    return;
  }
  o.put('"');
  if (!o.ok) return;
  const size_t room = static_cast<size_t>(o.end - o.p);
  o.p += json_escape(o.p, room < max_field_bytes ? room : max_field_bytes, v);
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
