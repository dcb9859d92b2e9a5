// Spec-style cases for upstream responses: heads (accepted with their
// fields, or rejected as upstream_protocol) and bodies (payload handed to
// the sink, and exactly where the message ends).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "same_walks.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"

using namespace std::literals;
using sluice::errc;
using sluice::http::body_sink;
using sluice::http::body_status;
using sluice::http::parse_status;
using sluice::http::response_head;
using sluice::http::response_parser;

namespace {

struct head_case {
  std::string_view name;
  std::string input;
  bool ok = true;
  uint16_t status = 200;
  bool keep_alive = true;
  bool chunked = false;
  int64_t content_length = -1;
  bool event_stream = false;
};

const std::vector<head_case>& head_cases() {
  static const std::vector<head_case> k = {
      {"Content-Length", "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true, 200, true, false, 5},
      {"vLLM stream head",
       "HTTP/1.1 200 OK\r\ndate: x\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
       "transfer-encoding: chunked\r\n\r\n",
       true, 200, true, true, -1, true},
      {"event stream in upper case", "HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream\r\nTransfer-Encoding: chunked\r\n\r\n",
       true, 200, true, true, -1, true},
      {"JSON is no event stream", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
       true, 200, true, false, 2, false},
      {"HTTP/1.0 closes", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", true, 200, false, false, 2},
      {"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n", true, 200, true, false, 2},
      {"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n", true, 200, false, false, 2},
      {"body until close", "HTTP/1.1 200 OK\r\n\r\n", true, 200, false},
      {"error status", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", true, 503, true, false, 0},
      {"no reason phrase", "HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n", true, 404, true, false, 0},
      {"204 has no body", "HTTP/1.1 204 No Content\r\n\r\n", true, 204, true},

      {"100 Continue", "HTTP/1.1 100 Continue\r\n\r\n", false},
      {"101 Switching Protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", false},
      {"status with letters", "HTTP/1.1 2OO OK\r\n\r\n", false},
      {"status of two digits", "HTTP/1.1 20 OK\r\n\r\n", false},
      {"status above 599", "HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n", false},
      {"no space after the version", "HTTP/1.1200 OK\r\n\r\n", false},
      {"misspelt protocol", "HTP/1.1 200 OK\r\n\r\n", false},
      {"HTTP/2.0", "HTTP/2.0 200 OK\r\n\r\n", false},
      {"not HTTP at all", "SSH-2.0-OpenSSH\r\n\r\n", false},
      {"CL and TE", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", false},
      {"TE gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false},
      {"TE chunked twice", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", false},
      {"duplicate Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", false},
      {"list Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", false},
      {"Content-Length 2^63", "HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\n", false},
      {"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n", false},
      {"obs-fold", "HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n", false},
      {"bare LF", "HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", false},
      {"NUL in a value", "HTTP/1.1 200 OK\r\nX: a\0\r\nContent-Length: 0\r\n\r\n"s, false},
      {"too many fields", [] {
         std::string s = "HTTP/1.1 200 OK\r\n";
         for (int i = 0; i < 65; ++i) s += "X: 1\r\n";
         return s + "\r\n";
       }(), false},
      {"head over 64 KiB", "HTTP/1.1 200 OK\r\nX: " + std::string(70000, 'v') + "\r\n\r\n", false},
  };
  return k;
}

// Collects what the sink receives.
struct collector {
  std::string data;
  size_t calls = 0;
  body_sink sink() {
    return body_sink{[](void* ctx, const char* d, size_t n) {
                       auto* self = static_cast<collector*>(ctx);
                       self->data.append(d, n);
                       ++self->calls;
                     },
                     this};
  }
};

// One chunk of a chunked body.
std::string chunk(std::string_view payload) {
  char size[20];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
  return std::string(size, static_cast<size_t>(n)) + std::string(payload) + "\r\n";
}

struct body_case {
  std::string_view name;
  std::string head;
  std::string message;        // the body bytes of this response
  std::string_view payload;   // what the sink must see
  std::string_view extra;     // bytes after the message: never consumed
  bool head_request = false;
};

const std::vector<body_case>& body_cases() {
  static const std::vector<body_case> k = {
      {"Content-Length body", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", "abc", "abc", "XYZ"},
      {"chunked SSE ends exactly at the terminal chunk",
       "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
       chunk("data: {\"a\":1}\n\n") + chunk("data: [DONE]\n\n") + "0\r\n\r\n",
       "data: {\"a\":1}\n\ndata: [DONE]\n\n", "HTTP/1.1 200 OK\r\n"},
      {"terminal chunk with trailers and extensions",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "3;x=y\r\nabc\r\n0;z\r\nX-T: 1\r\n\r\n", "abc",
       "more"},
      {"chunk sizes in hex", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
       chunk(std::string(26, 'q')) + "0\r\n\r\n", "qqqqqqqqqqqqqqqqqqqqqqqqqq", ""},
      {"Content-Length 0 ends at the head", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "", "", "next"},
      {"204 ends at the head", "HTTP/1.1 204 No Content\r\n\r\n", "", "", "next"},
      {"304 ends at the head", "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", "", "", "next"},
      {"HEAD response ends at the head", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "", "", "next", true},
  };
  return k;
}

// Feeds `body` in pieces of `step` bytes, as the connection would (bytes not
// consumed are offered again with the next piece).
body_status feed(response_parser& p, const std::string& body, size_t step, collector& c, size_t& consumed) {
  body_status st{};
  consumed = 0;
  size_t avail = 0;
  while (!st.complete && st.error == errc::ok) {
    if (avail == body.size() && consumed == avail) break;
    avail = std::min(body.size(), avail + step);
    const body_sink s = c.sink();
    st = p.feed_body(body.data() + consumed, avail - consumed, s);
    consumed += st.consumed;
  }
  return st;
}

// One response (head, then its body bytes fed in pieces of `step`) in both
// readings: the default (a plain head without llhttp, its body counted
// here) and llhttp's. They must agree on the answer, every fact of the
// head, what the sink saw and where the message ended. Returns whether the
// default skipped llhttp.
bool same_in_both_readings(std::string_view head, const std::string& body, size_t step, bool head_request) {
  response_parser fast, slow;
  slow.set_llhttp_only(true);
  fast.reset(head_request);
  slow.reset(head_request);
  response_head a, b;
  const parse_status sa = fast.parse_head(head.data(), head.size(), a);
  const parse_status sb = slow.parse_head(head.data(), head.size(), b);
  CHECK(sa.error == sb.error);
  CHECK(sa.status == sb.status);
  CHECK(sa.message == sb.message);
  if (!sa.ok() || !sb.ok()) return false;
  CHECK(a.status == b.status);
  CHECK(a.version_minor == b.version_minor);
  CHECK(a.keep_alive == b.keep_alive);
  CHECK(a.chunked == b.chunked);
  CHECK(a.has_content_length == b.has_content_length);
  CHECK(a.content_length == b.content_length);
  CHECK(a.event_stream == b.event_stream);
  CHECK(a.head_bytes == b.head_bytes);
  CHECK(a.reason == b.reason);
  CHECK(a.content_type == b.content_type);
  CHECK(a.header_count == b.header_count);
  CHECK(a.field_lines == b.field_lines);
  collector ca, cb;
  size_t na = 0, nb = 0;
  const body_status ba = feed(fast, body, step, ca, na);
  const body_status bb = feed(slow, body, step, cb, nb);
  CHECK(ba.error == bb.error);
  CHECK(ba.complete == bb.complete);
  CHECK(ba.consumed == bb.consumed);
  CHECK(ba.chunk_end == bb.chunk_end);
  CHECK(na == nb);
  CHECK(ca.data == cb.data);
  CHECK(fast.finish_at_eof() == slow.finish_at_eof());
  return !fast.llhttp_ran();
}

}  // namespace

TEST_SUITE("http::response_parser") {
  TEST_CASE("one parser, heads read with and without llhttp in turn, HEAD answers between") {
    response_parser p;
    response_head h;
    collector c;
    size_t consumed = 0;
    const std::string plain = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n";
    const std::string odd = "HTTP/1.1 200 OK\r\nConnection: keep-alive, x\r\nContent-Length: 3\r\n\r\n";
    for (int round = 0; round < 2; ++round) {
      for (bool head_request : {false, true}) {
        for (const std::string* in : {&plain, &odd}) {
          CAPTURE(*in);
          CAPTURE(head_request);
          p.reset(head_request);
          REQUIRE(p.parse_head(in->data(), in->size(), h).ok());
          CHECK(p.llhttp_ran() == (in == &odd));
          c = collector{};
          const body_status st = feed(p, "abcXYZ", 2, c, consumed);
          CHECK(st.complete);
          CHECK(consumed == (head_request ? 0u : 3u));
          CHECK(c.data == (head_request ? "" : "abc"));
        }
      }
    }
  }

  TEST_CASE("a head read without llhttp has the answer, the facts and the body framing llhttp gives it") {
    size_t fast = 0, total = 0;
    const auto both = [&](std::string_view head, const std::string& body, bool head_request = false) {
      for (size_t step : {size_t{1}, size_t{3}, body.size() + 1}) {
        CAPTURE(head);
        CAPTURE(step);
        ++total;
        if (same_in_both_readings(head, body, step, head_request)) ++fast;
      }
    };
    for (const head_case& c : head_cases()) both(c.input, "abcdefgh");
    for (const body_case& c : body_cases()) both(c.head, c.message + std::string(c.extra), c.head_request);
    for (int b = 0; b < 256; ++b) {
      const std::string c(1, static_cast<char>(b));
      both("HTTP/1.1 200 O" + c + "K\r\nContent-Length: 2\r\n\r\n", "okXX");
      both("HTTP/1.1 200 OK\r\nX" + c + "y: 1\r\nContent-Length: 2\r\n\r\n", "ok");
      both("HTTP/1.1 200 OK\r\nX: a" + c + "b\r\nContent-Length: 2\r\n\r\n", "ok");
      both("HTTP/1." + c + " 200 OK\r\nContent-Length: 2\r\n\r\n", "ok");
      both("HTTP/1.1 2" + c + "0 OK\r\nContent-Length: 2\r\n\r\n", "ok");
      // The fields llhttp reads with parsers of their own: each byte
      // before and after the value.
      for (std::string_view f : {"Transfer-Encoding: chunked", "Content-Length: 3", "Connection: close",
                                 "Connection: keep-alive"}) {
        const std::string field(f), name = field.substr(0, field.find(':') + 1);
        const std::string value = field.substr(field.find(':') + 2);
        for (std::string_view ver : {"1.0", "1.1"}) {
          const std::string head = "HTTP/" + std::string(ver) + " 200 OK\r\n";
          const std::string body = "3\r\nabc\r\n0\r\n\r\nrest";
          both(head + field + c + "\r\n\r\n", body);
          both(head + name + " " + c + value + "\r\n\r\n", body);
          both(head + field + " " + c + "\r\n\r\n", body);
        }
      }
    }
    for (std::string_view line : {"HTTP/1.1 200", "HTTP/1.1 200 ", "HTTP/1.1 200  OK", "HTTP/1.1 200 \tOK",
                                  "HTTP/1.1  200 OK", "HTTP/1.0 200 OK", "HTTP/1.1 404 Not Found",
                                  "HTTP/1.1 599 x", "HTTP/1.1 199 x", "HTTP/1.1 600 x", "HTTP/1.1 20 OK",
                                  "HTTP/1.1 2000 OK", "HTTP/2.0 200 OK", "HTTP/1.2 200 OK", "http/1.1 200 OK"}) {
      for (std::string_view framing : {"Content-Length: 3\r\n", "Transfer-Encoding: chunked\r\n", ""}) {
        both(std::string(line) + "\r\n" + std::string(framing) + "\r\n", "3\r\nabc\r\n0\r\n\r\nrest");
      }
    }
    for (std::string_view v : {"close", "keep-alive", "Keep-Alive", "CLOSE", "upgrade", "close, keep-alive",
                               "keep-alive , close", "foo", "closed", "", ","}) {
      for (std::string_view ver : {"1.0", "1.1"}) {
        const std::string line = "Connection: " + std::string(v) + "\r\n";
        const std::string head = "HTTP/" + std::string(ver) + " 200 OK\r\nContent-Length: 2\r\n";
        both(head + line + "\r\n", "okXY");
        both(head + line + line + "\r\n", "ok");
        both(head + line + "Connection: close\r\n\r\n", "ok");
        both(head + "Proxy-" + line + "\r\n", "ok");
        both(head + line + "Upgrade: h2c\r\n\r\n", "ok");
        both("HTTP/" + std::string(ver) + " 200 OK\r\n" + line + "\r\n", "until the close");
      }
    }
    // Bodies: lengths around the pieces' sizes, no-body answers, the close.
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, size_t{1000}}) {
      const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(n) + "\r\n\r\n";
      both(head, std::string(n, 'b') + "after");
      both(head, std::string(n - 1, 'b'));
      both(head, std::string(n, 'b'), true);
    }
    for (std::string_view head : {"HTTP/1.1 204 No Content\r\n\r\n", "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
                                  "HTTP/1.1 200 OK\r\n\r\n", "HTTP/1.0 200 OK\r\n\r\n"}) {
      both(head, "body bytes");
      both(head, "");
    }
    // The common heads do skip llhttp, or this test proves nothing.
    CHECK(same_in_both_readings("HTTP/1.1 200 OK\r\ndate: x\r\nserver: uvicorn\r\ncontent-length: 2\r\n"
                                "content-type: application/json\r\n\r\n", "{}", 1, false));
    CHECK(fast > total / 16);  // a share of the sweep is read without llhttp
    CHECK(fast < total);
  }

  TEST_CASE("every head row is accepted with its fields or rejected as upstream_protocol") {
    for (const head_case& c : head_cases()) {
      CAPTURE(c.name);
      for (size_t step : {c.input.size(), size_t{1}}) {
        CAPTURE(step);
        response_parser p;
        response_head h;
        parse_status s{errc::need_more, 0, {}};
        for (size_t n = std::min(step, c.input.size()); s.need_more(); n = std::min(n + step, c.input.size())) {
          s = p.parse_head(c.input.data(), n, h);
          if (n == c.input.size()) break;
        }
        if (!c.ok) {
          CHECK(s.error == errc::upstream_protocol);
          CHECK(s.status == 502);
          CHECK(!s.message.empty());
          continue;
        }
        REQUIRE(s.ok());
        CHECK(h.status == c.status);
        CHECK(h.keep_alive == c.keep_alive);
        CHECK(h.chunked == c.chunked);
        CHECK(h.has_content_length == (c.content_length >= 0));
        if (c.content_length >= 0) CHECK(h.content_length == static_cast<uint64_t>(c.content_length));
        CHECK(h.event_stream == c.event_stream);
        CHECK(h.head_bytes == c.input.size());
        // The pre-scan's index reads each field as a walk of the lines does.
        CHECK(h.field_refs.n == h.header_count);
        CHECK(same_walks(h) == h.header_count);
      }
    }
  }

  TEST_CASE("the reason phrase and headers are views into the head") {
    const std::string in = "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Type: application/json  \r\nContent-Length: 2\r\n\r\n{}";
    response_parser p;
    response_head h;
    REQUIRE(p.parse_head(in.data(), in.size(), h).ok());
    CHECK(h.reason == "Too Many Requests");
    CHECK(h.header_count == 3);
    std::vector<sluice::http::header> f;
    sluice::http::header one;
    for (sluice::http::header_fields it = h.fields(); it.next(one);) f.push_back(one);
    REQUIRE(f.size() == 3);
    CHECK(f[0].name == "Retry-After");
    CHECK(f[0].value == "2");
    CHECK(f[1].value == "application/json");
    CHECK(f[2].name == "Content-Length");
    CHECK(h.content_type == "application/json");
    CHECK(h.head_bytes == in.size() - 2);
  }

  TEST_CASE("every body row hands the payload to the sink and stops at the end of the message") {
    for (const body_case& c : body_cases()) {
      CAPTURE(c.name);
      const std::string body = c.message + std::string(c.extra);
      for (size_t step : {body.size(), size_t{1}, size_t{2}, size_t{5}}) {
        CAPTURE(step);
        response_parser p;
        p.reset(c.head_request);
        response_head h;
        REQUIRE(p.parse_head(c.head.data(), c.head.size(), h).ok());
        collector col;
        size_t consumed = 0;
        const body_status st = feed(p, body, std::max<size_t>(step, 1), col, consumed);
        CHECK(st.error == errc::ok);
        CHECK(st.complete);
        CHECK(consumed == c.message.size());
        CHECK(col.data == c.payload);
        CHECK(p.finish_at_eof());
        // Once complete, nothing more is taken.
        const body_status again = p.feed_body(body.data() + consumed, body.size() - consumed, col.sink());
        CHECK(again.complete);
        CHECK(again.consumed == 0);
      }
    }
  }

  TEST_CASE("chunk_end marks the end of the last whole chunk of each feed") {
    const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    response_parser p;
    response_head h;
    REQUIRE(p.parse_head(head.data(), head.size(), h).ok());
    body_sink none{};
    const std::string a = "5\r\nhello\r\n3\r\nab";  // one whole chunk, one cut
    auto s1 = p.feed_body(a.data(), a.size(), none);
    CHECK(s1.error == sluice::errc::ok);
    CHECK_FALSE(s1.complete);
    CHECK(s1.consumed == a.size());
    CHECK(s1.chunk_end == 10);
    const std::string b = "c";  // still inside the chunk
    auto s2 = p.feed_body(b.data(), b.size(), none);
    CHECK(s2.chunk_end == 0);
    const std::string c = "\r\n2\r\nxy\r\n0\r\n\r\n";
    auto s3 = p.feed_body(c.data(), c.size(), none);
    CHECK(s3.complete);
    CHECK(s3.consumed == c.size());
    CHECK(s3.chunk_end == c.size());
  }

  TEST_CASE("chunk_end is right for every split of a chunked body, CRLFs cut in half included") {
    const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    const std::string body = "5\r\nhello\r\n1;ext=1\r\n!\r\nA\r\n0123456789\r\n0\r\n\r\n";
    // Ends of the non-terminal chunks (just past their CRLF) in `body`.
    const size_t ends[] = {10, 22, 37};
    auto expect = [&](size_t from, size_t to) -> size_t {
      size_t e = 0;
      for (size_t x : ends) {
        if (x > from && x <= to) e = x - from;
      }
      return e;
    };
    // Every set of cut points of size <= 2, then every byte alone.
    std::vector<std::vector<size_t>> splits;
    for (size_t i = 1; i < body.size(); ++i) {
      splits.push_back({i});
      for (size_t j = i + 1; j < body.size(); ++j) splits.push_back({i, j});
    }
    std::vector<size_t> each;
    for (size_t i = 1; i < body.size(); ++i) each.push_back(i);
    splits.push_back(each);
    for (const auto& cuts : splits) {
      response_parser p;
      response_head h;
      REQUIRE(p.parse_head(head.data(), head.size(), h).ok());
      body_sink none{};
      size_t from = 0;
      std::vector<size_t> bounds = cuts;
      bounds.push_back(body.size());
      for (size_t to : bounds) {
        const auto st = p.feed_body(body.data() + from, to - from, none);
        CAPTURE(from);
        CAPTURE(to);
        REQUIRE(st.error == sluice::errc::ok);
        if (st.complete) {
          CHECK(to == body.size());
          CHECK(st.chunk_end == st.consumed);
        } else {
          CHECK(st.chunk_end == expect(from, to));
        }
        from = to;
      }
    }
  }

  TEST_CASE("a chunk whose data ends in LF CR is refused at the LF, and chunk_end stays within what was consumed") {
    const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    const std::string body = "5\r\nhello\n\r\n0\r\n\r\n";
    response_parser p;
    response_head h;
    REQUIRE(p.parse_head(head.data(), head.size(), h).ok());
    body_sink none{};
    size_t fed = 0;
    bool failed = false;
    for (; fed < body.size() && !failed; ++fed) {
      const auto st = p.feed_body(body.data() + fed, 1, none);
      CHECK(st.chunk_end <= st.consumed);
      failed = st.error != sluice::errc::ok;
    }
    CHECK(failed);
    CHECK(fed == 9);  // "5\r\nhello" and the LF
    response_parser whole;
    REQUIRE(whole.parse_head(head.data(), head.size(), h).ok());
    const auto st = whole.feed_body(body.data(), body.size(), none);
    CHECK(st.error == sluice::errc::upstream_protocol);
    CHECK(st.consumed == 9);
    CHECK(st.chunk_end == 0);
  }

  TEST_CASE("chunked framing is strict: each malformed body is refused, its well-formed twin accepted") {
    const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    struct row {
      std::string body;
      bool ok;
    };
    const row rows[] = {
        {"5\r\nhello\r\n0\r\n\r\n", true},
        {"5;name=value;x\r\nhello\r\n0\r\n\r\n", true},      // extensions are skipped
        {"5 ;x\r\nhello\r\n0\r\n\r\n", true},                // BWS before ';'
        {"0005\r\nhello\r\n000\r\n\r\n", true},              // leading zeros
        {"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n", true},  // a trailer field, dropped
        {"5 \r\nhello\r\n0\r\n\r\n", false},                 // whitespace not before ';'
        {"5\nhello\r\n0\r\n\r\n", false},                     // bare LF after the size
        {"5\r\nhello\r\n0\r\n\n", false},                     // the last CRLF without its CR
        {"5\r\nhello\r\n0\r\nX : 1\r\n\r\n", false},        // space before the trailer colon
        {"5\r\nhello\r\n0\r\n X: 1\r\n\r\n", false},        // folded trailer
        {"5\r\nhello\r\n0\r\nX: \x01\r\n\r\n", false},      // CTL in a trailer value
        {"5;\x01\r\nhello\r\n0\r\n\r\n", false},              // CTL in an extension
        {"g\r\nhello\r\n0\r\n\r\n", false},                   // not hex
        {"10000000000000000\r\n", false},                        // 17 digits
        {"5\r\nhelloX\r\n0\r\n\r\n", false},                  // data longer than its size
    };
    for (const row& r : rows) {
      CAPTURE(r.body);
      response_parser p;
      response_head h;
      REQUIRE(p.parse_head(head.data(), head.size(), h).ok());
      collector col;
      const body_status st = p.feed_body(r.body.data(), r.body.size(), col.sink());
      if (r.ok) {
        CHECK(st.error == errc::ok);
        CHECK(st.complete);
        CHECK(st.consumed == r.body.size());
        CHECK(col.data == "hello");
      } else {
        CHECK(st.error == errc::upstream_protocol);
        CHECK_FALSE(st.complete);
      }
    }
  }

  TEST_CASE("a body delimited by the close completes only at EOF") {
    const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n";
    response_parser p;
    response_head h;
    REQUIRE(p.parse_head(head.data(), head.size(), h).ok());
    CHECK_FALSE(h.keep_alive);
    collector col;
    const body_status st = p.feed_body("abc", 3, col.sink());
    CHECK(st.error == errc::ok);
    CHECK(st.consumed == 3);
    CHECK_FALSE(st.complete);
    CHECK(col.data == "abc");
    CHECK(p.finish_at_eof());
  }

  TEST_CASE("a body cut short is not complete at EOF") {
    const struct {
      std::string_view head, body;
    } rows[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "abc"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhel"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n0\r\n\r"},
    };
    for (const auto& r : rows) {
      CAPTURE(r.body);
      response_parser p;
      response_head h;
      REQUIRE(p.parse_head(r.head.data(), r.head.size(), h).ok());
      collector col;
      const body_status st = p.feed_body(r.body.data(), r.body.size(), col.sink());
      CHECK(st.error == errc::ok);
      CHECK_FALSE(st.complete);
      CHECK_FALSE(p.finish_at_eof());
    }
  }

  TEST_CASE("a head cut short is not complete at EOF") {
    response_parser p;
    response_head h;
    const std::string_view in = "HTTP/1.1 200 OK\r\nContent-Le";
    CHECK(p.parse_head(in.data(), in.size(), h).need_more());
    CHECK_FALSE(p.finish_at_eof());
  }

  TEST_CASE("malformed chunk framing from the backend is upstream_protocol") {
    const std::string_view rows[] = {
        "x\r\nabc\r\n0\r\n\r\n",
        "3\nabc\r\n0\r\n\r\n",
        "3\r\nabc\n0\r\n\r\n",
        "3\r\nabcd\r\n0\r\n\r\n",
        "3\r\nabc\r\n0\r\n\n",             // llhttp 8.1 alone would take this
        "FFFFFFFFFFFFFFFFF\r\n",
    };
    const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (std::string_view body : rows) {
      for (size_t step : {body.size(), size_t{1}}) {
        CAPTURE(body);
        CAPTURE(step);
        response_parser p;
        response_head h;
        REQUIRE(p.parse_head(head.data(), head.size(), h).ok());
        collector col;
        size_t consumed = 0;
        const body_status st = feed(p, std::string(body), step, col, consumed);
        CHECK(st.error == errc::upstream_protocol);
        CHECK_FALSE(st.complete);
        CHECK_FALSE(p.finish_at_eof());
      }
    }
  }

  TEST_CASE("reset makes the parser ready for the next response on the connection") {
    response_parser p;
    response_head h;
    const std::string a = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    REQUIRE(p.parse_head(a.data(), a.size(), h).ok());
    collector col;
    CHECK(p.feed_body(a.data() + h.head_bytes, 2, col.sink()).complete);
    p.reset();
    const std::string b = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1\r\n\r\nx";
    REQUIRE(p.parse_head(b.data(), b.size(), h).ok());
    CHECK(h.status == 500);
    CHECK(p.feed_body(b.data() + h.head_bytes, 1, col.sink()).complete);
    CHECK(col.data == "okx");
  }

  // The skip of plain chunks (body_sink::skip_ok): what is counted, what is
  // handed on, and in which order.
  struct skip_log {
    std::vector<std::string> calls;  // "chunk:<payload>", "data:<bytes>", "end", "skip:<n>@<offset>"
    bool ok = true;
    bool stop_after_chunk = false;   // on_chunk turns the skip off (as chunk_scanned does for an odd chunk)
    const char* base = nullptr;
    body_sink sink() {
      body_sink s{[](void* ctx, const char* d, size_t n) {
                    static_cast<skip_log*>(ctx)->calls.push_back("data:" + std::string(d, n));
                  },
                  this,
                  [](void* ctx, const char*) { static_cast<skip_log*>(ctx)->calls.push_back("end"); },
                  [](void* ctx, const char* d, size_t n, const char*) {
                    auto* self = static_cast<skip_log*>(ctx);
                    self->calls.push_back("chunk:" + std::string(d, n));
                    if (self->stop_after_chunk) self->ok = false;
                  }};
      s.skip_ok = &ok;
      s.skip_head = "data: {";
      s.skip_tail = "null}\n\n";
      s.on_skipped = [](void* ctx, uint32_t n, const char* end) {
        auto* self = static_cast<skip_log*>(ctx);
        self->calls.push_back("skip:" + std::to_string(n) + "@" + std::to_string(end - self->base));
      };
      return s;
    }
    // Parses a chunked event-stream head, then feeds `body` whole to `s`
    // (this log's sink by default); `msg` keeps the bytes.
    std::string msg;
    body_status run(const std::string& body) { return run(body, sink()); }
    body_status run(const std::string& body, const body_sink& s) {
      msg = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body;
      response_parser p;
      response_head h;
      REQUIRE(p.parse_head(msg.data(), msg.size(), h).ok());
      base = msg.data() + h.head_bytes;
      return p.feed_body(base, body.size(), s);
    }
  };

  TEST_CASE("skip: runs of whole one-event plain chunks are counted in one call, in order with the chunks handed on") {
    const std::string a = chunk("data: {\"c\":\"a\",\"f\":null}\n\n");
    const std::string odd = chunk("data: {\"f\":\"stop\"}\n\n");
    const std::string spaced = chunk("data:{\"c\":\"b\",\"f\":null}\n\n");  // no space: not the head
    // Head and tail right, but two events, or two lines: handed on.
    const std::string two = chunk("data: {\"f\":null}\n\ndata: {\"f\":null}\n\n");
    const std::string lines = chunk("data: {\"c\":1,\r\ndata: \"f\":null}\n\n");
    const std::string body = a + a + odd + a + spaced + a + a + a + two + lines + a + "0\r\n\r\n";
    skip_log log;
    CHECK(log.run(body).complete);
    const size_t e2 = 2 * a.size(), e4 = e2 + odd.size() + a.size(), e8 = e4 + spaced.size() + 3 * a.size();
    const std::vector<std::string> want = {
        "skip:2@" + std::to_string(e2), "chunk:data: {\"f\":\"stop\"}\n\n", "skip:1@" + std::to_string(e4),
        "chunk:data:{\"c\":\"b\",\"f\":null}\n\n", "skip:3@" + std::to_string(e8),
        "chunk:data: {\"f\":null}\n\ndata: {\"f\":null}\n\n", "chunk:data: {\"c\":1,\r\ndata: \"f\":null}\n\n",
        "skip:1@" + std::to_string(e8 + two.size() + lines.size() + a.size())};
    CHECK(log.calls == want);
  }

  TEST_CASE("skip: off while *skip_ok is false, read per chunk; a chunk cut by the read is always handed on") {
    const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    const std::string a = chunk("data: {\"f\":null}\n\n");
    const std::string odd = chunk("data: [DONE]\n\n");
    {
      // The callback of the odd chunk turns the skip off: the plain chunks
      // after it are handed on.
      skip_log log;
      log.stop_after_chunk = true;
      (void)log.run(a + odd + a + a);
      const std::vector<std::string> want = {"skip:1@" + std::to_string(a.size()), "chunk:data: [DONE]\n\n",
                                             "chunk:data: {\"f\":null}\n\n", "chunk:data: {\"f\":null}\n\n"};
      CHECK(log.calls == want);
    }
    {
      // Every split of two plain chunks: a chunk whole in a feed is counted,
      // one cut by it goes to on_data + on_chunk_end, and the count of
      // chunks (skipped or ended) is always two.
      const std::string body = a + a;
      const std::string msg = head + body;
      for (size_t cut = 1; cut < body.size(); ++cut) {
        CAPTURE(cut);
        response_parser p;
        response_head h;
        REQUIRE(p.parse_head(msg.data(), msg.size(), h).ok());
        skip_log log;
        const char* b = msg.data() + h.head_bytes;
        log.base = b;
        const body_status s1 = p.feed_body(b, cut, log.sink());
        REQUIRE(s1.error == errc::ok);
        log.base = b + s1.consumed;
        const body_status s2 = p.feed_body(b + s1.consumed, body.size() - s1.consumed, log.sink());
        REQUIRE(s2.error == errc::ok);
        size_t skipped = 0, ended = 0;
        std::string data;
        for (const std::string& c : log.calls) {
          if (c.rfind("skip:", 0) == 0) skipped += static_cast<size_t>(c[5] - '0');
          if (c == "end") ++ended;
          if (c.rfind("data:", 0) == 0) data += c.substr(5);
        }
        CHECK(skipped + ended == 2);
        // The chunk the read cut is handed on, never skipped; cut between
        // the two, both are whole in their feeds.
        if (cut == a.size()) {
          CHECK(ended == 0);
        } else {
          CHECK(ended >= 1);
        }
        // What was handed on is the payload of the chunks that ended so, whole and in order.
        std::string want;
        for (size_t i = 0; i < ended; ++i) want += "data: {\"f\":null}\n\n";
        CHECK(data == want);
      }
    }
  }

  TEST_CASE("skip: a head or tail that differs in any one byte is handed on (vLLM's 25-byte tail, heads of 1..32 bytes)") {
    const std::string tail = "\"finish_reason\":null}]}\n\n";
    const std::string full_head = "data: {\"id\":\"chatcmpl-0123456789ab";  // 32 bytes
    for (size_t hn = 1; hn <= full_head.size(); ++hn) {
      const std::string h = full_head.substr(0, hn);
      const std::string payload = full_head + "\"choices\":[{\"delta\":{\"content\":\"x\"}," + tail;
      for (size_t flip = 0; flip <= payload.size(); ++flip) {
        // flip == size: unchanged; else one byte changed (a head or tail
        // byte matters, one between them does not -- unless it is a line end)
        std::string p = payload;
        if (flip < p.size()) p[flip] = p[flip] == 'Z' ? 'Y' : 'Z';
        skip_log log;
        body_sink sk = log.sink();
        sk.skip_head = h;
        sk.skip_tail = tail;
        (void)log.run(chunk(p), sk);
        const bool in_head = flip < hn, in_tail = flip < p.size() && flip >= p.size() - tail.size();
        CAPTURE(hn);
        CAPTURE(flip);
        REQUIRE(log.calls.size() == 1);
        CHECK((log.calls[0].rfind("skip:1@", 0) == 0) == !(in_head || in_tail));
      }
    }
  }

  TEST_CASE("skip: a pattern the sink brings is the one the run and the chunk test use") {
    // Ten plain chunks of 48 bytes or more (the pattern's size) and one
    // under it. The sink's head and tail say "skip"; a pattern it brings,
    // made for another head, says "hand on": the pattern decides every
    // chunk it can hold, the bytes the one it cannot.
    const std::string tail = "\"finish_reason\":null}]}\n\n";
    std::string body;
    for (int i = 0; i < 10; ++i) body += chunk("data: {\"choices\":[{\"delta\":{\"content\":\"token " + std::to_string(i) + "\"}," + tail);
    body += chunk("data: {" + tail);  // 32 bytes
    body += "0\r\n\r\n";
    const auto skipped = [](const std::vector<std::string>& calls) {
      size_t n = 0;
      for (const std::string& c : calls) n += c.rfind("skip:", 0) == 0 ? std::stoul(c.substr(5)) : 0;
      return n;
    };
    sluice::http::detail::skip_pattern other, same;
    REQUIRE(sluice::http::detail::make_skip_pattern("data: [", tail, other));
    REQUIRE(sluice::http::detail::make_skip_pattern("data: {", tail, same));
    for (int which = 0; which < 3; ++which) {
      skip_log log;
      body_sink sk = log.sink();
      sk.skip_tail = tail;
      if (which == 1) sk.skip_pattern = &same;
      if (which == 2) sk.skip_pattern = &other;
      CAPTURE(which);
      CHECK(log.run(body, sk).complete);
      CHECK(skipped(log.calls) == (which == 2 ? 1 : 11));
      CHECK(std::count_if(log.calls.begin(), log.calls.end(), [](const std::string& c) { return c.rfind("chunk:", 0) == 0; }) ==
            (which == 2 ? 10 : 0));
    }
  }

  TEST_CASE("skip: the run of plain chunks gives the calls the chunk-by-chunk test gives, for mixed chunks at every few splits") {
    // The same bodies through two sinks whose tests agree on every chunk
    // below: a 7-byte head (a pattern: the run, where the CPU has AVX2)
    // and a 25-byte one (over 16 bytes: no pattern, each chunk tested in
    // turn). Every payload either starts with the long head or differs
    // from it in its first seven bytes. The sink's on_chunk turns the skip
    // off at an "off" chunk and on at an "on" one.
    const std::string long_head = "data: {\"id\":\"chatcmpl-1\",\"";
    const std::string tail = "\"finish_reason\":null}]}\n\n";
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    const auto rnd = [&](uint64_t n) {
      seed ^= seed << 13;
      seed ^= seed >> 7;
      seed ^= seed << 17;
      return seed % n;
    };
    const auto text = [&](size_t n) {
      std::string t;
      for (size_t i = 0; i < n; ++i) t.push_back("abc de,f\":{}[]0123456789"[rnd(24)]);
      return t;
    };
    const auto sized = [&](const std::string& p) {
      char hex[24];
      const int n = std::snprintf(hex, sizeof hex, rnd(4) == 0 ? "%zX" : "%zx", p.size());
      std::string zeros(rnd(6) == 0 ? rnd(17 - static_cast<uint64_t>(n)) : 0, '0');  // 16 digits at most
      return zeros + std::string(hex, static_cast<size_t>(n)) + (rnd(30) == 0 ? ";ext=1" : "") + "\r\n" + p + "\r\n";
    };
    size_t runs_seen = 0;
    for (int round = 0; round < 300; ++round) {
      std::string body;
      for (int c = 0, n = 1 + static_cast<int>(rnd(40)); c < n; ++c) {
        std::string p = long_head + text(rnd(4) == 0 ? rnd(30) : rnd(400)) + tail;  // plain, short or long
        switch (rnd(12)) {
          case 0: p[long_head.size() + rnd(p.size() - long_head.size() - 2)] = rnd(2) ? '\n' : '\r'; break;
          case 1: p[rnd(7)] ^= 0x20; break;                                       // the head
          case 2: p[p.size() - 3 - rnd(tail.size() - 2)] ^= 0x01; break;          // the tail
          case 3: p = p + p; break;                                                // two events
          case 4: p = "data: [DONE]\n\n"; break;
          case 5: p = "data: {\"off\":1}\n\n"; break;
          case 6: p = "data: {\"on\":1}\n\n"; break;
          default: break;
        }
        body += sized(p);
      }
      body += "0\r\n\r\n";
      const std::string msg = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body;
      // Three cuts (one body fed in up to four pieces), the same for both.
      std::vector<size_t> cuts{0, body.size()};
      for (int k = 0; k < 3; ++k) cuts.push_back(rnd(body.size() + 1));
      std::sort(cuts.begin(), cuts.end());
      // 0: the run, its pattern made per call; 1: chunk by chunk (a head
      // no pattern holds); 2: the run with the caller's pattern, made once.
      std::vector<std::string> logs[3];
      sluice::http::detail::skip_pattern prepared;
      REQUIRE(sluice::http::detail::make_skip_pattern("data: {", tail, prepared));
      for (int which = 0; which < 3; ++which) {
        struct toggling : skip_log {
          const char* body0 = nullptr;
        } log;
        body_sink sk = log.sink();
        sk.skip_head = which != 1 ? std::string_view("data: {") : std::string_view(long_head);
        sk.skip_tail = tail;
        if (which == 2) sk.skip_pattern = &prepared;
        sk.on_chunk = [](void* ctx, const char* d, size_t n, const char*) {
          auto* self = static_cast<skip_log*>(ctx);
          const std::string p(d, n);
          self->calls.push_back("chunk:" + p);
          if (p.find("\"off\"") != std::string::npos) self->ok = false;
          if (p.find("\"on\"") != std::string::npos) self->ok = true;
        };
        sk.on_skipped = [](void* ctx, uint32_t n, const char* end) {
          auto* self = static_cast<toggling*>(ctx);
          self->calls.push_back("skip:" + std::to_string(n) + "@" + std::to_string(end - self->body0));
        };
        response_parser p;
        response_head h;
        REQUIRE(p.parse_head(msg.data(), msg.size(), h).ok());
        log.body0 = msg.data() + h.head_bytes;
        size_t at = 0;
        bool complete = false;
        for (size_t k = 1; k < cuts.size() && !complete; ++k) {
          if (cuts[k] <= at) continue;
          const body_status st = p.feed_body(log.body0 + at, cuts[k] - at, sk);
          REQUIRE(st.error == errc::ok);
          complete = st.complete;
          at += st.consumed;
          // A feed's unconsumed bytes (a cut chunk is consumed as it goes) are none.
          REQUIRE((complete || at == cuts[k]));
        }
        CHECK(complete);
        logs[which] = log.calls;
      }
      CAPTURE(round);
      CHECK(logs[0] == logs[1]);
      CHECK(logs[2] == logs[0]);
      for (const std::string& c : logs[0]) runs_seen += c.rfind("skip:", 0) == 0 && c[5] != '1' ? 1 : 0;
    }
    CHECK(runs_seen > 100);  // runs of several chunks were taken
  }

  TEST_CASE("skip: the run reads a size line as the walker does -- two or three digits, or not, or broken -- with the same calls and the same error") {
    // Plain chunks of 48-4095 bytes, then one whose size line is one of
    // the forms the run reads itself (two or three digits and CRLF) or
    // hands to whole_chunk_at, broken or not: each byte of a two- or
    // three-digit line set to a non-digit, a CR, an LF; a one-digit line
    // followed by what looks like a later CRLF; leading zeros; an
    // extension; a size one off its payload. Fed whole, and cut at each
    // byte of the last size line: the run (a 7-byte head) and the chunk
    // test (a 25-byte head: no pattern) must agree on every call, on the
    // end and on the error.
    const std::string long_head = "data: {\"id\":\"chatcmpl-1\",\"";
    const std::string tail = "\"finish_reason\":null}]}\n\n";
    const auto plain = [&](size_t extra) { return long_head + std::string(extra, 'x') + tail; };
    const auto hex = [](size_t n) {
      char b[24];
      return std::string(b, static_cast<size_t>(std::snprintf(b, sizeof b, "%zx", n)));
    };
    std::vector<std::string> lasts;  // the last chunk, whole: its size line, payload and CRLF
    // `ff`: a payload of 255 bytes ("ff"), the size a broken digit
    // would read as where the check of the digits were missing ("fg",
    // "0fg": 0xf0 | 0xff, 0x0f0 | 0xff).
    const size_t ff = 255 - long_head.size() - tail.size();
    for (const size_t extra : {size_t{0}, size_t{3}, size_t{150}, ff, size_t{210}, size_t{300}, size_t{3000}}) {
      const std::string p = plain(extra);
      for (const std::string& h : {hex(p.size()), "0" + hex(p.size())}) {
      lasts.push_back(h + "\r\n" + p + "\r\n");
      lasts.push_back("0" + h + "\r\n" + p + "\r\n");
      lasts.push_back("00" + h + "\r\n" + p + "\r\n");
      lasts.push_back(h + ";a=b\r\n" + p + "\r\n");
      lasts.push_back(h + "\r\n" + p + "x\r\n");                         // one longer than its size
      lasts.push_back(h + "\r\n" + p.substr(0, p.size() - 1) + "\r\n");  // one shorter
      for (size_t k = 0; k < h.size() + 2; ++k) {
        for (const char c : {'g', '\r', '\n', ' ', ';', '0', 'F'}) {
          std::string l = h + "\r\n";
          l[k] = c;
          lasts.push_back(l + p + "\r\n");
        }
      }
      }
    }
    lasts.push_back("5\r\n\r\n\r\nxx\r\n");  // one digit, a CRLF where a third digit's would be
    lasts.push_back("5\r\nab\r\n\r\n");
    lasts.push_back("35\r\r\n" + plain(0) + "\r\n");
    const std::string lead = chunk(plain(20)) + chunk(plain(60));
    size_t errors = 0;
    for (const std::string& last : lasts) {
      const std::string body = lead + last + chunk(plain(10)) + "0\r\n\r\n";
      for (size_t cut = lead.size(); cut <= lead.size() + 6; ++cut) {
        std::vector<std::string> logs[2];
        errc errs[2];
        for (int which = 0; which < 2; ++which) {
          skip_log log;
          body_sink sk = log.sink();
          sk.skip_head = which == 0 ? std::string_view("data: {") : std::string_view(long_head);
          sk.skip_tail = tail;
          const std::string msg = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body;
          response_parser p;
          response_head h;
          REQUIRE(p.parse_head(msg.data(), msg.size(), h).ok());
          log.base = msg.data() + h.head_bytes;
          body_status st = p.feed_body(log.base, cut, sk);
          size_t at = st.consumed;
          if (st.error == errc::ok && !st.complete) {
            st = p.feed_body(log.base + at, body.size() - at, sk);
            at += st.consumed;
          }
          log.calls.push_back("end@" + std::to_string(at));
          logs[which] = log.calls;
          errs[which] = st.error;
        }
        CAPTURE(last);
        CAPTURE(cut);
        CHECK(logs[0] == logs[1]);
        CHECK(errs[0] == errs[1]);
        errors += errs[0] != errc::ok ? 1 : 0;
      }
    }
    CHECK(errors > 100);  // the broken lines were read as broken
  }
}
