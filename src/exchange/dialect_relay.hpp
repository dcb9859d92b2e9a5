#pragma once
// exchange (private): the client's dialect on the exchange's way (docs/architecture.md
// §2b). A Responses or Messages request is written as the canonical chat
// body before policy reads it (shard_server::route_request); every adapter
// then answers in chat's shape, and what reaches the client is rendered in
// its dialect here:
//   - a stream: the chat events of a batch -- read straight from an OpenAI
//     backend's stream (on_chat_event), or as the Anthropic and Triton
//     translators wrote them (render_batch) -- become the dialect's events;
//   - a non-stream reply: the chat.completion body becomes the dialect's;
//   - an error: Anthropic's shape for a Messages client (in_client_dialect).
#include <string_view>

#include "conn_memory.hpp"
#include "exchange.hpp"

namespace sluice::proxy {

// Whether the client speaks Responses or Messages (its request was
// written as the canonical chat body).
inline bool translated_request(const exchange& x) noexcept {
  return x.req.speaks == dialect::client_dialect::responses || x.req.speaks == dialect::client_dialect::messages;
}

// Whether the exchange's reply is rendered in a dialect other than chat's:
// a Responses or Messages client of a group that does not speak it.
inline bool renders(const exchange& x) noexcept { return translated_request(x) && !x.req.native; }

// The body the adapters forward: the canonical chat body written from the
// client's (renders()), else the client's own bytes.
std::string_view request_body(const exchange& x) noexcept;

// A stream's renderer, made on the connection's first rendered stream and
// reset for this one. Returns: false out of memory.
bool start_rendering(exchange& x) noexcept;

// The pings of x's reply (stream_pings), set before its stream's
// idle deadline is first armed: a rendered Messages stream is pinged each
// `interval_ms` the backend is quiet (server.ping_interval_ms).
inline void set_pings(exchange& x, uint32_t interval_ms) noexcept {
  x.pings.ping_ms = renders(x) && x.req.is_stream && x.req.speaks == dialect::client_dialect::messages ? interval_ms : 0;
}

// The chat SSE events an adapter wrote in f[k_batch_room, len), rendered in
// place as the client's events; `end_client`: the client's response ends
// with this batch (a stream cut short gets the dialect's failure events).
// Returns: false when the output cannot be had (out of memory).
bool render_batch(exchange& x, byte_buf& f, bool end_client) noexcept;

// A rendered stream (its events written as they came) whose client
// response ends with this batch: the dialect's failure events after them
// when the chat stream ended without its own end. Returns: false out of memory.
bool end_rendering(exchange& x, byte_buf& f, bool end_client) noexcept;

// A stream's canonical outcome, into the facts billing and audit read.
void take_outcome(exchange& x) noexcept;

// A non-stream chat.completion body rendered in the client's dialect, in
// x.mem->dialect_reply. Returns: false when `chat` is not one.
bool render_body(exchange& x, std::string_view chat) noexcept;

// A body sluice answers with: an error's (status >= 400) reshaped for a
// Messages client into `buf`; any other body as it is.
std::string_view in_client_dialect(const exchange& x, uint16_t status, std::string_view body, char* buf,
                                   size_t cap) noexcept;

}  // namespace sluice::proxy
