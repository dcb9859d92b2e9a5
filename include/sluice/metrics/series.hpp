#pragma once
// metrics: a short history of cumulative counters, for the status page
// (admin GET / and /status.json). The control thread copies the summed
// shard counters into it every few seconds; rates and latency percentiles
// over the last minutes are differences between two of its points.
//
// Fixed size from construction: `points` samples of `rows` × `width`
// counters each, in one ring. A push past the capacity overwrites the
// oldest point; nothing grows while the process runs. Time is a parameter
// (the push's t_ms), never read here. Counters only grow; a value lower
// than an older one (a row renamed by a reload, a gauge) gives a
// difference of 0, never a huge unsigned one.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace sluice::metrics {

// The q-quantile (0 < q < 1) of a latency histogram, from per-bucket (not
// cumulative) counts over latency_bounds_us (latency_bucket_count of them,
// the last being +Inf), interpolated linearly inside the bucket it falls in
// (as Prometheus' histogram_quantile does). Returns: µs; -1 when the
// buckets are empty; the last finite bound when it falls in +Inf.
double histogram_quantile_us(std::span<const uint64_t> buckets, double q) noexcept;

// Control-thread-local. One per status sampler; lives as long as it.
class series_ring {
 public:
  series_ring(size_t rows, size_t width, size_t points);

  size_t rows() const noexcept { return _rows; }
  size_t width() const noexcept { return _width; }
  size_t capacity() const noexcept { return _points; }
  size_t size() const noexcept { return _size; }

  // The next point's counters (rows × width, row-major), to fill before
  // commit(); zeroed. Overwrites the oldest point once the ring is full.
  std::span<uint64_t> stage() noexcept;
  void commit(uint64_t t_ms) noexcept;

  // Point i, 0 = the oldest kept, size() - 1 = the newest.
  uint64_t time_ms(size_t i) const noexcept { return _times[slot(i)]; }
  const uint64_t* at(size_t i, size_t row) const noexcept { return &_values[(slot(i) * _rows + row) * _width]; }

  // The oldest kept point no older than `window_ms` before the newest
  // (another than the newest when there are two or more). Returns: its
  // index, or size() - 1 with a single point.
  size_t window_start(uint64_t window_ms) const noexcept;
  // What a counter grew by from point `from` to point `to` (0 when it
  // went down).
  uint64_t delta(size_t from, size_t to, size_t row, size_t field) const noexcept {
    const uint64_t a = at(from, row)[field], b = at(to, row)[field];
    return b > a ? b - a : 0;
  }
  // The counter's rate per second from `from` to `to`; 0 over no time.
  double rate(size_t from, size_t to, size_t row, size_t field) const noexcept;
  // The q-quantile of the histogram stored at fields [first, first +
  // latency_bucket_count) of `row`, over the observations between the two
  // points. Returns: µs, or -1 when none.
  double quantile_us(size_t from, size_t to, size_t row, size_t first, double q) const noexcept;

 private:
  size_t slot(size_t i) const noexcept { return (_head + _points - _size + i) % _points; }

  size_t _rows, _width, _points;
  size_t _head = 0;  // where the next point goes
  size_t _size = 0;
  std::vector<uint64_t> _times;   // [points]
  std::vector<uint64_t> _values;  // [points × rows × width]
};

}  // namespace sluice::metrics
