// The worker's side of Anthropic's /v1/messages and OpenAI's /v1/responses:
// the request's plan, then the reply paced by the same timers as the chat
// endpoints (anthropic.hpp and responses.hpp have the bytes).
#include <ctime>

#include "anthropic.hpp"
#include "connection.hpp"
#include "worker.hpp"

namespace mock_vllm {

void worker::respond_anthropic_error(connection& c, int status, std::string_view message) {
  _scratch.clear();
  append_anthropic_error_body(_scratch, anthropic_error_type(status), message);
  respond_json(c, status, _scratch);
}

void worker::start_messages(connection& c) {
  c.body.reserve(c.body.size() + simdjson::SIMDJSON_PADDING);
  _error.clear();
  if (_opts.fail_status != 0) {
    respond_anthropic_error(c, static_cast<int>(_opts.fail_status),
                            "The engine cannot take requests right now (mock-vllm --fail-status).");
    return;
  }
  if (!make_anthropic_plan(_json, c.body, _opts.reply_tokens, _anthropic_plan, _error)) {
    respond_anthropic_error(c, 400, _error);
    return;
  }
  // "msg_" + X-Request-Id, as the OpenAI ids mirror it; else a random hex.
  c.id.assign("msg_");
  c.tool_id.assign("toolu_");
  if (const std::string* rid = find_header(c.headers, "x-request-id")) {
    c.id += *rid;
    c.tool_id += *rid;
  } else {
    size_t at = c.id.size();
    append_uuid_hex(c.id);
    c.tool_id.append(c.id, at);
  }
  c.kind = endpoint::messages;
  c.stream = _anthropic_plan.stream;
  c.include_usage = false;
  c.tokens = _anthropic_plan.tokens;
  c.ends_by_length = _anthropic_plan.ends_by_length;
  c.prompt_tokens = _anthropic_plan.prompt_tokens;
  c.tool_use = _anthropic_plan.tool_use;
  c.tool_name.assign(_anthropic_plan.tool_name);
  c.sent = 0;
  c.fail_after = fail_after_tokens(_opts, c.headers);
  c.created = _opts.created >= 0 ? _opts.created : time(nullptr);
  c.role_sent = false;  // here: message_start and content_block_start
  c.busy = true;
  c.waiting = true;
  _state.waiting.fetch_add(1, std::memory_order_relaxed);
  if (c.stream) append_stream_head(c.out, _date, c.close_header);
  schedule(c);
}

void worker::advance_messages(connection& c) {
  if (c.waiting) {
    c.waiting = false;
    _state.waiting.fetch_sub(1, std::memory_order_relaxed);
    _state.running.fetch_add(1, std::memory_order_relaxed);
  }
  if (c.stream && !c.role_sent) {
    append_message_start_event(c.out, _scratch, c.id, _opts.model, c.prompt_tokens);
    if (c.tool_use) {
      append_tool_block_start_event(c.out, _scratch, c.tool_id, c.tool_name);
    } else {
      append_text_block_start_event(c.out, _scratch);
    }
    append_ping_event(c.out, _scratch);
    c.role_sent = true;
  }
  if (!generate(c)) return;  // a timer or the socket calls again (or it failed)
  std::string_view stop_reason = c.tool_use ? "tool_use" : c.ends_by_length ? "max_tokens" : "end_turn";
  if (c.stream) {
    append_block_stop_event(c.out, _scratch);
    append_message_delta_event(c.out, _scratch, stop_reason, c.tokens);
    append_message_stop_event(c.out, _scratch);
  } else {
    _scratch.clear();
    if (c.tool_use) {
      append_tool_message_body(_scratch, c.id, _opts.model, c.tool_id, c.tool_name, c.prompt_tokens, c.tokens);
    } else {
      append_message_body(_scratch, c.id, _opts.model, c.tokens, c.ends_by_length, c.prompt_tokens,
                          _opts.token_pad);
    }
    respond_json(c, 200, _scratch);
  }
  finish_generation(c);
}

void worker::start_responses(connection& c) {
  c.body.reserve(c.body.size() + simdjson::SIMDJSON_PADDING);
  _error.clear();
  if (_opts.fail_status != 0) {
    respond_error(c, static_cast<int>(_opts.fail_status), "ServiceUnavailableError",
                  "The engine cannot take requests right now (mock-vllm --fail-status).");
    return;
  }
  if (!make_responses_plan(_json, c.body, _opts.reply_tokens, _responses_plan, _error)) {
    respond_error(c, 400, "BadRequestError", _error);
    return;
  }
  // "resp_" + X-Request-Id, as the chat ids mirror it; else a random hex.
  c.id.assign("resp_");
  if (const std::string* rid = find_header(c.headers, "x-request-id")) {
    c.id += *rid;
  } else {
    append_uuid_hex(c.id);
  }
  c.kind = endpoint::responses;
  c.stream = _responses_plan.stream;
  c.include_usage = false;
  c.tokens = _responses_plan.tokens;
  c.ends_by_length = _responses_plan.ends_by_length;
  c.prompt_tokens = _responses_plan.prompt_tokens;
  c.tool_use = false;
  c.sent = 0;
  c.seq = 0;
  c.fail_after = fail_after_tokens(_opts, c.headers);
  c.created = _opts.created >= 0 ? _opts.created : time(nullptr);
  c.role_sent = false;  // here: response.created ... content_part.added
  c.busy = true;
  c.waiting = true;
  _state.waiting.fetch_add(1, std::memory_order_relaxed);
  if (c.stream) append_stream_head(c.out, _date, c.close_header);
  schedule(c);
}

void worker::advance_responses(connection& c) {
  if (c.waiting) {
    c.waiting = false;
    _state.waiting.fetch_sub(1, std::memory_order_relaxed);
    _state.running.fetch_add(1, std::memory_order_relaxed);
  }
  if (c.stream && !c.role_sent) {
    append_response_start_events(c.out, _scratch, c.id, c.created, _opts.model, c.seq);
    c.role_sent = true;
  }
  if (!generate(c)) return;  // a timer or the socket calls again (or it failed)
  responses_plan p{c.stream, c.tokens, c.ends_by_length, c.prompt_tokens};
  if (c.stream) {
    append_response_end_events(c.out, _scratch, c.id, c.created, _opts.model, p, _opts.token_pad, c.seq);
  } else {
    _scratch.clear();
    append_response_body(_scratch, c.id, c.created, _opts.model, p, _opts.token_pad);
    respond_json(c, 200, _scratch);
  }
  finish_generation(c);
}

}  // namespace mock_vllm
