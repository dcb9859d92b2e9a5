#pragma once
// Process-wide. Counters and gauges shared by the event loops (relaxed
// atomics: they are read by /metrics only) and the record of the last
// requests behind a mutex (a test hook, not on vLLM).
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mock_vllm {

using header_list = std::vector<std::pair<std::string, std::string>>;

class request_log {
 public:
  static constexpr size_t k_capacity = 1000;

  void record(std::string_view method, std::string_view target, const header_list& headers,
              std::string_view body);
  // Appends the JSON array of the recorded requests, oldest first.
  void append_json(std::string& out) const;
  void clear();

 private:
  struct entry {
    std::string method;
    std::string target;
    header_list headers;
    std::string body;
  };
  mutable std::mutex _mutex;
  std::vector<entry> _entries;  // ring once full; _next is the oldest then
  size_t _next = 0;
};

struct shared_state {
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> aborts_total{0};
  std::atomic<uint64_t> failures_total{0};  // --fail-after-tokens drops
  std::atomic<int64_t> running{0};          // producing tokens
  std::atomic<int64_t> waiting{0};          // before the first token
  request_log log;

  // Prometheus text exposition of the gauges and counters.
  void append_metrics(std::string& out, std::string_view model, uint32_t kv_capacity) const;
  void reset_counters();
};

}  // namespace mock_vllm
