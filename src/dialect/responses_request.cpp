// dialect: an OpenAI Responses request -> the canonical chat body.
//   instructions                        the first message, role "system"
//   input as a string                   one user message
//   input items:
//     message (role user | assistant | system | developer; content a string
//       or input_text / input_image / output_text / refusal parts)
//                                       a chat message of that role
//     function_call                     an assistant message's tool_calls
//                                       (consecutive calls share one)
//     function_call_output              a "tool" message; its call must come before
//     reasoning                         dropped (a chat backend takes none)
//   max_output_tokens (max_tokens), temperature, top_p, tools (function),
//   tool_choice, parallel_tool_calls, text.format (response_format),
//   reasoning.effort (reasoning_effort), stream
// Other item and tool types are a 400 naming them.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "request_common.hpp"
#include "sluice/dialect/request.hpp"

namespace sluice::dialect {

namespace {

using namespace detail;

bool content_parts(job& j, element content, uint32_t i, bool assistant) {
  if (content.is_string()) {
    j.w.str(content.get_string().value_unsafe());
    return true;
  }
  if (!content.is_array()) return j.fail(j.at("input[%u].content", i), "must be a string or an array of parts");
  if (assistant) {  // chat's assistant content is text: the parts joined
    j.w.raw("\"");
    uint32_t p = 0;
    for (element part : as_array(content)) {
      const std::string_view type = get_string(part, "type");
      if (type != "output_text" && type != "refusal" && type != "input_text") {
        j.w.raw("\"");
        return j.fail(j.at("input[%u].content[%u].type", i, p), "an assistant message takes output_text parts");
      }
      j.w.escaped(get_string(part, type == "refusal" ? "refusal" : "text"));
      ++p;
    }
    j.w.raw("\"");
    return true;
  }
  j.w.raw("[");
  uint32_t p = 0;
  for (element part : as_array(content)) {
    const std::string_view type = get_string(part, "type");
    if (p != 0) j.w.raw(",");
    if (type == "input_text" || type == "output_text") {
      j.w.raw("{\"type\":\"text\",\"text\":");
      j.w.str(get_string(part, "text"));
      j.w.raw("}");
    } else if (type == "input_image") {
      const std::string_view url = get_string(part, "image_url");
      if (url.empty()) {
        return j.fail(j.at("input[%u].content[%u].image_url", i, p),
                      "an input_image needs an image_url (file_id is not carried)");
      }
      j.w.raw("{\"type\":\"image_url\",\"image_url\":{\"url\":");
      j.w.str(url);
      const std::string_view detail = get_string(part, "detail");
      if (!detail.empty()) {
        j.w.raw(",\"detail\":");
        j.w.str(detail);
      }
      j.w.raw("}}");
    } else {
      return j.fail(j.at("input[%u].content[%u].type", i, p), "this part type cannot be carried");
    }
    ++p;
  }
  j.w.raw("]");
  return true;
}

// Call ids of the function_call items seen so far (a function_call_output
// must name one). Bounded; past the bound an output is taken on trust.
struct call_ids {
  static constexpr uint32_t k_max = 256;
  std::string_view ids[k_max];
  uint32_t n = 0;
  bool overflow = false;
  void add(std::string_view id) noexcept {
    if (n < k_max) {
      ids[n++] = id;
    } else {
      overflow = true;
    }
  }
  bool has(std::string_view id) const noexcept {
    for (uint32_t k = 0; k < n; ++k) {
      if (ids[k] == id) return true;
    }
    return overflow;
  }
};

// The items of `lists` (the stored conversation's, then the request's), in
// order, as chat messages.
// `outputs_on_trust`: a function_call_output may answer a call not given
// here (previous_response_id names a conversation not read in yet).
bool input_items(job& j, std::initializer_list<element> lists, uint32_t& count, bool outputs_on_trust = false) {
  auto next = [&] { j.w.raw(count++ == 0 ? "" : ","); };
  call_ids calls;
  calls.overflow = outputs_on_trust;
  bool calls_open = false;  // an assistant message with tool_calls is open
  auto close_calls = [&] {
    if (calls_open) j.w.raw("]}");
    calls_open = false;
  };
  uint32_t i = 0;
  for (element input : lists)
  for (element item : as_array(input)) {
    if (!item.is_object()) return j.fail(j.at("input[%u]", i), "must be an object");
    std::string_view type = get_string(item, "type");
    if (type.empty() && !get_string(item, "role").empty()) type = "message";
    if (type == "function_call") {
      const std::string_view id = get_string(item, "call_id");
      const std::string_view name = get_string(item, "name");
      const std::string_view args = get_string(item, "arguments");
      if (id.empty() || name.empty()) return j.fail(j.at("input[%u]", i), "a function_call needs call_id and name");
      if (!calls_open) {
        next();
        j.w.raw("{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[");
        calls_open = true;
      } else {
        j.w.raw(",");
      }
      j.w.raw("{\"id\":");
      j.w.str(id);
      j.w.raw(",\"type\":\"function\",\"function\":{\"name\":");
      j.w.str(name);
      j.w.raw(",\"arguments\":");
      j.w.str(args.empty() ? std::string_view("{}") : args);
      j.w.raw("}}");
      calls.add(id);
      ++i;
      continue;
    }
    close_calls();
    if (type == "message") {
      const std::string_view role = get_string(item, "role");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        return j.fail(j.at("input[%u].role", i), "must be user, assistant, system or developer");
      }
      element content;
      if (!member(item, "content", content)) return j.fail(j.at("input[%u].content", i), "content: Field required");
      next();
      j.w.raw("{\"role\":");
      j.w.str(role == "developer" ? std::string_view("system") : role);
      j.w.raw(",\"content\":");
      if (!content_parts(j, content, i, role == "assistant")) return false;
      j.w.raw("}");
    } else if (type == "function_call_output") {
      const std::string_view id = get_string(item, "call_id");
      if (id.empty() || !calls.has(id)) {
        return j.fail(j.at("input[%u].call_id", i), "a function_call_output must answer a function_call given before it");
      }
      element output;
      if (!member(item, "output", output)) return j.fail(j.at("input[%u].output", i), "output: Field required");
      next();
      j.w.raw("{\"role\":\"tool\",\"tool_call_id\":");
      j.w.str(id);
      j.w.raw(",\"content\":");
      if (output.is_string()) {
        j.w.str(output.get_string().value_unsafe());
      } else if (!content_parts(j, output, i, true)) {
        return false;
      }
      j.w.raw("}");
    } else if (type != "reasoning") {
      return j.fail(j.at("input[%u].type", i), "this item type cannot be carried");
    }
    ++i;
  }
  close_calls();
  return true;
}

bool tools_of(job& j, element tools) {
  if (!tools.is_array()) return j.fail("tools", "must be an array");
  j.w.raw(",\"tools\":[");
  uint32_t i = 0;
  for (element t : as_array(tools)) {
    if (get_string(t, "type") != "function") {
      return j.fail(j.at("tools[%u].type", i), "only function tools can be carried");
    }
    const std::string_view name = get_string(t, "name");
    if (name.empty()) return j.fail(j.at("tools[%u].name", i), "a function tool needs a name");
    function_tool_head(j, i++ == 0, name, get_string(t, "description"));
    element v;
    if (member(t, "parameters", v)) {
      j.w.raw(",\"parameters\":");
      raw_json(j.w, v);
    }
    bool strict = false;
    if (t["strict"].get_bool().get(strict) == simdjson::SUCCESS) j.w.raw(strict ? ",\"strict\":true" : ",\"strict\":false");
    j.w.raw("}}");
  }
  j.w.raw("]");
  return true;
}

bool tool_choice_of(job& j, element tc) {
  if (tc.is_string()) {
    const std::string_view s = tc.get_string().value_unsafe();
    if (s != "auto" && s != "none" && s != "required") return j.fail("tool_choice", "must be auto, none or required");
    j.w.raw(",\"tool_choice\":");
    j.w.str(s);
    return true;
  }
  const std::string_view name = get_string(tc, "name");
  if (get_string(tc, "type") != "function" || name.empty()) {
    return j.fail("tool_choice", "must be auto, none, required or a function by name");
  }
  j.w.raw(",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":");
  j.w.str(name);
  j.w.raw("}}");
  return true;
}

bool text_format(job& j, element text) {
  element format;
  if (!text.is_object() || !member(text, "format", format)) return true;
  const std::string_view type = get_string(format, "type");
  if (type == "text") return true;
  if (type == "json_object") {
    j.w.raw(",\"response_format\":{\"type\":\"json_object\"}");
    return true;
  }
  if (type != "json_schema") return j.fail("text.format.type", "must be text, json_object or json_schema");
  element schema;
  if (!member(format, "schema", schema) || !schema.is_object()) return j.fail("text.format.schema", "must be an object");
  j.w.raw(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":");
  const std::string_view name = get_string(format, "name");
  j.w.str(name.empty() ? std::string_view("response") : name);
  j.w.raw(",\"schema\":");
  raw_json(j.w, schema);
  bool strict = false;
  if (format["strict"].get_bool().get(strict) == simdjson::SUCCESS) j.w.raw(strict ? ",\"strict\":true" : ",\"strict\":false");
  j.w.raw("}}");
  return true;
}

}  // namespace

bool request_translator::responses(std::string_view body, std::string& out, translated_request& t,
                                   openai::request_error& err, std::string_view history, std::string* items) {
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
  if (model.empty()) return j.fail("model", "Missing required parameter: 'model'.");
  element v;
  if (member(root, "previous_response_id", v)) {
    if (!v.is_string() || v.get_string().value_unsafe().empty()) return j.fail("previous_response_id", "must be a response id");
    t.previous_response_id = v.get_string().value_unsafe();
  }
  if (member(root, "store", v) && v.get_bool().get(t.store) != simdjson::SUCCESS) return j.fail("store", "must be a boolean");
  element input;
  if (!member(root, "input", input)) return j.fail("input", "Missing required parameter: 'input'.");
  // The stored conversation this one continues (previous_response_id).
  element earlier;
  if (!history.empty()) {
    _history.clear();
    _history.reserve(history.size() + 2 + simdjson::SIMDJSON_PADDING);
    _history.push_back('[');
    _history.append(history.data(), history.size());
    _history.push_back(']');
    if (_history_parser.parse(_history).get(earlier) != simdjson::SUCCESS || !earlier.is_array()) {
      return j.fail("previous_response_id", "the stored conversation could not be read");
    }
  }
  w.raw("{\"model\":");
  w.str(model);
  w.raw(",\"messages\":[");
  uint32_t count = 0;
  if (member(root, "instructions", v)) {
    if (!v.is_string()) return j.fail("instructions", "must be a string");
    w.raw("{\"role\":\"system\",\"content\":");
    w.str(v.get_string().value_unsafe());
    w.raw("}");
    ++count;
  }
  if (input.is_string()) {
    if (!history.empty() && !input_items(j, {earlier}, count)) return false;
    w.raw(count++ == 0 ? "{\"role\":\"user\",\"content\":" : ",{\"role\":\"user\",\"content\":");
    w.str(input.get_string().value_unsafe());
    w.raw("}");
  } else if (input.is_array()) {
    // A conversation named but not given: its calls are not known here (a
    // native backend holds them; a translated group reads them in first).
    const bool on_trust = history.empty() && !t.previous_response_id.empty();
    if (!(history.empty() ? input_items(j, {input}, count, on_trust) : input_items(j, {earlier, input}, count))) return false;
    if (count == 0) return j.fail("input", "input: at least one message is required");
  } else {
    return j.fail("input", "must be a string or an array of items");
  }
  w.raw("]");
  if (items != nullptr) {
    // The conversation so far as items, for the response store (the
    // stored ones as read, so that the list is whole JSON whatever came).
    items->clear();
    if (!history.empty()) {
      for (element item : as_array(earlier)) {
        if (!items->empty()) items->push_back(',');
        *items += simdjson::minify(item);
      }
    }
    if (input.is_string()) {
      if (!items->empty()) items->push_back(',');
      openai::detail::string_sink isink{*items};
      writer iw(isink);
      iw.raw("{\"type\":\"message\",\"role\":\"user\",\"content\":");
      iw.str(input.get_string().value_unsafe());
      iw.raw("}");
    } else {
      for (element item : as_array(input)) {
        if (!items->empty()) items->push_back(',');
        *items += simdjson::minify(item);
      }
    }
  }
  if (member(root, "max_output_tokens", v)) {
    int64_t n = 0;
    if (v.get_int64().get(n) != simdjson::SUCCESS || n < 1) return j.fail("max_output_tokens", "must be a positive integer");
    w.raw(",\"max_tokens\":");
    w.num(n);
  }
  if (!copy_number(j, root, "temperature", "temperature") || !copy_number(j, root, "top_p", "top_p")) return false;
  if (member(root, "tools", v) && !tools_of(j, v)) return false;
  if (member(root, "tool_choice", v) && !tool_choice_of(j, v)) return false;
  bool flag = false;
  if (root["parallel_tool_calls"].get_bool().get(flag) == simdjson::SUCCESS && !flag) w.raw(",\"parallel_tool_calls\":false");
  if (member(root, "text", v) && !text_format(j, v)) return false;
  if (member(root, "reasoning", v) && v.is_object()) {
    const std::string_view effort = get_string(v, "effort");
    if (!effort.empty()) {
      w.raw(",\"reasoning_effort\":");
      w.str(effort);
    }
  }
  if (member(root, "stream", v) && v.get_bool().get(t.stream) != simdjson::SUCCESS) return j.fail("stream", "must be a boolean");
  if (t.stream) w.raw(",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
  w.raw("}");
  return true;
}

}  // namespace sluice::dialect
