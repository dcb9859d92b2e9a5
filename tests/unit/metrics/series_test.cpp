#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "sluice/metrics/registry.hpp"
#include "sluice/metrics/series.hpp"

using namespace sluice::metrics;

namespace {

// Pushes one point of a one-row, `width`-wide ring whose counters are `v`.
void push(series_ring& r, uint64_t t_ms, std::vector<uint64_t> v) {
  std::span<uint64_t> p = r.stage();
  REQUIRE(p.size() == v.size());
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  r.commit(t_ms);
}

// Per-bucket counts with `n` observations in bucket `b` (bound index).
std::vector<uint64_t> buckets_with(std::initializer_list<std::pair<size_t, uint64_t>> at) {
  std::vector<uint64_t> b(latency_bucket_count, 0);
  for (auto [i, n] : at) b[i] = n;
  return b;
}

}  // namespace

TEST_SUITE("metrics::histogram_quantile_us") {
  TEST_CASE("empty buckets have no quantile") {
    const std::vector<uint64_t> b(latency_bucket_count, 0);
    CHECK(histogram_quantile_us(b, 0.5) == -1);
  }

  TEST_CASE("a quantile is interpolated inside the bucket it falls in") {
    // 10 observations in (1 ms, 2.5 ms]: the median is half-way.
    const std::vector<uint64_t> b = buckets_with({{1, 10}});
    CHECK(histogram_quantile_us(b, 0.5) == doctest::Approx(1750));
    CHECK(histogram_quantile_us(b, 1.0) == doctest::Approx(2500));
    // The first bucket starts at 0.
    CHECK(histogram_quantile_us(buckets_with({{0, 4}}), 0.5) == doctest::Approx(500));
  }

  TEST_CASE("p50 and p99 of a split distribution land in their own buckets") {
    // 90 fast (≤ 1 ms), 10 slow in (1 s, 2.5 s].
    const std::vector<uint64_t> b = buckets_with({{0, 90}, {10, 10}});
    CHECK(histogram_quantile_us(b, 0.5) < 1000);
    const double p99 = histogram_quantile_us(b, 0.99);
    CHECK(p99 > 1'000'000);
    CHECK(p99 <= 2'500'000);
    CHECK(p99 == doctest::Approx(1'000'000 + 1'500'000 * 0.9));
  }

  TEST_CASE("a quantile in the +Inf bucket reads as the last finite bound") {
    const std::vector<uint64_t> b = buckets_with({{latency_bucket_count - 1, 3}});
    CHECK(histogram_quantile_us(b, 0.5) == doctest::Approx(120'000'000));
  }
}

TEST_SUITE("metrics::series_ring") {
  TEST_CASE("rates are differences over the time between two points") {
    series_ring r(1, 2, 8);
    push(r, 1000, {0, 0});
    push(r, 3000, {10, 4});
    push(r, 5000, {30, 4});
    REQUIRE(r.size() == 3);
    CHECK(r.rate(0, 2, 0, 0) == doctest::Approx(7.5));
    CHECK(r.rate(1, 2, 0, 0) == doctest::Approx(10));
    CHECK(r.rate(1, 2, 0, 1) == doctest::Approx(0));
    CHECK(r.rate(2, 2, 0, 0) == 0);  // no time: no rate
  }

  TEST_CASE("a counter that went down gives 0, not a wrapped difference") {
    series_ring r(1, 1, 4);
    push(r, 0, {100});
    push(r, 1000, {40});
    CHECK(r.delta(0, 1, 0, 0) == 0);
    CHECK(r.rate(0, 1, 0, 0) == 0);
  }

  TEST_CASE("the window starts at the oldest point inside it") {
    series_ring r(1, 1, 16);
    for (uint64_t t = 0; t <= 10'000; t += 2000) push(r, t, {t});
    // Points at 0, 2, 4, 6, 8, 10 s; a 5 s window reaches back to 6 s.
    CHECK(r.time_ms(r.window_start(5000)) == 6000);
    CHECK(r.time_ms(r.window_start(60'000)) == 0);
    // Shorter than one step: still the previous point, so a rate exists.
    CHECK(r.window_start(100) == r.size() - 2);
    series_ring one(1, 1, 4);
    push(one, 7, {1});
    CHECK(one.window_start(1000) == 0);
  }

  TEST_CASE("wrap-around keeps the newest points, oldest first, and never grows") {
    series_ring r(2, 1, 4);
    for (uint64_t i = 0; i < 10; ++i) {
      std::span<uint64_t> p = r.stage();
      p[0] = i * 10;
      p[1] = i * 100;
      r.commit(i * 1000);
    }
    REQUIRE(r.size() == 4);
    CHECK(r.capacity() == 4);
    for (size_t i = 0; i < 4; ++i) {
      CHECK(r.time_ms(i) == (6 + i) * 1000);
      CHECK(r.at(i, 0)[0] == (6 + i) * 10);
      CHECK(r.at(i, 1)[0] == (6 + i) * 100);
    }
    CHECK(r.rate(0, 3, 1, 0) == doctest::Approx(100));
    CHECK(r.time_ms(r.window_start(60'000)) == 6000);
  }

  TEST_CASE("stage() hands out a zeroed point even over an old one") {
    series_ring r(1, 3, 2);
    push(r, 0, {1, 2, 3});
    push(r, 1, {4, 5, 6});
    std::span<uint64_t> p = r.stage();
    for (uint64_t v : p) CHECK(v == 0);
  }

  TEST_CASE("percentiles over the window count only its observations") {
    // One row: a histogram at fields [0, latency_bucket_count).
    series_ring r(1, latency_bucket_count, 8);
    std::vector<uint64_t> h(latency_bucket_count, 0);
    push(r, 0, h);
    h[12] = 50;  // 50 slow ones (5 s .. 10 s) before the window
    push(r, 60'000, h);
    h[0] += 100;  // then 100 fast ones
    push(r, 62'000, h);
    const size_t from = r.window_start(2000);
    CHECK(from == 1);
    CHECK(r.quantile_us(from, 2, 0, 0, 0.99) <= 1000);
    // Over everything the slow third shows at p99.
    CHECK(r.quantile_us(0, 2, 0, 0, 0.99) > 5'000'000);
    CHECK(r.quantile_us(1, 1, 0, 0, 0.5) == -1);
  }
}
