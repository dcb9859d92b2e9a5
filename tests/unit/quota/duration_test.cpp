#include <doctest/doctest.h>

#include <string>

#include "sluice/quota/duration.hpp"

namespace {
std::string fmt(uint64_t ms) {
  char buf[sluice::quota::k_duration_chars_max];
  return std::string(buf, sluice::quota::format_duration(ms, buf));
}
}  // namespace

TEST_SUITE("quota::duration") {
  TEST_CASE("durations are written the way OpenAI's rate-limit headers write them") {
    CHECK(fmt(0) == "0s");
    CHECK(fmt(1) == "1ms");
    CHECK(fmt(250) == "250ms");
    CHECK(fmt(1000) == "1s");
    CHECK(fmt(1200) == "1.2s");
    CHECK(fmt(1005) == "1.005s");
    CHECK(fmt(59'999) == "59.999s");
    CHECK(fmt(60'000) == "1m0s");
    CHECK(fmt(360'000) == "6m0s");
    CHECK(fmt(361'500) == "6m1.5s");
    CHECK(fmt(3'600'000) == "1h0m0s");
    CHECK(fmt(3'723'500) == "1h2m3.5s");
  }

  TEST_CASE("the largest duration fits the buffer") {
    CHECK(fmt(UINT64_MAX).size() <= sluice::quota::k_duration_chars_max);
    CHECK(fmt(UINT64_MAX) == "5124095576030h25m51.615s");
  }

  TEST_CASE("retry-after seconds round up and are never zero") {
    CHECK(sluice::quota::retry_after_seconds(0) == 1);
    CHECK(sluice::quota::retry_after_seconds(1) == 1);
    CHECK(sluice::quota::retry_after_seconds(1000) == 1);
    CHECK(sluice::quota::retry_after_seconds(1001) == 2);
  }
}
