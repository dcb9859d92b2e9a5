// Fuzz target: the Anthropic translators on arbitrary bytes. The input is
// cut at blank lines into SSE events ("name\ndata" each) fed to one
// openai::anthropic_stream, first into a buffer of a random size and, when
// that is too small, again into one of the size it asked for; the whole
// input is also an OpenAI request (chat or legacy completions), an Anthropic
// message and an Anthropic error body; replies take either endpoint's
// shape. Whatever comes out must be what the client can read:
//  - each stream output is whole "data: X\n\n" events, X "[DONE]" or a JSON
//    object, and nothing follows [DONE];
//  - need_space writes nothing and the retry writes exactly `needed` bytes;
//  - an accepted request, a translated message and an error body are JSON
//    objects; an error's status is 4xx or 5xx.
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "sluice/openai/anthropic.hpp"

namespace {

using namespace sluice::openai;

bool is_json_object(simdjson::dom::parser& parser, std::string_view s) {
  simdjson::dom::element e;
  return parser.parse(s.data(), s.size(), true).get(e) == simdjson::SUCCESS && e.is_object();
}

// Checks one feed's output; returns whether it ended with [DONE].
bool check_events(simdjson::dom::parser& parser, std::string_view out) {
  bool done = false;
  while (!out.empty()) {
    SLUICE_FUZZ_CHECK(!done);
    SLUICE_FUZZ_CHECK(out.starts_with("data: "));
    const size_t end = out.find("\n\n");
    SLUICE_FUZZ_CHECK(end != std::string_view::npos);
    const std::string_view payload = out.substr(6, end - 6);
    done = payload == "[DONE]";
    SLUICE_FUZZ_CHECK(done || is_json_object(parser, payload));
    out.remove_prefix(end + 2);
  }
  return done;
}

void fuzz_stream(std::string_view input, sluice::fuzz::split_rng& rng, simdjson::dom::parser& parser) {
  static anthropic_stream stream(16 * 1024);
  static std::vector<char> small(512);
  static std::vector<char> big;
  anthropic_reply_context ctx{"fuzz", 1, "model", (rng.next() & 1) != 0};
  ctx.kind = (rng.next() & 1) != 0 ? endpoint::completions : endpoint::chat_completions;
  stream.reset(ctx);
  bool done = false;
  while (!input.empty()) {
    size_t end = input.find("\n\n");
    const std::string_view record = input.substr(0, end);
    input.remove_prefix(end == std::string_view::npos ? input.size() : end + 2);
    const size_t nl = record.find('\n');
    const std::string_view name = nl == std::string_view::npos ? std::string_view{} : record.substr(0, nl);
    const std::string_view data = nl == std::string_view::npos ? record : record.substr(nl + 1);

    const size_t cap = rng.upto(small.size());
    anthropic_stream_result r = stream.feed(name, data, small.data(), cap);
    if (done) SLUICE_FUZZ_CHECK(r.status == anthropic_stream_status::ended);
    if (r.status == anthropic_stream_status::need_space) {
      SLUICE_FUZZ_CHECK(r.written == 0 && r.needed > cap);
      big.resize(r.needed);
      const size_t needed = r.needed;
      r = stream.feed(name, data, big.data(), big.size());
      SLUICE_FUZZ_CHECK(r.status == anthropic_stream_status::ok && r.written == needed);
      done = check_events(parser, std::string_view(big.data(), r.written));
    } else if (r.status == anthropic_stream_status::ok) {
      SLUICE_FUZZ_CHECK(r.written <= cap);
      done = check_events(parser, std::string_view(small.data(), r.written));
    }
    SLUICE_FUZZ_CHECK(done == stream.done());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t len) {
  const std::string_view input(reinterpret_cast<const char*>(data), len);
  sluice::fuzz::split_rng rng(sluice::fuzz::input_hash(data, len));
  static simdjson::dom::parser parser;
  fuzz_stream(input, rng, parser);

  static anthropic_request_writer writer;
  static std::string out;
  request_error err;
  const bool completions = (rng.next() & 1) != 0;
  if (completions ? writer.write_completion(input, {"claude", 1024}, out, err)
                  : writer.write(input, {"claude", 1024}, out, err)) {
    SLUICE_FUZZ_CHECK(is_json_object(parser, out));
  } else {
    SLUICE_FUZZ_CHECK(!err.message.empty());
  }
  anthropic_outcome outcome;
  anthropic_reply_context ctx{"fuzz", 1, "model", false};
  ctx.kind = completions ? endpoint::completions : endpoint::chat_completions;
  if (anthropic_response_to_openai(input, ctx, out, outcome)) {
    SLUICE_FUZZ_CHECK(is_json_object(parser, out));
  }
  char body[1024];
  uint16_t status = 0;
  const size_t n = anthropic_error_to_openai(static_cast<uint16_t>(400 + rng.upto(200)), input, body, sizeof(body), status);
  SLUICE_FUZZ_CHECK(status >= 400 && status < 600);
  SLUICE_FUZZ_CHECK(is_json_object(parser, std::string_view(body, n)));
  return 0;
}
