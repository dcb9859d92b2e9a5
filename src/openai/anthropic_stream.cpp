// openai: an Anthropic Messages SSE stream -> the OpenAI chunk sequence vLLM
// writes, one event at a time (for legacy completions, text_completion
// chunks: no role chunk, tool blocks dropped). Anthropic's events and what
// each becomes:
//   message_start        usage.input_tokens; the role chunk
//   content_block_start  text: nothing (its text comes in deltas);
//                        tool_use: the tool call's first chunk (id, name)
//   content_block_delta  text_delta: a content chunk; input_json_delta: an
//                        arguments fragment of its tool call
//   message_delta        stop_reason, usage.output_tokens; the finish chunk
//   message_stop         the usage chunk (when asked), [DONE]
//   error                an OpenAI error event, [DONE]
//   ping, content_block_stop, thinking/signature deltas, unknown types: nothing
#include <cstdint>
#include <cstring>

#include "anthropic_map.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/openai/anthropic.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::openai {

namespace {

using simdjson::dom::element;
using writer = detail::json_writer<detail::bounded_sink>;

std::string_view get_string(element obj, std::string_view key) noexcept {
  std::string_view v;
  return obj[key].get_string().get(v) == simdjson::SUCCESS ? v : std::string_view{};
}

int64_t get_int(element obj, std::string_view key, int64_t fallback) noexcept {
  int64_t v = 0;
  return obj[key].get_int64().get(v) == simdjson::SUCCESS ? v : fallback;
}

// A tool-call chunk up to its function's fields: {"index":<tool>, ... "function":{
void tool_chunk_begin(writer& w, const anthropic_reply_context& ctx, int16_t tool) noexcept {
  detail::chunk_prefix(w, ctx);
  w.raw("{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":");
  w.num(int64_t{tool});
}

}  // namespace

anthropic_stream::anthropic_stream(size_t event_bytes_max)
    : _event_bytes_max(event_bytes_max),
      _padded(new char[event_bytes_max + simdjson::SIMDJSON_PADDING]),
      _parser(event_bytes_max) {
  // Start-up, not per event: the parser's tape and string buffer for the
  // largest event, so parse() never grows them.
  SLUICE_VERIFY(_parser.allocate(event_bytes_max) == simdjson::SUCCESS);
  reset({});
}

void anthropic_stream::reset(const anthropic_reply_context& ctx) noexcept {
  _ctx = ctx;
  detail::set_chunk_head(_ctx, _chunk_head);
  _state = state{};
  _state.block_tool.fill(-1);
}

void anthropic_stream::role_chunk(detail::bounded_sink& sink) noexcept {
  if (_state.role_sent) return;
  _state.role_sent = true;
  writer w(sink);
  detail::role_chunk(w, _ctx);  // chat only
}

// A content block's index, checked against the tool map's bound: -1 when out of it.
int64_t anthropic_stream::block_index(element root) noexcept {
  const int64_t index = get_int(root, "index", -1);
  return index >= 0 && index < static_cast<int64_t>(k_blocks_max) ? index : -1;
}

bool anthropic_stream::on_block_start(element root, detail::bounded_sink& sink) noexcept {
  element block;
  const int64_t index = block_index(root);
  if (root["content_block"].get(block) != simdjson::SUCCESS || index < 0) return false;
  role_chunk(sink);
  writer w(sink);
  std::string_view type = get_string(block, "type");
  if (type == "text") {
    std::string_view text = get_string(block, "text");
    if (!text.empty()) detail::text_chunk(w, _ctx, text, {});
  } else if (type == "tool_use" && detail::is_chat(_ctx)) {  // a completion is text only
    if (_state.tools == INT16_MAX) return false;  // only a broken stream restarts blocks this often
    const int16_t tool = _state.tools++;
    _state.block_tool[static_cast<size_t>(index)] = tool;
    tool_chunk_begin(w, _ctx, tool);
    w.raw(",\"id\":");
    w.str(get_string(block, "id"));
    w.raw(",\"type\":\"function\",\"function\":{\"name\":");
    w.str(get_string(block, "name"));
    w.raw(",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  }
  return true;
}

bool anthropic_stream::on_block_delta(element root, detail::bounded_sink& sink) noexcept {
  element delta;
  const int64_t index = block_index(root);
  if (root["delta"].get(delta) != simdjson::SUCCESS || index < 0) return false;
  role_chunk(sink);
  writer w(sink);
  std::string_view type = get_string(delta, "type");
  if (type == "text_delta") {
    std::string_view text = get_string(delta, "text");
    if (!text.empty()) detail::text_chunk(w, _ctx, text, {});
  } else if (type == "input_json_delta" && detail::is_chat(_ctx)) {
    const int16_t tool = _state.block_tool[static_cast<size_t>(index)];
    if (tool < 0) return false;  // arguments for a block that is not a tool call
    std::string_view fragment = get_string(delta, "partial_json");
    if (!fragment.empty()) {
      tool_chunk_begin(w, _ctx, tool);
      w.raw(",\"function\":{\"arguments\":");
      w.str(fragment);
      w.raw("}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
  }
  return true;  // thinking, signature and citation deltas have no chat chunk
}

void anthropic_stream::on_usage(element usage) noexcept {
  _state.prompt_tokens = detail::anthropic_prompt_tokens(usage, _state.prompt_tokens);
  _state.completion_tokens = get_int(usage, "output_tokens", _state.completion_tokens);
}

void anthropic_stream::on_message_delta(element root, detail::bounded_sink& sink) noexcept {
  element usage;
  element delta;
  if (root["usage"].get(usage) == simdjson::SUCCESS) on_usage(usage);
  std::string_view finish;
  if (root["delta"].get(delta) == simdjson::SUCCESS) {
    finish = detail::anthropic_finish_reason(get_string(delta, "stop_reason"));
  }
  if (finish.empty() || !_state.finish_reason.empty()) return;
  role_chunk(sink);
  _state.finish_reason = finish;
  writer w(sink);
  // Anthropic says why it stopped after the last text: an empty chunk
  // carries the finish, as vLLM's finish by EOS does.
  detail::text_chunk(w, _ctx, "", finish);
}

void anthropic_stream::on_message_stop(detail::bounded_sink& sink) noexcept {
  writer w(sink);
  if (_ctx.include_usage) detail::usage_chunk(w, _ctx, _state.prompt_tokens, _state.completion_tokens);
  w.raw("data: [DONE]\n\n");
  _state.done = true;
}

// What a vLLM stream error looks like to the client: an error event, [DONE].
void anthropic_stream::on_error(element root, detail::bounded_sink& sink) noexcept {
  std::string_view type;
  std::string_view message;
  element error;
  if (root["error"].get(error) == simdjson::SUCCESS) {
    type = get_string(error, "type");
    message = get_string(error, "message");
  }
  const error_fields fields = default_error_for_status(detail::anthropic_error_status(type, 500), message);
  writer w(sink);
  w.raw("data: {\"error\":{\"message\":");
  w.str(fields.message);
  w.raw(",\"type\":");
  w.str(fields.type);
  w.raw(",\"param\":null,\"code\":");
  if (fields.code.empty()) {
    w.raw("null");
  } else {
    w.str(fields.code);
  }
  w.raw("}}\n\ndata: [DONE]\n\n");
  _state.finish_reason = "error";
  _state.done = true;
}

anthropic_stream_result anthropic_stream::feed(std::string_view event, std::string_view data, char* out,
                                               size_t cap) noexcept {
  using status = anthropic_stream_status;
  if (_state.done) return {status::ended, 0, 0};
  if (data.size() > k_large_event_bytes_max) return {status::too_large, 0, 0};
  // The usual event in the kept buffers; a larger one (a whole tool call's
  // input in one delta) in its own, freed at return, after every view into
  // it is written out.
  std::unique_ptr<char[]> large_copy;
  std::unique_ptr<simdjson::dom::parser> large_parser;
  char* padded = _padded.get();
  simdjson::dom::parser* parser = &_parser;
  if (data.size() > _event_bytes_max) {
    large_copy.reset(new (std::nothrow) char[data.size() + simdjson::SIMDJSON_PADDING]);
    large_parser.reset(new (std::nothrow) simdjson::dom::parser(data.size()));
    if (!large_copy || !large_parser) return {status::too_large, 0, 0};
    padded = large_copy.get();
    parser = large_parser.get();
  }
  std::memcpy(padded, data.data(), data.size());
  std::memset(padded + data.size(), 0, simdjson::SIMDJSON_PADDING);
  element root;
  if (parser->parse(padded, data.size(), false).get(root) != simdjson::SUCCESS || !root.is_object()) {
    return {status::malformed, 0, 0};
  }
  std::string_view type = get_string(root, "type");
  if (type.empty()) type = event;

  const state saved = _state;
  detail::bounded_sink sink{out, cap};
  bool well_formed = true;
  element message;
  element usage;
  if (type == "message_start") {
    if (root["message"].get(message) == simdjson::SUCCESS && message["usage"].get(usage) == simdjson::SUCCESS) {
      on_usage(usage);
    }
    role_chunk(sink);
  } else if (type == "content_block_start") {
    well_formed = on_block_start(root, sink);
  } else if (type == "content_block_delta") {
    well_formed = on_block_delta(root, sink);
  } else if (type == "message_delta") {
    on_message_delta(root, sink);
  } else if (type == "message_stop") {
    on_message_stop(sink);
  } else if (type == "error") {
    on_error(root, sink);
  }  // ping, content_block_stop and unknown types: nothing to say
  if (!well_formed) {
    _state = saved;
    return {status::malformed, 0, 0};
  }
  if (!sink.fits()) {
    _state = saved;
    return {status::need_space, 0, sink.size};
  }
  return {status::ok, sink.size, sink.size};
}

}  // namespace sluice::openai
