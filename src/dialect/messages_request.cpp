// dialect: an Anthropic Messages request -> the canonical chat body.
//   system (a string or text blocks)   the first message, role "system"
//   user text / image blocks            a user message's content parts
//   user tool_result blocks             "tool" messages, before the user's other parts
//   assistant text / tool_use blocks    one assistant message: content, tool_calls
//   assistant thinking blocks           dropped (a chat backend takes none)
//   max_tokens (required), temperature, top_p, top_k, stop_sequences (stop),
//   tools (input_schema as parameters), tool_choice, stream
// Anything else of a block's type is a 400 naming it. Unknown top-level
// members (metadata, service_tier, thinking) are not carried.
#include <cstdint>

#include "request_common.hpp"
#include "sluice/dialect/request.hpp"

namespace sluice::dialect {

namespace {

using namespace detail;

// Text of a string or of an array of text blocks, written as one JSON
// string (blocks joined by "\n"). Returns: false on a block that is not text.
bool text_of(job& j, element content, const char* param) {
  if (content.is_string()) {
    j.w.str(content.get_string().value_unsafe());
    return true;
  }
  if (!content.is_array()) return j.fail(param, "must be a string or an array of text blocks");
  j.w.raw("\"");
  uint32_t i = 0;
  for (element b : as_array(content)) {
    if (get_string(b, "type") != "text") {
      j.w.raw("\"");
      return j.fail(j.at("%s[%u].type", param, i), "only text blocks are carried here");
    }
    if (i++ != 0) j.w.raw("\\n");
    j.w.escaped(get_string(b, "text"));
  }
  j.w.raw("\"");
  return true;
}

// An image block's source as an image_url part.
bool image_part(job& j, element block, uint32_t m, uint32_t b) {
  element src;
  if (!member(block, "source", src) || !src.is_object()) {
    return j.fail(j.at("messages[%u].content[%u].source", m, b), "an image block needs a source");
  }
  const std::string_view type = get_string(src, "type");
  j.w.raw("{\"type\":\"image_url\",\"image_url\":{\"url\":\"");
  if (type == "base64") {
    j.w.raw("data:");
    j.w.escaped(get_string(src, "media_type"));
    j.w.raw(";base64,");
    j.w.escaped(get_string(src, "data"));
  } else if (type == "url") {
    j.w.escaped(get_string(src, "url"));
  } else {
    return j.fail(j.at("messages[%u].content[%u].source.type", m, b), "must be base64 or url");
  }
  j.w.raw("\"}}");
  return true;
}

bool user_message(job& j, element content, uint32_t m, uint32_t& count) {
  auto open = [&](std::string_view role) {
    j.w.raw(count++ == 0 ? "{\"role\":\"" : ",{\"role\":\"");
    j.w.raw(role);
    j.w.raw("\"");
  };
  if (content.is_string()) {
    open("user");
    j.w.raw(",\"content\":");
    j.w.str(content.get_string().value_unsafe());
    j.w.raw("}");
    return true;
  }
  if (!content.is_array()) return j.fail(j.at("messages[%u].content", m), "must be a string or an array of blocks");
  // Tool results first: in chat they follow the assistant's tool calls.
  uint32_t b = 0;
  uint32_t others = 0;
  for (element block : as_array(content)) {
    const std::string_view type = get_string(block, "type");
    if (type == "tool_result") {
      const std::string_view id = get_string(block, "tool_use_id");
      if (id.empty()) return j.fail(j.at("messages[%u].content[%u].tool_use_id", m, b), "a tool_result needs its tool_use_id");
      open("tool");
      j.w.raw(",\"tool_call_id\":");
      j.w.str(id);
      j.w.raw(",\"content\":");
      element c;
      if (!member(block, "content", c)) {
        j.w.raw("\"\"");
      } else if (!text_of(j, c, j.at("messages[%u].content[%u].content", m, b))) {
        return false;
      }
      j.w.raw("}");
    } else if (type == "text" || type == "image") {
      ++others;
    } else if (type != "thinking" && type != "redacted_thinking") {
      return j.fail(j.at("messages[%u].content[%u].type", m, b), "this block type cannot be carried");
    }
    ++b;
  }
  if (others == 0) return true;
  open("user");
  j.w.raw(",\"content\":[");
  b = 0;
  uint32_t n = 0;
  for (element block : as_array(content)) {
    const std::string_view type = get_string(block, "type");
    if (type == "text") {
      j.w.raw(n++ == 0 ? "{\"type\":\"text\",\"text\":" : ",{\"type\":\"text\",\"text\":");
      j.w.str(get_string(block, "text"));
      j.w.raw("}");
    } else if (type == "image") {
      if (n++ != 0) j.w.raw(",");
      if (!image_part(j, block, m, b)) return false;
    }
    ++b;
  }
  j.w.raw("]}");
  return true;
}

bool assistant_message(job& j, element content, uint32_t m, uint32_t& count) {
  j.w.raw(count++ == 0 ? "{\"role\":\"assistant\",\"content\":" : ",{\"role\":\"assistant\",\"content\":");
  if (content.is_string()) {
    j.w.str(content.get_string().value_unsafe());
    j.w.raw("}");
    return true;
  }
  if (!content.is_array()) return j.fail(j.at("messages[%u].content", m), "must be a string or an array of blocks");
  j.w.raw("\"");
  uint32_t b = 0;
  uint32_t tools = 0;
  uint32_t texts = 0;
  for (element block : as_array(content)) {
    const std::string_view type = get_string(block, "type");
    if (type == "text") {
      if (texts++ != 0) j.w.raw("\\n");
      j.w.escaped(get_string(block, "text"));
    } else if (type == "tool_use") {
      ++tools;
    } else if (type != "thinking" && type != "redacted_thinking") {
      j.w.raw("\"");
      return j.fail(j.at("messages[%u].content[%u].type", m, b), "this block type cannot be carried");
    }
    ++b;
  }
  j.w.raw("\"");
  if (tools != 0) {
    j.w.raw(",\"tool_calls\":[");
    b = 0;
    uint32_t n = 0;
    for (element block : as_array(content)) {
      if (get_string(block, "type") == "tool_use") {
        const std::string_view id = get_string(block, "id");
        const std::string_view name = get_string(block, "name");
        element input;
        if (id.empty() || name.empty()) return j.fail(j.at("messages[%u].content[%u]", m, b), "a tool_use needs an id and a name");
        if (!member(block, "input", input) || !input.is_object()) {
          return j.fail(j.at("messages[%u].content[%u].input", m, b), "must be an object");
        }
        j.w.raw(n++ == 0 ? "{\"id\":" : ",{\"id\":");
        j.w.str(id);
        j.w.raw(",\"type\":\"function\",\"function\":{\"name\":");
        j.w.str(name);
        j.w.raw(",\"arguments\":");
        json_as_string(j.w, input);
        j.w.raw("}}");
      }
      ++b;
    }
    j.w.raw("]");
  }
  j.w.raw("}");
  return true;
}

bool tools_of(job& j, element tools) {
  if (!tools.is_array()) return j.fail("tools", "must be an array");
  j.w.raw(",\"tools\":[");
  uint32_t i = 0;
  for (element t : as_array(tools)) {
    const std::string_view type = get_string(t, "type");
    if (!type.empty() && type != "custom") {
      return j.fail(j.at("tools[%u].type", i), "server tools cannot be carried; only client tools (name, input_schema)");
    }
    const std::string_view name = get_string(t, "name");
    element schema;
    if (name.empty()) return j.fail(j.at("tools[%u].name", i), "a tool needs a name");
    if (!member(t, "input_schema", schema) || !schema.is_object()) {
      return j.fail(j.at("tools[%u].input_schema", i), "must be an object");
    }
    function_tool_head(j, i++ == 0, name, get_string(t, "description"));
    j.w.raw(",\"parameters\":");
    raw_json(j.w, schema);
    j.w.raw("}}");
  }
  j.w.raw("]");
  return true;
}

bool tool_choice_of(job& j, element tc) {
  if (!tc.is_object()) return j.fail("tool_choice", "must be an object");
  const std::string_view type = get_string(tc, "type");
  if (type == "auto") {
    j.w.raw(",\"tool_choice\":\"auto\"");
  } else if (type == "any") {
    j.w.raw(",\"tool_choice\":\"required\"");
  } else if (type == "none") {
    j.w.raw(",\"tool_choice\":\"none\"");
  } else if (type == "tool") {
    const std::string_view name = get_string(tc, "name");
    if (name.empty()) return j.fail("tool_choice.name", "a tool choice of type tool needs a name");
    j.w.raw(",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":");
    j.w.str(name);
    j.w.raw("}}");
  } else {
    return j.fail("tool_choice.type", "must be auto, any, tool or none");
  }
  bool no_parallel = false;
  if (tc["disable_parallel_tool_use"].get_bool().get(no_parallel) == simdjson::SUCCESS && no_parallel) {
    j.w.raw(",\"parallel_tool_calls\":false");
  }
  return true;
}

}  // namespace

bool request_translator::messages(std::string_view body, bool count_only, std::string& out, translated_request& t,
                                  openai::request_error& err) {
  t = {};
  out.clear();
  openai::detail::string_sink sink{out};
  writer w(sink);
  job j{w, err, _param, sizeof _param};
  element root;
  if (!parse_object(_parser, body, root)) {
    return j.fail({}, "The request body is not a JSON object.");
  }
  const std::string_view model = get_string(root, "model");
  if (model.empty()) return j.fail("model", "model: Field required");
  element v;
  int64_t max_tokens = 0;
  if (!count_only) {
    if (!member(root, "max_tokens", v)) return j.fail("max_tokens", "max_tokens: Field required");
    if (v.get_int64().get(max_tokens) != simdjson::SUCCESS || max_tokens < 1) {
      return j.fail("max_tokens", "max_tokens: must be a positive integer");
    }
  }
  element messages;
  if (!member(root, "messages", messages) || !messages.is_array()) {
    return j.fail("messages", "messages: Field required (an array)");
  }
  w.raw("{\"model\":");
  w.str(model);
  w.raw(",\"messages\":[");
  uint32_t count = 0;
  if (member(root, "system", v)) {
    w.raw("{\"role\":\"system\",\"content\":");
    if (!text_of(j, v, "system")) return false;
    w.raw("}");
    ++count;
  }
  uint32_t m = 0;
  for (element msg : as_array(messages)) {
    if (!msg.is_object()) return j.fail(j.at("messages[%u]", m), "must be an object");
    const std::string_view role = get_string(msg, "role");
    element content;
    if (!member(msg, "content", content)) return j.fail(j.at("messages[%u].content", m), "content: Field required");
    if (role == "user") {
      if (!user_message(j, content, m, count)) return false;
    } else if (role == "assistant") {
      if (!assistant_message(j, content, m, count)) return false;
    } else {
      return j.fail(j.at("messages[%u].role", m), "must be user or assistant");
    }
    ++m;
  }
  if (m == 0) return j.fail("messages", "messages: at least one message is required");
  w.raw("]");
  if (!count_only) {
    w.raw(",\"max_tokens\":");
    w.num(max_tokens);
  }
  if (!copy_number(j, root, "temperature", "temperature") || !copy_number(j, root, "top_p", "top_p") ||
      !copy_number(j, root, "top_k", "top_k")) {
    return false;
  }
  if (member(root, "stop_sequences", v)) {
    if (!v.is_array()) return j.fail("stop_sequences", "must be an array of strings");
    w.raw(",\"stop\":[");
    uint32_t i = 0;
    for (element s : as_array(v)) {
      if (!s.is_string()) return j.fail(j.at("stop_sequences[%u]", i), "must be a string");
      if (i++ != 0) w.raw(",");
      w.str(s.get_string().value_unsafe());
    }
    w.raw("]");
  }
  if (member(root, "tools", v) && !tools_of(j, v)) return false;
  if (member(root, "tool_choice", v) && !tool_choice_of(j, v)) return false;
  bool stream = false;
  if (member(root, "stream", v) && v.get_bool().get(stream) != simdjson::SUCCESS) return j.fail("stream", "must be a boolean");
  if (stream && !count_only) {
    t.stream = true;
    w.raw(",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
  }
  w.raw("}");
  return true;
}

}  // namespace sluice::dialect
