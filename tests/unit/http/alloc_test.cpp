// The parsers run per request and per SSE event on a shard: they must not
// call the allocator. This test binary counts every operator new and checks
// the count does not move while a full exchange is parsed.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>
#include <string>

#include "../alloc_counter.hpp"
#include "sluice/http/request.hpp"
#include "sluice/http/response.hpp"
#include "sluice/http/sse.hpp"

TEST_SUITE("http::allocation") {
  TEST_CASE("parsing a request, a chunked body, a streamed response and its events allocates nothing") {
    std::string req =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const std::string resp =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        "f\r\ndata: {\"a\":1}\n\n\r\n0\r\n\r\n";
    auto* parser = new sluice::http::request_parser(sluice::http::limits{});
    auto* head = new sluice::http::request_head;
    auto* rparser = new sluice::http::response_parser;
    auto* rhead = new sluice::http::response_head;
    size_t events = 0;
    auto* scanner = new sluice::http::sse_scanner(
        [](void* ctx, const sluice::http::sse_event&) { ++*static_cast<size_t*>(ctx); }, &events);
    const sluice::http::body_sink sink{
        [](void* ctx, const char* d, size_t n) { static_cast<sluice::http::sse_scanner*>(ctx)->feed(d, n); },
        scanner};

    // No doctest macro inside the window: they may allocate themselves.
    const size_t before = sluice::test::allocations();
    const bool head_ok = parser->parse_head(req.data(), req.size(), *head).ok();
    size_t used = 0, produced = 0;
    char* body = req.data() + head->head_bytes;
    const bool body_ok = parser->decode_chunked(body, req.size() - head->head_bytes, body, used, produced).ok();
    const bool rhead_ok = rparser->parse_head(resp.data(), resp.size(), *rhead).ok();
    const auto st = rparser->feed_body(resp.data() + rhead->head_bytes, resp.size() - rhead->head_bytes, sink);
    const size_t after = sluice::test::allocations();

    CHECK(before > 0);  // the counting operator new is the one in use
    CHECK(after == before);
    CHECK(head_ok);
    CHECK(body_ok);
    CHECK(produced == 5);
    CHECK(rhead_ok);
    CHECK(st.complete);
    CHECK(events == 1);
    delete scanner;
    delete rhead;
    delete rparser;
    delete head;
    delete parser;
  }
}
