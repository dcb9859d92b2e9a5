#include <doctest/doctest.h>

#include <simdjson.h>

#include <string>

#include "sluice/dialect/request.hpp"

using sluice::dialect::request_translator;
using sluice::dialect::translated_request;
using sluice::openai::request_error;

namespace {

// The body with simdjson's padding readable after it (as the codecs keep it).
std::string padded(const std::string& body) {
  std::string s(body.size() + simdjson::SIMDJSON_PADDING, ' ');
  s.resize(body.size());
  s.replace(0, body.size(), body);
  return s;
}

struct result {
  bool ok;
  std::string out;
  translated_request t;
  std::string param;
  std::string message;
};

result messages(std::string body, bool count_only = false) {
  static request_translator tr;
  result r;
  request_error e;
  body = padded(body);
  r.ok = tr.messages(body, count_only, r.out, r.t, e);
  r.param = std::string(e.param);
  r.message = std::string(e.message);
  return r;
}

result responses(std::string body) {
  static request_translator tr;
  result r;
  request_error e;
  body = padded(body);
  r.ok = tr.responses(body, r.out, r.t, e);
  r.param = std::string(e.param);
  r.message = std::string(e.message);
  return r;
}

// The output is valid JSON (a chat body the request reader will read again).
bool valid_json(const std::string& s) {
  simdjson::dom::parser p;
  simdjson::dom::element e;
  return p.parse(s).get(e) == simdjson::SUCCESS && e.is_object();
}

}  // namespace

TEST_CASE("Messages -> chat: system, text, max_tokens, sampling, stop, stream") {
  auto r = messages(R"({"model":"m","max_tokens":64,"system":"be brief","temperature":0.5,"top_k":5,)"
                    R"("stop_sequences":["END"],"stream":true,"messages":[{"role":"user","content":"hi"}]})");
  REQUIRE(r.ok);
  CHECK(r.t.stream);
  CHECK(r.out ==
        R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],)"
        R"("max_tokens":64,"temperature":0.5,"top_k":5,"stop":["END"],"stream":true,"stream_options":{"include_usage":true}})");
}

TEST_CASE("Messages -> chat: system blocks, images, tool_use and tool_result blocks") {
  auto r = messages(R"({"model":"m","max_tokens":8,"system":[{"type":"text","text":"a"},{"type":"text","text":"b"}],)"
                    R"("messages":[{"role":"user","content":[{"type":"text","text":"look"},)"
                    R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"}}]},)"
                    R"({"role":"assistant","content":[{"type":"text","text":"calling"},)"
                    R"({"type":"tool_use","id":"t1","name":"get","input":{"q":"x"}}]},)"
                    R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"42"},)"
                    R"({"type":"text","text":"thanks"}]}],)"
                    R"("tools":[{"name":"get","description":"d","input_schema":{"type":"object"}}],)"
                    R"("tool_choice":{"type":"tool","name":"get","disable_parallel_tool_use":true}})");
  REQUIRE(r.ok);
  CHECK(valid_json(r.out));
  CHECK(r.out.find(R"({"role":"system","content":"a\nb"})") != std::string::npos);
  CHECK(r.out.find(R"({"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"}})") != std::string::npos);
  CHECK(r.out.find(R"({"role":"assistant","content":"calling","tool_calls":[{"id":"t1","type":"function",)"
                   R"("function":{"name":"get","arguments":"{\"q\":\"x\"}"}}]})") != std::string::npos);
  // The tool result comes first, as chat wants it right after the call.
  const size_t tool = r.out.find(R"({"role":"tool","tool_call_id":"t1","content":"42"})");
  const size_t thanks = r.out.find(R"({"role":"user","content":[{"type":"text","text":"thanks"}]})");
  CHECK(tool != std::string::npos);
  CHECK(thanks != std::string::npos);
  CHECK(tool < thanks);
  CHECK(r.out.find(R"("tools":[{"type":"function","function":{"name":"get","description":"d","parameters":{"type":"object"}}}])") !=
        std::string::npos);
  CHECK(r.out.find(R"("tool_choice":{"type":"function","function":{"name":"get"}},"parallel_tool_calls":false)") !=
        std::string::npos);
  CHECK(r.out.find("stream") == std::string::npos);
}

TEST_CASE("Messages: what is refused names its field") {
  CHECK(messages(R"({"model":"m","messages":[{"role":"user","content":"x"}]})").param == "max_tokens");
  CHECK(messages(R"({"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]})").param == "max_tokens");
  CHECK(messages(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}]})").param == "model");
  CHECK(messages(R"({"model":"m","max_tokens":5,"messages":[]})").param == "messages");
  CHECK(messages(R"({"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]})").param ==
        "messages[0].role");
  CHECK(messages(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document"}]}]})").param ==
        "messages[0].content[0].type");
  CHECK(messages(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],)"
                 R"("tools":[{"type":"web_search_20250305","name":"web_search"}]})").param == "tools[0].type");
  CHECK(messages(R"({"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":[]}]}]})")
            .param == "messages[0].content[0].input");
  CHECK(messages(R"([1])").ok == false);
  CHECK(messages(R"({"model":"m","max_tokens":5,"temperature":"hot","messages":[{"role":"user","content":"x"}]})").param ==
        "temperature");
}

TEST_CASE("Messages count_tokens takes no max_tokens") {
  auto r = messages(R"({"model":"m","messages":[{"role":"user","content":"count me"}]})", true);
  REQUIRE(r.ok);
  CHECK(r.out == R"({"model":"m","messages":[{"role":"user","content":"count me"}]})");
}

TEST_CASE("Responses -> chat: a string input, instructions, sampling, text.format, reasoning, stream") {
  auto r = responses(R"({"model":"m","input":"hi","instructions":"sys","max_output_tokens":7,"top_p":0.9,)"
                     R"("text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true}},)"
                     R"("reasoning":{"effort":"low"},"stream":true,"store":false})");
  REQUIRE(r.ok);
  CHECK(r.t.stream);
  CHECK(r.out == R"({"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}],)"
                 R"("max_tokens":7,"top_p":0.9,"response_format":{"type":"json_schema","json_schema":{"name":"s",)"
                 R"("schema":{"type":"object"},"strict":true}},"reasoning_effort":"low","stream":true,)"
                 R"("stream_options":{"include_usage":true}})");
}

TEST_CASE("Responses -> chat: items, function calls and their outputs, tools, tool_choice") {
  auto r = responses(R"({"model":"m","instructions":"sys","input":[)"
                     R"({"role":"developer","content":"dev"},)"
                     R"({"type":"message","role":"user","content":[{"type":"input_text","text":"look"},)"
                     R"({"type":"input_image","image_url":"https://x/y.png"}]},)"
                     R"({"type":"reasoning","id":"r1","summary":[]},)"
                     R"({"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},)"
                     R"({"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},)"
                     R"({"type":"function_call_output","call_id":"c1","output":"one"},)"
                     R"({"type":"function_call_output","call_id":"c2","output":"two"},)"
                     R"({"role":"assistant","content":[{"type":"output_text","text":"done"}]}],)"
                     R"("tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":false}],)"
                     R"("tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false})");
  REQUIRE(r.ok);
  CHECK(valid_json(r.out));
  CHECK(r.out == R"({"model":"m","messages":[{"role":"system","content":"sys"},{"role":"system","content":"dev"},)"
                 R"({"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]},)"
                 R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f",)"
                 R"("arguments":"{\"a\":1}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]},)"
                 R"({"role":"tool","tool_call_id":"c1","content":"one"},{"role":"tool","tool_call_id":"c2","content":"two"},)"
                 R"({"role":"assistant","content":"done"}],)"
                 R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":false}}],)"
                 R"("tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false})");
}

TEST_CASE("Responses: what is refused names its field") {
  CHECK(responses(R"({"model":"m"})").param == "input");
  CHECK(responses(R"({"input":"x"})").param == "model");
  CHECK(responses(R"({"model":"m","input":[{"type":"function_call_output","call_id":"nope","output":"x"}]})").param ==
        "input[0].call_id");
  CHECK(responses(R"({"model":"m","input":[{"type":"web_search_call"}]})").param == "input[0].type");
  CHECK(responses(R"({"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]})").param ==
        "input[0].content[0].type");
  CHECK(responses(R"({"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]})").param ==
        "input[0].content[0].image_url");
  CHECK(responses(R"({"model":"m","input":"x","tools":[{"type":"web_search"}]})").param == "tools[0].type");
  CHECK(responses(R"({"model":"m","input":"x","max_output_tokens":-1})").param == "max_output_tokens");
  CHECK(responses(R"({"model":"m","input":[]})").param == "input");
  auto r = responses(R"({"model":"m","input":"x","previous_response_id":"resp_1"})");
  CHECK(r.ok);
  CHECK(r.t.previous_response_id == "resp_1");
}

TEST_CASE("Responses: a stored conversation is read before the input; the items for the store; store: false") {
  static request_translator tr;
  request_error e;
  translated_request t;
  std::string out, items;
  const std::string history =
      R"({"type":"message","role":"user","content":"weather?"},)"
      R"({"id":"fc_1","type":"function_call","status":"completed","call_id":"c1","name":"w","arguments":"{}"})";
  // A function_call_output may answer the stored call; instructions are this request's.
  std::string body = padded(R"({"model":"m","instructions":"now","previous_response_id":"resp_1",)"
                            R"("input":[{"type":"function_call_output","call_id":"c1","output":"sunny"}]})");
  REQUIRE(tr.responses(body, out, t, e, history, &items));
  CHECK(t.previous_response_id == "resp_1");
  CHECK(t.store);
  CHECK(out == R"({"model":"m","messages":[{"role":"system","content":"now"},{"role":"user","content":"weather?"},)"
               R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w",)"
               R"("arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]})");
  std::string expect = history;
  expect.append(R"(,{"type":"function_call_output","call_id":"c1","output":"sunny"})");
  CHECK(items == expect);
  // A string input after the stored items; store: false said.
  body = padded(R"({"model":"m","input":"and?","store":false,"previous_response_id":"resp_1"})");
  REQUIRE(tr.responses(body, out, t, e, R"({"role":"user","content":"a"},{"role":"assistant","content":"b"})", &items));
  CHECK_FALSE(t.store);
  CHECK(out == R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},)"
               R"({"role":"user","content":"and?"}]})");
  CHECK(items == R"({"role":"user","content":"a"},{"role":"assistant","content":"b"},)"
                 R"({"type":"message","role":"user","content":"and?"})");
  // Without its conversation read in yet, an output naming a call not given
  // is taken on trust (the conversation comes before it once read).
  body = padded(R"({"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c9","output":"x"}]})");
  CHECK(tr.responses(body, out, t, e));
  // A stored conversation that is not JSON items is refused, naming previous_response_id.
  body = padded(R"({"model":"m","input":"x","previous_response_id":"resp_1"})");
  CHECK_FALSE(tr.responses(body, out, t, e, "not json", &items));
  CHECK(e.param == "previous_response_id");
  CHECK(responses(R"({"model":"m","input":"x","previous_response_id":7})").param == "previous_response_id");
  CHECK(responses(R"({"model":"m","input":"x","store":"no"})").param == "store");
}
