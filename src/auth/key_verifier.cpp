#include "sluice/auth/key_verifier.hpp"

#include <openssl/crypto.h>
#include <xxhash.h>

#include <cstring>

#include "sluice/core/text.hpp"

namespace sluice::auth {

std::string_view bearer_token(std::string_view a) noexcept {
  if (a.size() < 7 || !iequals(a.substr(0, 7), "bearer ")) return {};
  std::string_view key = a.substr(7);
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  return key;
}

int32_t key_verifier::find(std::string_view authorization, std::string_view api_key,
                           std::span<const config::key_config> keys) noexcept {
  std::string_view key = bearer_token(authorization);
  if (key.empty()) {
    key = api_key;
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
  }
  if (key.empty()) return -1;
  const uint64_t tag = XXH3_64bits(key.data(), key.size());
  entry& e = _cache[tag % k_cache_entries];
  if (key.size() <= sizeof e.key && e.key_len == key.size() && e.tag == tag && e.key_index >= 0 &&
      static_cast<size_t>(e.key_index) < keys.size() && CRYPTO_memcmp(e.key, key.data(), key.size()) == 0) {
    ++_hits;
    return e.key_index;
  }
  ++_full;
  const std::array<uint8_t, 32> digest = config::sha256(key);
  int32_t found = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool same = CRYPTO_memcmp(keys[i].key_sha256.data(), digest.data(), digest.size()) == 0;
    found = same && !keys[i].removed ? static_cast<int32_t>(i) : found;
  }
  if (found >= 0 && key.size() <= sizeof e.key) {
    e.tag = tag;
    e.key_len = static_cast<uint8_t>(key.size());
    std::memcpy(e.key, key.data(), key.size());
    e.key_index = found;
  }
  return found;
}

void key_verifier::forget() noexcept {
  for (entry& e : _cache) e = entry{};
}

}  // namespace sluice::auth
