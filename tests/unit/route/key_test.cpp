#include <doctest/doctest.h>

#include "sluice/route/key.hpp"

using namespace sluice::route;
using sluice::openai::endpoint;
using sluice::openai::request_fields;

namespace {

request_fields chat(std::string_view system, std::string_view first_user) {
  request_fields f;
  f.model = "m";
  f.system_prompt = system;
  f.first_user_message = first_user;
  f.leading_messages[0] = system;
  f.leading_messages[1] = first_user;
  f.message_count = 2;
  return f;
}

}  // namespace

TEST_SUITE("route::route_key") {
  TEST_CASE("a session id wins in session mode and is ignored in prefix mode") {
    const request_fields f = chat("sys", "hello");
    const key_params session{balance_mode::session, 2, 4096};
    const key_params prefix{balance_mode::prefix, 2, 4096};
    auto a = route_key(session, endpoint::chat_completions, f, "g", "s-1", 99);
    auto b = route_key(session, endpoint::chat_completions, chat("other", "text"), "g", "s-1", 98);
    CHECK(a.source == key_source::session);
    CHECK(a.hash == b.hash);  // the session, not the content, decides
    auto c = route_key(prefix, endpoint::chat_completions, f, "g", "s-1", 99);
    CHECK(c.source == key_source::prefix);
    CHECK(c.hash != a.hash);
    CHECK(c.hash == route_key(session, endpoint::chat_completions, f, "g", "", 5).hash);
  }

  TEST_CASE("the prefix key covers model, system prompt and first user message, not later turns") {
    const key_params p{balance_mode::session, 2, 4096};
    request_fields turn1 = chat("sys", "hello");
    request_fields turn3 = chat("sys", "hello");
    turn3.last_user_message = "and then?";
    turn3.message_count = 4;
    const uint64_t k = route_key(p, endpoint::chat_completions, turn1, "g", "", 1).hash;
    CHECK(route_key(p, endpoint::chat_completions, turn3, "g", "", 2).hash == k);
    CHECK(route_key(p, endpoint::chat_completions, turn1, "h", "", 1).hash != k);
    CHECK(route_key(p, endpoint::chat_completions, chat("sys", "hellO"), "g", "", 1).hash != k);
    CHECK(route_key(p, endpoint::chat_completions, chat("sy", "shello"), "g", "", 1).hash != k);
  }

  TEST_CASE("prefix_messages 1 keys on the system prompt alone and 3 on the first three messages") {
    const key_params one{balance_mode::prefix, 1, 4096};
    CHECK(route_key(one, endpoint::chat_completions, chat("sys", "a"), "g", "", 1).hash ==
          route_key(one, endpoint::chat_completions, chat("sys", "b"), "g", "", 2).hash);
    const key_params three{balance_mode::prefix, 3, 4096};
    request_fields x = chat("sys", "a"), y = chat("sys", "a");
    x.leading_messages[2] = "r1";
    y.leading_messages[2] = "r2";
    x.message_count = y.message_count = 3;
    CHECK(route_key(three, endpoint::chat_completions, x, "g", "", 1).hash !=
          route_key(three, endpoint::chat_completions, y, "g", "", 1).hash);
  }

  TEST_CASE("completions key on the first prefix_bytes of the prompt") {
    const key_params p{balance_mode::prefix, 2, 8};
    request_fields a, b;
    a.first_user_message = "0123456789-tail-a";
    b.first_user_message = "01234567-other";
    auto ka = route_key(p, endpoint::completions, a, "g", "", 1);
    CHECK(ka.source == key_source::prefix);
    CHECK(ka.hash == route_key(p, endpoint::completions, b, "g", "", 2).hash);
  }

  TEST_CASE("no key material gives the caller's random value") {
    const key_params p{balance_mode::session, 2, 4096};
    request_fields empty;
    auto k = route_key(p, endpoint::chat_completions, empty, "g", "", 1234);
    CHECK(k.source == key_source::random);
    CHECK(k.hash == 1234);
    request_fields embed;
    embed.first_user_message = "ignored";
    CHECK(route_key(p, endpoint::embeddings, embed, "g", "", 77).source == key_source::random);
  }

  TEST_CASE("balance mode names parse") {
    CHECK(parse_balance_mode("session") == balance_mode::session);
    CHECK(parse_balance_mode("prefix") == balance_mode::prefix);
    CHECK(parse_balance_mode("least-loaded") == balance_mode::least_loaded);
    CHECK(parse_balance_mode("round-robin") == balance_mode::round_robin);
  }
}
