// Fuzz target: the client dialects on arbitrary bytes. The whole input is a
// Messages request and a Responses request (translated to the canonical chat
// body), a stored Responses conversation a request continues, a
// chat.completion body (rendered as a message and as a response),
// and a native reply body (its usage read); cut at blank lines, it is a
// chat stream's events (rendered in both dialects) and a native stream's
// (its usage read). What comes out must be what a client or backend can read:
//  - an accepted request is a JSON object; a refused one names a reason;
//  - each rendered stream is whole "event: T\ndata: {JSON with type T}\n\n"
//    events, Responses' sequence numbers 0, 1, 2..., nothing after the end,
//    and every output within the renderer's bound();
//  - a rendered body is a JSON object;
//  - top_level_member agrees with a full parse: on a JSON object whose
//    top-level names are distinct and unescaped it finds "model" exactly
//    when the object has one, and its span holds that value.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "sluice/dialect/native.hpp"
#include "sluice/dialect/render.hpp"
#include "sluice/dialect/request.hpp"

namespace {

using namespace sluice::dialect;

bool is_json_object(simdjson::dom::parser& parser, std::string_view s) {
  simdjson::dom::element e;
  return parser.parse(s.data(), s.size(), true).get(e) == simdjson::SUCCESS && e.is_object();
}

// Checks a rendered batch; `seq` is the next Responses sequence number.
bool check_events(simdjson::dom::parser& parser, std::string_view out, client_dialect d, int64_t& seq) {
  bool last = false;
  while (!out.empty()) {
    SLUICE_FUZZ_CHECK(!last);
    SLUICE_FUZZ_CHECK(out.starts_with("event: "));
    const size_t nl = out.find('\n');
    SLUICE_FUZZ_CHECK(nl != std::string_view::npos);
    const std::string_view type = out.substr(7, nl - 7);
    out.remove_prefix(nl + 1);
    SLUICE_FUZZ_CHECK(out.starts_with("data: "));
    const size_t end = out.find("\n\n");
    SLUICE_FUZZ_CHECK(end != std::string_view::npos);
    const std::string_view data = out.substr(6, end - 6);
    simdjson::dom::element e;
    SLUICE_FUZZ_CHECK(parser.parse(data.data(), data.size(), true).get(e) == simdjson::SUCCESS && e.is_object());
    std::string_view t;
    SLUICE_FUZZ_CHECK(e["type"].get_string().get(t) == simdjson::SUCCESS && t == type);
    if (d == client_dialect::responses) {
      int64_t n = -1;
      SLUICE_FUZZ_CHECK(e["sequence_number"].get_int64().get(n) == simdjson::SUCCESS && n == seq);
      ++seq;
      last = t == "response.completed" || t == "response.incomplete" || t == "response.failed";
    } else {
      last = t == "message_stop" || t == "error";
    }
    out.remove_prefix(end + 2);
  }
  return last;
}

void fuzz_stream(std::string_view input, client_dialect d, simdjson::dom::parser& parser) {
  static stream_renderer renderer(16 * 1024);
  static std::vector<char> out;
  renderer.reset(d, {"fuzz", 1, "model"});
  int64_t seq = 0;
  bool ended = false;
  auto take = [&](render_status st, size_t n) {
    if (st != render_status::ok) return;
    const bool last = check_events(parser, std::string_view(out.data(), n), d, seq);
    if (ended) SLUICE_FUZZ_CHECK(n == 0);
    ended = ended || last;
    if (last) SLUICE_FUZZ_CHECK(renderer.done());
  };
  if (!input.empty() && (static_cast<unsigned char>(input[0]) & 1) != 0) {
    // Opened at the backend's head, before any event (start()).
    out.resize(renderer.bound(0));
    size_t n = 0;
    const render_status st = renderer.start(out.data(), out.size(), n);
    SLUICE_FUZZ_CHECK(st == render_status::ok && n != 0);
    take(st, n);
  }
  while (!input.empty()) {
    const size_t end = input.find("\n\n");
    const std::string_view data = input.substr(0, end);
    input.remove_prefix(end == std::string_view::npos ? input.size() : end + 2);
    out.resize(renderer.bound(data.size()));
    // A tight room first (as the relay tries the frame's): at worst more_room,
    // nothing taken from the event; then the bound's, which always fits.
    size_t n = 0;
    render_status st = renderer.feed(data, out.data(), std::min(out.size(), data.size() + 64), n);
    if (st == render_status::more_room) {
      SLUICE_FUZZ_CHECK(n == 0);
      st = renderer.feed(data, out.data(), out.size(), n);
    }
    SLUICE_FUZZ_CHECK(st != render_status::too_large && st != render_status::more_room);
    take(st, n);
    if (st == render_status::malformed) break;
  }
  out.resize(renderer.bound(0));
  size_t n = 0;
  const render_status st = renderer.finish(false, out.data(), out.size(), n);
  SLUICE_FUZZ_CHECK(st == render_status::ok);
  take(st, n);
  SLUICE_FUZZ_CHECK(renderer.done());
}

void fuzz_member(std::string_view input, simdjson::dom::parser& parser) {
  uint32_t b = 0, e = 0;
  const member_scan m = top_level_member(input, "model", b, e);
  if (m == member_scan::found) SLUICE_FUZZ_CHECK(b <= e && e <= input.size());
  simdjson::dom::element root;
  if (parser.parse(input.data(), input.size(), true).get(root) != simdjson::SUCCESS || !root.is_object()) return;
  bool plain = true;  // distinct, unescaped names
  std::vector<std::string_view> names;
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS) return;
  for (auto field : obj) {
    for (std::string_view n : names) plain = plain && n != field.key;
    names.push_back(field.key);
  }
  if (!plain || m == member_scan::escaped) return;  // an escaped name may still be distinct: refused is fine
  simdjson::dom::element model;
  const bool has = root["model"].get(model) == simdjson::SUCCESS;
  SLUICE_FUZZ_CHECK((m == member_scan::found) == has);
  if (has) {
    static simdjson::dom::parser span_parser;
    simdjson::dom::element v;
    const std::string span(input.substr(b, e - b));
    SLUICE_FUZZ_CHECK(span_parser.parse(span).get(v) == simdjson::SUCCESS);
    SLUICE_FUZZ_CHECK(simdjson::minify(v) == simdjson::minify(model));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t len) {
  static simdjson::dom::parser parser;
  static request_translator translator;
  const std::string body(reinterpret_cast<const char*>(data), len);
  std::string padded = body;
  padded.reserve(body.size() + simdjson::SIMDJSON_PADDING);
  const std::string_view input(padded.data(), body.size());
  std::string out;
  translated_request t;
  sluice::openai::request_error err;
  for (bool count : {false, true}) {
    if (translator.messages(input, count, out, t, err)) {
      SLUICE_FUZZ_CHECK(is_json_object(parser, out));
    } else {
      SLUICE_FUZZ_CHECK(!err.message.empty());
    }
  }
  if (translator.responses(input, out, t, err)) {
    SLUICE_FUZZ_CHECK(is_json_object(parser, out));
  } else {
    SLUICE_FUZZ_CHECK(!err.message.empty());
  }
  // The same bytes as a stored conversation (the items a response store
  // keeps) before a request that continues it: read or refused, and the
  // items written for the store, with the stored ones, read as a JSON array.
  static constexpr std::string_view k_next = R"({"model":"m","previous_response_id":"resp_1","input":[{"role":"user","content":"next"}]})";
  std::string next_body(k_next);
  next_body.reserve(next_body.size() + simdjson::SIMDJSON_PADDING);
  std::string items;
  if (translator.responses(std::string_view(next_body.data(), k_next.size()), out, t, err, input, &items)) {
    SLUICE_FUZZ_CHECK(is_json_object(parser, out));
    SLUICE_FUZZ_CHECK(is_json_object(parser, "{\"items\":[" + items + "]}"));
  } else {
    SLUICE_FUZZ_CHECK(!err.message.empty());
  }
  reply_outcome o;
  for (client_dialect d : {client_dialect::messages, client_dialect::responses}) {
    if (render_reply(d, input, {"fuzz", 1, "model"}, out, o)) SLUICE_FUZZ_CHECK(is_json_object(parser, out));
    fuzz_stream(input, d, parser);
    native_usage u;
    std::string_view rest = input;
    while (!rest.empty()) {
      const size_t end = rest.find("\n\n");
      std::string_view id;
      scan_native_event(d, rest.substr(0, end), u, &id);
      // The id is a string the event held (its own bytes, or unescaped).
      SLUICE_FUZZ_CHECK(id.size() <= end || end == std::string_view::npos);
      rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 2);
    }
    (void)native_body_usage(d, input);
  }
  fuzz_member(input, parser);
  return 0;
}
