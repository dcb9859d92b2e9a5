#include <doctest/doctest.h>

#include "sluice/route/health.hpp"

using namespace sluice::route;

namespace {
sluice::config::health_config params() {
  sluice::config::health_config h;
  h.rise = 2;
  h.fall = 3;
  h.eject_after = 2;
  h.backoff_ms = 1000;
  h.backoff_max_ms = 3000;
  return h;
}
}  // namespace

TEST_SUITE("route::backend_health") {
  TEST_CASE("fall probe failures take it down and rise successes bring it back") {
    backend_health h(params());
    CHECK(h.takes_requests());
    CHECK(h.on_probe(false, 0) == health_event::none);
    CHECK(h.on_probe(false, 1) == health_event::none);
    CHECK(h.on_probe(true, 2) == health_event::none);  // a success resets the count
    CHECK(h.on_probe(false, 3) == health_event::none);
    CHECK(h.on_probe(false, 4) == health_event::none);
    CHECK(h.on_probe(false, 5) == health_event::became_down);
    CHECK(h.state() == health_state::down);
    CHECK_FALSE(h.takes_requests());
    CHECK(h.on_probe(true, 6) == health_event::none);
    CHECK(h.on_probe(false, 7) == health_event::none);
    CHECK(h.on_probe(true, 8) == health_event::none);
    CHECK(h.on_probe(true, 9) == health_event::became_up);
    CHECK(h.takes_requests());
  }

  TEST_CASE("consecutive request failures eject, and a probe after the backoff re-admits") {
    backend_health h(params());
    CHECK(h.on_request(true, 100) == health_event::none);
    CHECK(h.on_request(false, 101) == health_event::none);  // not consecutive
    CHECK(h.on_request(true, 102) == health_event::none);
    CHECK(h.on_request(true, 103) == health_event::ejected);
    CHECK(h.state() == health_state::ejected);
    CHECK(h.ejected_until_ms() == 1103);
    CHECK(h.on_probe(true, 1102) == health_event::none);  // backoff not over
    CHECK(h.on_probe(true, 1103) == health_event::readmitted);
    CHECK(h.takes_requests());
    CHECK(h.on_probation());
  }

  TEST_CASE("a failure on probation ejects again with the backoff doubled up to the maximum") {
    backend_health h(params());
    h.on_request(true, 0);
    REQUIRE(h.on_request(true, 0) == health_event::ejected);
    REQUIRE(h.on_probe(true, 1000) == health_event::readmitted);
    CHECK(h.on_request(true, 1001) == health_event::ejected);
    CHECK(h.backoff_ms() == 2000);
    CHECK(h.ejected_until_ms() == 3001);
    REQUIRE(h.on_probe(true, 3001) == health_event::readmitted);
    CHECK(h.on_request(true, 3002) == health_event::ejected);
    CHECK(h.backoff_ms() == 3000);  // capped
    REQUIRE(h.on_probe(true, 6002) == health_event::readmitted);
    CHECK(h.on_request(false, 6003) == health_event::none);
    CHECK_FALSE(h.on_probation());
    CHECK(h.backoff_ms() == 1000);  // a success resets it
  }

  TEST_CASE("without active probes tick re-admits after the backoff") {
    auto p = params();
    p.interval_ms = 0;
    backend_health h(p);
    h.on_request(true, 0);
    REQUIRE(h.on_request(true, 0) == health_event::ejected);
    CHECK(h.tick(999) == health_event::none);
    CHECK(h.tick(1000) == health_event::readmitted);
    backend_health probed(params());
    probed.on_request(true, 0);
    probed.on_request(true, 0);
    CHECK(probed.tick(5000) == health_event::none);  // probes decide
  }

  TEST_CASE("eject_after 0 turns passive ejection off, and draining stops new requests") {
    auto p = params();
    p.eject_after = 0;
    backend_health h(p);
    for (int i = 0; i < 100; ++i) CHECK(h.on_request(true, 0) == health_event::none);
    CHECK(h.state() == health_state::up);
    h.set_draining(true);
    CHECK_FALSE(h.takes_requests());
    h.set_draining(false);
    CHECK(h.takes_requests());
  }

  TEST_CASE("request outcomes of a backend already down change nothing") {
    backend_health h(params());
    for (int i = 0; i < 3; ++i) h.on_probe(false, 0);
    REQUIRE(h.state() == health_state::down);
    CHECK(h.on_request(true, 1) == health_event::none);
    CHECK(h.on_request(true, 2) == health_event::none);
    CHECK(h.state() == health_state::down);
  }
}

TEST_SUITE("route::vllm_waiting_requests") {
  TEST_CASE("the queue length is summed over label sets; other metrics and comments are ignored") {
    const char* body =
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting{model_name=\"a\"} 3.0\n"
        "vllm:num_requests_waiting{model_name=\"b\"} 4.0\n"
        "vllm:num_requests_running{model_name=\"a\"} 9.0\n"
        "vllm:num_requests_waiting_total 100\n";
    CHECK(sluice::route::vllm_waiting_requests(body) == 7);
  }
  TEST_CASE("a body without the metric reads as unknown, not zero") {
    CHECK(sluice::route::vllm_waiting_requests("vllm:num_requests_running 2\n") == -1);
    CHECK(sluice::route::vllm_waiting_requests("") == -1);
  }
  TEST_CASE("a sample without labels and a malformed value") {
    CHECK(sluice::route::vllm_waiting_requests("vllm:num_requests_waiting 5\n") == 5);
    CHECK(sluice::route::vllm_waiting_requests("vllm:num_requests_waiting{} x\n") == -1);
  }
}

TEST_SUITE("route::prometheus_gauge_sum") {
  TEST_CASE("a fractional gauge is summed over label sets; a longer name is another metric") {
    const char* body =
        "vllm:kv_cache_usage_perc{model_name=\"a\"} 0.25\n"
        "vllm:kv_cache_usage_perc{model_name=\"b\"} 0.5\n"
        "vllm:kv_cache_usage_perc_max 9\n"
        "vllm:num_requests_running 3\n";
    CHECK(sluice::route::prometheus_gauge_sum(body, "vllm:kv_cache_usage_perc") == doctest::Approx(0.75));
    CHECK(sluice::route::prometheus_gauge_sum(body, "vllm:num_requests_running") == doctest::Approx(3));
    CHECK(sluice::route::prometheus_gauge_sum(body, "vllm:num_requests_waiting") == -1);
    CHECK(sluice::route::prometheus_gauge_sum(body, "") == -1);
  }
}

TEST_SUITE("route::backend_health max ejection") {
  TEST_CASE("failures past eject_after do not eject while ejecting is not allowed, and do once it is") {
    sluice::config::health_config p;
    p.eject_after = 2;
    p.interval_ms = 0;
    backend_health h(p);
    CHECK(h.on_request(true, 0, false) == health_event::none);
    CHECK(h.on_request(true, 1, false) == health_event::none);
    CHECK(h.on_request(true, 2, false) == health_event::none);
    CHECK(h.state() == health_state::up);
    CHECK(h.on_request(true, 3, true) == health_event::ejected);
  }

  TEST_CASE("a window of 5xx ejects only when allowed") {
    sluice::config::health_config p;
    backend_health h(p);
    CHECK(h.on_server_errors(0, false) == health_event::none);
    CHECK(h.on_server_errors(0, true) == health_event::ejected);
    CHECK(h.on_server_errors(1, true) == health_event::none);  // already out
  }
}
