// openai: error bodies in OpenAI's shape, written into fixed buffers.
//
// The output is always valid JSON, whatever the message holds (the core
// escaper's rules, sluice/core/json_string.hpp), because messages may quote
// client input (a duplicate key, a model name) or a backend's words.
#include "sluice/openai/error.hpp"

#include "json_writer.hpp"

#include <algorithm>
#include <cstring>

namespace sluice::openai {

namespace {

// Appends bytes when they fit whole. Returns: false (and writes nothing)
// when they do not.
struct writer {
  char* out;
  size_t cap;
  size_t len = 0;

  bool put(const char* s, size_t n) noexcept {
    if (cap - len < n) return false;
    std::memcpy(out + len, s, n);
    len += n;
    return true;
  }
  bool put(std::string_view s) noexcept { return put(s.data(), s.size()); }
};

// A quoted string member value, or null when empty.
bool put_nullable(writer& w, std::string_view s) noexcept {
  if (s.empty()) return w.put("null", 4);
  if (!w.put("\"", 1)) return false;
  size_t n = json_escape(w.out + w.len, w.cap - w.len, s);
  w.len += n;
  return n == json_escaped_size(s) && w.put("\"", 1);
}

constexpr std::string_view head = "{\"error\":{\"message\":\"";
constexpr std::string_view type_key = "\",\"type\":\"";
constexpr std::string_view param_key = "\",\"param\":";
constexpr std::string_view code_key = ",\"code\":";
constexpr std::string_view tail = "}}";

size_t nullable_size(std::string_view s) noexcept { return s.empty() ? 4 : json_escaped_size(s) + 2; }

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  // 6 bytes a byte at worst (\u00XX), and the quotes.
  const size_t at = out.size();
  out.resize(at + 2 + s.size() * 6);
  out[at] = '"';
  const size_t n = json_escape(out.data() + at + 1, s.size() * 6, s);
  out[at + 1 + n] = '"';
  out.resize(at + 2 + n);
}

size_t write_error_body(char* out, size_t cap, const error_fields& e) noexcept {
  std::string_view type = e.type;
  std::string_view param = e.param;
  std::string_view code = e.code;
  const size_t skeleton = head.size() + type_key.size() + param_key.size() + code_key.size() +
                          tail.size();
  // Shorten in order of least value: the message first, then param and code,
  // then the type. Below the bare skeleton nothing valid fits.
  if (cap < skeleton + 2 * 4) return 0;
  auto fixed = [&] {
    return skeleton + json_escaped_size(type) + nullable_size(param) + nullable_size(code);
  };
  if (fixed() > cap) param = {}, code = {};
  if (fixed() > cap) type = {};

  writer w{out, cap};
  w.put(head);
  const size_t message_budget = cap - fixed();
  w.len += json_escape(out + w.len, message_budget, e.message);
  w.put(type_key);
  w.len += json_escape(out + w.len, cap - w.len, type);
  w.put(param_key);
  put_nullable(w, param);
  w.put(code_key);
  put_nullable(w, code);
  w.put(tail);
  return w.len;
}

// Status → (type, code, default message), when sluice itself answers:
//
//   status        type                   code                default message
//   400           invalid_request_error  null                Bad request.
//   401           invalid_request_error  invalid_api_key     Incorrect API key provided.
//   403           invalid_request_error  null                Forbidden.
//   404           invalid_request_error  model_not_found     The model does not exist ...
//   405           invalid_request_error  null                Method not allowed.
//   408           invalid_request_error  null                Request timed out.
//   413           invalid_request_error  null                Request body too large.
//   414           invalid_request_error  null                Request target too long.
//   431           invalid_request_error  null                Request header fields too large.
//   429           requests               rate_limit_exceeded Rate limit reached.
//   other 4xx     invalid_request_error  null                Bad request.
//   500           server_error           null                Internal server error.
//   502           server_error           null                Bad gateway: the backend ...
//   503           server_error           null                No backend is available ...
//   504           server_error           null                The backend did not answer ...
//   other 5xx     server_error           null                Server error.
//
// 404 defaults to model_not_found, OpenAI's answer for a model the key cannot
// use; an unknown path sets code = "unknown_url" on the result. 429's type is
// "requests" by default; a token limit sets type = "tokens". An empty
// `message` takes the default one.
error_fields default_error_for_status(uint16_t status, std::string_view message) noexcept {
  error_fields e;
  std::string_view fallback = "Bad request.";
  switch (status) {
    case 400: break;
    case 401:
      e.code = "invalid_api_key";
      fallback = "Incorrect API key provided.";
      break;
    case 403: fallback = "Forbidden."; break;
    case 404:
      e.code = "model_not_found";
      fallback = "The model does not exist or you do not have access to it.";
      break;
    case 405: fallback = "Method not allowed."; break;
    case 408: fallback = "Request timed out."; break;
    case 413: fallback = "Request body too large."; break;
    case 414: fallback = "Request target too long."; break;
    case 431: fallback = "Request header fields too large."; break;
    case 429:
      e.type = "requests";
      e.code = "rate_limit_exceeded";
      fallback = "Rate limit reached.";
      break;
    case 500:
      e.type = "server_error";
      fallback = "Internal server error.";
      break;
    case 502:
      e.type = "server_error";
      fallback = "Bad gateway: the backend sent an invalid response.";
      break;
    case 503:
      e.type = "server_error";
      fallback = "No backend is available for this request. Please try again later.";
      break;
    case 504:
      e.type = "server_error";
      fallback = "The backend did not answer in time.";
      break;
    default:
      if (status >= 500) {
        e.type = "server_error";
        fallback = "Server error.";
      }
      break;
  }
  e.message = message.empty() ? fallback : message;
  return e;
}

namespace detail {
// json_writer.hpp's out-of-line copy: the C library's memcpy.
void copy_bytes(char* to, const char* from, size_t n) noexcept { std::memcpy(to, from, n); }
}  // namespace detail

}  // namespace sluice::openai
