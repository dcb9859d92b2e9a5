// Fuzz target: a Triton backend's gRPC response stream. The input is the
// DATA bytes of a ModelStreamInfer response: 5-byte framed messages, each
// decoded as a ModelStreamInferResponse. Checks: a frame read from the
// whole input equals the one read once its bytes arrive one at a time (a
// frame is never taken early); consumed stays within the input; decoded
// views lie inside their message; a second decode reads the same. Each
// decoded response also goes to two openai::triton_streams, a stream chat
// client's (include_usage) and a non-stream completions client's: output
// is whole `data: X` events, X `[DONE]` or a JSON object, nothing after
// [DONE]; need_space writes nothing and the retry writes exactly `needed`,
// within event_bytes_max; the body at the end is a JSON object.
#include <simdjson.h>

#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "sluice/grpc/kserve.hpp"
#include "sluice/openai/triton.hpp"

namespace {

using namespace sluice::grpc;
using sluice::fuzz::inside;

constexpr uint32_t k_message_bytes_max = 1 << 16;

using sluice::openai::triton_stream;
using sluice::openai::triton_stream_result;
using sluice::openai::triton_stream_status;

bool is_json_object(simdjson::dom::parser& parser, std::string_view s) {
  simdjson::dom::element root;
  return parser.parse(s.data(), s.size(), true).get(root) == simdjson::SUCCESS && root.is_object();
}

// The two clients of one input; their output is checked as it is written.
struct replies {
  std::string id = "req-1";
  std::string model = "m\"odel";
  triton_stream events;
  triton_stream body;
  std::string text;
  std::string out;
  bool done_written = false;
  simdjson::dom::parser parser;

  replies() {
    events.reset({id, 1, model, sluice::openai::endpoint::chat_completions, true});
    body.reset({id, 1, model, sluice::openai::endpoint::completions, false}, &text);
  }

  // `written` bytes of events: whole events, JSON or [DONE], nothing after [DONE].
  void check_events(std::string_view w) {
    while (!w.empty()) {
      SLUICE_FUZZ_CHECK(!done_written);
      SLUICE_FUZZ_CHECK(w.substr(0, 6) == "data: ");
      const size_t end = w.find("\n\n");
      SLUICE_FUZZ_CHECK(end != std::string_view::npos);
      const std::string_view data = w.substr(6, end - 6);
      if (data == "[DONE]") {
        done_written = true;
      } else {
        SLUICE_FUZZ_CHECK(is_json_object(parser, data));
      }
      w.remove_prefix(end + 2);
    }
  }

  // A first try in a small buffer; on need_space the retry at `needed`.
  void feed(const sluice::grpc::stream_response& r, uint64_t seed) {
    const size_t bound = events.event_bytes_max(r);
    const bool was_done = events.done();
    out.assign(seed % 512, '\0');
    triton_stream_result a = events.feed(r, out.data(), out.size());
    if (a.status == triton_stream_status::need_space) {
      SLUICE_FUZZ_CHECK(a.written == 0 && a.needed > out.size() && a.needed <= bound);
      SLUICE_FUZZ_CHECK(events.done() == was_done);
      out.assign(a.needed, '\0');
      triton_stream_result b = events.feed(r, out.data(), out.size());
      SLUICE_FUZZ_CHECK(b.status == triton_stream_status::ok && b.written == a.needed);
      a = b;
    }
    SLUICE_FUZZ_CHECK(a.status != triton_stream_status::failed);
    SLUICE_FUZZ_CHECK(a.status != triton_stream_status::ended || was_done);
    SLUICE_FUZZ_CHECK(a.written <= out.size() && a.written <= bound);
    check_events(std::string_view(out.data(), a.written));
    SLUICE_FUZZ_CHECK(events.done() == done_written);

    const bool body_was_done = body.done();
    char none[1];
    const triton_stream_result c = body.feed(r, none, 0);
    SLUICE_FUZZ_CHECK(c.written == 0 && c.status != triton_stream_status::need_space);
    SLUICE_FUZZ_CHECK(c.status != triton_stream_status::ended || body_was_done);
    SLUICE_FUZZ_CHECK(c.status != triton_stream_status::failed || !r.error_message.empty());
  }

  void end() {
    out.assign(2048 + 24 * (id.size() + model.size()), '\0');
    const triton_stream_result a = events.finish(out.data(), out.size());
    SLUICE_FUZZ_CHECK(a.status == triton_stream_status::ok || a.status == triton_stream_status::ended);
    check_events(std::string_view(out.data(), a.written));
    SLUICE_FUZZ_CHECK(done_written && events.done());
    char none[1];
    (void)body.finish(none, 0);
    SLUICE_FUZZ_CHECK(body.done());
    if (body.outcome().finish_reason == "error") return;  // the caller answers 502 instead
    out.assign(body.body_bytes_max(), '\0');
    const triton_stream_result b = body.write_body(out.data(), out.size());
    SLUICE_FUZZ_CHECK(b.status == triton_stream_status::ok);
    SLUICE_FUZZ_CHECK(is_json_object(parser, std::string_view(out.data(), b.written)));
  }
};

void check_message(std::string_view m, replies* to = nullptr, uint64_t seed = 0) {
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
  if (to != nullptr) to->feed(a, seed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  sluice::fuzz::split_rng rng(sluice::fuzz::input_hash(data, size));
  replies to;
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
      check_message(f.message, &to, rng.next());
      at += f.consumed;
      continue;
    }
    break;
  }
  // The whole input as one message too: most mutations land here.
  check_message(in, &to, rng.next());
  to.end();
  return 0;
}
