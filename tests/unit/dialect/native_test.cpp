#include <doctest/doctest.h>

#include <string>

#include "sluice/dialect/native.hpp"

using namespace sluice::dialect;

namespace {

std::string span_of(std::string_view body, std::string_view key, member_scan* status = nullptr) {
  uint32_t b = 0, e = 0;
  const member_scan m = top_level_member(body, key, b, e);
  if (status != nullptr) *status = m;
  return m == member_scan::found ? std::string(body.substr(b, e - b)) : std::string();
}

}  // namespace

TEST_CASE("top_level_member: the value's span, skipping nested members and strings that look like keys") {
  CHECK(span_of(R"({"model":"m","x":1})", "model") == R"("m")");
  CHECK(span_of(" {\n \"a\" : {\"model\":\"inner\"} , \"b\":[\"model\",{\"model\":1}], \"model\" :\t\"out\\\"er\" }", "model") ==
        R"("out\"er")");
  CHECK(span_of(R"({"messages":[{"content":"\"model\":\"x\""}],"model":"real"})", "model") == R"("real")");
  CHECK(span_of(R"({"max_tokens":12,"model":"m"})", "max_tokens") == "12");
  member_scan m;
  CHECK(span_of(R"({"x":1})", "model", &m).empty());
  CHECK(m == member_scan::absent);
  span_of(R"({"model":"a","max_tokens":1,"max_tokens":2})", "model", &m);
  CHECK(m == member_scan::duplicate);
  span_of(R"({"m\u006fdel":"a","model":"b"})", "model", &m);
  CHECK(m == member_scan::escaped);
  span_of(R"([1,2])", "model", &m);
  CHECK(m == member_scan::malformed);
  span_of(R"({"model":"a")", "model", &m);
  CHECK(m == member_scan::malformed);
}

TEST_CASE("a native Messages stream's usage: message_start's input (with the cache's), message_delta's output") {
  native_usage u;
  scan_native_event(client_dialect::messages,
                    R"({"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_read_input_tokens":5,"cache_creation_input_tokens":2,"output_tokens":1}}})",
                    u);
  CHECK(u.prompt_tokens == 17);
  scan_native_event(client_dialect::messages, R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}})", u);
  CHECK(u.content);
  scan_native_event(client_dialect::messages, R"({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}})", u);
  CHECK_FALSE(u.content);
  CHECK(u.prompt_tokens == 17);
  CHECK(u.completion_tokens == 9);
  CHECK(u.content_events == 1);
  CHECK_FALSE(u.error);
  scan_native_event(client_dialect::messages, R"({"type":"error","error":{"type":"overloaded_error","message":"x"}})", u);
  CHECK(u.error);
}

TEST_CASE("a native Responses stream's usage: response.completed's, response.failed an error") {
  native_usage u;
  scan_native_event(client_dialect::responses, R"({"type":"response.output_text.delta","sequence_number":4,"delta":"x"})", u);
  CHECK(u.content_events == 1);
  scan_native_event(client_dialect::responses,
                    R"({"type":"response.completed","sequence_number":9,"response":{"status":"completed","usage":{"input_tokens":8,"output_tokens":3,"total_tokens":11}}})",
                    u);
  CHECK(u.prompt_tokens == 8);
  CHECK(u.completion_tokens == 3);
  native_usage f;
  scan_native_event(client_dialect::responses, R"({"type":"response.failed","response":{"status":"failed","usage":null}})", f);
  CHECK(f.error);
}

TEST_CASE("a native Responses stream's id: response.created's response.id, in any layout, and only there") {
  native_usage u;
  std::string_view id;
  scan_native_event(client_dialect::responses,
                    R"({ "sequence_number": 0, "response": { "object": "response", "id": "resp_abc", "status": "in_progress" }, "type": "response.created" })",
                    u, &id);
  CHECK(id == "resp_abc");
  std::string_view none;
  scan_native_event(client_dialect::responses,
                    R"({"type":"response.completed","response":{"id":"resp_other","usage":{"input_tokens":1,"output_tokens":1}}})", u,
                    &none);
  CHECK(none.empty());
  scan_native_event(client_dialect::responses, R"({"type":"response.created","response":{"id":7}})", u, &none);
  CHECK(none.empty());
  scan_native_event(client_dialect::messages, R"({"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":2}}})", u,
                    &none);
  CHECK(none.empty());
}

TEST_CASE("a native body's usage: the last usage object, in either dialect's names") {
  const native_usage m = native_body_usage(
      client_dialect::messages,
      R"({"id":"m","content":[{"type":"text","text":"\"usage\":{\"input_tokens\":99}"}],"usage":{"input_tokens":4,"output_tokens":6}})");
  CHECK(m.prompt_tokens == 4);
  CHECK(m.completion_tokens == 6);
  const native_usage r = native_body_usage(client_dialect::responses,
                                           R"({"output":[],"usage": {"input_tokens":7,"output_tokens":2},"user":null})");
  CHECK(r.prompt_tokens == 7);
  CHECK(r.completion_tokens == 2);
  CHECK(native_body_usage(client_dialect::responses, R"({"output":[]})").prompt_tokens == -1);
}

TEST_CASE("a native event's type is read where it stands first or last; elsewhere the event is parsed") {
  native_usage u;
  // pydantic's field order (vLLM's Responses events): type last.
  scan_native_event(client_dialect::responses,
                    R"({"content_index":0,"delta":"x","item_id":"m","logprobs":[],"output_index":0,"sequence_number":5,"type":"response.output_text.delta"})",
                    u);
  CHECK(u.content_events == 1);
  scan_native_event(client_dialect::responses,
                    R"({"response":{"usage":{"input_tokens":3,"output_tokens":2}},"sequence_number":9,"type":"response.completed"})", u);
  CHECK(u.prompt_tokens == 3);
  CHECK(u.completion_tokens == 2);
  // A type in the middle: parsed, and still read.
  native_usage m;
  scan_native_event(client_dialect::messages, R"({"usage":{"output_tokens":4},"type":"message_delta","delta":{}})", m);
  CHECK(m.completion_tokens == 4);
}
