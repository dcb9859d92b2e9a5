// A request parked on the [responses] store (docs/architecture.md §2b): the
// shard asks the control thread by a message and parks the exchange until
// the answer. The exchange lives in its client's connection, so the wait
// must be one the codec knows of: a client that leaves unparks it before
// the connection, and the exchange in it, go.
#include <doctest/doctest.h>

#include <memory>
#include <string_view>

#include "policy_fixture.hpp"

using namespace sluice::policy_test;

namespace {

constexpr std::string_view k_store_config = R"(
[audit]
path = ""

[responses]
store = "local"

[[group]]
name = "plain"
models = ["plain-*"]
backends = ["http://127.0.0.1:11"]

[[key]]
id = "a"
key = "sk-a"
)";

}  // namespace

TEST_SUITE("proxy::policy the [responses] store") {
  TEST_CASE("GET /v1/responses/{id} waits for the store parked at its codec; a client that leaves takes it out") {
    policy_fixture f(k_store_config);
    auto r = std::make_unique<request>(f, "GET", "/v1/responses/resp_1", bearer("sk-a"), "");
    r->run();
    proxy::store_op op;
    REQUIRE(f.store_ops.try_pop(op));
    std::unique_ptr<proxy::store_record> asked(op.record);
    CHECK(op.what == proxy::store_op::kind::get);
    CHECK(asked->id == "resp_1");
    CHECK(r->x.waiting == exchange::waiting_in::store);
    // The codec was told: its close unparks the exchange.
    CHECK(r->codec.parked);
    CHECK(r->codec.status == 0);
    r->client_gone();
    CHECK(r->x.waiting == exchange::waiting_in::none);
    r.reset();  // the connection, and the exchange it holds, go
    // The answer comes and finds no one (it must not reach the freed exchange).
    f.srv->on_store_answer(op.seq, asked.release());
  }

  TEST_CASE("a store answer for a waiting request ends its wait and answers it") {
    policy_fixture f(k_store_config);
    request r(f, "GET", "/v1/responses/resp_2", bearer("sk-a"), "");
    r.run();
    proxy::store_op op;
    REQUIRE(f.store_ops.try_pop(op));
    delete op.record;
    REQUIRE(r.codec.parked);
    f.srv->on_store_answer(op.seq, nullptr);  // not found
    CHECK(r.x.waiting == exchange::waiting_in::none);
    CHECK(r.codec.status == 404);
    r.end();
  }

  TEST_CASE("previous_response_id on a translated group waits for the conversation the same way") {
    policy_fixture f(k_store_config);
    auto r = std::make_unique<request>(
        f, "POST", "/v1/responses", bearer("sk-a"),
        R"({"model":"plain-1","input":"and then?","previous_response_id":"resp_3","max_output_tokens":5})");
    r->run();
    proxy::store_op op;
    REQUIRE(f.store_ops.try_pop(op));
    std::unique_ptr<proxy::store_record> asked(op.record);
    CHECK(asked->id == "resp_3");
    CHECK(r->codec.parked);
    CHECK(r->adapter.started == 0);
    r->client_gone();
    r.reset();
    f.srv->on_store_answer(op.seq, asked.release());
  }
}
