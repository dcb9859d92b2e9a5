// The exchange's policy between its two seams: a request made of a parsed
// head and a body, a fake client codec that records what it is asked to do,
// and a fake backend adapter that records the attempts. No socket, no
// backend: what is checked is which transition the policy takes (answered
// here, refused, admitted and sent on, parked, settled) and what it leaves
// in the exchange.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend_adapter.hpp"
#include "client_codec.hpp"
#include "exchange.hpp"
#include "shard_server.hpp"
#include "sluice/config/config.hpp"
#include "sluice/shard/reactor.hpp"

namespace proxy = sluice::proxy;
namespace cfg = sluice::config;
using proxy::exchange;

namespace {

constexpr std::string_view k_config = R"(
[quota]
max_tokens_cap = 4096
default_max_tokens = 100

[[group]]
name = "chat"
models = ["chat-*"]
backends = ["http://127.0.0.1:9"]
max_tokens_cap = 1000

[[group]]
name = "private"
models = ["private"]
backends = ["http://127.0.0.1:9"]

[[key]]
id = "big"
key = "sk-big"
groups = ["chat"]
daily_tokens = 1000

[[key]]
id = "small"
key = "sk-small"
tokens_per_minute = 50
groups = ["chat"]
)";

struct fake_codec final : proxy::client_codec {
  std::string body;  // the request body (with simdjson's padding after it)
  size_t body_len = 0;
  std::vector<std::string> calls;
  uint16_t status = 0;
  std::string answer_body;
  std::string code;
  int lent = 0;

  std::string_view request_body(const exchange&) const noexcept override { return {body.data(), body_len}; }
  std::string_view peer_ip(const exchange&) const noexcept override { return "127.0.0.1"; }
  void wait_for_quota(exchange&) noexcept override { calls.emplace_back("wait_for_quota"); }
  void wait_for_backend(exchange&, proxy::deadline_kind, uint64_t) noexcept override {
    calls.emplace_back("wait_for_backend");
  }
  void answer(exchange& x, uint16_t s, std::string_view b, bool, std::string_view,
              std::string_view error_code) noexcept override {
    calls.emplace_back("answer");
    status = s;
    answer_body = std::string(b);
    x.status = s;  // as a codec does: the audit reads it
    x.error_code = error_code;
  }
  void answer_error(exchange& x, uint16_t s, std::string_view message, std::string_view, std::string_view,
                    std::string_view c, bool, std::string_view) noexcept override {
    calls.emplace_back("answer_error");
    status = s;
    answer_body = std::string(message);
    code = std::string(c);
    x.status = s;
    x.error_code = c;  // as the codecs do
  }
  void fail(exchange&) noexcept override { calls.emplace_back("fail"); }
  void lend_request_bytes(exchange&) noexcept override { ++lent; }
  bool return_request_bytes(exchange&) noexcept override { return --lent >= 0; }
  void request_bytes_free(exchange&) noexcept override {}
  bool takes_chunked(const exchange&) const noexcept override { return true; }
  bool stage_response_head(exchange&, const sluice::http::response_head&, bool) noexcept override { return true; }
  void stream_wait(exchange&, uint64_t) noexcept override { calls.emplace_back("stream_wait"); }
  void send_response(exchange&, bool, const iovec*, uint8_t, proxy::buffer_lender*, uint8_t) noexcept override {
    calls.emplace_back("send_response");
  }
  void response_done(exchange&) noexcept override { calls.emplace_back("response_done"); }

  bool called(std::string_view what) const {
    for (const auto& c : calls) {
      if (c == what) return true;
    }
    return false;
  }
};

struct fake_adapter final : proxy::backend_adapter {
  int prepared = 0, started = 0, released = 0;
  bool prepare_ok = true;
  bool prepare(exchange& x, const sluice::openai::request_fields&) noexcept override {
    ++prepared;
    // An adapter that cannot build the request answers the client itself.
    if (!prepare_ok) x.codec->answer_error(x, 500, "Internal error.", "server_error", {}, {}, true);
    return prepare_ok;
  }
  void start(exchange&) noexcept override { ++started; }
  void release(exchange&) noexcept override { ++released; }
  void on_timeout(exchange&) noexcept override {}
  void on_sent(exchange&) noexcept override {}
};

// One shard's policy on a config, with nothing listening (listen fd -1:
// init() is not called, so no socket, no buffer ring).
struct policy_fixture {
  std::shared_ptr<const cfg::config> config = cfg::load(k_config, "exchange_test.toml", cfg::flags{});
  std::unique_ptr<sluice::shard::reactor> ring = sluice::shard::reactor::create({});
  sluice::metrics::registry metrics{1, names_of(*config)};
  std::unique_ptr<std::atomic<int64_t>[]> levels = std::make_unique<std::atomic<int64_t>[]>(config->keys.size() * 2);
  sluice::quota::budget_board budgets{1, static_cast<uint32_t>(config->keys.size()), static_cast<uint32_t>(config->groups.size())};
  proxy::shard_mesh mesh = mesh_of(*this);
  std::unique_ptr<proxy::shard_server> srv =
      std::make_unique<proxy::shard_server>(0, config, *ring, -1, -1, metrics.shard(0), mesh);

  static sluice::metrics::registry::names names_of(const cfg::config& c) {
    sluice::metrics::registry::names n;
    for (const auto& g : c.groups) n.groups.push_back(g.name);
    for (const auto& b : c.backends) n.backends.push_back(b.url);
    for (const auto& k : c.keys) n.keys.push_back(k.id);
    return n;
  }
  static proxy::shard_mesh mesh_of(policy_fixture& f) {
    proxy::shard_mesh m;
    m.count = 1;
    m.quota_levels = f.levels.get();
    m.quota_keys_max = static_cast<uint32_t>(f.config->keys.size());
    m.budgets = &f.budgets;
    return m;
  }
};

// A request on its way through the policy: its bytes, its exchange and the
// two fakes it is bound to.
struct request {
  std::string bytes;
  sluice::http::request_parser parser{sluice::http::limits{}};
  exchange x;
  fake_codec codec;
  fake_adapter adapter;
  proxy::exchange_memory mem;

  request(std::string_view method, std::string_view path, std::string_view key, std::string_view body) {
    bytes = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nhost: sluice\r\n";
    if (!key.empty()) bytes += "authorization: Bearer " + std::string(key) + "\r\n";
    bytes += "content-type: application/json\r\ncontent-length: " + std::to_string(body.size()) + "\r\n\r\n";
    codec.body = std::string(body) + std::string(64, '\0');
    codec.body_len = body.size();
    x.codec = &codec;
    x.adapter = &adapter;
    x.mem = &mem;
    const sluice::http::parse_status st = parser.parse_head(bytes.data(), bytes.size(), x.head);
    REQUIRE(st.ok());
    x.head_ok = true;
  }

  // What the codec does with a whole request: accounts it, checks its
  // head, hands it to the policy.
  void run(proxy::shard_server& srv) {
    srv.make_request_id(x);
    srv.open_request(x);
    if (srv.accept_head(x, codec.body_len != 0)) srv.dispatch(x);
  }
};

constexpr std::string_view k_chat = R"({"model":"chat-1","messages":[{"role":"user","content":"hello"}],"max_tokens":10})";

}  // namespace

TEST_CASE("a request the key may send is admitted against its quota and goes to the adapter") {
  policy_fixture f;
  request r("POST", "/v1/chat/completions", "sk-big", k_chat);
  r.run(*f.srv);
  CHECK(r.adapter.prepared == 1);
  CHECK(r.adapter.started == 1);
  CHECK(r.codec.called("wait_for_backend"));
  CHECK_FALSE(r.codec.called("answer_error"));
  CHECK(r.x.key_index == 0);
  CHECK(r.x.group == 0);
  CHECK(r.x.held.live);
  CHECK(r.x.reserved_output == 10);
  CHECK(r.x.quota_cost > 0);
  CHECK(r.x.request_open);
  // Ended before any answer from a backend: the reservation is refunded,
  // nothing is billed, the accounting is closed.
  f.srv->end_request(r.x);
  CHECK_FALSE(r.x.request_open);
  CHECK_FALSE(r.x.held.live);
  CHECK(r.x.quota_charged == 0);
}

TEST_CASE("requests refused before the body is read never reach the adapter") {
  policy_fixture f;
  SUBCASE("an unknown path: 404") {
    request r("POST", "/v1/nothing", "sk-big", k_chat);
    r.run(*f.srv);
    CHECK(r.codec.status == 404);
    CHECK(r.codec.code == "unknown_url");
    CHECK(r.adapter.prepared == 0);
  }
  SUBCASE("a known path with the wrong method: 405") {
    request r("GET", "/v1/chat/completions", "sk-big", "");
    r.run(*f.srv);
    CHECK(r.codec.status == 405);
    CHECK(r.adapter.prepared == 0);
  }
  SUBCASE("no key, or a wrong one: 401") {
    request none("POST", "/v1/chat/completions", "", k_chat);
    none.run(*f.srv);
    CHECK(none.codec.status == 401);
    CHECK(none.codec.code == "invalid_api_key");
    request wrong("POST", "/v1/chat/completions", "sk-wrong", k_chat);
    wrong.run(*f.srv);
    CHECK(wrong.codec.status == 401);
    CHECK(wrong.adapter.prepared == 0);
    CHECK(wrong.x.key_index < 0);
  }
}

TEST_CASE("requests refused from their body are answered without a reservation") {
  policy_fixture f;
  SUBCASE("invalid JSON: 400") {
    request r("POST", "/v1/chat/completions", "sk-big", R"({"model":"chat-1","messages":[)");
    r.run(*f.srv);
    CHECK(r.codec.status == 400);
    CHECK(r.adapter.prepared == 0);
  }
  SUBCASE("a model outside the key's groups reads as unknown: 404, model_not_found") {
    request r("POST", "/v1/chat/completions", "sk-big",
              R"({"model":"private","messages":[{"role":"user","content":"hi"}]})");
    r.run(*f.srv);
    CHECK(r.codec.status == 404);
    CHECK(r.codec.code == "model_not_found");
    CHECK(r.adapter.prepared == 0);
  }
  SUBCASE("max_tokens over the group's cap: 400 naming the field") {
    request r("POST", "/v1/chat/completions", "sk-big",
              R"({"model":"chat-1","messages":[{"role":"user","content":"hi"}],"max_tokens":1001})");
    r.run(*f.srv);
    CHECK(r.codec.status == 400);
    CHECK(r.codec.code == "invalid_value");
    CHECK(r.codec.answer_body.find("max_tokens") != std::string::npos);
    CHECK(r.adapter.prepared == 0);
  }
  SUBCASE("the adapter cannot build the backend's request: 500, nothing reserved") {
    request r("POST", "/v1/chat/completions", "sk-big", k_chat);
    r.adapter.prepare_ok = false;
    r.run(*f.srv);
    CHECK(r.codec.status == 500);
    CHECK(r.adapter.started == 0);
    CHECK_FALSE(r.x.held.live);
  }
}

TEST_CASE("a request over its key's tokens per minute gets 429 and no attempt") {
  policy_fixture f;
  // 10 output tokens x 2 + the prompt fits 50; 40 x 2 does not.
  request fits("POST", "/v1/chat/completions", "sk-small", k_chat);
  fits.run(*f.srv);
  CHECK(fits.adapter.started == 1);
  request big("POST", "/v1/chat/completions", "sk-small",
              R"({"model":"chat-1","messages":[{"role":"user","content":"hello"}],"max_tokens":40})");
  big.run(*f.srv);
  CHECK(big.codec.status == 429);
  CHECK(big.adapter.started == 0);
  CHECK(big.x.error_code == "rate_limit_exceeded");
  CHECK_FALSE(big.x.held.live);
  f.srv->end_request(fits.x);
  f.srv->end_request(big.x);
}

TEST_CASE("a key whose budget bit is set gets 429 insufficient_quota naming the budget, before any reservation") {
  policy_fixture f;
  sluice::quota::budget_limits left{};
  f.budgets.publish_key(0, 1u << static_cast<unsigned>(sluice::quota::budget_kind::daily_tokens), left);
  request r("POST", "/v1/chat/completions", "sk-big", k_chat);
  r.run(*f.srv);
  CHECK(r.codec.status == 429);
  CHECK(r.codec.code == "insufficient_quota");
  CHECK(r.adapter.started == 0);
  CHECK_FALSE(r.x.held.live);
  CHECK(r.codec.answer_body.starts_with("The daily token budget of key big (1000 tokens) is used up; it resets at "));
  CHECK(f.budgets.rejections(0, static_cast<size_t>(sluice::quota::budget_kind::daily_tokens)) == 1);
  f.srv->end_request(r.x);
  CHECK(f.budgets.key_tokens(0) == 0);  // refused: nothing used
}

TEST_CASE("a group's budget bit refuses every key of the group; the key's own bits stay clear") {
  policy_fixture f;
  f.budgets.publish_group(0, 1u << static_cast<unsigned>(sluice::quota::budget_kind::monthly_tokens), {});
  request r("POST", "/v1/chat/completions", "sk-small", k_chat);
  r.run(*f.srv);
  CHECK(r.codec.status == 429);
  CHECK(r.codec.code == "insufficient_quota");
  CHECK(r.codec.answer_body.starts_with("The monthly token budget of group chat"));
  CHECK(f.budgets.rejections(1, sluice::quota::budget_kind_count + 1) == 1);
  f.srv->end_request(r.x);
}

TEST_CASE("GET /v1/models is answered by the policy itself, from the key's groups") {
  policy_fixture f;
  request r("GET", "/v1/models", "sk-big", "");
  r.run(*f.srv);
  CHECK(r.codec.status == 200);
  CHECK(r.adapter.prepared == 0);
  CHECK(r.codec.answer_body.find("\"chat\"") != std::string::npos);
  CHECK(r.codec.answer_body.find("private") == std::string::npos);
}

TEST_CASE("a cancelled exchange is audited as the client's close") {
  policy_fixture f;
  request r("POST", "/v1/chat/completions", "sk-big", k_chat);
  r.run(*f.srv);
  REQUIRE(r.adapter.started == 1);
  f.srv->cancel(r.x);
  CHECK(r.x.cancelled);
  CHECK(r.x.status == 499);
  CHECK(r.x.error_code == "client_closed");
  f.srv->end_request(r.x);
  CHECK_FALSE(r.x.held.live);
}
