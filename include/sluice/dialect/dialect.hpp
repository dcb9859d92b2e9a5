#pragma once
// dialect: what a client speaks inside its HTTP frames (docs/architecture.md §2b) --
// OpenAI Chat Completions, OpenAI Responses, Anthropic Messages -- apart
// from how it is framed (the codecs) and from what the backend speaks (the
// adapters). The canonical request is an OpenAI chat completions body: a
// Responses or Messages request is parsed once and written as one, so
// routing, quota and every adapter read one shape. The canonical events
// (text, reasoning and tool-call deltas, finish, usage, error: render.hpp's
// table) are read from that body's reply and rendered in the client's
// dialect by render.hpp. No I/O here.
#include <cstdint>
#include <string_view>

namespace sluice::dialect {

enum class client_dialect : uint8_t { chat, completions, embeddings, responses, messages };

// The name in audit records and on the `dialect` metric label.
constexpr std::string_view name(client_dialect d) noexcept {
  switch (d) {
    case client_dialect::chat: return "chat";
    case client_dialect::completions: return "completions";
    case client_dialect::embeddings: return "embeddings";
    case client_dialect::responses: return "responses";
    case client_dialect::messages: return "messages";
  }
  return "chat";
}
inline constexpr size_t k_dialects = 5;

// Whether the client's errors come in Anthropic's shape
// ({"type":"error","error":{"type","message"}}) rather than OpenAI's.
constexpr bool anthropic_errors(client_dialect d) noexcept { return d == client_dialect::messages; }

// Anthropic's error type for an HTTP status (docs/architecture.md §6b): 400
// invalid_request_error, 401 authentication_error, 403 permission_error,
// 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
// 503 / 529 overloaded_error, any other 5xx api_error.
std::string_view anthropic_error_type(uint16_t status) noexcept;

// {"type":"error","error":{"type":T,"message":M}} into out[0, cap) (the
// message escaped and shortened to fit, never mid-character). Returns:
// bytes written; cap >= 128 always fits the skeleton.
size_t write_anthropic_error(char* out, size_t cap, uint16_t status, std::string_view message) noexcept;

}  // namespace sluice::dialect
