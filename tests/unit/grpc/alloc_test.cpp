// Encoding a request and decoding stream responses -- once per token on
// the hot path -- never call the allocator (STYLE.md §4).
#include <doctest/doctest.h>

#include <array>
#include <string_view>

#include "../alloc_counter.hpp"
#include "sluice/grpc/kserve.hpp"

using namespace sluice::grpc;
using namespace std::literals;

TEST_SUITE("grpc::allocation") {
  TEST_CASE("encode, frame and decode allocate nothing") {
    const std::array<std::string_view, 1> prompt{"hello"};
    const std::array<infer_parameter, 1> params{
        infer_parameter::of_bool("triton_enable_empty_final_response", true)};
    const std::array<infer_input, 2> inputs{infer_input::of_bytes("text_input", prompt),
                                            infer_input::of_bool("stream", true)};
    infer_request r;
    r.model_name = "m";
    r.parameters = params;
    r.inputs = inputs;
    // outputs { name: "text_output" } raw_output_contents: "\2\0\0\0hi"
    const std::string_view response =
        "\x12\x17\x2a\x0d\x0a\x0btext_output" "\x32\x06\x02\x00\x00\x00" "hi"sv;
    char buf[256];
    sluice::grpc::decode_memo memo;
    const size_t before = sluice::test::allocations();
    for (int i = 0; i < 100; ++i) {
      const size_t n = encode_frame(r, buf, sizeof buf);
      frame f;
      CHECK(read_frame(std::string_view(buf, n), 1024, f) == decode_status::ok);
      stream_response out;
      CHECK(decode_stream_response(response, out) == decode_status::ok);
      CHECK(out.text_output == "hi");
      CHECK(decode_stream_response(response, out, memo) == decode_status::ok);
      CHECK(out.text_output == "hi");
    }
    CHECK(memo.hits == 99);
    CHECK(sluice::test::allocations() == before);
  }
}
