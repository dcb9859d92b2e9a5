// openai: an OpenAI chat completions request -> an Anthropic Messages
// request. Anthropic wants strictly alternating user/assistant turns with
// content blocks, the system prompt apart, and tool results inside a user
// turn; OpenAI allows consecutive same-role messages and sends tool results
// as their own "tool" messages. So blocks are written into the turn their
// role maps to, and a turn is opened only when a message's role differs from
// the open one (consecutive tool results share one user turn, as Anthropic
// requires).
#include <cstdio>

#include "json_writer.hpp"
#include "sluice/core/assert.hpp"
#include "sluice/openai/anthropic.hpp"

namespace sluice::openai {

namespace {

using simdjson::dom::element;
using writer = detail::json_writer<detail::string_sink>;

bool fail(request_error& err, std::string_view param, std::string_view message) {
  err = {message, param, {}};
  return false;
}

std::string_view get_string(element obj, std::string_view key) {
  std::string_view v;
  return obj[key].get_string().get(v) == simdjson::SUCCESS ? v : std::string_view{};
}

// An element known to be an array, as a value: a range-for over
// `e.get_array().value_unsafe()` would keep a reference into a temporary.
simdjson::dom::array as_array(element e) {
  simdjson::dom::array a;
  const simdjson::error_code ec = e.get_array().get(a);
  SLUICE_ASSERT(ec == simdjson::SUCCESS);  // callers check is_array() first
  (void)ec;
  return a;
}

// The open turn: its role and how many blocks it holds. Opened lazily, on
// its first block, so a message without content leaves no empty turn
// (Anthropic refuses empty content).
struct turns {
  writer& w;
  std::string_view role;
  uint32_t blocks = 0;
  uint32_t count = 0;

  void block(std::string_view block_role) {
    if (block_role != role) {
      close();
      w.raw(count == 0 ? "{\"role\":" : ",{\"role\":");
      w.str(block_role);
      w.raw(",\"content\":[");
      role = block_role;
      ++count;
    } else if (blocks > 0) {
      w.raw(",");
    }
    ++blocks;
  }
  void close() {
    if (!role.empty()) w.raw("]}");
    role = {};
    blocks = 0;
  }
};

void text_block(turns& t, std::string_view role, std::string_view text) {
  if (text.empty()) return;  // Anthropic refuses empty text blocks
  t.block(role);
  t.w.raw("{\"type\":\"text\",\"text\":");
  t.w.str(text);
  t.w.raw("}");
}

// An image_url part: a data: URL becomes a base64 source, http(s) a url source.
bool image_block(turns& t, element part, request_error& err, std::string_view param) {
  std::string_view url;
  element image;
  if (part["image_url"].get(image) != simdjson::SUCCESS) return fail(err, param, "image_url part without image_url");
  url = image.is_string() ? std::string_view(image.get_string().value_unsafe()) : get_string(image, "url");
  t.block("user");
  if (url.starts_with("data:")) {
    size_t semi = url.find(";base64,");
    if (semi == std::string_view::npos) return fail(err, param, "an image data: URL must be base64-encoded");
    t.w.raw("{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":");
    t.w.str(url.substr(5, semi - 5));
    t.w.raw(",\"data\":");
    t.w.str(url.substr(semi + 8));
    t.w.raw("}}");
    return true;
  }
  if (!url.starts_with("http://") && !url.starts_with("https://")) {
    return fail(err, param, "an image URL must be data:, http: or https:");
  }
  t.w.raw("{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":");
  t.w.str(url);
  t.w.raw("}}");
  return true;
}

}  // namespace

bool anthropic_request_writer::write(std::string_view body, const anthropic_request_options& opts,
                                     std::string& out, request_error& err) {
  out.clear();
  element root;
  if (_parser.parse(body.data(), body.size(), true).get(root) != simdjson::SUCCESS || !root.is_object()) {
    return fail(err, {}, "the request body is not a JSON object");
  }
  simdjson::dom::array messages;
  if (root["messages"].get_array().get(messages) != simdjson::SUCCESS) {
    return fail(err, "messages", "messages must be an array");
  }
  int64_t n = 1;
  if (root["n"].get_int64().get(n) == simdjson::SUCCESS && n != 1) {
    return fail(err, "n", "this model's backend gives one choice per request: n must be 1");
  }

  detail::string_sink sink{out};
  writer w(sink);
  w.raw("{\"model\":");
  w.str(opts.model);
  int64_t max_tokens = opts.max_tokens_default;
  if (root["max_completion_tokens"].get_int64().get(max_tokens) != simdjson::SUCCESS &&
      root["max_tokens"].get_int64().get(max_tokens) != simdjson::SUCCESS) {
    max_tokens = opts.max_tokens_default;
  }
  w.raw(",\"max_tokens\":");
  w.num(max_tokens);

  // System and developer messages, in order, as text blocks of `system`.
  uint32_t system_blocks = 0;
  for (element m : messages) {
    std::string_view role = get_string(m, "role");
    if (role != "system" && role != "developer") continue;
    element content;
    if (m["content"].get(content) != simdjson::SUCCESS) continue;
    auto add = [&](std::string_view text) {
      if (text.empty()) return;
      w.raw(system_blocks++ == 0 ? ",\"system\":[" : ",");
      w.raw("{\"type\":\"text\",\"text\":");
      w.str(text);
      w.raw("}");
    };
    if (content.is_string()) add(content.get_string().value_unsafe());
    if (content.is_array()) {
      for (element part : as_array(content)) add(get_string(part, "text"));
    }
  }
  if (system_blocks > 0) w.raw("]");

  w.raw(",\"messages\":[");
  turns t{w, {}};
  uint32_t index = 0;
  for (element m : messages) {
    const uint32_t i = index++;
    std::string_view role = get_string(m, "role");
    if (role == "system" || role == "developer") continue;
    element content;
    const bool has_content = m["content"].get(content) == simdjson::SUCCESS && !content.is_null();
    if (role == "tool") {
      t.block("user");
      w.raw("{\"type\":\"tool_result\",\"tool_use_id\":");
      w.str(get_string(m, "tool_call_id"));
      w.raw(",\"content\":");
      if (has_content && content.is_string()) {
        w.str(content.get_string().value_unsafe());
      } else {
        w.raw("[");
        uint32_t parts = 0;
        if (has_content && content.is_array()) {
          for (element part : as_array(content)) {
            w.raw(parts++ == 0 ? "{\"type\":\"text\",\"text\":" : ",{\"type\":\"text\",\"text\":");
            w.str(get_string(part, "text"));
            w.raw("}");
          }
        }
        w.raw("]");
      }
      w.raw("}");
      continue;
    }
    if (role != "user" && role != "assistant") {
      std::snprintf(_param, sizeof(_param), "messages[%u].role", i);
      return fail(err, _param, "this model's backend takes system, user, assistant and tool messages only");
    }
    if (has_content && content.is_string()) text_block(t, role, content.get_string().value_unsafe());
    if (has_content && content.is_array()) {
      uint32_t j = 0;
      for (element part : as_array(content)) {
        std::snprintf(_param, sizeof(_param), "messages[%u].content[%u]", i, j++);
        std::string_view type = get_string(part, "type");
        if (type == "text") {
          text_block(t, role, get_string(part, "text"));
        } else if (type == "image_url" && role == "user") {
          if (!image_block(t, part, err, _param)) return false;
        } else {
          return fail(err, _param, "this content part type cannot be sent to this model's backend");
        }
      }
    }
    simdjson::dom::array calls;
    if (role != "assistant" || m["tool_calls"].get_array().get(calls) != simdjson::SUCCESS) continue;
    uint32_t k = 0;
    for (element call : calls) {
      std::snprintf(_param, sizeof(_param), "messages[%u].tool_calls[%u]", i, k++);
      element fn;
      if (call["function"].get(fn) != simdjson::SUCCESS) return fail(err, _param, "a tool call needs a function");
      std::string_view arguments = get_string(fn, "arguments");
      element parsed;
      if (arguments.empty()) arguments = "{}";
      if (_arguments.parse(arguments.data(), arguments.size(), true).get(parsed) != simdjson::SUCCESS ||
          !parsed.is_object()) {
        return fail(err, _param, "a tool call's arguments must be a JSON object");
      }
      t.block("assistant");
      w.raw("{\"type\":\"tool_use\",\"id\":");
      w.str(get_string(call, "id"));
      w.raw(",\"name\":");
      w.str(get_string(fn, "name"));
      w.raw(",\"input\":");
      w.raw(arguments);  // checked above: a JSON object, as the client wrote it
      w.raw("}");
    }
  }
  t.close();
  if (t.count == 0) return fail(err, "messages", "messages must hold at least one user or assistant message");
  w.raw("]");

  double number = 0;
  if (root["temperature"].get_double().get(number) == simdjson::SUCCESS) {
    // Anthropic's range is 0..1, OpenAI's 0..2: a value above 1 has no equivalent.
    if (number > 1.0) return fail(err, "temperature", "temperature must be at most 1 for this model's backend");
    w.raw(",\"temperature\":");
    w.num(number);
  }
  if (root["top_p"].get_double().get(number) == simdjson::SUCCESS) {
    w.raw(",\"top_p\":");
    w.num(number);
  }
  element stop;
  if (root["stop"].get(stop) == simdjson::SUCCESS && !stop.is_null()) {
    w.raw(",\"stop_sequences\":[");
    if (stop.is_string()) {
      w.str(stop.get_string().value_unsafe());
    } else if (stop.is_array()) {
      uint32_t s = 0;
      for (element e : as_array(stop)) {
        if (!e.is_string()) return fail(err, "stop", "stop must be a string or an array of strings");
        if (s++ > 0) w.raw(",");
        w.str(e.get_string().value_unsafe());
      }
    } else {
      return fail(err, "stop", "stop must be a string or an array of strings");
    }
    w.raw("]");
  }
  bool stream = false;
  if (root["stream"].get_bool().get(stream) == simdjson::SUCCESS && stream) w.raw(",\"stream\":true");

  simdjson::dom::array tools;
  if (root["tools"].get_array().get(tools) == simdjson::SUCCESS && tools.size() > 0) {
    w.raw(",\"tools\":[");
    uint32_t k = 0;
    for (element tool : tools) {
      element fn;
      if (tool["function"].get(fn) != simdjson::SUCCESS || get_string(tool, "type") != "function") {
        std::snprintf(_param, sizeof(_param), "tools[%u]", k);
        return fail(err, _param, "only function tools can be sent to this model's backend");
      }
      w.raw(k++ == 0 ? "{\"name\":" : ",{\"name\":");
      w.str(get_string(fn, "name"));
      std::string_view description = get_string(fn, "description");
      if (!description.empty()) {
        w.raw(",\"description\":");
        w.str(description);
      }
      element schema;
      w.raw(",\"input_schema\":");
      if (fn["parameters"].get(schema) == simdjson::SUCCESS && schema.is_object()) {
        w.raw(simdjson::to_string(schema));
      } else {
        w.raw("{\"type\":\"object\",\"properties\":{}}");
      }
      w.raw("}");
    }
    w.raw("]");
  }
  element choice;
  if (root["tool_choice"].get(choice) == simdjson::SUCCESS && !choice.is_null()) {
    std::string_view mode = choice.is_string() ? std::string_view(choice.get_string().value_unsafe()) : "";
    if (mode == "auto") {
      w.raw(",\"tool_choice\":{\"type\":\"auto\"}");
    } else if (mode == "required") {
      w.raw(",\"tool_choice\":{\"type\":\"any\"}");
    } else if (mode == "none") {
      w.raw(",\"tool_choice\":{\"type\":\"none\"}");
    } else if (choice.is_object()) {
      element fn;
      if (choice["function"].get(fn) != simdjson::SUCCESS) return fail(err, "tool_choice", "tool_choice needs a function");
      w.raw(",\"tool_choice\":{\"type\":\"tool\",\"name\":");
      w.str(get_string(fn, "name"));
      w.raw("}");
    } else {
      return fail(err, "tool_choice", "tool_choice must be auto, required, none or a function");
    }
  }
  w.raw("}");
  return true;
}

}  // namespace sluice::openai
