#pragma once
// adapters (private): the Anthropic Messages API backend adapter (POST
// /v1/messages: Anthropic itself, vLLM and SGLang's native endpoints). The
// client's OpenAI chat (or legacy completions) request is rewritten into a
// Messages request here; the transport -- pools, connect, send, receive,
// retries -- is the OpenAI adapter's HTTP/1.1 one (openai_http), and the
// reply is read back here, as that transport's http_reply_reader
// (anthropic_relay.cpp), so the client sees what the OpenAI adapter gives
// for the same reply.
#include <string>

#include "backend_adapter.hpp"
#include "openai_http.hpp"
#include "shard_context.hpp"
#include "sluice/openai/anthropic.hpp"

namespace sluice::proxy {

// Shard-local; the Anthropic adapter's memory of a client connection (its
// wing of exchange_memory, kept across exchanges): the reply's translator,
// made on the connection's first translated Anthropic stream.
struct anthropic_memory final : adapter_memory {
  openai::anthropic_stream stream{http::sse_scanner::k_event_bytes_max};
  // What the translator allocates besides itself (counted with it).
  static constexpr int64_t k_extra_bytes = 2 * static_cast<int64_t>(http::sse_scanner::k_event_bytes_max);
};
inline constexpr size_t k_anthropic_wing = 0;  // exchange_memory::wings (triton_grpc.hpp has 1)

// Shard-local; a part of the shard's server.
class anthropic_http final : public backend_adapter, public http_reply_reader {
 public:
  anthropic_http(shard_context& s, openai_http& transport) noexcept : _s(s), _http(transport) {}
  anthropic_http(const anthropic_http&) = delete;
  anthropic_http& operator=(const anthropic_http&) = delete;

  // --- backend_adapter ---
  // The Messages request, head and body, in x.mem->up_head (the body is
  // sluice's, not the client's bytes: nothing of the request is lent).
  bool prepare(exchange& x, const openai::request_fields& f) noexcept override;
  void start(exchange& x) noexcept override { _http.start(x); }
  void release(exchange& x) noexcept override { _http.release(x); }
  void on_timeout(exchange& x) noexcept override { _http.on_timeout(x); }
  void on_sent(exchange& x) noexcept override { _http.on_sent(x); }

  // --- http_reply_reader (anthropic_relay.cpp) ---
  // Anthropic's own "overloaded" is 529.
  bool overloaded(uint16_t status) const noexcept override { return status == 529; }
  size_t error_to_openai(uint16_t status, std::string_view body, bool overflow, char* out, size_t cap,
                         uint16_t& status_out) const noexcept override;
  void on_reply_head(exchange& x) noexcept override;
  void on_reply_event(exchange& x, const http::sse_event& ev) noexcept override;
  void on_whole_reply(exchange& x) noexcept override;

  static constexpr std::string_view k_version = "2023-06-01";  // anthropic-version

 private:
  shard_context& _s;
  openai_http& _http;
  openai::anthropic_request_writer _writer;  // its parsers, reused
  std::string _body;                         // the Messages body, reused (cold-ish: once per request)
  std::string _reply;                        // a non-stream reply translated, reused
};

}  // namespace sluice::proxy
