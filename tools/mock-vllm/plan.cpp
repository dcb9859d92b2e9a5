#include "plan.hpp"

#include <cmath>

namespace mock_vllm {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

uint64_t fnv1a(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// A JSON integer, or a float with an integral value (pydantic accepts 5.0).
bool read_integer(element e, int64_t& out) {
  switch (e.type()) {
    case element_type::INT64: out = e.get_int64().value_unsafe(); return true;
    case element_type::UINT64: out = INT64_MAX; return true;
    case element_type::DOUBLE: {
      double d = e.get_double().value_unsafe();
      if (std::floor(d) != d || std::fabs(d) > 9e18) return false;
      out = static_cast<int64_t>(d);
      return true;
    }
    default: return false;
  }
}

// Optional<int> field: absent or null leaves `out` at -1.
bool read_optional_max(simdjson::dom::object obj, std::string_view key, int64_t& out,
                       std::string& error) {
  element e;
  if (obj.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return true;
  if (!read_integer(e, out)) {
    error = std::string(key) + ": Input should be a valid integer";
    return false;
  }
  if (out < 1) {
    error = std::string(key) + " must be at least 1, got " + std::to_string(out) + ".";
    return false;
  }
  return true;
}

// Words of a chat message's content: a string, null, or an array of parts.
bool content_words(element content, uint32_t& words, std::string& error) {
  switch (content.type()) {
    case element_type::NULL_VALUE: return true;
    case element_type::STRING: {
      std::string_view text;
      if (content.get(text) != simdjson::SUCCESS) return false;
      words += count_words(text);
      return true;
    }
    case element_type::ARRAY: {
      simdjson::dom::array parts;
      if (content.get(parts) != simdjson::SUCCESS) return false;
      for (element part : parts) {
        std::string_view text;
        simdjson::dom::object fields;
        if (part.get(fields) == simdjson::SUCCESS && fields["text"].get(text) == simdjson::SUCCESS) {
          words += count_words(text);
        }
      }
      return true;
    }
    default: error = "messages: content must be a string, an array or null"; return false;
  }
}

bool is_number(element e) {
  auto t = e.type();
  return t == element_type::INT64 || t == element_type::UINT64 || t == element_type::DOUBLE;
}

// A list of token ids: counts them and hashes them as one input.
bool read_token_list(simdjson::dom::array ids, plan& out) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (element id : ids) {
    int64_t v = 0;
    if (!read_integer(id, v)) return false;
    h = fnv1a(std::string_view(reinterpret_cast<const char*>(&v), sizeof v), h);
    ++out.prompt_tokens;
  }
  out.input_hashes.push_back(h);
  return true;
}

// A completions prompt or an embeddings input: a string, an array of
// strings, an array of token ids, or an array of arrays of token ids.
// Fills the prompt token count and one hash per separate input.
bool read_inputs(element value, std::string_view name, plan& out, std::string& error) {
  auto bad = [&] {
    error = std::string(name) + ": must be a string, an array of strings or of token ids";
    return false;
  };
  std::string_view text;
  if (value.get(text) == simdjson::SUCCESS) {
    out.prompt_tokens += count_words(text);
    out.input_hashes.push_back(fnv1a(text));
    return true;
  }
  simdjson::dom::array items;
  if (value.get(items) != simdjson::SUCCESS) return bad();
  bool first = true;
  for (element item : items) {
    if (first && is_number(item)) return read_token_list(items, out) ? true : bad();
    first = false;
    simdjson::dom::array ids;
    if (item.get(text) == simdjson::SUCCESS) {
      out.prompt_tokens += count_words(text);
      out.input_hashes.push_back(fnv1a(text));
    } else if (item.get(ids) == simdjson::SUCCESS) {
      if (!read_token_list(ids, out)) return bad();
    } else {
      return bad();
    }
  }
  if (first) {
    error = std::string(name) + ": must not be empty";
    return false;
  }
  return true;
}

}  // namespace

uint32_t count_words(std::string_view text) noexcept {
  uint32_t words = 0;
  bool in_word = false;
  for (char c : text) {
    bool space = is_space(c);
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

bool make_plan(simdjson::dom::parser& parser, const std::string& body, endpoint kind,
               uint32_t reply_tokens, plan& out, std::string& error) {
  out = plan{.input_hashes = std::move(out.input_hashes)};
  out.input_hashes.clear();
  element root;
  auto parsed = parser.parse(simdjson::padded_string_view(body.data(), body.size(), body.capacity()));
  if (parsed.get(root) != simdjson::SUCCESS) {
    error = "JSON decode error: the request body is not valid JSON";
    return false;
  }
  simdjson::dom::object obj;
  if (root.get(obj) != simdjson::SUCCESS) {
    error = "Input should be a valid dictionary or object to extract fields from";
    return false;
  }

  if (kind == endpoint::embedding) {
    element input;
    if (obj.at_key("input").get(input) != simdjson::SUCCESS) {
      error = "input: Field required";
      return false;
    }
    return read_inputs(input, "input", out, error);
  }

  if (kind == endpoint::chat) {
    simdjson::dom::array messages;
    element m;
    if (obj.at_key("messages").get(m) != simdjson::SUCCESS) {
      error = "messages: Field required";
      return false;
    }
    if (m.get(messages) != simdjson::SUCCESS) {
      error = "messages: Input should be a valid list";
      return false;
    }
    for (element message : messages) {
      if (!message.is_object()) {
        error = "messages: each message must be an object";
        return false;
      }
      out.prompt_tokens += 4;
      element content;
      if (message["content"].get(content) == simdjson::SUCCESS &&
          !content_words(content, out.prompt_tokens, error)) {
        return false;
      }
    }
  } else {
    element prompt;
    if (obj.at_key("prompt").get(prompt) != simdjson::SUCCESS) {
      error = "prompt: Field required";
      return false;
    }
    if (!read_inputs(prompt, "prompt", out, error)) return false;
    out.input_hashes.clear();
  }

  element stream;
  if (obj.at_key("stream").get(stream) == simdjson::SUCCESS && !stream.is_null()) {
    if (!stream.is_bool()) {
      error = "stream: Input should be a valid boolean";
      return false;
    }
    out.stream = stream.get_bool().value_unsafe();
  }
  element stream_options;
  if (obj.at_key("stream_options").get(stream_options) == simdjson::SUCCESS && !stream_options.is_null()) {
    if (!out.stream) {
      error = "Stream options can only be defined when `stream=True`.";
      return false;
    }
    if (!stream_options.is_object()) {
      error = "stream_options: Input should be a valid dictionary";
      return false;
    }
    // vLLM's StreamOptions.include_usage defaults to True when the object is there.
    out.include_usage = true;
    element include;
    if (stream_options["include_usage"].get(include) == simdjson::SUCCESS && !include.is_null()) {
      if (!include.is_bool()) {
        error = "stream_options.include_usage: Input should be a valid boolean";
        return false;
      }
      out.include_usage = include.get_bool().value_unsafe();
    }
  }

  int64_t max_tokens = -1;
  int64_t max_completion_tokens = -1;
  if (!read_optional_max(obj, "max_tokens", max_tokens, error)) return false;
  if (kind == endpoint::chat &&
      !read_optional_max(obj, "max_completion_tokens", max_completion_tokens, error)) {
    return false;
  }
  int64_t limit = max_completion_tokens > 0 ? max_completion_tokens : max_tokens;
  out.tokens = reply_tokens;
  if (limit > 0 && limit < static_cast<int64_t>(reply_tokens)) {
    out.tokens = static_cast<uint32_t>(limit);
    out.ends_by_length = true;
  }
  return true;
}

}  // namespace mock_vllm
