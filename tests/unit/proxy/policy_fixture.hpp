#pragma once
// Test helper for tests/unit/proxy: the real policy (shard_server) on a TOML
// config, between a fake client codec that records what it is told and a
// fake backend adapter that records what it is asked. The codec answers as
// the real ones do (client_codec::answer_error's OpenAI body, reshaped for a
// Messages client by in_client_dialect, then the policy's response fields),
// so a test reads the status, body and header lines a client would get.
//
// Time is the reactor's clock, which only moves when the loop turns: a test
// that needs a deadline passes a later reading to turn(), as the loop's hook
// would (shard_main.cpp), and nothing ever sleeps.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend_adapter.hpp"
#include "client_codec.hpp"
#include "dialect_relay.hpp"
#include "exchange.hpp"
#include "shard_server.hpp"
#include "sluice/config/config.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/net/socket.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::policy_test {

namespace proxy = sluice::proxy;
namespace cfg = sluice::config;
using proxy::exchange;

// Records every call and the last answer. One per request (an HTTP/1.1
// connection carries one exchange at a time).
struct fake_codec final : proxy::client_codec {
  fake_codec(proxy::shard_server& server, metrics::shard_metrics& m) : client_codec(server, m), srv(&server) {}

  proxy::shard_server* srv;
  std::string request;  // the body, with simdjson's padding after it
  size_t request_len = 0;
  std::vector<std::string> calls;
  bool parked = false;  // told to wait for quota (or a slot) and not told to go on since
  int answers = 0;
  uint16_t status = 0;
  std::string body;            // as the client gets it
  std::string extra_headers;   // the caller's (retry-after, x-should-retry)
  std::string sluice_headers;  // the policy's own (x-ratelimit-*, x-budget-*, x-sluice-group)
  std::string message, type, param, code;  // answer_error's fields
  int lent = 0;

  std::string_view request_body(const exchange&) const noexcept override { return {request.data(), request_len}; }
  std::string_view peer_ip(const exchange&) const noexcept override { return "127.0.0.1"; }
  void wait_for_quota(exchange&) noexcept override {
    calls.emplace_back("wait_for_quota");
    parked = true;
  }
  void wait_for_backend(exchange&, proxy::deadline_kind, uint64_t) noexcept override {
    calls.emplace_back("wait_for_backend");
    parked = false;
  }
  void answer(exchange& x, uint16_t s, std::string_view b, bool, std::string_view extra,
              std::string_view error_code) noexcept override {
    calls.emplace_back("answer");
    ++answers;
    char reshaped[1024];
    b = proxy::in_client_dialect(x, s, b, reshaped, sizeof reshaped);
    status = s;
    body.assign(b);
    extra_headers.assign(extra);
    char fields[2048];
    sluice_headers.assign(fields, srv->write_response_headers(x, fields, sizeof fields));
    x.status = s;  // as the codecs do: the audit and the metrics read them
    x.error_code = error_code;
  }
  void answer_error(exchange& x, uint16_t s, std::string_view m, std::string_view t, std::string_view p,
                    std::string_view c, bool close, std::string_view extra) noexcept override {
    message.assign(m);
    type.assign(t);
    param.assign(p);
    code.assign(c);
    client_codec::answer_error(x, s, m, t, p, c, close, extra);
  }
  void fail(exchange&) noexcept override { calls.emplace_back("fail"); }
  void lend_request_bytes(exchange&) noexcept override { ++lent; }
  bool return_request_bytes(exchange&) noexcept override { return --lent >= 0; }
  void request_bytes_free(exchange&) noexcept override {}
  bool takes_chunked(const exchange&) const noexcept override { return true; }
  bool stage_response_head(exchange&, const http::response_head&, bool) noexcept override { return true; }
  void stream_wait(exchange&, uint64_t) noexcept override {}
  void send_response(exchange&, bool, const iovec*, uint8_t, proxy::buffer_lender*, uint8_t) noexcept override {}
  void response_done(exchange&) noexcept override {}

  bool called(std::string_view what) const {
    for (const auto& c : calls) {
      if (c == what) return true;
    }
    return false;
  }
  std::string last_call() const { return calls.empty() ? std::string() : calls.back(); }
  bool has_header(std::string_view line) const {
    return extra_headers.find(line) != std::string::npos || sluice_headers.find(line) != std::string::npos;
  }
};

// What the backends of a test run, shared by its requests' adapters: the
// order attempts started in and how many are running. With `book_slots`
// each running attempt is booked as load on backend 0 reported by peer
// shard 1: the route table counts fair admission's slots from the shard's
// own starts plus its peers' reports, and a fake adapter has only the
// second to reach (the shard's table is its own).
struct fake_backend {
  proxy::shard_server* srv = nullptr;
  bool book_slots = false;
  std::vector<std::string> started;
  uint32_t running = 0;

  void book() {
    if (!book_slots) return;
    route::message m;
    m.kind = route::message_kind::load_report;
    m.shard = 1;
    m.backend = 0;
    m.value = running;
    srv->apply_route(m);
  }
};

struct fake_adapter final : proxy::backend_adapter {
  fake_backend* backend = nullptr;
  std::string name;
  int prepared = 0, started = 0, released = 0;
  bool running = false;

  bool prepare(exchange&, const openai::request_fields&) noexcept override {
    ++prepared;
    return true;
  }
  void start(exchange&) noexcept override {
    ++started;
    running = true;
    backend->started.push_back(name);
    ++backend->running;
    backend->book();
  }
  void release(exchange&) noexcept override {
    ++released;
    finish();
  }
  void on_timeout(exchange&) noexcept override {}
  void on_sent(exchange&) noexcept override {}
  // The attempt ends: its slot comes back.
  void finish() {
    if (!running) return;
    running = false;
    --backend->running;
    backend->book();
  }
};

inline metrics::registry::names names_of(const cfg::config& c) {
  metrics::registry::names n;
  for (const auto& g : c.groups) n.groups.push_back(g.name);
  for (const auto& b : c.backends) n.backends.push_back(b.url);
  for (const auto& k : c.keys) n.keys.push_back(k.id);
  return n;
}

// One shard's policy (shard 0 of `shards`) on a config. `live`: init() on a
// listener nobody connects to, so the loop's turn (on_iteration) can run;
// otherwise nothing is set up past the policy (no socket, no buffer ring).
struct policy_fixture {
  std::shared_ptr<const cfg::config> config;
  std::unique_ptr<shard::reactor> ring = shard::reactor::create({});
  uint32_t shards;
  metrics::registry metrics;
  std::unique_ptr<std::atomic<int64_t>[]> levels;
  quota::budget_board budgets;
  std::vector<std::unique_ptr<proxy::mesh_queue>> queues;
  std::vector<proxy::mesh_queue*> queue_of;
  std::unique_ptr<std::atomic<shard::reactor*>[]> reactors;
  proxy::shard_mesh mesh;
  proxy::store_queue store_ops;  // what the shard asks the [responses] store (the control thread's side)
  fake_backend backend;
  std::unique_ptr<proxy::shard_server> srv;

  explicit policy_fixture(std::string_view toml, uint32_t shard_count = 1, bool live = false)
      : config(cfg::load(toml, "policy_test.toml", cfg::flags{})),
        shards(shard_count),
        metrics(shard_count, names_of(*config)),
        levels(std::make_unique<std::atomic<int64_t>[]>(config->keys.size() * 2 * shard_count)),
        budgets(shard_count, static_cast<uint32_t>(config->keys.size()), static_cast<uint32_t>(config->groups.size())),
        reactors(std::make_unique<std::atomic<shard::reactor*>[]>(shard_count)) {
    REQUIRE(ring != nullptr);
    for (uint32_t from = 0; from < shard_count; ++from) {
      for (uint32_t to = 0; to < shard_count; ++to) {
        queues.push_back(from == to ? nullptr : std::make_unique<proxy::mesh_queue>());
        queue_of.push_back(queues.back().get());
      }
    }
    for (uint32_t s = 0; s < shard_count; ++s) reactors[s].store(nullptr);
    mesh.count = shard_count;
    mesh.queues = queue_of.data();
    mesh.reactors = reactors.get();
    mesh.quota_levels = levels.get();
    mesh.quota_keys_max = static_cast<uint32_t>(config->keys.size());
    mesh.budgets = &budgets;
    mesh.to_store = &store_ops;
    int listen_fd = -1;
    if (live) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      listen_fd = net::listen_socket(reinterpret_cast<const sockaddr*>(&a), sizeof a, false);
      REQUIRE(listen_fd >= 0);
    }
    srv = std::make_unique<proxy::shard_server>(0, config, *ring, listen_fd, -1, metrics.shard(0), mesh);
    if (live) REQUIRE(srv->init());
    backend.srv = srv.get();
  }

  uint64_t now_ms() const { return ring->now_ms(); }
  // One loop turn with the clock at `at_ms`: the peers' messages, then the
  // turn's work (quota waiters, fair admission's releases and timeouts).
  void turn(uint64_t at_ms) {
    srv->before_completions(at_ms);
    srv->on_iteration(at_ms);
  }

  // Answers counted for `group` (groups.size(): none) with `status`.
  uint64_t answers(size_t group, uint16_t status) const {
    std::vector<uint64_t> out(metrics::totals_width, 0);
    metrics.add_group_totals(group, out.data());
    return out[metrics::totals_codes + metrics::status_index(status)];
  }
  uint64_t no_group() const { return config->groups.size(); }
  uint64_t dialect_requests(dialect::client_dialect d) const {
    uint64_t out[metrics::dialect_count] = {};
    metrics.dialect_requests(out);
    return out[static_cast<size_t>(d)];
  }
  // A sample of the Prometheus text, by its name and labels; -1 if absent.
  int64_t sample(std::string_view series) const {
    std::string text;
    metrics.render(text);
    const std::string head = std::string(series) + " ";
    const size_t at = text.find("\n" + head);
    if (at == std::string::npos) return -1;
    return std::stoll(text.substr(at + 1 + head.size()));
  }
};

inline std::string bearer(std::string_view key) { return "authorization: Bearer " + std::string(key) + "\r\n"; }
inline std::string api_key(std::string_view key) { return "x-api-key: " + std::string(key) + "\r\n"; }

// A request on its way through the policy: its bytes, its exchange and the
// two fakes it is bound to.
struct request {
  policy_fixture& f;
  std::string bytes;
  http::request_parser parser{http::limits{}};
  exchange x;
  fake_codec codec;
  fake_adapter adapter;
  proxy::exchange_memory mem;

  request(policy_fixture& fx, std::string_view method, std::string_view path, std::string_view headers,
          std::string_view body, std::string_view name = "")
      : f(fx), codec(*fx.srv, fx.metrics.shard(0)) {
    bytes = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nhost: sluice\r\n" + std::string(headers);
    bytes += "content-type: application/json\r\ncontent-length: " + std::to_string(body.size()) + "\r\n\r\n";
    codec.request = std::string(body) + std::string(64, '\0');
    codec.request_len = body.size();
    adapter.backend = &fx.backend;
    adapter.name = std::string(name);
    x.codec = &codec;
    x.adapter = &adapter;
    x.mem = &mem;
    const http::parse_status st = parser.parse_head(bytes.data(), bytes.size(), x.head);
    REQUIRE(st.ok());
    x.head_ok = true;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;

  // What a codec does with a whole request: accounts it, checks its head,
  // hands it to the policy.
  void run() {
    f.srv->make_request_id(x);
    f.srv->open_request(x);
    if (f.srv->accept_head(x, codec.request_len != 0)) f.srv->dispatch(x);
  }
  // The backend answered 200 with this usage, as a stream whose usage
  // chunk the relay read; then the codec ends the exchange.
  void served(int64_t prompt_tokens, int64_t completion_tokens) {
    x.rsp.head_seen = true;
    x.rsp.head.status = 200;
    x.rsp.head.event_stream = true;
    x.rsp.complete = true;
    x.rsp.facts.prompt_tokens = prompt_tokens;
    x.rsp.facts.completion_tokens = completion_tokens;
    x.status = 200;
    adapter.finish();
    f.srv->end_request(x);
  }
  // The answer went out (or the request was refused): the codec ends it.
  void end() {
    adapter.finish();
    f.srv->end_request(x);
  }
  // The client closed its connection, as h1_codec::on_peer_gone does it.
  void client_gone() {
    f.srv->cancel(x);
    if (codec.parked || x.waiting != exchange::waiting_in::none) f.srv->unpark(x);
    codec.parked = false;
    if (x.request_open) f.srv->end_request(x);
    adapter.release(x);
  }
};

}  // namespace sluice::policy_test
