// openai: chat templates. Each built-in follows the model family's Jinja
// template as its tokenizer_config.json ships it, minus the parts a text
// prompt has no use for (tools, multimodal); the strings are spelled out
// here so the prompt the backend sees is reviewable byte for byte.
#include "sluice/openai/chat_template.hpp"

#include <cstring>

namespace sluice::openai {
namespace {

using element = simdjson::dom::element;

enum class role : uint8_t { system, user, assistant };

// One message, checked: its role, and its content as an element (null
// content = empty, as for an assistant turn).
struct message {
  role who = role::user;
  element content;
  bool has_content = false;
};

bool refuse(request_error& err, std::string_view message, std::string_view param) noexcept {
  err.message = message;
  err.param = param;
  err.code = {};
  return false;
}

// Returns: false with `err` set for what a text prompt cannot carry.
bool read_message(element m, message& out, request_error& err) noexcept {
  std::string_view r;
  out = message{};
  for (auto kv : simdjson::dom::object(m)) {
    if (kv.key == "role" && kv.value.is_string()) {
      r = std::string_view(kv.value);
    } else if (kv.key == "content" && !kv.value.is_null()) {
      out.content = kv.value;
      out.has_content = true;
    } else if ((kv.key == "tool_calls" || kv.key == "function_call") && !kv.value.is_null()) {
      if (!kv.value.is_array() || simdjson::dom::array(kv.value).size() > 0) {
        return refuse(err,
                      "This model group takes a text prompt: tool calls in messages are not "
                      "supported.",
                      "messages");
      }
    }
  }
  if (r == "system" || r == "developer") {
    out.who = role::system;
  } else if (r == "user") {
    out.who = role::user;
  } else if (r == "assistant") {
    out.who = role::assistant;
  } else if (r == "tool" || r == "function") {
    return refuse(err,
                  "This model group takes a text prompt: tool messages are not supported.",
                  "messages");
  } else {
    return refuse(err,
                  "Invalid 'messages': each role must be 'system', 'developer', 'user' or "
                  "'assistant'.",
                  "messages");
  }
  return true;
}

// Writes a message's text: the string, or its text parts joined by "\n".
bool put_content(const message& m, text_writer& out, request_error& err) noexcept {
  if (!m.has_content) return true;
  if (m.content.is_string()) {
    out.put(std::string_view(m.content));
    return true;
  }
  if (!m.content.is_array()) {
    return refuse(err, "Invalid 'messages': content must be a string or an array of parts.",
                  "messages");
  }
  bool first = true;
  for (element part : simdjson::dom::array(m.content)) {
    std::string_view text;
    bool is_text = part.is_string();
    if (is_text) text = std::string_view(part);
    if (part.is_object()) {
      std::string_view type;
      for (auto kv : simdjson::dom::object(part)) {
        if (kv.key == "type" && kv.value.is_string()) type = std::string_view(kv.value);
        if (kv.key == "text" && kv.value.is_string()) text = std::string_view(kv.value);
      }
      is_text = type == "text" || type == "input_text";
      if (type == "image_url" || type == "input_image") {
        return refuse(err, "This model group takes a text prompt: image content parts are not "
                      "supported.", "messages");
      }
    }
    if (!is_text) {
      return refuse(err, "This model group takes a text prompt: only text content parts are "
                    "supported.", "messages");
    }
    if (!first) out.put('\n');
    out.put(text);
    first = false;
  }
  return true;
}

std::string_view role_name(role r) noexcept {
  switch (r) {
    case role::system: return "system";
    case role::user: return "user";
    case role::assistant: return "assistant";
  }
  return "user";
}

bool is_space(char c) noexcept { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Llama 3's template trims each content (Jinja's `| trim`): done in place
// on what put_content wrote from `begin`.
void trim_from(text_writer& out, char* begin) noexcept {
  if (!out.ok) return;
  while (out.p > begin && is_space(out.p[-1])) --out.p;
  char* s = begin;
  while (s < out.p && is_space(*s)) ++s;
  if (s != begin) {
    std::memmove(begin, s, static_cast<size_t>(out.p - s));
    out.p -= s - begin;
  }
}

// Walks the messages once, checking each, calling put(message) in order.
template <class Put>
bool each_message(const request_fields& f, request_error& err, Put&& put) noexcept {
  message m;
  for (element e : simdjson::dom::array(f.messages)) {
    if (!read_message(e, m, err) || !put(m)) return false;
  }
  return true;
}

bool render_chatml(const request_fields& f, text_writer& out, request_error& err) noexcept {
  const bool ok = each_message(f, err, [&](const message& m) {
    out.put("<|im_start|>");
    out.put(role_name(m.who));
    out.put('\n');
    if (!put_content(m, out, err)) return false;
    out.put("<|im_end|>\n");
    return true;
  });
  out.put("<|im_start|>assistant\n");
  return ok;
}

bool render_llama3(const request_fields& f, bool bos, text_writer& out,
                   request_error& err) noexcept {
  if (bos) out.put("<|begin_of_text|>");
  const bool ok = each_message(f, err, [&](const message& m) {
    out.put("<|start_header_id|>");
    out.put(role_name(m.who));
    out.put("<|end_header_id|>\n\n");
    char* begin = out.p;
    if (!put_content(m, out, err)) return false;
    trim_from(out, begin);
    out.put("<|eot_id|>");
    return true;
  });
  out.put("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return ok;
}

// Mistral's instruct template has no system role: the system messages'
// text (joined by "\n\n") opens the first user turn, followed by "\n\n".
// The rest must alternate user/assistant, starting with a user turn, as
// the template itself raises otherwise.
bool render_mistral(const request_fields& f, bool bos, text_writer& out,
                    request_error& err) noexcept {
  bool system_pending = false;
  const bool checked = each_message(f, err, [&](const message& m) {
    system_pending = system_pending || m.who == role::system;
    return true;
  });
  if (!checked) return false;
  auto put_system = [&]() {
    bool first = true;
    return each_message(f, err, [&](const message& s) {
      if (s.who != role::system) return true;
      if (!first) out.put("\n\n");
      first = false;
      return put_content(s, out, err);
    });
  };
  if (bos) out.put("<s>");
  bool expect_user = true;
  const bool ok = each_message(f, err, [&](const message& m) {
    if (m.who == role::system) return true;
    if ((m.who == role::user) != expect_user) {
      return refuse(err, "Conversation roles must alternate user/assistant/user/assistant/...",
                    "messages");
    }
    expect_user = !expect_user;
    if (m.who == role::assistant) {
      if (!put_content(m, out, err)) return false;
      out.put("</s>");
      return true;
    }
    out.put("[INST] ");
    if (system_pending) {
      if (!put_system()) return false;
      out.put("\n\n");
      system_pending = false;
    }
    if (!put_content(m, out, err)) return false;
    out.put(" [/INST]");
    return true;
  });
  if (ok && system_pending) {
    // Only system messages: they are the one instruction.
    out.put("[INST] ");
    if (!put_system()) return false;
    out.put(" [/INST]");
  }
  return ok;
}

const std::string_view& prefix_of(const custom_chat_template& t, role r) noexcept {
  return r == role::system ? t.system_prefix : r == role::user ? t.user_prefix : t.assistant_prefix;
}
const std::string_view& suffix_of(const custom_chat_template& t, role r) noexcept {
  return r == role::system ? t.system_suffix : r == role::user ? t.user_suffix : t.assistant_suffix;
}

bool render_custom(const custom_chat_template& t, const request_fields& f, text_writer& out,
                   request_error& err) noexcept {
  out.put(t.begin);
  const bool ok = each_message(f, err, [&](const message& m) {
    out.put(prefix_of(t, m.who));
    if (!put_content(m, out, err)) return false;
    out.put(suffix_of(t, m.who));
    return true;
  });
  out.put(t.generation_prefix);
  return ok;
}

}  // namespace

bool parse_chat_template_kind(std::string_view name, chat_template_kind& out) noexcept {
  for (auto k : {chat_template_kind::chatml, chat_template_kind::llama3,
                 chat_template_kind::mistral, chat_template_kind::custom}) {
    if (name == to_string(k)) {
      out = k;
      return true;
    }
  }
  return false;
}

std::string_view to_string(chat_template_kind k) noexcept {
  switch (k) {
    case chat_template_kind::chatml: return "chatml";
    case chat_template_kind::llama3: return "llama3";
    case chat_template_kind::mistral: return "mistral";
    case chat_template_kind::custom: return "custom";
  }
  return "chatml";
}

bool render_chat_prompt(const chat_template& t, const request_fields& fields, text_writer& out,
                        request_error& err) noexcept {
  // The reader has looked at the whole body already: refuse what a text
  // prompt cannot carry before writing a byte.
  if (fields.has_tools) {
    return refuse(err, "This model group takes a text prompt: 'tools' are not supported.",
                  "tools");
  }
  if (fields.has_images) {
    return refuse(err, "This model group takes a text prompt: image content parts are not "
                  "supported.", "messages");
  }
  if (fields.message_count == 0) {
    return refuse(err, "Missing required parameter: 'messages'.", "messages");
  }
  bool ok = false;
  switch (t.kind) {
    case chat_template_kind::chatml: ok = render_chatml(fields, out, err); break;
    case chat_template_kind::llama3: ok = render_llama3(fields, t.include_bos, out, err); break;
    case chat_template_kind::mistral: ok = render_mistral(fields, t.include_bos, out, err); break;
    case chat_template_kind::custom: ok = render_custom(t.custom, fields, out, err); break;
  }
  if (!ok) return false;
  if (!out.ok) {
    return refuse(err, "The rendered prompt is longer than this model group accepts.",
                  "messages");
  }
  return true;
}

}  // namespace sluice::openai
