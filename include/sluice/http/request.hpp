#pragma once
// http: downstream request parsing. llhttp in strict mode (no lenient flags;
// a common head whose facts it is known to read the same way is read
// without it, see request.cpp) plus the checks llhttp 8.1 leaves out: space before the colon, obs-fold
// continuation lines, bare CR / bare LF, NUL and CTL bytes in values, a Host
// that is no `host[:port]`, first bytes that cannot begin a request line
// (refused as they arrive: a TLS ClientHello on the plaintext port), and
// the size limits of docs/architecture.md §9. Nothing is ever repaired and forwarded.
//
// Views in request_head point into the caller's buffer: the buffer must hold
// the whole head and must not move while the views are used (see rebase()).
#include <llhttp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "sluice/core/assert.hpp"
#include "sluice/core/result.hpp"
#include "sluice/http/chunked.hpp"

namespace sluice::http {

struct limits {
  uint32_t head_bytes_max = 32u << 10;   // whole head: 431
  uint32_t line_bytes_max = 8u << 10;    // one header line: 431; request line: 414
  uint16_t header_count_max = 100;       // 431
  uint64_t body_bytes_max = 8u << 20;    // 413 (Content-Length known up front, or chunked running total)
};

enum class method : uint8_t { other, get, head, post, put, delete_, options, patch, connect, trace };

struct header {
  std::string_view name;
  std::string_view value;  // leading/trailing whitespace removed
};

// The most header fields a request head may have (server.max_header_count
// is clamped to it).
inline constexpr uint16_t k_headers_max = 128;

// Where the pre-scan found a field line's parts, as offsets from the first
// field line's first byte: its colon, its value without the whitespace
// around it, and its CR.
struct field_ref {
  uint16_t colon;
  uint16_t value_begin;
  uint16_t value_end;
  uint16_t cr;
};

// The first k_indexed_fields field lines of a head, as the pre-scan found
// them (256 bytes in a head; a line whose offsets pass 64 KiB, and every
// line after it, is not indexed). header_fields reads these without
// scanning the lines again.
inline constexpr uint16_t k_indexed_fields = 32;
struct field_index {
  uint16_t n = 0;            // lines indexed, from the first
  uint32_t lines_bytes = 0;  // the size of the field lines it was made for (set by copy_index)
  field_ref at[k_indexed_fields];
};

// Copies the n entries `from` holds, not the whole array, into the index of
// the head whose field lines are `lines`.
inline void copy_index(const field_index& from, std::string_view lines, field_index& to) noexcept {
  to.n = from.n;
  to.lines_bytes = static_cast<uint32_t>(lines.size());
  std::memcpy(to.at, from.at, size_t{from.n} * sizeof(field_ref));
}

// The header fields of a head the parser accepted, in order. A head keeps
// no array of every field (that would be ~4 KiB in every connection): the
// lines its index holds are read from it, and any after them are walked
// again when needed. The pre-scan has proven every line `name:value` CRLF
// (no fold, no bare CR/LF, no space before the colon), so splitting at the
// first colon and the LF is exact.
class header_fields {
 public:
  header_fields() noexcept = default;
  // `lines`: the field lines, each with its CRLF, without the empty line.
  explicit header_fields(std::string_view lines) noexcept : _rest(lines) {}
  // The same, with the pre-scan's index of those lines. An index made for
  // lines of another size is not theirs (a head whose lines were set
  // anew, its index left behind): the lines are walked instead, so no
  // offset can point past them.
  header_fields(std::string_view lines, const field_index& index) noexcept
      : _rest(lines), _base(lines.data()), _refs(index.at), _n(index.lines_bytes == lines.size() ? index.n : 0) {}
  // Returns: false past the last field; else the next field in `out`.
  bool next(header& out) noexcept {
    std::string_view line;
    return next(out, line);
  }
  // The same, and the field's whole line as it came, name through CRLF.
  // Inline: the heads' checks and the upstream request's copy walk every
  // field, ~40 a request, and an indexed line is a few loads.
  bool next(header& out, std::string_view& line) noexcept {
    if (_rest.empty()) return false;
    if (_i >= _n) return next_walked(out, line);
    // The pre-scan's index: the line's parts without looking at its bytes.
    const char* p = _rest.data();
    const field_ref r = _refs[_i++];
    SLUICE_ASSERT(_base + r.colon >= p && size_t{r.cr} + 2 <= static_cast<size_t>(p - _base) + _rest.size());
    out.name = std::string_view(p, static_cast<size_t>(_base + r.colon - p));
    out.value = std::string_view(_base + r.value_begin, size_t{r.value_end} - r.value_begin);
    line = std::string_view(p, static_cast<size_t>(_base + r.cr + 2 - p));
    _rest.remove_prefix(line.size());
    return true;
  }

 private:
  // A line past the index: found by its LF and its first colon.
  bool next_walked(header& out, std::string_view& line) noexcept;

  std::string_view _rest;
  const char* _base = nullptr;       // the first line's first byte: the index's offsets start here
  const field_ref* _refs = nullptr;
  uint16_t _i = 0, _n = 0;           // the next line's entry, and how many there are
};

// Shard-local, one per downstream connection (inside request_parser).
struct request_head {
  method meth = method::other;
  std::string_view method_name;
  std::string_view target;        // as sent: "/v1/chat/completions?x=1"
  std::string_view path;          // target up to '?' or '#'
  uint8_t version_major = 1;
  uint8_t version_minor = 1;
  bool keep_alive = true;         // from the version and Connection
  bool chunked = false;           // Transfer-Encoding: chunked (the only coding accepted:
                                  // "gzip, chunked" is 501, chunked not last is 400,
                                  // any Transfer-Encoding in HTTP/1.0 is 400)
  bool has_content_length = false;
  uint64_t content_length = 0;
  bool expect_continue = false;   // Expect: 100-continue (any other expectation: 417)
  uint32_t head_bytes = 0;        // bytes up to and including the empty line
  // Well-known fields, empty when absent. A second Authorization, Host,
  // Content-Length, Transfer-Encoding, Content-Type, X-Session-ID or
  // X-Request-ID is rejected by the parser (400), and so is a Host that is
  // not `host[:port]`. Connection and Upgrade are lists that may repeat: the
  // view is the first one.
  std::string_view authorization;
  std::string_view api_key;       // x-api-key: Anthropic's SDK sends the key here (a second one is 400 too)
  std::string_view host;
  std::string_view session_id;    // X-Session-ID
  std::string_view request_id;    // X-Request-ID
  std::string_view content_type;
  std::string_view connection;
  std::string_view upgrade;
  uint16_t header_count = 0;
  std::string_view field_lines;   // every field line with its CRLF; see header_fields
  field_index field_refs;         // the pre-scan's index of field_lines (n = 0: none, they are walked)

  header_fields fields() const noexcept { return header_fields(field_lines, field_refs); }

  // Moves every view from a buffer at old_base to the same offsets at
  // new_base (after the caller grew and moved its buffer).
  void rebase(const char* old_base, const char* new_base) noexcept;
};

// The outcome of a parse step. `status` is the HTTP status to answer with
// when `error` is set (400, 408, 413, 414, 417, 431, 501, 505); `message` is a
// static, human-readable reason for the OpenAI-shaped error body. An error
// always means: answer, then close the connection. core's errc has no code
// for 417 and 501: those carry errc::bad_request; `status` is what counts.
struct parse_status {
  errc error = errc::ok;          // ok, need_more, or the failure
  uint16_t status = 0;
  std::string_view message;
  bool ok() const noexcept { return error == errc::ok; }
  bool need_more() const noexcept { return error == errc::need_more; }
};

namespace detail {
// Progress of the head pre-scan across need_more calls (src/http/head_scan.hpp).
// Offsets only, so the caller may move its buffer between calls.
struct head_scan_state {
  uint32_t line_begin = 0;   // first byte of the line being scanned
  uint32_t pos = 0;          // where the LF search resumes
  uint32_t start_begin = 0;  // the request/status line
  uint32_t start_end = 0;    // at its CR
  uint32_t head_bytes = 0;   // set when complete
  uint16_t fields = 0;
  bool have_start_line = false;
  bool name_not_token = false;  // a field name holds a byte that is no tchar
  uint8_t error = 0;         // a detail::scan_error
};
}  // namespace detail

// Shard-local, one per downstream connection; reset() between requests.
class request_parser {
 public:
  explicit request_parser(const limits& l) noexcept;
  request_parser(const request_parser&) = delete;
  request_parser& operator=(const request_parser&) = delete;

  void reset() noexcept;

  // Tests: every head through llhttp, as when the fast reading does not
  // apply (the default reads the common heads without it, the same facts).
  void set_llhttp_only(bool on) noexcept { _llhttp_only = on; }
  // Whether llhttp parsed the head since the last reset() (tests).
  bool llhttp_ran() const noexcept { return _llhttp_used; }

  // `data`/`len`: every byte buffered so far for this request, starting at
  // its first byte. Returns need_more until the head is complete (and checks
  // the limits and the method on what is there so far, so an oversize head
  // or bytes that are no HTTP request fail early),
  // then ok with `out` filled, or an error. Only offsets are kept between
  // need_more calls, so the buffer may move; `out`'s views are written on
  // ok only. Never reads past the end of the head: the body and any
  // pipelined request after it are left alone. Errors are sticky until reset().
  parse_status parse_head(const char* data, size_t len, request_head& out) noexcept;

  // Chunked bodies only, after parse_head() returned ok. Decodes in place:
  // reads `len` raw bytes at `in` (the first not yet consumed) and writes the
  // payload to `out` (out <= in; the caller keeps decoded bytes contiguous).
  // Sets `consumed` (raw bytes used) and `produced` (payload bytes written).
  // Returns need_more until the last chunk and trailer section are consumed,
  // then ok (`consumed` then ends just past the final CRLF: later bytes are
  // the next request); 413 when the running total passes
  // limits.body_bytes_max, or when the framing (size lines, extensions,
  // CRLFs) passes max(limits.body_bytes_max, 64 KiB): the caller holds the
  // raw bytes until the body is complete, so tiny chunks with long
  // extensions must not make it hold many times the body limit. Strict: hex
  // sizes of at most 16 digits, CRLF everywhere, extensions ignored (at most
  // 4 KiB per chunk), trailers validated like header lines and dropped.
  parse_status decode_chunked(char* in, size_t len, char* out, size_t& consumed,
                              size_t& produced) noexcept;

 private:
  static const llhttp_settings_t* settings() noexcept;
  static int on_headers_complete(llhttp_t*);
  // What check_fields() notes when llhttp has not parsed the head.
  struct own_facts {
    uint16_t connections = 0;  // Connection fields
    bool ask_llhttp = false;   // Upgrade, Proxy-Connection, or a Connection not read here
  };
  void start_head(const char* data, request_head& out) noexcept;
  parse_status parse_request_line(const char* data) noexcept;
  // own: null after llhttp parsed the head (its flags are read); else the
  // head's facts are read without it and `own` says whether that was enough.
  parse_status check_fields(own_facts* own = nullptr) noexcept;
  parse_status chunk_fail(uint16_t status, std::string_view message) noexcept;

  limits _limits;
  llhttp_t _parser;
  detail::head_scan_state _scan;
  field_index _index;             // the field lines as the scan finds them; copied into the head
  request_head* _head = nullptr;
  parse_status _pending{errc::need_more, 0, {}};    // sticky once ok or failed
  chunk_walker _chunk;            // the chunked body (decode_chunked)
  parse_status _body_status{errc::need_more, 0, {}};
  bool _llhttp_only = false;
  bool _llhttp_used = true;       // since its last init: reset() inits it again
};

}  // namespace sluice::http
