// Spec-style cases for chunked request bodies: raw body bytes, the expected
// status (0 = complete, need_more = incomplete) and payload. Every row runs
// whole, one byte at a time and in pseudo-random splits, decoding in place
// the way the downstream connection does.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/http/chunked.hpp"
#include "sluice/http/request.hpp"

using namespace std::literals;
using sluice::errc;
namespace http = sluice::http;
using sluice::http::limits;
using sluice::http::parse_status;
using sluice::http::request_head;
using sluice::http::request_parser;

namespace {

constexpr limits k_limits{.head_bytes_max = 256, .line_bytes_max = 128,
                          .header_count_max = 4, .body_bytes_max = 64};
constexpr std::string_view k_head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
constexpr uint16_t k_incomplete = 1;  // the body needs more bytes

struct chunk_case {
  std::string_view name;
  std::string body;
  uint16_t status = 0;          // 0: complete; k_incomplete; or the error status
  std::string_view payload = {};
  size_t rest = 0;              // bytes after the message that must stay unconsumed
};

const std::vector<chunk_case>& cases() {
  static const std::vector<chunk_case> k = {
      {"one chunk", "5\r\nhello\r\n0\r\n\r\n", 0, "hello"},
      {"two chunks", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 0, "hello world"},
      {"empty body", "0\r\n\r\n", 0, ""},
      {"upper-case hex", "A\r\n0123456789\r\n0\r\n\r\n", 0, "0123456789"},
      {"lower-case hex", "a\r\n0123456789\r\n0\r\n\r\n", 0, "0123456789"},
      {"leading zeros", "0005\r\nhello\r\n0000\r\n\r\n", 0, "hello"},
      {"payload holding CRLF", "4\r\n\r\n\r\n\r\n0\r\n\r\n", 0, "\r\n\r\n"},
      {"extensions are ignored", "5;name=value\r\nhello\r\n0;last\r\n\r\n", 0, "hello"},
      {"quoted extension", "5;a=\"b; c\"\r\nhello\r\n0\r\n\r\n", 0, "hello"},
      {"whitespace before the extension", "5 \t;x\r\nhello\r\n0\r\n\r\n", 0, "hello"},
      {"trailers are consumed", "5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-B:\tc d\r\n\r\n", 0, "hello"},
      {"bytes after the message stay", "5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n", 0, "hello", 16},
      {"body at its limit", "40\r\n" + std::string(64, 'x') + "\r\n0\r\n\r\n", 0, {}},

      {"truncated in the data", "5\r\nhel", k_incomplete},
      {"truncated before the last chunk", "5\r\nhello\r\n", k_incomplete},
      {"truncated before the final CRLF", "5\r\nhello\r\n0\r\n", k_incomplete},

      {"non-hex size", "g\r\nhello\r\n0\r\n\r\n", 400},
      {"empty size", "\r\nhello\r\n0\r\n\r\n", 400},
      {"signed size", "+5\r\nhello\r\n0\r\n\r\n", 400},
      {"0x prefix", "0x5\r\nhello\r\n0\r\n\r\n", 400},
      {"whitespace before the size", " 5\r\nhello\r\n0\r\n\r\n", 400},
      {"whitespace after the size without extension", "5 \r\nhello\r\n0\r\n\r\n", 400},
      {"bare LF after the size", "5\nhello\r\n0\r\n\r\n", 400},
      {"bare CR after the size", "5\rhello\r\n0\r\n\r\n", 400},
      {"bare LF after the data", "5\r\nhello\n0\r\n\r\n", 400},
      {"data longer than its size", "5\r\nhelloX\r\n0\r\n\r\n", 400},
      {"missing CRLF after the data", "5\r\nhello0\r\n\r\n", 400},
      {"bare LF ends the body", "5\r\nhello\r\n0\r\n\n", 400},
      {"CR CR ends the body", "5\r\nhello\r\n0\r\n\r\r", 400},
      {"bare LF in the extension", "5;a\nhello\r\n0\r\n\r\n", 400},
      {"CTL in the extension", "5;a\x01\r\nhello\r\n0\r\n\r\n", 400},
      {"NUL in the extension", "5;a\0\r\nhello\r\n0\r\n\r\n"s, 400},
      {"overlong extension", "5;" + std::string(5000, 'e') + "\r\nhello\r\n0\r\n\r\n", 400},
      {"obs-fold in the trailers", "0\r\nX: a\r\n b\r\n\r\n", 400},
      {"space before the colon in a trailer", "0\r\nX : a\r\n\r\n", 400},
      {"bare LF in a trailer", "0\r\nX: a\n\r\n", 400},
      {"CTL in a trailer", "0\r\nX: a\x01\r\n\r\n", 400},
      {"trailer without a colon", "0\r\nX\r\n\r\n", 400},
      {"17 zero digits", "00000000000000000\r\n\r\n", 400},

      {"size above the body limit", "41\r\n", 413},
      {"sizes adding up above the body limit", "20\r\n" + std::string(32, 'x') + "\r\n21\r\n", 413},
      {"size overflowing 64 bits", "FFFFFFFFFFFFFFFFF\r\n", 413},
      {"size of 2^64", "10000000000000000\r\n", 413},
      {"trailer section over the head limit", "0\r\nX: " + std::string(300, 'v') + "\r\n\r\n", 431},
      {"too many trailer fields", "0\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n", 431},
  };
  return k;
}

struct outcome {
  uint16_t status = 0;
  std::string payload;
  size_t consumed = 0;  // raw body bytes used in total
};

// Decodes `body` delivered in pieces of the sizes `split` returns, in place,
// as the connection does: [decoded payload][raw bytes not yet consumed].
template <class Split>
outcome decode(const std::string& body, Split split) {
  request_parser p(k_limits);
  request_head h;
  REQUIRE(p.parse_head(k_head.data(), k_head.size(), h).ok());
  REQUIRE(h.chunked);
  std::string buf(body.size(), '\0');
  size_t payload = 0, raw_begin = 0, raw_end = 0, arrived = 0, consumed = 0;
  parse_status s{errc::need_more, 0, {}};
  while (s.need_more() && arrived < body.size()) {
    const size_t n = std::min(split(), body.size() - arrived);
    // New bytes land after the unconsumed raw bytes.
    body.copy(buf.data() + raw_end, n, arrived);
    arrived += n;
    raw_end += n;
    size_t used = 0, produced = 0;
    s = p.decode_chunked(buf.data() + raw_begin, raw_end - raw_begin, buf.data() + payload, used, produced);
    if (s.ok() || s.need_more()) REQUIRE(payload + produced <= raw_begin + used);
    payload += produced;
    raw_begin += used;
    consumed += used;
    if (s.need_more()) {
      REQUIRE(raw_begin == raw_end);  // need_more consumes everything
      raw_begin = raw_end = payload;
    }
  }
  outcome o;
  o.status = s.ok() ? 0 : (s.need_more() ? k_incomplete : s.status);
  o.payload.assign(buf.data(), payload);
  o.consumed = consumed;
  return o;
}

void check(const chunk_case& c, const outcome& o) {
  CHECK(o.status == c.status);
  if (c.status == 0) {
    if (!c.payload.empty() || c.name == "empty body") CHECK(o.payload == c.payload);
    CHECK(o.consumed == c.body.size() - c.rest);
  }
}

}  // namespace

TEST_SUITE("http::request_parser::decode_chunked") {
  TEST_CASE("every spec row decodes fed whole") {
    for (const chunk_case& c : cases()) {
      CAPTURE(c.name);
      check(c, decode(c.body, [&] { return c.body.size(); }));
    }
  }

  TEST_CASE("every spec row decodes the same fed one byte at a time") {
    for (const chunk_case& c : cases()) {
      CAPTURE(c.name);
      check(c, decode(c.body, [] { return size_t{1}; }));
    }
  }

  TEST_CASE("every spec row decodes the same in pseudo-random splits") {
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      for (const chunk_case& c : cases()) {
        CAPTURE(c.name);
        CAPTURE(seed);
        uint32_t x = seed * 2654435761u;
        check(c, decode(c.body, [&] {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                return size_t{1} + x % 7;
              }));
      }
    }
  }

  TEST_CASE("a body at the limit is accepted in full") {
    const std::string body = "40\r\n" + std::string(64, 'x') + "\r\n0\r\n\r\n";
    const outcome o = decode(body, [] { return size_t{3}; });
    CHECK(o.status == 0);
    CHECK(o.payload == std::string(64, 'x'));
  }

  TEST_CASE("framing past 64 KiB is refused with 413 though the payload is under the limit") {
    // 60 one-byte chunks with 1100-byte extensions: 60 payload bytes (the
    // limit is 64), 66360 framing bytes.
    std::string body;
    for (int i = 0; i < 60; ++i) body += "1;" + std::string(1100, 'e') + "\r\nx\r\n";
    body += "0\r\n\r\n";
    CHECK(decode(body, [] { return size_t{97}; }).status == 413);
    CHECK(decode(body, [&] { return body.size(); }).status == 413);
  }

  TEST_CASE("framing under 64 KiB is accepted whatever the body limit") {
    std::string body;
    for (int i = 0; i < 50; ++i) body += "1;" + std::string(1100, 'e') + "\r\nx\r\n";
    body += "0\r\n\r\n";
    const outcome o = decode(body, [] { return size_t{97}; });
    CHECK(o.status == 0);
    CHECK(o.payload == std::string(50, 'x'));
  }

  TEST_CASE("after completion further calls consume nothing") {
    request_parser p(k_limits);
    request_head h;
    REQUIRE(p.parse_head(k_head.data(), k_head.size(), h).ok());
    std::string b = "0\r\n\r\nGET";
    size_t used = 0, produced = 0;
    REQUIRE(p.decode_chunked(b.data(), b.size(), b.data(), used, produced).ok());
    CHECK(used == 5);
    CHECK(p.decode_chunked(b.data() + 5, 3, b.data(), used, produced).ok());
    CHECK(used == 0);
    CHECK(produced == 0);
  }

  TEST_CASE("the decoder state is cleared by reset") {
    request_parser p(k_limits);
    request_head h;
    REQUIRE(p.parse_head(k_head.data(), k_head.size(), h).ok());
    std::string b = "5\r\nhe";
    size_t used = 0, produced = 0;
    CHECK(p.decode_chunked(b.data(), b.size(), b.data(), used, produced).need_more());
    p.reset();
    REQUIRE(p.parse_head(k_head.data(), k_head.size(), h).ok());
    std::string c = "2\r\nok\r\n0\r\n\r\n";
    CHECK(p.decode_chunked(c.data(), c.size(), c.data(), used, produced).ok());
    CHECK(std::string_view(c.data(), produced) == "ok");
  }
}

TEST_SUITE("http::read_chunk_size_line and scan_whole_chunks (bytes read again)") {
  TEST_CASE("a size line: its digits, extensions and CRLF, at most 16 digits") {
    const std::string s = "1a;ext=1\r\nrest";
    size_t i = 0;
    uint64_t size = 0;
    REQUIRE(http::read_chunk_size_line(s.data(), s.size(), i, size));
    CHECK(size == 0x1a);
    CHECK(i == 10);
    SUBCASE("16 digits fill a uint64_t") {
      const std::string m = "FFFFFFFFFFFFFFFF\r\n";
      i = 0;
      REQUIRE(http::read_chunk_size_line(m.data(), m.size(), i, size));
      CHECK(size == UINT64_MAX);
    }
    SUBCASE("17 digits, no digit, or no LF: no line, nothing moved") {
      for (const std::string bad : {"1FFFFFFFFFFFFFFFF\r\n", "00000000000000001\r\n", "\r\n", "x\r\n", "12\r"}) {
        CAPTURE(bad);
        i = 0;
        size = 7;
        CHECK_FALSE(http::read_chunk_size_line(bad.data(), bad.size(), i, size));
        CHECK(i == 0);
        CHECK(size == 7);
      }
    }
  }

  TEST_CASE("whole chunks up to the terminal chunk or the first thing that is not one") {
    const std::string s = "3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n";
    http::whole_chunks w = http::scan_whole_chunks(s.data(), s.size());
    CHECK(w.payload == 5);
    CHECK(w.last);
    CHECK(w.end == s.size() - 2);
    const std::string cut = "3\r\nabc\r\n5\r\nab";
    w = http::scan_whole_chunks(cut.data(), cut.size());
    CHECK(w.payload == 3);
    CHECK_FALSE(w.last);
    CHECK(w.end == 8);
    const std::string no_crlf = "3\r\nabcXY";
    CHECK(http::scan_whole_chunks(no_crlf.data(), no_crlf.size()).end == 0);
  }

  TEST_CASE("sizes that would wrap a 64-bit sum end the walk (a batch cut mid-chunk by a hostile backend)") {
    // "1\nX\r\n" then a size that wraps i + size back to the same place:
    // the unbounded reader looped here for ever.
    std::string s = "1\nX\r\nFFFFFFFFFFFFFFED\n";
    s.append(1000, 'A');
    http::whole_chunks w = http::scan_whole_chunks(s.data(), s.size());
    CHECK(w.payload == 1);
    CHECK(w.end == 5);
    std::string huge = "FFFFFFFFFFFFFFFF\n";
    huge.append(64, 'B');
    w = http::scan_whole_chunks(huge.data(), huge.size());
    CHECK(w.payload == 0);
    CHECK(w.end == 0);
    // 17 digits of zeros then a 1: refused, not read as 1.
    const std::string padded = "00000000000000001\r\nX\r\n";
    CHECK(http::scan_whole_chunks(padded.data(), padded.size()).payload == 0);
  }
}
