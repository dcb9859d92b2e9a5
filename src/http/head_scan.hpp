#pragma once
// http (private): the pre-scan that runs before llhttp over a message head.
// llhttp 8.1 in strict mode still accepts a space before the header colon,
// obs-fold continuation lines and a bare LF in places; this scan rejects
// those, enforces the size limits while the head is still arriving (so an
// oversize head fails early instead of being buffered), refuses bytes that
// cannot begin a request line as soon as they arrive (a TLS ClientHello on
// the plaintext port would otherwise wait out the header timeout), and finds
// the end of the head so llhttp only ever sees one complete head.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sluice/core/text.hpp"
#include "sluice/http/request.hpp"

namespace sluice::http::detail {

// The longest request method accepted. The longest registered one
// (UPDATEREDIRECTREF, RFC 3253) is 17 bytes; anything much longer is not a
// client speaking HTTP.
inline constexpr uint8_t k_method_bytes_max = 32;

struct scan_limits {
  uint32_t head_bytes_max;        // including the empty line
  uint32_t start_line_bytes_max;  // excluding CRLF
  uint32_t field_line_bytes_max;  // excluding CRLF
  uint16_t fields_max;
  bool start_line_htab;           // a status line's reason phrase may hold HTAB
  // Request heads: the start line must begin `method SP`, the method at most
  // this long, checked byte by byte as it arrives. 0 for a status line.
  uint8_t method_bytes_max;
};

enum class scan_error : uint8_t {
  none,
  head_too_large,
  start_line_too_long,
  field_line_too_long,
  too_many_fields,
  bare_lf,
  bare_cr,
  nul,
  ctl_in_start_line,
  ctl_in_value,
  obs_fold,
  space_before_colon,
  empty_name,
  missing_colon,
  not_a_request_line,   // a byte that cannot be part of `method SP`
  method_too_long,
};

enum class scan_state : uint8_t { need_more, complete, failed };

// Scans what previous calls on `s` have not seen of `data`/`len` (every
// byte of the message received so far, from its first byte). `s` holds
// offsets only, so the caller may move its buffer between calls.
// Returns: complete (then s.head_bytes, s.start_begin/start_end are set),
// need_more, or failed (then error_of(s) says why). Calling again after
// complete or failed returns the same answer.
// `idx` (may be null): where the field lines are indexed as they are found
// (header_fields); its n must be 0 when the head's scan starts.
scan_state scan_head(head_scan_state& s, const char* data, size_t len, const scan_limits& l,
                     field_index* idx = nullptr) noexcept;

inline scan_error error_of(const head_scan_state& s) noexcept { return static_cast<scan_error>(s.error); }

// A static, human-readable reason for the error body or the log.
std::string_view scan_message(scan_error e) noexcept;

// Field names are tokens (RFC 9110 §5.6.2).
bool is_tchar(unsigned char c) noexcept;

// Case-insensitive ASCII comparison (core's).
using sluice::iequals;
bool istarts_with(std::string_view s, std::string_view lower) noexcept;

// Strips SP/HTAB on both ends.
std::string_view trim_ows(std::string_view s) noexcept;

// Host = uri-host [ ":" port ] (RFC 9112 §3.2, RFC 3986 §3.2.2-3): a
// reg-name (unreserved, sub-delims, pct-encoded), an IPv4 address (a
// reg-name by its syntax) or a bracketed IPv6 / IPvFuture literal, then
// optionally 1-5 digits of at most 65535. Stricter than RFC 3986 in two
// places: an empty host and an empty port ("host:") are refused, as no
// client that means well sends either.
bool valid_host(std::string_view v) noexcept;

// Content-Length: 1*DIGIT, below 2^63 (a list or a sign is not a number).
// Returns: whether `s` is such a value; `out` is set when it is.
bool parse_content_length(std::string_view s, uint64_t& out) noexcept;

// llhttp reads Connection, Content-Length and Transfer-Encoding with small
// parsers of their own, which skip spaces around the value but take an
// HTAB as part of it (refused in a length, no flag for "chunked<HTAB>" or
// "close<HTAB>"). `line`: such a field's whole line. Returns: whether a
// head holding it must be read by llhttp.
inline bool llhttp_reads_value_apart(std::string_view line) noexcept {
  return line.find('\t') != std::string_view::npos;
}

// llhttp hands a span over in one or more pieces that are adjacent in the
// caller's buffer: this joins them.
inline std::string_view extend_span(std::string_view s, const char* at, size_t len) noexcept {
  return s.data() == nullptr ? std::string_view(at, len)
                             : std::string_view(s.data(), static_cast<size_t>(at + len - s.data()));
}

}  // namespace sluice::http::detail
