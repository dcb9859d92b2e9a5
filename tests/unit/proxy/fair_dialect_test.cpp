// Fair admission as the policy runs it (docs/architecture.md §2c): a group's
// slots, its queue, releases in the turn after a slot frees, by priority and
// then by the keys' virtual counters, timeouts and clients that leave; then
// the dialects as the policy reads them (§2b: translated, native, refused in
// the client's shape) and the accounting of an exchange's end.
#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "policy_fixture.hpp"

using namespace sluice::policy_test;
using sluice::dialect::client_dialect;

namespace {

// Backend 0 serves only the fair group: one slot in all. The fixture's
// shard 0 of two owns it (cap / shards, plus one for shard 0 < cap % shards).
constexpr std::string_view k_config = R"(
[audit]
path = ""

[quota]
default_max_tokens = 100

[[group]]
name = "fair"
models = ["fair-*"]
backends = ["http://127.0.0.1:9"]
admission = "fair"
max_inflight_per_backend = 1
queue_timeout_ms = 1000
queue_max = 3

[[group]]
name = "native"
models = ["native-*"]
backends = ["http://127.0.0.1:10"]
native_dialects = ["chat", "messages"]

[[group]]
name = "plain"
models = ["plain-*"]
backends = ["http://127.0.0.1:11"]

[[key]]
id = "a"
key = "sk-a"

[[key]]
id = "b"
key = "sk-b"

[[key]]
id = "heavy"
key = "sk-heavy"
weight = 4.0

[[key]]
id = "vip"
key = "sk-vip"
priority = 5
)";

constexpr uint32_t k_fair = 0, k_native = 1, k_plain = 2;
constexpr uint32_t k_key_a = 0;

constexpr std::string_view k_fair_chat = R"({"model":"fair-1","messages":[{"role":"user","content":"hello"}]})";

// Two shards (the peer is the fake backend's bookings), the loop's turn live.
struct fair_fixture : policy_fixture {
  fair_fixture() : policy_fixture(k_config, 2, true) { backend.book_slots = true; }
};

struct fair_request : request {
  fair_request(policy_fixture& fx, std::string_view key, std::string_view name)
      : request(fx, "POST", "/v1/chat/completions", bearer(key), k_fair_chat, name) {}
  bool queued() const { return codec.parked && x.waiting == sluice::proxy::exchange::waiting_in::fair; }
};

using names = std::vector<std::string>;

}  // namespace

TEST_SUITE("proxy::policy fair admission") {
  TEST_CASE("beyond the slots a request queues, told to wait; it starts in the turn after the slot frees") {
    fair_fixture f;
    fair_request a(f, "sk-a", "a");
    a.run();
    CHECK(a.adapter.started == 1);
    CHECK_FALSE(a.codec.parked);
    fair_request b(f, "sk-a", "b");
    b.run();
    CHECK(b.queued());
    CHECK(b.codec.last_call() == "wait_for_quota");
    CHECK(b.adapter.prepared == 1);  // built before it waits: its fields are gone after
    CHECK(b.adapter.started == 0);
    CHECK(b.x.adm.queued_since_ms == f.now_ms());
    CHECK(f.metrics.queue_depth(k_fair) == 1);
    const uint64_t t0 = f.now_ms();
    f.turn(t0 + 1);
    CHECK(b.queued());  // the slot is still taken
    a.served(5, 5);
    CHECK(b.queued());  // the release waits for the loop's turn
    f.turn(t0 + 7);
    CHECK(b.adapter.started == 1);
    CHECK_FALSE(b.codec.parked);
    CHECK(b.codec.last_call() == "wait_for_backend");
    CHECK(b.x.adm.queued_ms == 7);
    CHECK(f.metrics.queue_depth(k_fair) == 0);
    uint64_t usage[sluice::metrics::registry::key_usage_width] = {};
    f.metrics.key_usage(k_key_a, usage);
    CHECK(usage[3] == 1);  // sluice_key_queued_total
    CHECK(usage[4] == 7);  // ... and the milliseconds it waited
    b.served(5, 5);
    CHECK(f.backend.started == names{"a", "b"});
  }

  TEST_CASE("a free slot with nobody queued is taken at once, without a wait") {
    fair_fixture f;
    fair_request a(f, "sk-a", "a");
    a.run();
    CHECK(a.adapter.started == 1);
    CHECK_FALSE(a.codec.called("wait_for_quota"));
    CHECK(a.x.adm.queued_since_ms == 0);
    a.served(1, 1);
    fair_request b(f, "sk-b", "b");
    b.run();
    CHECK(b.adapter.started == 1);
    b.end();
  }

  TEST_CASE("a higher priority goes first, whatever the order of arrival") {
    fair_fixture f;
    fair_request running(f, "sk-a", "running");
    running.run();
    fair_request low(f, "sk-b", "low");
    low.run();
    fair_request vip(f, "sk-vip", "vip");
    vip.run();
    REQUIRE(low.queued());
    REQUIRE(vip.queued());
    running.served(1, 1);
    f.turn(f.now_ms() + 1);
    CHECK(f.backend.started == names{"running", "vip"});
    CHECK(low.queued());
    vip.served(1, 1);
    f.turn(f.now_ms() + 2);
    CHECK(f.backend.started == names{"running", "vip", "low"});
    low.end();
  }

  TEST_CASE("within a level the key served least goes first, its service divided by its weight") {
    fair_fixture f;
    // A request of key a runs; a second one of a waits, then one of
    // `other`, which enters at a's counter (idleness is not banked).
    fair_request first(f, "sk-a", "a1");
    first.run();
    fair_request a2(f, "sk-a", "a2");
    a2.run();
    std::string other_key;
    bool other_first = false;
    SUBCASE("weight 4: a quarter of the same service, so its next request passes a's") {
      other_key = "sk-heavy";
      other_first = true;
    }
    SUBCASE("weight 1: the same service, so a's older waiter goes first") {
      other_key = "sk-b";
      other_first = false;
    }
    fair_request o1(f, other_key, "o1");
    o1.run();
    REQUIRE(a2.queued());
    REQUIRE(o1.queued());
    // a's real usage (10 + 100 x 2) lifts its counter past the other key's.
    first.served(10, 100);
    f.turn(f.now_ms() + 1);
    REQUIRE(f.backend.started == names{"a1", "o1"});
    fair_request o2(f, other_key, "o2");
    o2.run();
    REQUIRE(o2.queued());
    o1.served(10, 100);
    f.turn(f.now_ms() + 2);
    CHECK(f.backend.started == names{"a1", "o1", other_first ? "o2" : "a2"});
    fair_request& ran = other_first ? o2 : a2;
    fair_request& waits = other_first ? a2 : o2;
    CHECK(waits.queued());
    ran.served(1, 1);
    f.turn(f.now_ms() + 3);
    CHECK(waits.adapter.started == 1);
    waits.end();
  }

  TEST_CASE("a waiter past queue_timeout_ms is 429 queue_timeout with retry-after, refunded, never started") {
    fair_fixture f;
    fair_request a(f, "sk-a", "a");
    a.run();
    fair_request b(f, "sk-b", "b");
    b.run();
    REQUIRE(b.queued());
    REQUIRE(b.x.held.live);
    const uint64_t t0 = f.now_ms();
    f.turn(t0 + 999);
    CHECK(b.queued());
    CHECK(b.codec.answers == 0);
    f.turn(t0 + 1000);
    CHECK_FALSE(b.codec.parked);
    CHECK(b.x.waiting == sluice::proxy::exchange::waiting_in::none);
    CHECK(b.codec.status == 429);
    CHECK(b.codec.code == "queue_timeout");
    CHECK(b.codec.type == "requests");
    CHECK(b.codec.message ==
          "The model group fair is saturated: this request waited 1000 ms for a slot (queue_timeout_ms). "
          "Please try again.");
    CHECK(b.codec.extra_headers == "retry-after: 1\r\nretry-after-ms: 1000\r\n");
    CHECK(b.x.adm.queued_ms == 1000);
    CHECK(f.metrics.queue_depth(k_fair) == 0);
    b.end();
    CHECK_FALSE(b.x.held.live);
    CHECK(b.x.quota_charged == 0);
    CHECK(f.answers(k_fair, 429) == 1);
    a.served(1, 1);
    f.turn(t0 + 1001);
    CHECK(b.adapter.started == 0);
    CHECK(f.backend.started == names{"a"});
  }

  TEST_CASE("past queue_max a request is 429 queue_full at once, never queued") {
    fair_fixture f;
    fair_request a(f, "sk-a", "a");
    a.run();
    fair_request q1(f, "sk-b", "q1"), q2(f, "sk-b", "q2"), q3(f, "sk-b", "q3");
    q1.run();
    q2.run();
    q3.run();
    CHECK(f.metrics.queue_depth(k_fair) == 3);
    fair_request over(f, "sk-b", "over");
    over.run();
    CHECK(over.codec.status == 429);
    CHECK(over.codec.code == "queue_full");
    CHECK(over.codec.message ==
          "The model group fair is saturated and its queue is full (3 requests waiting). Please try again.");
    CHECK(over.codec.has_header("retry-after: 1\r\n"));
    CHECK_FALSE(over.codec.called("wait_for_quota"));
    CHECK(f.metrics.queue_depth(k_fair) == 3);
    over.end();
    for (fair_request* r : {&q1, &q2, &q3}) r->client_gone();
    a.end();
  }

  TEST_CASE("a queued request whose client leaves is dropped at once, audited 499, and the next one gets the slot") {
    fair_fixture f;
    fair_request a(f, "sk-a", "a");
    a.run();
    fair_request gone(f, "sk-b", "gone");
    gone.run();
    fair_request next(f, "sk-b", "next");
    next.run();
    REQUIRE(f.metrics.queue_depth(k_fair) == 2);
    gone.client_gone();
    CHECK(gone.x.cancelled);
    CHECK(gone.x.status == 499);
    CHECK(gone.x.error_code == "client_closed");
    CHECK(gone.x.waiting == sluice::proxy::exchange::waiting_in::none);
    CHECK_FALSE(gone.x.held.live);
    CHECK(f.metrics.queue_depth(k_fair) == 1);
    CHECK(f.answers(k_fair, 499) == 1);
    CHECK(f.metrics.sum(sluice::metrics::stat::downstream_aborts) == 1);
    a.served(1, 1);
    f.turn(f.now_ms() + 1);
    CHECK(f.backend.started == names{"a", "next"});
    CHECK(gone.adapter.started == 0);
    next.end();
  }
}

TEST_SUITE("proxy::policy dialects") {
  TEST_CASE("a Messages request without max_tokens is 400 in Anthropic's shape, nothing built") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/messages", api_key("sk-a"),
              R"({"model":"plain-1","messages":[{"role":"user","content":"hi"}]})");
    r.run();
    CHECK(r.codec.status == 400);
    CHECK(r.codec.param == "max_tokens");
    CHECK(r.codec.body ==
          R"({"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}})");
    CHECK(r.adapter.prepared == 0);
    r.end();
  }

  TEST_CASE("a Messages request to a translated group goes on as the canonical chat body") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/messages", api_key("sk-a"),
              R"({"model":"plain-1","max_tokens":20,"messages":[{"role":"user","content":"hi"}]})");
    r.run();
    CHECK(r.x.group == k_plain);
    CHECK_FALSE(r.x.req.native);
    CHECK(r.x.req.speaks == client_dialect::messages);
    CHECK(r.x.req.body.find(R"("messages")") != std::string_view::npos);
    CHECK(r.x.reserved_output == 20);
    CHECK(r.adapter.started == 1);
    r.served(4, 4);
    CHECK(f.dialect_requests(client_dialect::messages) == 1);
    CHECK(f.answers(k_plain, 200) == 1);
    // A second end (the codec's close after the answer) counts nothing again.
    f.srv->end_request(r.x);
    CHECK(f.dialect_requests(client_dialect::messages) == 1);
    CHECK(f.answers(k_plain, 200) == 1);
  }

  TEST_CASE("a group with the client's dialect in native_dialects passes its bytes, the model token marked") {
    policy_fixture f(k_config);
    const std::string_view body = R"({"model":"native-1","max_tokens":20,"messages":[{"role":"user","content":"hi"}]})";
    request r(f, "POST", "/v1/messages", api_key("sk-a"), body);
    r.run();
    CHECK(r.x.group == k_native);
    CHECK(r.x.req.native);
    CHECK(body.substr(r.x.req.native_model_begin, r.x.req.native_model_end - r.x.req.native_model_begin)
              .find("native-1") != std::string_view::npos);
    CHECK(r.adapter.started == 1);
    r.end();
  }

  TEST_CASE("a native body with a repeated top-level member is refused: 400 in the client's shape") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/messages", api_key("sk-a"),
              R"({"model":"native-1","max_tokens":20,"messages":[{"role":"user","content":"hi"}],"model":"x"})");
    r.run();
    CHECK(r.codec.status == 400);
    CHECK(r.codec.body ==
          R"({"type":"error","error":{"type":"invalid_request_error","message":"A top-level member is given twice."}})");
    CHECK(r.adapter.prepared == 0);
    CHECK_FALSE(r.x.req.native);
    r.end();
  }

  TEST_CASE("POST /v1/messages/count_tokens is answered from the admission estimate") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/messages/count_tokens", api_key("sk-a"),
              R"({"model":"native-1","messages":[{"role":"user","content":"hello there"}]})");
    r.run();
    CHECK(r.codec.status == 200);
    CHECK(r.codec.body == "{\"input_tokens\":" + std::to_string(r.x.input_estimate) + "}");
    CHECK(r.x.input_estimate > 0);
    CHECK(r.adapter.prepared == 0);
    CHECK_FALSE(r.x.held.live);
    r.end();
  }

  TEST_CASE("previous_response_id on a translated group with no store is 400 naming [responses] store") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/responses", bearer("sk-a"),
              R"({"model":"plain-1","input":"hi","previous_response_id":"resp_abc"})");
    r.run();
    CHECK(r.codec.status == 400);
    CHECK(r.codec.param == "previous_response_id");
    CHECK(r.codec.code == "unsupported_parameter");
    CHECK(r.codec.message.find("[responses] store") != std::string::npos);
    CHECK(r.codec.body.starts_with(R"({"error":)"));  // OpenAI's shape on /v1/responses
    CHECK(r.adapter.prepared == 0);
    r.end();
    CHECK(f.dialect_requests(client_dialect::responses) == 1);
  }

  TEST_CASE("a Responses request without a continuation is translated and sent") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/responses", bearer("sk-a"), R"({"model":"plain-1","input":"hi","max_output_tokens":9})");
    r.run();
    CHECK(r.x.req.speaks == client_dialect::responses);
    CHECK_FALSE(r.x.req.continues);
    CHECK_FALSE(r.x.req.store_put);  // no store to keep it in
    CHECK(r.x.reserved_output == 9);
    CHECK(r.adapter.started == 1);
    r.end();
  }

  TEST_CASE("GET /v1/responses/{id} with no store is 404 before anything is read, after the key check") {
    policy_fixture f(k_config);
    request r(f, "GET", "/v1/responses/resp_1", bearer("sk-a"), "");
    r.run();
    CHECK(r.codec.status == 404);
    CHECK(r.codec.code == "not_found");
    r.end();
    // Without a key, or with a wrong one, nothing of the set-up is told:
    // a 401, as any request's.
    for (const std::string& key : {std::string(), bearer("sk-wrong")}) {
      for (const char* method : {"GET", "DELETE"}) {
        request anon(f, method, "/v1/responses/resp_1", key, "");
        anon.run();
        CHECK(anon.codec.status == 401);
        CHECK(anon.codec.code == "invalid_api_key");
        anon.end();
      }
    }
  }
}

TEST_SUITE("proxy::policy accounting") {
  TEST_CASE("a cancelled exchange is counted and audited as 499 once, its reservation refunded") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/chat/completions", bearer("sk-a"),
              R"({"model":"plain-1","messages":[{"role":"user","content":"hi"}],"max_tokens":5})");
    r.run();
    REQUIRE(r.adapter.started == 1);
    REQUIRE(r.x.held.live);
    r.client_gone();
    CHECK(r.x.status == 499);
    CHECK(r.x.cancelled);
    CHECK(r.x.error_code == "client_closed");
    CHECK_FALSE(r.x.request_open);
    CHECK_FALSE(r.x.held.live);
    CHECK(r.x.quota_charged == 0);
    CHECK(r.adapter.released == 1);
    CHECK(f.answers(k_plain, 499) == 1);
    CHECK(f.dialect_requests(client_dialect::chat) == 1);
    f.srv->end_request(r.x);
    CHECK(f.answers(k_plain, 499) == 1);
    CHECK(f.metrics.inflight() == 0);
  }

  TEST_CASE("a served exchange counts its tokens by group and key") {
    policy_fixture f(k_config);
    request r(f, "POST", "/v1/completions", bearer("sk-b"), R"({"model":"plain-1","prompt":"hi","max_tokens":5})");
    r.run();
    REQUIRE(r.adapter.started == 1);
    r.served(3, 4);
    CHECK(f.dialect_requests(client_dialect::completions) == 1);
    uint64_t usage[sluice::metrics::registry::key_usage_width] = {};
    f.metrics.key_usage(1, usage);
    CHECK(usage[0] == 1);
    CHECK(usage[1] == 3);
    CHECK(usage[2] == 4);
    std::vector<uint64_t> totals(sluice::metrics::totals_width, 0);
    f.metrics.add_group_totals(k_plain, totals.data());
    CHECK(totals[sluice::metrics::totals_tokens] + totals[sluice::metrics::totals_tokens + 1] == 7);
  }
}
