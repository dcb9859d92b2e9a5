#pragma once
// The per-connection state of a mock-vllm worker, shared by worker.cpp (HTTP
// and the OpenAI endpoints) and messages.cpp (Anthropic's /v1/messages).
#include <llhttp.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "options.hpp"
#include "state.hpp"
#include "wire.hpp"
#include "worker.hpp"

namespace mock_vllm {

// An unpaced stream stops generating while this much waits to be sent and
// goes on when the socket has taken it: a reply of hundreds of MiB to a slow
// reader is produced as fast as it is read, not held whole in memory.
inline constexpr size_t k_output_high = 1024 * 1024;

inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

inline const std::string* find_header(const header_list& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (iequals(h.first, name)) return &h.second;
  }
  return nullptr;
}

// --fail-after-tokens, or the request's "x-mock-fail-after-tokens: N" (a
// test's per-request failure in soak traffic; a bad value is ignored).
inline uint32_t fail_after_tokens(const options& opts, const header_list& headers) {
  uint32_t n = opts.fail_after_tokens;
  if (const std::string* fail = find_header(headers, "x-mock-fail-after-tokens")) {
    uint32_t v = 0;
    auto [end, ec] = std::from_chars(fail->data(), fail->data() + fail->size(), v);
    if (ec == std::errc{} && end == fail->data() + fail->size()) n = v;
  }
  return n;
}

// Shard-local. One per accepted socket, from accept until close; reused
// through the worker's free list so its buffers keep their capacity.
struct worker::connection {
  int fd = -1;
  llhttp_t parser{};
  std::string in;  // received, not yet parsed past `in_parsed`
  size_t in_parsed = 0;
  std::string out;  // to send, from `out_sent`
  size_t out_sent = 0;

  // The request being parsed (llhttp hands pieces of each across reads).
  std::string url;
  header_list headers;
  bool in_value = false;
  std::string body;
  bool request_ready = false;
  bool keep_alive = true;
  bool close_header = false;  // uvicorn echoes a literal "connection: close"

  bool want_write = false;
  bool closing = false;  // close once `out` is sent
  bool dead = false;
  bool peer_eof = false;
  bool blocked = false;  // generation waits for `out` to drain (k_output_high)

  // The reply in progress; `busy` while it is not fully generated.
  bool busy = false;
  bool waiting = false;  // before the first token (vllm:num_requests_waiting)
  endpoint kind = endpoint::chat;
  bool stream = false;
  bool include_usage = false;
  bool ends_by_length = false;
  bool role_sent = false;
  uint32_t tokens = 0;
  uint32_t sent = 0;
  uint32_t fail_after = 0;  // --fail-after-tokens, or this request's x-mock-fail-after-tokens
  uint32_t prompt_tokens = 0;
  int64_t created = 0;
  uint64_t first_token_ns = 0;
  uint64_t timer_serial = 0;
  std::string id;
  std::string prefix;  // constant head of every chunk of this stream
  // /v1/messages: a tool_use reply instead of text (anthropic_plan::tool_use).
  bool tool_use = false;
  std::string tool_name;
  std::string tool_id;
  uint32_t seq = 0;  // /v1/responses: the next event's sequence_number
  // --max-running: this request holds one of the loop's slots, or waits for one.
  bool has_slot = false;
  bool queued = false;
  uint64_t queue_serial = 0;  // its entry in the loop's queue (fds are reused)
};

}  // namespace mock_vllm
