#pragma once
// audit: the per-request record and its JSON line (docs/architecture.md §5).
//
// One record per answered request, rejected ones (401/404/429/4xx) included.
// The record only borrows: every string is a view into request/session state
// that outlives the format_line() call. Key ids only, never keys.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::audit {

// Plain data, filled by the proxy when a request ends.
struct record {
  uint64_t time_ms = 0;             // unix time (ms) when the request arrived
  std::string_view request_id;
  std::string_view key_id;          // config key id; empty before/without auth
  std::string_view endpoint;        // "/v1/chat/completions"
  std::string_view model;           // as the client sent it
  std::string_view group;
  std::string_view backend;         // backend URL as configured
  std::string_view session_id;      // X-Session-ID, when the client sent one
  uint16_t status = 0;              // HTTP status sent downstream (499: client gone first)
  uint64_t prompt_tokens = 0;
  uint64_t completion_tokens = 0;
  uint64_t total_tokens = 0;
  uint64_t quota_charged = 0;       // weighted tokens settled against the key
  int64_t ttft_ms = -1;             // -1: no first token (non-stream, error)
  uint64_t duration_ms = 0;
  bool stream = false;
  bool cancelled = false;           // client went away, backend request cancelled
  std::string_view finish_reason;   // "stop", "length", …
  std::string_view error;           // error code or reason ("rate_limit_exceeded")
  // The client's dialect: chat | completions | embeddings | responses |
  // messages (docs/architecture.md §6b); written after `error` when set.
  std::string_view dialect;
  // Fair admission: how long the request waited at the gateway for a slot
  // (-1: it was never queued); written after `dialect` when >= 0.
  int64_t queued_ms = -1;
  // The auto model's routing: how its group was picked ("rule",
  // "classifier", "default", "sticky") and the classifier's top probability
  // (-1: it did not run). Written after the fields above, and only for a
  // request the router decided (other lines stay as they were).
  std::string_view route_how;
  double route_confidence = -1;
};

// Each string field is cut to this many output bytes (after escaping, at a
// character boundary), which bounds a line: a client-chosen model name can be
// megabytes and must not be able to push out other requests' lines.
inline constexpr size_t max_field_bytes = 1024;
// No line is longer than this (13 strings × (max_field_bytes + quotes) plus
// names and numbers): a buffer with this much room always takes a record.
inline constexpr size_t max_line_bytes = 16384;

// Writes the record as one JSON object followed by '\n' into out[0, cap).
// Field order is fixed; empty strings and ttft_ms < 0 are written as null.
// Strings are escaped per RFC 8259 (quote, backslash, control characters);
// bytes that are not valid UTF-8 become U+FFFD. Allocates nothing.
// Returns: the line's length including '\n', or 0 when it does not fit in cap
// (out may then hold a partial line: do not use it).
size_t format_line(const record& r, char* out, size_t cap) noexcept;

}  // namespace sluice::audit
