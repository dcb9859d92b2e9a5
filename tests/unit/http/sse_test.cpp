// Spec-style cases for the SSE scanner: a de-chunked body and the events it
// must yield. Every row runs whole, one byte at a time and split in two at
// every position.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/http/sse.hpp"

using namespace std::literals;
using sluice::http::sse_event;
using sluice::http::sse_scanner;

namespace {

struct sse_case {
  std::string_view name;
  std::string input;
  std::vector<std::string> events;
};

const std::vector<sse_case>& cases() {
  static const std::vector<sse_case> k = {
      {"one event", "data: a\n\n", {"a"}},
      {"no space after the colon", "data:a\n\n", {"a"}},
      {"only one space is stripped", "data:  a \n\n", {" a "}},
      {"data lines are joined with LF", "data: a\ndata: b\ndata: c\n\n", {"a\nb\nc"}},
      {"CRLF line ends", "data: a\r\ndata: b\r\n\r\n", {"a\nb"}},
      {"CR line ends", "data: a\rdata: b\r\r", {"a\nb"}},
      {"mixed line ends", "data: a\r\n\ndata: b\n\r\ndata: c\r\r", {"a", "b", "c"}},
      {"comments are ignored", ": keep-alive\n\n: ping\ndata: x\n\n", {"x"}},
      {"event, id and retry are ignored", "event: message\nid: 7\nretry: 100\ndata: x\n\n", {"x"}},
      {"unknown fields are ignored", "foo: bar\ndatax: y\ndat: z\ndata: x\n\n", {"x"}},
      {"an event without data is not reported", "event: ping\n\n", {}},
      {"data without a colon is an empty line", "data\n\n", {""}},
      {"empty data value", "data:\n\n", {""}},
      {"empty data lines join", "data\ndata\n\n", {"\n"}},
      {"colons inside the value stay", "data: {\"a\":\"b:c\"}\n\n", {"{\"a\":\"b:c\"}"}},
      {"extra blank lines dispatch nothing", "\n\n\ndata: a\n\n\n\n", {"a"}},
      {"an unterminated event is not reported", "data: a\n\ndata: b\n", {"a"}},
      {"vLLM stream",
       "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
       "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
       "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n"
       "data: [DONE]\n\n",
       {"{\"id\":\"c\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}",
        "{\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}",
        "{\"id\":\"c\",\"choices\":[],\"usage\":{\"total_tokens\":3}}", "[DONE]"}},
      {"a NUL byte is data", "data: a\0b\n\n"s, {"a\0b"s}},
  };
  return k;
}

struct recorder {
  std::vector<std::string> events;
  std::vector<bool> truncated;
  static void on_event(void* ctx, const sse_event& ev) {
    auto* self = static_cast<recorder*>(ctx);
    self->events.emplace_back(ev.data);
    self->truncated.push_back(ev.truncated);
  }
};

}  // namespace

TEST_SUITE("http::sse_scanner") {
  TEST_CASE("every spec row yields its events fed whole") {
    for (const sse_case& c : cases()) {
      CAPTURE(c.name);
      recorder r;
      sse_scanner s(recorder::on_event, &r);
      s.feed(c.input.data(), c.input.size());
      CHECK(r.events == c.events);
      CHECK(s.events() == c.events.size());
    }
  }

  TEST_CASE("every spec row yields the same events fed one byte at a time") {
    for (const sse_case& c : cases()) {
      CAPTURE(c.name);
      recorder r;
      sse_scanner s(recorder::on_event, &r);
      for (char ch : c.input) s.feed(&ch, 1);
      CHECK(r.events == c.events);
    }
  }

  TEST_CASE("every spec row yields the same events split in two anywhere") {
    for (const sse_case& c : cases()) {
      for (size_t at = 0; at <= c.input.size(); ++at) {
        CAPTURE(c.name);
        CAPTURE(at);
        recorder r;
        sse_scanner s(recorder::on_event, &r);
        s.feed(c.input.data(), at);
        s.feed(c.input.data() + at, c.input.size() - at);
        CHECK(r.events == c.events);
      }
    }
  }

  TEST_CASE("an event longer than the buffer is reported truncated when it spans pieces, and the next one is whole") {
    const std::string big(sse_scanner::k_event_bytes_max + 100, 'x');
    const std::string in = "data: " + big + "\n\ndata: next\n\n";
    recorder r;
    auto s = std::make_unique<sse_scanner>(recorder::on_event, &r);
    s->feed(in.data(), 1000);
    s->feed(in.data() + 1000, in.size() - 1000);
    REQUIRE(r.events.size() == 2);
    CHECK(r.truncated[0]);
    CHECK(r.events[0].size() == sse_scanner::k_event_bytes_max);
    CHECK(r.events[0] == big.substr(0, sse_scanner::k_event_bytes_max));
    CHECK_FALSE(r.truncated[1]);
    CHECK(r.events[1] == "next");
  }

  TEST_CASE("with an event limit, a long event over many pieces is assembled whole; past the limit, cut; reset forgets it") {
    const std::string big(300000, 'y');
    const std::string lines = "data: " + big.substr(0, 150000) + "\ndata: " + big.substr(150000) + "\n\n";
    const std::string in = lines + "data: next\n\n" + "data: " + big + big + "\n\n";
    recorder r;
    auto s = std::make_unique<sse_scanner>(recorder::on_event, &r);
    s->set_event_limit(400000);
    for (size_t at = 0; at < in.size(); at += 7001) s->feed(in.data() + at, std::min<size_t>(7001, in.size() - at));
    REQUIRE(r.events.size() == 3);
    CHECK_FALSE(r.truncated[0]);
    CHECK(r.events[0] == big.substr(0, 150000) + "\n" + big.substr(150000));
    CHECK(r.events[1] == "next");
    CHECK(r.truncated[2]);  // 600 kB: past the limit, cut at what the buffer held
    CHECK(r.events[2].size() <= 400000);
    CHECK(r.events[2].size() >= sse_scanner::k_event_bytes_max);
    // reset(): the default bound again.
    s->reset();
    r = recorder{};
    const std::string again = "data: " + big + "\n\n";
    s->feed(again.data(), 1000);
    s->feed(again.data() + 1000, again.size() - 1000);
    REQUIRE(r.events.size() == 1);
    CHECK(r.truncated[0]);
    CHECK(r.events[0].size() == sse_scanner::k_event_bytes_max);
  }

  TEST_CASE("an event with one data line inside one piece is reported in place, whatever its size") {
    const std::string big(sse_scanner::k_event_bytes_max + 100, 'x');
    const std::string in = "data: " + big + "\n\ndata: a\ndata: b\n\n: c\ndata: tail";
    struct seen_t {
      std::vector<std::string> data;
      std::vector<bool> in_place;
      std::vector<const char*> at;
    } seen;
    sse_scanner s(
        [](void* ctx, const sse_event& ev) {
          auto* x = static_cast<seen_t*>(ctx);
          x->data.emplace_back(ev.data);
          x->in_place.push_back(ev.in_place);
          x->at.push_back(ev.data.data());
        },
        &seen);
    s.feed(in.data(), in.size());
    const std::string more = "\n\n";
    s.feed(more.data(), more.size());
    REQUIRE(seen.data.size() == 3);
    CHECK(seen.in_place[0]);
    CHECK(seen.at[0] == in.data() + 6);  // the caller's bytes, not a copy
    CHECK(seen.data[0] == big);
    CHECK_FALSE(seen.in_place[1]);       // two data lines are joined in a copy
    CHECK(seen.data[1] == "a\nb");
    CHECK_FALSE(seen.in_place[2]);       // its end came in the next piece
    CHECK(seen.data[2] == "tail");
  }

  TEST_CASE("a CR or LF anywhere in a one-piece event takes it off the fast path: the same events as byte by byte") {
    // The fast path's line-end check reads 64 bytes a turn and then the last
    // 64 again: every size around those blocks, every offset, CR and LF.
    for (size_t n : {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 191, 192, 193, 250}) {
      for (size_t at = 0; at < n; ++at) {
        for (char eol : {'\n', '\r'}) {
          std::string value(n, 'v');
          value[at] = eol;
          const std::string in = "data: " + value + "\n\n";
          CAPTURE(n);
          CAPTURE(at);
          recorder whole, bytes;
          sse_scanner a(recorder::on_event, &whole), b(recorder::on_event, &bytes);
          a.feed(in.data(), in.size());
          for (char ch : in) b.feed(&ch, 1);
          REQUIRE(whole.events == bytes.events);
          CHECK(a.events() == b.events());
        }
      }
      // And with no line end: one event, in place, the value whole.
      const std::string value(n, 'v');
      const std::string in = "data: " + value + "\n\n";
      recorder r;
      sse_scanner s(recorder::on_event, &r);
      s.feed(in.data(), in.size());
      REQUIRE(r.events.size() == 1);
      CHECK(r.events[0] == value);
    }
  }

  TEST_CASE("an event that fills the buffer exactly is not truncated") {
    const std::string full(sse_scanner::k_event_bytes_max, 'y');
    const std::string in = "data: " + full + "\n\n";
    recorder r;
    auto s = std::make_unique<sse_scanner>(recorder::on_event, &r);
    for (size_t i = 0; i < in.size(); i += 1000) s->feed(in.data() + i, std::min<size_t>(1000, in.size() - i));
    REQUIRE(r.events.size() == 1);
    CHECK_FALSE(r.truncated[0]);
    CHECK(r.events[0] == full);
  }

  TEST_CASE("reset drops a partial event and the count") {
    recorder r;
    sse_scanner s(recorder::on_event, &r);
    const std::string_view a = "data: a\n\ndata: partial";
    s.feed(a.data(), a.size());
    CHECK(s.events() == 1);
    s.reset();
    CHECK(s.events() == 0);
    const std::string_view b = "\n\ndata: b\n\n";
    s.feed(b.data(), b.size());
    CHECK(r.events == std::vector<std::string>{"a", "b"});
  }
}

TEST_SUITE("http::sse_scanner between_events") {
  TEST_CASE("between two events only after an event's blank line, not inside one") {
    sluice::http::sse_scanner s(nullptr, nullptr);
    CHECK(s.between_events());
    s.feed("data: {\"a\":1}\n\n", 15);
    CHECK(s.between_events());
    s.feed("event: x\n", 9);  // a field of the next event
    CHECK_FALSE(s.between_events());
    s.feed("data: 2\r\n\r", 10);
    CHECK_FALSE(s.between_events());  // the LF of the CRLF may still come
    s.feed("\n", 1);
    CHECK(s.between_events());
    s.feed(": comment\n", 10);
    CHECK_FALSE(s.between_events());
  }

  TEST_CASE("has_line_end, dispatched, direct and SSE2, against a byte loop: one byte of every low value at every offset") {
    // The bytes below 14 (which the block test takes as candidates), 14 and
    // 0xFF (never), in buffers of 0..520 bytes of JSON-like text (four of
    // AVX2's 128-byte turns and every rest after them), at every offset;
    // and two of them in one buffer.
    const auto slow = [](const char* p, size_t n) {
      for (size_t i = 0; i < n; ++i) {
        if (p[i] == '\n' || p[i] == '\r') return true;
      }
      return false;
    };
    std::string base;
    for (size_t i = 0; i < 520; ++i) base.push_back("{\"content\":\" tok\\u00e9x\"}"[i % 25]);
    const sluice::http::detail::line_end_fn direct = sluice::http::detail::line_end_impl();
    size_t checked = 0;
    for (size_t n = 0; n <= 520; ++n) {
      // A heap block of exactly n bytes: a load past its end is ASan's.
      const std::unique_ptr<char[]> b(new char[n == 0 ? 1 : n]);
      std::copy_n(base.data(), n, b.get());
      CHECK_FALSE(sluice::http::has_line_end(b.get(), n));
      CHECK_FALSE(direct(b.get(), n));
      CHECK_FALSE(sluice::http::detail::line_end_sse2(b.get(), n));
      for (const char c : {'\0', '\t', '\n', '\v', '\f', '\r', '\x0e', '\xff'}) {
        for (size_t at = 0; at < n; ++at) {
          const size_t other = (at * 7 + 3) % n;
          b[at] = c;
          if (at % 2 != 0 && other != at) b[other] = '\t';
          const bool want = slow(b.get(), n);
          REQUIRE(sluice::http::has_line_end(b.get(), n) == want);
          REQUIRE(direct(b.get(), n) == want);
          REQUIRE(sluice::http::detail::line_end_sse2(b.get(), n) == want);
          b[at] = base[at];
          b[other] = base[other];
          ++checked;
        }
      }
    }
    CHECK(checked == 8 * 520 * 521 / 2);
  }

  TEST_CASE("the skip pattern, dispatched, SSE2 and the run's, agrees with comparing head and tail and scanning for CR and LF") {
    // The relay's patterns and others: every payload of 48..300 bytes made
    // of head + text + tail, then each byte changed in turn (to a line end,
    // a tab, another printable byte), in a heap block of exactly n bytes.
    namespace d = sluice::http::detail;
    const auto slow = [](std::string_view head, std::string_view tail, const char* p, size_t n) {
      if (n < head.size() + tail.size()) return false;
      if (std::string_view(p, head.size()) != head || std::string_view(p + n - tail.size(), tail.size()) != tail) return false;
      for (size_t i = head.size(); i + 2 < n; ++i) {
        if (p[i] == '\n' || p[i] == '\r') return false;
      }
      return true;
    };
    struct pair {
      std::string_view head, tail;
    };
    const pair pairs[] = {{"data: {", "\"finish_reason\":null}]}\n\n"},
                          {"data: {", "}\n\n"},
                          {"", "\n\n"},
                          {"event: x\ndata: {", "}\n\n"},            // a line end in the head
                          {"data: {\"x\":", "\r\n\"a\":1}\n\n"},      // and in the tail, before its last two
                          {"0123456789abcdef", "0123456789abcdef0123456789abcd\n\n"}};  // 16 and 32 bytes
    d::skip_pattern none;
    CHECK_FALSE(d::make_skip_pattern("data: {", "}\n", none));            // not ending in a blank line
    CHECK_FALSE(d::make_skip_pattern("event: content_block_delta\ndata: {", "}\n\n", none));  // head over 16
    CHECK_FALSE(d::make_skip_pattern("", std::string(33, 'x') + "\n\n", none));
    const d::skip_fn direct = d::skip_impl();
    // And the run's (AVX2) test, on the payload as one whole chunk.
    const d::skip_run_fn run = d::skip_run_impl();
    const auto run_takes = [&](const d::skip_pattern& pt, const char* p, size_t n) {
      // In a heap block of exactly the chunk's bytes.
      char hex[20];
      const auto h = static_cast<size_t>(std::snprintf(hex, sizeof hex, "%zx\r\n", n));
      const size_t total = h + n + 2;
      const std::unique_ptr<char[]> framed(new char[total]);
      std::copy_n(hex, h, framed.get());
      std::copy_n(p, n, framed.get() + h);
      std::copy_n("\r\n", 2, framed.get() + h + n);
      uint64_t bl = UINT64_MAX, fl = UINT64_MAX;
      uint32_t c = 0;
      const size_t end = run(pt, framed.get(), total, 0, bl, fl, c);
      return end == total && c == 1;
    };
    size_t checked = 0, passed = 0;
    for (const pair& pr : pairs) {
      d::skip_pattern pat;
      REQUIRE(d::make_skip_pattern(pr.head, pr.tail, pat));
      // Sizes: every one to 80, then every 37th, and where the bytes the
      // minimum covers (n less the head and the tail's cut) are one side
      // or the other of a way of reading them (32, 64, 128, 256 bytes).
      std::vector<size_t> sizes;
      for (size_t n = d::k_skip_pattern_min; n <= 300; n += (n < 80 ? 1 : 37)) sizes.push_back(n);
      for (const size_t edge : {64u, 128u, 256u}) {
        for (size_t span = edge - 1; span <= edge + 1; ++span) sizes.push_back(span + pat.head_n + pat.scan_cut);
      }
      for (const size_t n : sizes) {
        std::string base(pr.head);
        // (The filler's own length: an index past it read whatever the
        // binary held after the literal.)
        constexpr std::string_view filler = "{\"content\":\" tok\u00e9x\"},";
        while (base.size() + pr.tail.size() < n) base.push_back(filler[base.size() % filler.size()]);
        base += pr.tail;
        REQUIRE(base.size() == n);
        const std::unique_ptr<char[]> b(new char[n]);
        std::copy_n(base.data(), n, b.get());
        for (size_t at = 0; at < n; ++at) {
          for (const char c : {'\n', '\r', '\t', 'Q'}) {
            const char was = b[at];
            b[at] = c;
            const bool want = slow(pr.head, pr.tail, b.get(), n);
            REQUIRE(direct(pat, b.get(), n) == want);
            REQUIRE(d::skip_sse2(pat, b.get(), n) == want);
            if (run != nullptr) REQUIRE(run_takes(pat, b.get(), n) == want);
            passed += want ? 1 : 0;
            b[at] = was;
            ++checked;
          }
        }
        const bool whole = slow(pr.head, pr.tail, b.get(), n);
        CHECK(direct(pat, b.get(), n) == whole);
        CHECK(d::skip_sse2(pat, b.get(), n) == whole);
      }
    }
    CHECK(checked > 110000);  // 110,292 payloads and changes
    CHECK(passed > 1000);  // both answers were seen
  }

  TEST_CASE("the skip's run takes whole plain chunks and stops before the first that fails, is cut, or leaves the limits") {
    namespace d = sluice::http::detail;
    const d::skip_run_fn run = d::skip_run_impl();
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) {
      CHECK((run == nullptr));  // the walk tests chunk by chunk there (response_test)
      return;
    }
    REQUIRE((run != nullptr));
    d::skip_pattern pat;
    REQUIRE(d::make_skip_pattern("data: {", "\"finish_reason\":null}]}\n\n", pat));
    const std::string payload =
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":null}]}\n\n";
    const auto chunk = [](const std::string& p, std::string_view size_prefix = "") {
      char hex[20];
      const int n = std::snprintf(hex, sizeof hex, "%zx", p.size());
      return std::string(size_prefix) + std::string(hex, static_cast<size_t>(n)) + "\r\n" + p + "\r\n";
    };
    const std::string plain = chunk(payload);
    std::string odd = payload;
    odd[30] = '\n';
    // Five plain chunks (one with its size in 16 digits, leading zeros),
    // then one that fails the test, then one more plain.
    const std::string five = plain + plain + chunk(payload, "00000000000000") + plain + plain;
    const std::string body = five + chunk(odd) + plain;
    const auto go = [&](size_t len, size_t from, uint64_t body_left, uint64_t framing_left, uint32_t& chunks) {
      uint64_t b = body_left, f = framing_left;
      const size_t end = run(pat, body.data(), len, from, b, f, chunks);
      // What it took off the limits is the payload and framing it passed.
      CHECK(body_left - b == chunks * payload.size());
      CHECK(framing_left - f == (end - from) - chunks * payload.size());
      return end;
    };
    uint32_t chunks = 0;
    CHECK(go(body.size(), 0, UINT64_MAX, UINT64_MAX, chunks) == five.size());
    CHECK(chunks == 5);
    chunks = 0;
    CHECK(go(body.size(), five.size(), UINT64_MAX, UINT64_MAX, chunks) == five.size());  // the odd one first: none
    CHECK(chunks == 0);
    // Cut anywhere inside the third chunk: the two before it.
    for (size_t cut = 2 * plain.size() + 1; cut < 3 * plain.size() + 14; ++cut) {
      chunks = 0;
      CAPTURE(cut);
      CHECK(go(cut, 0, UINT64_MAX, UINT64_MAX, chunks) == 2 * plain.size());
      CHECK(chunks == 2);
    }
    // The limits: where they leave less than `len`, the run takes nothing
    // (the walk tests chunk by chunk, each against them); from `len` on, all.
    for (const bool by_body : {true, false}) {
      for (const uint64_t room : {uint64_t{0}, 2 * payload.size(), uint64_t{body.size() - 1}, uint64_t{body.size()}}) {
        chunks = 0;
        const uint64_t b = by_body ? room : UINT64_MAX;
        const uint64_t f = by_body ? UINT64_MAX : room;
        CAPTURE(by_body);
        CAPTURE(room);
        const bool takes = room >= body.size();
        CHECK(go(body.size(), 0, b, f, chunks) == (takes ? five.size() : 0));
        CHECK(chunks == (takes ? 5u : 0u));
      }
    }
    // What the walker does not take whole is not taken: an extension, a
    // 17-digit size, the last chunk, a bare LF after the size.
    for (const std::string& bad : {std::string("b3;x=1\r\n"), std::string("00000000000000000b3\r\n"), std::string("0\r\n\r\n"),
                                   std::string("b3\n")}) {
      const std::string b2 = plain + bad + payload + "\r\n";
      uint64_t bl = UINT64_MAX, fl = UINT64_MAX;
      chunks = 0;
      CAPTURE(bad);
      CHECK(run(pat, b2.data(), b2.size(), 0, bl, fl, chunks) == plain.size());
      CHECK(chunks == 1);
    }
  }

  TEST_CASE("the skip's run reads nothing past `len` however a read ends, and takes no chunk under k_skip_pattern_min bytes") {
    namespace d = sluice::http::detail;
    const d::skip_run_fn run = d::skip_run_impl();
    if (run == nullptr) return;  // no AVX2: the walk tests chunk by chunk (response_test)
    const std::string head = "data: {", tail = "\"finish_reason\":null}]}\n\n";
    d::skip_pattern pat;
    REQUIRE(d::make_skip_pattern(head, tail, pat));
    const auto chunk = [](const std::string& p) {
      char hex[20];
      const int n = std::snprintf(hex, sizeof hex, "%zx", p.size());
      return std::string(hex, static_cast<size_t>(n)) + "\r\n" + p + "\r\n";
    };
    // Runs the skip over bytes[0, len) copied into a heap block of exactly
    // len bytes: a read past it fails under ASan.
    const auto take = [&](const std::string& bytes, size_t len, uint32_t& chunks) {
      const std::unique_ptr<char[]> b(new char[len == 0 ? 1 : len]);
      std::copy_n(bytes.data(), len, b.get());
      uint64_t bl = UINT64_MAX, fl = UINT64_MAX;
      chunks = 0;
      return run(pat, b.get(), len, 0, bl, fl, chunks);
    };
    // Payloads of 48 bytes (size line "30"), 49 and 200: cut at every byte
    // of the third chunk and just past it.
    for (const size_t n : {size_t{48}, size_t{49}, size_t{200}}) {
      const std::string payload = head + std::string(n - head.size() - tail.size(), 'x') + tail;
      const std::string one = chunk(payload);
      const std::string body = one + one + one;
      for (size_t cut = 2 * one.size(); cut <= body.size(); ++cut) {
        uint32_t chunks = 0;
        CAPTURE(n);
        CAPTURE(cut);
        const size_t want = cut == body.size() ? body.size() : 2 * one.size();
        CHECK(take(body, cut, chunks) == want);
        CHECK(chunks == want / one.size());
      }
    }
    // Chunks of 1-47 bytes, those from 32 on with the pattern's head and
    // tail: never taken by the run (the walk's chunk test has them), and
    // the run stops before each.
    const std::string big = chunk(head + std::string(150, 'x') + tail);
    static_assert(d::k_skip_pattern_min == 48, "the sizes below are drawn for the run's minimum of 48");
    for (size_t n = 1; n < 48; ++n) {
      const std::string payload =
          n >= head.size() + tail.size() ? head + std::string(n - head.size() - tail.size(), 'x') + tail : std::string(n, 'x');
      const std::string body = big + chunk(payload) + big;
      uint32_t chunks = 0;
      CAPTURE(n);
      CHECK(take(body, body.size(), chunks) == big.size());
      CHECK(chunks == 1);
    }
  }
}
