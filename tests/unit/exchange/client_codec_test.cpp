// client_codec::answer_error, the one error writer every codec shares: the
// body it hands to the codec's answer(), the flags it passes on, and what
// it asks of the policy and the counters on the way.
#include <doctest/doctest.h>

#include <simdjson.h>

#include <string>
#include <string_view>

#include "dialect_relay.hpp"
#include "fakes.hpp"

using sluice::test::exchange_fixture;

namespace {

// The OpenAI error object of a body: message, type, param, code (null as
// "null").
struct openai_error {
  std::string message, type, param, code;
};

openai_error openai_error_of(const std::string& body) {
  simdjson::dom::parser p;
  simdjson::dom::element root;
  REQUIRE(p.parse(body).get(root) == simdjson::SUCCESS);
  simdjson::dom::object e;
  REQUIRE(root["error"].get(e) == simdjson::SUCCESS);
  auto text = [&](const char* k) -> std::string {
    simdjson::dom::element v;
    REQUIRE(e[k].get(v) == simdjson::SUCCESS);
    if (v.is_null()) return "null";
    return std::string(v.get_string().value());
  };
  return {text("message"), text("type"), text("param"), text("code")};
}

}  // namespace

TEST_SUITE("exchange::client_codec") {
  TEST_CASE("answer_error sends OpenAI's error object through the codec's answer") {
    exchange_fixture f;
    f.codec.answer_error(f.x, 404, "The model `m` does not exist.", "invalid_request_error", "model",
                         "model_not_found", false);
    REQUIRE(f.codec.answers.size() == 1);
    const auto& a = f.codec.answers[0];
    CHECK(a.status == 404);
    CHECK_FALSE(a.close);
    CHECK(a.extra_headers.empty());
    CHECK(a.error_code == "model_not_found");  // what the audit records
    const openai_error e = openai_error_of(a.body);
    CHECK(e.message == "The model `m` does not exist.");
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == "model");
    CHECK(e.code == "model_not_found");
  }

  TEST_CASE("an error with no param and no code has them null, and is audited as invalid_request") {
    exchange_fixture f;
    f.codec.answer_error(f.x, 400, "Bad \"request\".\n", "invalid_request_error", {}, {}, true);
    REQUIRE(f.codec.answers.size() == 1);
    const auto& a = f.codec.answers[0];
    CHECK(a.close);
    CHECK(a.error_code == "invalid_request");
    const openai_error e = openai_error_of(a.body);
    CHECK(e.message == "Bad \"request\".\n");  // escaped in the body, the same text once parsed
    CHECK(e.param == "null");
    CHECK(e.code == "null");
  }

  TEST_CASE("the caller's extra fields and close flag reach answer() unchanged") {
    exchange_fixture f;
    SUBCASE("a 503 with retry-after that keeps the connection") {
      f.codec.answer_error(f.x, 503, "The server is overloaded.", "server_error", {}, "overloaded", false,
                           "retry-after: 1\r\n");
      REQUIRE(f.codec.answers.size() == 1);
      CHECK(f.codec.answers[0].extra_headers == "retry-after: 1\r\n");
      CHECK_FALSE(f.codec.answers[0].close);
      CHECK(f.codec.answers[0].status == 503);
    }
    SUBCASE("a 431 that closes") {
      f.codec.answer_error(f.x, 431, "Request header fields too large.", "invalid_request_error", {}, {}, true);
      REQUIRE(f.codec.answers.size() == 1);
      CHECK(f.codec.answers[0].extra_headers.empty());
      CHECK(f.codec.answers[0].close);
    }
  }

  TEST_CASE("an exchange without a request id gets one from the policy first; one that has it keeps it") {
    exchange_fixture f;
    f.codec.answer_error(f.x, 400, "Bad request.", "invalid_request_error", {}, {}, true);
    CHECK(f.policy.request_ids == 1);
    CHECK(std::string_view(f.x.request_id, f.x.request_id_len) == "req-fixed");

    exchange_fixture g;
    constexpr std::string_view own = "client-id-7";
    std::memcpy(g.x.request_id, own.data(), own.size());
    g.x.request_id_len = static_cast<uint8_t>(own.size());
    g.codec.answer_error(g.x, 400, "Bad request.", "invalid_request_error", {}, {}, true);
    CHECK(g.policy.request_ids == 0);
    CHECK(std::string_view(g.x.request_id, g.x.request_id_len) == own);
  }

  TEST_CASE("every error sluice answers itself counts as a local error, once") {
    exchange_fixture f;
    CHECK(f.local_errors() == 0);
    f.codec.answer_error(f.x, 401, "Incorrect API key provided.", "invalid_request_error", {}, "invalid_api_key",
                         false);
    CHECK(f.local_errors() == 1);
    f.codec.answer_error(f.x, 429, "Rate limit.", "requests", {}, "rate_limit_exceeded", false);
    CHECK(f.local_errors() == 2);
  }

  TEST_CASE("a message longer than the body's room is cut, and the body stays valid JSON") {
    exchange_fixture f;
    const std::string long_message(4000, 'x');
    f.codec.answer_error(f.x, 400, long_message, "invalid_request_error", "messages", "too_long", false);
    REQUIRE(f.codec.answers.size() == 1);
    const auto& a = f.codec.answers[0];
    CHECK(a.body.size() <= 1024);
    const openai_error e = openai_error_of(a.body);
    CHECK(e.message.size() < long_message.size());
    CHECK(e.type == "invalid_request_error");
  }

  TEST_CASE("a Messages client: answer_error hands the codec OpenAI's shape, which the codec reshapes") {
    // answer_error is the same for every dialect; each codec's answer()
    // reshapes the body for a Messages client (in_client_dialect), so the
    // reshaping happens once, for answer_error's bodies and the policy's
    // own answers alike.
    exchange_fixture f;
    f.x.req.speaks = sluice::dialect::client_dialect::messages;
    f.codec.answer_error(f.x, 429, "Slow \"down\".", "requests", {}, "rate_limit_exceeded", false);
    REQUIRE(f.codec.answers.size() == 1);
    const std::string& openai = f.codec.answers[0].body;
    CHECK(openai_error_of(openai).message == "Slow \"down\".");
    char buf[1024];
    const std::string anthropic(sluice::proxy::in_client_dialect(f.x, 429, openai, buf, sizeof buf));
    simdjson::dom::parser p;
    simdjson::dom::element root;
    REQUIRE(p.parse(anthropic).get(root) == simdjson::SUCCESS);
    CHECK(std::string_view(root["type"].get_string().value()) == "error");
    CHECK(std::string_view(root["error"]["type"].get_string().value()) == "rate_limit_error");
    CHECK(std::string_view(root["error"]["message"].get_string().value()) == "Slow \"down\".");
  }
}
