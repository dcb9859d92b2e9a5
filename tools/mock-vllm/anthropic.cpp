#include "anthropic.hpp"

#include <cmath>

#include "plan.hpp"
#include "wire.hpp"

namespace mock_vllm {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// The input JSON is cut where no piece is valid JSON alone, so a client
// that parses a piece instead of the concatenation is seen to fail.
constexpr std::string_view k_tool_pieces[k_tool_json_pieces] = {"{\"city\"", ":\"Par", "is\"}"};
constexpr std::string_view k_tool_input = "{\"city\":\"Paris\"}";

bool is_number(element e) {
  auto t = e.type();
  return t == element_type::INT64 || t == element_type::UINT64 || t == element_type::DOUBLE;
}

double number_value(element e) {
  switch (e.type()) {
    case element_type::INT64: return static_cast<double>(e.get_int64().value_unsafe());
    case element_type::UINT64: return static_cast<double>(e.get_uint64().value_unsafe());
    default: return e.get_double().value_unsafe();
  }
}

bool contains_weather(std::string_view text) {
  constexpr std::string_view word = "weather";
  for (size_t i = 0; i + word.size() <= text.size(); ++i) {
    size_t j = 0;
    while (j < word.size()) {
      char c = text[i + j];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      if (c != word[j]) break;
      ++j;
    }
    if (j == word.size()) return true;
  }
  return false;
}

// Text of a block list or a string: the words counted, and whether it says
// "weather". A tool_result's content (a string or text blocks) counts too.
bool read_content(element content, std::string_view where, uint32_t& words, bool& weather,
                  std::string& error) {
  std::string_view text;
  if (content.get(text) == simdjson::SUCCESS) {
    words += count_words(text);
    weather = weather || contains_weather(text);
    return true;
  }
  simdjson::dom::array blocks;
  if (content.get(blocks) != simdjson::SUCCESS) {
    error = std::string(where) + ": Input should be a valid string or a list of content blocks";
    return false;
  }
  for (element block : blocks) {
    simdjson::dom::object fields;
    std::string_view type;
    if (block.get(fields) != simdjson::SUCCESS || fields["type"].get(type) != simdjson::SUCCESS) {
      error = std::string(where) + ": each content block must be an object with a type";
      return false;
    }
    if (type == "text") {
      if (fields["text"].get(text) != simdjson::SUCCESS) {
        error = std::string(where) + ".text: Field required";
        return false;
      }
      words += count_words(text);
      weather = weather || contains_weather(text);
    } else if (type == "tool_result") {
      element inner;
      if (fields["content"].get(inner) == simdjson::SUCCESS &&
          !read_content(inner, where, words, weather, error)) {
        return false;
      }
    }
    // image, tool_use, document...: no words.
  }
  return true;
}

void begin_event(std::string& scratch, std::string_view type) {
  scratch.clear();
  scratch += "event: ";
  scratch += type;
  scratch += "\ndata: ";
}

void end_event(std::string& out, std::string& scratch) {
  scratch += "\n\n";
  append_chunk(out, scratch);
}

void append_message_head(std::string& out, std::string_view id, std::string_view model) {
  out += "{\"id\":";
  append_json_string(out, id);
  out += ",\"type\":\"message\",\"role\":\"assistant\",\"model\":";
  append_json_string(out, model);
}

void append_usage(std::string& out, uint32_t input_tokens, uint32_t output_tokens) {
  out += "\"usage\":{\"input_tokens\":";
  append_uint(out, input_tokens);
  out += ",\"output_tokens\":";
  append_uint(out, output_tokens);
  out += '}';
}

}  // namespace

bool make_anthropic_plan(simdjson::dom::parser& parser, const std::string& body, uint32_t reply_tokens,
                         anthropic_plan& out, std::string& error) {
  out = anthropic_plan{.tool_name = std::move(out.tool_name)};
  out.tool_name.clear();
  element root;
  auto parsed = parser.parse(simdjson::padded_string_view(body.data(), body.size(), body.capacity()));
  if (parsed.get(root) != simdjson::SUCCESS) {
    error = "The request body is not valid JSON.";
    return false;
  }
  simdjson::dom::object obj;
  if (root.get(obj) != simdjson::SUCCESS) {
    error = "The request body must be a JSON object.";
    return false;
  }
  std::string_view model;
  if (obj["model"].get(model) != simdjson::SUCCESS) {
    error = "model: Field required";
    return false;
  }

  element max_tokens;
  if (obj["max_tokens"].get(max_tokens) != simdjson::SUCCESS) {
    error = "max_tokens: Field required";
    return false;
  }
  int64_t limit = 0;
  if (max_tokens.get(limit) != simdjson::SUCCESS) {
    error = "max_tokens: Input should be a valid integer";
    return false;
  }
  if (limit < 1) {
    error = "max_tokens: Input should be greater than or equal to 1";
    return false;
  }

  element system;
  if (obj["system"].get(system) == simdjson::SUCCESS && !system.is_null()) {
    // The system prompt counts as one chat message, as on the OpenAI path.
    bool ignored = false;
    out.prompt_tokens += 4;
    if (!read_content(system, "system", out.prompt_tokens, ignored, error)) return false;
  }

  simdjson::dom::array messages;
  element m;
  if (obj["messages"].get(m) != simdjson::SUCCESS) {
    error = "messages: Field required";
    return false;
  }
  if (m.get(messages) != simdjson::SUCCESS) {
    error = "messages: Input should be a valid list";
    return false;
  }
  bool last_user_weather = false;
  size_t index = 0;
  for (element message : messages) {
    std::string where = "messages." + std::to_string(index++);
    simdjson::dom::object fields;
    std::string_view role;
    if (message.get(fields) != simdjson::SUCCESS) {
      error = where + ": Input should be a valid dictionary";
      return false;
    }
    if (fields["role"].get(role) != simdjson::SUCCESS || (role != "user" && role != "assistant")) {
      error = where + ".role: Input should be 'user' or 'assistant'";
      return false;
    }
    element content;
    if (fields["content"].get(content) != simdjson::SUCCESS) {
      error = where + ".content: Field required";
      return false;
    }
    bool weather = false;
    out.prompt_tokens += 4;
    if (!read_content(content, where + ".content", out.prompt_tokens, weather, error)) return false;
    if (role == "user") last_user_weather = weather;
  }

  element stream;
  if (obj["stream"].get(stream) == simdjson::SUCCESS && !stream.is_null()) {
    if (!stream.is_bool()) {
      error = "stream: Input should be a valid boolean";
      return false;
    }
    out.stream = stream.get_bool().value_unsafe();
  }
  for (std::string_view key : {"temperature", "top_p"}) {
    element v;
    if (obj[key].get(v) != simdjson::SUCCESS || v.is_null()) continue;
    if (!is_number(v) || number_value(v) < 0.0 || number_value(v) > 1.0) {
      error = std::string(key) + ": Input should be a number between 0 and 1";
      return false;
    }
  }
  element stops;
  if (obj["stop_sequences"].get(stops) == simdjson::SUCCESS && !stops.is_null()) {
    simdjson::dom::array list;
    if (stops.get(list) != simdjson::SUCCESS) {
      error = "stop_sequences: Input should be a valid list";
      return false;
    }
    for (element s : list) {
      if (!s.is_string()) {
        error = "stop_sequences: each item should be a valid string";
        return false;
      }
    }
  }
  element tools;
  bool have_tool = false;
  if (obj["tools"].get(tools) == simdjson::SUCCESS && !tools.is_null()) {
    simdjson::dom::array list;
    if (tools.get(list) != simdjson::SUCCESS) {
      error = "tools: Input should be a valid list";
      return false;
    }
    for (element tool : list) {
      std::string_view name;
      if (tool["name"].get(name) != simdjson::SUCCESS) {
        error = "tools: each tool needs a name";
        return false;
      }
      if (!have_tool) out.tool_name.assign(name);
      have_tool = true;
    }
  }

  if (have_tool && last_user_weather) {
    out.tool_use = true;
    out.tokens = k_tool_json_pieces;
    return true;
  }
  out.tokens = reply_tokens;
  if (limit < static_cast<int64_t>(reply_tokens)) {
    out.tokens = static_cast<uint32_t>(limit);
    out.ends_by_length = true;
  }
  return true;
}

std::string_view anthropic_error_type(int status) noexcept {
  switch (status) {
    case 400:
    case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

void append_anthropic_error_body(std::string& out, std::string_view type, std::string_view message) {
  out += "{\"type\":\"error\",\"error\":{\"type\":";
  append_json_string(out, type);
  out += ",\"message\":";
  append_json_string(out, message);
  out += "}}";
}

void append_message_body(std::string& out, std::string_view id, std::string_view model, uint32_t tokens,
                         bool ends_by_length, uint32_t prompt_tokens, uint32_t token_pad) {
  append_message_head(out, id, model);
  out += ",\"content\":[{\"type\":\"text\",\"text\":\"";
  for (uint32_t i = 0; i < tokens; ++i) append_token_text(out, i, token_pad);
  out += ends_by_length ? "\"}],\"stop_reason\":\"max_tokens\"" : "\"}],\"stop_reason\":\"end_turn\"";
  out += ",\"stop_sequence\":null,";
  append_usage(out, prompt_tokens, tokens);
  out += '}';
}

void append_tool_message_body(std::string& out, std::string_view id, std::string_view model,
                              std::string_view tool_id, std::string_view tool_name,
                              uint32_t prompt_tokens, uint32_t output_tokens) {
  append_message_head(out, id, model);
  out += ",\"content\":[{\"type\":\"tool_use\",\"id\":";
  append_json_string(out, tool_id);
  out += ",\"name\":";
  append_json_string(out, tool_name);
  out += ",\"input\":";
  out += k_tool_input;
  out += "}],\"stop_reason\":\"tool_use\",\"stop_sequence\":null,";
  append_usage(out, prompt_tokens, output_tokens);
  out += '}';
}

void append_message_start_event(std::string& out, std::string& scratch, std::string_view id,
                                std::string_view model, uint32_t prompt_tokens) {
  begin_event(scratch, "message_start");
  scratch += "{\"type\":\"message_start\",\"message\":";
  append_message_head(scratch, id, model);
  scratch += ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,";
  append_usage(scratch, prompt_tokens, 1);
  scratch += "}}";
  end_event(out, scratch);
}

void append_text_block_start_event(std::string& out, std::string& scratch) {
  begin_event(scratch, "content_block_start");
  scratch += "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}";
  end_event(out, scratch);
}

void append_tool_block_start_event(std::string& out, std::string& scratch, std::string_view tool_id,
                                   std::string_view tool_name) {
  begin_event(scratch, "content_block_start");
  scratch += "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":";
  append_json_string(scratch, tool_id);
  scratch += ",\"name\":";
  append_json_string(scratch, tool_name);
  scratch += ",\"input\":{}}}";
  end_event(out, scratch);
}

void append_ping_event(std::string& out, std::string& scratch) {
  begin_event(scratch, "ping");
  scratch += "{\"type\":\"ping\"}";
  end_event(out, scratch);
}

void append_text_delta_event(std::string& out, std::string& scratch, uint32_t index, uint32_t token_pad) {
  begin_event(scratch, "content_block_delta");
  scratch += "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"";
  append_token_text(scratch, index, token_pad);
  scratch += "\"}}";
  end_event(out, scratch);
}

void append_json_delta_event(std::string& out, std::string& scratch, uint32_t index) {
  begin_event(scratch, "content_block_delta");
  scratch += "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":";
  append_json_string(scratch, tool_input_piece(index));
  scratch += "}}";
  end_event(out, scratch);
}

void append_block_stop_event(std::string& out, std::string& scratch) {
  begin_event(scratch, "content_block_stop");
  scratch += "{\"type\":\"content_block_stop\",\"index\":0}";
  end_event(out, scratch);
}

void append_message_delta_event(std::string& out, std::string& scratch, std::string_view stop_reason,
                                uint32_t output_tokens) {
  begin_event(scratch, "message_delta");
  scratch += "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":";
  append_json_string(scratch, stop_reason);
  scratch += ",\"stop_sequence\":null},\"usage\":{\"output_tokens\":";
  append_uint(scratch, output_tokens);
  scratch += "}}";
  end_event(out, scratch);
}

void append_message_stop_event(std::string& out, std::string& scratch) {
  begin_event(scratch, "message_stop");
  scratch += "{\"type\":\"message_stop\"}";
  end_event(out, scratch);
  out += "0\r\n\r\n";
}

void append_stream_error_event(std::string& out, std::string& scratch, std::string_view type,
                               std::string_view message) {
  begin_event(scratch, "error");
  append_anthropic_error_body(scratch, type, message);
  end_event(out, scratch);
}

std::string_view tool_input_json() noexcept { return k_tool_input; }

std::string_view tool_input_piece(uint32_t index) noexcept {
  return index < k_tool_json_pieces ? k_tool_pieces[index] : std::string_view{};
}

}  // namespace mock_vllm
