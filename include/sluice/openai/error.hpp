#pragma once
// openai: error bodies in OpenAI's shape,
//   {"error":{"message":"...","type":"...","param":null,"code":"..."}}
// written into a caller's fixed buffer (no allocation). Strings are JSON-escaped.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sluice::openai {

struct error_fields {
  std::string_view message;
  std::string_view type = "invalid_request_error";
  std::string_view param;   // empty = null
  std::string_view code;    // empty = null
};

// Returns: bytes written (the body is truncated, still valid JSON, if cap is
// too small; cap >= 128 always fits a shortened message).
size_t write_error_body(char* out, size_t cap, const error_fields& e) noexcept;

// Writes `s` JSON-escaped (without quotes). Returns bytes written, <= cap.
size_t json_escape(char* out, size_t cap, std::string_view s) noexcept;

// The type/code OpenAI uses for an HTTP status when sluice itself answers:
// 400 invalid_request_error, 401 invalid_api_key, 404 model_not_found /
// unknown_url, 408/413/414/431 invalid_request_error, 429 rate_limit_exceeded,
// 500 server_error, 502/503/504 server_error ...
error_fields default_error_for_status(uint16_t status, std::string_view message) noexcept;

}  // namespace sluice::openai
