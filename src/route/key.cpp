// Route keys: chained XXH3-64 over the key material (see key.hpp).
#include "sluice/route/key.hpp"

#include <xxhash.h>

#include <algorithm>

namespace sluice::route {

namespace {

// Distinct seeds keep a session id from colliding by construction with a
// prefix hash of the same bytes. Changing them remaps every key.
constexpr uint64_t k_session_seed = 0x73657373696f6e21ull;  // "session!"
constexpr uint64_t k_prefix_seed = 0x7072656669782121ull;   // "prefix!!"

// Each part is hashed with the previous hash as its seed: the chain depends
// on where parts begin and end ("ab"+"c" differs from "a"+"bc").
uint64_t chain(uint64_t h, std::string_view part) noexcept { return XXH3_64bits_withSeed(part.data(), part.size(), h); }

}  // namespace

balance_mode parse_balance_mode(std::string_view text) noexcept {
  if (text == "prefix") return balance_mode::prefix;
  if (text == "least-loaded") return balance_mode::least_loaded;
  if (text == "round-robin") return balance_mode::round_robin;
  return balance_mode::session;
}

route_key_result route_key(const key_params& params, openai::endpoint ep, const openai::request_fields& f,
                           std::string_view model, std::string_view session_id, uint64_t random_seed) noexcept {
  if (params.mode == balance_mode::session && !session_id.empty()) {
    return {XXH3_64bits_withSeed(session_id.data(), session_id.size(), k_session_seed), key_source::session};
  }
  uint64_t h = chain(k_prefix_seed, model);
  bool material = false;
  switch (ep) {
    case openai::endpoint::chat_completions:
      if (params.prefix_messages <= 2) {
        material = !f.system_prompt.empty() || (params.prefix_messages == 2 && !f.first_user_message.empty());
        h = chain(h, f.system_prompt);
        if (params.prefix_messages == 2) h = chain(h, f.first_user_message);
      } else {
        const uint32_t k = std::min({params.prefix_messages, f.message_count,
                                     openai::request_fields::k_leading_messages_max});
        for (uint32_t i = 0; i < k; ++i) {
          material = material || !f.leading_messages[i].empty();
          h = chain(h, f.leading_messages[i]);
        }
      }
      break;
    case openai::endpoint::completions: {
      std::string_view prompt = f.first_user_message;
      prompt = prompt.substr(0, std::min<size_t>(prompt.size(), params.prefix_bytes));
      material = !prompt.empty();
      h = chain(h, prompt);
      break;
    }
    case openai::endpoint::embeddings:
      break;
  }
  if (!material) return {random_seed, key_source::random};
  return {h, key_source::prefix};
}

}  // namespace sluice::route
