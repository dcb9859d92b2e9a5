#pragma once
// proxy: per-shard counters. Single writer (the shard), read by the control
// thread at scrape time as relaxed atomics: no locks, no shared cache line
// written by two cores (each shard's block is cache-line aligned).
#include <atomic>
#include <cstdint>

namespace sluice::proxy {

struct counter {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n = 1) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  void sub(uint64_t n = 1) noexcept { v.store(v.load(std::memory_order_relaxed) - n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

struct alignas(64) shard_stats {
  counter connections_accepted;
  counter connections_open;
  counter requests_total;
  counter requests_inflight;
  counter responses_2xx;
  counter responses_4xx;
  counter responses_5xx;
  counter local_errors;           // answered by sluice itself (4xx/5xx before any backend)
  counter upstream_requests;
  counter upstream_connect_errors;
  counter upstream_retries;
  counter upstream_timeouts;
  counter upstream_reset_after_send;  // a backend connection failed after the whole request was written: 502, never retried
  counter upstream_truncated;     // backend gone mid-response: client response truncated
  counter downstream_aborts;      // client gone mid-response: backend request cancelled
  counter client_stalls;          // client took no bytes of a response for stream_idle_timeout_ms: closed
  counter upstream_own_buffers;   // backend receives that found the shard's buffer ring empty
  counter usage_chunks_cut;       // injected usage chunks removed from client streams
  counter shed_connections;       // over server.connections_max
  counter shed_requests;          // over server.inflight_max (503)
  counter shed_upstream_pool;     // over upstream.connections_max to the chosen backend (503)
  counter shed_memory;            // over server.memory_max_bytes of connection memory (503)
  counter memory_bytes;           // gauge: this shard's connection memory, as of its last tick
  counter audit_written;          // audit lines confirmed on disk (copied from the writer per tick)
  counter audit_dropped;          // audit lines dropped (both buffers busy at their bound, no file)
  counter audit_lost;             // audit lines in a batch whose write failed
  counter loop_iterations;
  counter loop_cqes;
};

}  // namespace sluice::proxy
