// The Triton translators: client bodies in, ModelInferRequest frames out
// (decoded back field by field); stream responses in, OpenAI events and
// bodies out, compared byte for byte with what mock-vllm writes for vLLM
// where the shapes are meant to be the same; gRPC statuses in, error
// answers out.
#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "vllm_reference.hpp"
#include "sluice/grpc/kserve.hpp"
#include "sluice/openai/triton.hpp"

using namespace sluice::openai;
// GCC 12 at -O3 takes an element's tape pointer for possibly null where a
// lookup chain follows a successful parse (a false positive in simdjson's
// inlined accessors); the checks below only read parsed documents.
#pragma GCC diagnostic ignored "-Wnull-dereference"

using sluice::grpc::stream_response;
using sluice::grpc::wire_field;
using sluice::grpc::wire_reader;
using simdjson::dom::element;
using namespace std::literals;
using sluice::test::vllm_stream;

namespace {

// One parser for the tests' JSON checks, made out of line.
[[gnu::noinline]] simdjson::dom::parser& json_parser() {
  static simdjson::dom::parser p;
  return p;
}

// --- requests ---------------------------------------------------------------

struct tensor {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::string raw;
};

struct decoded_request {
  std::string model;
  std::string id;
  std::vector<std::pair<std::string, bool>> bool_params;
  std::vector<tensor> inputs;

  const tensor& input(std::string_view name) const {
    for (const tensor& t : inputs) {
      if (t.name == name) return t;
    }
    FAIL("no input ", std::string(name));
    return inputs.front();
  }
  bool has(std::string_view name) const {
    for (const tensor& t : inputs) {
      if (t.name == name) return true;
    }
    return false;
  }
};

std::vector<int64_t> packed_varints(std::string_view b) {
  std::vector<int64_t> out;
  uint64_t v = 0;
  unsigned shift = 0;
  for (char c : b) {
    v |= uint64_t(static_cast<unsigned char>(c) & 0x7F) << shift;
    shift += 7;
    if ((static_cast<unsigned char>(c) & 0x80) == 0) {
      out.push_back(static_cast<int64_t>(v));
      v = 0;
      shift = 0;
    }
  }
  return out;
}

// The frame -> its ModelInferRequest, through grpc::wire_reader.
decoded_request decode(const std::string& framed) {
  sluice::grpc::frame fr;
  REQUIRE(sluice::grpc::read_frame(framed, 1 << 30, fr) == sluice::grpc::decode_status::ok);
  CHECK(fr.consumed == framed.size());
  decoded_request d;
  size_t raw_index = 0;
  wire_reader r(fr.message);
  wire_field f;
  while (r.next(f)) {
    switch (f.number) {
      case 1: d.model = f.bytes; break;
      case 3: d.id = f.bytes; break;
      case 4: {  // parameters map entry
        std::string key;
        bool value = false;
        wire_reader e(f.bytes);
        wire_field ef;
        while (e.next(ef)) {
          if (ef.number == 1) key = ef.bytes;
          if (ef.number == 2) {
            wire_reader p(ef.bytes);
            wire_field pf;
            while (p.next(pf)) {
              if (pf.number == 1) value = pf.value != 0;
            }
          }
        }
        d.bool_params.emplace_back(key, value);
        break;
      }
      case 5: {
        tensor t;
        wire_reader in(f.bytes);
        wire_field tf;
        while (in.next(tf)) {
          if (tf.number == 1) t.name = tf.bytes;
          if (tf.number == 2) t.datatype = tf.bytes;
          if (tf.number == 3) t.shape = packed_varints(tf.bytes);
        }
        CHECK(in.status() == sluice::grpc::decode_status::ok);
        d.inputs.push_back(t);
        break;
      }
      case 7:
        REQUIRE(raw_index < d.inputs.size());
        d.inputs[raw_index++].raw = f.bytes;
        break;
      default: FAIL("unexpected field ", f.number);
    }
  }
  CHECK(r.status() == sluice::grpc::decode_status::ok);
  CHECK(raw_index == d.inputs.size());
  return d;
}

// BYTES raw contents -> the elements.
std::vector<std::string> bytes_elements(std::string_view raw) {
  std::vector<std::string> out;
  while (raw.size() >= 4) {
    uint32_t n = 0;
    for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[static_cast<size_t>(i)]);
    raw.remove_prefix(4);
    REQUIRE(n <= raw.size());
    out.emplace_back(raw.substr(0, n));
    raw.remove_prefix(n);
  }
  CHECK(raw.empty());
  return out;
}

uint64_t le(std::string_view raw) {
  uint64_t v = 0;
  for (size_t i = raw.size(); i > 0; --i) v = (v << 8) | static_cast<unsigned char>(raw[i - 1]);
  return v;
}

struct client_body {
  request_reader reader{1 << 20};
  std::string body;
  request_fields fields;
  request_error err;

  const request_fields& read(endpoint e, std::string_view json) {
    body.assign(json);
    const size_t len = body.size();
    body.append(simdjson::SIMDJSON_PADDING, '\0');
    const bool ok = reader.read(e, body.data(), len, 4096, fields, err);
    INFO(err.message);
    REQUIRE(ok);
    return fields;
  }
};

triton_request_options options(triton_flavor flavor) {
  triton_request_options o;
  o.flavor = flavor;
  o.model = "backend-model";
  o.request_id = "req-7";
  o.default_max_tokens = 100;
  return o;
}

decoded_request written(triton_flavor flavor, endpoint e, std::string_view json) {
  client_body c;
  const request_fields& f = c.read(e, json);
  triton_request_writer w;
  std::string out;
  request_error err;
  const bool ok = w.write(options(flavor), f, e, out, err);
  INFO(err.message);
  REQUIRE(ok);
  return decode(out);
}

request_error refused(triton_flavor flavor, endpoint e, std::string_view json) {
  static client_body c;  // the error's views may point into the reader
  static triton_request_writer w;
  const request_fields& f = c.read(e, json);
  std::string out;
  request_error err;
  CHECK_FALSE(w.write(options(flavor), f, e, out, err));
  CHECK_FALSE(err.message.empty());
  return err;
}

void check_bool_input(const decoded_request& d, std::string_view name, const std::vector<int64_t>& shape) {
  const tensor& t = d.input(name);
  CHECK(t.datatype == "BOOL");
  CHECK(t.shape == shape);
  CHECK(t.raw == "\x01"s);
}

// --- replies ----------------------------------------------------------------

stream_response text(std::string_view t, int64_t out_tokens = -1, std::string_view finish = "None") {
  stream_response r;
  r.has_text_output = true;
  r.text_output = t;
  r.num_output_tokens = out_tokens;
  r.has_finish_reason = true;
  r.finish_reason = finish;
  return r;
}

stream_response final_empty() {
  stream_response r;
  r.has_final_response = true;
  r.final_response = true;
  return r;
}

std::string feed_all(triton_stream& s, const std::vector<stream_response>& rs) {
  std::string out;
  char buf[8192];
  for (const stream_response& r : rs) {
    CHECK(s.event_bytes_max(r) <= sizeof buf);
    triton_stream_result res = s.feed(r, buf, sizeof buf);
    REQUIRE(res.status == triton_stream_status::ok);
    out.append(buf, res.written);
  }
  return out;
}

const triton_reply_context chat_ctx{"req", 1700000000, "qwen", endpoint::chat_completions, false};
const triton_reply_context completions_ctx{"req", 1700000000, "qwen", endpoint::completions, false};

}  // namespace

TEST_SUITE("openai::triton_request") {
  TEST_CASE("a vLLM-flavour chat request carries the rendered prompt and the client's sampling members") {
    constexpr std::string_view body =
        R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi \"there\""}],)"
        R"("max_tokens":32,"temperature":0.5,"top_p":0.9,"stop":["a","\n"],"seed":7,)"
        R"("presence_penalty":0.25,"frequency_penalty":-1,"stream":false})";
    const decoded_request d = written(triton_flavor::vllm, endpoint::chat_completions, body);
    CHECK(d.model == "backend-model");
    CHECK(d.id == "req-7");
    REQUIRE(d.bool_params.size() == 1);
    CHECK(d.bool_params[0] == std::pair<std::string, bool>{"triton_enable_empty_final_response", true});
    REQUIRE(d.inputs.size() == 7);

    // The prompt is exactly what render_chat_prompt writes.
    client_body c;
    const request_fields& f = c.read(endpoint::chat_completions, body);
    char prompt[1024];
    sluice::text_writer tw(prompt, sizeof prompt);
    request_error err;
    REQUIRE(render_chat_prompt(chat_template{}, f, tw, err));
    const tensor& t = d.input("text_input");
    CHECK(t.datatype == "BYTES");
    CHECK(t.shape == std::vector<int64_t>{1});
    CHECK(bytes_elements(t.raw) == std::vector<std::string>{std::string(prompt, tw.p)});

    check_bool_input(d, "stream", {1});  // always: sluice streams from Triton
    check_bool_input(d, "exclude_input_in_output", {1});
    check_bool_input(d, "return_finish_reason", {1});
    check_bool_input(d, "return_num_input_tokens", {1});
    check_bool_input(d, "return_num_output_tokens", {1});

    const tensor& sp = d.input("sampling_parameters");
    CHECK(sp.datatype == "BYTES");
    CHECK(sp.shape == std::vector<int64_t>{1});
    const std::vector<std::string> json = bytes_elements(sp.raw);
    REQUIRE(json.size() == 1);
    simdjson::dom::parser& parser = json_parser();
    element root;
    REQUIRE(parser.parse(json[0]).get(root) == simdjson::SUCCESS);
    CHECK(int64_t(root["max_tokens"]) == 32);
    CHECK(double(root["temperature"]) == 0.5);
    CHECK(double(root["top_p"]) == 0.9);
    CHECK(int64_t(root["seed"]) == 7);
    CHECK(double(root["presence_penalty"]) == 0.25);
    CHECK(int64_t(root["frequency_penalty"]) == -1);
    simdjson::dom::array stop = root["stop"];
    REQUIRE(stop.size() == 2);
    CHECK(std::string_view(stop.at(0)) == "a");
    CHECK(std::string_view(stop.at(1)) == "\n");
    CHECK(simdjson::dom::object(root).size() == 7);
  }

  TEST_CASE("a vLLM-flavour completions request sends the prompt as it is and the group's default max_tokens") {
    SUBCASE("a string") {
      const decoded_request d =
          written(triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"Once upon","stop":"."})");
      CHECK(bytes_elements(d.input("text_input").raw) == std::vector<std::string>{"Once upon"});
      const std::vector<std::string> json = bytes_elements(d.input("sampling_parameters").raw);
      CHECK(json == std::vector<std::string>{R"({"max_tokens":100,"stop":["."]})"});
    }
    SUBCASE("an array of one string") {
      const decoded_request d =
          written(triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":["x y"],"max_tokens":5})");
      CHECK(bytes_elements(d.input("text_input").raw) == std::vector<std::string>{"x y"});
      CHECK(bytes_elements(d.input("sampling_parameters").raw) == std::vector<std::string>{R"({"max_tokens":5})"});
    }
  }

  TEST_CASE("a TensorRT-LLM request has [1,1] tensors, FP32 sampling, UINT64 seed and [1,N] stop words") {
    const decoded_request d = written(
        triton_flavor::trtllm, endpoint::chat_completions,
        R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":64,)"
        R"("temperature":0.7,"top_p":1,"seed":18446744073709551615,"stop":["x","yz"],"frequency_penalty":0.5})");
    REQUIRE(d.bool_params.size() == 1);
    CHECK(d.bool_params[0].first == "triton_enable_empty_final_response");
    const std::vector<int64_t> one_by_one{1, 1};
    const tensor& t = d.input("text_input");
    CHECK(t.datatype == "BYTES");
    CHECK(t.shape == one_by_one);
    CHECK(bytes_elements(t.raw) ==
          std::vector<std::string>{"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"});
    const tensor& mt = d.input("max_tokens");
    CHECK(mt.datatype == "INT32");
    CHECK(mt.shape == one_by_one);
    CHECK(mt.raw.size() == 4);
    CHECK(le(mt.raw) == 64);
    check_bool_input(d, "stream", one_by_one);
    const tensor& temp = d.input("temperature");
    CHECK(temp.datatype == "FP32");
    CHECK(temp.shape == one_by_one);
    CHECK(std::bit_cast<float>(static_cast<uint32_t>(le(temp.raw))) == 0.7f);
    CHECK(std::bit_cast<float>(static_cast<uint32_t>(le(d.input("top_p").raw))) == 1.0f);
    CHECK(std::bit_cast<float>(static_cast<uint32_t>(le(d.input("frequency_penalty").raw))) == 0.5f);
    CHECK_FALSE(d.has("presence_penalty"));
    const tensor& seed = d.input("random_seed");
    CHECK(seed.datatype == "UINT64");
    CHECK(seed.shape == one_by_one);
    CHECK(le(seed.raw) == UINT64_MAX);
    const tensor& stops = d.input("stop_words");
    CHECK(stops.datatype == "BYTES");
    CHECK(stops.shape == std::vector<int64_t>{1, 2});
    CHECK(bytes_elements(stops.raw) == std::vector<std::string>{"x", "yz"});
    CHECK_FALSE(d.has("sampling_parameters"));
    CHECK(d.inputs.size() == 8);
  }

  TEST_CASE("a TensorRT-LLM completions request with no sampling members has the three inputs") {
    const decoded_request d = written(triton_flavor::trtllm, endpoint::completions, R"({"model":"m","prompt":"p"})");
    REQUIRE(d.inputs.size() == 3);
    CHECK(d.inputs[0].name == "text_input");
    CHECK(d.inputs[1].name == "max_tokens");
    CHECK(le(d.inputs[1].raw) == 100);
    CHECK(d.inputs[2].name == "stream");
  }

  TEST_CASE("harmless members pass: tool_choice none, response_format text, logprobs false") {
    const decoded_request d = written(
        triton_flavor::vllm, endpoint::chat_completions,
        R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"none",)"
        R"("response_format":{"type":"text"},"logprobs":false,"top_logprobs":0,"n":1,"temperature":null})");
    CHECK(bytes_elements(d.input("sampling_parameters").raw) == std::vector<std::string>{R"({"max_tokens":100})"});
  }

  TEST_CASE("what a text model cannot do is refused, naming the member") {
    struct refusal {
      triton_flavor flavor;
      endpoint e;
      std::string_view body;
      std::string_view param;
    };
    constexpr std::string_view m = R"("messages":[{"role":"user","content":"hi"}])";
    const std::string chat = std::string(R"({"model":"m",)") + std::string(m);
    const std::vector<refusal> cases = {
        {triton_flavor::vllm, endpoint::embeddings, R"({"model":"m","input":"x"})", ""},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]})",
         "tools"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"required"})", "tool_choice"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"function"}})",
         "tool_choice"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{}}})",
         "response_format"},
        {triton_flavor::trtllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})",
         "response_format"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true})", "logprobs"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","logprobs":2})", "logprobs"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"top_logprobs":3})", "top_logprobs"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
         "messages"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"user","content":"hi"}],"n":2})", "n"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","best_of":3})", "best_of"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":[1,2,3]})", "prompt"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":["a","b"]})", "prompt"},
        {triton_flavor::trtllm, endpoint::completions, R"({"model":"m","prompt":[[1,2]]})", "prompt"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","temperature":"hot"})",
         "temperature"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","temperature":-0.1})",
         "temperature"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","top_p":0})", "top_p"},
        {triton_flavor::trtllm, endpoint::completions, R"({"model":"m","prompt":"p","presence_penalty":3})",
         "presence_penalty"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","stop":5})", "stop"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","stop":["a",""]})", "stop"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","seed":1.5})", "seed"},
        {triton_flavor::trtllm, endpoint::completions, R"({"model":"m","prompt":"p","seed":-1})", "seed"},
        {triton_flavor::vllm, endpoint::completions, R"({"model":"m","prompt":"p","seed":18446744073709551615})",
         "seed"},
        {triton_flavor::vllm, endpoint::chat_completions,
         R"({"model":"m","messages":[{"role":"tool","content":"r","tool_call_id":"c"}]})", "messages"},
    };
    for (const refusal& c : cases) {
      INFO(c.body);
      const request_error err = refused(c.flavor, c.e, c.body);
      CHECK(err.param == c.param);
    }
    const std::string many_stops = std::string(R"({"model":"m","prompt":"p","stop":[)") +
                                   R"("1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})";
    CHECK(refused(triton_flavor::vllm, endpoint::completions, many_stops).param == "stop");
    CHECK(refused(triton_flavor::vllm, endpoint::chat_completions, chat + R"(,"tools":[{"type":"function"}]})")
              .message.find("'tools'") != std::string_view::npos);
  }

  TEST_CASE("a prompt longer than the first guess is rendered in more room, and past the bound refused") {
    std::string body = R"({"model":"m","messages":[{"role":"user","content":[)";
    for (int i = 0; i < 1000; ++i) body += std::string(i ? "," : "") + R"({"type":"text","text":"a"})";
    body += "]}]}";
    client_body c;
    const request_fields& f = c.read(endpoint::chat_completions, body);
    std::string out;
    request_error err;
    triton_request_writer roomy;
    REQUIRE(roomy.write(options(triton_flavor::vllm), f, endpoint::chat_completions, out, err));
    const decoded_request d = decode(out);
    const std::vector<std::string> prompt = bytes_elements(d.input("text_input").raw);
    REQUIRE(prompt.size() == 1);
    CHECK(prompt[0].find("aa") == std::string::npos);  // joined with "\n"
    CHECK(prompt[0].size() > 1999);
    triton_request_writer tight(200);
    CHECK_FALSE(tight.write(options(triton_flavor::vllm), f, endpoint::chat_completions, out, err));
    CHECK(err.param == "messages");
  }
}

TEST_SUITE("openai::triton_stream") {
  TEST_CASE("a stream chat reply is vLLM's chunk sequence, byte for byte") {
    for (bool include_usage : {false, true}) {
      CAPTURE(include_usage);
      triton_reply_context ctx = chat_ctx;
      ctx.include_usage = include_usage;
      triton_stream s;
      s.reset(ctx);
      stream_response first = text("tok0", 1);
      first.num_input_tokens = 5;
      // vLLM's stop by EOS: a last response with no text (EOS decodes to "").
      stream_response last = text("", 1, "stop");
      last.num_input_tokens = 5;
      last.has_final_response = last.final_response = true;
      const std::string got = feed_all(s, {first, text(" tok1", 1), last});

      CHECK(got.size() > 600);
      CHECK(got == vllm_stream(mock_vllm::endpoint::chat, "chatcmpl-req", "qwen", 2, false,
                               include_usage ? std::optional(mock_vllm::usage_counts{5, 3}) : std::nullopt));
      CHECK(s.done());
      CHECK(s.outcome().prompt_tokens == 5);
      CHECK(s.outcome().completion_tokens == 3);
      CHECK(s.outcome().counted_by_backend);
      CHECK(s.outcome().content_seen);
      CHECK(s.outcome().finish_reason == "stop");
      char buf[64];
      CHECK(s.feed(final_empty(), buf, sizeof buf).status == triton_stream_status::ended);
    }
  }

  TEST_CASE("the finish reason rides on the last text, as vLLM's length finish does") {
    for (auto [kind, mock_kind, id] :
         {std::tuple{endpoint::chat_completions, mock_vllm::endpoint::chat, "chatcmpl-req"},
          std::tuple{endpoint::completions, mock_vllm::endpoint::completion, "cmpl-req"}}) {
      triton_reply_context ctx = chat_ctx;
      ctx.kind = kind;
      ctx.include_usage = true;
      triton_stream s;
      s.reset(ctx);
      stream_response first = text("tok0", 1);
      first.num_input_tokens = 2;
      stream_response last = text(" tok1", 1, "length");
      last.has_final_response = last.final_response = true;
      const std::string got = feed_all(s, {first, last});
      CHECK(got == vllm_stream(mock_kind, id, "qwen", 2, true, mock_vllm::usage_counts{2, 2}));
      CHECK(s.outcome().finish_reason == "length");
    }
  }

  TEST_CASE("a stream completions reply is vLLM's, with no role chunk, ended by the empty final response") {
    triton_reply_context ctx = completions_ctx;
    ctx.include_usage = true;
    triton_stream s;
    s.reset(ctx);
    stream_response first = text("tok0", 1);
    first.num_input_tokens = 3;
    const std::string got = feed_all(s, {first, text(" tok1", 1), text("", 0), final_empty()});

    CHECK(got == vllm_stream(mock_vllm::endpoint::completion, "cmpl-req", "qwen", 2, false, mock_vllm::usage_counts{3, 2}));
  }

  TEST_CASE("finish reasons map to OpenAI's; None is not an end") {
    struct mapping {
      std::string_view triton;
      std::string_view openai;
    };
    for (mapping m : {mapping{"stop", "stop"}, mapping{"length", "length"}, mapping{"abort", "abort"},
                      mapping{"eos", "stop"}}) {
      triton_stream s;
      s.reset(chat_ctx);
      char buf[4096];
      CHECK(s.feed(text("x", 1, "None"), buf, sizeof buf).status == triton_stream_status::ok);
      CHECK_FALSE(s.done());
      triton_stream_result r = s.feed(text("", 0, m.triton), buf, sizeof buf);
      REQUIRE(r.status == triton_stream_status::ok);
      CHECK(s.done());
      CHECK(s.outcome().finish_reason == m.openai);
      const std::string_view events(buf, r.written);
      CHECK(events.find(std::string("\"finish_reason\":\"") + std::string(m.openai) + "\"") != std::string_view::npos);
    }
  }

  TEST_CASE("a non-stream chat body is vLLM's, byte for byte") {
    std::string acc;
    triton_stream s;
    s.reset(chat_ctx, &acc);
    stream_response first = text("tok0", 1);
    first.num_input_tokens = 5;
    stream_response last = text(" tok1", 1, "stop");
    last.has_final_response = last.final_response = true;
    CHECK(feed_all(s, {first, last}).empty());
    CHECK(acc == "tok0 tok1");
    REQUIRE(s.done());
    std::string body(s.body_bytes_max(), '\0');
    triton_stream_result r = s.write_body(body.data(), body.size());
    REQUIRE(r.status == triton_stream_status::ok);
    body.resize(r.written);
    CHECK(body.size() > 300);
    std::string expected;
    mock_vllm::append_chat_body(expected, "chatcmpl-req", 1700000000, "qwen", 2, false, {5, 2});
    CHECK(body == expected);
  }

  TEST_CASE("a non-stream reply's text is bounded: past k_reply_text_bytes_max it is too_large, state kept") {
    // A backend that never says final and keeps sending text (review F4):
    // once grew the text without bound, and a bad_alloc escaped noexcept.
    std::string acc;
    triton_stream s;
    s.reset(chat_ctx, &acc);
    const std::string piece(64u << 10, 'x');
    stream_response r = text(piece, 1);
    char out[64];
    size_t fed = 0;
    triton_stream_result res;
    while ((res = s.feed(r, out, sizeof out)).status == triton_stream_status::ok) fed += piece.size();
    CHECK(res.status == triton_stream_status::too_large);
    CHECK(fed == k_reply_text_bytes_max);
    CHECK(acc.size() == k_reply_text_bytes_max);
    CHECK_FALSE(s.done());
    CHECK(s.feed(r, out, sizeof out).status == triton_stream_status::too_large);
  }

  TEST_CASE("a non-stream completions body is vLLM's, byte for byte, also when ended by length") {
    std::string acc;
    triton_stream s;
    s.reset(completions_ctx, &acc);
    stream_response first = text("tok0", 1);
    first.num_input_tokens = 4;
    CHECK(feed_all(s, {first, text(" tok1", 1, "length")}).empty());
    std::string body(s.body_bytes_max(), '\0');
    triton_stream_result r = s.write_body(body.data(), body.size());
    REQUIRE(r.status == triton_stream_status::ok);
    body.resize(r.written);
    std::string expected;
    mock_vllm::append_completion_body(expected, "cmpl-req", 1700000000, "qwen", 2, true, {4, 2});
    CHECK(body == expected);
  }

  TEST_CASE("text is escaped in chunks and bodies") {
    triton_stream s;
    s.reset(chat_ctx);
    const std::string got = feed_all(s, {text("a\"b\\c\n\x01")});
    const size_t at = got.rfind("data: ");
    simdjson::dom::parser& parser = json_parser();
    element root;
    const std::string event = got.substr(at + 6, got.size() - at - 8);
    REQUIRE(parser.parse(event).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["choices"].at(0)["delta"]["content"]) == "a\"b\\c\n\x01");
  }

  TEST_CASE("need_space leaves the state as it was; a retry with room writes the same bytes") {
    triton_reply_context ctx = chat_ctx;
    ctx.include_usage = true;
    triton_stream a;
    triton_stream b;
    a.reset(ctx);
    b.reset(ctx);
    stream_response r = text("hello", 2, "stop");
    r.num_input_tokens = 9;
    char small[100];
    triton_stream_result miss = a.feed(r, small, sizeof small);
    CHECK(miss.status == triton_stream_status::need_space);
    CHECK(miss.written == 0);
    CHECK(miss.needed > sizeof small);
    CHECK(miss.needed <= a.event_bytes_max(r));
    CHECK_FALSE(a.done());
    CHECK(a.outcome().prompt_tokens == -1);
    CHECK(a.outcome().completion_tokens == 0);
    CHECK_FALSE(a.outcome().content_seen);
    std::string room(miss.needed, '\0');
    triton_stream_result hit = a.feed(r, room.data(), room.size());
    REQUIRE(hit.status == triton_stream_status::ok);
    CHECK(hit.written == miss.needed);
    CHECK(room == feed_all(b, {r}));
    CHECK(a.done());
    CHECK(a.outcome().completion_tokens == 2);

    triton_stream c;
    c.reset(ctx);
    CHECK(c.finish(small, 10).status == triton_stream_status::need_space);
    CHECK_FALSE(c.done());
  }

  TEST_CASE("an error_message mid-stream is an error event and [DONE]") {
    triton_stream s;
    s.reset(chat_ctx);
    stream_response err;
    err.error_message = "engine died: \"oom\"";
    const std::string got = feed_all(s, {text("partial"), err});
    CHECK(s.done());
    CHECK(s.outcome().finish_reason == "error");
    CHECK(s.outcome().error_message == err.error_message);
    const std::string_view tail = "data: [DONE]\n\n";
    REQUIRE(got.size() > tail.size());
    CHECK(got.substr(got.size() - tail.size()) == tail);
    const size_t at = got.rfind("data: {\"error\"");
    REQUIRE(at != std::string::npos);
    const std::string event = got.substr(at + 6, got.size() - tail.size() - at - 8);
    simdjson::dom::parser& parser = json_parser();
    element root;
    REQUIRE(parser.parse(event).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["error"]["message"]) == err.error_message);
    CHECK(std::string_view(root["error"]["type"]) == "server_error");
    CHECK(root["error"]["param"].is_null());
    CHECK(int64_t(root["error"]["code"]) == 502);
    CHECK(event == R"({"error":{"message":"engine died: \"oom\"","type":"server_error","param":null,"code":502}})");

    SUBCASE("as the first response, after the role chunk") {
      triton_stream t;
      t.reset(chat_ctx);
      const std::string first = feed_all(t, {err});
      CHECK(first.find("\"role\":\"assistant\"") < first.find("{\"error\""));
    }
    SUBCASE("in accumulate mode the caller answers 502") {
      std::string acc;
      triton_stream t;
      t.reset(chat_ctx, &acc);
      char buf[512];
      CHECK(t.feed(text("x"), buf, sizeof buf).status == triton_stream_status::ok);
      CHECK(t.feed(err, buf, sizeof buf).status == triton_stream_status::failed);
      CHECK(t.done());
      const size_t n = triton_error_body(t.outcome().error_message, buf, sizeof buf);
      CHECK(std::string_view(buf, n) ==
            R"({"error":{"message":"engine died: \"oom\"","type":"server_error","param":null,"code":null}})");
    }
  }

  TEST_CASE("a stream closed by OK trailers alone is finished by finish()") {
    triton_reply_context ctx = chat_ctx;
    ctx.include_usage = true;
    triton_stream s;
    s.reset(ctx);
    std::string got = feed_all(s, {text("tok0")});
    CHECK_FALSE(s.done());
    char buf[4096];
    triton_stream_result r = s.finish(buf, sizeof buf);
    REQUIRE(r.status == triton_stream_status::ok);
    got.append(buf, r.written);
    CHECK(s.done());
    CHECK(s.finish(buf, sizeof buf).status == triton_stream_status::ended);

    // No counts: a piece is a token.
    CHECK(got == vllm_stream(mock_vllm::endpoint::chat, "chatcmpl-req", "qwen", 1, false, mock_vllm::usage_counts{0, 1}));

    SUBCASE("with nothing before it, a chat stream still opens with the role chunk") {
      triton_stream t;
      t.reset(chat_ctx);
      r = t.finish(buf, sizeof buf);
      REQUIRE(r.status == triton_stream_status::ok);
      CHECK(std::string_view(buf, r.written).find("\"role\":\"assistant\"") != std::string_view::npos);
    }
  }

  TEST_CASE("TensorRT-LLM's count-less responses: prompt tokens unknown, a token per non-empty text") {
    std::string acc;
    triton_stream s;
    s.reset(completions_ctx, &acc);
    stream_response a;
    a.has_text_output = true;
    a.text_output = "Hel";
    stream_response b = a;
    b.text_output = "lo";
    stream_response empty = a;
    empty.text_output = "";
    CHECK(feed_all(s, {a, empty, b, final_empty()}).empty());
    CHECK(s.done());
    CHECK(s.outcome().prompt_tokens == -1);
    CHECK(s.outcome().completion_tokens == 2);
    CHECK_FALSE(s.outcome().counted_by_backend);
    CHECK(s.outcome().finish_reason == "stop");
    CHECK(acc == "Hello");
  }

  TEST_CASE("reset starts over") {
    std::string acc = "stale";
    triton_stream s;
    s.reset(chat_ctx, &acc);
    CHECK(acc.empty());
    (void)feed_all(s, {text("a", 1, "stop")});
    CHECK(s.done());
    s.reset(chat_ctx);
    CHECK_FALSE(s.done());
    CHECK(s.outcome().completion_tokens == 0);
    CHECK(feed_all(s, {text("b")}).find("\"role\"") != std::string::npos);
  }
}

TEST_SUITE("openai::triton_errors") {
  TEST_CASE("gRPC statuses map to OpenAI answers") {
    struct row {
      uint32_t code;
      uint16_t status;
      bool retryable;
      std::string_view type;
      std::string_view code_field;  // "null" or the quoted code
    };
    const row rows[] = {
        {0, 502, false, "server_error", "null"},          {1, 502, false, "server_error", "null"},
        {2, 502, false, "server_error", "null"},          {3, 400, false, "invalid_request_error", "null"},
        {4, 504, false, "server_error", "null"},          {5, 404, false, "invalid_request_error", "\"model_not_found\""},
        {7, 502, false, "server_error", "null"},          {8, 429, false, "requests", "\"rate_limit_exceeded\""},
        {9, 502, false, "server_error", "null"},          {11, 400, false, "invalid_request_error", "null"},
        {12, 502, false, "server_error", "null"},         {13, 502, false, "server_error", "null"},
        {14, 503, true, "server_error", "null"},          {16, 502, false, "server_error", "null"},
        {99, 502, false, "server_error", "null"},
    };
    for (const row& r : rows) {
      CAPTURE(r.code);
      char out[512];
      const grpc_error_answer a = grpc_status_to_openai(r.code, "model%20%22x%22 failed", out, sizeof out);
      CHECK(a.status == r.status);
      CHECK(a.retryable == r.retryable);
      simdjson::dom::parser& parser = json_parser();
      element root;
      REQUIRE(parser.parse(out, a.written).get(root) == simdjson::SUCCESS);
      CHECK(std::string_view(root["error"]["type"]) == r.type);
      const std::string code = simdjson::to_string(root["error"]["code"]);
      CHECK(code == r.code_field);
      const std::string_view message = root["error"]["message"];
      if (r.code == 7 || r.code == 16 || r.code == 0) {
        CHECK(message.find("model") == std::string_view::npos);  // the backend's words are not shown
      } else {
        CHECK(message == "model \"x\" failed");
      }
    }
  }

  TEST_CASE("an empty grpc-message takes the status's default; a long one is cut") {
    char out[512];
    grpc_error_answer a = grpc_status_to_openai(14, "", out, sizeof out);
    CHECK(std::string_view(out, a.written).find("No backend is available") != std::string_view::npos);
    const std::string long_message(5000, 'z');
    a = grpc_status_to_openai(13, long_message, out, sizeof out);
    simdjson::dom::parser& parser = json_parser();
    element root;
    REQUIRE(parser.parse(out, a.written).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["error"]["message"]).size() <= 400);
  }

  TEST_CASE("percent_decode undoes grpc-message's encoding and leaves stray percents") {
    struct c {
      std::string_view in;
      std::string_view out;
    };
    for (c x : {c{"plain", "plain"}, c{"a%20b", "a b"}, c{"%25", "%"}, c{"%e2%82%AC", "\xe2\x82\xac"},
                c{"100%", "100%"}, c{"%4", "%4"}, c{"%zz1", "%zz1"}, c{"%0A%00x", "\n\0x"sv}}) {
      char buf[32];
      const size_t n = percent_decode(x.in, buf, sizeof buf);
      CHECK(std::string_view(buf, n) == x.out);
    }
    char two[2];
    CHECK(percent_decode("%41%42%43", two, sizeof two) == 2);
    CHECK(std::string_view(two, 2) == "AB");
  }
}
