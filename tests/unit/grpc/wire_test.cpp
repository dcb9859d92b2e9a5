// gRPC framing and the protobuf wire reader: every wire type skipped,
// every malformed shape named.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "sluice/grpc/wire.hpp"

using sluice::grpc::decode_status;
using sluice::grpc::frame;
using sluice::grpc::wire_field;
using sluice::grpc::wire_reader;
using sluice::grpc::wire_type;
using sluice::grpc::wire_writer;
using namespace std::literals;

TEST_SUITE("grpc::frame") {
  TEST_CASE("a frame header is a zero flag and a big-endian length") {
    char h[5];
    sluice::grpc::write_frame_header(h, 0x01020304);
    CHECK(std::string_view(h, 5) == "\x00\x01\x02\x03\x04"sv);
  }

  TEST_CASE("read_frame takes one whole frame and says where the next starts") {
    const std::string in = "\x00\x00\x00\x00\x03" "abc" "\x00\x00\x00\x00\x00"s;
    frame f;
    REQUIRE(sluice::grpc::read_frame(in, 1024, f) == decode_status::ok);
    CHECK(f.message == "abc");
    CHECK(f.consumed == 8);
    REQUIRE(sluice::grpc::read_frame(std::string_view(in).substr(8), 1024, f) == decode_status::ok);
    CHECK(f.message.empty());
    CHECK(f.consumed == 5);
  }

  TEST_CASE("a truncated frame needs more bytes") {
    frame f;
    CHECK(sluice::grpc::read_frame("\x00\x00\x00"sv, 1024, f) == decode_status::need_more);
    CHECK(sluice::grpc::read_frame("\x00\x00\x00\x00\x04" "abc"sv, 1024, f) ==
          decode_status::need_more);
  }

  TEST_CASE("a frame over the cap is refused before its bytes arrive") {
    frame f;
    CHECK(sluice::grpc::read_frame("\x00\x00\x01\x00\x00"sv, 1024, f) == decode_status::over_long);
    CHECK(sluice::grpc::read_frame("\x00\x00\x00\x04\x00"sv, 1024, f) == decode_status::need_more);
  }

  TEST_CASE("compressed and unknown flags are errors") {
    frame f;
    CHECK(sluice::grpc::read_frame("\x01\x00\x00\x00\x00"sv, 1024, f) == decode_status::compressed);
    CHECK(sluice::grpc::read_frame("\x02\x00\x00\x00\x00"sv, 1024, f) ==
          decode_status::bad_frame_flag);
  }
}

TEST_SUITE("grpc::wire") {
  TEST_CASE("varints round-trip at their size boundaries") {
    for (uint64_t v : {0ULL, 1ULL, 127ULL, 128ULL, 16383ULL, 16384ULL, ~0ULL}) {
      char buf[16];
      wire_writer w(buf, sizeof buf);
      w.varint_field(1, v);
      REQUIRE(w.ok());
      CHECK(w.written() == 1 + sluice::grpc::varint_bytes(v));
      wire_reader r(std::string_view(buf, w.written()));
      wire_field f;
      REQUIRE(r.next(f));
      CHECK(f.number == 1);
      CHECK(f.value == v);
      CHECK_FALSE(r.next(f));
      CHECK(r.status() == decode_status::ok);
    }
  }

  TEST_CASE("the writer stops at its capacity") {
    char buf[4];
    wire_writer w(buf, sizeof buf);
    w.bytes_field(1, "hello");
    CHECK_FALSE(w.ok());
  }

  TEST_CASE("fields of every wire type are read, groups skipped whole") {
    // 1: varint 150; 2: fixed64; 3: group { 4: varint 1, 5: group {} };
    // 6: fixed32; 7: len "hi"
    const std::string msg =
        "\x08\x96\x01"
        "\x11\x01\x02\x03\x04\x05\x06\x07\x08"
        "\x1b\x20\x01\x2b\x2c\x1c"
        "\x35\x01\x00\x00\x00"
        "\x3a\x02hi"s;
    wire_reader r(msg);
    wire_field f;
    REQUIRE(r.next(f));
    CHECK((f.number == 1 && f.value == 150));
    REQUIRE(r.next(f));
    CHECK((f.number == 2 && f.type == wire_type::fixed64 && f.value == 0x0807060504030201ULL));
    REQUIRE(r.next(f));
    CHECK((f.number == 6 && f.type == wire_type::fixed32 && f.value == 1));
    REQUIRE(r.next(f));
    CHECK((f.number == 7 && f.bytes == "hi"));
    CHECK_FALSE(r.next(f));
    CHECK(r.status() == decode_status::ok);
  }

  struct bad_case {
    const char* what;
    std::string bytes;
    decode_status expect;
  };

  TEST_CASE("malformed messages are named") {
    const bad_case cases[] = {
        {"varint cut short", "\x08\x96"s, decode_status::truncated},
        {"tag cut short", "\x80"s, decode_status::truncated},
        {"fixed64 cut short", "\x11\x01\x02\x03"s, decode_status::truncated},
        {"fixed32 cut short", "\x15\x01"s, decode_status::truncated},
        {"length past the message", "\x0a\x05" "abc"s, decode_status::over_long},
        {"11-byte varint", "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"s,
         decode_status::bad_varint},
        {"wire type 6", "\x0e"s, decode_status::bad_wire_type},
        {"wire type 7", "\x0f"s, decode_status::bad_wire_type},
        {"field number 0", "\x00\x01"s, decode_status::bad_wire_type},
        {"stray group end", "\x0c"s, decode_status::bad_wire_type},
        {"group never closed", "\x0b\x08\x01"s, decode_status::truncated},
        {"group closed by another number", "\x0b\x14"s, decode_status::bad_wire_type},
    };
    for (const auto& c : cases) {
      CAPTURE(c.what);
      wire_reader r(c.bytes);
      wire_field f;
      while (r.next(f)) {
      }
      CHECK(r.status() == c.expect);
      CHECK(sluice::grpc::describe(r.status()).size() > 3);
    }
  }
}
