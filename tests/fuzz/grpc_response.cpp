// Fuzz target: a Triton backend's gRPC response stream. The input is the
// DATA bytes of a ModelStreamInfer response: 5-byte framed messages, each
// decoded as a ModelStreamInferResponse. Checks: a frame read from the
// whole input equals the one read once its bytes arrive one at a time (a
// frame is never taken early); consumed stays within the input; decoded
// views lie inside their message; a second decode reads the same.
#include <string_view>

#include "fuzz_common.hpp"
#include "sluice/grpc/kserve.hpp"

namespace {

using namespace sluice::grpc;
using sluice::fuzz::inside;

constexpr uint32_t k_message_bytes_max = 1 << 16;

void check_message(std::string_view m) {
  stream_response a;
  stream_response b;
  const decode_status sa = decode_stream_response(m, a);
  const decode_status sb = decode_stream_response(m, b);
  SLUICE_FUZZ_CHECK(sa == sb);
  SLUICE_FUZZ_CHECK(sa != decode_status::need_more && sa != decode_status::compressed);
  if (sa != decode_status::ok) return;
  for (std::string_view v : {a.error_message, a.model_name, a.model_version, a.id, a.text_output,
                             a.finish_reason}) {
    SLUICE_FUZZ_CHECK(inside(v, m.data(), m.size()));
  }
  SLUICE_FUZZ_CHECK(a.text_output == b.text_output && a.finish_reason == b.finish_reason);
  SLUICE_FUZZ_CHECK(a.num_input_tokens == b.num_input_tokens);
  SLUICE_FUZZ_CHECK(a.num_output_tokens == b.num_output_tokens);
  SLUICE_FUZZ_CHECK(a.final_response == b.final_response);
  SLUICE_FUZZ_CHECK(a.has_text_output || a.text_output.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  while (at < in.size()) {
    frame f;
    const decode_status st = read_frame(in.substr(at), k_message_bytes_max, f);
    // Growing the input a byte at a time: nothing before the frame's end
    // is ok, and the frame at its end is the same frame.
    if (st == decode_status::ok) {
      for (size_t n = 0; n < f.consumed && n < 64; ++n) {
        frame g;
        SLUICE_FUZZ_CHECK(read_frame(in.substr(at, n), k_message_bytes_max, g) != decode_status::ok);
      }
      SLUICE_FUZZ_CHECK(f.consumed >= k_frame_header_bytes && at + f.consumed <= in.size());
      SLUICE_FUZZ_CHECK(inside(f.message, in.data(), in.size()));
      check_message(f.message);
      at += f.consumed;
      continue;
    }
    break;
  }
  // The whole input as one message too: most mutations land here.
  check_message(in);
  return 0;
}
