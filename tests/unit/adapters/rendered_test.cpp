// openai_http's rendered relay: an OpenAI backend's chat stream rendered
// for a Responses or Messages client. vLLM's plain token event, alone in
// its chunk, is rendered from the chunk without the SSE scan; any other
// chunk is scanned. Both ways must give the client what the renderer gives
// when fed the stream's events one by one (the reference below, the events
// read by this suite's own SSE reader), wherever the backend's writes split.
#include "adapter_fixture.hpp"

#include "sluice/dialect/render.hpp"
#include "sluice/http/sse.hpp"

using namespace sluice::adapters_test;
using sluice::dialect::client_dialect;
using sluice::dialect::render_status;
using sluice::dialect::stream_renderer;

namespace {

constexpr std::string_view k_group = k_chat_group;

constexpr std::string_view k_stream = k_chat_stream;


std::string event(std::string_view delta, std::string_view finish = "null", std::string_view eol = "\n") {
  return "data: " R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"chat-1","choices":[{"index":0,"delta":)" +
         std::string(delta) + R"(,"logprobs":null,"finish_reason":)" + std::string(finish) + "}]}" + std::string(eol) +
         std::string(eol);
}
std::string token(std::string_view escaped_text) { return event(R"({"content":")" + std::string(escaped_text) + "\"}"); }

// The chunks of vLLM's stream, and shapes beside it: text to check byte by
// byte (escapes, UTF-8, past 16 bytes), an empty text, two events in one
// chunk, CRLF line ends, an event whose two data lines make one.
std::vector<std::string> chunks() {
  return {
      event(R"({"role":"assistant","content":""})"),
      token("Hel"),
      token("lo"),
      token(R"( \"q\" \\ \n)"),
      token("\xc3\xa9\xe2\x82\xac"),
      token("a text of forty bytes, past a 16 piece."),
      token(R"(\u00e9)"),
      token(""),
      token("one") + token(" two"),
      event(R"({"content":" crlf"})", "null", "\r\n"),
      "data: " R"({"id":"c1","object":"chat.completion.chunk",)" "\ndata: "
      R"("created":1,"model":"chat-1","choices":[{"index":0,"delta":{"content":" joined"},"logprobs":null,"finish_reason":null}]})"
      "\n\n",
      token(" end"),
      event(R"({"content":""})", R"("stop")"),
      "data: " R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"chat-1","choices":[],)"
      R"("usage":{"prompt_tokens":7,"total_tokens":19,"completion_tokens":12}})"
      "\n\n",
      "data: [DONE]\n\n",
  };
}

// What the renderer writes for the stream's events fed one by one.
std::string reference(client_dialect d, std::string_view request_id, const std::vector<std::string>& data,
                      uint32_t& deltas) {
  stream_renderer r(sluice::http::sse_scanner::k_event_bytes_max);
  r.reset(d, {request_id, 1700000000, "chat-1"});
  std::string out, buf(1 << 20, '\0');
  size_t n = 0;
  REQUIRE(r.start(buf.data(), buf.size(), n) == render_status::ok);
  out.append(buf.data(), n);
  for (const std::string& e : data) {
    REQUIRE(r.feed(e, buf.data(), buf.size(), n) == render_status::ok);
    out.append(buf.data(), n);
  }
  REQUIRE(r.done());
  deltas = r.outcome().deltas;
  return out;
}

}  // namespace

TEST_SUITE("adapters::openai_http rendered") {
  TEST_CASE("vLLM's stream rendered for a Responses or a Messages client: the same events wherever the writes split") {
    shard_fixture f(k_group);
    const std::vector<std::string> cs = chunks();
    const std::string reply = k_sse_head + chunked(cs);
    std::string all;
    for (const std::string& c : cs) all += c;
    const std::vector<std::string> data = sse_data(all);
    REQUIRE(data.size() == cs.size() + 1);  // the chunk of two events
    for (client_dialect d : {client_dialect::responses, client_dialect::messages}) {
      CAPTURE(static_cast<int>(d));
      const std::string path = d == client_dialect::responses ? "/v1/responses" : "/v1/messages";
      for (size_t split = k_sse_head.size() - 2; split < reply.size(); ++split) {
        CAPTURE(split);
        call& c = f.start(k_stream, {.path = path, .speaks = d});
        f.serve(c, {reply.substr(0, split), reply.substr(split)});
        REQUIRE(f.pump([&] { return c.codec.ended(); }));
        REQUIRE(c.codec.done);
        uint32_t deltas = 0;
        const std::string expected = reference(d, c.request_id, data, deltas);
        std::string payload;
        REQUIRE(dechunk(c.codec.sent, payload));
        CHECK(payload == expected);
        CHECK(c.x.rsp.facts.done);
        CHECK(c.x.rsp.facts.events == data.size());
        CHECK(c.x.rsp.facts.content_events == deltas);
        CHECK(c.x.rsp.facts.prompt_tokens == 7);
        CHECK(c.x.rsp.facts.completion_tokens == 12);
        if (split < k_sse_head.size()) {
          // Whole chunks: each plain token event alone in its chunk is
          // rendered from it; the scan reads the rest -- the role event,
          // the empty text, the two-event chunk, the CRLF one, the joined
          // lines, the finish, the usage, [DONE].
          REQUIRE(c.mem.sse);
          CHECK(c.mem.sse->events() == 10);
        }
      }
      CHECK(f.backend().conns.size() == 1);  // every reply kept alive
    }
  }

  TEST_CASE("an event begun in one chunk is ended by the next one, plain as it looks: it is read as the scan reads it") {
    // "data: [" then, in the next chunk, a plain token event: one event of
    // two data lines, not JSON -- the stream ends with the dialect's
    // failure events, nothing of " x" rendered.
    shard_fixture f(k_group);
    const std::vector<std::string> cs = {event(R"({"role":"assistant","content":""})"), token("Hel"), token("lo"),
                                         "data: [\n", token(" x"), token(" after")};
    const std::string reply = k_sse_head + chunked(cs);
    for (client_dialect d : {client_dialect::responses, client_dialect::messages}) {
      CAPTURE(static_cast<int>(d));
      call& c = f.start(k_stream, {.path = d == client_dialect::responses ? "/v1/responses" : "/v1/messages", .speaks = d});
      f.serve(c, {reply});
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      std::string payload;
      dechunk(c.codec.sent, payload);
      CHECK(payload.find(" x") == std::string::npos);
      CHECK(payload.find("Hello") == std::string::npos);  // each token its own delta
      CHECK(payload.find(d == client_dialect::responses ? "event: response.failed" : "event: error") != std::string::npos);
      CHECK(c.x.rsp.facts.content_events == 2);
    }
  }
}
