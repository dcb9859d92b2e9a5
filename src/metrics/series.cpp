#include "sluice/metrics/series.hpp"

#include <algorithm>

#include "sluice/core/assert.hpp"
#include "sluice/metrics/registry.hpp"

namespace sluice::metrics {

double histogram_quantile_us(std::span<const uint64_t> buckets, double q) noexcept {
  SLUICE_ASSERT(buckets.size() == latency_bucket_count);
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  if (total == 0 || buckets.size() != latency_bucket_count) return -1;
  // The rank of the quantile among the observations, as a count from the
  // lowest bucket; the bucket where the running count reaches it holds it.
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t b = 0; b < latency_bucket_count; ++b) {
    const uint64_t here = buckets[b];
    if (here == 0 || static_cast<double>(below + here) < rank) {
      below += here;
      continue;
    }
    if (b + 1 == latency_bucket_count) return static_cast<double>(latency_bounds_us[b - 1]);
    const double lo = b == 0 ? 0.0 : static_cast<double>(latency_bounds_us[b - 1]);
    const double hi = static_cast<double>(latency_bounds_us[b]);
    return lo + (hi - lo) * (rank - static_cast<double>(below)) / static_cast<double>(here);
  }
  return static_cast<double>(latency_bounds_us[latency_bucket_count - 2]);
}

series_ring::series_ring(size_t rows, size_t width, size_t points)
    : _rows(rows), _width(width), _points(points), _times(points, 0), _values(points * rows * width, 0) {
  SLUICE_VERIFY(rows > 0 && width > 0 && points > 1);
}

std::span<uint64_t> series_ring::stage() noexcept {
  uint64_t* p = &_values[_head * _rows * _width];
  std::fill(p, p + _rows * _width, 0);
  return {p, _rows * _width};
}

void series_ring::commit(uint64_t t_ms) noexcept {
  _times[_head] = t_ms;
  _head = (_head + 1) % _points;
  if (_size < _points) ++_size;
}

size_t series_ring::window_start(uint64_t window_ms) const noexcept {
  if (_size < 2) return _size == 0 ? 0 : _size - 1;
  const uint64_t newest = time_ms(_size - 1);
  size_t i = _size - 2;
  while (i > 0 && newest - time_ms(i - 1) <= window_ms) --i;
  return i;
}

double series_ring::rate(size_t from, size_t to, size_t row, size_t field) const noexcept {
  const uint64_t t0 = time_ms(from), t1 = time_ms(to);
  if (t1 <= t0) return 0;
  return static_cast<double>(delta(from, to, row, field)) * 1000.0 / static_cast<double>(t1 - t0);
}

double series_ring::quantile_us(size_t from, size_t to, size_t row, size_t first, double q) const noexcept {
  SLUICE_ASSERT(first + latency_bucket_count <= _width);
  uint64_t buckets[latency_bucket_count];
  for (size_t b = 0; b < latency_bucket_count; ++b) buckets[b] = delta(from, to, row, first + b);
  return histogram_quantile_us(buckets, q);
}

}  // namespace sluice::metrics
