// Backend error answers in OpenAI's shape (see error.hpp). Cold path: runs
// only when a backend answered >= 400 with a body small enough to hold.
#include <simdjson.h>

#include <array>
#include <cstring>
#include <string_view>

#include "sluice/openai/error.hpp"

namespace sluice::openai {

namespace {

bool openai_type(std::string_view t) noexcept {
  static constexpr std::array<std::string_view, 6> k_types = {
      "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
      "rate_limit_error",      "server_error"};
  for (std::string_view k : k_types) {
    if (k == t) return true;
  }
  return false;
}

// One string field of `obj`, or empty.
std::string_view string_field(simdjson::dom::object obj, std::string_view key) noexcept {
  std::string_view v;
  if (obj[key].get_string().get(v) != simdjson::SUCCESS) return {};
  return v;
}

}  // namespace

size_t normalize_backend_error(uint16_t status, std::string_view body, bool overflow, char* out, size_t cap,
                               uint16_t& status_out) noexcept {
  status_out = status;
  error_fields e = default_error_for_status(status, {});
  e.code = {};
  if (status == 401 || status == 403) {
    // The client's key was good (sluice checked it); the backend refused
    // the credential sluice sends it ([[group]] api_key_env).
    status_out = 502;
    e = default_error_for_status(502, "The backend refused the gateway's credentials.");
    e.code = "bad_gateway";
    return write_error_body(out, cap, e);
  }
  std::string_view message, type, param, code;
  // simdjson needs padding past the end: parse a padded copy. One parser per
  // thread, made on the first backend error it sees.
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (!overflow && !body.empty() && parser.parse(body.data(), body.size(), true).get(root) == simdjson::SUCCESS) {
    simdjson::dom::object top;
    if (root.get_object().get(top) == simdjson::SUCCESS) {
      simdjson::dom::object inner;
      simdjson::dom::object fields = top;
      if (top["error"].get_object().get(inner) == simdjson::SUCCESS) {
        fields = inner;  // OpenAI's shape, perhaps with an integer code
      } else if (std::string_view s = string_field(top, "error"); !s.empty()) {
        message = s;  // {"error":"..."}
      }
      if (message.empty()) message = string_field(fields, "message");
      if (message.empty()) message = string_field(top, "detail");  // FastAPI
      type = string_field(fields, "type");
      param = string_field(fields, "param");
      code = string_field(fields, "code");
    }
  }
  char generic[64];
  if (message.empty()) {
    const size_t n = static_cast<size_t>(
        std::snprintf(generic, sizeof generic, "The backend answered HTTP %u.", static_cast<unsigned>(status)));
    message = std::string_view(generic, n < sizeof generic ? n : sizeof generic - 1);
  }
  e.message = message;
  if (openai_type(type)) e.type = type;
  e.param = param;
  e.code = code;
  return write_error_body(out, cap, e);
}

}  // namespace sluice::openai
