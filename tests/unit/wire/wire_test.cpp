#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include <string_view>

#include "wire.hpp"

using namespace sluice::proxy;

namespace {

std::string chunk(std::string_view payload) {
  char size[16];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
  return std::string(size, static_cast<size_t>(n)) + std::string(payload) + "\r\n";
}

const std::string k_usage_event =
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],"
    "\"usage\":{\"prompt_tokens\":7,\"total_tokens\":10,\"completion_tokens\":3}}\n\n";
const std::string k_content_event =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";

}  // namespace

TEST_SUITE("proxy::wire") {
  TEST_CASE("hop-by-hop and sluice's own request fields are dropped, in any case") {
    for (const char* f : {"Host", "authorization", "Content-Length", "TRANSFER-ENCODING", "Expect", "connection",
                          "Keep-Alive", "proxy-connection", "TE", "trailer", "Upgrade", "proxy-authorization",
                          "HTTP2-Settings", "x-request-id", "X-Forwarded-For", "X-Api-Key"}) {
      CAPTURE(f);
      CHECK(drop_request_header(f));
    }
    // Names of the dropped ones' lengths too: the length picks the
    // candidates, the bytes decide.
    for (const char* f : {"content-type", "x-session-id", "user-agent", "accept", "hostname", "x-request", "tf", "hose",
                          "x-stainless-os", "x-stainless-arch", "x-stainless-async", "x-stainless-runtime", "x-api-kez",
                          "trailers", "upgrad", ""}) {
      CAPTURE(f);
      CHECK_FALSE(drop_request_header(f));
    }
    for (const char* f : {"Connection", "keep-alive", "Proxy-Connection", "te", "Trailer", "upgrade", "x-request-id"}) {
      CAPTURE(f);
      CHECK(drop_response_header(f));
    }
    for (const char* f : {"content-type", "transfer-encoding", "content-length", "x-api-key", "set-cookie", "tf"}) {
      CAPTURE(f);
      CHECK_FALSE(drop_response_header(f));  // framing passes through as it is
    }
  }

  TEST_CASE("fields named in Connection are hop-by-hop too") {
    CHECK(named_in_connection("keep-alive, X-Custom", "x-custom"));
    CHECK(named_in_connection(" close ,\tfoo\t", "FOO"));
    CHECK_FALSE(named_in_connection("x-customer", "x-custom"));
    CHECK_FALSE(named_in_connection("", "x"));
  }

  TEST_CASE("the usage chunk is found by its size line and its event, and only then") {
    const std::string before = chunk(k_content_event);
    const std::string usage = chunk(k_usage_event);
    const std::string after = chunk("data: [DONE]\n\n");
    const std::string batch = before + usage + after;
    size_t b = 0, e = 0;
    REQUIRE(find_usage_chunk(batch.data(), batch.size(), 0, b, e));
    CHECK(b == before.size());
    CHECK(e == before.size() + usage.size());

    SUBCASE("a size line that does not match the event is left alone") {
      std::string bad = before + usage + after;
      bad[before.size()] = bad[before.size()] == 'f' ? 'e' : 'f';  // corrupt the hex size
      CHECK_FALSE(find_usage_chunk(bad.data(), bad.size(), 0, b, e));
    }
    SUBCASE("a usage object on a chunk with choices is not the injected one") {
      const std::string with_choices = chunk(
          "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1}}\n\n");
      CHECK_FALSE(find_usage_chunk(with_choices.data(), with_choices.size(), 0, b, e));
    }
    SUBCASE("a chunk not yet whole is not cut") {
      const std::string partial = before + usage.substr(0, usage.size() - 2);
      CHECK_FALSE(find_usage_chunk(partial.data(), partial.size(), 0, b, e));
    }
    SUBCASE("the search starts where the scan saw the event") {
      CHECK(find_usage_chunk(batch.data(), batch.size(), before.size() + 10, b, e));
      CHECK(b == before.size());
    }
  }

  TEST_CASE("advance_iov drops what a short send took and keeps the rest in order") {
    char a[10], bb[20], c[5];
    iovec iov[3] = {{a, sizeof a}, {bb, sizeof bb}, {c, sizeof c}};
    uint8_t n = 3;
    CHECK(advance_iov(iov, n, 4));
    CHECK(n == 3);
    CHECK(iov[0].iov_base == a + 4);
    CHECK(iov[0].iov_len == 6);
    CHECK(advance_iov(iov, n, 6 + 15));  // the rest of a, most of b
    CHECK(n == 2);
    CHECK(iov[0].iov_base == bb + 15);
    CHECK(iov[0].iov_len == 5);
    CHECK(iov[1].iov_base == c);
    CHECK_FALSE(advance_iov(iov, n, 10));
    CHECK(n == 0);
  }
}

TEST_SUITE("proxy::wire re-framing") {
  TEST_CASE("dechunk copies the payload of whole chunks, extensions skipped, up to the terminal chunk") {
    const std::string in = "5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
    char out[64];
    bool last = false;
    const size_t n = dechunk(in.data(), in.size(), out, last);
    CHECK(std::string_view(out, n) == "hello world");
    CHECK(last);
    const std::string no_end = "3\r\nabc\r\n";
    CHECK(dechunk(no_end.data(), no_end.size(), out, last) == 3);
    CHECK_FALSE(last);
  }

  TEST_CASE("dechunk is bounded by its input whatever the bytes: sizes that would wrap, 17 digits, no LF") {
    // A batch that starts inside a chunk's data (what a hostile backend
    // made the relay hand on): 2^64-1 once made memcpy copy past the end.
    std::string in = "FFFFFFFFFFFFFFFF\n";
    in.append(100, 'A');
    std::vector<char> out(in.size());
    bool last = true;
    size_t n = dechunk(in.data(), in.size(), out.data(), last);
    CHECK(n == 100);  // the cut chunk's data so far, and no more
    CHECK_FALSE(last);
    in = "1\nX\r\nFFFFFFFFFFFFFFED\n";
    in.append(40, 'Z');
    out.assign(in.size(), 0);
    n = dechunk(in.data(), in.size(), out.data(), last);
    CHECK(n == 1 + 40);
    in = "100000000000000001\r\nabc";  // 18 digits: no size line
    CHECK(dechunk(in.data(), in.size(), out.data(), last) == 0);
    in = "3\r\nabc\r\n5";  // a size line without its LF
    CHECK(dechunk(in.data(), in.size(), out.data(), last) == 3);
  }

  TEST_CASE("find_usage_chunk takes no size line of over 16 digits") {
    const std::string ev = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n";
    char size[32];
    std::snprintf(size, sizeof size, "%zx", ev.size());
    size_t b = 0, e = 0;
    std::string good = std::string(size) + "\r\n" + ev + "\r\n";
    CHECK(find_usage_chunk(good.data(), good.size(), 0, b, e));
    // The same value behind 16 zeros: 18 digits, which no walker passed.
    std::string padded = std::string(16, '0') + size + "\r\n" + ev + "\r\n";
    CHECK_FALSE(find_usage_chunk(padded.data(), padded.size(), 0, b, e));
  }

  TEST_CASE("drop_usage_events leaves out the usage-only event, whatever its spacing and line ends") {
    const std::string content = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}";
    const std::string usage_spaced = "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 1, \"completion_tokens\": 2}}";
    for (const char* eol : {"\n", "\r\n", "\r"}) {
      CAPTURE(std::string(eol));
      const std::string e = eol;
      const std::string in = content + e + e + usage_spaced + e + e + "data: [DONE]" + e + e;
      std::string out(in.size(), '\0');
      uint32_t cut = 0;
      const size_t n = drop_usage_events(in.data(), in.size(), out.data(), cut);
      CHECK(cut == 1);
      CHECK(out.substr(0, n) == content + e + e + "data: [DONE]" + e + e);
    }
  }

  TEST_CASE("drop_usage_events keeps usage that rides on a chunk with choices, and an unfinished tail") {
    const std::string with_choices = "data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1}}\n\n";
    const std::string tail = "data: {\"choices\":[],\"usa";
    const std::string in = with_choices + tail;
    std::string out(in.size(), '\0');
    uint32_t cut = 0;
    const size_t n = drop_usage_events(in.data(), in.size(), out.data(), cut);
    CHECK(cut == 0);
    CHECK(out.substr(0, n) == in);
  }
}

TEST_SUITE("proxy::wire the usage event cut as it streams") {
  TEST_CASE("classify_event_prefix reads the top level's choices, whatever the spacing, and no deeper") {
    CHECK(classify_event_prefix(R"({"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1)") ==
          prefix_verdict::usage_only);
    CHECK(classify_event_prefix(R"( { "id" : "x" , "choices" : [ ] , "usage")") == prefix_verdict::usage_only);
    CHECK(classify_event_prefix(R"({"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]})") == prefix_verdict::other);
    CHECK(classify_event_prefix(R"({"id":"a \"choices\":[] b","choices":[{"index")") == prefix_verdict::other);
    CHECK(classify_event_prefix(R"({"meta":{"choices":[]},"choices":[{"x":1}]})") == prefix_verdict::other);
    CHECK(classify_event_prefix(R"({"usage":{"prompt_tokens":1}})") == prefix_verdict::other);  // no choices at all
    CHECK(classify_event_prefix("[DONE]") == prefix_verdict::other);
    CHECK(classify_event_prefix(R"({"id":"chatcmpl-1","choi)") == prefix_verdict::unknown);
    CHECK(classify_event_prefix(R"({"id":"chatcmpl-1","choices":)") == prefix_verdict::unknown);
    CHECK(classify_event_prefix(R"({"big":")" + std::string(100000, 'x')) == prefix_verdict::unknown);
  }

  TEST_CASE("dechunk_cursor takes the payload of chunks cut anywhere, up to the terminal chunk") {
    const std::string in = "5\r\nhello\r\n6;x=1\r\n world\r\n10\r\n0123456789abcdef\r\n0\r\nt: 1\r\n\r\n";
    for (size_t cut1 = 0; cut1 <= in.size(); ++cut1) {
      for (size_t cut2 = cut1; cut2 <= in.size(); cut2 += 7) {
        CAPTURE(cut1);
        CAPTURE(cut2);
        dechunk_cursor c;
        std::string out(in.size(), '\0');
        bool last = false;
        size_t w = c.feed(in.data(), cut1, out.data(), last);
        w += c.feed(in.data() + cut1, cut2 - cut1, out.data() + w, last);
        w += c.feed(in.data() + cut2, in.size() - cut2, out.data() + w, last);
        CHECK(std::string_view(out.data(), w) == "hello world0123456789abcdef");
        CHECK(last);
      }
    }
  }

  // A stream of events; `usage` is left out whatever its size.
  std::string usage_event(size_t extra, std::string_view eol) {
    return "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,"
           "\"completion_tokens\":3},\"extra\":\"" + std::string(extra, 'u') + "\"}" + std::string(eol) + std::string(eol);
  }
  std::string content_event(std::string_view text, std::string_view eol) {
    return "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + std::string(text) +
           "\"}}]}" + std::string(eol) + std::string(eol);
  }

  TEST_CASE("usage_event_filter drops the usage event, 70 KB or 4 MB, in any split; every other event passes whole") {
    for (const std::string_view eol : {std::string_view("\n"), std::string_view("\r\n"), std::string_view("\r")}) {
      for (const size_t extra : {size_t{0}, size_t{70000}, size_t{4u << 20}}) {
        CAPTURE(extra);
        const std::string before = content_event("a", eol) + ": a comment" + std::string(eol) + std::string(eol) +
                                   content_event(std::string(200000, 'b'), eol);  // a content event larger than any hold
        const std::string after = "data: [DONE]" + std::string(eol) + std::string(eol);
        const std::string in = before + usage_event(extra, eol) + after;
        for (const size_t piece : {size_t{1}, size_t{13}, size_t{4096}, in.size()}) {
          if (piece == 1 && extra > 70000) continue;  // byte by byte over 4 MB: slow, and the 13-byte split covers it
          CAPTURE(piece);
          usage_event_filter f;
          std::string out;
          std::vector<char> room(piece + usage_event_filter::k_hold_bytes_max);
          for (size_t at = 0; at < in.size(); at += piece) {
            const size_t k = std::min(piece, in.size() - at);
            const size_t w = f.feed(in.data() + at, k, room.data());
            out.append(room.data(), w);
          }
          CHECK(f.dropped() == 1);
          CHECK(out.size() == before.size() + after.size());
          CHECK(out == before + after);
        }
      }
    }
  }

  TEST_CASE("nothing after [DONE] goes out; told to keep usage, the filter keeps it") {
    const std::string in = content_event("a", "\r\n") + usage_event(10, "\r\n") + "data: [DONE]\r\n\r\n" +
                           "data: late\n\n" + std::string(50000, 'A');
    usage_event_filter f;
    std::vector<char> room(in.size() + usage_event_filter::k_hold_bytes_max);
    size_t w = f.feed(in.data(), in.size(), room.data());
    CHECK(std::string_view(room.data(), w) == content_event("a", "\r\n") + "data: [DONE]\r\n\r\n");
    CHECK(f.done());
    f.reset(false);
    CHECK_FALSE(f.done());
    w = f.feed(in.data(), in.size(), room.data());
    CHECK(std::string_view(room.data(), w) == content_event("a", "\r\n") + usage_event(10, "\r\n") + "data: [DONE]\r\n\r\n");
    CHECK(f.dropped() == 0);
  }

  TEST_CASE("after [DONE] the output is the same however the rest is cut (a CR, then an LF in the next feed)") {
    const std::string in = "data: [DONE]\r\r\rx\r\ndata: late\r\n\r\n";
    std::vector<char> a(in.size() + usage_event_filter::k_hold_bytes_max), b(a.size());
    usage_event_filter whole;
    const size_t n = whole.feed(in.data(), in.size(), a.data());
    CHECK(std::string_view(a.data(), n) == "data: [DONE]\r\r");
    for (size_t cut = 0; cut <= in.size(); ++cut) {
      CAPTURE(cut);
      usage_event_filter split;
      size_t m = split.feed(in.data(), cut, b.data());
      m += split.feed(in.data() + cut, in.size() - cut, b.data() + m);
      CHECK(std::string_view(b.data(), m) == std::string_view(a.data(), n));
    }
  }

  TEST_CASE("an event the hold cannot decide goes out whole") {
    // "choices" behind 20 KB of another member: undecided at the bound.
    const std::string ev = "data: {\"id\":\"" + std::string(20000, 'i') + "\",\"choices\":[]}\n\n";
    usage_event_filter f;
    std::vector<char> room(ev.size() + usage_event_filter::k_hold_bytes_max);
    const size_t w = f.feed(ev.data(), ev.size(), room.data());
    CHECK(std::string_view(room.data(), w) == ev);
    CHECK(f.dropped() == 0);
  }
}
