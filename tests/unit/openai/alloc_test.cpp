// The hot path does not call the allocator once warm (STYLE.md §4): global
// operator new is counted in this test binary.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>
#include <span>
#include <string>
#include <string_view>

#include "../alloc_counter.hpp"
#include "sluice/openai/anthropic.hpp"
#include "sluice/openai/chat_template.hpp"
#include "sluice/openai/error.hpp"
#include "sluice/openai/request.hpp"
#include "sluice/openai/triton.hpp"

using namespace sluice::openai;

namespace {

struct anthropic_event {
  std::string_view name;
  std::string_view data;
};

// Runs `events` through one translator once to warm it, then 100 times
// more: the same bytes each time, and no allocation.
void check_warm_anthropic_stream(const anthropic_reply_context& ctx, std::span<const anthropic_event> events) {
  anthropic_stream stream;
  char out[2048];
  auto run = [&] {
    stream.reset(ctx);
    size_t bytes = 0;
    for (const anthropic_event& e : events) {
      anthropic_stream_result r = stream.feed(e.name, e.data, out, sizeof(out));
      CHECK(r.status == anthropic_stream_status::ok);
      bytes += r.written;
    }
    CHECK(stream.done());
    return bytes;
  };
  const size_t warm = run();
  CHECK(warm > 0);
  const size_t before = sluice::test::allocations();
  for (int i = 0; i < 100; ++i) CHECK(run() == warm);
  CHECK(sluice::test::allocations() == before);
}

}  // namespace

TEST_SUITE("openai::allocation") {
  TEST_CASE("a warm reader, event scan and error writer allocate nothing") {
    std::string body =
        R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],)"
        R"("stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"meta":{)";
    for (int i = 0; i < 40; ++i) body += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
    body += R"("z":{"a":[1,2,{"b":null}]}}})";
    const size_t len = body.size();
    body.append(simdjson::SIMDJSON_PADDING, '\0');
    const std::string bad = std::string(R"({"model":"m","model":"n"})") +
                            std::string(simdjson::SIMDJSON_PADDING, '\0');
    const std::string chunk =
        R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}})";
    // An escape: the walk leaves it to the parse, whose scratch is warm too.
    const std::string parsed_chunk =
        R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}})";

    request_reader reader(1 << 20);
    request_fields f;
    request_error e;
    REQUIRE(reader.read(endpoint::chat_completions, body.data(), len, 100, f, e));
    (void)scan_stream_event(chunk);
    (void)scan_stream_event(parsed_chunk);
    (void)scan_response_usage(chunk);

    const size_t before = sluice::test::allocations();
    for (int i = 0; i < 100; ++i) {
      CHECK(reader.read(endpoint::chat_completions, body.data(), len, 100, f, e));
      CHECK_FALSE(reader.read(endpoint::chat_completions, bad.data(), 25, 100, f, e));
      CHECK(scan_stream_event(chunk).has_usage);
      stream_event_info walked;
      CHECK_FALSE(sluice::openai::detail::walk_stream_event(parsed_chunk, walked));
      CHECK(scan_stream_event(parsed_chunk).completion_tokens == 2);
      CHECK(scan_response_usage(chunk).completion_tokens == 2);
      char out[256];
      CHECK(write_error_body(out, sizeof(out), default_error_for_status(400, e.message)) > 0);
    }
    CHECK(sluice::test::allocations() == before);
  }

  TEST_CASE("a warm Anthropic stream translator allocates nothing per event") {
    static constexpr anthropic_event events[] = {
        {"message_start", R"({"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"output_tokens":1}}})"},
        {"content_block_start", R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"},
        {"ping", R"({"type":"ping"})"},
        {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello \"x\"\n"}})"},
        {"content_block_start", R"({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}})"},
        {"content_block_delta", R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}})"},
        {"unknown", R"({"type":"unknown"})"},
        {"message_delta", R"({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":15}})"},
        {"message_stop", R"({"type":"message_stop"})"},
    };
    check_warm_anthropic_stream({"req", 1, "m", true}, events);
  }

  TEST_CASE("a warm Anthropic stream translator allocates nothing on a completions stream") {
    static constexpr anthropic_event events[] = {
        {"message_start", R"({"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"output_tokens":1}}})"},
        {"content_block_start", R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"},
        {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Once"}})"},
        {"ping", R"({"type":"ping"})"},
        {"content_block_delta", R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" upon \"a\"\n"}})"},
        {"content_block_stop", R"({"type":"content_block_stop","index":0})"},
        {"message_delta", R"({"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":15}})"},
        {"message_stop", R"({"type":"message_stop"})"},
    };
    anthropic_reply_context ctx{"req", 1, "m", true};
    ctx.kind = endpoint::completions;
    check_warm_anthropic_stream(ctx, events);
  }

  TEST_CASE("rendering a chat template allocates nothing") {
    std::string body =
        R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":)"
        R"([{"type":"text","text":"a"},{"type":"text","text":" b "}]}]})";
    const size_t len = body.size();
    body.append(simdjson::SIMDJSON_PADDING, '\0');
    request_reader reader(1 << 20);
    request_fields f;
    request_error e;
    REQUIRE(reader.read(endpoint::chat_completions, body.data(), len, 100, f, e));
    char prompt[512];
    const size_t before = sluice::test::allocations();
    for (auto kind : {chat_template_kind::chatml, chat_template_kind::llama3,
                      chat_template_kind::mistral, chat_template_kind::custom}) {
      chat_template t;
      t.kind = kind;
      sluice::text_writer out(prompt, sizeof prompt);
      CHECK(render_chat_prompt(t, f, out, e));
    }
    CHECK(sluice::test::allocations() == before);
  }

  TEST_CASE("a warm Triton request writer and stream translator allocate nothing") {
    std::string chat =
        R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],)"
        R"("max_tokens":9,"temperature":0.5,"top_p":0.9,"stop":["a","b"],"seed":3,"presence_penalty":0.1})";
    const size_t chat_len = chat.size();
    chat.append(simdjson::SIMDJSON_PADDING, '\0');
    std::string completion = R"({"model":"m","prompt":"once","stop":"x","frequency_penalty":1})";
    const size_t completion_len = completion.size();
    completion.append(simdjson::SIMDJSON_PADDING, '\0');
    request_reader reader(1 << 20);
    request_fields f;
    request_error e;
    triton_request_writer writer;
    std::string frame;
    triton_request_options opts;
    opts.model = "backend";
    opts.request_id = "req";

    sluice::grpc::stream_response piece;
    piece.has_text_output = true;
    piece.text_output = "Hello \"x\"\n";
    piece.num_input_tokens = 4;
    piece.num_output_tokens = 1;
    piece.has_finish_reason = true;
    piece.finish_reason = "None";
    sluice::grpc::stream_response last = piece;
    last.finish_reason = "stop";
    last.has_final_response = last.final_response = true;
    sluice::grpc::stream_response error;
    error.error_message = "failed";
    triton_stream stream;
    std::string text;
    char out[4096];

    auto run = [&] {
      size_t bytes = 0;
      for (triton_flavor flavor : {triton_flavor::vllm, triton_flavor::trtllm}) {
        opts.flavor = flavor;
        CHECK(reader.read(endpoint::chat_completions, chat.data(), chat_len, 100, f, e));
        CHECK(writer.write(opts, f, endpoint::chat_completions, frame, e));
        bytes += frame.size();
        CHECK(reader.read(endpoint::completions, completion.data(), completion_len, 100, f, e));
        CHECK(writer.write(opts, f, endpoint::completions, frame, e));
        bytes += frame.size();
      }
      for (endpoint kind : {endpoint::chat_completions, endpoint::completions}) {
        const triton_reply_context ctx{"req", 1, "m", kind, true};
        stream.reset(ctx);
        for (int i = 0; i < 3; ++i) bytes += stream.feed(piece, out, sizeof out).written;
        bytes += stream.feed(last, out, sizeof out).written;
        stream.reset(ctx);
        bytes += stream.feed(piece, out, sizeof out).written;
        bytes += stream.feed(error, out, sizeof out).written;
        stream.reset(ctx);
        bytes += stream.feed(piece, out, sizeof out).written;
        bytes += stream.finish(out, sizeof out).written;
        stream.reset(ctx, &text);
        for (int i = 0; i < 3; ++i) CHECK(stream.feed(piece, out, sizeof out).status == triton_stream_status::ok);
        CHECK(stream.feed(last, out, sizeof out).status == triton_stream_status::ok);
        bytes += stream.write_body(out, sizeof out).written;
      }
      return bytes;
    };
    const size_t warm = run();
    const size_t before = sluice::test::allocations();
    for (int i = 0; i < 50; ++i) CHECK(run() == warm);
    CHECK(sluice::test::allocations() == before);
  }
}
