// openai: an OpenAI chat completions request -> an Anthropic Messages
// request. Anthropic wants strictly alternating user/assistant turns with
// content blocks, the system prompt apart, and tool results inside a user
// turn; OpenAI allows consecutive same-role messages and sends tool results
// as their own "tool" messages. So blocks are written into the turn their
// role maps to, and a turn is opened only when a message's role differs from
// the open one (consecutive tool results share one user turn, as Anthropic
// requires).
#include <cstdarg>
#include <cstdio>
#include <initializer_list>

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

// One translation's shared parts: the output, the error, and the writer's
// buffer for a param that names an index ("messages[3].content[1]").
struct job {
  writer& w;
  request_error& err;
  char* param;
  size_t param_cap;
  simdjson::dom::parser& arguments;

  [[gnu::format(printf, 2, 3)]] const char* at(const char* format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(param, param_cap, format, args);
    va_end(args);
    return param;
  }
};

// System and developer messages, in order, as text blocks of `system`.
void write_system(job& j, simdjson::dom::array messages) {
  uint32_t blocks = 0;
  auto add = [&](std::string_view text) {
    if (text.empty()) return;
    j.w.raw(blocks++ == 0 ? ",\"system\":[" : ",");
    j.w.raw("{\"type\":\"text\",\"text\":");
    j.w.str(text);
    j.w.raw("}");
  };
  for (element m : messages) {
    std::string_view role = get_string(m, "role");
    element content;
    if ((role != "system" && role != "developer") || m["content"].get(content) != simdjson::SUCCESS) continue;
    if (content.is_string()) add(content.get_string().value_unsafe());
    if (content.is_array()) {
      for (element part : as_array(content)) add(get_string(part, "text"));
    }
  }
  if (blocks > 0) j.w.raw("]");
}

// A "tool" message: a tool_result block in the user turn.
void write_tool_result(job& j, turns& t, element m, element content, bool has_content) {
  t.block("user");
  j.w.raw("{\"type\":\"tool_result\",\"tool_use_id\":");
  j.w.str(get_string(m, "tool_call_id"));
  j.w.raw(",\"content\":");
  if (has_content && content.is_string()) {
    j.w.str(content.get_string().value_unsafe());
  } else {
    j.w.raw("[");
    uint32_t parts = 0;
    if (has_content && content.is_array()) {
      for (element part : as_array(content)) {
        j.w.raw(parts++ == 0 ? "{\"type\":\"text\",\"text\":" : ",{\"type\":\"text\",\"text\":");
        j.w.str(get_string(part, "text"));
        j.w.raw("}");
      }
    }
    j.w.raw("]");
  }
  j.w.raw("}");
}

// An assistant message's tool_calls as tool_use blocks. `arguments` is a
// JSON string in OpenAI, an object in Anthropic: it is checked to be one and
// then copied as the client wrote it.
bool write_tool_calls(job& j, turns& t, element m, uint32_t i) {
  simdjson::dom::array calls;
  if (m["tool_calls"].get_array().get(calls) != simdjson::SUCCESS) return true;
  uint32_t k = 0;
  for (element call : calls) {
    const char* param = j.at("messages[%u].tool_calls[%u]", i, k++);
    element fn;
    if (call["function"].get(fn) != simdjson::SUCCESS) return fail(j.err, param, "a tool call needs a function");
    std::string_view arguments = get_string(fn, "arguments");
    element parsed;
    if (arguments.empty()) arguments = "{}";
    if (j.arguments.parse(arguments.data(), arguments.size(), true).get(parsed) != simdjson::SUCCESS ||
        !parsed.is_object()) {
      return fail(j.err, param, "a tool call's arguments must be a JSON object");
    }
    t.block("assistant");
    j.w.raw("{\"type\":\"tool_use\",\"id\":");
    j.w.str(get_string(call, "id"));
    j.w.raw(",\"name\":");
    j.w.str(get_string(fn, "name"));
    j.w.raw(",\"input\":");
    j.w.raw(arguments);
    j.w.raw("}");
  }
  return true;
}

// One non-system message (index i) into the turns.
bool write_message(job& j, turns& t, element m, uint32_t i) {
  std::string_view role = get_string(m, "role");
  if (role == "system" || role == "developer") return true;
  element content;
  const bool has_content = m["content"].get(content) == simdjson::SUCCESS && !content.is_null();
  if (role == "tool") {
    write_tool_result(j, t, m, content, has_content);
    return true;
  }
  if (role != "user" && role != "assistant") {
    return fail(j.err, j.at("messages[%u].role", i),
                "this model's backend takes system, user, assistant and tool messages only");
  }
  if (has_content && content.is_string()) text_block(t, role, content.get_string().value_unsafe());
  if (has_content && content.is_array()) {
    uint32_t k = 0;
    for (element part : as_array(content)) {
      const char* param = j.at("messages[%u].content[%u]", i, k++);
      std::string_view type = get_string(part, "type");
      if (type == "text") {
        text_block(t, role, get_string(part, "text"));
      } else if (type == "image_url" && role == "user") {
        if (!image_block(t, part, j.err, param)) return false;
      } else {
        return fail(j.err, param, "this content part type cannot be sent to this model's backend");
      }
    }
  }
  return role != "assistant" || write_tool_calls(j, t, m, i);
}

// temperature, top_p, stop -> stop_sequences, stream.
bool write_sampling(job& j, element root) {
  double number = 0;
  if (root["temperature"].get_double().get(number) == simdjson::SUCCESS) {
    // Anthropic's range is 0..1, OpenAI's 0..2: a value above 1 has no equivalent.
    if (number > 1.0) return fail(j.err, "temperature", "temperature must be at most 1 for this model's backend");
    j.w.raw(",\"temperature\":");
    j.w.num(number);
  }
  if (root["top_p"].get_double().get(number) == simdjson::SUCCESS) {
    j.w.raw(",\"top_p\":");
    j.w.num(number);
  }
  element stop;
  if (root["stop"].get(stop) == simdjson::SUCCESS && !stop.is_null()) {
    if (!stop.is_string() && !stop.is_array()) return fail(j.err, "stop", "stop must be a string or an array of strings");
    j.w.raw(",\"stop_sequences\":[");
    if (stop.is_string()) {
      j.w.str(stop.get_string().value_unsafe());
    } else {
      uint32_t s = 0;
      for (element e : as_array(stop)) {
        if (!e.is_string()) return fail(j.err, "stop", "stop must be a string or an array of strings");
        if (s++ > 0) j.w.raw(",");
        j.w.str(e.get_string().value_unsafe());
      }
    }
    j.w.raw("]");
  }
  bool stream = false;
  if (root["stream"].get_bool().get(stream) == simdjson::SUCCESS && stream) j.w.raw(",\"stream\":true");
  return true;
}

// tools[].function -> tools[] {name, description, input_schema}.
bool write_tools(job& j, element root) {
  simdjson::dom::array tools;
  if (root["tools"].get_array().get(tools) != simdjson::SUCCESS || tools.size() == 0) return true;
  j.w.raw(",\"tools\":[");
  uint32_t k = 0;
  for (element tool : tools) {
    element fn;
    if (tool["function"].get(fn) != simdjson::SUCCESS || get_string(tool, "type") != "function") {
      return fail(j.err, j.at("tools[%u]", k), "only function tools can be sent to this model's backend");
    }
    j.w.raw(k++ == 0 ? "{\"name\":" : ",{\"name\":");
    j.w.str(get_string(fn, "name"));
    std::string_view description = get_string(fn, "description");
    if (!description.empty()) {
      j.w.raw(",\"description\":");
      j.w.str(description);
    }
    element schema;
    j.w.raw(",\"input_schema\":");
    if (fn["parameters"].get(schema) == simdjson::SUCCESS && schema.is_object()) {
      j.w.raw(simdjson::to_string(schema));
    } else {
      j.w.raw("{\"type\":\"object\",\"properties\":{}}");
    }
    j.w.raw("}");
  }
  j.w.raw("]");
  return true;
}

// tool_choice: auto -> auto, required -> any, none -> none, a function ->
// tool; parallel_tool_calls false -> disable_parallel_tool_use (Anthropic
// keeps it inside tool_choice, so it needs one: auto when none was given).
bool write_tool_choice(job& j, element root) {
  bool parallel = true;
  const bool serial = root["parallel_tool_calls"].get_bool().get(parallel) == simdjson::SUCCESS && !parallel;
  element choice;
  if (root["tool_choice"].get(choice) != simdjson::SUCCESS || choice.is_null()) {
    if (serial) j.w.raw(",\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true}");
    return true;
  }
  std::string_view mode = choice.is_string() ? std::string_view(choice.get_string().value_unsafe()) : "";
  element fn;
  if (mode == "auto" || mode == "none") {
    j.w.raw(",\"tool_choice\":{\"type\":");
    j.w.str(mode);
  } else if (mode == "required") {
    j.w.raw(",\"tool_choice\":{\"type\":\"any\"");
  } else if (choice.is_object() && choice["function"].get(fn) == simdjson::SUCCESS) {
    j.w.raw(",\"tool_choice\":{\"type\":\"tool\",\"name\":");
    j.w.str(get_string(fn, "name"));
  } else {
    return fail(j.err, "tool_choice", "tool_choice must be auto, required, none or a function");
  }
  j.w.raw(serial && mode != "none" ? ",\"disable_parallel_tool_use\":true}" : "}");
  return true;
}

// The body as a JSON object in `root`. Returns: false with `err` set when it is not one.
bool parse_object(simdjson::dom::parser& parser, std::string_view body, element& root, request_error& err) {
  if (parser.parse(body.data(), body.size(), true).get(root) != simdjson::SUCCESS || !root.is_object()) {
    return fail(err, {}, "the request body is not a JSON object");
  }
  return true;
}

// The request's opening: {"model":M,"max_tokens":N. Anthropic requires
// max_tokens: the first of `keys` the client gave, else the default.
void write_head(writer& w, element root, const anthropic_request_options& opts,
                std::initializer_list<std::string_view> keys) {
  int64_t max_tokens = opts.max_tokens_default;
  for (std::string_view key : keys) {
    if (root[key].get_int64().get(max_tokens) == simdjson::SUCCESS) break;
    max_tokens = opts.max_tokens_default;
  }
  w.raw("{\"model\":");
  w.str(opts.model);
  w.raw(",\"max_tokens\":");
  w.num(max_tokens);
}

// A member is there with a value other than null (and false, for `echo`).
bool given(element root, std::string_view key) {
  element v;
  bool flag = true;
  if (root[key].get(v) != simdjson::SUCCESS || v.is_null()) return false;
  return v.get_bool().get(flag) != simdjson::SUCCESS || flag;
}

// user -> metadata.user_id, the one piece of OpenAI's end-user tracking
// Anthropic has.
void write_metadata(job& j, element root) {
  std::string_view user = get_string(root, "user");
  if (user.empty()) return;
  j.w.raw(",\"metadata\":{\"user_id\":");
  j.w.str(user);
  j.w.raw("}");
}

}  // namespace

bool anthropic_request_writer::write(std::string_view body, const anthropic_request_options& opts,
                                     std::string& out, request_error& err) {
  out.clear();
  element root;
  if (!parse_object(_parser, body, root, err)) return false;
  simdjson::dom::array messages;
  if (root["messages"].get_array().get(messages) != simdjson::SUCCESS) {
    return fail(err, "messages", "messages must be an array");
  }
  int64_t n = 1;
  if (root["n"].get_int64().get(n) == simdjson::SUCCESS && n != 1) {
    return fail(err, "n", "this model's backend gives one choice per request: n must be 1");
  }
  bool logprobs = false;
  if (root["logprobs"].get_bool().get(logprobs) == simdjson::SUCCESS && logprobs) {
    return fail(err, "logprobs", "this model's backend does not return logprobs");
  }

  detail::string_sink sink{out};
  writer w(sink);
  job j{w, err, _param, sizeof(_param), _arguments};
  write_head(w, root, opts, {"max_completion_tokens", "max_tokens"});
  write_system(j, messages);

  w.raw(",\"messages\":[");
  turns t{w, {}};
  uint32_t i = 0;
  for (element m : messages) {
    if (!write_message(j, t, m, i++)) return false;
  }
  t.close();
  if (t.count == 0) return fail(err, "messages", "messages must hold at least one user or assistant message");
  w.raw("]");
  if (!write_sampling(j, root) || !write_tools(j, root) || !write_tool_choice(j, root)) return false;
  write_metadata(j, root);
  w.raw("}");
  return true;
}

bool anthropic_request_writer::write_completion(std::string_view body, const anthropic_request_options& opts,
                                                std::string& out, request_error& err) {
  out.clear();
  element root;
  if (!parse_object(_parser, body, root, err)) return false;
  // A Messages reply is one answer to one conversation, without
  // probabilities: what asks for more has no equivalent.
  int64_t choices = 1;
  for (std::string_view key : {"n", "best_of"}) {
    if (root[key].get_int64().get(choices) == simdjson::SUCCESS && choices > 1) {
      return fail(err, key,
                  "this model's backend (the Anthropic Messages API) gives one choice per request: n and best_of "
                  "must be 1");
    }
  }
  if (given(root, "echo")) return fail(err, "echo", "this model's backend (the Anthropic Messages API) cannot echo the prompt");
  if (given(root, "logprobs")) {
    return fail(err, "logprobs", "this model's backend (the Anthropic Messages API) does not return logprobs");
  }
  if (given(root, "suffix")) {
    return fail(err, "suffix", "this model's backend (the Anthropic Messages API) cannot complete before a suffix");
  }
  element prompt;
  simdjson::dom::array list;
  std::string_view text;
  if (root["prompt"].get(prompt) != simdjson::SUCCESS ||
      (prompt.get_string().get(text) != simdjson::SUCCESS &&
       (prompt.get_array().get(list) != simdjson::SUCCESS || list.size() != 1 ||
        list.at(0).get_string().get(text) != simdjson::SUCCESS))) {
    return fail(err, "prompt",
                "this model's backend (the Anthropic Messages API) takes one text prompt: 'prompt' must be a string "
                "or an array of one string");
  }

  detail::string_sink sink{out};
  writer w(sink);
  job j{w, err, _param, sizeof(_param), _arguments};
  write_head(w, root, opts, {"max_tokens"});
  w.raw(",\"messages\":[");
  turns t{w, {}};
  text_block(t, "user", text);
  t.close();
  if (t.count == 0) return fail(err, "prompt", "this model's backend needs a prompt that is not empty");
  w.raw("]");
  if (!write_sampling(j, root)) return false;
  write_metadata(j, root);
  w.raw("}");
  return true;
}

}  // namespace sluice::openai
