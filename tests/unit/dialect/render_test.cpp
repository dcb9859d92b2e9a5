#include <doctest/doctest.h>

#include <simdjson.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../alloc_counter.hpp"
#include "sluice/dialect/render.hpp"

using namespace sluice::dialect;

namespace {

// vLLM's chunks for "Hello world", then a tool call, finish, usage, [DONE].
const std::vector<std::string> k_text_stream = {
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" \"world\""},"logprobs":null,"finish_reason":null}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":""}}]},"finish_reason":null}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\":"}}]},"finish_reason":null}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},"finish_reason":null}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]})",
    R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":10,"total_tokens":15,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}})",
    "[DONE]",
};

struct sse {
  std::string event;
  std::string data;
};

// The output split at its event boundaries, each data parsed as JSON.
std::vector<sse> events_of(const std::string& out) {
  std::vector<sse> v;
  size_t at = 0;
  while (at < out.size()) {
    const size_t end = out.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    const std::string ev = out.substr(at, end - at);
    REQUIRE(ev.rfind("event: ", 0) == 0);
    const size_t nl = ev.find('\n');
    REQUIRE(ev.compare(nl + 1, 6, "data: ") == 0);
    v.push_back({ev.substr(7, nl - 7), ev.substr(nl + 7)});
    at = end + 2;
  }
  return v;
}

// The events once decoded: each data parsed and written again (minified).
std::string decoded(const std::string& out) {
  simdjson::dom::parser p;
  std::string all;
  for (const auto& e : events_of(out)) {
    simdjson::dom::element root;
    REQUIRE(p.parse(e.data).get(root) == simdjson::SUCCESS);
    all += e.event + " " + simdjson::minify(root) + "\n";
  }
  return all;
}

std::string render(client_dialect d, const std::vector<std::string>& chunks, reply_outcome* o = nullptr) {
  stream_renderer r(16 * 1024);
  reply_context ctx{"rid", 1700000000, "client-model"};
  r.reset(d, ctx);
  std::string all;
  for (const auto& c : chunks) {
    std::string buf(r.bound(c.size()), '\0');
    size_t n = 0;
    REQUIRE(r.feed(c, buf.data(), buf.size(), n) == render_status::ok);
    all.append(buf.data(), n);
  }
  std::string buf(r.bound(0), '\0');
  size_t n = 0;
  REQUIRE(r.finish(false, buf.data(), buf.size(), n) == render_status::ok);
  CHECK(n == 0);  // [DONE] ended it already
  CHECK(r.done());
  if (o != nullptr) *o = r.outcome();
  return all;
}

}  // namespace

TEST_CASE("a chat stream rendered as Messages events") {
  reply_outcome o;
  const auto ev = events_of(render(client_dialect::messages, k_text_stream, &o));
  std::vector<std::string> types;
  simdjson::dom::parser p;
  for (const auto& e : ev) {
    simdjson::dom::element root;
    REQUIRE(p.parse(e.data).get(root) == simdjson::SUCCESS);
    CHECK(std::string(root["type"].get_string().value()) == e.event);
    types.push_back(e.event);
  }
  CHECK(types == std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_stop", "content_block_start",
                                          "content_block_delta", "content_block_delta", "content_block_stop",
                                          "message_delta", "message_stop"});
  CHECK(ev[2].data == R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}})");
  CHECK(ev[3].data == R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" \"world\""}})");
  CHECK(ev[5].data == R"({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_1","name":"get","input":{}}})");
  CHECK(ev[6].data == R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"q\":"}})");
  CHECK(ev[9].data == R"({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},)"
                      R"("usage":{"input_tokens":6,"cache_read_input_tokens":4,"output_tokens":5}})");
  CHECK(o.prompt_tokens == 10);
  CHECK(o.completion_tokens == 5);
  CHECK(o.cached_tokens == 4);
  CHECK(o.finish_reason == "tool_calls");
}

TEST_CASE("a chat stream rendered as Responses events: sequence numbers, items, the final response") {
  const auto ev = events_of(render(client_dialect::responses, k_text_stream));
  std::vector<std::string> types;
  simdjson::dom::parser p;
  int64_t seq = 0;
  for (const auto& e : ev) {
    simdjson::dom::element root;
    REQUIRE(p.parse(e.data).get(root) == simdjson::SUCCESS);
    CHECK(std::string(root["type"].get_string().value()) == e.event);
    CHECK(root["sequence_number"].get_int64().value() == seq++);
    types.push_back(e.event);
  }
  CHECK(types == std::vector<std::string>{
                     "response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"});
  simdjson::dom::element done;
  REQUIRE(p.parse(ev[6].data).get(done) == simdjson::SUCCESS);
  CHECK(std::string(done["text"].get_string().value()) == "Hello \"world\"");
  simdjson::dom::element completed;
  REQUIRE(p.parse(ev.back().data).get(completed) == simdjson::SUCCESS);
  simdjson::dom::element resp = completed["response"];
  CHECK(std::string(resp["status"].get_string().value()) == "completed");
  CHECK(std::string(resp["id"].get_string().value()) == "resp_rid");
  CHECK(std::string(resp["model"].get_string().value()) == "client-model");
  simdjson::dom::array out = resp["output"].get_array();
  REQUIRE(out.size() == 2);
  CHECK(std::string(out.at(0)["content"].at(0)["text"].get_string().value()) == "Hello \"world\"");
  CHECK(std::string(out.at(1)["type"].get_string().value()) == "function_call");
  CHECK(std::string(out.at(1)["call_id"].get_string().value()) == "call_1");
  CHECK(std::string(out.at(1)["arguments"].get_string().value()) == "{\"q\":1}");
  CHECK(resp["usage"]["input_tokens"].get_int64().value() == 10);
  CHECK(resp["usage"]["output_tokens"].get_int64().value() == 5);
  CHECK(resp["usage"]["total_tokens"].get_int64().value() == 15);
  CHECK(resp["usage"]["input_tokens_details"]["cached_tokens"].get_int64().value() == 4);
}

TEST_CASE("max tokens: response.incomplete and stop_reason max_tokens; a stop string: stop_sequence") {
  const std::vector<std::string> cut = {
      R"({"choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":"length"}]})",
      R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}})", "[DONE]"};
  auto r = events_of(render(client_dialect::responses, cut));
  CHECK(r.back().event == "response.incomplete");
  CHECK(r.back().data.find(R"("incomplete_details":{"reason":"max_output_tokens"})") != std::string::npos);
  auto m = events_of(render(client_dialect::messages, cut));
  CHECK(m[m.size() - 2].data.find(R"("stop_reason":"max_tokens")") != std::string::npos);
  const std::vector<std::string> stopped = {
      R"({"choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":"stop","stop_reason":"END"}]})", "[DONE]"};
  m = events_of(render(client_dialect::messages, stopped));
  CHECK(m[m.size() - 2].data.find(R"("stop_reason":"stop_sequence","stop_sequence":"END")") != std::string::npos);
}

TEST_CASE("a failure: an error event mid-stream, a stream cut short, a malformed event") {
  const std::vector<std::string> failing = {R"({"choices":[{"index":0,"delta":{"content":"ab"}}]})",
                                            R"({"error":{"message":"boom","type":"server_error","code":500}})"};
  auto m = events_of(render(client_dialect::messages, failing));
  CHECK(m.back().event == "error");
  CHECK(m.back().data == R"({"type":"error","error":{"type":"api_error","message":"boom"}})");
  auto r = events_of(render(client_dialect::responses, failing));
  CHECK(r.back().event == "response.failed");
  CHECK(r.back().data.find(R"("error":{"code":"server_error","message":"boom"})") != std::string::npos);

  stream_renderer s(16 * 1024);
  s.reset(client_dialect::responses, {"rid", 1, "m"});
  std::string buf(s.bound(64), '\0');
  size_t n = 0;
  CHECK(s.feed(R"({"choices":[{"index":0,"delta":{"content":"ab"}}]})", buf.data(), buf.size(), n) ==
        render_status::ok);
  CHECK(s.feed("not json", buf.data(), buf.size(), n) == render_status::malformed);
  CHECK(s.finish(true, buf.data(), buf.size(), n) == render_status::ok);
  CHECK(std::string(buf.data(), n).find("event: response.failed") == 0);
  CHECK(s.outcome().error);
  // Too small a buffer is said, not overrun, and nothing is taken from the
  // event: it is fed again with the room bound() names.
  s.reset(client_dialect::messages, {"rid", 1, "m"});
  const std::string ab = R"({"choices":[{"index":0,"delta":{"content":"ab"}}]})";
  CHECK(s.feed(ab, buf.data(), 16, n) == render_status::more_room);
  CHECK(n == 0);
  CHECK(s.feed(ab, buf.data(), buf.size(), n) == render_status::ok);
  CHECK(std::string(buf.data(), n).find("event: message_start") == 0);
  CHECK(s.finish(false, buf.data(), buf.size(), n) == render_status::ok);
  CHECK(s.outcome().deltas == 1);
}

TEST_CASE("an event past the renderer's own bound (a whole tool call in one delta) is rendered whole; past 4 MiB and the slack, malformed") {
  const std::string args = std::string(R"({\"code\":\")") + std::string(200000, 'z') + R"(\"})";
  std::vector<std::string> chunks = k_text_stream;
  chunks[4] = R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":")" +
              args + R"("}}]},"finish_reason":null}]})";
  chunks.erase(chunks.begin() + 5);
  const auto ev = events_of(render(client_dialect::messages, chunks));
  simdjson::dom::parser p;
  simdjson::dom::element root;
  REQUIRE(p.parse(ev[6].data).get(root) == simdjson::SUCCESS);
  CHECK(std::string(root["delta"]["partial_json"].get_string().value()) == "{\"code\":\"" + std::string(200000, 'z') + "\"}");
  stream_renderer r(16 * 1024);
  r.reset(client_dialect::responses, {"rid", 1, "m"});
  const std::string huge =
      R"({"choices":[{"index":0,"delta":{"content":")" +
      std::string(stream_renderer::k_large_event_bytes_max + stream_renderer::k_translation_slack_bytes, 'h') +
      R"("}}]})";
  std::string buf(r.bound(huge.size()), '\0');
  size_t n = 0;
  CHECK(r.feed(huge, buf.data(), buf.size(), n) == render_status::malformed);
  // A translated chunk: a backend's event of just under 4 MiB (the most
  // sluice reads whole) wrapped in a chat chunk's fields is past 4 MiB,
  // and still renders whole.
  stream_renderer t(16 * 1024);
  t.reset(client_dialect::responses, {"rid", 1, "m"});
  const std::string wrapped =
      R"({"id":"msg_01XFDUDYJgAACzvnptvVoYEL","object":"chat.completion.chunk","created":1,"model":"claude-sonnet-4-5","choices":[{"index":0,"delta":{"content":")" +
      std::string(stream_renderer::k_large_event_bytes_max - 100, 't') + R"("},"logprobs":null,"finish_reason":null}]})";
  REQUIRE(wrapped.size() > stream_renderer::k_large_event_bytes_max);
  std::string out(t.bound(wrapped.size()), '\0');
  CHECK(t.feed(wrapped, out.data(), out.size(), n) == render_status::ok);
  CHECK(std::string_view(out.data(), n).find(std::string(1000, 't')) != std::string_view::npos);
}

TEST_CASE("a warm renderer does not allocate per event") {
  stream_renderer r(16 * 1024);
  std::string buf(64 * 1024, '\0');
  const std::string delta = R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]})";
  for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
    for (int round = 0; round < 2; ++round) {
      r.reset(d, {"rid", 1, "m"});
      size_t n = 0;
      const size_t before = sluice::test::allocations();
      for (int i = 0; i < 200; ++i) REQUIRE(r.feed(delta, buf.data(), buf.size(), n) == render_status::ok);
      if (round == 1) CHECK(sluice::test::allocations() == before);
      for (const auto& c : k_text_stream) REQUIRE(r.feed(c, buf.data(), buf.size(), n) == render_status::ok);
    }
  }
}

TEST_CASE("a non-stream chat.completion rendered as a message and as a response") {
  const std::string body =
      R"({"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant",)"
      R"("content":"hi","tool_calls":[{"id":"call_9","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},)"
      R"("finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})";
  std::string out;
  reply_outcome o;
  REQUIRE(render_reply(client_dialect::messages, body, {"rid", 5, "cm"}, out, o));
  CHECK(out == R"({"id":"msg_rid","type":"message","role":"assistant","model":"cm","content":[{"type":"text","text":"hi"},)"
               R"({"type":"tool_use","id":"call_9","name":"f","input":{"a":1}}],"stop_reason":"tool_use","stop_sequence":null,)"
               R"("usage":{"input_tokens":7,"cache_read_input_tokens":0,"output_tokens":3}})");
  CHECK(o.prompt_tokens == 7);
  CHECK(o.completion_tokens == 3);
  REQUIRE(render_reply(client_dialect::responses, body, {"rid", 5, "cm"}, out, o));
  CHECK(out == R"({"id":"resp_rid","object":"response","created_at":5,"status":"completed","error":null,"incomplete_details":null,)"
               R"("model":"cm","output":[{"id":"msg_rid_0","type":"message","status":"completed","role":"assistant","content":)"
               R"([{"type":"output_text","text":"hi","annotations":[]}]},{"id":"fc_rid_1","type":"function_call","status":"completed",)"
               R"("call_id":"call_9","name":"f","arguments":"{\"a\":1}"}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],)"
               R"("usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,)"
               R"("output_tokens_details":{"reasoning_tokens":0},"total_tokens":10}})");
  CHECK_FALSE(render_reply(client_dialect::messages, R"({"error":{"message":"x"}})", {"rid", 5, "cm"}, out, o));
}

TEST_CASE("Anthropic's error shape and type by status") {
  char buf[256];
  const size_t n = write_anthropic_error(buf, sizeof buf, 429, "slow \"down\"");
  CHECK(std::string(buf, n) == R"({"type":"error","error":{"type":"rate_limit_error","message":"slow \"down\""}})");
  CHECK(anthropic_error_type(401) == "authentication_error");
  CHECK(anthropic_error_type(404) == "not_found_error");
  CHECK(anthropic_error_type(413) == "request_too_large");
  CHECK(anthropic_error_type(503) == "overloaded_error");
  CHECK(anthropic_error_type(502) == "api_error");
  char msg[64];
  CHECK(error_message_of(R"({"error":{"message":"a\nb","type":"t"}})", msg, sizeof msg) == "a\nb");
}

TEST_CASE("vLLM's plain content event, passed on escaped without a parse, renders as the parsed one does") {
  const std::string head = R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":)";
  const std::string tail = R"(},"logprobs":null,"finish_reason":null}]})";
  const std::string first = head + R"("a"},"logprobs":null,"finish_reason":null}]})";
  // The same text in a layout the fast path does not take (a space).
  const auto spaced = [&](const std::string& text) { return head + " " + text + tail; };
  for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
    for (std::string text : {R"("plain")", R"("\"q\" \\ \n \u00e9 é \ud83d\ude00")", R"("</script>")"}) {
      const std::vector<std::string> fast = {first, head + text + tail, "[DONE]"};
      const std::vector<std::string> slow = {first, spaced(text), "[DONE]"};
      // The same events once decoded (the escapes may be spelled otherwise).
      CHECK(decoded(render(d, fast)) == decoded(render(d, slow)));
    }
  }
  // What is not a whole JSON string body is parsed (and refused when bad).
  stream_renderer r(16 * 1024);
  r.reset(client_dialect::messages, {"rid", 1, "m"});
  std::string buf(r.bound(512), '\0');
  size_t n = 0;
  REQUIRE(r.feed(first, buf.data(), buf.size(), n) == render_status::ok);
  for (std::string bad : {std::string(R"("a\x")"), std::string("\"a\x01\""), std::string("\"\xff\""), std::string(R"("a\u12")")}) {
    CHECK(r.feed(head + bad + tail, buf.data(), buf.size(), n) == render_status::malformed);
  }
}

TEST_CASE("a long plain stream: sequence numbers past 9, 99 and 999, texts of every length, exact room") {
  // The fast path's event head is made once per block and its sequence
  // number stepped in place; the parsed path writes it whole. 1200 events,
  // every seventh in a layout the fast path does not take, texts of 0 to
  // 40 bytes (a short one copied as 16): both must render the same stream.
  const std::string head = R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":)";
  const std::string tail = R"(},"logprobs":null,"finish_reason":null}]})";
  std::vector<std::string> fast = {head + R"("a"},"logprobs":null,"finish_reason":null}]})"};
  std::vector<std::string> slow = fast;
  for (int i = 0; i < 1200; ++i) {
    std::string text(1, '"');
    text.append(static_cast<size_t>(i % 41), static_cast<char>('a' + i % 26));
    text += '"';
    fast.push_back((i % 7 == 3 ? head + " " : head) + text + tail);
    slow.push_back(head + " " + text + tail);
  }
  fast.push_back(head + R"("z"},"logprobs":null,"finish_reason":"stop"}]})");
  slow.push_back(fast.back());
  fast.push_back("[DONE]");
  slow.push_back("[DONE]");
  for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
    const std::string out = render(d, fast);
    CHECK(out == render(d, slow));
    if (d == client_dialect::responses) {
      simdjson::dom::parser p;
      int64_t seq = 0;
      for (const auto& e : events_of(out)) {
        simdjson::dom::element root;
        REQUIRE(p.parse(e.data).get(root) == simdjson::SUCCESS);
        CHECK(root["sequence_number"].get_int64().value() == seq++);
      }
      CHECK(seq > 1000);
    }
    // Each event fed with exactly the room it needs; and, to a twin, one
    // byte less first: it asks for more and takes nothing from the event.
    stream_renderer sized(16 * 1024), tight(16 * 1024), short_one(16 * 1024);
    for (auto* r : {&sized, &tight, &short_one}) r->reset(d, {"rid", 1700000000, "client-model"});
    std::string big, exact;  // as bound() asks
    std::string again, retried;
    int in_exact_room = 0;
    for (const auto& c : fast) {
      INFO("event ", &c - fast.data(), " of dialect ", static_cast<int>(d), ": ", c);
      size_t n = 0, m = 0;
      big.resize(std::max(big.size(), sized.bound(c.size())));
      exact.resize(big.size());
      REQUIRE(sized.feed(c, big.data(), big.size(), n) == render_status::ok);
      // A token's delta in exactly its room; any other event may ask for
      // bound()'s first.
      render_status st = tight.feed(c, exact.data(), n, m);
      if (st == render_status::more_room) {
        CHECK(m == 0);
        st = tight.feed(c, exact.data(), exact.size(), m);
      } else {
        ++in_exact_room;
      }
      REQUIRE(st == render_status::ok);
      REQUIRE(m == n);
      again.append(exact.data(), m);
      if (n != 0) {
        REQUIRE(short_one.feed(c, exact.data(), n - 1, m) == render_status::more_room);
        CHECK(m == 0);
      }
      REQUIRE(short_one.feed(c, big.data(), big.size(), m) == render_status::ok);
      retried.append(big.data(), m);
    }
    CHECK(again == out);
    CHECK(retried == out);
    CHECK(in_exact_room > 1000);  // the plain events (six in seven, but the empty texts)
  }
}

TEST_CASE("a token's text checked in 16-byte pieces: every length and place of a byte to escape, a bad byte, UTF-8") {
  // The fast path's check reads the text in pieces of 16 (the last one
  // overlapping, a short one masked); the parsed path is simdjson's. They
  // must agree on every text: taken (the same events) or refused.
  const std::string head = R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":)";
  const std::string tail = R"(},"logprobs":null,"finish_reason":null}]})";
  const std::string first = head + R"("a"},"logprobs":null,"finish_reason":null}]})";
  const auto run = [&](client_dialect d, const std::string& event, std::string& out) {
    stream_renderer r(16 * 1024);
    r.reset(d, {"rid", 1, "m"});
    std::string buf(r.bound(first.size()), '\0');
    size_t n = 0;
    REQUIRE(r.feed(first, buf.data(), buf.size(), n) == render_status::ok);
    buf.resize(r.bound(event.size()));
    const render_status st = r.feed(event, buf.data(), buf.size(), n);
    out.assign(buf.data(), st == render_status::ok ? n : 0);
    return st;
  };
  int taken = 0, refused = 0;
  for (const std::string& odd : {std::string("\""), std::string("\x1f"), std::string("\x7f"), std::string("\xc3\xa9"),
                                std::string("\xff"), std::string("\\n"), std::string("\\u00e9"), std::string("\\"),
                                std::string("\\q")}) {
    for (size_t len = 0; len <= 40; ++len) {
      for (size_t at = 0; at <= len; ++at) {
        std::string text(len, 'x');
        text.insert(at, odd);
        std::string fast_out, slow_out;
        for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
          const render_status fast = run(d, head + "\"" + text + "\"" + tail, fast_out);
          const render_status slow = run(d, head + " \"" + text + "\"" + tail, slow_out);
          INFO("text ", text, " dialect ", static_cast<int>(d));
          REQUIRE(fast == slow);
          CHECK(decoded(fast_out) == decoded(slow_out));  // an escape may be spelled otherwise
          (fast == render_status::ok ? taken : refused) += 1;
        }
      }
    }
  }
  CHECK(taken > 1000);
  CHECK(refused > 1000);
}

TEST_CASE("reasoning deltas: a reasoning item for Responses, a thinking block for Messages, then the text") {
  const std::vector<std::string> stream = {
      R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
      R"({"choices":[{"index":0,"delta":{"reasoning_content":"Let me "}}]})",
      R"({"choices":[{"index":0,"delta":{"reasoning_content":"think."}}]})",
      R"({"choices":[{"index":0,"delta":{"content":"Answer."}}]})",
      R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", "[DONE]"};
  std::vector<std::string> types;
  for (const auto& e : events_of(render(client_dialect::responses, stream))) types.push_back(e.event);
  CHECK(types == std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                          "response.content_part.added", "response.reasoning_text.delta",
                                          "response.reasoning_text.delta", "response.reasoning_text.done",
                                          "response.content_part.done", "response.output_item.done",
                                          "response.output_item.added", "response.content_part.added",
                                          "response.output_text.delta", "response.output_text.done",
                                          "response.content_part.done", "response.output_item.done",
                                          "response.completed"});
  const auto ev = events_of(render(client_dialect::responses, stream));
  simdjson::dom::parser p;
  simdjson::dom::element done = p.parse(ev.back().data);
  simdjson::dom::array out = done["response"]["output"].get_array();
  REQUIRE(out.size() == 2);
  CHECK(std::string(out.at(0)["type"].get_string().value()) == "reasoning");
  CHECK(std::string(out.at(0)["content"].at(0)["text"].get_string().value()) == "Let me think.");
  CHECK(std::string(out.at(1)["content"].at(0)["text"].get_string().value()) == "Answer.");
  std::vector<std::string> m;
  for (const auto& e : events_of(render(client_dialect::messages, stream))) m.push_back(e.event);
  CHECK(m == std::vector<std::string>{"message_start", "content_block_start", "content_block_delta", "content_block_delta",
                                      "content_block_stop", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"});
  std::string body;
  reply_outcome o;
  REQUIRE(render_reply(client_dialect::responses,
                       R"({"choices":[{"index":0,"message":{"role":"assistant","content":"A.","reasoning_content":"R."},"finish_reason":"stop"}]})",
                       {"rid", 1, "m"}, body, o));
  CHECK(body.find(R"("output":[{"id":"rs_rid_0","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"R."}]},{"id":"msg_rid_1","type":"message")") != std::string::npos);
}

TEST_CASE("a request id that escapes to six times its length still makes whole events") {
  const std::string rid(64, '\x01');  // each byte \u0001 escaped
  for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
    stream_renderer r(16 * 1024);
    r.reset(d, {rid, 1, "m"});
    std::string out;
    for (const auto& c : k_text_stream) {
      std::string buf(r.bound(c.size()), '\0');
      size_t n = 0;
      REQUIRE(r.feed(c, buf.data(), buf.size(), n) == render_status::ok);
      out.append(buf.data(), n);
    }
    simdjson::dom::parser p;
    for (const auto& e : events_of(out)) {
      simdjson::dom::element root;
      CHECK(p.parse(e.data).get(root) == simdjson::SUCCESS);
    }
  }
}

TEST_CASE("start(): the stream opens before the first chat event -- message_start and a ping, or response.created") {
  for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
    stream_renderer r(16 * 1024);
    r.reset(d, {"rid", 1, "m"});
    std::string buf(r.bound(0), '\0');
    size_t n = 0;
    REQUIRE(r.start(buf.data(), buf.size(), n) == render_status::ok);
    std::vector<std::string> types;
    for (const auto& e : events_of(buf.substr(0, n))) types.push_back(e.event);
    CHECK(types == (d == client_dialect::messages ? std::vector<std::string>{"message_start", "ping"}
                                                  : std::vector<std::string>{"response.created", "response.in_progress"}));
    REQUIRE(r.start(buf.data(), buf.size(), n) == render_status::ok);
    CHECK(n == 0);  // once
    // The first chat event then opens no second stream.
    const std::string role = R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})";
    std::string more(r.bound(role.size()), '\0');
    REQUIRE(r.feed(role, more.data(), more.size(), n) == render_status::ok);
    CHECK(n == 0);
  }
}
