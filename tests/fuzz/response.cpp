// Fuzz target: the upstream (backend) response path. The input is what a
// backend sends: a status line and headers, then a body that
// http::response_parser de-chunks into an http::sse_scanner, whose events go
// through openai::scan_stream_event. The body is fed all at once, one byte
// per call and in random reads, and the three runs must agree on the end of
// the message, the payload and the events. The SSE scanner is also checked
// on the raw input against a plain reference of the WHATWG event-stream
// rules, and an event stream is fed again with the skip of plain chunks on
// (body_sink::skip_ok): what it skips and what it still reports must add up
// to the full scan's events. A stream event's walk, where it vouches, must
// read what its parse reads; a non-stream body's usage read from its end
// must match a full parse of it.
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"
#include "sluice/openai/request.hpp"

namespace {

using sluice::errc;
using sluice::fuzz::inside;
using sluice::fuzz::split_rng;
using namespace sluice::http;
namespace openai = sluice::openai;

struct event_copy {
  std::string data;
  bool truncated = false;
  bool operator==(const event_copy&) const = default;
};

void check_event_info(std::string_view payload) {
  const openai::stream_event_info a = openai::scan_stream_event(payload);
  // The scratch is reused: a second scan of the same bytes reads the same.
  const openai::stream_event_info b = openai::scan_stream_event(payload);
  SLUICE_FUZZ_CHECK(a.done == b.done && a.error == b.error && a.has_usage == b.has_usage);
  SLUICE_FUZZ_CHECK(a.usage_only == b.usage_only && a.has_content == b.has_content);
  SLUICE_FUZZ_CHECK(a.prompt_tokens == b.prompt_tokens);
  SLUICE_FUZZ_CHECK(a.completion_tokens == b.completion_tokens);
  SLUICE_FUZZ_CHECK(a.malformed == b.malformed && a.finish_reason == b.finish_reason);
  SLUICE_FUZZ_CHECK(!(a.usage_only && !a.has_usage));
  // Where the walk vouches, its answer is the parse's.
  openai::stream_event_info w;
  if (openai::detail::walk_stream_event(payload, w)) {
    const openai::stream_event_info p = openai::detail::scan_stream_event_parsed(payload);
    SLUICE_FUZZ_CHECK(w.done == p.done && w.error == p.error && w.has_usage == p.has_usage);
    SLUICE_FUZZ_CHECK(w.usage_only == p.usage_only && w.has_content == p.has_content);
    SLUICE_FUZZ_CHECK(w.prompt_tokens == p.prompt_tokens && w.completion_tokens == p.completion_tokens);
    SLUICE_FUZZ_CHECK(w.malformed == p.malformed && w.finish_reason == p.finish_reason);
  }
}

// A non-stream body's usage, read walking back from its end, is what a full
// parse reads wherever the body is a JSON object (the DOM says) with at most
// one top-level "usage" member; on any other bytes it only must not fault.
void check_usage(std::string_view payload) {
  openai::usage walked;
  const bool answered = openai::detail::scan_response_usage_from_end(payload, walked);
  const openai::usage u = openai::scan_response_usage(payload);
  if (answered) {
    SLUICE_FUZZ_CHECK(u.prompt_tokens == walked.prompt_tokens && u.completion_tokens == walked.completion_tokens &&
                      u.total_tokens == walked.total_tokens);
  }
  if (payload.empty()) return;
  static simdjson::dom::parser dom;
  simdjson::dom::object root;
  if (dom.parse(payload.data(), payload.size()).get(root) != simdjson::SUCCESS) return;
  size_t usages = 0;
  for (auto kv : root) usages += kv.key == "usage" ? 1 : 0;
  if (usages > 1) return;
  const openai::usage parsed = openai::detail::scan_response_usage_parsed(payload);
  SLUICE_FUZZ_CHECK(u.prompt_tokens == parsed.prompt_tokens && u.completion_tokens == parsed.completion_tokens &&
                    u.total_tokens == parsed.total_tokens);
}

// Collects the events of one scanner and scans each as a vLLM chunk.
struct event_log {
  std::vector<event_copy> events;
  static void on_event(void* ctx, const sse_event& ev) {
    SLUICE_FUZZ_CHECK(ev.data.size() <= sse_scanner::k_event_bytes_max);
    static_cast<event_log*>(ctx)->events.push_back({std::string(ev.data), ev.truncated});
    check_event_info(ev.data);
  }
};

// The de-chunked payload of one run, passed on to that run's scanner.
struct body_log {
  std::string payload;
  sse_scanner* scanner = nullptr;
  static void on_data(void* ctx, const char* data, size_t len) {
    auto* self = static_cast<body_log*>(ctx);
    SLUICE_FUZZ_CHECK(len > 0);
    self->payload.append(data, len);
    self->scanner->feed(data, len);
  }
};

// The WHATWG event-stream rules, written plainly: the scanner must report
// the same events (a truncated one as a prefix of the same size cap).
std::vector<std::string> reference_events(std::string_view s) {
  std::vector<std::string> out;
  std::string data;
  bool has_data = false;
  size_t i = 0;
  while (i < s.size()) {
    size_t end = i;
    while (end < s.size() && s[end] != '\r' && s[end] != '\n') ++end;
    if (end == s.size()) break;  // an unterminated last line is never dispatched
    const std::string_view line = s.substr(i, end - i);
    i = end + 1;
    if (s[end] == '\r' && i < s.size() && s[i] == '\n') ++i;
    if (line.empty()) {
      if (has_data) out.push_back(data);
      data.clear();
      has_data = false;
      continue;
    }
    if (line[0] == ':') continue;
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (name != "data") continue;
    if (has_data) data += '\n';
    data.append(value);
    has_data = true;
  }
  return out;
}

void check_scanner_alone(const std::vector<char>& bytes, split_rng& rng) {
  static event_log whole_log, split_log;
  static sse_scanner whole(event_log::on_event, &whole_log);
  static sse_scanner split(event_log::on_event, &split_log);
  whole_log.events.clear();
  split_log.events.clear();
  whole.reset();
  split.reset();
  whole.feed(bytes.data(), bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = rng.piece(bytes.size() - at);
    split.feed(bytes.data() + at, n);
    at += n;
  }
  SLUICE_FUZZ_CHECK(whole_log.events == split_log.events);
  SLUICE_FUZZ_CHECK(whole.events() == whole_log.events.size());
  const std::string_view s(bytes.data(), bytes.size());
  if (s.substr(0, 3) == "\xEF\xBB\xBF") return;  // a BOM: the reference would drop it
  const std::vector<std::string> ref = reference_events(s);
  SLUICE_FUZZ_CHECK(ref.size() == whole_log.events.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const event_copy& e = whole_log.events[i];
    if (e.truncated) {
      SLUICE_FUZZ_CHECK(ref[i].size() > e.data.size() || ref[i].size() > sse_scanner::k_event_bytes_max);
      SLUICE_FUZZ_CHECK(std::string_view(ref[i]).substr(0, e.data.size()) == e.data);
    } else {
      SLUICE_FUZZ_CHECK(ref[i] == e.data);
    }
  }
}

// The chunked coding (RFC 9112 §7.1) written plainly, line by line, as the
// reference for response_parser's walker. Limits aside (inputs here are
// small). Returns: 1 complete (`consumed` just past the final CRLF,
// `payload` the data), -1 malformed, 0 incomplete.
bool is_tchar_plain(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}
bool ctl_plain(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && u != '\t') || u == 0x7f;
}
int reference_dechunk(std::string_view s, size_t& consumed, std::string& payload) {
  size_t i = 0;
  // Returns the line at i without its CRLF; false when malformed, `more`
  // when no LF yet.
  auto line_at = [&](size_t at, std::string_view& line, bool& more) {
    const size_t lf = s.find('\n', at);
    more = lf == std::string_view::npos;
    if (more) return true;
    if (lf == at || s[lf - 1] != '\r') return false;
    line = s.substr(at, lf - 1 - at);
    return line.find('\r') == std::string_view::npos;
  };
  while (true) {
    std::string_view line;
    bool more = false;
    if (!line_at(i, line, more)) return -1;
    if (more) return 0;
    size_t d = 0;
    uint64_t size = 0;
    while (d < line.size() && std::isxdigit(static_cast<unsigned char>(line[d])) != 0) {
      const char c = line[d];
      size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
      ++d;
    }
    if (d == 0 || d > 16) return -1;
    std::string_view rest = line.substr(d);
    while (!rest.empty() && (rest[0] == ' ' || rest[0] == '\t')) rest.remove_prefix(1);
    if (rest.size() != line.size() - d && (rest.empty() || rest[0] != ';')) return -1;  // BWS only before ';'
    if (!rest.empty()) {
      if (rest[0] != ';') return -1;
      for (char c : rest) {
        if (ctl_plain(c)) return -1;
      }
    }
    i += line.size() + 2;
    if (size == 0) break;
    if (s.size() - i < size) return 0;
    payload.append(s.substr(i, size));
    i += size;
    if (s.size() - i < 2) {
      if (s.size() > i && s[i] != '\r') return -1;
      return 0;
    }
    if (s[i] != '\r' || s[i + 1] != '\n') return -1;
    i += 2;
  }
  size_t fields = 0;
  while (true) {  // trailer fields (as many as a head may have), then the empty line
    std::string_view line;
    bool more = false;
    if (!line_at(i, line, more)) return -1;
    if (more) return 0;
    i += line.size() + 2;
    if (line.empty()) {
      consumed = i;
      return 1;
    }
    if (++fields > k_response_headers_max) return -1;
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos) return -1;
    for (size_t k = 0; k < colon; ++k) {
      if (!is_tchar_plain(line[k])) return -1;
    }
    for (size_t k = colon + 1; k < line.size(); ++k) {
      if (ctl_plain(line[k])) return -1;
    }
  }
}

// One complete run of the body through a parser, cut into reads by `piece`.
struct body_run {
  errc error = errc::ok;
  bool complete = false;
  bool eof_complete = false;
  size_t consumed = 0;
  body_log body;
  event_log events;
};

template <typename Piece>
void feed_all(response_parser& p, const char* data, size_t len, body_run& run, Piece piece) {
  auto scanner = std::make_unique<sse_scanner>(event_log::on_event, &run.events);
  run.body.scanner = scanner.get();
  const body_sink sink{body_log::on_data, &run.body};
  size_t avail = run.consumed;
  while (true) {
    avail += piece(len - avail);
    const body_status st = p.feed_body(data + run.consumed, avail - run.consumed, sink);
    const size_t given = avail - run.consumed;
    SLUICE_FUZZ_CHECK(st.consumed <= given);
    SLUICE_FUZZ_CHECK(st.chunk_end <= st.consumed);
    if (st.error != errc::ok) {
      SLUICE_FUZZ_CHECK(st.error == errc::upstream_protocol);
      SLUICE_FUZZ_CHECK(!st.complete);
      run.error = st.error;
      run.consumed += st.consumed;
      // Sticky.
      const body_status again = p.feed_body(data + run.consumed, len - run.consumed, sink);
      SLUICE_FUZZ_CHECK(again.error == errc::upstream_protocol);
      break;
    }
    run.consumed += st.consumed;
    if (st.complete) {
      run.complete = true;
      // Stops exactly: nothing more is taken, and it stays complete.
      const body_status again = p.feed_body(data + run.consumed, len - run.consumed, sink);
      SLUICE_FUZZ_CHECK(again.complete && again.consumed == 0 && again.error == errc::ok);
      break;
    }
    SLUICE_FUZZ_CHECK(st.consumed == given);
    if (avail == len) break;
  }
  run.eof_complete = p.finish_at_eof();
  SLUICE_FUZZ_CHECK(!run.complete || run.eof_complete);
  SLUICE_FUZZ_CHECK(!(run.error != errc::ok && run.eof_complete));
  // Long events are cut in the scan copy, never in the payload.
  SLUICE_FUZZ_CHECK(run.body.payload.size() <= run.consumed);
}

void same(const body_run& a, const body_run& b) {
  SLUICE_FUZZ_CHECK(a.error == b.error);
  SLUICE_FUZZ_CHECK(a.complete == b.complete);
  SLUICE_FUZZ_CHECK(a.eof_complete == b.eof_complete);
  if (a.error == errc::ok) {
    SLUICE_FUZZ_CHECK(a.consumed == b.consumed);
    SLUICE_FUZZ_CHECK(a.body.payload == b.body.payload);
    SLUICE_FUZZ_CHECK(a.events.events == b.events.events);
  }
}

// A run with the skip on (body_sink::skip_ok, as the relay keeps it:
// between two events, past the first): what it skips plus what its scanner
// reports must be what the full scan reports.
constexpr std::string_view k_skip_head = "data: {";
constexpr std::string_view k_skip_tail = "\"finish_reason\":null}]}\n\n";
struct skip_run {
  event_log events;
  std::unique_ptr<sse_scanner> scanner = std::make_unique<sse_scanner>(event_log::on_event, &events);
  uint64_t skipped = 0;
  bool ok = false;
  void keep() noexcept { ok = scanner->between_events() && scanner->events() + skipped > 0; }
  static void on_data(void* ctx, const char* data, size_t len) {
    auto* self = static_cast<skip_run*>(ctx);
    self->scanner->feed(data, len);
  }
  static void on_chunk_end(void* ctx, const char*) { static_cast<skip_run*>(ctx)->keep(); }
  static void on_skipped(void* ctx, uint32_t chunks, const char*) {
    SLUICE_FUZZ_CHECK(chunks > 0);
    static_cast<skip_run*>(ctx)->skipped += chunks;
  }
};

// The events of the full scan that a skip may stand for: one data line that
// the skip's head and tail frame.
bool plain(const event_copy& e) {
  constexpr std::string_view tail = k_skip_tail.substr(0, k_skip_tail.size() - 2);
  return !e.truncated && e.data.size() >= 1 + tail.size() && e.data[0] == '{' &&
         std::string_view(e.data).substr(e.data.size() - tail.size()) == tail &&
         e.data.find_first_of("\r\n") == std::string::npos;
}

template <typename Piece>
void check_skip(const char* head, size_t head_len, const char* body, size_t body_len, const body_run& full, Piece piece) {
  response_parser p;
  response_head h;
  SLUICE_FUZZ_CHECK(p.parse_head(head, head_len, h).ok());
  skip_run run;
  body_sink sink{skip_run::on_data, &run, skip_run::on_chunk_end, nullptr};
  sink.skip_ok = &run.ok;
  sink.skip_head = k_skip_head;
  sink.skip_tail = k_skip_tail;
  sink.on_skipped = skip_run::on_skipped;
  size_t consumed = 0, avail = 0;
  while (avail < body_len) {
    avail += piece(body_len - avail);
    const body_status st = p.feed_body(body + consumed, avail - consumed, sink);
    if (st.error != errc::ok || st.complete) break;
    consumed += st.consumed;
  }
  if (full.error != errc::ok) return;  // up to the error the runs may differ in where they stopped
  // Every event is either reported or skipped, and only plain ones are skipped:
  // the others, in order, are the same.
  SLUICE_FUZZ_CHECK(run.events.events.size() + run.skipped == full.events.events.size());
  std::vector<event_copy> full_rest, skip_rest;
  size_t full_plain = 0;
  for (const event_copy& e : full.events.events) {
    if (plain(e)) {
      ++full_plain;
    } else {
      full_rest.push_back(e);
    }
  }
  for (const event_copy& e : run.events.events) {
    if (!plain(e)) skip_rest.push_back(e);
  }
  SLUICE_FUZZ_CHECK(run.skipped <= full_plain);
  SLUICE_FUZZ_CHECK(full_rest == skip_rest);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  split_rng rng(sluice::fuzz::input_hash(bytes, size));
  const std::vector<char> stream(bytes, bytes + size);
  const char* data = stream.data();
  const size_t len = stream.size();

  check_scanner_alone(stream, rng);
  check_usage(std::string_view(data, len));

  const bool head_request = (rng.next() & 7) == 0;
  static response_head whole_head, split_head, byte_head;
  response_parser whole, split, bytewise;
  whole.reset(head_request);
  split.reset(head_request);
  bytewise.reset(head_request);

  const parse_status st = whole.parse_head(data, len, whole_head);
  if (!st.ok() && !st.need_more()) {
    SLUICE_FUZZ_CHECK(st.error == errc::upstream_protocol);
    SLUICE_FUZZ_CHECK(!st.message.empty());
  }
  parse_status sst{errc::need_more, 0, {}};
  for (size_t avail = 0; sst.need_more() && avail < len;) {
    avail += rng.piece(len - avail);
    sst = split.parse_head(data, avail, split_head);
  }
  SLUICE_FUZZ_CHECK(sst.error == st.error && sst.status == st.status);
  if (!st.ok()) return 0;

  const response_head& h = whole_head;
  SLUICE_FUZZ_CHECK(h.head_bytes > 0 && h.head_bytes <= len);
  SLUICE_FUZZ_CHECK(h.head_bytes == split_head.head_bytes);
  SLUICE_FUZZ_CHECK(h.status >= 200 && h.status <= 599);
  SLUICE_FUZZ_CHECK(!(h.chunked && h.has_content_length));
  SLUICE_FUZZ_CHECK(inside(h.reason, data, h.head_bytes) && inside(h.content_type, data, h.head_bytes));
  SLUICE_FUZZ_CHECK(h.header_count <= k_response_headers_max);
  uint16_t fields = 0;
  header f;
  for (header_fields it = h.fields(); it.next(f); ++fields) {
    SLUICE_FUZZ_CHECK(!f.name.empty());
    SLUICE_FUZZ_CHECK(inside(f.name, data, h.head_bytes));
    SLUICE_FUZZ_CHECK(inside(f.value, data, h.head_bytes));
  }
  SLUICE_FUZZ_CHECK(fields == h.header_count);
  SLUICE_FUZZ_CHECK(bytewise.parse_head(data, len, byte_head).ok());

  const char* body = data + h.head_bytes;
  const size_t body_len = len - h.head_bytes;
  body_run one, pieces, bytes1;
  feed_all(whole, body, body_len, one, [](size_t left) { return left; });
  feed_all(split, body, body_len, pieces, [&rng](size_t left) { return rng.piece(left); });
  feed_all(bytewise, body, body_len, bytes1, [](size_t left) { return left < 1 ? left : size_t{1}; });
  same(one, pieces);
  same(one, bytes1);
  if (h.chunked && h.event_stream && !head_request) {
    check_skip(data, h.head_bytes, body, body_len, one, [](size_t left) { return left; });
    check_skip(data, h.head_bytes, body, body_len, one, [&rng](size_t left) { return rng.piece(left); });
  }
  if (!h.event_stream) check_usage(one.body.payload);
  if (one.complete && h.has_content_length && !head_request && h.status != 204 &&
      h.status != 304) {
    SLUICE_FUZZ_CHECK(one.consumed == h.content_length);
  }
  // Chunked bodies agree with the plain reference.
  if (h.chunked && !head_request && h.status != 204 && h.status != 304 && body_len < 4000) {
    size_t ref_consumed = 0;
    std::string ref_payload;
    const int ref = reference_dechunk(std::string_view(body, body_len), ref_consumed, ref_payload);
    if (ref == 1) {
      SLUICE_FUZZ_CHECK(one.complete && one.error == errc::ok);
      SLUICE_FUZZ_CHECK(one.consumed == ref_consumed);
      SLUICE_FUZZ_CHECK(one.body.payload == ref_payload);
    } else if (ref == -1) {
      SLUICE_FUZZ_CHECK(one.error == errc::upstream_protocol);
    } else {
      SLUICE_FUZZ_CHECK(!one.complete);
    }
  }
  return 0;
}
