#include "state.hpp"

#include <algorithm>

#include "wire.hpp"

namespace mock_vllm {

namespace {

void append_entry_json(std::string& out, std::string_view method, std::string_view target,
                       const header_list& headers, std::string_view body) {
  out += "{\"method\":";
  append_json_bytes(out, method);
  out += ",\"target\":";
  append_json_bytes(out, target);
  out += ",\"headers\":[";
  for (size_t i = 0; i < headers.size(); ++i) {
    if (i > 0) out += ',';
    out += '[';
    append_json_bytes(out, headers[i].first);
    out += ',';
    append_json_bytes(out, headers[i].second);
    out += ']';
  }
  out += "],\"body\":";
  append_json_bytes(out, body);
  out += '}';
}

// prometheus_client writes integral floats as "3.0".
void append_sample(std::string& out, double v) {
  if (v == static_cast<double>(static_cast<int64_t>(v))) {
    append_int(out, static_cast<int64_t>(v));
    out += ".0";
    return;
  }
  char buf[32];
  int n = std::snprintf(buf, sizeof buf, "%.17g", v);
  out.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

void append_gauge(std::string& out, std::string_view name, std::string_view help,
                  std::string_view model, double v) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += " gauge\n";
  out += name;
  out += "{model_name=";
  append_json_string(out, model);  // Prometheus label escaping is a subset of JSON's
  out += "} ";
  append_sample(out, v);
  out += '\n';
}

void append_counter(std::string& out, std::string_view name, std::string_view help, uint64_t v) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += " counter\n";
  out += name;
  out += ' ';
  append_sample(out, static_cast<double>(v));
  out += '\n';
}

}  // namespace

void request_log::record(std::string_view method, std::string_view target,
                         const header_list& headers, std::string_view body) {
  std::lock_guard lock(_mutex);
  entry* e;
  if (_entries.size() < k_capacity) {
    e = &_entries.emplace_back();
  } else {
    e = &_entries[_next];
    _next = (_next + 1) % k_capacity;
  }
  // assign() keeps the capacity of a reused slot.
  e->method.assign(method);
  e->target.assign(target);
  e->headers.resize(headers.size());
  for (size_t i = 0; i < headers.size(); ++i) {
    e->headers[i].first.assign(headers[i].first);
    e->headers[i].second.assign(headers[i].second);
  }
  e->body.assign(body);
}

void request_log::append_json(std::string& out) const {
  std::lock_guard lock(_mutex);
  out += '[';
  for (size_t i = 0; i < _entries.size(); ++i) {
    const entry& e = _entries[(_next + i) % _entries.size()];
    if (i > 0) out += ',';
    append_entry_json(out, e.method, e.target, e.headers, e.body);
  }
  out += ']';
}

void request_log::clear() {
  std::lock_guard lock(_mutex);
  _entries.clear();
  _next = 0;
}

void shared_state::append_metrics(std::string& out, std::string_view model, uint32_t kv_capacity) const {
  int64_t r = std::max<int64_t>(0, running.load(std::memory_order_relaxed));
  int64_t w = std::max<int64_t>(0, waiting.load(std::memory_order_relaxed));
  double kv = std::min(1.0, static_cast<double>(r + w) / kv_capacity);
  append_gauge(out, "vllm:num_requests_running", "Number of requests in model execution batches.",
               model, static_cast<double>(r));
  append_gauge(out, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", model,
               static_cast<double>(w));
  append_gauge(out, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", model, kv);
  append_counter(out, "mock_requests_total", "Requests received (debug endpoints excluded).",
                 requests_total.load(std::memory_order_relaxed));
  append_counter(out, "mock_aborts_total", "Requests whose client left before the reply was complete.",
                 aborts_total.load(std::memory_order_relaxed));
  append_counter(out, "mock_failures_total", "Connections dropped on purpose by --fail-after-tokens.",
                 failures_total.load(std::memory_order_relaxed));
}

void shared_state::reset_counters() {
  requests_total.store(0, std::memory_order_relaxed);
  aborts_total.store(0, std::memory_order_relaxed);
  failures_total.store(0, std::memory_order_relaxed);
}

}  // namespace mock_vllm
