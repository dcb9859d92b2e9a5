// The dialect relay (dialect_relay.hpp): a Responses or Messages client's
// reply rendered from the canonical chat reply, as the adapters call it --
// a non-stream body, a stream's batches in the relay's frame, the end of a
// stream cut short, an error body -- with a recording codec and policy
// around the exchange.
#include <doctest/doctest.h>

#include <simdjson.h>

#include <string>
#include <string_view>
#include <vector>

#include "dialect_relay.hpp"
#include "fakes.hpp"
#include "wire.hpp"

namespace proxy = sluice::proxy;
using sluice::dialect::client_dialect;
using sluice::test::exchange_fixture;

namespace {

constexpr std::string_view k_completion =
    R"({"id":"x","object":"chat.completion","created":1,"model":"backend-m","choices":[{"index":0,)"
    R"("message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],)"
    R"("usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})";

// A chat stream as the translators write it: "data: X\n\n" per event.
std::string chat_event(std::string_view content) {
  return "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
         "\"delta\":{\"content\":\"" + std::string(content) + "\"},\"finish_reason\":null}]}\n\n";
}
const std::string k_finish =
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
    "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],"
    "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n"
    "data: [DONE]\n\n";

// An exchange of a client that speaks `d`, its reply rendered (not native).
void speak(exchange_fixture& f, client_dialect d, bool stream) {
  f.x.req.speaks = d;
  f.x.req.is_stream = stream;
  constexpr std::string_view model = "client-model";
  std::memcpy(f.x.req.model, model.data(), model.size());
  f.x.req.model_len = static_cast<uint8_t>(model.size());
  constexpr std::string_view id = "rid1";
  std::memcpy(f.x.request_id, id.data(), id.size());
  f.x.request_id_len = static_cast<uint8_t>(id.size());
}

// A relay frame holding `events` after its k_batch_room bytes.
void frame_of(proxy::byte_buf& f, std::string_view events) {
  REQUIRE(f.reserve(proxy::k_batch_room + events.size()));
  std::memcpy(f.data + proxy::k_batch_room, events.data(), events.size());
  f.len = static_cast<uint32_t>(proxy::k_batch_room + events.size());
}

std::string payload_of(const proxy::byte_buf& f) {
  REQUIRE(f.len >= proxy::k_batch_room);
  return std::string(f.data + proxy::k_batch_room, f.len - proxy::k_batch_room);
}

// The event names of rendered SSE ("event: NAME\ndata: ...\n\n" each).
std::vector<std::string> event_names(const std::string& s) {
  std::vector<std::string> names;
  size_t at = 0;
  while (at < s.size()) {
    const size_t end = s.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    REQUIRE(s.compare(at, 7, "event: ") == 0);
    const size_t nl = s.find('\n', at);
    names.push_back(s.substr(at + 7, nl - at - 7));
    at = end + 2;
  }
  return names;
}

}  // namespace

TEST_SUITE("exchange::dialect_relay") {
  TEST_CASE("which exchanges are rendered: Responses and Messages clients of a group that does not speak them") {
    exchange_fixture f;
    CHECK_FALSE(proxy::translated_request(f.x));
    CHECK_FALSE(proxy::renders(f.x));
    f.x.req.speaks = client_dialect::messages;
    CHECK(proxy::translated_request(f.x));
    CHECK(proxy::renders(f.x));
    f.x.req.native = true;  // the group's backends speak Messages: passed through
    CHECK(proxy::translated_request(f.x));
    CHECK_FALSE(proxy::renders(f.x));
    f.x.req.native = false;
    f.x.req.speaks = client_dialect::responses;
    CHECK(proxy::renders(f.x));
    f.x.req.speaks = client_dialect::embeddings;
    CHECK_FALSE(proxy::renders(f.x));
  }

  TEST_CASE("the body forwarded: the canonical chat body when rendered, else the client's own bytes") {
    exchange_fixture f;
    f.codec.body = std::string("{\"client\":1}") + std::string(64, '\0');
    f.codec.body_len = 12;
    CHECK(proxy::request_body(f.x) == "{\"client\":1}");
    f.x.req.speaks = client_dialect::messages;
    f.x.req.body = "{\"canonical\":1}";
    CHECK(proxy::request_body(f.x) == "{\"canonical\":1}");
    f.x.req.native = true;
    CHECK(proxy::request_body(f.x) == "{\"client\":1}");
  }

  TEST_CASE("pings only for a rendered Messages stream") {
    exchange_fixture f;
    speak(f, client_dialect::messages, true);
    proxy::set_pings(f.x, 10000);
    CHECK(f.x.pings.ping_ms == 10000);
    SUBCASE("not a stream") {
      f.x.req.is_stream = false;
      proxy::set_pings(f.x, 10000);
      CHECK(f.x.pings.ping_ms == 0);
    }
    SUBCASE("a Responses stream") {
      f.x.req.speaks = client_dialect::responses;
      proxy::set_pings(f.x, 10000);
      CHECK(f.x.pings.ping_ms == 0);
    }
    SUBCASE("a native Messages stream: the backend pings") {
      f.x.req.native = true;
      proxy::set_pings(f.x, 10000);
      CHECK(f.x.pings.ping_ms == 0);
    }
  }

  TEST_CASE("a non-stream chat.completion rendered as a Messages message, its usage in the facts") {
    exchange_fixture f;
    speak(f, client_dialect::messages, false);
    REQUIRE(proxy::render_body(f.x, k_completion));
    simdjson::dom::parser p;
    simdjson::dom::element root;
    REQUIRE(p.parse(f.mem.dialect_reply).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["type"].get_string().value()) == "message");
    CHECK(std::string_view(root["id"].get_string().value()) == "msg_rid1");
    CHECK(std::string_view(root["model"].get_string().value()) == "client-model");  // the client's name, not the backend's
    CHECK(std::string_view(root["content"].at(0)["text"].get_string().value()) == "hi there");
    CHECK(std::string_view(root["stop_reason"].get_string().value()) == "end_turn");
    CHECK(f.x.rsp.facts.prompt_tokens == 7);
    CHECK(f.x.rsp.facts.completion_tokens == 3);
    CHECK(std::string_view(f.x.rsp.facts.finish_reason, f.x.rsp.facts.finish_reason_len) == "stop");
    CHECK(f.policy.kept_responses == 0);  // nothing to store: not asked
  }

  TEST_CASE("a rendered Responses reply is kept in the store once, only when asked and only when it is one") {
    exchange_fixture f;
    speak(f, client_dialect::responses, false);
    f.x.req.store_put = true;
    REQUIRE(proxy::render_body(f.x, k_completion));
    CHECK(f.policy.kept_responses == 1);
    simdjson::dom::parser p;
    simdjson::dom::element root;
    REQUIRE(p.parse(f.mem.dialect_reply).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["object"].get_string().value()) == "response");
    CHECK(std::string_view(root["id"].get_string().value()) == "resp_rid1");

    // A body that is no chat.completion is refused, and nothing is kept.
    CHECK_FALSE(proxy::render_body(f.x, R"({"error":{"message":"backend broke"}})"));
    CHECK(f.policy.kept_responses == 1);
  }

  TEST_CASE("a stream's batches rendered in the frame's place, the outcome in the facts at the end") {
    exchange_fixture f;
    speak(f, client_dialect::messages, true);
    REQUIRE(proxy::start_rendering(f.x));
    proxy::byte_buf frame;
    frame_of(frame, chat_event("Hel") + chat_event("lo"));
    REQUIRE(proxy::render_batch(f.x, frame, false));
    const std::string first = payload_of(frame);
    CHECK(event_names(first) ==
          std::vector<std::string>{"message_start", "content_block_start", "content_block_delta", "content_block_delta"});
    CHECK(first.find("\"text\":\"Hel\"") != std::string::npos);
    CHECK_FALSE(f.x.rsp.facts.done);
    CHECK(f.x.rsp.facts.content_events == 2);

    frame_of(frame, k_finish);
    REQUIRE(proxy::render_batch(f.x, frame, true));
    const std::string last = payload_of(frame);
    CHECK(event_names(last) == std::vector<std::string>{"content_block_stop", "message_delta", "message_stop"});
    CHECK(f.x.rsp.facts.done);
    CHECK(f.x.rsp.facts.prompt_tokens == 5);
    CHECK(f.x.rsp.facts.completion_tokens == 2);
    CHECK_FALSE(f.x.rsp.facts.error);
  }

  TEST_CASE("a rendered stream cut short: its batch ends with the dialect's failure events, billed by its deltas") {
    exchange_fixture f;
    speak(f, client_dialect::messages, true);
    REQUIRE(proxy::start_rendering(f.x));
    proxy::byte_buf frame;
    frame_of(frame, chat_event("partial"));
    REQUIRE(proxy::render_batch(f.x, frame, true));  // the client's response ends here
    const std::vector<std::string> names = event_names(payload_of(frame));
    REQUIRE_FALSE(names.empty());
    CHECK(names.back() == "error");
    CHECK(f.x.rsp.facts.error);
    CHECK(f.x.rsp.facts.prompt_tokens == -1);  // no usage came: the estimate bills it
    CHECK(f.x.rsp.facts.content_events == 1);  // what a cut stream is billed by
  }

  TEST_CASE("end_rendering adds the failure events only when the client's response ends before the stream's") {
    exchange_fixture f;
    speak(f, client_dialect::responses, true);
    f.x.req.store_put = true;
    REQUIRE(proxy::start_rendering(f.x));
    proxy::byte_buf frame;
    frame_of(frame, chat_event("a"));
    REQUIRE(proxy::render_batch(f.x, frame, false));
    const uint32_t before = frame.len;
    REQUIRE(proxy::end_rendering(f.x, frame, false));  // the response goes on: nothing added
    CHECK(frame.len == before);
    REQUIRE(proxy::end_rendering(f.x, frame, true));
    const std::string tail(frame.data + before, frame.len - before);
    CHECK(event_names(tail) == std::vector<std::string>{"response.failed"});
    CHECK(f.x.rsp.facts.error);
    // The renderer is done (its failure written), so the policy is asked
    // to keep it; a failed response has no object to keep.
    CHECK(f.policy.kept_responses == 1);
    std::string kept;
    CHECK_FALSE(f.mem.renderer->write_response(kept));
  }

  TEST_CASE("a rendered Responses stream that completes is kept once, before its last bytes go") {
    exchange_fixture f;
    speak(f, client_dialect::responses, true);
    f.x.req.store_put = true;
    REQUIRE(proxy::start_rendering(f.x));
    proxy::byte_buf frame;
    frame_of(frame, chat_event("a") + k_finish);
    REQUIRE(proxy::render_batch(f.x, frame, true));
    CHECK(event_names(payload_of(frame)).back() == "response.completed");
    CHECK(f.policy.kept_responses == 1);
    REQUIRE(proxy::end_rendering(f.x, frame, true));  // done already: no failure events
    CHECK(event_names(payload_of(frame)).back() == "response.completed");
  }

  TEST_CASE("the renderer is made once per connection and reset for each stream") {
    exchange_fixture f;
    speak(f, client_dialect::messages, true);
    REQUIRE(proxy::start_rendering(f.x));
    const void* made = f.mem.renderer.get();
    proxy::byte_buf frame;
    frame_of(frame, chat_event("a") + k_finish);
    REQUIRE(proxy::render_batch(f.x, frame, true));
    REQUIRE(f.x.rsp.facts.done);
    // The next exchange on the connection: the same renderer, fresh.
    f.x.rsp.facts = {};
    REQUIRE(proxy::start_rendering(f.x));
    CHECK(f.mem.renderer.get() == made);
    frame_of(frame, chat_event("b"));
    REQUIRE(proxy::render_batch(f.x, frame, false));
    CHECK(event_names(payload_of(frame)).front() == "message_start");
    CHECK_FALSE(f.x.rsp.facts.done);
  }

  TEST_CASE("error bodies reach a Messages client in Anthropic's shape; other bodies and clients as they are") {
    exchange_fixture f;
    constexpr std::string_view err =
        R"({"error":{"message":"No such model.","type":"invalid_request_error","param":null,"code":"model_not_found"}})";
    char buf[1024];
    CHECK(proxy::in_client_dialect(f.x, 404, err, buf, sizeof buf) == err);  // a chat client
    f.x.req.speaks = client_dialect::responses;
    CHECK(proxy::in_client_dialect(f.x, 404, err, buf, sizeof buf) == err);  // Responses errors are OpenAI's
    f.x.req.speaks = client_dialect::messages;
    CHECK(proxy::in_client_dialect(f.x, 200, R"({"ok":1})", buf, sizeof buf) == R"({"ok":1})");

    const std::string reshaped(proxy::in_client_dialect(f.x, 404, err, buf, sizeof buf));
    simdjson::dom::parser p;
    simdjson::dom::element root;
    REQUIRE(p.parse(reshaped).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["type"].get_string().value()) == "error");
    CHECK(std::string_view(root["error"]["type"].get_string().value()) == "not_found_error");
    CHECK(std::string_view(root["error"]["message"].get_string().value()) == "No such model.");

    // A body with no message of its own still says something.
    const std::string bare(proxy::in_client_dialect(f.x, 502, "upstream said nothing", buf, sizeof buf));
    simdjson::dom::element b;
    REQUIRE(p.parse(bare).get(b) == simdjson::SUCCESS);
    CHECK(std::string_view(b["error"]["type"].get_string().value()) == "api_error");
    CHECK(std::string_view(b["error"]["message"].get_string().value()) == "The request failed.");
  }
}
