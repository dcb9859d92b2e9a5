// Chat templates as tables: a chat request body in, the exact prompt (or
// the 400) out. A new edge case is a new row.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "sluice/openai/chat_template.hpp"

using sluice::text_writer;
using sluice::openai::chat_template;
using sluice::openai::chat_template_kind;
using sluice::openai::endpoint;
using sluice::openai::request_error;
using sluice::openai::request_fields;
using sluice::openai::request_reader;

namespace {

struct rendered {
  bool ok = false;
  std::string prompt;
  std::string message;  // the 400's
  std::string param;
};

rendered render(const chat_template& t, std::string_view body, size_t cap = 4096) {
  static request_reader reader(1 << 20);
  std::string padded(body);
  padded.append(simdjson::SIMDJSON_PADDING, '\0');
  request_fields fields;
  request_error err;
  REQUIRE_MESSAGE(reader.read(endpoint::chat_completions, padded.data(), body.size(), 4096,
                              fields, err),
                  std::string(err.message));
  std::string buf(cap, '\0');
  text_writer out(buf.data(), buf.size());
  rendered r;
  r.ok = sluice::openai::render_chat_prompt(t, fields, out, err);
  if (r.ok) {
    r.prompt.assign(buf.data(), static_cast<size_t>(out.p - buf.data()));
  } else {
    r.message = err.message;
    r.param = err.param;
  }
  return r;
}

chat_template of(chat_template_kind k) {
  chat_template t;
  t.kind = k;
  return t;
}

struct row {
  const char* what;
  const char* body;
  const char* prompt;
};

void check_rows(chat_template_kind k, std::initializer_list<row> rows) {
  for (const auto& r : rows) {
    CAPTURE(r.what);
    const rendered out = render(of(k), r.body);
    REQUIRE_MESSAGE(out.ok, out.message);
    CHECK(out.prompt == r.prompt);
  }
}

constexpr const char* k_conversation =
    R"({"model":"m","messages":[{"role":"system","content":"Be brief."},)"
    R"({"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},)"
    R"({"role":"user","content":"2+2?"}]})";

}  // namespace

TEST_SUITE("openai::chat_template") {
  TEST_CASE("chatml renders Qwen2.5's im_start / im_end turns") {
    check_rows(chat_template_kind::chatml, {
        {"one user turn", R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})",
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
        {"a conversation", k_conversation,
         "<|im_start|>system\nBe brief.<|im_end|>\n"
         "<|im_start|>user\nHi<|im_end|>\n"
         "<|im_start|>assistant\nHello!<|im_end|>\n"
         "<|im_start|>user\n2+2?<|im_end|>\n"
         "<|im_start|>assistant\n"},
        {"developer is system; text parts join with a newline",
         R"({"model":"m","messages":[{"role":"developer","content":"Rules"},)"
         R"({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
         "<|im_start|>system\nRules<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
         "<|im_start|>assistant\n"},
        {"null assistant content is empty",
         R"({"model":"m","messages":[{"role":"user","content":"x"},)"
         R"({"role":"assistant","content":null},{"role":"user","content":"y"}]})",
         "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
         "<|im_start|>user\ny<|im_end|>\n<|im_start|>assistant\n"},
    });
  }

  TEST_CASE("llama3 renders header and eot tokens, content trimmed") {
    check_rows(chat_template_kind::llama3, {
        {"a conversation", k_conversation,
         "<|begin_of_text|>"
         "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
         "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"whitespace trimmed at both ends",
         R"({"model":"m","messages":[{"role":"user","content":"  \n hi there \n"}]})",
         "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
         "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    });
  }

  TEST_CASE("mistral folds the system prompt into the first user turn") {
    check_rows(chat_template_kind::mistral, {
        {"a conversation", k_conversation,
         "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] 2+2? [/INST]"},
        {"no system", R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})",
         "<s>[INST] Hi [/INST]"},
        {"two system messages, one after the user turn",
         R"({"model":"m","messages":[{"role":"system","content":"A"},)"
         R"({"role":"user","content":"Hi"},{"role":"system","content":"B"}]})",
         "<s>[INST] A\n\nB\n\nHi [/INST]"},
        {"only a system message", R"({"model":"m","messages":[{"role":"system","content":"S"}]})",
         "<s>[INST] S [/INST]"},
    });
  }

  TEST_CASE("include_bos = false leaves the BOS token to the backend's tokenizer") {
    chat_template t = of(chat_template_kind::llama3);
    t.include_bos = false;
    const std::string_view body = R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})";
    CHECK(render(t, body).prompt ==
          "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    t.kind = chat_template_kind::mistral;
    CHECK(render(t, body).prompt == "[INST] Hi [/INST]");
  }

  TEST_CASE("mistral refuses turns that do not alternate") {
    const rendered r = render(of(chat_template_kind::mistral),
        R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]})");
    CHECK_FALSE(r.ok);
    CHECK(r.message == "Conversation roles must alternate user/assistant/user/assistant/...");
    CHECK(r.param == "messages");
  }

  TEST_CASE("custom uses the operator's per-role strings") {
    chat_template t = of(chat_template_kind::custom);
    t.custom.begin = "<BOS>";
    t.custom.system_prefix = "[SYS]";
    t.custom.system_suffix = "[/SYS]\n";
    t.custom.user_prefix = "User: ";
    t.custom.user_suffix = "\n";
    t.custom.assistant_prefix = "Bot: ";
    t.custom.assistant_suffix = "<END>\n";
    t.custom.generation_prefix = "Bot:";
    const rendered r = render(t, k_conversation);
    REQUIRE(r.ok);
    CHECK(r.prompt ==
          "<BOS>[SYS]Be brief.[/SYS]\nUser: Hi\nBot: Hello!<END>\nUser: 2+2?\nBot:");
  }

  struct refused {
    const char* what;
    const char* body;
    const char* message;
    const char* param;
  };

  TEST_CASE("what a text prompt cannot carry is a 400 that says so") {
    const refused rows[] = {
        {"tools",
         R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
         R"("tools":[{"type":"function","function":{"name":"f"}}]})",
         "This model group takes a text prompt: 'tools' are not supported.", "tools"},
        {"an image part",
         R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"see"},)"
         R"({"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]})",
         "This model group takes a text prompt: image content parts are not supported.",
         "messages"},
        {"an audio part",
         R"({"model":"m","messages":[{"role":"user","content":[{"type":"input_audio",)"
         R"("input_audio":{"data":"AA==","format":"wav"}}]}]})",
         "This model group takes a text prompt: only text content parts are supported.",
         "messages"},
        {"a tool call",
         R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant",)"
         R"("content":null,"tool_calls":[{"id":"c","type":"function",)"
         R"("function":{"name":"f","arguments":"{}"}}]}]})",
         "This model group takes a text prompt: tool calls in messages are not supported.",
         "messages"},
        {"a tool message",
         R"({"model":"m","messages":[{"role":"tool","tool_call_id":"c","content":"1"}]})",
         "This model group takes a text prompt: tool messages are not supported.", "messages"},
        {"an unknown role", R"({"model":"m","messages":[{"role":"narrator","content":"x"}]})",
         "Invalid 'messages': each role must be 'system', 'developer', 'user' or 'assistant'.",
         "messages"},
    };
    for (auto k : {chat_template_kind::chatml, chat_template_kind::llama3,
                   chat_template_kind::mistral, chat_template_kind::custom}) {
      for (const auto& r : rows) {
        CAPTURE(r.what);
        CAPTURE(sluice::openai::to_string(k));
        const rendered out = render(of(k), r.body);
        CHECK_FALSE(out.ok);
        CHECK(out.message == r.message);
        CHECK(out.param == r.param);
      }
    }
  }

  TEST_CASE("a prompt past the buffer is a 400, not a cut prompt") {
    const rendered r = render(of(chat_template_kind::chatml), k_conversation, 40);
    CHECK_FALSE(r.ok);
    CHECK(r.message == "The rendered prompt is longer than this model group accepts.");
  }

  TEST_CASE("template names parse and print back") {
    for (auto k : {chat_template_kind::chatml, chat_template_kind::llama3,
                   chat_template_kind::mistral, chat_template_kind::custom}) {
      chat_template_kind parsed = chat_template_kind::custom;
      REQUIRE(sluice::openai::parse_chat_template_kind(sluice::openai::to_string(k), parsed));
      CHECK(parsed == k);
    }
    chat_template_kind ignored;
    CHECK_FALSE(sluice::openai::parse_chat_template_kind("jinja", ignored));
  }
}
