// Spec-style cases for the downstream request head: one row per input, the
// expected status (0 = accepted) and, for accepted heads, the fields. A new
// edge case is a new row. Every row also runs fed one byte at a time, from
// a buffer that moves between calls.
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "same_walks.hpp"
#include "sluice/http/request.hpp"

using namespace std::literals;
using sluice::errc;
using sluice::http::header;
using sluice::http::header_fields;
using sluice::http::limits;
using sluice::http::method;
using sluice::http::parse_status;
using sluice::http::request_head;
using sluice::http::request_parser;

namespace {

// Small limits so the oversize rows stay readable.
constexpr limits k_limits{.head_bytes_max = 1024, .line_bytes_max = 128,
                          .header_count_max = 8, .body_bytes_max = 1000};

std::string big(char c, size_t n) { return std::string(n, c); }

std::vector<header> all_fields(const request_head& h) {
  std::vector<header> v;
  header f;
  for (header_fields it = h.fields(); it.next(f);) v.push_back(f);
  return v;
}

struct accepted {
  method meth = method::get;
  std::string_view path = "/";
  bool keep_alive = true;
  bool chunked = false;
  int64_t content_length = -1;  // -1: no Content-Length
  bool expect_continue = false;
};

struct head_case {
  std::string_view name;
  std::string input;
  uint16_t status = 0;  // 0: accepted, with `want`
  accepted want = {};
  // Not 0: the input cannot begin a request line, and fed one byte at a time
  // it is refused (400) at exactly this many bytes, before any head ends.
  size_t fails_at = 0;
};

const std::vector<head_case>& cases() {
  static const std::vector<head_case> k = {
      // Accepted.
      {"minimal GET", "GET / HTTP/1.1\r\nHost: a\r\n\r\n"},
      {"POST with Content-Length", "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
       0, {.meth = method::post, .path = "/v1/chat/completions", .content_length = 5}},
      {"POST chunked", "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
       0, {.meth = method::post, .path = "/v1/completions", .chunked = true}},
      {"chunked in upper case", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n",
       0, {.meth = method::post, .chunked = true}},
      {"chunked with extra OWS", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  \tchunked \r\n\r\n",
       0, {.meth = method::post, .chunked = true}},
      {"query is not part of the path", "GET /v1/models?limit=1 HTTP/1.1\r\nHost: a\r\n\r\n",
       0, {.path = "/v1/models"}},
      {"HTTP/1.1 Connection: close", "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
       0, {.keep_alive = false}},
      {"HTTP/1.0 closes by default, Host optional", "GET / HTTP/1.0\r\n\r\n", 0, {.keep_alive = false}},
      {"HTTP/1.0 Connection: keep-alive", "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 0, {}},
      {"Expect: 100-continue", "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n",
       0, {.meth = method::post, .content_length = 3, .expect_continue = true}},
      {"Expect: 100-continue ignored in HTTP/1.0", "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
       0, {.meth = method::post, .keep_alive = false, .content_length = 3}},
      {"Content-Length: 0", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
       0, {.meth = method::post, .content_length = 0}},
      {"Content-Length at the body limit", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n",
       0, {.meth = method::post, .content_length = 1000}},
      {"Content-Length with leading zeros", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 007\r\n\r\n",
       0, {.meth = method::post, .content_length = 7}},
      {"empty line before the request line", "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"},
      {"HTAB and obs-text in a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\tb\xff\r\n\r\n"},
      {"empty value", "GET / HTTP/1.1\r\nHost: a\r\nX-Empty:\r\n\r\n"},
      {"DELETE", "DELETE /x HTTP/1.1\r\nHost: a\r\n\r\n", 0, {.meth = method::delete_, .path = "/x"}},
      {"PATCH", "PATCH / HTTP/1.1\r\nHost: a\r\n\r\n", 0, {.meth = method::patch}},
      {"a known method sluice has no name for", "PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n", 0, {.meth = method::other}},
      {"request line at its limit", "GET /" + big('a', 128 - 14) + " HTTP/1.1\r\nHost: a\r\n\r\n", 0,
       {.path = ""}},
      {"header line at its limit", "GET / HTTP/1.1\r\nHost: a\r\nX: " + big('v', 125) + "\r\n\r\n"},
      {"Host with a port", "GET / HTTP/1.1\r\nHost: a.example:8080\r\n\r\n"},
      {"Host an IPv4 address with a port", "GET / HTTP/1.1\r\nHost: 127.0.0.1:65535\r\n\r\n"},
      {"Host an IPv6 literal with a port", "GET / HTTP/1.1\r\nHost: [::1]:443\r\n\r\n"},
      {"method of 32 bytes is still a method (one sluice does not know)",
       big('X', 32) + " / HTTP/1.1\r\nHost: a\r\n\r\n", 501},
      {"header count at its limit", "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\n\r\n"},

      // Smuggling shapes: framing that two hops could read differently.
      {"CL.TE", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"TE.CL", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n", 400},
      {"TE xchunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", 400},
      {"TE chunked, identity", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 400},
      {"TE identity", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", 400},
      {"TE chunked twice in one field", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400},
      {"TE gzip, chunked is not implemented", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"TE twice", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"TE behind obs-fold", "POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n", 400},
      {"TE with space before colon", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n", 400},
      {"duplicate Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 400},
      {"list Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", 400},
      {"signed Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", 400},
      {"negative Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
      {"hex Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", 400},
      {"empty Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", 400},
      {"Content-Length 2^63", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\n", 400},
      {"Content-Length 2^64", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", 400},
      {"Content-Length above the body limit", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n", 413},

      // Line grammar llhttp 8.1 lets through.
      {"space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400},
      {"tab before colon", "GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", 400},
      {"obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n  c\r\n\r\n", 400},
      {"first header line starts with a space", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400},
      {"bare LF ends a header line", "GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", 400},
      {"bare LF ends the request line", "GET / HTTP/1.1\nHost: a\r\n\r\n", 400},
      {"bare LF ends the head", "GET / HTTP/1.1\r\nHost: a\r\n\n", 400},
      {"bare CR in a value", "GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400},
      {"bare CR in a name", "GET / HTTP/1.1\r\nHo\rst: a\r\n\r\n", 400},
      {"NUL in a value", "GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n"s, 400},
      {"NUL in the request line", "GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n"s, 400},
      {"HTAB in the request line", "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, {}, 4},
      {"CTL in a value", "GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n", 400},
      {"DEL in a value", "GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n", 400},
      {"empty field name", "GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", 400},
      {"field line without a colon", "GET / HTTP/1.1\r\nHost: a\r\nX-A\r\n\r\n", 400},
      {"invalid character in a name", "GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n", 400},

      // Fields sluice reads: exactly one each.
      {"duplicate Host", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"duplicate Authorization", "GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\r\nauthorization: Bearer y\r\n\r\n", 400},
      {"duplicate X-Session-ID", "GET / HTTP/1.1\r\nHost: a\r\nX-Session-ID: 1\r\nX-Session-Id: 2\r\n\r\n", 400},
      {"duplicate X-Request-ID", "GET / HTTP/1.1\r\nHost: a\r\nX-Request-ID: 1\r\nX-Request-ID: 1\r\n\r\n", 400},
      {"duplicate Content-Type", "GET / HTTP/1.1\r\nHost: a\r\nContent-Type: a/b\r\nContent-Type: c/d\r\n\r\n", 400},
      {"HTTP/1.1 without Host", "GET / HTTP/1.1\r\nX: y\r\n\r\n", 400},
      {"empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", 400},
      {"empty Host in HTTP/1.0 (no Host is fine, an empty one is not)", "GET / HTTP/1.0\r\nHost: \r\n\r\n", 400},
      {"Host with a space inside", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
      {"Host with userinfo", "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400},
      {"Host with a port that is not digits", "GET / HTTP/1.1\r\nHost: a:abc\r\n\r\n", 400},
      {"Host with a port over 65535", "GET / HTTP/1.1\r\nHost: a:99999\r\n\r\n", 400},
      {"Host with an empty port", "GET / HTTP/1.1\r\nHost: a:\r\n\r\n", 400},
      {"Host an unterminated IPv6 literal", "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400},
      {"Host with a path", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400},
      {"unknown expectation", "POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", 417},

      // Request line.
      {"HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 505},
      {"HTTP/1.2", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505},
      {"HTTP/0.9 version", "GET / HTTP/0.9\r\n\r\n", 505},
      {"h2 prior-knowledge preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505},
      {"version without minor", "GET / HTTP/1\r\nHost: a\r\n\r\n", 400},
      {"two-digit minor", "GET / HTTP/1.10\r\nHost: a\r\n\r\n", 400},
      {"lower-case protocol", "GET / http/1.1\r\nHost: a\r\n\r\n", 400},
      {"no version (HTTP/0.9 shape)", "GET /\r\nHost: a\r\n\r\n", 400},
      {"two spaces after the method", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"trailing space after the version", "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400},
      {"absolute-form target", "GET http://backend/v1/models HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"asterisk-form target", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"authority-form target", "CONNECT backend:443 HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"fragment in the target", "GET /v1/models#x HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"unknown method", "FOO / HTTP/1.1\r\nHost: a\r\n\r\n", 501},
      {"lower-case method", "get / HTTP/1.1\r\nHost: a\r\n\r\n", 501},
      {"method with a separator", "GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400, {}, 3},

      // First bytes that cannot begin `method SP`: refused as they arrive,
      // without a head to end (most of these have no end).
      {"TLS ClientHello record header", "\x16\x03\x01\x02\x00"s, 400, {}, 1},
      {"NUL as the first byte", "\0GET / HTTP/1.1\r\n"s, 400, {}, 1},
      {"JSON instead of a request", "{\"model\":\"m\"}", 400, {}, 1},
      {"a space before the method", " GET / HTTP/1.1\r\n", 400, {}, 1},
      {"CR right after the method", "GET\r\nHost: a\r\n\r\n", 400, {}, 4},
      {"a lone CR may begin an empty line; a second one may not", "\r\r\n", 400, {}, 2},
      {"bare CR after an empty line", "\r\n\rGET", 400, {}, 4},
      {"not a request after empty lines", "\r\n\r\n\x16\x03", 400, {}, 5},
      {"method longer than 32 bytes", big('M', 40), 400, {}, 33},

      // Limits.
      {"request line over its limit", "GET /" + big('a', 128 - 13) + " HTTP/1.1\r\nHost: a\r\n\r\n", 414},
      {"request line over its limit, never ending", "GET /" + big('a', 600), 414},
      {"header line over its limit", "GET / HTTP/1.1\r\nHost: a\r\nX: " + big('v', 126) + "\r\n\r\n", 431},
      {"too many header fields", "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\nH: 1\r\n\r\n", 431},
      {"head over its limit", [] {
         std::string s = "GET / HTTP/1.1\r\nHost: a\r\n";
         while (s.size() < 1100) s += "X: " + big('v', 100) + "\r\n";
         return s + "\r\n";
       }(), 431},
      {"endless empty lines", [] {
         std::string s;
         while (s.size() < 1100) s += "\r\n";
         return s;
       }(), 431},
  };
  return k;
}

// Feeds `input` whole. Returns the status; fills `head`.
parse_status parse_whole(request_parser& p, std::string_view input, request_head& head) {
  return p.parse_head(input.data(), input.size(), head);
}

uint16_t status_of(const parse_status& s) { return s.ok() ? 0 : s.status; }

void check_accepted(const head_case& c, const request_head& h, std::string_view input) {
  CHECK(h.meth == c.want.meth);
  if (!c.want.path.empty()) CHECK(h.path == c.want.path);
  CHECK(h.keep_alive == c.want.keep_alive);
  CHECK(h.chunked == c.want.chunked);
  CHECK(h.has_content_length == (c.want.content_length >= 0));
  if (c.want.content_length >= 0) CHECK(h.content_length == static_cast<uint64_t>(c.want.content_length));
  CHECK(h.expect_continue == c.want.expect_continue);
  // Every view lies inside the head.
  CHECK(h.head_bytes <= input.size());
  CHECK(input.substr(0, h.head_bytes).ends_with("\r\n\r\n"));
  uint16_t seen = 0;
  header f;
  for (header_fields it = h.fields(); it.next(f); ++seen) {
    CHECK(f.name.data() >= input.data());
    CHECK(f.value.data() + f.value.size() <= input.data() + h.head_bytes);
  }
  CHECK(seen == h.header_count);
}

// Both readings of one head: the default (common heads without llhttp) and
// llhttp's, which must agree on the answer and on every fact. Returns
// whether the default skipped llhttp.
bool same_in_both_readings(std::string_view input) {
  request_parser fast(k_limits), slow(k_limits);
  slow.set_llhttp_only(true);
  request_head a, b;
  const parse_status sa = fast.parse_head(input.data(), input.size(), a);
  const parse_status sb = slow.parse_head(input.data(), input.size(), b);
  CHECK(sa.error == sb.error);
  CHECK(sa.status == sb.status);
  CHECK(sa.message == sb.message);
  if (sa.ok() && sb.ok()) {
    CHECK(a.meth == b.meth);
    CHECK(a.method_name == b.method_name);
    CHECK(a.target == b.target);
    CHECK(a.path == b.path);
    CHECK(a.version_major == b.version_major);
    CHECK(a.version_minor == b.version_minor);
    CHECK(a.keep_alive == b.keep_alive);
    CHECK(a.chunked == b.chunked);
    CHECK(a.has_content_length == b.has_content_length);
    CHECK(a.content_length == b.content_length);
    CHECK(a.expect_continue == b.expect_continue);
    CHECK(a.head_bytes == b.head_bytes);
    CHECK(a.authorization == b.authorization);
    CHECK(a.host == b.host);
    CHECK(a.session_id == b.session_id);
    CHECK(a.request_id == b.request_id);
    CHECK(a.content_type == b.content_type);
    CHECK(a.connection == b.connection);
    CHECK(a.upgrade == b.upgrade);
    CHECK(a.header_count == b.header_count);
    CHECK(a.field_lines == b.field_lines);
  }
  return sa.ok() && !fast.llhttp_ran();
}

}  // namespace

TEST_SUITE("http::request_parser") {
  TEST_CASE("a head read without llhttp has the answer and the facts llhttp gives it") {
    // The spec rows, then every byte in each part of a head, then the
    // methods and the Connection forms the fast reading must hand over.
    size_t fast = 0, total = 0;
    const auto both = [&](std::string_view in) {
      CAPTURE(in);
      ++total;
      if (same_in_both_readings(in)) ++fast;
    };
    for (const head_case& c : cases()) both(c.input);
    for (int b = 0; b < 256; ++b) {
      const std::string c(1, static_cast<char>(b));
      both("GET /a" + c + "b HTTP/1.1\r\nHost: a\r\n\r\n");
      both("POST /v1/chat/completions?q=" + c + " HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n");
      both("GET / HTTP/1.1\r\nX" + c + "y: 1\r\nHost: a\r\n\r\n");
      both("GET / HTTP/1.1\r\n" + c + "X: 1\r\nHost: a\r\n\r\n");
      both("GET / HTTP/1.1\r\nX: a" + c + "b\r\nHost: a\r\n\r\n");
      both("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k" + c + "\r\n\r\n");
      both("G" + c + "T / HTTP/1.1\r\nHost: a\r\n\r\n");
      both("GET / HTTP/1." + c + "\r\nHost: a\r\n\r\n");
      // The fields llhttp reads with parsers of their own: each byte
      // before and after the value.
      for (std::string_view f : {"Transfer-Encoding: chunked", "Content-Length: 5", "Connection: close",
                                 "Connection: keep-alive"}) {
        const std::string field(f), name = field.substr(0, field.find(':') + 1);
        const std::string value = field.substr(field.find(':') + 2);
        for (std::string_view ver : {"1.0", "1.1"}) {
          const std::string head = "POST / HTTP/" + std::string(ver) + "\r\nHost: a\r\n";
          both(head + field + c + "\r\n\r\n");
          both(head + name + " " + c + value + "\r\n\r\n");
          both(head + name + c + value + "\r\n\r\n");
          both(head + field + " " + c + "\r\n\r\n");
        }
      }
    }
    for (std::string_view m : {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE",
                               "PURGE", "MKCOL", "PROPFIND", "M-SEARCH", "QUERY", "get", "Post", "FOO", "GETS"}) {
      both(std::string(m) + " / HTTP/1.1\r\nHost: a\r\n\r\n");
      both(std::string(m) + " / HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    }
    for (std::string_view v : {"close", "keep-alive", "Keep-Alive", "CLOSE", "upgrade", "close, keep-alive",
                               "keep-alive , close", "keep-alive,upgrade", "foo", "closed", "keep-alivex",
                               "te, close", "", ",", "close,"}) {
      for (std::string_view ver : {"1.0", "1.1"}) {
        const std::string line = "Connection: " + std::string(v) + "\r\n";
        const std::string head = "GET / HTTP/" + std::string(ver) + "\r\nHost: a\r\n";
        both(head + line + "\r\n");
        both(head + line + line + "\r\n");
        both(head + line + "Connection: close\r\n\r\n");
        both(head + "Proxy-" + line + "\r\n");
        both(head + line + "Upgrade: websocket\r\n\r\n");
      }
    }
    // Framing and the well-known fields, with the fast reading's errors.
    for (std::string_view f : {"Content-Length: 5", "Content-Length: 05", "Content-Length: 5, 5",
                               "Content-Length: -1", "Content-Length: 99999999999999999999",
                               "Transfer-Encoding: chunked", "Transfer-Encoding: gzip, chunked",
                               "Transfer-Encoding: chunked, gzip", "Transfer-Encoding: identity",
                               "Transfer-Encoding: chunked\r\nContent-Length: 5",
                               "Content-Length: 5\r\nContent-Length: 5", "Expect: 100-continue",
                               "Expect: nothing", "Host: b", "X-Session-ID: s\r\nX-Session-ID: t",
                               "Content-Type: a\r\nContent-Type: b", "Content-Length: 2000"}) {
      both("POST / HTTP/1.1\r\nHost: a\r\n" + std::string(f) + "\r\n\r\n");
      both("POST / HTTP/1.0\r\n" + std::string(f) + "\r\n\r\n");
    }
    // The common heads do skip llhttp, or this test proves nothing.
    CHECK(same_in_both_readings("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
                                "Authorization: Bearer k\r\nContent-Type: application/json\r\n"
                                "Connection: keep-alive\r\nContent-Length: 5\r\n\r\n"));
    CHECK(same_in_both_readings("GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n"));
    CHECK(fast > total / 16);  // a share of the sweep is read without llhttp
    CHECK(fast < total);
  }

  TEST_CASE("after a head read without llhttp, the next head on the connection may need it") {
    request_parser p(k_limits);
    request_head h;
    const std::string first = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    REQUIRE(parse_whole(p, first, h).ok());
    CHECK(!p.llhttp_ran());
    p.reset();
    const std::string second = "PURGE / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    const parse_status s = parse_whole(p, second, h);
    REQUIRE(s.ok());
    CHECK(p.llhttp_ran());
    CHECK(h.meth == method::other);
    CHECK(!h.keep_alive);
    p.reset();
    REQUIRE(parse_whole(p, first, h).ok());
    CHECK(!p.llhttp_ran());
    CHECK(h.meth == method::get);
    CHECK(h.keep_alive);
  }

  TEST_CASE("every spec row gets its status and fields when fed whole") {
    for (const head_case& c : cases()) {
      CAPTURE(c.name);
      request_parser p(k_limits);
      request_head h;
      const parse_status s = parse_whole(p, c.input, h);
      CHECK(status_of(s) == c.status);
      if (c.status == 0) {
        check_accepted(c, h, c.input);
      } else {
        CHECK(!s.message.empty());
        CHECK(!s.need_more());
      }
    }
  }

  TEST_CASE("every spec row gets the same answer fed one byte at a time from a moving buffer") {
    for (const head_case& c : cases()) {
      CAPTURE(c.name);
      request_parser p(k_limits);
      request_head h;
      // Two buffers used in turn: the data moves between every call.
      std::string buf[2] = {std::string(c.input.size() + 1, '\0'), std::string(c.input.size() + 1, '\0')};
      parse_status s{errc::need_more, 0, {}};
      size_t n = 0;
      while (s.need_more() && n < c.input.size()) {
        ++n;
        std::string& b = buf[n % 2];
        b.replace(0, n, c.input, 0, n);
        s = p.parse_head(b.data(), n, h);
      }
      CHECK(status_of(s) == c.status);
      if (c.status == 0) check_accepted(c, h, std::string_view(buf[n % 2].data(), n));
    }
  }

  TEST_CASE("bytes that cannot begin a request line fail at the first byte that shows it") {
    for (const head_case& c : cases()) {
      if (c.fails_at == 0) continue;
      CAPTURE(c.name);
      request_parser p(k_limits);
      request_head h;
      for (size_t n = 1; n < c.fails_at; ++n) {
        CAPTURE(n);
        REQUIRE(p.parse_head(c.input.data(), n, h).need_more());
      }
      const parse_status s = p.parse_head(c.input.data(), c.fails_at, h);
      CHECK(s.status == 400);
      CHECK(s.error == errc::bad_request);
      CHECK(s.message.starts_with("not an HTTP/1.1 request"));
    }
  }

  TEST_CASE("an invalid Host says so") {
    const std::string in = "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n";
    request_parser p(k_limits);
    request_head h;
    const parse_status s = parse_whole(p, in, h);
    CHECK(s.status == 400);
    CHECK(s.message == "invalid Host header");
  }

  TEST_CASE("the well-known fields are found whatever the case of their names") {
    const std::string in =
        "POST /v1/chat/completions HTTP/1.1\r\nHOST: gw\r\nauthorization: Bearer k1\r\n"
        "X-SESSION-ID:  s-1 \r\nx-request-id: r-9\r\nContent-TYPE: application/json\r\n"
        "connection: keep-alive\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n{}";
    request_parser p(k_limits);
    request_head h;
    REQUIRE(parse_whole(p, in, h).ok());
    CHECK(h.method_name == "POST");
    CHECK(h.target == "/v1/chat/completions");
    CHECK(h.host == "gw");
    CHECK(h.authorization == "Bearer k1");
    CHECK(h.session_id == "s-1");
    CHECK(h.request_id == "r-9");
    CHECK(h.content_type == "application/json");
    CHECK(h.connection == "keep-alive");
    CHECK(h.upgrade == "h2c");
    CHECK(h.header_count == 8);
    const std::vector<header> f = all_fields(h);
    REQUIRE(f.size() == 8);
    CHECK(f[2].name == "X-SESSION-ID");
    CHECK(f[2].value == "s-1");
    CHECK(h.head_bytes == in.size() - 2);
  }

  TEST_CASE("a pipelined second request is left untouched and parses after reset") {
    const std::string first = "POST /v1/embeddings HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody";
    const std::string second = "GET /v1/models HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n";
    std::string buf = first + second;
    const std::string copy = buf;
    request_parser p(k_limits);
    request_head h;
    REQUIRE(p.parse_head(buf.data(), buf.size(), h).ok());
    CHECK(h.head_bytes == first.size() - 4);
    CHECK(h.content_length == 4);
    CHECK(buf == copy);  // parse_head never writes into the buffer

    p.reset();
    const size_t next = h.head_bytes + h.content_length;
    REQUIRE(p.parse_head(buf.data() + next, buf.size() - next, h).ok());
    CHECK(h.path == "/v1/models");
    CHECK(h.host == "b");
    CHECK_FALSE(h.keep_alive);
    CHECK(h.head_bytes == second.size());
  }

  TEST_CASE("every prefix of a valid head asks for more") {
    const std::string in = "GET / HTTP/1.1\r\nHost: a\r\nX-Session-ID: s\r\n\r\n";
    for (size_t n = 0; n < in.size(); ++n) {
      request_parser p(k_limits);
      request_head h;
      CAPTURE(n);
      CHECK(p.parse_head(in.data(), n, h).need_more());
    }
  }

  TEST_CASE("an oversize head fails as soon as the limit is reached, without its end") {
    limits l = k_limits;
    l.header_count_max = 100;
    request_parser p(l);
    request_head h;
    std::string in = "GET / HTTP/1.1\r\nHost: a\r\n";
    while (in.size() < 2000) in += "X: 12345678\r\n";
    CHECK(p.parse_head(in.data(), 1023, h).need_more());
    const parse_status s = p.parse_head(in.data(), 1024, h);
    CHECK(s.status == 431);
    CHECK(s.error == errc::header_too_large);
  }

  TEST_CASE("an overlong request line fails with 414 before its end arrives") {
    request_parser p(k_limits);
    request_head h;
    const std::string in = "GET /" + big('a', 300);
    const parse_status s = p.parse_head(in.data(), 200, h);
    CHECK(s.status == 414);
    CHECK(s.error == errc::uri_too_long);
  }

  TEST_CASE("an error is sticky until reset") {
    request_parser p(k_limits);
    request_head h;
    const std::string bad = "GET / HTTP/1.1\r\nHost : a\r\n\r\n";
    const std::string good = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    CHECK(p.parse_head(bad.data(), bad.size(), h).status == 400);
    CHECK(p.parse_head(good.data(), good.size(), h).status == 400);
    p.reset();
    CHECK(p.parse_head(good.data(), good.size(), h).ok());
  }

  TEST_CASE("errors map to the matching errc") {
    const struct {
      std::string_view in;
      errc e;
    } rows[] = {
        {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", errc::bad_request},
        {"GET / HTTP/2.0\r\n\r\n", errc::version_not_supported},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n", errc::body_too_large},
        {"POST / HTTP/1.1\r\nHost: a\r\nExpect: x\r\n\r\n", errc::bad_request},
    };
    for (const auto& r : rows) {
      CAPTURE(r.in);
      request_parser p(k_limits);
      request_head h;
      CHECK(p.parse_head(r.in.data(), r.in.size(), h).error == r.e);
    }
  }

  TEST_CASE("the fields are walked from the head's lines: names, trimmed values, colons in values") {
    const std::string in = "POST /x HTTP/1.1\r\nHost:gw\r\nX-Empty:\r\nX-Url: \t http://a:1/b \t\r\n"
                           "Content-Length: 0\r\n\r\n";
    request_parser p(k_limits);
    request_head h;
    REQUIRE(p.parse_head(in.data(), in.size(), h).ok());
    const std::vector<header> f = all_fields(h);
    REQUIRE(f.size() == 4);
    CHECK(h.header_count == 4);
    CHECK(f[0].name == "Host");
    CHECK(f[0].value == "gw");
    CHECK(f[1].name == "X-Empty");
    CHECK(f[1].value.empty());
    CHECK(f[2].name == "X-Url");
    CHECK(f[2].value == "http://a:1/b");
    CHECK(f[3].name == "Content-Length");
    CHECK(f[3].value == "0");

    // No fields at all (HTTP/1.0 needs no Host): nothing to walk.
    const std::string bare = "GET / HTTP/1.0\r\n\r\n";
    request_parser q(k_limits);
    request_head g;
    REQUIRE(q.parse_head(bare.data(), bare.size(), g).ok());
    CHECK(g.header_count == 0);
    CHECK(all_fields(g).empty());
  }

  TEST_CASE("the pre-scan's index reads every field as a walk of the lines does") {
    for (const head_case& c : cases()) {
      if (c.status != 0) continue;
      CAPTURE(c.name);
      request_parser p(k_limits);
      request_head h;
      REQUIRE(parse_whole(p, c.input, h).ok());
      CHECK(h.field_refs.n == h.header_count);
      CHECK(same_walks(h) == h.header_count);
    }
    // Values with and without whitespace around them, empty ones, colons
    // in values; more fields than the index holds (the rest are walked);
    // fed whole and one byte at a time from a moving buffer.
    limits l = k_limits;
    l.header_count_max = 100;
    l.head_bytes_max = 1u << 20;
    l.line_bytes_max = 64u << 10;
    std::string in = "POST /v1/x HTTP/1.1\r\nHost: gw\r\nX-A:\r\nX-B: \t\r\nX-C:\t v \t\r\nX-D:a:b: c\r\n";
    for (int i = 0; i < 40; ++i) in += "X-" + std::to_string(i) + ": " + big('v', size_t(i)) + " \r\n";
    in += "Content-Length: 0\r\n\r\n";
    {
      request_parser p(l);
      request_head h;
      REQUIRE(parse_whole(p, in, h).ok());
      CHECK(h.field_refs.n == sluice::http::k_indexed_fields);
      CHECK(same_walks(h) == 46);
      const std::vector<header> f = all_fields(h);
      CHECK(f[1].value.empty());
      CHECK(f[2].value.empty());
      CHECK(f[3].value == "v");
      CHECK(f[4].value == "a:b: c");
      CHECK(f[45].name == "Content-Length");
    }
    {
      request_parser p(l);
      request_head h;
      std::string buf[2] = {std::string(in.size(), '\0'), std::string(in.size(), '\0')};
      parse_status st{errc::need_more, 0, {}};
      size_t n = 0;
      while (st.need_more() && n < in.size()) {
        ++n;
        std::string& b = buf[n % 2];
        b.replace(0, n, in, 0, n);
        st = p.parse_head(b.data(), n, h);
      }
      REQUIRE(st.ok());
      CHECK(h.field_refs.n == sluice::http::k_indexed_fields);
      CHECK(same_walks(h) == 46);
    }
    // Lines past 64 KiB from the first field line are not indexed: the
    // index stops at the first of them and the walk reads the rest.
    std::string wide = "GET / HTTP/1.1\r\nHost: gw\r\nX-Big: " + big('b', 40000) + "\r\nX-Big2: " + big('c', 30000) +
                       "\r\nX-After: 1\r\n\r\n";
    request_parser p(l);
    request_head h;
    REQUIRE(parse_whole(p, wide, h).ok());
    CHECK(h.field_refs.n == 2);
    CHECK(same_walks(h) == 4);
    CHECK(all_fields(h)[3].value == "1");
    // After rebase the index still reads the lines, at the new place.
    std::string moved = wide;
    h.rebase(wide.data(), moved.data());
    wide.assign(wide.size(), '#');
    CHECK(same_walks(h) == 4);
    CHECK(all_fields(h)[2].value == big('c', 30000));
    // Lines set anew on a parsed head, its index left behind: the index is
    // not theirs, so they are walked, and read as they are.
    const std::string other = "A: 1\r\nB-Longer-Name: two\r\n";
    h.field_lines = other;
    const std::vector<header> f = all_fields(h);
    REQUIRE(f.size() == 2);
    CHECK(f[0].name == "A");
    CHECK(f[0].value == "1");
    CHECK(f[1].name == "B-Longer-Name");
    CHECK(f[1].value == "two");
  }

  TEST_CASE("a field name with a byte outside the token set is refused at every place and length") {
    // The name check reads sixteen bytes at a time where the line allows
    // and walks byte by byte where it does not, or when a byte is none of
    // letters, digits, '-', '_', '.': every name length to 40, every
    // place, short and long values (the line's length decides the way).
    limits l = k_limits;
    l.line_bytes_max = 1024;
    l.head_bytes_max = 4096;
    const std::string bad = std::string("\"(),/;<=>?@[\\]{}") + "\x80\xff";
    const std::string good_special = "!#$%&'*+^`|~_.-";
    const auto head_with = [](size_t len, char fill, size_t at, char c, const std::string& value) {
      std::string name(len, fill);
      name[at] = c;
      return std::pair{name, "GET / HTTP/1.1\r\nHost: a\r\n" + name + ":" + value + "\r\n\r\n"};
    };
    for (size_t len = 1; len <= 40; ++len) {
      for (size_t value_n : {size_t{0}, size_t{1}, size_t{30}}) {
        const std::string value(value_n, 'v');
        for (size_t at = 0; at < len; ++at) {
          for (char c : bad) {
            const auto [name, in] = head_with(len, 'a', at, c, value);
            request_parser p(l);
            request_head h;
            const parse_status st = parse_whole(p, in, h);
            CAPTURE(len);
            CAPTURE(value_n);
            CAPTURE(at);
            CAPTURE(int(static_cast<unsigned char>(c)));
            REQUIRE(status_of(st) == 400);
          }
          for (char c : good_special) {
            const auto [name, in] = head_with(len, 'Z', at, c, value);
            request_parser p(l);
            request_head h;
            REQUIRE(parse_whole(p, in, h).ok());
            REQUIRE(all_fields(h).size() == 2);
            CHECK(all_fields(h)[1].name == name);
            CHECK(all_fields(h)[1].value == value);
          }
        }
      }
    }
  }

  TEST_CASE("a control byte in a field value is refused at every place and length; HTAB and bytes >= 0x80 are not") {
    // The value check reads sixteen bytes at a time (the last sixteen
    // overlapping) from sixteen bytes on, byte by byte below: every value
    // length to 70, every place, every byte below 0x20 and DEL.
    limits l = k_limits;
    l.line_bytes_max = 1024;
    l.head_bytes_max = 4096;
    for (size_t len = 1; len <= 70; ++len) {
      for (size_t at = 0; at < len; ++at) {
        for (int c = 0; c <= 0x7f; c = c == 0x1f ? 0x7f : c + 1) {
          std::string value(len, 'v');
          value[at] = static_cast<char>(c);
          const std::string in = "GET / HTTP/1.1\r\nHost: a\r\nX-V: <" + value + ">\r\n\r\n";
          request_parser p(l);
          request_head h;
          const parse_status st = parse_whole(p, in, h);
          CAPTURE(len);
          CAPTURE(at);
          CAPTURE(c);
          if (c == '\t') {
            REQUIRE(st.ok());
            REQUIRE(all_fields(h)[1].value == "<" + value + ">");
          } else {
            REQUIRE(status_of(st) == 400);
          }
        }
        std::string high(len, 'v');
        high[at] = '\xff';
        request_parser p(l);
        request_head h;
        REQUIRE(parse_whole(p, "GET / HTTP/1.1\r\nHost: a\r\nX-V: <" + high + ">\r\n\r\n", h).ok());
      }
    }
  }

  TEST_CASE("rebase moves every view to the new buffer") {
    std::string a = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k\r\n"
                    "X-Session-ID: s\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n";
    request_parser p(k_limits);
    request_head h;
    REQUIRE(p.parse_head(a.data(), a.size(), h).ok());
    std::string b = a;
    h.rebase(a.data(), b.data());
    a.assign(a.size(), '#');  // the old bytes are gone
    CHECK(h.method_name == "POST");
    CHECK(h.target == "/v1/chat/completions?x=1");
    CHECK(h.path == "/v1/chat/completions");
    CHECK(h.host == "gw");
    CHECK(h.authorization == "Bearer k");
    CHECK(h.session_id == "s");
    CHECK(h.content_type == "application/json");
    CHECK(h.request_id.empty());
    const std::vector<header> f = all_fields(h);
    REQUIRE(f.size() == 5);
    CHECK(f[4].name == "Content-Length");
    CHECK(f[4].value == "0");
    CHECK(f[0].name.data() >= b.data());
    CHECK(f[4].value.data() < b.data() + b.size());
  }

  TEST_CASE("header_count_max above the head array is clamped to it") {
    limits l = k_limits;
    l.header_count_max = 60000;
    l.head_bytes_max = 1u << 20;
    std::string in = "GET / HTTP/1.1\r\nHost: a\r\n";
    for (int i = 0; i < sluice::http::k_headers_max; ++i) in += "X: 1\r\n";
    in += "\r\n";
    request_parser p(l);
    request_head h;
    CHECK(p.parse_head(in.data(), in.size(), h).status == 431);
  }
}
