#include "wire.hpp"

#include <simdjson.h>

#include <array>
#include <charconv>

namespace mock_vllm {

namespace {

constexpr char k_hex[] = "0123456789abcdef";

void append_escaped_byte(std::string& out, unsigned char c) {
  switch (c) {
    case '"': out += "\\\""; return;
    case '\\': out += "\\\\"; return;
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\b': out += "\\b"; return;
    case '\f': out += "\\f"; return;
    default: break;
  }
  // Python and serde_json both write the remaining escapes with lowercase hex.
  char buf[6] = {'\\', 'u', '0', '0', k_hex[c >> 4], k_hex[c & 15]};
  out.append(buf, sizeof buf);
}

bool needs_escape(unsigned char c) { return c < 0x20 || c == '"' || c == '\\'; }

void append_escaped(std::string& out, std::string_view s, bool escape_high) {
  size_t run = 0;  // start of the current run of bytes copied as they are
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (needs_escape(c) || (escape_high && c >= 0x80)) {
      out.append(s.data() + run, i - run);
      append_escaped_byte(out, c);
      run = i + 1;
    }
  }
  out.append(s.data() + run, s.size() - run);
}

void append_head_start(std::string& out, int status, std::string_view date) {
  // uvicorn writes its default headers (date, then server) before the app's.
  out += status_line(status);
  out += "date: ";
  out += date;
  out += "\r\nserver: uvicorn\r\n";
}

void append_usage_object(std::string& out, usage_counts u, bool with_details) {
  out += "{\"prompt_tokens\":";
  append_uint(out, u.prompt_tokens);
  out += ",\"total_tokens\":";
  append_uint(out, uint64_t{u.prompt_tokens} + u.completion_tokens);
  out += ",\"completion_tokens\":";
  append_uint(out, u.completion_tokens);
  out += with_details ? ",\"prompt_tokens_details\":null}" : "}";
}

void append_reply_text(std::string& out, uint32_t tokens, uint32_t pad) {
  for (uint32_t i = 0; i < tokens; ++i) append_token_text(out, i, pad);
}

// Frames `scratch` (a finished "data: ...\n\n" event) as one HTTP chunk.
void frame_event(std::string& out, std::string& scratch) { append_chunk(out, scratch); }

void begin_event(std::string& scratch, std::string_view prefix) {
  scratch.clear();
  scratch += "data: ";
  scratch += prefix;
}

// Chat chunks are dumped with exclude_unset (no "usage" key); completion
// chunks with exclude_unset=False (so "usage":null is there).
void end_event(std::string& scratch, endpoint kind) {
  scratch += kind == endpoint::chat ? "]}\n\n" : "],\"usage\":null}\n\n";
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  append_escaped(out, s, false);
  out += '"';
}

void append_json_bytes(std::string& out, std::string_view s) {
  bool valid = simdjson::validate_utf8(s.data(), s.size());
  out += '"';
  append_escaped(out, s, !valid);
  out += '"';
}

void append_uint(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

void append_token_text(std::string& out, uint32_t i, uint32_t pad) {
  out += i == 0 ? "tok" : " tok";
  append_uint(out, i);
  out.append(pad, 'x');
}

std::string_view http_date::at(time_t now_s) noexcept {
  if (now_s != _second) {
    static constexpr std::array<const char*, 7> days = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static constexpr std::array<const char*, 12> months = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    tm t{};
    gmtime_r(&now_s, &t);
    // RFC 7231 IMF-fixdate, as email.utils.formatdate(usegmt=True) in uvicorn.
    int n = std::snprintf(_text, sizeof _text, "%s, %02d %s %04d %02d:%02d:%02d GMT",
                          days[static_cast<size_t>(t.tm_wday)], t.tm_mday,
                          months[static_cast<size_t>(t.tm_mon)], t.tm_year + 1900, t.tm_hour,
                          t.tm_min, t.tm_sec);
    _length = n > 0 ? static_cast<size_t>(n) : 0;
    _second = now_s;
  }
  return {_text, _length};
}

std::string_view status_line(int status) noexcept {
  switch (status) {
    case 100: return "HTTP/1.1 100 Continue\r\n";
    case 200: return "HTTP/1.1 200 OK\r\n";
    case 400: return "HTTP/1.1 400 Bad Request\r\n";
    case 401: return "HTTP/1.1 401 Unauthorized\r\n";
    case 404: return "HTTP/1.1 404 Not Found\r\n";
    case 405: return "HTTP/1.1 405 Method Not Allowed\r\n";
    case 413: return "HTTP/1.1 413 Request Entity Too Large\r\n";
    case 422: return "HTTP/1.1 422 Unprocessable Entity\r\n";
    case 429: return "HTTP/1.1 429 Too Many Requests\r\n";
    case 502: return "HTTP/1.1 502 Bad Gateway\r\n";
    case 503: return "HTTP/1.1 503 Service Unavailable\r\n";
    case 504: return "HTTP/1.1 504 Gateway Timeout\r\n";
    // Anthropic's "overloaded"; not an IANA status, so no standard phrase.
    case 529: return "HTTP/1.1 529 Overloaded\r\n";
    default: return "HTTP/1.1 500 Internal Server Error\r\n";
  }
}

void append_response(std::string& out, int status, std::string_view date, std::string_view body,
                     std::string_view content_type, bool connection_close,
                     std::string_view extra_headers) {
  append_head_start(out, status, date);
  // Starlette's Response.init_headers: given headers, then content-length,
  // then content-type; uvicorn appends connection: close last when the
  // request carried it.
  out += extra_headers;
  out += "content-length: ";
  append_uint(out, body.size());
  out += "\r\ncontent-type: ";
  out += content_type;
  out += connection_close ? "\r\nconnection: close\r\n\r\n" : "\r\n\r\n";
  out += body;
}

void append_empty_response(std::string& out, std::string_view date, bool connection_close) {
  append_head_start(out, 200, date);
  out += connection_close ? "content-length: 0\r\nconnection: close\r\n\r\n" : "content-length: 0\r\n\r\n";
}

void append_invalid_http_response(std::string& out, std::string_view date) {
  constexpr std::string_view msg = "Invalid HTTP request received.";
  append_head_start(out, 400, date);
  out += "content-type: text/plain; charset=utf-8\r\ncontent-length: ";
  append_uint(out, msg.size());
  out += "\r\nconnection: close\r\n\r\n";
  out += msg;
}

void append_stream_head(std::string& out, std::string_view date, bool connection_close) {
  append_head_start(out, 200, date);
  out += "content-type: text/event-stream; charset=utf-8\r\n";
  if (connection_close) out += "connection: close\r\n";
  out += "transfer-encoding: chunked\r\n\r\n";
}

void append_chunk(std::string& out, std::string_view payload) {
  char buf[20];
  auto r = std::to_chars(buf, buf + sizeof buf, payload.size(), 16);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
  out += "\r\n";
  out += payload;
  out += "\r\n";
}

void append_error_body(std::string& out, error_format format, int code, std::string_view type,
                       std::string_view message) {
  if (format == error_format::flat) {
    out += "{\"object\":\"error\",\"message\":";
    append_json_string(out, message);
    out += ",\"type\":";
    append_json_string(out, type);
    out += ",\"param\":null,\"code\":";
    append_int(out, code);
    out += "}";
    return;
  }
  out += "{\"error\":{\"message\":";
  append_json_string(out, message);
  out += ",\"type\":";
  append_json_string(out, type);
  out += ",\"param\":null,\"code\":";
  append_int(out, code);
  out += "}}";
}

void append_chunk_prefix(std::string& out, endpoint kind, std::string_view id, int64_t created,
                         std::string_view model) {
  out += "{\"id\":";
  append_json_string(out, id);
  out += kind == endpoint::chat ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                                : ",\"object\":\"text_completion\",\"created\":";
  append_int(out, created);
  out += ",\"model\":";
  append_json_string(out, model);
  out += ",\"choices\":[";
}

void append_role_event(std::string& out, std::string& scratch, std::string_view prefix) {
  begin_event(scratch, prefix);
  scratch +=
      "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
      "\"finish_reason\":null}";
  end_event(scratch, endpoint::chat);
  frame_event(out, scratch);
}

void append_token_event(std::string& out, std::string& scratch, endpoint kind,
                        std::string_view prefix, uint32_t index, bool ends_by_length,
                        uint32_t token_pad) {
  begin_event(scratch, prefix);
  scratch += kind == endpoint::chat ? "{\"index\":0,\"delta\":{\"content\":\"" : "{\"index\":0,\"text\":\"";
  append_token_text(scratch, index, token_pad);
  if (kind == endpoint::chat) {
    // The token that hits max_tokens carries the finish (vLLM's last output).
    scratch += ends_by_length
                   ? "\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}"
                   : "\"},\"logprobs\":null,\"finish_reason\":null}";
  } else {
    scratch += ends_by_length ? "\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}"
                              : "\",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}";
  }
  end_event(scratch, kind);
  frame_event(out, scratch);
}

void append_stop_event(std::string& out, std::string& scratch, endpoint kind, std::string_view prefix) {
  // vLLM's stop by EOS: the EOS token decodes to "", so the finish chunk has
  // empty content.
  begin_event(scratch, prefix);
  scratch += kind == endpoint::chat
                 ? "{\"index\":0,\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"stop\","
                   "\"stop_reason\":null}"
                 : "{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}";
  end_event(scratch, kind);
  frame_event(out, scratch);
}

void append_usage_event(std::string& out, std::string& scratch, std::string_view prefix, usage_counts u) {
  // Dumped with exclude_none: no prompt_tokens_details.
  begin_event(scratch, prefix);
  scratch += "],\"usage\":";
  append_usage_object(scratch, u, false);
  scratch += "}\n\n";
  frame_event(out, scratch);
}

void append_done_events(std::string& out) {
  // Both constant: "data: [DONE]\n\n" is 14 bytes = 0xe.
  out += "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
}

void append_chat_body(std::string& out, std::string_view id, int64_t created, std::string_view model,
                      uint32_t tokens, bool ends_by_length, usage_counts u, uint32_t token_pad) {
  out += "{\"id\":";
  append_json_string(out, id);
  out += ",\"object\":\"chat.completion\",\"created\":";
  append_int(out, created);
  out += ",\"model\":";
  append_json_string(out, model);
  out += ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"";
  append_reply_text(out, tokens, token_pad);
  out +=
      "\",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,"
      "\"tool_calls\":[],\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":";
  out += ends_by_length ? "\"length\"" : "\"stop\"";
  out += ",\"stop_reason\":null}],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":";
  append_usage_object(out, u, true);
  out += ",\"prompt_logprobs\":null,\"kv_transfer_params\":null}";
}

void append_completion_body(std::string& out, std::string_view id, int64_t created,
                            std::string_view model, uint32_t tokens, bool ends_by_length,
                            usage_counts u, uint32_t token_pad) {
  out += "{\"id\":";
  append_json_string(out, id);
  out += ",\"object\":\"text_completion\",\"created\":";
  append_int(out, created);
  out += ",\"model\":";
  append_json_string(out, model);
  out += ",\"choices\":[{\"index\":0,\"text\":\"";
  append_reply_text(out, tokens, token_pad);
  out += "\",\"logprobs\":null,\"finish_reason\":";
  out += ends_by_length ? "\"length\"" : "\"stop\"";
  out +=
      ",\"stop_reason\":null,\"prompt_logprobs\":null}],\"service_tier\":null,"
      "\"system_fingerprint\":null,\"usage\":";
  append_usage_object(out, u, true);
  out += ",\"kv_transfer_params\":null}";
}

void append_embedding_body(std::string& out, std::string_view id, int64_t created,
                           std::string_view model, std::span<const uint64_t> input_hashes,
                           uint32_t prompt_tokens) {
  // Python's repr of (k - 8) / 8 for k = 0..15.
  static constexpr std::array<std::string_view, 16> values = {
      "-1.0", "-0.875", "-0.75", "-0.625", "-0.5", "-0.375", "-0.25", "-0.125",
      "0.0",  "0.125",  "0.25",  "0.375",  "0.5",  "0.625",  "0.75",  "0.875"};
  out += "{\"id\":";
  append_json_string(out, id);
  out += ",\"object\":\"list\",\"created\":";
  append_int(out, created);
  out += ",\"model\":";
  append_json_string(out, model);
  out += ",\"data\":[";
  for (size_t i = 0; i < input_hashes.size(); ++i) {
    if (i > 0) out += ',';
    out += "{\"index\":";
    append_uint(out, i);
    out += ",\"object\":\"embedding\",\"embedding\":[";
    for (unsigned j = 0; j < 8; ++j) {
      if (j > 0) out += ',';
      out += values[(input_hashes[i] >> (4 * j)) & 15];
    }
    out += "]}";
  }
  out += "],\"usage\":";
  append_usage_object(out, usage_counts{prompt_tokens, 0}, true);
  out += "}";
}

void append_models_body(std::string& out, std::string_view model, int64_t created,
                        uint32_t max_model_len, std::string_view permission_id) {
  out += "{\"object\":\"list\",\"data\":[{\"id\":";
  append_json_string(out, model);
  out += ",\"object\":\"model\",\"created\":";
  append_int(out, created);
  out += ",\"owned_by\":\"vllm\",\"root\":";
  append_json_string(out, model);
  out += ",\"parent\":null,\"max_model_len\":";
  append_uint(out, max_model_len);
  out += ",\"permission\":[{\"id\":\"modelperm-";
  out += permission_id;
  out += "\",\"object\":\"model_permission\",\"created\":";
  append_int(out, created);
  out +=
      ",\"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,"
      "\"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,"
      "\"organization\":\"*\",\"group\":null,\"is_blocking\":false}]}]}";
}

}  // namespace mock_vllm
