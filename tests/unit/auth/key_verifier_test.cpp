#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sluice/auth/key_verifier.hpp"

using sluice::auth::bearer_token;
using sluice::auth::key_verifier;
using sluice::config::key_config;

namespace {

std::vector<key_config> keys_of(std::initializer_list<const char*> secrets) {
  std::vector<key_config> v;
  for (const char* s : secrets) {
    key_config k;
    k.id = std::string("id-") + s;
    k.key_sha256 = sluice::config::sha256(s);
    v.push_back(k);
  }
  return v;
}

}  // namespace

TEST_SUITE("auth::key_verifier") {
  TEST_CASE("the bearer token is the value after the scheme, any case, spaces skipped") {
    CHECK(bearer_token("Bearer abc") == "abc");
    CHECK(bearer_token("bearer   abc") == "abc");
    CHECK(bearer_token("BEARER abc") == "abc");
    CHECK(bearer_token("Basic abc").empty());
    CHECK(bearer_token("Bearer").empty());
    CHECK(bearer_token("Bearer ").empty());
    CHECK(bearer_token("").empty());
  }

  TEST_CASE("a configured key is found by its digest; any other is not") {
    const auto keys = keys_of({"alpha", "beta"});
    key_verifier v;
    CHECK(v.find("Bearer beta", keys) == 1);
    CHECK(v.find("Bearer alpha", keys) == 0);
    CHECK(v.find("Bearer gamma", keys) == -1);
    CHECK(v.find("Bearer alph", keys) == -1);
    CHECK(v.find("alpha", keys) == -1);
  }

  TEST_CASE("x-api-key is taken when there is no bearer credential; a bearer one wins") {
    const auto keys = keys_of({"alpha", "beta"});
    key_verifier v;
    CHECK(v.find("", "beta", keys) == 1);
    CHECK(v.find("", "beta \t", keys) == 1);  // trailing whitespace of a field value
    CHECK(v.find("", "gamma", keys) == -1);
    CHECK(v.find("", "", keys) == -1);
    CHECK(v.find("Bearer alpha", "beta", keys) == 0);
    CHECK(v.find("Bearer gamma", "beta", keys) == -1);
    CHECK(v.find("Basic abc", "beta", keys) == 1);  // no bearer credential: the api key
  }

  TEST_CASE("a verified key is served from the cache; a wrong key is never cached") {
    const auto keys = keys_of({"alpha"});
    key_verifier v;
    CHECK(v.find("Bearer alpha", keys) == 0);
    CHECK(v.find("Bearer alpha", keys) == 0);
    CHECK(v.cache_hits() == 1);
    CHECK(v.full_checks() == 1);
    CHECK(v.find("Bearer wrong", keys) == -1);
    CHECK(v.find("Bearer wrong", keys) == -1);
    CHECK(v.full_checks() == 3);  // every guess pays the full check
  }

  TEST_CASE("a removed key stops authenticating once the cache is forgotten (reload)") {
    auto keys = keys_of({"alpha", "beta"});
    key_verifier v;
    REQUIRE(v.find("Bearer alpha", keys) == 0);
    keys[0].removed = true;
    v.forget();
    CHECK(v.find("Bearer alpha", keys) == -1);
    CHECK(v.find("Bearer beta", keys) == 1);
  }

  TEST_CASE("a key longer than the cache holds is verified every time") {
    const std::string long_key(300, 'k');
    const auto keys = keys_of({long_key.c_str()});
    key_verifier v;
    const std::string header = "Bearer " + long_key;
    CHECK(v.find(header, keys) == 0);
    CHECK(v.find(header, keys) == 0);
    CHECK(v.cache_hits() == 0);
    CHECK(v.find("Bearer " + long_key.substr(1), keys) == -1);
  }
}
