#pragma once
// auth: which configured key an `Authorization: Bearer KEY` header presents.
//
// Keys are configured as SHA-256 digests; a presented key is hashed and
// compared against every digest in constant time, so timing says nothing
// about which (or whether a) key matched. Recently verified keys skip the
// hash: a small direct-mapped cache of the exact key bytes, compared in
// constant time. Wrong keys are never cached, so every guess pays the full
// hash and compare.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sluice/config/config.hpp"

namespace sluice::auth {

// The KEY of "Bearer KEY" (scheme case-insensitive, spaces after it
// skipped). Returns: empty when the value is no bearer credential.
std::string_view bearer_token(std::string_view authorization) noexcept;

// Shard-local (one per shard: no locks); lives as long as the shard.
class key_verifier {
 public:
  static constexpr size_t k_cache_entries = 64;
  static constexpr size_t k_cached_key_bytes_max = 115;  // longer keys are verified every time

  // Returns: the index in `keys` of the key `authorization` presents, or -1
  // (no bearer credential, an unknown key, or a removed one).
  int32_t find(std::string_view authorization, std::span<const config::key_config> keys) noexcept {
    return find(authorization, {}, keys);
  }
  // The same with `api_key` (an x-api-key value, as Anthropic's SDK sends
  // it) taken when there is no bearer credential.
  int32_t find(std::string_view authorization, std::string_view api_key,
               std::span<const config::key_config> keys) noexcept;
  // Every cached key forgotten (a reload may remove or re-key any).
  void forget() noexcept;

  uint64_t cache_hits() const noexcept { return _hits; }
  uint64_t full_checks() const noexcept { return _full; }

 private:
  // 128 bytes: two cache lines per entry at most, 8 KiB per shard.
  struct entry {
    uint64_t tag = 0;
    int32_t key_index = -1;
    uint8_t key_len = 0;
    char key[k_cached_key_bytes_max] = {};
  };
  std::array<entry, k_cache_entries> _cache{};
  uint64_t _hits = 0;
  uint64_t _full = 0;
};

}  // namespace sluice::auth
