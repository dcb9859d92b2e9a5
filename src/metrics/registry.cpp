#include "sluice/metrics/registry.hpp"

#include <fmt/format.h>

#include <iterator>
#include <new>
#include <utility>

#include "sluice/core/assert.hpp"

namespace sluice::metrics {

size_t status_index(uint16_t status) noexcept {
  for (size_t i = 0; i < status_code_count - 1; ++i) {
    if (status_codes[i] == status) return i;
  }
  return status_code_count - 1;
}

namespace {

constexpr size_t line_counters = 64 / sizeof(counter);
constexpr std::align_val_t line_align{64};

// Label values per the exposition format: backslash, double quote and line
// feed are the characters that need escaping.
void put_label_value(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// Microseconds as a decimal number of seconds, exact (no floating point):
// 2500 → "0.0025", 1000000 → "1".
void put_seconds(std::string& out, uint64_t us) {
  uint64_t whole = us / 1'000'000, frac = us % 1'000'000;
  fmt::format_to(std::back_inserter(out), "{}", whole);
  if (frac == 0) return;
  char digits[7];
  for (int i = 5; i >= 0; --i) {
    digits[i] = static_cast<char>('0' + frac % 10);
    frac /= 10;
  }
  int n = 6;
  while (n > 0 && digits[n - 1] == '0') --n;
  out += '.';
  out.append(digits, static_cast<size_t>(n));
}

void put_family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

std::string_view name_or_none(const std::vector<std::string>& names, size_t i) {
  return i < names.size() ? std::string_view(names[i]) : std::string_view();
}

}  // namespace

void registry::block_free::operator()(counter* p) const noexcept { ::operator delete[](p, line_align); }

registry::registry(size_t shard_count, names n) : _names(std::move(n)) {
  SLUICE_VERIFY(shard_count > 0);
  const size_t g = _names.groups.size() + 1, b = _names.backends.size() + 1, k = _names.keys.size() + 1;
  const size_t requests = g * b * status_code_count;
  const size_t tokens = g * token_kind_count;
  const size_t rejected = k * reject_reason_count;
  const size_t hist = g * shard_metrics::histogram_width;
  size_t total = requests + tokens + rejected + 2 * hist + 1 + 2;
  total = (total + line_counters - 1) / line_counters * line_counters;  // whole cache lines

  _shards.resize(shard_count);
  _blocks.reserve(shard_count);
  for (size_t s = 0; s < shard_count; ++s) {
    auto* mem = static_cast<counter*>(::operator new[](total * sizeof(counter), line_align));
    for (size_t i = 0; i < total; ++i) new (mem + i) counter();
    _blocks.emplace_back(mem);
    shard_metrics& m = _shards[s];
    m._groups = _names.groups.size();
    m._backends = _names.backends.size();
    m._keys = _names.keys.size();
    counter* p = mem;
    m._requests = p;
    p += requests;
    m._tokens = p;
    p += tokens;
    m._rejected = p;
    p += rejected;
    m._ttft = p;
    p += hist;
    m._duration = p;
    p += hist;
    m._inflight = p;
    p += 1;
    m._loop = p;
  }
  _backend_up.reset(new counter[_names.backends.size() + 1]);
}

registry::~registry() = default;

void registry::set_backend_up(uint32_t backend, bool up) noexcept {
  SLUICE_ASSERT(backend < _names.backends.size());
  if (backend < _names.backends.size()) _backend_up[backend].set(up ? 1 : 0);
}

void registry::render(std::string& out) const {
  auto it = std::back_inserter(out);
  const size_t g = _names.groups.size() + 1, b = _names.backends.size() + 1, k = _names.keys.size() + 1;
  auto sum = [&](counter* shard_metrics::*field, size_t index) {
    uint64_t t = 0;
    for (const shard_metrics& m : _shards) t += (m.*field)[index].get();
    return t;
  };

  put_family(out, "sluice_requests_total", "counter", "Requests answered, by model group, backend and status code.");
  for (size_t gi = 0; gi < g; ++gi) {
    for (size_t bi = 0; bi < b; ++bi) {
      for (size_t ci = 0; ci < status_code_count; ++ci) {
        const uint64_t v = sum(&shard_metrics::_requests, (gi * b + bi) * status_code_count + ci);
        if (v == 0) continue;
        out += "sluice_requests_total{group=\"";
        put_label_value(out, name_or_none(_names.groups, gi));
        out += "\",backend=\"";
        put_label_value(out, name_or_none(_names.backends, bi));
        out += "\",code=\"";
        if (ci + 1 < status_code_count) {
          fmt::format_to(it, "{}", status_codes[ci]);
        } else {
          out += "other";
        }
        fmt::format_to(it, "\"}} {}\n", v);
      }
    }
  }

  put_family(out, "sluice_tokens_total", "counter", "Tokens by model group and kind, from the backends' usage.");
  static constexpr std::string_view kinds[token_kind_count] = {"prompt", "completion"};
  for (size_t gi = 0; gi < g; ++gi) {
    const uint64_t v0 = sum(&shard_metrics::_tokens, gi * token_kind_count);
    const uint64_t v1 = sum(&shard_metrics::_tokens, gi * token_kind_count + 1);
    if (gi + 1 == g && v0 == 0 && v1 == 0) continue;  // the no-group slot only when used
    for (size_t ki = 0; ki < token_kind_count; ++ki) {
      out += "sluice_tokens_total{group=\"";
      put_label_value(out, name_or_none(_names.groups, gi));
      fmt::format_to(it, "\",kind=\"{}\"}} {}\n", kinds[ki], ki == 0 ? v0 : v1);
    }
  }

  put_family(out, "sluice_quota_rejected_total", "counter", "Requests rejected by quota, by key id and reason.");
  static constexpr std::string_view reasons[reject_reason_count] = {"tokens", "requests", "concurrency", "too_large"};
  for (size_t ki = 0; ki < k; ++ki) {
    for (size_t ri = 0; ri < reject_reason_count; ++ri) {
      const uint64_t v = sum(&shard_metrics::_rejected, ki * reject_reason_count + ri);
      if (v == 0) continue;
      out += "sluice_quota_rejected_total{key=\"";
      put_label_value(out, name_or_none(_names.keys, ki));
      fmt::format_to(it, "\",reason=\"{}\"}} {}\n", reasons[ri], v);
    }
  }

  put_family(out, "sluice_inflight_requests", "gauge", "Requests in flight.");
  {
    // Each shard's own count never goes below zero; the sum is read without
    // a snapshot, so take it as signed and clamp a momentary skew.
    int64_t t = 0;
    for (const shard_metrics& m : _shards) t += static_cast<int64_t>(m._inflight->get());
    fmt::format_to(it, "sluice_inflight_requests {}\n", t < 0 ? 0 : t);
  }

  put_family(out, "sluice_backend_up", "gauge", "1 when the backend passes health checks, else 0.");
  for (size_t bi = 0; bi + 1 < b; ++bi) {
    out += "sluice_backend_up{backend=\"";
    put_label_value(out, _names.backends[bi]);
    fmt::format_to(it, "\"}} {}\n", _backend_up[bi].get());
  }

  auto histogram = [&](std::string_view name, std::string_view help, counter* shard_metrics::*field) {
    put_family(out, name, "histogram", help);
    constexpr size_t w = shard_metrics::histogram_width;
    for (size_t gi = 0; gi < g; ++gi) {
      uint64_t row[w] = {};
      for (size_t i = 0; i < w; ++i) row[i] = sum(field, gi * w + i);
      uint64_t count = 0;
      for (size_t i = 0; i < latency_bucket_count; ++i) count += row[i];
      if (gi + 1 == g && count == 0) continue;
      // Stored per bucket, written cumulatively; _count is the +Inf bucket.
      uint64_t cumulative = 0;
      for (size_t bi = 0; bi < latency_bucket_count; ++bi) {
        cumulative += row[bi];
        fmt::format_to(it, "{}_bucket{{group=\"", name);
        put_label_value(out, name_or_none(_names.groups, gi));
        out += "\",le=\"";
        if (bi + 1 < latency_bucket_count) {
          put_seconds(out, latency_bounds_us[bi]);
        } else {
          out += "+Inf";
        }
        fmt::format_to(it, "\"}} {}\n", cumulative);
      }
      fmt::format_to(it, "{}_sum{{group=\"", name);
      put_label_value(out, name_or_none(_names.groups, gi));
      out += "\"} ";
      put_seconds(out, row[latency_bucket_count]);
      fmt::format_to(it, "\n{}_count{{group=\"", name);
      put_label_value(out, name_or_none(_names.groups, gi));
      fmt::format_to(it, "\"}} {}\n", cumulative);
    }
  };
  histogram("sluice_ttft_seconds", "Time from request arrival to the first generated byte sent downstream.", &shard_metrics::_ttft);
  histogram("sluice_request_duration_seconds", "Request duration, arrival to last byte.", &shard_metrics::_duration);

  put_family(out, "sluice_loop_iterations_total", "counter", "Reactor loop iterations per shard.");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_iterations_total{{shard=\"{}\"}} {}\n", s, _shards[s]._loop[0].get());
  }
  put_family(out, "sluice_loop_cqes_total", "counter", "Completions handled per shard.");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_cqes_total{{shard=\"{}\"}} {}\n", s, _shards[s]._loop[1].get());
  }
}

}  // namespace sluice::metrics
