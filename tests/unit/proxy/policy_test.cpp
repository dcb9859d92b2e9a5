// The policy's decisions before a request reaches a backend, through the
// calls a codec makes: which key it is, which endpoint, which group, and
// whether the key's quota and budgets let it go; and what the client reads
// when they do not (status, body, retry-after and the rate and budget
// fields), with the counters that say so.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "policy_fixture.hpp"

using namespace sluice::policy_test;

namespace {

constexpr std::string_view k_config = R"(
[audit]
path = ""

[quota]
default_max_tokens = 100
max_tokens_cap = 4096

[router]
group_header = true

[[group]]
name = "chat"
models = ["chat-*", "chat"]
backends = ["http://127.0.0.1:9"]

[[group]]
name = "vision"
models = ["vision-large"]
backends = ["http://127.0.0.1:10"]

[[group]]
name = "private"
models = ["private-*"]
backends = ["http://127.0.0.1:9"]

[[key]]
id = "all"
key = "sk-all"

[[key]]
id = "chatonly"
key = "sk-chat"
groups = ["chat"]

[[key]]
id = "tpm"
key = "sk-tpm"
tokens_per_minute = 1000
groups = ["chat"]

[[key]]
id = "rpm"
key = "sk-rpm"
requests_per_minute = 2
groups = ["chat"]

[[key]]
id = "conc"
key = "sk-conc"
max_concurrent = 1
groups = ["chat"]

[[key]]
id = "daily"
key = "sk-daily"
daily_tokens = 5000
groups = ["chat"]
)";

constexpr uint32_t k_chat = 0, k_vision = 1;

std::string chat_body(std::string_view model, int max_tokens = 10) {
  return R"({"model":")" + std::string(model) + R"(","messages":[{"role":"user","content":"hello"}],"max_tokens":)" +
         std::to_string(max_tokens) + "}";
}

// The value of header `name` in CRLF-separated lines; "" if absent.
std::string header_value(std::string_view lines, std::string_view name) {
  const std::string key = std::string(name) + ": ";
  size_t at = 0;
  while (at < lines.size()) {
    const size_t end = lines.find("\r\n", at);
    const std::string_view line = lines.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    if (line.starts_with(key)) return std::string(line.substr(key.size()));
    if (end == std::string_view::npos) break;
    at = end + 2;
  }
  return {};
}

// The response fields the codec would write for `r` now (x-ratelimit-*,
// x-budget-*, x-sluice-group).
std::string fields_of(policy_fixture& f, const request& r) {
  char out[2048];
  return std::string(out, f.srv->write_response_headers(r.x, out, sizeof out));
}

uint64_t remaining_tokens(policy_fixture& f, const request& r) {
  return std::stoull(header_value(fields_of(f, r), "x-ratelimit-remaining-tokens"));
}

}  // namespace

TEST_SUITE("proxy::policy auth") {
  TEST_CASE("the key is read from Authorization: Bearer and from x-api-key alike") {
    policy_fixture f(k_config);
    SUBCASE("Bearer") {
      request r(f, "POST", "/v1/chat/completions", bearer("sk-chat"), chat_body("chat-1"));
      r.run();
      CHECK(r.x.key_index == 1);
      CHECK(r.adapter.started == 1);
      r.end();
    }
    SUBCASE("x-api-key, as Anthropic's SDK sends it") {
      request r(f, "POST", "/v1/chat/completions", api_key("sk-chat"), chat_body("chat-1"));
      r.run();
      CHECK(r.x.key_index == 1);
      CHECK(r.adapter.started == 1);
      r.end();
    }
  }

  TEST_CASE("a wrong key is 401 invalid_api_key in OpenAI's shape, counted as an answer of no group") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-nope"), chat_body("chat-1"));
    r.run();
    CHECK(r.codec.status == 401);
    CHECK(r.codec.message == "Incorrect API key provided.");
    CHECK(r.codec.body.find("\"code\":\"invalid_api_key\"") != std::string::npos);
    CHECK(r.codec.body.find("\"type\":\"invalid_request_error\"") != std::string::npos);
    CHECK(r.adapter.prepared == 0);
    r.end();
    CHECK(f.answers(f.no_group(), 401) == 1);
    CHECK(f.metrics.sum(sluice::metrics::stat::local_errors) == 1);
  }

  TEST_CASE("on /v1/messages a 401 is in Anthropic's shape: authentication_error") {
    policy_fixture f(k_config);
    SUBCASE("a wrong key") {
      request r(f, "POST", "/v1/messages", api_key("sk-nope"), "{}");
      r.run();
      CHECK(r.codec.status == 401);
      CHECK(r.codec.body ==
            R"({"type":"error","error":{"type":"authentication_error","message":"Incorrect API key provided."}})");
      r.end();
    }
    SUBCASE("no key: the message names x-api-key") {
      request r(f, "POST", "/v1/messages", "", "{}");
      r.run();
      CHECK(r.codec.status == 401);
      CHECK(r.codec.body.starts_with(R"({"type":"error","error":{"type":"authentication_error","message":"x-api-key)"));
      r.end();
    }
  }

  TEST_CASE("no key on an OpenAI path: 401 telling how to send one") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", "", chat_body("chat-1"));
    r.run();
    CHECK(r.codec.status == 401);
    CHECK(r.codec.message.starts_with("You didn't provide an API key."));
    CHECK(r.x.key_index < 0);
    r.end();
  }

  TEST_CASE("a model of a group the key may not use is 404 model_not_found, as if it did not exist") {
    policy_fixture f(k_config);
    request denied(f, "POST", "/v1/chat/completions", bearer("sk-chat"), chat_body("vision-large"));
    denied.run();
    CHECK(denied.codec.status == 404);
    CHECK(denied.codec.code == "model_not_found");
    CHECK(denied.codec.param == "model");
    CHECK(denied.codec.message == "The model `vision-large` does not exist or you do not have access to it.");
    CHECK(denied.adapter.prepared == 0);
    denied.end();
    // The same model for a key of every group goes on.
    request allowed(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("vision-large"));
    allowed.run();
    CHECK(allowed.x.group == k_vision);
    CHECK(allowed.adapter.started == 1);
    allowed.end();
  }
}

TEST_SUITE("proxy::policy endpoints") {
  TEST_CASE("an unknown path is 404 before the key is looked at") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completion", "", chat_body("chat-1"));
    r.run();
    CHECK(r.codec.status == 404);
    CHECK(r.codec.code == "unknown_url");
    CHECK(r.x.key_index < 0);
    r.end();
  }

  TEST_CASE("a known path with the wrong method is 405 method_not_allowed") {
    policy_fixture f(k_config);
    SUBCASE("POST /v1/models") {
      request r(f, "POST", "/v1/models", bearer("sk-all"), "{}");
      r.run();
      CHECK(r.codec.status == 405);
      CHECK(r.codec.code == "method_not_allowed");
      r.end();
    }
    SUBCASE("GET /v1/messages") {
      request r(f, "GET", "/v1/messages", bearer("sk-all"), "");
      r.run();
      CHECK(r.codec.status == 405);
      CHECK(r.codec.body.find("\"type\":\"invalid_request_error\"") != std::string::npos);
      CHECK(r.codec.body.starts_with(R"({"type":"error")"));
      r.end();
    }
  }

  TEST_CASE("GET /v1/models lists the exact names of the key's groups, and the group's name") {
    policy_fixture f(k_config);
    request mine(f, "GET", "/v1/models", bearer("sk-chat"), "");
    mine.run();
    CHECK(mine.codec.status == 200);
    CHECK(mine.codec.body ==
          R"({"object":"list","data":[{"id":"chat","object":"model","created":0,"owned_by":"sluice"}]})");
    mine.end();
    request every(f, "GET", "/v1/models", bearer("sk-all"), "");
    every.run();
    CHECK(every.codec.body.find(R"("id":"vision-large")") != std::string::npos);
    CHECK(every.codec.body.find(R"("id":"vision")") != std::string::npos);   // the group's name
    CHECK(every.codec.body.find(R"("id":"private")") != std::string::npos);
    CHECK(every.codec.body.find("private-*") == std::string::npos);          // a pattern is no name
    CHECK(every.adapter.prepared == 0);
    every.end();
  }

  TEST_CASE("GET /v1/models/{id} answers a model the key may use and 404s the others alike") {
    policy_fixture f(k_config);
    request ok(f, "GET", "/v1/models/chat-7b", bearer("sk-chat"), "");
    ok.run();
    CHECK(ok.codec.status == 200);
    CHECK(ok.codec.body == R"({"id":"chat-7b","object":"model","created":0,"owned_by":"sluice"})");
    ok.end();
    request hidden(f, "GET", "/v1/models/vision-large", bearer("sk-chat"), "");
    hidden.run();
    CHECK(hidden.codec.status == 404);
    CHECK(hidden.codec.code == "model_not_found");
    hidden.end();
    request escaped(f, "GET", "/v1/models/chat%2Dx", bearer("sk-chat"), "");
    escaped.run();
    CHECK(escaped.codec.status == 200);
    CHECK(escaped.codec.body.find(R"("id":"chat-x")") != std::string::npos);
    escaped.end();
  }
}

TEST_SUITE("proxy::policy routing") {
  TEST_CASE("a model goes to the group whose name or pattern matches it") {
    policy_fixture f(k_config);
    request exact(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("chat"));
    exact.run();
    CHECK(exact.x.group == k_chat);
    request pattern(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("chat-large-2"));
    pattern.run();
    CHECK(pattern.x.group == k_chat);
    request other(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("vision-large"));
    other.run();
    CHECK(other.x.group == k_vision);
    CHECK(std::string_view(other.x.req.model, other.x.req.model_len) == "vision-large");
    for (request* r : {&exact, &pattern, &other}) {
      CHECK(r->adapter.started == 1);
      r->end();
    }
  }

  TEST_CASE("an unknown model is 404 model_not_found with the model quoted, and nothing reserved") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body(R"(gpt-\"9\")"));
    r.run();
    CHECK(r.codec.status == 404);
    CHECK(r.codec.code == "model_not_found");
    CHECK(r.codec.message == "The model `gpt-\\\"9\\\"` does not exist or you do not have access to it.");
    CHECK_FALSE(r.x.held.live);
    CHECK(remaining_tokens(f, r) == 1000);
    r.end();
    CHECK(f.answers(f.no_group(), 404) == 1);
  }

  TEST_CASE("with [router] group_header the answer names its group in x-sluice-group") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("vision-large"));
    r.run();
    CHECK(header_value(fields_of(f, r), "x-sluice-group") == "vision");
    r.end();
    request refused(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("nothing"));
    refused.run();
    CHECK(fields_of(f, refused).find("x-sluice-group") == std::string::npos);  // no group, no field
    refused.end();
  }

  TEST_CASE("without group_header no x-sluice-group field is written") {
    std::string config(k_config);
    config.replace(config.find("group_header = true"), 19, "group_header = false");
    policy_fixture f(config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-all"), chat_body("chat-1"));
    r.run();
    REQUIRE(r.adapter.started == 1);
    CHECK(fields_of(f, r).find("x-sluice-group") == std::string::npos);
    r.end();
  }
}

TEST_SUITE("proxy::policy quota") {
  TEST_CASE("admission reserves input + max_tokens x 2; the end settles on the backend's usage") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body("chat-1", 100));
    r.run();
    REQUIRE(r.adapter.started == 1);
    REQUIRE(r.x.held.live);
    CHECK(r.x.reserved_output == 100);
    CHECK(r.x.input_estimate > 0);
    CHECK(r.x.quota_cost == r.x.input_estimate + 200);
    CHECK(remaining_tokens(f, r) == 1000 - r.x.quota_cost);
    CHECK(header_value(fields_of(f, r), "x-ratelimit-limit-tokens") == "1000");
    CHECK(fields_of(f, r).find("x-ratelimit-limit-requests") == std::string::npos);  // unlimited: no field
    r.served(7, 30);  // 7 + 30 x 2 = 67
    CHECK_FALSE(r.x.held.live);
    CHECK(r.x.quota_charged == 67);
    CHECK(remaining_tokens(f, r) == 1000 - 67);
    CHECK(f.budgets.key_tokens(2) == 37);  // budgets count tokens, unweighted
    CHECK(f.answers(k_chat, 200) == 1);
    // Ended twice (a codec's close after its answer): settled and counted once.
    f.srv->end_request(r.x);
    CHECK(remaining_tokens(f, r) == 1000 - 67);
    CHECK(f.answers(k_chat, 200) == 1);
  }

  TEST_CASE("a request ended before any answer is refunded whole") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body("chat-1", 100));
    r.run();
    REQUIRE(r.x.held.live);
    r.x.status = 502;
    r.end();
    CHECK(r.x.quota_charged == 0);
    CHECK(remaining_tokens(f, r) == 1000);
    CHECK(f.budgets.key_tokens(2) == 0);
  }

  TEST_CASE("a non-stream 200 whose usage was never read bills the prompt estimate and the whole output cap") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body("chat-1", 50));
    r.run();
    REQUIRE(r.x.held.live);
    r.x.rsp.head_seen = true;
    r.x.rsp.head.status = 200;  // the head came, the client left before the body
    r.x.status = 200;
    r.end();
    CHECK(r.x.quota_charged == r.x.input_estimate + 100);
    CHECK(remaining_tokens(f, r) == 1000 - r.x.quota_charged);
  }

  TEST_CASE("over the key's tokens per minute: 429 rate_limit_exceeded with retry-after and the rate fields") {
    policy_fixture f(k_config);
    request first(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body("chat-1", 400));
    first.run();
    REQUIRE(first.adapter.started == 1);
    const uint64_t left = remaining_tokens(f, first);
    REQUIRE(left < 400);
    request second(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body("chat-1", 200));
    second.run();
    CHECK(second.codec.status == 429);
    CHECK(second.codec.code == "rate_limit_exceeded");
    CHECK(second.codec.type == "tokens");
    CHECK(second.codec.message.starts_with("Rate limit reached for key tpm on tokens per min: Limit 1000, Requested " +
                                           std::to_string(second.x.quota_cost) + ". Please try again in "));
    CHECK(second.adapter.started == 0);
    CHECK_FALSE(second.x.held.live);
    const std::string retry_s = header_value(second.codec.extra_headers, "retry-after");
    const std::string retry_ms = header_value(second.codec.extra_headers, "retry-after-ms");
    REQUIRE_FALSE(retry_s.empty());
    REQUIRE_FALSE(retry_ms.empty());
    CHECK(std::stoull(retry_ms) > 250);  // past the wait bound: answered, not parked
    CHECK(std::stoull(retry_s) * 1000 >= std::stoull(retry_ms));
    CHECK(second.codec.extra_headers.find("x-should-retry") == std::string::npos);
    CHECK(header_value(second.codec.sluice_headers, "x-ratelimit-limit-tokens") == "1000");
    CHECK(header_value(second.codec.sluice_headers, "x-ratelimit-remaining-tokens") == std::to_string(left));
    CHECK_FALSE(header_value(second.codec.sluice_headers, "x-ratelimit-reset-tokens").empty());
    CHECK(f.sample(R"(sluice_quota_rejected_total{key="tpm",reason="tokens"})") == 1);
    second.end();
    first.end();
    CHECK(f.answers(k_chat, 429) == 1);
  }

  TEST_CASE("a request larger than the whole bucket is told not to retry") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-tpm"), chat_body("chat-1", 600));
    r.run();
    CHECK(r.codec.status == 429);
    CHECK(r.codec.message.starts_with("Request too large for key tpm on tokens per min: Limit 1000"));
    CHECK(r.codec.has_header("x-should-retry: false\r\n"));
    CHECK(remaining_tokens(f, r) == 1000);  // nothing taken
    CHECK(f.sample(R"(sluice_quota_rejected_total{key="tpm",reason="too_large"})") == 1);
    r.end();
  }

  TEST_CASE("requests per minute: the third request of a key allowed two is 429 of type requests") {
    policy_fixture f(k_config);
    request a(f, "POST", "/v1/chat/completions", bearer("sk-rpm"), chat_body("chat-1"));
    request b(f, "POST", "/v1/chat/completions", bearer("sk-rpm"), chat_body("chat-1"));
    request c(f, "POST", "/v1/chat/completions", bearer("sk-rpm"), chat_body("chat-1"));
    a.run();
    a.served(3, 3);
    b.run();
    b.served(3, 3);
    c.run();
    CHECK(a.adapter.started == 1);
    CHECK(b.adapter.started == 1);
    CHECK(c.adapter.started == 0);
    CHECK(c.codec.status == 429);
    CHECK(c.codec.type == "requests");
    CHECK(c.codec.message.starts_with("Rate limit reached for key rpm on requests per min: Limit 2, Requested 1."));
    CHECK(header_value(c.codec.sluice_headers, "x-ratelimit-limit-requests") == "2");
    CHECK(header_value(c.codec.sluice_headers, "x-ratelimit-remaining-requests") == "0");
    CHECK(f.sample(R"(sluice_quota_rejected_total{key="rpm",reason="requests"})") == 1);
    c.end();
  }

  TEST_CASE("max_concurrent: a second request while one runs is 429; once it ends the next goes") {
    policy_fixture f(k_config);
    request a(f, "POST", "/v1/chat/completions", bearer("sk-conc"), chat_body("chat-1"));
    a.run();
    REQUIRE(a.adapter.started == 1);
    request b(f, "POST", "/v1/chat/completions", bearer("sk-conc"), chat_body("chat-1"));
    b.run();
    CHECK(b.codec.status == 429);
    CHECK(b.codec.message.starts_with("Too many concurrent requests for key conc: Limit 1."));
    CHECK(header_value(b.codec.extra_headers, "retry-after") == "1");
    CHECK(header_value(b.codec.extra_headers, "retry-after-ms") == "1000");
    CHECK(f.sample(R"(sluice_quota_rejected_total{key="conc",reason="concurrency"})") == 1);
    b.end();
    a.served(1, 1);
    request c(f, "POST", "/v1/chat/completions", bearer("sk-conc"), chat_body("chat-1"));
    c.run();
    CHECK(c.adapter.started == 1);
    c.end();
  }
}

TEST_SUITE("proxy::policy budgets") {
  TEST_CASE("an exhausted daily budget is 429 insufficient_quota, not to be retried, with the budget fields") {
    policy_fixture f(k_config);
    sluice::quota::budget_limits left{};
    f.budgets.publish_key(5, 1u << static_cast<unsigned>(sluice::quota::budget_kind::daily_tokens), left);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-daily"), chat_body("chat-1"));
    r.run();
    CHECK(r.codec.status == 429);
    CHECK(r.codec.code == "insufficient_quota");
    CHECK(r.codec.type == "insufficient_quota");
    CHECK(r.codec.message.starts_with("The daily token budget of key daily (5000 tokens) is used up; it resets at "));
    CHECK(r.codec.has_header("x-should-retry: false\r\n"));
    CHECK(header_value(r.codec.sluice_headers, "x-budget-remaining-daily-tokens") == "0");
    CHECK_FALSE(header_value(r.codec.sluice_headers, "x-budget-reset-daily").empty());
    CHECK(header_value(r.codec.sluice_headers, "x-budget-reset-monthly").empty());  // no monthly budget
    CHECK(r.adapter.started == 0);
    CHECK_FALSE(r.x.held.live);
    r.end();
    CHECK(f.answers(k_chat, 429) == 1);
  }

  TEST_CASE("a key with budget left is admitted and its answers say what is left") {
    policy_fixture f(k_config);
    sluice::quota::budget_limits left{};
    left[static_cast<size_t>(sluice::quota::budget_kind::daily_tokens)] = 1234;
    f.budgets.publish_key(5, 0, left);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-daily"), chat_body("chat-1"));
    r.run();
    CHECK(r.adapter.started == 1);
    CHECK(header_value(fields_of(f, r), "x-budget-remaining-daily-tokens") == "1234");
    r.served(10, 5);
    CHECK(f.budgets.key_tokens(5) == 15);
    // A key without budgets gets no budget field.
    request other(f, "POST", "/v1/chat/completions", bearer("sk-chat"), chat_body("chat-1"));
    other.run();
    CHECK(fields_of(f, other).find("x-budget-") == std::string::npos);
    other.end();
  }
}
