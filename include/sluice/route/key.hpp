#pragma once
// route: the route key of a request (docs/architecture.md §3). A pure function of the
// request: the same request gives the same key on every shard and every
// sluice instance, so affinity needs no shared state. No allocation.
#include <cstdint>
#include <string_view>

#include "sluice/openai/request.hpp"

namespace sluice::route {

enum class balance_mode : uint8_t { session, prefix, least_loaded, round_robin };

// "session" | "prefix" | "least-loaded" | "round-robin" (config validated it);
// anything else reads as session, the default.
balance_mode parse_balance_mode(std::string_view text) noexcept;

// A group's key settings (config::group_config).
struct key_params {
  balance_mode mode = balance_mode::session;
  uint32_t prefix_messages = 2;  // 1 = system prompt; 2 = + first user message; 3..8 = first K messages
  uint32_t prefix_bytes = 4096;  // /v1/completions: leading prompt bytes
};

enum class key_source : uint8_t { session, prefix, random };

struct route_key_result {
  uint64_t hash = 0;
  key_source source = key_source::random;
  // A global backend index the request must reach while it can take it
  // (previous_response_id on a native Responses group: the backend that
  // holds the conversation); UINT32_MAX = none.
  uint32_t pinned = UINT32_MAX;
};

// Precedence: X-Session-ID (mode session, non-empty) -> XXH3 of `model`, then
// the prefix material -> `random_seed` (the caller's per-shard PRNG value).
// Prefix material: chat with prefix_messages <= 2: the system prompt and
// (when 2) the first user message, which stay the same on every turn of a
// conversation; 3..8: the texts of the first K messages (a conversation's
// first turns then land apart: K > 2 is for long shared openings).
// Completions: the first prefix_bytes of the prompt. Embeddings, or no
// material at all: random.
// `model`: pass the group name, so that every alias of a group shares keys.
route_key_result route_key(const key_params& params, openai::endpoint ep, const openai::request_fields& f,
                           std::string_view model, std::string_view session_id, uint64_t random_seed) noexcept;

}  // namespace sluice::route
