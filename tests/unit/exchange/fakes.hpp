#pragma once
// Test helpers: a policy and a client codec that only record what they are
// asked, so the exchange library's own code (answer_error, the dialect
// relay) is seen from both of its seams with no socket and no backend.
#include <sys/uio.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "client_codec.hpp"
#include "exchange.hpp"
#include "exchange_policy.hpp"
#include "sluice/metrics/registry.hpp"

namespace sluice::test {

// Records every call; answers nothing itself.
struct recording_policy final : proxy::exchange_policy {
  int request_ids = 0;
  int kept_responses = 0;
  int ended = 0;

  void open_request(proxy::exchange& x) noexcept override { x.request_open = true; }
  void make_request_id(proxy::exchange& x) noexcept override {
    ++request_ids;
    constexpr std::string_view id = "req-fixed";
    std::memcpy(x.request_id, id.data(), id.size());
    x.request_id_len = static_cast<uint8_t>(id.size());
  }
  bool accept_head(proxy::exchange&, bool) noexcept override { return true; }
  void dispatch(proxy::exchange&) noexcept override {}
  size_t write_response_headers(const proxy::exchange&, char*, size_t) noexcept override { return 0; }
  void cancel(proxy::exchange&) noexcept override {}
  void unpark(proxy::exchange&) noexcept override {}
  void end_request(proxy::exchange& x) noexcept override {
    ++ended;
    x.request_open = false;
  }
  proxy::backend_adapter* adapter() noexcept override { return nullptr; }
  void report_outcome(uint32_t, bool) noexcept override {}
  void fair_progress(proxy::exchange&) noexcept override {}
  void keep_route(proxy::exchange&, uint32_t, std::string_view) noexcept override {}
  void keep_response(proxy::exchange&) noexcept override { ++kept_responses; }
};

// One answer() as the codec was asked for it.
struct recorded_answer {
  uint16_t status = 0;
  std::string body;
  bool close = false;
  std::string extra_headers;
  std::string error_code;
};

// A client codec bound to a policy and a shard's counters (as every real
// codec is: answer_error needs both), which keeps what answer() is given.
struct recording_codec final : proxy::client_codec {
  recording_codec(proxy::exchange_policy& p, metrics::shard_metrics& m) noexcept : client_codec(p, m) {}

  std::string body;  // request_body(), with simdjson's padding after it
  size_t body_len = 0;
  std::vector<recorded_answer> answers;

  std::string_view request_body(const proxy::exchange&) const noexcept override { return {body.data(), body_len}; }
  std::string_view peer_ip(const proxy::exchange&) const noexcept override { return "127.0.0.1"; }
  void wait_for_quota(proxy::exchange&) noexcept override {}
  void wait_for_backend(proxy::exchange&, proxy::deadline_kind, uint64_t) noexcept override {}
  void answer(proxy::exchange& x, uint16_t status, std::string_view b, bool close, std::string_view extra,
              std::string_view error_code) noexcept override {
    answers.push_back({status, std::string(b), close, std::string(extra), std::string(error_code)});
    x.status = status;
    x.error_code = error_code;
  }
  void fail(proxy::exchange&) noexcept override {}
  bool takes_chunked(const proxy::exchange&) const noexcept override { return true; }
  bool stage_response_head(proxy::exchange&, const http::response_head&, bool) noexcept override { return true; }
  void stream_wait(proxy::exchange&, uint64_t) noexcept override {}
  void send_response(proxy::exchange&, bool, const iovec*, uint8_t, proxy::buffer_lender*, uint8_t) noexcept override {}
  void response_done(proxy::exchange&) noexcept override {}
  void lend_request_bytes(proxy::exchange&) noexcept override {}
  bool return_request_bytes(proxy::exchange&) noexcept override { return true; }
  void request_bytes_free(proxy::exchange&) noexcept override {}
};

// A shard's counters, a policy, a codec and an exchange bound to them.
struct exchange_fixture {
  metrics::registry registry{1, metrics::registry::names{}};
  recording_policy policy;
  recording_codec codec{policy, registry.shard(0)};
  proxy::exchange_memory mem;
  proxy::exchange x;

  exchange_fixture() {
    x.codec = &codec;
    x.mem = &mem;
  }
  uint64_t local_errors() { return registry.shard(0).at(metrics::stat::local_errors).get(); }
};

}  // namespace sluice::test
