// Fuzz target: the downstream HTTP/1.1 request path (http::request_parser).
// The input is a byte stream from a client, possibly several pipelined
// requests. For each request: parse the head all at once and again in reads
// of input-chosen sizes (a reused, reset() parser) and demand the same
// answer; check that every view lies inside the head; for a chunked body,
// decode the rest all at once, one byte per call and in random pieces, and
// demand the same payload, the same end and the same status.
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "sluice/http/request.hpp"

namespace {

using sluice::errc;
using sluice::fuzz::inside;
using sluice::fuzz::split_rng;
using namespace sluice::http;

constexpr uint16_t k_statuses[] = {400, 408, 413, 414, 417, 431, 501, 505};

// Small limits so that inputs of a few KiB reach every limit check.
limits small_limits() noexcept {
  limits l;
  l.head_bytes_max = 4096;
  l.line_bytes_max = 1024;
  l.header_count_max = 40;
  l.body_bytes_max = 2048;
  return l;
}

bool no_ctl(std::string_view v) noexcept {
  for (char c : v) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return true;
}

void check_status(const parse_status& st) {
  if (st.ok() || st.need_more()) return;
  bool known = false;
  for (uint16_t s : k_statuses) known = known || st.status == s;
  SLUICE_FUZZ_CHECK(known);
  SLUICE_FUZZ_CHECK(!st.message.empty());
}

// Every view of an accepted head lies inside its bytes, and holds no byte
// that could split or end a line downstream of sluice.
void check_head(const request_head& h, const char* data, size_t len, const limits& l) {
  SLUICE_FUZZ_CHECK(h.head_bytes > 0 && h.head_bytes <= len);
  SLUICE_FUZZ_CHECK(h.head_bytes <= l.head_bytes_max);
  const size_t hb = h.head_bytes;
  SLUICE_FUZZ_CHECK(std::string_view(data + hb - 2, 2) == "\r\n");
  for (std::string_view v : {h.method_name, h.target, h.path, h.authorization, h.host,
                             h.session_id, h.request_id, h.content_type, h.connection,
                             h.upgrade}) {
    SLUICE_FUZZ_CHECK(inside(v, data, hb));
    SLUICE_FUZZ_CHECK(no_ctl(v));
  }
  SLUICE_FUZZ_CHECK(!h.method_name.empty());
  SLUICE_FUZZ_CHECK(!h.target.empty());
  SLUICE_FUZZ_CHECK(h.target.substr(0, h.path.size()) == h.path);
  SLUICE_FUZZ_CHECK(h.header_count <= k_headers_max && h.header_count <= l.header_count_max);
  uint16_t fields = 0;
  header f;
  for (header_fields it = h.fields(); it.next(f); ++fields) {
    SLUICE_FUZZ_CHECK(!f.name.empty());
    SLUICE_FUZZ_CHECK(inside(f.name, data, hb) && inside(f.value, data, hb));
    SLUICE_FUZZ_CHECK(no_ctl(f.name) && no_ctl(f.value));
    SLUICE_FUZZ_CHECK(f.name.find(':') == std::string_view::npos);
  }
  SLUICE_FUZZ_CHECK(fields == h.header_count);
  // Smuggling: never both framings; a length over the limit is a 413.
  SLUICE_FUZZ_CHECK(!(h.chunked && h.has_content_length));
  SLUICE_FUZZ_CHECK(!h.has_content_length || h.content_length <= l.body_bytes_max);
  SLUICE_FUZZ_CHECK(!(h.chunked && h.version_major == 1 && h.version_minor == 0));
}

struct decoded {
  parse_status st{errc::need_more, 0, {}};
  size_t consumed = 0;              // raw bytes used
  std::vector<char> payload;
};

// Decodes `raw` with reads cut by `next_piece(left)` (0 = all at once).
template <typename Piece>
decoded decode(request_parser& p, const std::vector<char>& raw, Piece next_piece) {
  decoded d;
  std::vector<char> buf(raw);
  size_t rp = 0, wp = 0, avail = 0;
  while (true) {
    const size_t grow = next_piece(buf.size() - avail);
    avail += grow;
    size_t consumed = 0, produced = 0;
    d.st = p.decode_chunked(buf.data() + rp, avail - rp, buf.data() + wp, consumed, produced);
    check_status(d.st);
    SLUICE_FUZZ_CHECK(consumed <= avail - rp);
    // On an error the decoder leaves `consumed` at 0 (the connection closes
    // anyway), so the in-place bound holds for ok and need_more only.
    if (d.st.ok() || d.st.need_more()) SLUICE_FUZZ_CHECK(wp + produced <= rp + consumed);
    SLUICE_FUZZ_CHECK(wp + produced <= avail);
    rp += consumed;
    wp += produced;
    if (!d.st.need_more()) break;
    if (avail == buf.size()) break;
  }
  d.consumed = rp;
  d.payload.assign(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(wp));
  return d;
}

void same(const decoded& a, const decoded& b) {
  SLUICE_FUZZ_CHECK(a.st.error == b.st.error);
  SLUICE_FUZZ_CHECK(a.st.status == b.st.status);
  if (a.st.ok()) {
    SLUICE_FUZZ_CHECK(a.consumed == b.consumed);
    SLUICE_FUZZ_CHECK(a.payload == b.payload);
  }
  if (a.st.need_more()) SLUICE_FUZZ_CHECK(a.payload == b.payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const limits l = small_limits();
  split_rng rng(sluice::fuzz::input_hash(bytes, size));
  // A private, exactly sized copy: ASan then sees any read past the end.
  std::vector<char> stream(bytes, bytes + size);
  static request_head whole_head, split_head;

  size_t at = 0;
  for (int request = 0; request < 8 && at < stream.size(); ++request) {
    const char* data = stream.data() + at;
    const size_t len = stream.size() - at;

    request_parser whole(l);
    const parse_status st = whole.parse_head(data, len, whole_head);
    check_status(st);
    // Sticky: asking again gives the same answer.
    const parse_status again = whole.parse_head(data, len, whole_head);
    SLUICE_FUZZ_CHECK(again.error == st.error && again.status == st.status);

    // The same bytes in reads: first a throwaway parse so that reset() is
    // what makes the parser clean.
    request_parser split(l);
    (void)split.parse_head(data, len / 2, split_head);
    split.reset();
    parse_status sst{errc::need_more, 0, {}};
    size_t avail = 0;
    while (sst.need_more() && avail < len) {
      avail += rng.piece(len - avail);
      sst = split.parse_head(data, avail, split_head);
      check_status(sst);
    }
    if (sst.error != st.error || sst.status != st.status) {
      if (std::getenv("SLUICE_FUZZ_VERBOSE") != nullptr) {
        std::fprintf(stderr, "request %d: whole %u \"%.*s\", in reads %u \"%.*s\"\n", request,
                     st.status, static_cast<int>(st.message.size()), st.message.data(),
                     sst.status, static_cast<int>(sst.message.size()), sst.message.data());
      }
      // Which error a bad head gets may depend on where the reads end (a
      // line found too long before its bare LF arrives: 414 or 431 instead
      // of 400); that it is refused may not.
      SLUICE_FUZZ_CHECK(!st.ok() && !st.need_more() && !sst.ok() && !sst.need_more());
    }
    if (!st.ok()) break;
    check_head(whole_head, data, len, l);
    SLUICE_FUZZ_CHECK(split_head.head_bytes == whole_head.head_bytes);
    SLUICE_FUZZ_CHECK(split_head.chunked == whole_head.chunked);
    SLUICE_FUZZ_CHECK(split_head.content_length == whole_head.content_length);
    SLUICE_FUZZ_CHECK(split_head.header_count == whole_head.header_count);
    SLUICE_FUZZ_CHECK(split_head.target == whole_head.target);

    at += whole_head.head_bytes;
    if (whole_head.chunked) {
      const std::vector<char> raw(stream.begin() + static_cast<ptrdiff_t>(at), stream.end());
      const decoded one = decode(whole, raw, [](size_t left) { return left; });
      const decoded bytewise = decode(split, raw, [](size_t left) {
        return left < 1 ? left : size_t{1};
      });
      request_parser third(l);
      (void)third.parse_head(data, len, split_head);
      const decoded pieces = decode(third, raw, [&rng](size_t left) {
        return rng.piece(left);
      });
      same(one, bytewise);
      same(one, pieces);
      if (!one.st.ok()) break;
      SLUICE_FUZZ_CHECK(one.payload.size() <= l.body_bytes_max);
      SLUICE_FUZZ_CHECK(one.consumed >= 5);  // at least "0\r\n\r\n"
      at += one.consumed;
    } else if (whole_head.has_content_length) {
      if (whole_head.content_length > stream.size() - at) break;
      at += whole_head.content_length;
    }
  }
  return 0;
}
