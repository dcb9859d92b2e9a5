// triton_grpc against a scripted KServe v2 backend (an nghttp2 server
// session on the loopback socket): the ModelStreamInfer request it writes
// on its h2c connection, the reply's messages translated into the OpenAI
// chat reply vLLM would give (chunks or one chat.completion), streams
// sharing a connection, and every way a stream ends short of a reply -- a
// gRPC status, a reset, a closed connection, a client that went, a message
// past the bound.
#include "triton_fixture.hpp"

using namespace sluice::adapters_test;
using sluice::proxy::triton_grpc;

namespace {

// A custom template makes the rendered prompt recognisable byte for byte.
constexpr std::string_view k_group = R"(
[[group]]
name = "tri"
models = ["tri-*"]
protocol = "triton"
backend_model = "tri-backend"
chat_template = "custom"
backends = [BACKENDS]
[group.custom_template]
begin = "<s>"
system_prefix = "[S] "
system_suffix = "\n"
user_prefix = "[U] "
user_suffix = "\n"
generation_prefix = "[A] "
)";

std::string config(std::string_view backends = "\"{g0}\"") {
  std::string g(k_group);
  g.replace(g.find("BACKENDS"), 8, backends);
  return g;
}

constexpr std::string_view k_messages = R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hi."}])";
constexpr std::string_view k_prompt = "<s>[S] Be brief.\n[U] Say hi.\n[A] ";
const std::string k_stream = std::string(R"({"model":"tri-1","stream":true,)") + std::string(k_messages) + "}";
const std::string k_stream_usage =
    std::string(R"({"model":"tri-1","stream":true,"stream_options":{"include_usage":true},)") + std::string(k_messages) + "}";
const std::string k_chat = std::string(R"({"model":"tri-1",)") + std::string(k_messages) + "}";

constexpr std::string_view k_path = "/inference.GRPCInferenceService/ModelStreamInfer";

// vLLM's backend streaming "Hello world": 12 tokens in, one out per
// response, the last (EOS) with no text and the finish reason.
const std::vector<std::string> k_reply = {
    token_message("Hello", {}, 12, 1),
    token_message(" world", {}, 12, 1),
    token_message("", "stop", 12, 1),
};

// Each message on its own, handled before the next; then the trailers.
void answer(triton_shard& f, const grpc_request& r, const std::vector<std::string>& messages, uint32_t status = 0) {
  r.peer->head(r.id);
  f.settle();
  for (const std::string& m : messages) {
    r.peer->message(r.id, m);
    f.settle();
  }
  r.peer->trailers(r.id, status);
  f.settle();
}

// What a stream client read: the events, the text of the content deltas,
// the finish reasons given, the error events.
struct chat_events {
  std::vector<std::string> events;
  std::string text;
  std::vector<std::string> finishes;
  std::vector<std::string> errors;  // error.message of each error event
};

chat_events read_stream(const call& c) {
  chat_events out;
  std::string payload;
  REQUIRE(dechunk(c.codec.sent, payload));  // well framed, the terminal chunk last
  out.events = sse_data(payload);
  for (const std::string& e : out.events) {
    if (e == "[DONE]") continue;
    CAPTURE(e);
    const json j(e);
    simdjson::dom::element error;
    if (j.root["error"].get(error) == simdjson::SUCCESS) {
      out.errors.push_back(str(error["message"]));
      continue;
    }
    CHECK(str(j.root["object"]) == "chat.completion.chunk");
    CHECK(str(j.root["id"]) == "chatcmpl-" + c.request_id);
    CHECK(str(j.root["model"]) == "tri-1");  // the client's, not the backend's
    CHECK(int64_t(j.root["created"]) == 1700000000);
    simdjson::dom::array choices;
    REQUIRE(j.root["choices"].get_array().get(choices) == simdjson::SUCCESS);
    if (choices.size() == 0) continue;
    std::string_view s;
    if (choices.at(0)["delta"]["content"].get_string().get(s) == simdjson::SUCCESS) out.text += s;
    if (choices.at(0)["finish_reason"].get_string().get(s) == simdjson::SUCCESS) out.finishes.emplace_back(s);
  }
  return out;
}

std::string finish_of(const call& c) {
  const sluice::proxy::stream_facts& s = c.x.rsp.facts;
  return std::string(s.finish_reason, s.finish_reason_len);
}

// The message of an OpenAI error body.
std::string error_text(std::string_view body) { return str(json(body).root["error"]["message"]); }

}  // namespace

TEST_SUITE("adapters::triton_grpc") {
  TEST_CASE("the backend gets ModelStreamInfer on h2c: gRPC fields, the group's model, the prompt in its template, no client key") {
    triton_shard f(config());
    call& c = f.start(k_stream, {.headers = "authorization: Bearer sk-client\r\nx-api-key: sk-client\r\n"});
    const grpc_request r = f.await_request();
    const grpc_stream& s = r.stream();
    CHECK(s.field(":method") == "POST");
    CHECK(s.field(":scheme") == "http");
    CHECK(s.field(":path") == k_path);
    CHECK(s.field(":authority") == "127.0.0.1:" + std::to_string(f.backend().port));
    CHECK(s.field("content-type") == "application/grpc");
    CHECK(s.field("te") == "trailers");
    CHECK(s.field("grpc-timeout") == "<absent>");  // no total deadline on this exchange
    CHECK(s.field("authorization") == "<absent>");
    CHECK(s.field("x-api-key") == "<absent>");
    for (const auto& [name, value] : s.fields) {
      CAPTURE(name);
      CHECK(value.find("sk-client") == std::string::npos);
    }
    CHECK(s.body.find("sk-client") == std::string::npos);
    infer_request_seen q;
    REQUIRE(read_infer_request(s.body, q));  // one whole message, then END_STREAM
    CHECK(q.model_name == "tri-backend");
    CHECK(q.id == c.request_id);
    CHECK(q.bytes_input("text_input") == k_prompt);
    CHECK(q.bool_input("stream"));  // always asked to stream
    CHECK(q.bool_input("exclude_input_in_output"));
    CHECK(r.stream().request_ended);
    answer(f, r, k_reply);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    CHECK(c.codec.done);
  }

  TEST_CASE("a streamed reply reaches the client as vLLM's chat chunks, each message as it comes, usage in the facts") {
    bool usage = false;
    SUBCASE("without the usage chunk") { usage = false; }
    SUBCASE("with the usage chunk the client asked for") { usage = true; }
    triton_shard f(config());
    call& c = f.start(usage ? k_stream_usage : k_stream);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    f.settle();
    CHECK_FALSE(c.codec.head_sent);  // the head waits for the first message (an error could still come)
    r.peer->message(r.id, k_reply[0]);
    f.settle();
    // The first message is out before the second is written.
    CHECK(c.codec.head_sent);
    CHECK(c.codec.head_status == 200);
    CHECK(c.codec.field("content-type").starts_with("text/event-stream"));
    CHECK(c.codec.sent.find("Hello") != std::string::npos);
    CHECK(c.codec.sent.find("world") == std::string::npos);
    CHECK_FALSE(c.codec.ended());
    r.peer->message(r.id, k_reply[1]);
    f.settle();
    CHECK(c.codec.sent.find("world") != std::string::npos);
    r.peer->message(r.id, k_reply[2]);
    r.peer->trailers(r.id, 0);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.done);
    const chat_events e = read_stream(c);
    REQUIRE(e.events.size() == (usage ? 6u : 5u));
    CHECK(str(json(e.events[0]).root["choices"].at(0)["delta"]["role"]) == "assistant");
    CHECK(e.text == "Hello world");
    CHECK(e.finishes == std::vector<std::string>{"stop"});
    CHECK(e.errors.empty());
    if (usage) {
      const json u(e.events[4]);
      CHECK(int64_t(u.root["usage"]["prompt_tokens"]) == 12);
      CHECK(int64_t(u.root["usage"]["completion_tokens"]) == 3);
      CHECK(int64_t(u.root["usage"]["total_tokens"]) == 15);
    }
    CHECK(e.events.back() == "[DONE]");
    const sluice::proxy::stream_facts& s = c.x.rsp.facts;
    CHECK(s.prompt_tokens == 12);
    CHECK(s.completion_tokens == 3);  // the backend's counts, summed
    CHECK(finish_of(c) == "stop");
    CHECK_FALSE(s.error);
    CHECK(c.x.rsp.complete);
    REQUIRE(f.policy.outcomes.size() == 1);
    CHECK_FALSE(f.policy.outcomes[0].failure);
  }

  TEST_CASE("messages split anywhere across DATA frames, or several in one, read the same") {
    triton_shard f(config());
    std::string all;
    for (const std::string& m : k_reply) all += m;
    for (size_t split = 1; split < all.size(); split += 7) {
      CAPTURE(split);
      call& c = f.start(k_stream);
      const grpc_request r = f.await_request();
      r.peer->head(r.id);
      r.peer->message(r.id, all.substr(0, split));
      f.settle();
      r.peer->message(r.id, all.substr(split));
      r.peer->trailers(r.id, 0);
      REQUIRE(f.pump([&] { return c.codec.ended(); }));
      REQUIRE(c.codec.done);
      const chat_events e = read_stream(c);
      CHECK(e.events.size() == 5);
      CHECK(e.text == "Hello world");
      CHECK(e.finishes == std::vector<std::string>{"stop"});
      CHECK(c.x.rsp.facts.completion_tokens == 3);
      CHECK(c.x.rsp.facts.prompt_tokens == 12);
    }
    CHECK(f.accepted() == 1);  // one connection took every one
  }

  TEST_CASE("a non-stream reply is gathered into one chat.completion with the backend's counts") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    answer(f, r, {token_message("Hello", {}, 12, 1), token_message(" world", {}, 12, 1), token_message("", "length", 12, 1)});
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK_FALSE(c.codec.head_sent);
    CHECK(c.codec.answer_status == 200);
    const json j(c.codec.answer_body);
    CHECK(str(j.root["object"]) == "chat.completion");
    CHECK(str(j.root["id"]) == "chatcmpl-" + c.request_id);
    CHECK(str(j.root["model"]) == "tri-1");
    CHECK(str(j.root["choices"].at(0)["message"]["role"]) == "assistant");
    CHECK(str(j.root["choices"].at(0)["message"]["content"]) == "Hello world");
    CHECK(str(j.root["choices"].at(0)["finish_reason"]) == "length");
    CHECK(int64_t(j.root["usage"]["prompt_tokens"]) == 12);
    CHECK(int64_t(j.root["usage"]["completion_tokens"]) == 3);
    CHECK(c.x.rsp.facts.prompt_tokens == 12);
    CHECK(c.x.rsp.facts.completion_tokens == 3);
    CHECK(finish_of(c) == "length");
    CHECK(c.x.rsp.answered_ok);
  }

  TEST_CASE("a non-stream reply that fails after its first message is a 502 with a 502's body, the backend's words in it") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    r.peer->message(r.id, token_message("Hello", {}, 12, 1));
    f.settle();
    r.peer->trailers(r.id, 8, "busy");  // RESOURCE_EXHAUSTED
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK(c.codec.answer_status == 502);
    CHECK(error_text(c.codec.answer_body) == "busy");
    CHECK(c.codec.answer_body.find("\"type\":\"server_error\"") != std::string::npos);
    CHECK(c.codec.answer_body.find("rate_limit_exceeded") == std::string::npos);  // not a 429's shape
  }

  TEST_CASE("two exchanges at once share one connection, a stream each, and each gets its own reply") {
    triton_shard f(config());
    call& a = f.start(k_stream);
    call& b = f.start(k_chat);
    grpc_request ra = f.await_request();
    grpc_request rb = f.await_request();
    CHECK(f.accepted() == 1);
    REQUIRE(ra.peer == rb.peer);
    CHECK(ra.id != rb.id);
    infer_request_seen qa, qb;
    REQUIRE(read_infer_request(ra.stream().body, qa));
    REQUIRE(read_infer_request(rb.stream().body, qb));
    if (qa.id != a.request_id) {
      std::swap(ra, rb);
      std::swap(qa, qb);
    }
    REQUIRE(qa.id == a.request_id);
    REQUIRE(qb.id == b.request_id);
    // Interleaved on the one connection.
    grpc_peer& p = *ra.peer;
    p.head(rb.id);
    p.head(ra.id);
    p.message(ra.id, token_message("A1", {}, 7, 1));
    p.message(rb.id, token_message("B1", {}, 9, 1));
    f.settle();
    CHECK(a.codec.sent.find("A1") != std::string::npos);
    CHECK(a.codec.sent.find("B1") == std::string::npos);
    p.message(rb.id, token_message("B2", "stop", 9, 1));
    p.message(ra.id, token_message("A2", {}, 7, 1));
    p.trailers(rb.id, 0);
    f.settle();
    CHECK(b.codec.answered);
    CHECK_FALSE(a.codec.ended());
    p.message(ra.id, token_message("", "stop", 7, 1));
    p.trailers(ra.id, 0);
    REQUIRE(f.pump([&] { return a.codec.ended() && b.codec.ended(); }));
    REQUIRE(a.codec.done);
    const chat_events ea = read_stream(a);
    CHECK(ea.text == "A1A2");
    CHECK(ea.events.back() == "[DONE]");
    CHECK(a.x.rsp.facts.prompt_tokens == 7);
    CHECK(a.x.rsp.facts.completion_tokens == 3);
    REQUIRE(b.codec.answer_status == 200);
    CHECK(str(json(b.codec.answer_body).root["choices"].at(0)["message"]["content"]) == "B1B2");
    CHECK(b.x.rsp.facts.prompt_tokens == 9);
    CHECK(b.x.rsp.facts.completion_tokens == 2);
    CHECK(f.accepted() == 1);
  }

  TEST_CASE("a non-zero grpc-status before any message answers the mapped HTTP error; the connection serves on") {
    struct expect {
      uint32_t grpc_status;
      uint16_t http_status;
    };
    expect e{};
    SUBCASE("RESOURCE_EXHAUSTED") { e = {8, 429}; }
    SUBCASE("INVALID_ARGUMENT") { e = {3, 400}; }
    SUBCASE("UNAVAILABLE, no other backend") { e = {14, 503}; }
    SUBCASE("NOT_FOUND") { e = {5, 404}; }
    SUBCASE("INTERNAL") { e = {13, 502}; }
    CAPTURE(e.grpc_status);
    triton_shard f(config());
    for (const bool trailers_only : {false, true}) {
      for (const bool stream : {true, false}) {
        CAPTURE(trailers_only);
        CAPTURE(stream);
        call& c = f.start(stream ? k_stream : k_chat);
        const grpc_request r = f.await_request();
        if (trailers_only) {
          r.peer->trailers_only(r.id, e.grpc_status, "model%20tri-backend: no%21");
        } else {
          r.peer->head(r.id);
          f.settle();
          r.peer->trailers(r.id, e.grpc_status, "model%20tri-backend: no%21");
        }
        REQUIRE(f.pump([&] { return c.codec.ended(); }));
        REQUIRE(c.codec.answered);
        CHECK_FALSE(c.codec.head_sent);
        CHECK(c.codec.answer_status == e.http_status);
        CHECK(c.codec.answer_code == "upstream_error");
        CHECK(error_text(c.codec.answer_body) == "model tri-backend: no!");  // percent-decoded
        CHECK_FALSE(c.x.rsp.answered_ok);
        CHECK(c.x.attempts == 0);
      }
    }
    // The backend answered every time: nothing for passive health to count.
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
    CHECK(f.accepted() == 1);
  }

  TEST_CASE("UNAVAILABLE before any message goes to the next backend") {
    triton_shard f(config("\"{g0}\", \"{g1}\""), {true, true});
    call& c = f.start(k_stream, {.pinned = f.backend_index(0)});
    const grpc_request r0 = f.await_request();
    CHECK(&r0.peer->backend == &f.backend(0));
    r0.peer->trailers_only(r0.id, 14, "draining");
    const grpc_request r1 = f.await_request();
    CHECK(&r1.peer->backend == &f.backend(1));
    answer(f, r1, k_reply);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.done);
    CHECK(c.x.attempts == 1);
    CHECK(c.x.backend_used == f.backend_index(1));
    CHECK(read_stream(c).text == "Hello world");
  }

  TEST_CASE("a plain HTTP 503 without grpc-status is UNAVAILABLE: 503, not a gRPC reply") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    r.peer->http_head(r.id, "503", true);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK(c.codec.answer_status == 503);
    CHECK(error_text(c.codec.answer_body).find("HTTP 503") != std::string::npos);
  }

  TEST_CASE("an error_message before any token is a 502 with the backend's words") {
    triton_shard f(config());
    call& c = f.start(k_stream);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    r.peer->message(r.id, error_message("max_tokens exceeds the model's limit"));
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK_FALSE(c.codec.head_sent);
    CHECK(c.codec.answer_status == 502);
    CHECK(error_text(c.codec.answer_body) == "max_tokens exceeds the model's limit");
    // The stream is cancelled towards the backend.
    REQUIRE(f.pump([&] { return r.stream().reset_by_sluice; }));
    CHECK(r.stream().reset_code == NGHTTP2_CANCEL);
  }

  TEST_CASE("a stream the backend resets after its first token ends with an error event, never a finish") {
    triton_shard f(config());
    call& c = f.start(k_stream);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    r.peer->message(r.id, k_reply[0]);
    f.settle();
    REQUIRE(c.codec.head_sent);
    r.peer->reset(r.id, NGHTTP2_INTERNAL_ERROR);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    const chat_events e = read_stream(c);
    CHECK(e.text == "Hello");  // what came before the reset went out
    CHECK(e.finishes.empty());  // no made-up finish
    REQUIRE(e.errors.size() == 1);
    CHECK(e.errors[0].find("reset the stream") != std::string::npos);
    // README "Backend protocols": an error event, then [DONE], as vLLM's own.
    REQUIRE(e.events.size() >= 2);
    CHECK(e.events[e.events.size() - 2].find("\"error\"") != std::string::npos);
    CHECK(e.events.back() == "[DONE]");
    CHECK(c.x.rsp.facts.error);
    CHECK(finish_of(c).empty());
    CHECK(c.x.error_code == "upstream_truncated");
    CHECK(c.x.rsp.facts.completion_tokens == 1);  // the token it was sent
    // Passive health: a reset counts against the backend, as an HTTP/1.1
    // backend's does.
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
  }

  TEST_CASE("a stream the backend refuses (REFUSED_STREAM) is a busy backend, not a failing one") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    r.peer->reset(r.id, NGHTTP2_REFUSED_STREAM);
    REQUIRE(f.pump([&] { return c.codec.answered || c.codec.ended(); }));
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
  }

  TEST_CASE("a connection the backend closes mid-stream: the stream ends in an error, a failure is reported, the next request reconnects") {
    triton_shard f(config());
    call& c = f.start(k_stream);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    r.peer->message(r.id, k_reply[0]);
    f.settle();
    REQUIRE(c.codec.sent.find("Hello") != std::string::npos);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
    f.backend().close_conn(r.peer->conn);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    const chat_events e = read_stream(c);
    CHECK(e.text == "Hello");
    CHECK(e.finishes.empty());
    REQUIRE(e.errors.size() == 1);
    CHECK(e.errors[0] == "The backend closed the connection.");
    CHECK(c.x.rsp.facts.error);
    CHECK(finish_of(c).empty());
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    // A fresh connection for the next one.
    call& next = f.start(k_chat);
    const grpc_request r2 = f.await_request();
    CHECK(f.accepted() == 2);
    CHECK(r2.peer != r.peer);
    answer(f, r2, k_reply);
    REQUIRE(f.pump([&] { return next.codec.ended(); }));
    CHECK(next.codec.answer_status == 200);
  }

  TEST_CASE("a connection closed before any message: 503, a failure reported") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    f.backend().close_conn(r.peer->conn);
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK(c.codec.answer_status == 503);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
  }

  TEST_CASE("release() mid-stream resets the stream towards the backend; the connection serves the next exchange") {
    triton_shard f(config());
    call& c = f.start(k_stream);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    r.peer->message(r.id, k_reply[0]);
    f.settle();
    REQUIRE(c.codec.sent.find("Hello") != std::string::npos);
    const std::string sent = c.codec.sent;
    f.triton->release(c.x);  // the client went
    // The backend, not yet aware, writes on.
    r.peer->message(r.id, token_message(" late", {}, 12, 1));
    REQUIRE(f.pump([&] { return r.stream().reset_by_sluice; }));
    CHECK(r.stream().reset_code == NGHTTP2_CANCEL);
    f.settle();
    CHECK(c.codec.sent == sent);  // nothing more reached the gone client
    CHECK_FALSE(c.codec.ended());  // its end is the codec's, not the adapter's
    call& next = f.start(k_chat);
    const grpc_request r2 = f.await_request();
    CHECK(r2.peer == r.peer);
    CHECK(r2.id > r.id);
    answer(f, r2, k_reply);
    REQUIRE(f.pump([&] { return next.codec.ended(); }));
    REQUIRE(next.codec.answered);
    CHECK(next.codec.answer_status == 200);
    CHECK(str(json(next.codec.answer_body).root["choices"].at(0)["message"]["content"]) == "Hello world");
    CHECK(f.accepted() == 1);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
  }

  TEST_CASE("a deadline with no answer: 504, the stream cancelled") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    f.settle();
    f.triton->on_timeout(c.x);  // the codec's timer
    REQUIRE(c.codec.answered);
    CHECK(c.codec.answer_status == 504);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);  // passive health, as for HTTP/1.1
    CHECK(c.codec.answer_code == "upstream_timeout");
    REQUIRE(f.pump([&] { return r.stream().reset_by_sluice; }));
    CHECK(r.stream().reset_code == NGHTTP2_CANCEL);
  }

  TEST_CASE("a message declared past the 4 MiB bound is refused at once; the connection serves on") {
    triton_shard f(config());
    call& c = f.start(k_stream);
    const grpc_request r = f.await_request();
    r.peer->head(r.id);
    // Only the prefix and a few bytes: the refusal does not wait for the rest.
    r.peer->message(r.id, frame_header(triton_grpc::k_message_bytes_max + 1) + "\x12\x03" + "abc");
    REQUIRE(f.pump([&] { return c.codec.ended(); }));
    REQUIRE(c.codec.answered);
    CHECK_FALSE(c.codec.head_sent);
    CHECK(c.codec.answer_status == 502);
    CHECK(error_text(c.codec.answer_body) == "The backend sent a reply sluice cannot read.");
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
    REQUIRE(f.pump([&] { return r.stream().reset_by_sluice; }));
    CHECK(r.stream().reset_code == NGHTTP2_CANCEL);
    call& next = f.start(k_stream);
    const grpc_request r2 = f.await_request();
    CHECK(r2.peer == r.peer);
    answer(f, r2, k_reply);
    REQUIRE(f.pump([&] { return next.codec.ended(); }));
    REQUIRE(next.codec.done);
    CHECK(read_stream(next).text == "Hello world");
  }

  TEST_CASE("a message of exactly the bound is read whole, through many stream windows") {
    triton_shard f(config());
    call& c = f.start(k_chat);
    const grpc_request r = f.await_request();
    // The text that makes the framed message exactly 5 + 4 MiB.
    // (Lengths near 4 MiB take the same varint bytes: one probe finds it.)
    const size_t bound = triton_grpc::k_message_bytes_max;
    const size_t guess = bound - token_message("", "stop", 12, 1).size();
    const size_t probe = token_message(std::string(guess, 'a'), "stop", 12, 1).size();
    const size_t text_bytes = guess - (probe - 5 - bound);
    const std::string big = token_message(std::string(text_bytes, 'a'), "stop", 12, 1);
    REQUIRE(big.size() == 5 + triton_grpc::k_message_bytes_max);
    REQUIRE(big.size() > 8 * triton_grpc::k_stream_window_bytes);
    r.peer->head(r.id);
    r.peer->message(r.id, big);
    r.peer->trailers(r.id, 0);
    REQUIRE(f.pump([&] { return c.codec.ended(); }, 20000));
    REQUIRE(c.codec.answered);
    CHECK(c.codec.answer_status == 200);
    const json j(c.codec.answer_body);
    CHECK(str(j.root["choices"].at(0)["message"]["content"]).size() == text_bytes);
    CHECK(f.policy.failures_of(f.backend_index(0)) == 0);
  }

  TEST_CASE("a connection nghttp2 gives up on (a SETTINGS flood) reports one failure, not one per stream") {
    triton_shard f(config());
    call& a = f.start(k_stream);
    call& b = f.start(k_stream);
    const grpc_request ra = f.await_request();
    const grpc_request rb = f.await_request();
    REQUIRE(ra.peer == rb.peer);
    ra.peer->head(ra.id);
    rb.peer->head(rb.id);
    f.settle();
    // 5000 empty SETTINGS frames in one write: nghttp2's mem_recv returns
    // NGHTTP2_ERR_FLOODED (over 1000 ACKs queued, none sent).
    std::string flood;
    for (int i = 0; i < 5000; ++i) flood.append("\0\0\0\x04\0\0\0\0\0", 9);
    REQUIRE(::send(f.backend().conns[ra.peer->conn], flood.data(), flood.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(flood.size()));
    REQUIRE(f.pump([&] { return a.codec.ended() && b.codec.ended(); }));
    CHECK(f.policy.failures_of(f.backend_index(0)) == 1);
  }
}
