// KServe v2 messages: the request encoder against protoc's bytes, the
// stream-response decoder against protoc's bytes, unknown fields, and
// malformed input.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/grpc/kserve.hpp"

using sluice::grpc::decode_status;
using sluice::grpc::infer_input;
using sluice::grpc::infer_parameter;
using sluice::grpc::infer_request;
using sluice::grpc::stream_response;
using sluice::grpc::wire_writer;
using namespace std::literals;

namespace {

std::string read_file(const std::string& path) {
  // stdio, not ifstream: GCC 12's -Wnull-dereference fires inside streambuf.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE_MESSAGE(f != nullptr, "cannot open ", path);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// The golden files: the committed ones, and protoc's fresh output when the
// build ran protoc (both must agree).
std::string golden(const char* name) {
  std::string committed = read_file(std::string(SLUICE_GOLDEN_DIR) + "/" + name);
#ifdef SLUICE_PROTOC_DIR
  CHECK_MESSAGE(read_file(std::string(SLUICE_PROTOC_DIR) + "/" + name) == committed,
                std::string(name), " is stale: regenerate it with the command in meson.build");
#endif
  return committed;
}

// The request of golden/vllm_request.txtpb, as an adapter would build it.
struct vllm_request {
  std::array<std::string_view, 1> prompt{"hello"};
  std::array<std::string_view, 1> sampling{R"({"max_tokens": 16})"};
  std::array<int64_t, 2> shape_1x1{1, 1};
  std::array<infer_parameter, 3> params{
      infer_parameter::of_bool("triton_enable_empty_final_response", true),
      infer_parameter::of_int64("priority", -3),
      infer_parameter::of_string("tag", ""),
  };
  std::array<infer_parameter, 1> input_params{infer_parameter::of_bool("k", false)};
  std::array<infer_input, 4> inputs{};
  infer_request request{};

  vllm_request() {
    inputs[0] = infer_input::of_bytes("text_input", prompt);
    inputs[1] = infer_input::of_bool("stream", true);
    inputs[2] = infer_input::of_bytes("sampling_parameters", sampling);
    inputs[3] = infer_input::of_int32("max_tokens", 16);
    inputs[3].shape = shape_1x1;
    inputs[3].parameters = input_params;
    request.model_name = "qwen2.5-7b";
    request.id = "req-42";
    request.parameters = params;
    request.inputs = inputs;
  }
};

std::string encode(const infer_request& r) {
  std::string out(sluice::grpc::encoded_size(r), '\0');
  const size_t n = sluice::grpc::encode(r, out.data(), out.size());
  REQUIRE(n == out.size());
  return out;
}

}  // namespace

TEST_SUITE("grpc::kserve request") {
  TEST_CASE("a vLLM-flavour request encodes to protoc's bytes") {
    vllm_request v;
    CHECK(encode(v.request) == golden("vllm_request.bin"));
  }

  TEST_CASE("encode refuses a buffer one byte short and writes nothing past it") {
    vllm_request v;
    const size_t n = sluice::grpc::encoded_size(v.request);
    std::string buf(n + 8, '#');
    CHECK(sluice::grpc::encode(v.request, buf.data(), n - 1) == 0);
    CHECK(buf.substr(n - 1) == std::string(9, '#'));
  }

  TEST_CASE("encode_frame puts the 5-byte prefix before the message") {
    vllm_request v;
    const std::string message = encode(v.request);
    std::string buf(message.size() + 5, '\0');
    REQUIRE(sluice::grpc::encode_frame(v.request, buf.data(), buf.size()) == buf.size());
    sluice::grpc::frame f;
    REQUIRE(sluice::grpc::read_frame(buf, 1 << 20, f) == decode_status::ok);
    CHECK(f.message == message);
    CHECK(sluice::grpc::encode_frame(v.request, buf.data(), buf.size() - 1) == 0);
  }

  TEST_CASE("empty strings are left out as protoc leaves them") {
    infer_request r;
    CHECK(sluice::grpc::encoded_size(r) == 0);
    r.model_name = "m";
    CHECK(encode(r) == "\x0a\x01m"sv);
  }

  TEST_CASE("a BYTES tensor with two elements has a length before each") {
    std::array<std::string_view, 2> words{"ab", ""};
    std::array<infer_input, 1> in{infer_input::of_bytes("stop_words", words)};
    infer_request r;
    r.inputs = in;
    const std::string bytes = encode(r);
    // inputs { name datatype shape: 2 }, then raw_input_contents
    CHECK(bytes.ends_with("\x3a\x0a\x02\x00\x00\x00" "ab" "\x00\x00\x00\x00"sv));
    CHECK(bytes.find("\x1a\x01\x02"sv) != std::string::npos);
  }
}

TEST_SUITE("grpc::kserve stream response") {
  TEST_CASE("protoc's stream response decodes to its outputs and final flag") {
    const std::string bytes = golden("stream_response.bin");
    stream_response r;
    REQUIRE(sluice::grpc::decode_stream_response(bytes, r) == decode_status::ok);
    CHECK(r.error_message.empty());
    CHECK(r.model_name == "vllm_model");
    CHECK(r.model_version == "1");
    CHECK(r.id == "req-42");
    CHECK(r.has_text_output);
    CHECK(r.text_output == " world");
    CHECK(r.finish_reason == "stop");
    CHECK(r.num_input_tokens == 11);
    CHECK(r.num_output_tokens == 263);
    CHECK(r.has_final_response);
    CHECK(r.final_response);
  }

  TEST_CASE("every truncation of a valid response is an error, never a crash") {
    const std::string bytes = golden("stream_response.bin");
    for (size_t n = 1; n < bytes.size(); ++n) {
      CAPTURE(n);
      stream_response r;
      CHECK(sluice::grpc::decode_stream_response(std::string_view(bytes).substr(0, n), r) !=
            decode_status::ok);
    }
  }

  TEST_CASE("an error_message is read") {
    stream_response r;
    REQUIRE(sluice::grpc::decode_stream_response("\x0a\x04oops"sv, r) == decode_status::ok);
    CHECK(r.error_message == "oops");
    CHECK_FALSE(r.has_text_output);
  }

  // Builds a response with unknown fields of every wire type at each level.
  std::string with_unknown_fields() {
    std::string out(512, '\0');
    std::string tensor, entry, value, response;
    auto unknowns = [](wire_writer& w) {
      w.varint_field(90, 7);
      w.tag(91, sluice::grpc::wire_type::fixed64);
      w.raw("12345678");
      w.tag(92, sluice::grpc::wire_type::fixed32);
      w.raw("1234");
      w.bytes_field(93, "future");
      w.tag(94, sluice::grpc::wire_type::group_start);
      w.varint_field(1, 1);
      w.tag(94, sluice::grpc::wire_type::group_end);
    };
    auto build = [&](auto&& body) {
      wire_writer w(out.data(), out.size());
      body(w);
      REQUIRE(w.ok());
      return out.substr(0, w.written());
    };
    tensor = build([&](wire_writer& w) {
      unknowns(w);
      w.bytes_field(1, "text_output");
      w.bytes_field(2, "BYTES");
      w.tag(2, sluice::grpc::wire_type::varint);  // a known number, wrong type: skipped
      w.varint(3);
      unknowns(w);
    });
    value = build([&](wire_writer& w) {
      unknowns(w);
      w.varint_field(1, 1);
    });
    entry = build([&](wire_writer& w) {
      w.bytes_field(1, "triton_final_response");
      unknowns(w);
      w.bytes_field(2, value);
    });
    response = build([&](wire_writer& w) {
      unknowns(w);
      w.bytes_field(6, "\x02\x00\x00\x00hi"sv);  // raw contents before their output
      w.bytes_field(4, entry);
      w.bytes_field(5, tensor);
      unknowns(w);
    });
    return build([&](wire_writer& w) {
      unknowns(w);
      w.bytes_field(2, response);
      unknowns(w);
    });
  }

  TEST_CASE("unknown fields of every wire type are skipped at every level") {
    const std::string bytes = with_unknown_fields();
    stream_response r;
    REQUIRE(sluice::grpc::decode_stream_response(bytes, r) == decode_status::ok);
    CHECK(r.text_output == "hi");
    CHECK(r.final_response);
    CHECK(r.num_input_tokens == -1);
  }

  TEST_CASE("a nested message longer than its parent is over_long") {
    // infer_response claims 10 bytes; the frame holds 3.
    stream_response r;
    CHECK(sluice::grpc::decode_stream_response("\x12\x0a\x0a\x01m"sv, r) ==
          decode_status::over_long);
    // outputs inside infer_response claim more than infer_response holds
    CHECK(sluice::grpc::decode_stream_response("\x12\x04\x2a\x05\x0a\x01"sv, r) ==
          decode_status::over_long);
  }

  TEST_CASE("a BYTES element longer than its contents is bad_tensor") {
    // outputs { name: "text_output" } raw_output_contents: "\x09\0\0\0abc"
    std::string response = "\x2a\x0d\x0a\x0btext_output" "\x32\x07\x09\x00\x00\x00" "abc"s;
    std::string msg = "\x12"s + static_cast<char>(response.size()) + response;
    stream_response r;
    CHECK(sluice::grpc::decode_stream_response(msg, r) == decode_status::bad_tensor);
  }

  // --- the decode memo ---
  using sluice::grpc::decode_memo;

  // A token's response as a server writes it: the same names, parameters
  // and outputs every time, then the contents. `final`: the last one, with
  // finish_reason and the counts.
  std::string token_response(std::string_view text, bool final_response, uint32_t tokens) {
    std::string out(1024, '\0');
    auto build = [&](auto&& body) {
      wire_writer w(out.data(), out.size());
      body(w);
      REQUIRE(w.ok());
      return out.substr(0, w.written());
    };
    auto tensor = [&](std::string_view name, std::string_view type) {
      return build([&](wire_writer& w) {
        w.bytes_field(1, name);
        w.bytes_field(2, type);
        w.len_prefix(3, 1);
        w.varint(1);
      });
    };
    auto element = [](std::string_view s) {
      std::string e(4, '\0');
      for (size_t i = 0; i < 4; ++i) e[i] = static_cast<char>((s.size() >> (8 * i)) & 0xff);
      return e + std::string(s);
    };
    auto u32 = [](uint32_t v) {
      std::string e(4, '\0');
      for (size_t i = 0; i < 4; ++i) e[i] = static_cast<char>((v >> (8 * i)) & 0xff);
      return e;
    };
    const std::string value = build([&](wire_writer& w) { w.varint_field(1, final_response ? 1 : 0); });
    const std::string entry = build([&](wire_writer& w) {
      w.bytes_field(1, "triton_final_response");
      w.bytes_field(2, value);
    });
    const std::string text_t = tensor("text_output", "BYTES");
    const std::string finish_t = tensor("finish_reason", "BYTES");
    const std::string in_t = tensor("num_input_tokens", "UINT32");
    const std::string out_t = tensor("num_output_tokens", "INT64");
    const std::string response = build([&](wire_writer& w) {
      w.bytes_field(1, "vllm_model");
      w.bytes_field(2, "1");
      w.bytes_field(3, "req-7");
      w.bytes_field(4, entry);
      w.bytes_field(5, text_t);
      if (final_response) {
        w.bytes_field(5, finish_t);
        w.bytes_field(5, in_t);
        w.bytes_field(5, out_t);
      }
      w.bytes_field(6, element(text));
      if (final_response) {
        w.bytes_field(6, element("length"));
        w.bytes_field(6, u32(11));
        w.bytes_field(6, u32(tokens) + std::string(4, '\0'));
      }
    });
    return build([&](wire_writer& w) { w.bytes_field(2, response); });
  }

  void check_same(const stream_response& a, const stream_response& b) {
    CHECK(a.error_message == b.error_message);
    CHECK(a.model_name == b.model_name);
    CHECK(a.model_version == b.model_version);
    CHECK(a.id == b.id);
    CHECK(a.text_output == b.text_output);
    CHECK(a.finish_reason == b.finish_reason);
    CHECK(a.num_input_tokens == b.num_input_tokens);
    CHECK(a.num_output_tokens == b.num_output_tokens);
    CHECK(a.has_text_output == b.has_text_output);
    CHECK(a.has_finish_reason == b.has_finish_reason);
    CHECK(a.has_final_response == b.has_final_response);
    CHECK(a.final_response == b.final_response);
  }

  TEST_CASE("a stream's token responses are read from the memo, and read the same") {
    decode_memo memo;
    const char* words[] = {"Hello", ",", " world", "", " \xe4\xbd\xa0\xe5\xa5\xbd", "!"};
    for (uint32_t i = 0; i < 60; ++i) {
      CAPTURE(i);
      const std::string msg = token_response(words[i % 6], false, i);
      stream_response plain, memoed;
      REQUIRE(sluice::grpc::decode_stream_response(msg, plain) == decode_status::ok);
      REQUIRE(sluice::grpc::decode_stream_response(msg, memoed, memo) == decode_status::ok);
      check_same(plain, memoed);
      CHECK(memoed.text_output == words[i % 6]);
      // Views point into this message, not into the memo's copy.
      CHECK(memoed.model_name.data() >= msg.data());
      CHECK(memoed.model_name.data() < msg.data() + msg.size());
    }
    CHECK(memo.misses == 1);
    CHECK(memo.hits == 59);
    // The last response's parameters differ: decoded in full, and right.
    const std::string last = token_response("", true, 60);
    stream_response r;
    REQUIRE(sluice::grpc::decode_stream_response(last, r, memo) == decode_status::ok);
    CHECK(memo.misses == 2);
    CHECK(r.final_response);
    CHECK(r.finish_reason == "length");
    CHECK(r.num_input_tokens == 11);
    CHECK(r.num_output_tokens == 60);
  }

  TEST_CASE("with a memo or without, every input decodes the same (mutations, truncations, other shapes)") {
    // A deterministic stream of messages: token responses, the last ones,
    // each of them with a byte changed or cut short, and the golden and
    // unknown-field shapes, all through one memo.
    std::vector<std::string> bases{token_response("ab", false, 1), token_response("cde", false, 2),
                                   token_response("", true, 3), golden("stream_response.bin"),
                                   with_unknown_fields(), "\x0a\x04oops\x12\x00"s};
    decode_memo memo;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    auto next = [&] {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      return seed >> 33;
    };
    size_t oks = 0, errors = 0;
    for (int round = 0; round < 20000; ++round) {
      std::string msg = bases[next() % bases.size()];
      switch (next() % 4) {
        case 0: break;  // as it is (and a likely memo hit after a token)
        case 1: msg[next() % msg.size()] = static_cast<char>(next()); break;
        case 2: msg.resize(next() % msg.size()); break;
        case 3: msg[next() % msg.size()] ^= static_cast<char>(1u << (next() % 8)); break;
      }
      CAPTURE(round);
      stream_response plain, memoed;
      const decode_status a = sluice::grpc::decode_stream_response(msg, plain);
      const decode_status b = sluice::grpc::decode_stream_response(msg, memoed, memo);
      REQUIRE(a == b);
      if (a == decode_status::ok) {
        ++oks;
        check_same(plain, memoed);
      } else {
        ++errors;
      }
    }
    CHECK(memo.hits > 300);  // the memo path ran, on unmutated and raw-mutated tokens
    CHECK(oks > 1000);
    CHECK(errors > 1000);
  }
}
