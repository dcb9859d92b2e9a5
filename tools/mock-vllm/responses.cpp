#include "responses.hpp"

#include "plan.hpp"
#include "wire.hpp"

namespace mock_vllm {

namespace {

using simdjson::dom::element;

// Words of a string, or of the text parts of a content array.
uint32_t words_of(element content) {
  std::string_view text;
  if (content.get(text) == simdjson::SUCCESS) return count_words(text);
  simdjson::dom::array parts;
  uint32_t n = 0;
  if (content.get(parts) != simdjson::SUCCESS) return 0;
  for (element part : parts) {
    if (part["text"].get(text) == simdjson::SUCCESS) n += count_words(text);
  }
  return n;
}

void begin_event(std::string& scratch, std::string_view type, uint32_t& seq) {
  scratch.clear();
  scratch += "event: ";
  scratch += type;
  scratch += "\ndata: {\"type\":\"";
  scratch += type;
  scratch += "\",\"sequence_number\":";
  append_uint(scratch, seq++);
}

void end_event(std::string& out, std::string& scratch) {
  scratch += "}\n\n";
  append_chunk(out, scratch);
}

void append_text(std::string& out, const responses_plan& p, uint32_t token_pad) {
  out += '"';
  for (uint32_t i = 0; i < p.tokens; ++i) append_token_text(out, i, token_pad);
  out += '"';
}

void append_item_id(std::string& out, std::string_view id) {
  out += "\"msg_";
  out += id.substr(id.starts_with("resp_") ? 5 : 0);
  out += '"';
}

// The response object; `p` null: in progress (no output, no usage).
void append_response(std::string& out, std::string_view id, int64_t created, std::string_view model,
                     const responses_plan* p, uint32_t token_pad) {
  out += "{\"id\":";
  append_json_string(out, id);
  out += ",\"object\":\"response\",\"created_at\":";
  append_uint(out, static_cast<uint64_t>(created));
  out += ",\"status\":\"";
  out += p == nullptr ? "in_progress" : p->ends_by_length ? "incomplete" : "completed";
  out += "\",\"error\":null,\"incomplete_details\":";
  out += p != nullptr && p->ends_by_length ? "{\"reason\":\"max_output_tokens\"}" : "null";
  out += ",\"instructions\":null,\"model\":";
  append_json_string(out, model);
  out += ",\"output\":[";
  if (p != nullptr) {
    out += "{\"id\":";
    append_item_id(out, id);
    out += ",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
           "\"text\":";
    append_text(out, *p, token_pad);
    out += ",\"annotations\":[]}]}";
  }
  out += "],\"parallel_tool_calls\":true,\"temperature\":1.0,\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":1.0,"
         "\"usage\":";
  if (p == nullptr) {
    out += "null}";
    return;
  }
  out += "{\"input_tokens\":";
  append_uint(out, p->prompt_tokens);
  out += ",\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":";
  append_uint(out, p->tokens);
  out += ",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":";
  append_uint(out, p->prompt_tokens + p->tokens);
  out += "}}";
}

}  // namespace

bool make_responses_plan(simdjson::dom::parser& parser, const std::string& body, uint32_t reply_tokens,
                         responses_plan& out, std::string& error) {
  out = {};
  element root;
  if (parser.parse(simdjson::padded_string_view(body.data(), body.size(), body.capacity())).get(root) !=
          simdjson::SUCCESS ||
      !root.is_object()) {
    error = "The request body must be a JSON object.";
    return false;
  }
  std::string_view model;
  if (root["model"].get(model) != simdjson::SUCCESS) {
    error = "model: Field required";
    return false;
  }
  element input, v;
  if (root["input"].get(input) != simdjson::SUCCESS) {
    error = "input: Field required";
    return false;
  }
  simdjson::dom::array items;
  if (input.get(items) == simdjson::SUCCESS) {
    for (element item : items) {
      element content;
      if (item["content"].get(content) == simdjson::SUCCESS) out.prompt_tokens += words_of(content);
      if (item["output"].get(content) == simdjson::SUCCESS) out.prompt_tokens += words_of(content);
    }
  } else {
    out.prompt_tokens += words_of(input);
  }
  if (root["instructions"].get(v) == simdjson::SUCCESS) out.prompt_tokens += words_of(v);
  out.tokens = reply_tokens;
  int64_t max_out = 0;
  if (root["max_output_tokens"].get(v) == simdjson::SUCCESS && !v.is_null()) {
    if (v.get_int64().get(max_out) != simdjson::SUCCESS || max_out < 1) {
      error = "max_output_tokens: Input should be greater than or equal to 1";
      return false;
    }
    if (static_cast<uint64_t>(max_out) < reply_tokens) {
      out.tokens = static_cast<uint32_t>(max_out);
      out.ends_by_length = true;
    }
  }
  bool stream = false;
  if (root["stream"].get(stream) == simdjson::SUCCESS) out.stream = stream;
  return true;
}

void append_response_body(std::string& out, std::string_view id, int64_t created, std::string_view model,
                          const responses_plan& p, uint32_t token_pad) {
  append_response(out, id, created, model, &p, token_pad);
}

void append_response_start_events(std::string& out, std::string& scratch, std::string_view id, int64_t created,
                                  std::string_view model, uint32_t& seq) {
  for (std::string_view type : {"response.created", "response.in_progress"}) {
    begin_event(scratch, type, seq);
    scratch += ",\"response\":";
    append_response(scratch, id, created, model, nullptr, 0);
    end_event(out, scratch);
  }
  begin_event(scratch, "response.output_item.added", seq);
  scratch += ",\"output_index\":0,\"item\":{\"id\":";
  append_item_id(scratch, id);
  scratch += ",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}";
  end_event(out, scratch);
  begin_event(scratch, "response.content_part.added", seq);
  scratch += ",\"item_id\":";
  append_item_id(scratch, id);
  scratch += ",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}";
  end_event(out, scratch);
}

void append_output_text_delta_event(std::string& out, std::string& scratch, std::string_view id, uint32_t index,
                                    uint32_t token_pad, uint32_t& seq) {
  begin_event(scratch, "response.output_text.delta", seq);
  scratch += ",\"item_id\":";
  append_item_id(scratch, id);
  scratch += ",\"output_index\":0,\"content_index\":0,\"delta\":\"";
  append_token_text(scratch, index, token_pad);
  scratch += "\",\"logprobs\":[]";
  end_event(out, scratch);
}

void append_response_end_events(std::string& out, std::string& scratch, std::string_view id, int64_t created,
                                std::string_view model, const responses_plan& p, uint32_t token_pad, uint32_t& seq) {
  begin_event(scratch, "response.output_text.done", seq);
  scratch += ",\"item_id\":";
  append_item_id(scratch, id);
  scratch += ",\"output_index\":0,\"content_index\":0,\"text\":";
  append_text(scratch, p, token_pad);
  scratch += ",\"logprobs\":[]";
  end_event(out, scratch);
  begin_event(scratch, "response.content_part.done", seq);
  scratch += ",\"item_id\":";
  append_item_id(scratch, id);
  scratch += ",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":";
  append_text(scratch, p, token_pad);
  scratch += ",\"annotations\":[]}";
  end_event(out, scratch);
  begin_event(scratch, "response.output_item.done", seq);
  scratch += ",\"output_index\":0,\"item\":{\"id\":";
  append_item_id(scratch, id);
  scratch += ",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
             "\"text\":";
  append_text(scratch, p, token_pad);
  scratch += ",\"annotations\":[]}]}";
  end_event(out, scratch);
  begin_event(scratch, p.ends_by_length ? "response.incomplete" : "response.completed", seq);
  scratch += ",\"response\":";
  append_response(scratch, id, created, model, &p, token_pad);
  end_event(out, scratch);
  append_chunk(out, {});
}

}  // namespace mock_vllm
