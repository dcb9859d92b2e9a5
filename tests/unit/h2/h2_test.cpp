#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "h2_peer.hpp"

using namespace h2_test;

namespace {

iovec iov(const std::string& s) { return {const_cast<char*>(s.data()), s.size()}; }

// An owner that answers every request at once with a small JSON body.
void answer_json(recording_owner& o, std::string body) {
  o.answer = [&o, body = std::move(body)](const h2::request& r) {
    const h2::field f[] = {{"content-type", "application/json"}};
    REQUIRE(o.session->submit_response(r.stream_id, 200, f, false));
    const iovec v = iov(body);
    REQUIRE(o.session->send_body(r.stream_id, {&v, 1}, true));
  };
}

}  // namespace

TEST_SUITE("h2") {

TEST_CASE("a GET is reported with its pseudo-headers and as an HTTP/1-like head, and answered") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  const std::string body = R"({"ok":true})";
  answer_json(o, body);
  client c;
  const int32_t id = c.request("GET", "/v1/models?x=1",
                               {{"authorization", "Bearer k1"}, {"x-session-id", "s-42"}, {"accept", "*/*"}});
  pump(c, s);

  REQUIRE(o.streams.count(id) == 1);
  const server_stream& st = o.streams[id];
  CHECK(st.method == "GET");
  CHECK(st.scheme == "https");
  CHECK(st.authority == "gw.example");
  CHECK(st.path == "/v1/models?x=1");
  CHECK(st.meth == sluice::http::method::get);
  CHECK(st.target == "/v1/models?x=1");
  CHECK(st.http_path == "/v1/models");
  CHECK(st.host == "gw.example");
  CHECK(st.authorization == "Bearer k1");
  CHECK(st.session_id == "s-42");
  CHECK(st.header_count == 3);
  CHECK(st.field_lines == "authorization:Bearer k1\r\nx-session-id:s-42\r\naccept:*/*\r\n");
  REQUIRE(st.fields.size() == 3);
  CHECK(st.fields[2] == std::pair<std::string, std::string>("accept", "*/*"));
  CHECK(st.end_at_head);
  CHECK(st.closed);
  CHECK(st.cause == h2::close_cause::done);

  CHECK(c.streams[id].status == 200);
  CHECK(c.streams[id].body == body);
  CHECK(c.streams[id].end_stream);
  CHECK(s.stats().streams_opened == 1);
  CHECK(s.open_streams() == 0);
  CHECK_FALSE(s.done());
}

TEST_CASE("fields no later response repeats go never indexed; the encoder's table keeps the ones that repeat") {
  CHECK(h2::unique_per_response("x-request-id"));
  CHECK(h2::unique_per_response("openai-processing-ms"));
  CHECK(h2::unique_per_response("x-ratelimit-remaining-tokens"));
  CHECK(h2::unique_per_response("x-ratelimit-reset-requests"));
  CHECK_FALSE(h2::unique_per_response("x-ratelimit-limit-tokens"));
  CHECK_FALSE(h2::unique_per_response("content-type"));
  CHECK_FALSE(h2::unique_per_response("server"));

  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  int answered = 0;
  o.answer = [&o, &answered](const h2::request& r) {
    // As the HTTP/2 codec answers: a fresh request id and time per response.
    const std::string id = "req-" + std::to_string(1000000 + answered), ms = std::to_string(answered++);
    const h2::field f[] = {{"x-request-id", id},
                           {"content-type", "text/event-stream; charset=utf-8"},
                           {"server", "uvicorn"},
                           {"openai-processing-ms", ms}};
    REQUIRE(o.session->submit_response(r.stream_id, 200, f, true));
  };
  client c;
  std::vector<int32_t> ids;
  for (int i = 0; i < 60; ++i) {
    ids.push_back(c.request("GET", "/v1/models", {}));
    pump(c, s);
  }
  REQUIRE(answered == 60);
  for (const int32_t id : ids) {
    const client_stream& cs = c.streams[id];
    CHECK(cs.status == 200);
    CHECK(cs.headers.size() == 4);
    CHECK(cs.never_indexed == std::vector<std::string>{"x-request-id", "openai-processing-ms"});
  }
  // 60 request ids indexed would fill the 4 KiB table (~70 bytes each);
  // the client's decoder holds the two fields that repeat and nothing else:
  // (12 + 32 + 32) + (6 + 7 + 32).
  CHECK(nghttp2_session_get_hd_inflate_dynamic_table_size(c.native()) == 121);
}

TEST_CASE("a POST body split over DATA frames arrives whole, and its window opens as the owner consumes it") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  client_body b;
  for (int i = 0; i < 100000; ++i) b.bytes += static_cast<char>('a' + i % 26);

  SUBCASE("the owner consumes as it goes") {
    const int32_t id = c.request("POST", "/v1/chat/completions",
                                 {{"content-type", "application/json"},
                                  {"content-length", std::to_string(b.bytes.size())},
                                  {"expect", "100-continue"}},
                                 &b);
    pump(c, s);
    server_stream& st = o.streams[id];
    CHECK_FALSE(st.end_at_head);
    CHECK(st.has_content_length);
    CHECK(st.content_length == 100000);
    CHECK(st.content_type == "application/json");
    CHECK(st.expect_continue);
    CHECK(st.body == b.bytes);
    CHECK(st.body_ended);
    CHECK(st.data_pieces.size() >= 7);  // 16 KiB frames at most
    REQUIRE(s.submit_response(id, 204, {}, true));
    pump(c, s);
    CHECK(c.streams[id].status == 204);
    CHECK(st.closed);
    CHECK(st.cause == h2::close_cause::done);
  }
  SUBCASE("nothing consumed: the stream window (64 KiB) holds the rest back") {
    o.consume_body = false;
    const int32_t id = c.request("POST", "/v1/chat/completions", {}, &b);
    pump(c, s);
    server_stream& st = o.streams[id];
    CHECK(st.body.size() == 65536);
    CHECK_FALSE(st.body_ended);
    s.consume(id, st.body.size());
    pump(c, s);
    CHECK(st.body.size() == 100000);
    CHECK(st.body_ended);
  }
}

TEST_CASE("100 concurrent streams on one connection are each answered") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  std::vector<int32_t> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(c.request("GET", "/r/" + std::to_string(i)));
  pump(c, s);
  REQUIRE(o.head_order.size() == 100);
  CHECK(s.open_streams() == 100);
  std::vector<std::string> bodies(100);
  for (int i = 0; i < 100; ++i) {
    bodies[static_cast<size_t>(i)] = "answer " + o.streams[ids[static_cast<size_t>(i)]].path;
    REQUIRE(s.submit_response(ids[static_cast<size_t>(i)], 200, {}, false));
    const iovec v = iov(bodies[static_cast<size_t>(i)]);
    REQUIRE(s.send_body(ids[static_cast<size_t>(i)], {&v, 1}, true));
  }
  pump(c, s);
  for (int i = 0; i < 100; ++i) {
    const client_stream& cs = c.streams[ids[static_cast<size_t>(i)]];
    CHECK(cs.status == 200);
    CHECK(cs.body == "answer /r/" + std::to_string(i));
  }
  CHECK(s.open_streams() == 0);
  CHECK(s.stats().streams_refused == 0);
}

TEST_CASE("an SSE body supplied over time goes out as DATA frames in order, a batch per frame") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t id = c.request("POST", "/v1/chat/completions");
  pump(c, s);
  const h2::field f[] = {{"content-type", "text/event-stream"}};
  REQUIRE(s.submit_response(id, 200, f, false));
  pump(c, s);
  CHECK(c.streams[id].status == 200);
  CHECK(c.streams[id].data_frames.empty());  // the provider waits for pieces

  const std::string e1 = "data: {\"n\":1}\n\n", e2 = "data: {\"n\":2}\n\n", e3 = "data: {\"n\":3}\n\n";
  const std::string done = "data: [DONE]\n\n";
  const iovec one = iov(e1);
  REQUIRE(s.send_body(id, {&one, 1}, false));
  pump(c, s);
  CHECK(o.streams[id].drained == 1);
  const iovec two[] = {iov(e2), iov(e3)};  // came together: one frame
  REQUIRE(s.send_body(id, two, false));
  pump(c, s);
  CHECK(o.streams[id].drained == 2);
  const iovec last = iov(done);
  REQUIRE(s.send_body(id, {&last, 1}, true));
  pump(c, s);

  const client_stream& cs = c.streams[id];
  CHECK(cs.body == e1 + e2 + e3 + done);
  REQUIRE(cs.data_frames.size() == 3);
  CHECK(cs.data_frames[0] == e1.size());
  CHECK(cs.data_frames[1] == e2.size() + e3.size());
  CHECK(cs.data_frames[2] == done.size());
  CHECK(cs.end_stream);
  CHECK(o.streams[id].closed);
  CHECK(o.streams[id].cause == h2::close_cause::done);
  CHECK_FALSE(s.send_body(id, {&last, 1}, false));  // the stream is gone
}

TEST_CASE("a client with a small window gets the body only as it opens the window; the server holds little") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c(1000, true);
  const int32_t id = c.request("GET", "/big");
  pump(c, s);
  std::string big(200000, 'x');
  for (size_t i = 0; i < big.size(); i += 97) big[i] = static_cast<char>('a' + i % 26);
  REQUIRE(s.submit_response(id, 200, {}, false));
  const iovec v = iov(big);
  REQUIRE(s.send_body(id, {&v, 1}, true));
  const size_t mem_before = s.memory_bytes();
  pump(c, s);
  CHECK(c.streams[id].body.size() == 1000);
  CHECK(s.output_size() == 0);
  // The body stays in the caller's buffer, not copied into the session.
  CHECK(s.memory_bytes() < mem_before + 20000);
  CHECK(o.streams[id].drained == 0);

  size_t rounds = 0;
  while (c.streams[id].body.size() < big.size() && rounds < 1000) {
    const size_t had = c.streams[id].body.size();
    nghttp2_session_consume(c.native(), id, 1000);
    pump(c, s);
    const size_t got = c.streams[id].body.size() - had;
    CHECK(got <= 1000);
    CHECK(s.memory_bytes() < mem_before + 20000);
    ++rounds;
  }
  CHECK(c.streams[id].body == big);
  CHECK(o.streams[id].drained == 1);
  CHECK(o.streams[id].closed);
}

TEST_CASE("chunked pieces: only the chunks' data goes out, whatever the windows cut, mixed with plain pieces") {
  // Sizes in either case, extensions, a multi-event chunk, a terminal
  // chunk ending the data; a window of 7 bytes cuts every chunk apart.
  const auto chunk = [](const std::string& data, const char* ext, bool upper) {
    char size[16];
    std::snprintf(size, sizeof size, upper ? "%zX" : "%zx", data.size());
    return std::string(size) + ext + "\r\n" + data + "\r\n";
  };
  const std::string d1 = "data: one\n\n", d2 = "data: two\n\ndata: three and more words\r\n\r\n", d3 = "data: four\n\n";
  const std::string a = chunk(d1, "", true) + chunk(d2, ";ext=1", false);  // "B", "28"
  const std::string b = chunk(d3, ";x", false) + "0\r\n\r\n";
  const std::string plain = "data: [DONE]\n\n";
  const std::string want = d1 + d2 + d3 + plain;
  CHECK(h2::chunked_payload_bytes(a.data(), a.size()) == d1.size() + d2.size());
  CHECK(h2::chunked_payload_bytes(b.data(), b.size()) == d3.size());
  for (const uint32_t window : {7u, 65535u}) {
    CAPTURE(window);
    recording_owner o;
    h2::server_session s(o, {});
    o.session = &s;
    client c(window, true);
    const int32_t id = c.request("POST", "/v1/chat/completions");
    pump(c, s);
    REQUIRE(s.submit_response(id, 200, {}, false));
    const iovec two[] = {iov(a), iov(b)};
    REQUIRE(s.send_body(id, two, false, 3));
    const iovec last = iov(plain);
    REQUIRE(s.send_body(id, {&last, 1}, true, 0));
    size_t rounds = 0;
    pump(c, s);
    while (c.streams[id].body.size() < want.size() && rounds < 200) {
      nghttp2_session_consume(c.native(), id, c.streams[id].body.size());
      pump(c, s);
      ++rounds;
    }
    CHECK(c.streams[id].body == want);
    CHECK(c.streams[id].end_stream);
    CHECK(o.streams[id].drained >= 1);
  }
  // A chunked piece with no data (a terminal chunk alone) takes no slot.
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t id = c.request("GET", "/");
  pump(c, s);
  REQUIRE(s.submit_response(id, 200, {}, false));
  const std::string end = "0\r\n\r\n";
  const iovec e = iov(end);
  REQUIRE(s.send_body(id, {&e, 1}, true, 1));
  pump(c, s);
  CHECK(c.streams[id].body.empty());
  CHECK(c.streams[id].end_stream);
}

TEST_CASE("a chunked piece that is not whole chunks is refused, whatever its sizes say") {
  // What a relay that lost the chunk alignment would hand on: the middle of
  // a chunk's data, shaped as size lines that wrap a 64-bit sum. Counting
  // it once looped for ever; now send_body refuses it and queues nothing.
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t id = c.request("POST", "/v1/chat/completions");
  pump(c, s);
  REQUIRE(s.submit_response(id, 200, {}, false));
  std::string mid = "1\nX\r\nFFFFFFFFFFFFFFED\n";
  mid.append(4096, 'A');
  const iovec v = iov(mid);
  CHECK_FALSE(s.send_body(id, {&v, 1}, false, 1));
  const std::string cut = "5\r\nhello\r\n9\r\nwor";  // whole, then a chunk cut short
  const iovec w = iov(cut);
  CHECK_FALSE(s.send_body(id, {&w, 1}, false, 1));
  const std::string whole = "5\r\nhello\r\n";
  const iovec ok = iov(whole);
  CHECK(s.send_body(id, {&ok, 1}, true, 1));
  pump(c, s);
  CHECK(c.streams[id].body == "hello");
}

TEST_CASE("a client RST_STREAM mid-response is reported as a cancel") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t id = c.request("POST", "/v1/chat/completions");
  pump(c, s);
  REQUIRE(s.submit_response(id, 200, {}, false));
  const std::string e1 = "data: {}\n\n";
  const iovec v = iov(e1);
  REQUIRE(s.send_body(id, {&v, 1}, false));
  pump(c, s);
  REQUIRE(nghttp2_submit_rst_stream(c.native(), NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL) == 0);
  pump(c, s);
  const server_stream& st = o.streams[id];
  CHECK(st.closed);
  CHECK(st.cause == h2::close_cause::client_reset);
  CHECK(st.code == h2::cancel);
  CHECK(s.stats().client_resets == 1);
  CHECK_FALSE(s.send_body(id, {&v, 1}, true));
  CHECK_FALSE(s.goaway_sent());
}

TEST_CASE("rapid reset: HEADERS + RST_STREAM pairs past the window's budget end in GOAWAY ENHANCE_YOUR_CALM") {
  recording_owner o;
  h2::options opt;
  opt.resets_per_window_max = 50;
  opt.reset_window_ms = 1000;
  h2::server_session s(o, opt);
  o.session = &s;
  client c;

  SUBCASE("all at once") {
    std::string wire;
    for (int i = 0; i < 80; ++i) {
      const int32_t id = c.request("GET", "/");
      wire += c.take_output();  // HEADERS first: nghttp2 drops a HEADERS still queued when reset
      REQUIRE(nghttp2_submit_rst_stream(c.native(), NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL) == 0);
      wire += c.take_output();
    }
    CHECK_FALSE(s.feed(wire, 5000));
    const auto frames = server_frames(s);
    CHECK(goaway_code(frames) == h2::enhance_your_calm);
    CHECK(s.stats().client_resets == 51);
    CHECK(s.stats().rapid_reset_goaways == 1);
    CHECK(s.goaway_code() == h2::enhance_your_calm);
    REQUIRE_FALSE(o.goaways.empty());
    CHECK(o.goaways.back() == std::pair<uint32_t, bool>(h2::enhance_your_calm, false));
    CHECK(s.done());
    CHECK(s.open_streams() == 0);
  }
  SUBCASE("spread over windows: no GOAWAY") {
    uint64_t now = 0;
    for (int i = 0; i < 200; ++i) {
      const int32_t id = c.request("GET", "/");
      pump(c, s, now);
      REQUIRE(nghttp2_submit_rst_stream(c.native(), NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL) == 0);
      pump(c, s, now);
      if (i % 40 == 39) now += 1000;
    }
    CHECK(s.stats().client_resets == 200);
    CHECK_FALSE(s.goaway_sent());
    CHECK_FALSE(c.goaway);
  }
  SUBCASE("server-provoked resets (MadeYouReset) count too") {
    // A second authorization field: the session resets each stream
    // PROTOCOL_ERROR (malformed), the client never resets.
    for (int i = 0; i < 60; ++i) c.request("GET", "/", {{"authorization", "a"}, {"authorization", "b"}});
    pump(c, s);
    CHECK(o.head_order.empty());  // never reported
    CHECK(s.stats().malformed_requests == 51);
    CHECK(s.stats().provoked_resets == 51);
    CHECK(s.stats().client_resets == 0);
    CHECK(c.goaway);
    CHECK(c.goaway_code == h2::enhance_your_calm);
  }
}

TEST_CASE("a malformed request is reset PROTOCOL_ERROR and never reported") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t dup = c.request("POST", "/", {{"content-type", "a"}, {"content-type", "b"}});
  const int32_t host = c.request("GET", "/", {{"host", "other.example"}});
  const int32_t fine = c.request("GET", "/", {{"host", "gw.example"}});
  answer_json(o, "{}");
  pump(c, s);
  CHECK(c.streams[dup].close_code == NGHTTP2_PROTOCOL_ERROR);
  CHECK(c.streams[host].close_code == NGHTTP2_PROTOCOL_ERROR);
  CHECK(c.streams[fine].status == 200);
  CHECK(o.head_order == std::vector<int32_t>{fine});
  CHECK(s.stats().malformed_requests == 2);
}

TEST_CASE("a header list over the limit is answered 431; far over it ends the connection") {
  recording_owner o;
  h2::options opt;
  opt.header_list_bytes_max = 1024;
  h2::server_session s(o, opt);
  o.session = &s;
  client c;
  answer_json(o, "{}");

  SUBCASE("over the limit: 431, the connection goes on") {
    const int32_t big = c.request("GET", "/", {{"x-big", std::string(2000, 'v')}});
    pump(c, s);
    CHECK(c.streams[big].status == 431);
    CHECK(c.streams[big].end_stream);
    CHECK(s.stats().header_lists_too_large == 1);
    CHECK(o.streams.count(big) == 0);
    const int32_t next = c.request("GET", "/");
    pump(c, s);
    CHECK(c.streams[next].status == 200);
    CHECK_FALSE(c.goaway);
  }
  SUBCASE("with a body still coming: 431 then RST_STREAM NO_ERROR") {
    client_body b{std::string(10, 'x')};
    const int32_t big = c.request("POST", "/", {{"x-big", std::string(2000, 'v')}}, &b);
    pump(c, s);
    CHECK(c.streams[big].status == 431);
    CHECK(c.streams[big].closed);
    CHECK(s.stats().header_lists_too_large == 1);
    CHECK(s.stats().provoked_resets == 0);
  }
  SUBCASE("past 4x the limit (an HPACK bomb): GOAWAY ENHANCE_YOUR_CALM") {
    c.request("GET", "/", {{"x-big", std::string(5000, 'v')}});
    pump(c, s);
    CHECK(c.goaway);
    CHECK(c.goaway_code == h2::enhance_your_calm);
    CHECK(s.stats().hpack_bombs == 1);
    CHECK(s.done());
  }
}

TEST_CASE("a SETTINGS flood and a PING flood whose ACKs go unread end in GOAWAY ENHANCE_YOUR_CALM") {
  recording_owner o;
  h2::options opt;
  opt.control_frames_per_window_max = 100000;  // the ACK limit alone
  h2::server_session s(o, opt);
  o.session = &s;
  std::string wire = raw_start();
  SUBCASE("SETTINGS") {
    for (int i = 0; i < 1100; ++i) wire += frame(NGHTTP2_SETTINGS, 0, 0, {});
  }
  SUBCASE("PING") {
    for (int i = 0; i < 1100; ++i) wire += frame(NGHTTP2_PING, 0, 0, std::string(8, static_cast<char>(i)));
  }
  CHECK_FALSE(s.feed(wire, 0));
  const auto frames = server_frames(s);
  CHECK(goaway_code(frames) == h2::enhance_your_calm);
  CHECK(s.stats().ack_floods == 1);
  // Only our GOAWAY follows the server's own SETTINGS: the piled-up ACKs are dropped.
  CHECK(frames.size() <= 3);
  CHECK(s.done());
}

TEST_CASE("PINGs and SETTINGS over the rate end in GOAWAY ENHANCE_YOUR_CALM even when their ACKs are read") {
  recording_owner o;
  h2::options opt;
  opt.control_frames_per_window_max = 50;
  opt.control_window_ms = 1000;
  h2::server_session s(o, opt);
  o.session = &s;
  REQUIRE(s.feed(raw_start(), 0));
  server_frames(s);
  uint64_t now = 0;
  bool ok = true;
  SUBCASE("spread over windows: fine") {
    for (int i = 0; i < 200 && ok; ++i) {
      ok = s.feed(frame(i % 2 ? NGHTTP2_PING : NGHTTP2_SETTINGS, 0, 0, i % 2 ? std::string(8, 'p') : ""), now);
      server_frames(s);
      if (i % 40 == 39) now += 1000;
    }
    CHECK(ok);
    CHECK(s.stats().control_floods == 0);
  }
  SUBCASE("within one window: GOAWAY") {
    std::vector<raw_frame> frames;
    for (int i = 0; i < 200 && ok; ++i) {
      ok = s.feed(frame(NGHTTP2_PING, 0, 0, std::string(8, 'p')), now);
      frames = server_frames(s);
    }
    CHECK_FALSE(ok);
    CHECK(goaway_code(frames) == h2::enhance_your_calm);
    CHECK(s.stats().control_floods == 1);
    CHECK(s.stats().ack_floods == 0);
  }
}

TEST_CASE("a SETTINGS frame with more entries than allowed ends the connection") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  std::string entries;
  for (int i = 0; i < 40; ++i) entries += std::string("\x00\x03\x00\x00\x00\x64", 6);  // MAX_CONCURRENT_STREAMS 100
  CHECK_FALSE(s.feed(raw_start() + frame(NGHTTP2_SETTINGS, 0, 0, entries), 0));
  const auto frames = server_frames(s);
  CHECK(goaway_code(frames) == h2::enhance_your_calm);
  CHECK(s.stats().connection_errors == 1);
}

TEST_CASE("a CONTINUATION flood ends in GOAWAY ENHANCE_YOUR_CALM") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  std::string wire = raw_start() + frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM, 1, get_block());
  for (int i = 0; i < 20; ++i) wire += frame(NGHTTP2_CONTINUATION, 0, 1, {});
  CHECK_FALSE(s.feed(wire, 0));
  CHECK(goaway_code(server_frames(s)) == h2::enhance_your_calm);
  CHECK(s.stats().continuation_floods == 1);
  CHECK(o.head_order.empty());
}

TEST_CASE("a stream id going backwards or reused is a connection PROTOCOL_ERROR") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  const uint8_t flags = NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS;
  std::string wire = raw_start();
  SUBCASE("backwards") {
    wire += frame(NGHTTP2_HEADERS, flags, 5, get_block()) + frame(NGHTTP2_HEADERS, flags, 3, get_block());
  }
  SUBCASE("reused") {
    wire += frame(NGHTTP2_HEADERS, flags, 1, get_block()) + frame(NGHTTP2_HEADERS, flags, 1, get_block());
  }
  CHECK_FALSE(s.feed(wire, 0));
  const auto frames = server_frames(s);
  CHECK(goaway_code(frames) != -1);
  CHECK((goaway_code(frames) == h2::protocol_error || goaway_code(frames) == h2::stream_closed));
  CHECK(s.stats().connection_errors == 1);
  CHECK(o.head_order.size() == 1);
  // The stream that was open ends with the connection.
  CHECK(o.streams[o.head_order[0]].cause == h2::close_cause::connection_closed);
  CHECK(s.done());
}

TEST_CASE("a stream id going backwards is GOAWAY PROTOCOL_ERROR") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  const uint8_t flags = NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS;
  s.feed(raw_start() + frame(NGHTTP2_HEADERS, flags, 5, get_block()) + frame(NGHTTP2_HEADERS, flags, 3, get_block()),
         0);
  CHECK(goaway_code(server_frames(s)) == h2::protocol_error);
}

TEST_CASE("DATA on a stream the client already ended is GOAWAY STREAM_CLOSED") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  const uint8_t flags = NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS;
  SUBCASE("half-closed (remote): the server has not answered yet") {
    CHECK_FALSE(s.feed(raw_start() + frame(NGHTTP2_HEADERS, flags, 1, post_block()) + frame(NGHTTP2_DATA, 0, 1, "xyz"), 0));
  }
  SUBCASE("closed: answered and done") {
    answer_json(o, "{}");
    s.feed(raw_start() + frame(NGHTTP2_HEADERS, flags, 1, post_block()), 0);
    server_frames(s);
    REQUIRE(o.streams[1].closed);
    CHECK_FALSE(s.feed(frame(NGHTTP2_DATA, 0, 1, "xyz"), 0));
  }
  const auto frames = server_frames(s);
  CHECK(goaway_code(frames) == h2::stream_closed);
  CHECK(s.stats().connection_errors == 1);
}

TEST_CASE("the memory cap bounds a connection, which ends in GOAWAY ENHANCE_YOUR_CALM") {
  recording_owner o;
  h2::options opt;
  opt.memory_bytes_max = 256u << 10;
  h2::server_session s(o, opt);
  o.session = &s;
  client c;
  // Requests with 8 KB of headers that nobody answers: each stream keeps its copy.
  for (int i = 0; i < 60; ++i) c.request("GET", "/", {{"x-pad", std::string(8000, static_cast<char>('a' + i % 26))}});
  pump(c, s);
  CHECK(c.goaway);
  CHECK(c.goaway_code == h2::enhance_your_calm);
  CHECK(s.stats().memory_refusals >= 1);
  CHECK(s.memory_bytes_peak() <= opt.memory_bytes_max);
  CHECK(o.head_order.size() < 60);
  for (int32_t id : o.head_order) CHECK(o.streams[id].cause == h2::close_cause::connection_closed);
  CHECK(s.done());
}

TEST_CASE("drain: GOAWAY NO_ERROR, the stream in flight finishes, then done") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t id = c.request("GET", "/");
  pump(c, s);
  s.drain();
  pump(c, s);
  CHECK(c.goaway);
  CHECK(c.goaway_code == 0);
  CHECK_FALSE(s.done());
  REQUIRE(s.submit_response(id, 200, {}, true));
  pump(c, s);
  CHECK(c.streams[id].status == 200);
  CHECK(s.done());
}

TEST_CASE("a reset by the owner reaches the client and closes the stream as server_reset") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  client c;
  const int32_t id = c.request("GET", "/");
  pump(c, s);
  REQUIRE(s.submit_response(id, 200, {}, false));
  REQUIRE(s.reset_stream(id, h2::internal_error));
  pump(c, s);
  CHECK(c.streams[id].close_code == NGHTTP2_INTERNAL_ERROR);
  CHECK(o.streams[id].cause == h2::close_cause::server_reset);
  CHECK(s.stats().provoked_resets == 0);
}

TEST_CASE("a small output ring wraps and carries frames whole; sent bytes never move before they are consumed") {
  recording_owner o;
  h2::options opt;
  opt.output_buffer_bytes = 100;
  h2::server_session s(o, opt);
  o.session = &s;
  client c;
  const int32_t id = c.request("GET", "/");
  pump(c, s, 0, 37);
  std::string big(50000, 'y');
  for (size_t i = 0; i < big.size(); i += 13) big[i] = static_cast<char>('a' + i % 26);
  REQUIRE(s.submit_response(id, 200, {}, false));
  const iovec v = iov(big);
  REQUIRE(s.send_body(id, {&v, 1}, true));
  // A send in flight: its bytes stay as they were while more is queued behind them.
  auto first = s.pending_output();
  const std::string copy(first.data(), first.size());
  CHECK(s.output_size() <= 100);
  const int32_t id2 = c.request("GET", "/2");
  s.feed(c.take_output(), 0);
  CHECK(std::string(first.data(), first.size()) == copy);
  c.receive(first);
  s.consume_output(first.size());
  pump(c, s, 0, 37);
  CHECK(c.streams[id].body == big);
  CHECK(o.streams.count(id2) == 1);
}

TEST_CASE("request views stay valid across feeds until the stream closes") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  std::vector<h2::request> kept;
  o.answer = [&kept](const h2::request& r) { kept.push_back(r); };
  client c;
  const int32_t a = c.request("POST", "/first", {{"authorization", "Bearer A"}, {"x-request-id", "r-1"}});
  pump(c, s);
  for (int i = 0; i < 10; ++i) c.request("GET", "/other/" + std::to_string(i), {{"x-pad", std::string(500, 'p')}});
  pump(c, s);
  REQUIRE(kept.size() == 11);
  CHECK(kept[0].stream_id == a);
  CHECK(kept[0].path == "/first");
  CHECK(kept[0].head.authorization == "Bearer A");
  CHECK(kept[0].head.request_id == "r-1");
  CHECK(kept[0].head.field_lines == "authorization:Bearer A\r\nx-request-id:r-1\r\n");
  CHECK(kept[10].path == "/other/9");
}

TEST_CASE("streams past SETTINGS_MAX_CONCURRENT_STREAMS are refused and counted") {
  recording_owner o;
  h2::options opt;
  opt.max_concurrent_streams = 2;
  h2::server_session s(o, opt);
  o.session = &s;
  // Our SETTINGS is not acknowledged yet: nghttp2 answers REFUSED_STREAM.
  std::string wire = std::string(h2::k_client_preface) + frame(NGHTTP2_SETTINGS, 0, 0, {});
  for (uint32_t id = 1; id <= 7; id += 2) wire += frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, id, get_block());
  s.feed(wire, 0);
  const auto frames = server_frames(s);
  CHECK(o.head_order.size() == 2);
  CHECK(rst_code(frames, 5) == h2::refused_stream);
  CHECK(rst_code(frames, 7) == h2::refused_stream);
  CHECK(s.stats().streams_refused == 2);
  CHECK(s.stats().provoked_resets == 0);
  CHECK(goaway_code(frames) == -1);
}

TEST_CASE("trailers end the request body; DATA after the owner's reset is not delivered") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  const std::string trailer("\x00\x03x-t\x01" "1", 7);  // literal, new name
  SUBCASE("trailers") {
    CHECK(s.feed(raw_start() + frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, 1, post_block()) +
                     frame(NGHTTP2_DATA, 0, 1, "abc") +
                     frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, 1, trailer),
                 0));
    CHECK(o.streams[1].body == "abc");
    CHECK(o.streams[1].body_ended);
  }
  SUBCASE("after reset_stream") {
    o.answer = [&o](const h2::request& r) { REQUIRE(o.session->reset_stream(r.stream_id, h2::cancel)); };
    CHECK(s.feed(raw_start() + frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, 1, post_block()) +
                     frame(NGHTTP2_DATA, 0, 1, "zzz"),
                 0));
    CHECK(o.streams[1].body.empty());
    server_frames(s);
    CHECK(o.streams[1].closed);
    CHECK(o.streams[1].cause == h2::close_cause::server_reset);
  }
}

TEST_CASE("bytes that are no HTTP/2 preface end the session") {
  recording_owner o;
  h2::server_session s(o, {});
  o.session = &s;
  CHECK_FALSE(s.feed("GET / HTTP/1.1\r\nHost: a\r\n\r\n", 0));
  CHECK(s.failed());
  server_frames(s);
  CHECK(s.done());
}

TEST_CASE("the h2c prior-knowledge preface is told apart from HTTP/1.1") {
  using h2::sniff;
  const std::string p(h2::k_client_preface);
  CHECK(h2::looks_like_h2_preface(p) == sniff::yes);
  CHECK(h2::looks_like_h2_preface(p + "\x00\x00\x00\x04") == sniff::yes);
  CHECK(h2::looks_like_h2_preface(p.substr(0, 10)) == sniff::need_more);
  CHECK(h2::looks_like_h2_preface({}) == sniff::need_more);
  CHECK(h2::looks_like_h2_preface(std::string_view("PRI * HTTP/1.1\r\n")) == sniff::no);
  CHECK(h2::looks_like_h2_preface(std::string_view("POST /v1/chat")) == sniff::no);
  CHECK(h2::looks_like_h2_preface(std::string_view("\x16\x03\x01")) == sniff::no);
}

}  // TEST_SUITE
