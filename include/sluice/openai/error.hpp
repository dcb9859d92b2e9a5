#pragma once
// openai: error bodies in OpenAI's shape,
//   {"error":{"message":"...","type":"...","param":null,"code":"..."}}
// written into a caller's fixed buffer (no allocation). Strings are JSON-escaped.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/core/json_string.hpp"

namespace sluice::openai {

struct error_fields {
  std::string_view message;
  std::string_view type = "invalid_request_error";
  std::string_view param;   // empty = null
  std::string_view code;    // empty = null
};

// Always valid JSON (json_escape's rules). When `cap` is too small the
// message is shortened (never mid-character or mid-escape), then param and
// code become null, then the type empty. Returns: bytes written; 0 only when
// cap < 59 (the bare skeleton with two nulls does not fit). cap >= 128
// always fits the type, param and code sluice uses with a shortened message.
size_t write_error_body(char* out, size_t cap, const error_fields& e) noexcept;

// JSON string escaping is the core's (sluice/core/json_string.hpp), named
// here as the callers of this module know it.
using ::sluice::json_escape;
// Appends `s` to `out` as a JSON string, quotes included (json_escape's
// rules). Cold paths: `out` grows (may throw std::bad_alloc).
void append_json_string(std::string& out, std::string_view s);

// The type/code OpenAI uses for an HTTP status when sluice itself answers
// (the full table is in error.cpp): 4xx type invalid_request_error, 401 code
// invalid_api_key, 404 code model_not_found (an unknown path sets code =
// "unknown_url" on the result), 429 type "requests" (a token limit sets type =
// "tokens") code rate_limit_exceeded, 5xx type server_error; code null
// otherwise. An empty `message` takes a default one for the status.
error_fields default_error_for_status(uint16_t status, std::string_view message) noexcept;

// A backend's error answer (status >= 400, body `body`) in OpenAI's shape,
// for the client: vLLM's flat {"object":"error","message",...,"code":400},
// its `--api-key` 401 {"error":"Unauthorized"}, FastAPI's {"detail":...}
// and OpenAI-shaped bodies with an integer code all become
// {"error":{"message","type","param","code"}} -- the message kept, the type
// OpenAI's for the status unless the backend gave one of OpenAI's, a code
// kept only when it is a string. A backend's 401/403 means sluice's own
// credentials for it were refused, not the client's: 502. An unreadable
// body gets a generic message. `overflow`: the body was cut (too long to
// read). Returns: bytes written to out (cap >= 512); `status_out` is the
// status to answer with. Cold path (backend errors only).
size_t normalize_backend_error(uint16_t status, std::string_view body, bool overflow, char* out, size_t cap,
                               uint16_t& status_out) noexcept;

}  // namespace sluice::openai
