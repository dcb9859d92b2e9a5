// The readiness RPCs' messages: request frames byte for byte (the bytes
// protoc writes for the same ModelReadyRequest), and response decoding.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "sluice/grpc/kserve.hpp"

using sluice::grpc::decode_status;
using namespace std::literals;

TEST_SUITE("grpc::ready") {
  TEST_CASE("ServerReadyRequest is a frame of zero bytes") {
    char out[8];
    REQUIRE(sluice::grpc::encode_server_ready_frame(out, sizeof out) == 5);
    CHECK(std::string_view(out, 5) == "\0\0\0\0\0"sv);
    CHECK(sluice::grpc::encode_server_ready_frame(out, 4) == 0);
  }

  TEST_CASE("ModelReadyRequest carries the name and, when set, the version") {
    char out[64];
    SUBCASE("name only: version left out as protoc leaves it") {
      const size_t n = sluice::grpc::encode_model_ready_frame("mock-model", "", out, sizeof out);
      CHECK(std::string_view(out, n) == "\0\0\0\0\x0c\x0a\x0amock-model"sv);
    }
    SUBCASE("name and version") {
      const size_t n = sluice::grpc::encode_model_ready_frame("m", "3", out, sizeof out);
      CHECK(std::string_view(out, n) == "\0\0\0\0\x06\x0a\x01m\x12\x01" "3"sv);
    }
    SUBCASE("a buffer one byte short gets nothing") {
      const size_t need = sluice::grpc::model_ready_frame_bytes("mock-model", "");
      CHECK(need == 17);
      CHECK(sluice::grpc::encode_model_ready_frame("mock-model", "", out, need - 1) == 0);
    }
  }

  TEST_CASE("a ready response reads ready = 1, absent ready as false, and skips unknown fields") {
    bool ready = true;
    CHECK(sluice::grpc::decode_ready_response("\x08\x01"sv, ready) == decode_status::ok);
    CHECK(ready);
    CHECK(sluice::grpc::decode_ready_response(""sv, ready) == decode_status::ok);
    CHECK_FALSE(ready);
    CHECK(sluice::grpc::decode_ready_response("\x08\x00"sv, ready) == decode_status::ok);
    CHECK_FALSE(ready);
    // unknown string field 2, then ready; the last ready wins
    CHECK(sluice::grpc::decode_ready_response("\x12\x02hi\x08\x00\x08\x01"sv, ready) == decode_status::ok);
    CHECK(ready);
    // ready sent as a length-delimited field is unknown, so false
    CHECK(sluice::grpc::decode_ready_response("\x0a\x01x"sv, ready) == decode_status::ok);
    CHECK_FALSE(ready);
  }

  TEST_CASE("a malformed ready response says why and is not ready") {
    bool ready = true;
    CHECK(sluice::grpc::decode_ready_response("\x08"sv, ready) == decode_status::truncated);
    CHECK_FALSE(ready);
    CHECK(sluice::grpc::decode_ready_response("\x12\x05hi"sv, ready) != decode_status::ok);
  }
}
