// Unit tests of mock-triton's pure part: requests as sluice's own KServe
// encoder writes them are decoded and planned, and the responses are read
// back by sluice's decoder (the grpc-js integration test checks the same
// bytes against protobufjs, an independent peer).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "codec.hpp"
#include "options.hpp"
#include "sluice/grpc/kserve.hpp"

using namespace mock_triton;
using sluice::grpc::decode_status;
using sluice::grpc::infer_input;
using sluice::grpc::infer_parameter;
using namespace std::literals;

namespace {

// A ModelInferRequest as the gateway's encoder writes it (no gRPC frame).
std::string encode(const sluice::grpc::infer_request& r) {
  std::string out(sluice::grpc::encoded_size(r), '\0');
  REQUIRE(sluice::grpc::encode(r, out.data(), out.size()) == out.size());
  return out;
}

// Splits `out` into its gRPC frames and decodes each as a stream response.
std::vector<sluice::grpc::stream_response> read_responses(std::string_view out) {
  std::vector<sluice::grpc::stream_response> responses;
  while (!out.empty()) {
    sluice::grpc::frame f;
    REQUIRE(sluice::grpc::read_frame(out, 1 << 20, f) == decode_status::ok);
    REQUIRE(sluice::grpc::decode_stream_response(f.message, responses.emplace_back()) == decode_status::ok);
    out.remove_prefix(f.consumed);
  }
  return responses;
}

struct vllm_case {
  std::string_view text = "one two  three";
  bool stream = true;
  std::string_view sampling = R"({"max_tokens":3,"temperature":0.1})";
  bool extras = true;
  bool empty_final = false;
};

// Holds the views the encoder reads until the request is encoded.
struct vllm_request {
  std::array<std::string_view, 1> text;
  std::array<std::string_view, 1> sampling;
  std::vector<infer_input> inputs;
  std::array<infer_parameter, 1> parameters;
  std::string bytes;

  explicit vllm_request(const vllm_case& c) : text{c.text}, sampling{c.sampling} {
    inputs.push_back(infer_input::of_bytes("text_input", text));
    inputs.push_back(infer_input::of_bool("stream", c.stream));
    inputs.push_back(infer_input::of_bytes("sampling_parameters", sampling));
    inputs.push_back(infer_input::of_bool("exclude_input_in_output", true));
    if (c.extras) {
      inputs.push_back(infer_input::of_bool("return_finish_reason", true));
      inputs.push_back(infer_input::of_bool("return_num_input_tokens", true));
      inputs.push_back(infer_input::of_bool("return_num_output_tokens", true));
    }
    parameters[0] = infer_parameter::of_bool("triton_enable_empty_final_response", c.empty_final);
    sluice::grpc::infer_request r{"mock-model", "", "req-7", parameters, inputs};
    bytes = encode(r);
  }
};

struct planned {
  bool ok = false;
  infer_request request;
  stream_plan plan;
  std::string error;
};

planned plan_of(std::string_view message, uint32_t reply_tokens = 16) {
  static simdjson::dom::parser parser;
  planned p;
  REQUIRE(decode_infer_request(message, p.request) == decode_status::ok);
  p.ok = make_stream_plan(parser, p.request, reply_tokens, p.plan, p.error);
  return p;
}

}  // namespace

TEST_SUITE("mock_triton::codec") {
  TEST_CASE("a vLLM-backend request decodes: ids, the empty-final parameter, inputs paired with their contents") {
    vllm_request req(vllm_case{.empty_final = true});
    infer_request r;
    REQUIRE(decode_infer_request(req.bytes, r) == decode_status::ok);
    CHECK(r.model_name == "mock-model");
    CHECK(r.id == "req-7");
    CHECK(r.empty_final_response);
    REQUIRE(r.inputs.size() == 7);
    CHECK(r.inputs[0].name == "text_input");
    CHECK(r.inputs[0].datatype == "BYTES");
    CHECK(r.inputs[0].raw == "\x0e\0\0\0one two  three"sv);
    CHECK(r.inputs[1].datatype == "BOOL");
    CHECK(r.inputs[1].raw == "\x01"sv);
    CHECK(r.inputs[6].name == "return_num_output_tokens");
  }

  TEST_CASE("the vLLM flavour: words of text_input, max_tokens from sampling_parameters") {
    auto p = plan_of(vllm_request(vllm_case{}).bytes);
    REQUIRE(p.ok);
    CHECK(p.plan.kind == flavour::vllm);
    CHECK(p.plan.stream);
    CHECK(p.plan.prompt_tokens == 3);
    CHECK(p.plan.tokens == 3);
    CHECK(p.plan.ends_by_length);
    CHECK(p.plan.exclude_input_in_output);
    CHECK(p.plan.return_finish_reason);
    CHECK(p.plan.return_num_output_tokens);
    SUBCASE("a numeric string counts, as the backend reads it") {
      auto s = plan_of(vllm_request(vllm_case{.sampling = R"({"max_tokens":"5"})"}).bytes);
      REQUIRE(s.ok);
      CHECK(s.plan.tokens == 5);
    }
    SUBCASE("no max_tokens: the whole reply, ending by stop") {
      auto s = plan_of(vllm_request(vllm_case{.sampling = "{}"}).bytes);
      REQUIRE(s.ok);
      CHECK(s.plan.tokens == 16);
      CHECK_FALSE(s.plan.ends_by_length);
    }
    SUBCASE("sampling_parameters that are not a JSON object are refused") {
      auto s = plan_of(vllm_request(vllm_case{.sampling = "[1"}).bytes);
      CHECK_FALSE(s.ok);
      CHECK_FALSE(s.error.empty());
    }
  }

  TEST_CASE("an INT32 max_tokens input makes it the TensorRT-LLM ensemble") {
    std::array<std::string_view, 1> text{"a b c d"};
    std::array<std::string_view, 1> stop{"</s>"};
    std::array inputs{infer_input::of_bytes("text_input", text), infer_input::of_int32("max_tokens", 40),
                      infer_input::of_bool("stream", false), infer_input::of_fp32("temperature", 0.5f),
                      infer_input::of_bytes("stop_words", stop)};
    auto p = plan_of(encode({"mock-model", "1", "t", {}, inputs}), 8);
    REQUIRE(p.ok);
    CHECK(p.plan.kind == flavour::trtllm);
    CHECK_FALSE(p.plan.stream);
    CHECK(p.plan.prompt_tokens == 4);
    CHECK(p.plan.tokens == 8);
    CHECK_FALSE(p.plan.ends_by_length);
  }

  TEST_CASE("a request without text_input, or with inputs of the wrong type, is refused") {
    std::array none{infer_input::of_bool("stream", true)};
    CHECK_FALSE(plan_of(encode({"m", "", "", {}, none})).ok);
    std::array<std::string_view, 1> text{"x"};
    std::array wrong{infer_input::of_bytes("text_input", text), infer_input::of_int32("stream", 1)};
    CHECK_FALSE(plan_of(encode({"m", "", "", {}, wrong})).ok);
    std::array bool_text{infer_input::of_bool("text_input", true)};
    CHECK_FALSE(plan_of(encode({"m", "", "", {}, bool_text})).ok);
    infer_request r;
    CHECK(decode_infer_request("\x0a\x05" "ab", r) != decode_status::ok);  // truncated field
  }

  TEST_CASE("a vLLM stream: one token per response, the finish reason and counts on the last only") {
    auto p = plan_of(vllm_request(vllm_case{.empty_final = true}).bytes, 5);
    REQUIRE(p.ok);
    response_head head{"mock-model", "1", "req-7", true, false};
    std::string out;
    REQUIRE(responses(p.plan) == 3);
    for (uint32_t i = 0; i < responses(p.plan); ++i) append_token_response(out, p.plan, head, i);
    append_empty_final_response(out, head);
    auto rs = read_responses(out);
    REQUIRE(rs.size() == 4);
    const char* texts[] = {"tok0", " tok1", " tok2"};
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(rs[i].id == "req-7");
      CHECK(rs[i].model_name == "mock-model");
      CHECK(rs[i].model_version == "1");
      CHECK(rs[i].has_text_output);
      CHECK(rs[i].text_output == texts[i]);
      CHECK(rs[i].has_final_response);
      CHECK_FALSE(rs[i].final_response);
      CHECK(rs[i].has_finish_reason == (i == 2));
    }
    CHECK(rs[0].num_input_tokens == -1);
    CHECK(rs[2].finish_reason == "length");
    CHECK(rs[2].num_input_tokens == 3);
    CHECK(rs[2].num_output_tokens == 3);
    CHECK_FALSE(rs[3].has_text_output);
    CHECK(rs[3].has_final_response);
    CHECK(rs[3].final_response);
  }

  TEST_CASE("without streaming one response holds the whole text, the prompt first unless excluded") {
    // The plan's text_input views the request's bytes: the request stays.
    const auto request = vllm_request(vllm_case{.text = "Hi ", .stream = false, .sampling = "{}", .extras = false});
    auto p = plan_of(request.bytes, 2);
    REQUIRE(p.ok);
    std::string out;
    append_token_response(out, p.plan, response_head{"m", "1", "", false, false}, 0);
    p.plan.exclude_input_in_output = false;
    append_token_response(out, p.plan, response_head{"m", "1", "", false, false}, 0);
    auto rs = read_responses(out);
    REQUIRE(rs.size() == 2);
    CHECK(rs[0].text_output == "tok0 tok1");
    CHECK(rs[1].text_output == "Hi tok0 tok1");
    CHECK_FALSE(rs[0].has_finish_reason);
    CHECK_FALSE(rs[0].has_final_response);
  }

  TEST_CASE("error and ready responses") {
    std::string out;
    append_error_response(out, "the model failed");
    auto rs = read_responses(out);
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].error_message == "the model failed");
    std::string ready, not_ready;
    append_ready_response(ready, true);
    append_ready_response(not_ready, false);
    CHECK(ready == "\0\0\0\0\x02\x08\x01"sv);
    CHECK(not_ready == "\0\0\0\0\0"sv);
  }

  TEST_CASE("grpc-message is percent-encoded outside printable ASCII, and '%' itself") {
    CHECK(percent_encode("plain text") == "plain text");
    CHECK(percent_encode("50% \xc3\xa9\n") == "50%25 %C3%A9%0A");
  }

  TEST_CASE("the model ready request decodes name and version") {
    std::string_view name, version;
    REQUIRE(decode_model_ready_request("\x0a\x01m\x12\x01" "1", name, version) == decode_status::ok);
    CHECK(name == "m");
    CHECK(version == "1");
  }
}

TEST_SUITE("mock_triton::options") {
  TEST_CASE("flags are read in both spellings and bad values are refused") {
    const char* argv[] = {"mock-triton", "--port", "0", "--model=m", "--fail-mode", "status", "--not-ready",
                          "--fail-status=14"};
    options o;
    std::string error;
    REQUIRE(parse_flags(8, const_cast<char**>(argv), o, error) == parse_outcome::run);
    CHECK(o.port == 0);
    CHECK(o.model == "m");
    CHECK(o.fail == fail_mode::status);
    CHECK(o.not_ready);
    CHECK(o.fail_status == 14);
    const char* bad_mode[] = {"mock-triton", "--fail-mode", "crash"};
    CHECK(parse_flags(3, const_cast<char**>(bad_mode), o, error) == parse_outcome::error);
    const char* bad_status[] = {"mock-triton", "--fail-status", "17"};
    CHECK(parse_flags(3, const_cast<char**>(bad_status), o, error) == parse_outcome::error);
  }
}
