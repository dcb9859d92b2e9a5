#pragma once
// metrics: per-shard counters and histograms, summed at scrape time into
// Prometheus text exposition format 0.0.4 (docs/architecture.md §5).
//
// Every label set is known when the config is loaded (groups, backends, keys,
// a fixed set of status codes, token kinds, rejection reasons), so each shard
// gets dense arrays indexed by position — no maps, no strings, no allocation
// on the hot path. Each shard writes only its own block (single writer,
// relaxed atomics, see counter.hpp); the scraper reads all blocks.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/metrics/counter.hpp"

namespace sluice::metrics {

// Appends a label value escaped per the exposition format (backslash,
// double quote and line feed). The one Prometheus escaper of the tree.
void put_label_value(std::string& out, std::string_view v);

// "Not known for this request": no group resolved (401, unknown model), no
// backend picked (429, 503 before routing). Rendered as an empty label value,
// which Prometheus treats as the label being absent.
inline constexpr uint32_t none = UINT32_MAX;

// Status codes are bucketed into this fixed set so the label space stays
// small and dense; anything else is "other".
inline constexpr uint16_t status_codes[] = {200, 400, 401, 403, 404, 408, 413, 429, 431, 499, 500, 502, 503, 504};
inline constexpr size_t status_code_count = sizeof status_codes / sizeof status_codes[0] + 1;  // + "other"
// Returns: the index of `status` in status_codes, or the "other" slot.
size_t status_index(uint16_t status) noexcept;

enum class token_kind : uint8_t { prompt = 0, completion = 1 };
inline constexpr size_t token_kind_count = 2;

// How the semantic router picked the auto model's group, in the order of
// route::decision_how (proxy static_asserts the two agree).
inline constexpr std::string_view router_how_names[] = {"rule", "classifier", "default", "sticky", "embeddings"};
inline constexpr size_t router_how_count = sizeof router_how_names / sizeof router_how_names[0];

// The client dialects, in the order of dialect::client_dialect (proxy
// static_asserts the two agree).
inline constexpr std::string_view dialect_names[] = {"chat", "completions", "embeddings", "responses", "messages"};
inline constexpr size_t dialect_count = sizeof dialect_names / sizeof dialect_names[0];

enum class reject_reason : uint8_t { tokens = 0, requests = 1, concurrency = 2, too_large = 3 };
inline constexpr size_t reject_reason_count = 4;

// Latency buckets (upper bounds, µs) for TTFT and request duration: 1 ms to
// 120 s; LLM requests span both ends (cached short answers, long generations).
inline constexpr uint64_t latency_bounds_us[] = {
    1'000,      2'500,      5'000,      10'000,     25'000,     50'000,      100'000,     250'000,   500'000,
    1'000'000,  2'500'000,  5'000'000,  10'000'000, 20'000'000, 30'000'000,  60'000'000,  120'000'000};
inline constexpr size_t latency_bucket_count = sizeof latency_bounds_us / sizeof latency_bounds_us[0] + 1;  // + +Inf

// registry::add_group_totals' layout: one group's answers by status code
// (status_codes order, then "other"), its tokens by kind, then its TTFT and
// duration histograms (per-bucket counts, latency_bounds_us order).
inline constexpr size_t totals_codes = 0;
inline constexpr size_t totals_tokens = totals_codes + status_code_count;
inline constexpr size_t totals_ttft = totals_tokens + token_kind_count;
inline constexpr size_t totals_duration = totals_ttft + latency_bucket_count;
inline constexpr size_t totals_width = totals_duration + latency_bucket_count;

// A shard's plain counters and gauges: one slot each per shard, summed over
// the shards at scrape time. Their names, help and labels are a table in
// registry.cpp (stat_rows); a stat without a row is internal (read by the
// shard itself, never rendered).
enum class stat : uint8_t {
  connections_accepted,
  connections_open,          // gauge
  requests_total,
  requests_inflight,         // internal: dispatched and not yet answered (server.inflight_max)
  responses_2xx,
  responses_4xx,
  responses_5xx,
  local_errors,              // answered by sluice itself (4xx/5xx before any backend)
  upstream_requests,
  upstream_connect_errors,
  upstream_retries,
  upstream_timeouts,
  upstream_reset_after_send, // a backend connection failed after the whole request was written
  upstream_truncated,        // backend gone mid-response: client response truncated
  downstream_aborts,         // client gone mid-response: backend request cancelled
  client_stalls,             // client took no bytes of a response for stream_idle_timeout_ms
  upstream_own_buffers,      // backend receives that found the shard's buffer ring empty
  usage_chunks_cut,          // injected usage chunks removed from client streams
  usage_cut_failed,          // injected usage chunks that reached the client (a shape not cut): must stay 0
  sse_chunks_skipped,        // event-stream chunks counted at their boundaries, their bytes not scanned
  upstream_bad_replies,      // translated protocols: a backend reply or event sluice could not read (502 / stream ended)
  shed_connections,          // over server.connections_max
  shed_requests,             // over server.inflight_max (503)
  shed_upstream_pool,        // over upstream.connections_max to the chosen backend (503)
  shed_memory,               // over server.memory_max_bytes of connection memory (503)
  memory_bytes,              // gauge: this shard's connection memory, as of its last tick
  audit_written,             // audit lines confirmed on disk (set from the writer per tick)
  audit_dropped,             // audit lines dropped (both buffers busy at their bound, no file)
  audit_lost,                // audit lines given up at shutdown, after the close timeout (never written)
  audit_write_errors,        // failed audit write attempts (each one retried)
  audit_fsyncs,              // completed audit fdatasyncs
  audit_fsync_errors,        // audit fdatasyncs that failed
  h2_connections,            // connections that spoke HTTP/2 (h2c prior knowledge or ALPN h2)
  h2_streams,                // HTTP/2 request streams opened
  h2_refused_streams,        // RST_STREAM REFUSED_STREAM: over SETTINGS_MAX_CONCURRENT_STREAMS
  h2_client_resets,          // RST_STREAM from clients
  h2_rapid_resets,           // connections ended for resets over the window (CVE-2023-44487, -2025-8671)
  h2_continuation_floods,    // connections ended for CONTINUATION floods (CVE-2024-27316 family)
  h2_control_floods,         // connections ended for SETTINGS / PING floods (or their ACKs piling up)
  h2_hpack_bombs,            // connections ended for a decoded header list past 4x the limit
  h2_header_lists_too_large, // requests answered 431 (header list over server.max_head_bytes)
  h2_memory_refusals,        // connections ended at their memory cap
  h2_protocol_errors,        // connections ended with another GOAWAY error (bad frames, ids...)
  tls_handshakes,            // TLS handshakes completed
  tls_handshake_errors,      // TLS handshakes that failed (alerts, garbage, no shared version)
  tls_ktls_connections,      // TLS connections whose sends the kernel encrypts (kTLS)
  tls_copy_connections,      // TLS connections encrypted by OpenSSL in user space
  edge_protocol_mismatches,  // plaintext HTTP on the TLS port, or a ClientHello on the plaintext one
  router_embeddings_ok,      // embeddings calls that decided (a vector came back)
  router_embeddings_failed,  // embeddings calls that failed (connect, status, bad reply) or found no backend up
  router_embeddings_timeouts,// embeddings calls past [router] embeddings_timeout_ms
  router_embeddings_busy,    // pending decisions that found every call slot of the shard busy
  router_embeddings_cache_hits,    // auto-model decisions taken from the shard's embeddings cache
  router_embeddings_cache_misses,  // ... that needed a call
  responses_stored,          // [responses] store: responses sent to the store to keep
  responses_store_dropped,   // ... not sent: the shard's queue to the store was full
  count_
};
inline constexpr size_t stat_count = static_cast<size_t>(stat::count_);

// Shard-local view of one shard's block. Lives as long as the registry; the
// shard keeps a pointer from registry::shard(i). Only that shard calls the
// writers below; indices come from the config (position in config.groups,
// config.backends, config.keys) or `none`.
class shard_metrics {
 public:
  void request_done(uint32_t group, uint32_t backend, uint16_t status) noexcept {
    _requests[(slot(group, _groups) * (_backends + 1) + slot(backend, _backends)) * status_code_count +
              status_index(status)]
        .add();
  }
  void tokens(uint32_t group, uint64_t prompt, uint64_t completion) noexcept {
    counter* t = &_tokens[slot(group, _groups) * token_kind_count];
    t[static_cast<size_t>(token_kind::prompt)].add(prompt);
    t[static_cast<size_t>(token_kind::completion)].add(completion);
  }
  // sluice_dialect_requests_total{group,dialect}: one per answered request
  // whose client's dialect is known (group none: refused before a group).
  void dialect_done(uint32_t group, size_t dialect) noexcept {
    _dialects[slot(group, _groups) * dialect_count + (dialect < dialect_count ? dialect : 0)].add();
  }
  // sluice_router_decisions_total{group,how}: one per auto-model request routed.
  void router_decision(uint32_t group, size_t how) noexcept {
    _decisions[slot(group, _groups) * router_how_count + (how < router_how_count ? how : 0)].add();
  }
  void quota_rejected(uint32_t key, reject_reason why) noexcept {
    _rejected[slot(key, _keys) * reject_reason_count + static_cast<size_t>(why)].add();
  }
  // One answered request of key `key` (none: no key) and the tokens it was
  // billed: sluice_key_requests_total, sluice_key_tokens_total.
  void key_done(uint32_t key, uint64_t prompt, uint64_t completion) noexcept {
    counter* k = &_key_usage[slot(key, _keys) * key_usage_width];
    k[0].add();
    if ((prompt | completion) == 0) return;
    k[1].add(prompt);
    k[2].add(completion);
  }
  // Fair admission: a request of key `key` that waited in its group's
  // queue `queued_ms` (sluice_key_queued_total / _seconds_total), and the
  // queue's depth (sluice_admission_queue_depth{group}) and waits
  // (sluice_admission_wait_seconds{group}).
  void key_queued(uint32_t key, uint64_t queued_ms) noexcept {
    counter* k = &_key_usage[slot(key, _keys) * key_usage_width];
    k[3].add();
    k[4].add(queued_ms);
  }
  void queue_depth_add(uint32_t group) noexcept { _queue_depth[slot(group, _groups)].add(); }
  void queue_depth_sub(uint32_t group) noexcept { _queue_depth[slot(group, _groups)].sub(); }
  void observe_queue_wait_us(uint32_t group, uint64_t us) noexcept { observe(_queue_wait, group, us); }
  // A backend request begins / ends (the routing table's load moves with
  // it): sluice_backend_inflight. A failure attributed to the backend
  // (connect error, reset, timeout, a reply sluice cannot read):
  // sluice_backend_failures_total.
  void backend_started(uint32_t backend) noexcept { _backend_load[slot(backend, _backends) * 2].add(); }
  void backend_ended(uint32_t backend) noexcept { _backend_load[slot(backend, _backends) * 2].sub(); }
  void backend_failed(uint32_t backend) noexcept { _backend_load[slot(backend, _backends) * 2 + 1].add(); }
  counter& at(stat s) noexcept { return _stats[static_cast<size_t>(s)]; }
  const counter& at(stat s) const noexcept { return _stats[static_cast<size_t>(s)]; }
  void inflight_add() noexcept { _inflight->add(); }
  void inflight_sub() noexcept { _inflight->sub(); }
  uint64_t inflight() const noexcept { return _inflight->get(); }  // this shard's share of sluice_inflight_requests
  void observe_ttft_us(uint32_t group, uint64_t us) noexcept { observe(_ttft, group, us); }
  void observe_duration_us(uint32_t group, uint64_t us) noexcept { observe(_duration, group, us); }
  // From the reactor, once per loop iteration (or less often).
  void set_loop(uint64_t iterations, uint64_t cqes, uint64_t polls_caught = 0, uint64_t polls_missed = 0,
                uint64_t poll_ns = 0, uint64_t batched_waits = 0) noexcept {
    _loop[0].set(iterations);
    _loop[1].set(cqes);
    _loop[2].set(polls_caught);
    _loop[3].set(polls_missed);
    _loop[4].set(poll_ns);
    _loop[5].set(batched_waits);
  }

 private:
  friend class registry;
  // Histogram layout per group: latency_bucket_count per-bucket (not yet
  // cumulative) counts, then the sum in µs. The count is the buckets' total,
  // so it is not stored: one store less per observation.
  static constexpr size_t histogram_width = latency_bucket_count + 1;
  // requests, prompt tokens, completion tokens, requests queued, ms queued
  static constexpr size_t key_usage_width = 5;

  // Out-of-range indices are a programmer error; in release they land in the
  // `none` slot rather than in another shard's memory.
  static size_t slot(uint32_t i, size_t n) noexcept { return i < n ? i : n; }
  void observe(counter* h, uint32_t group, uint64_t us) noexcept {
    counter* row = h + slot(group, _groups) * histogram_width;
    size_t b = 0;
    while (b < latency_bucket_count - 1 && us > latency_bounds_us[b]) ++b;
    row[b].add();
    row[latency_bucket_count].add(us);
  }

  // Row counts (the registry's capacity); the last row of each is `none`.
  size_t _groups = 0, _backends = 0, _keys = 0;
  counter* _requests = nullptr;   // [(groups+1) × (backends+1) × status_code_count]
  counter* _tokens = nullptr;     // [(groups+1) × token_kind_count]
  counter* _rejected = nullptr;   // [(keys+1) × reject_reason_count]
  counter* _decisions = nullptr;  // [(groups+1) × router_how_count]
  counter* _dialects = nullptr;   // [(groups+1) × dialect_count]
  counter* _key_usage = nullptr;  // [(keys+1) × key_usage_width]
  counter* _backend_load = nullptr;  // [(backends+1) × 2]: in flight (gauge), failures
  counter* _ttft = nullptr;       // [(groups+1) × histogram_width]
  counter* _duration = nullptr;   // [(groups+1) × histogram_width]
  counter* _queue_wait = nullptr; // [(groups+1) × histogram_width]
  counter* _queue_depth = nullptr;  // [groups+1]: gauge
  counter* _inflight = nullptr;
  static constexpr size_t loop_width = 6;
  counter* _loop = nullptr;       // [iterations, cqes, polls caught, polls missed, poll ns, batched waits]
  counter* _stats = nullptr;      // [stat_count]
};

// Process-wide. Created from the config before the shards start, destroyed
// after they stop. Rows are sized for the names plus `room` more of each, so
// a config reload that appends groups, backends or keys (config::reconcile
// keeps every existing position) only renames: shards never see a row move.
class registry {
 public:
  struct names {
    std::vector<std::string> groups;    // config.groups[i].name
    std::vector<std::string> backends;  // config.backends[i].url
    std::vector<std::string> keys;      // config.keys[i].id
    // Parallel to `backends`: the protocol its groups speak ("openai",
    // "triton", "anthropic"), the `protocol` label of every series that
    // names a backend (docs/architecture.md §6a). Shorter than `backends` (or "") where
    // not known: the label is then empty.
    std::vector<std::string> backend_protocols;
  };

  struct room {
    size_t groups = 0, backends = 0, keys = 0;
  };
  registry(size_t shard_count, names n, room extra);
  registry(size_t shard_count, names n) : registry(shard_count, std::move(n), room{0, 0, 0}) {}
  ~registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  size_t shard_count() const noexcept { return _shards.size(); }
  shard_metrics& shard(size_t i) noexcept { return _shards[i]; }
  const shard_metrics& shard(size_t i) const noexcept { return _shards[i]; }
  // Group rows, room for reloads included; row group_capacity() is the
  // `none` group (answers before any group was resolved).
  size_t group_capacity() const noexcept { return _group_rows; }
  size_t backend_capacity() const noexcept { return _backend_rows; }
  size_t key_capacity() const noexcept { return _key_rows; }
  const names& label_names() const noexcept { return _names; }
  // Control thread (the thread that renders): the label names after a
  // reload. Returns: false (nothing changes) when a list would shrink or
  // outgrow the rows.
  bool rename(names n);

  // Control thread (health checker): single writer of these gauges.
  void set_backend_up(uint32_t backend, bool up) noexcept;

  // Any thread: a stat summed over the shards.
  uint64_t sum(stat s) const noexcept;
  // Any thread: the answers recorded for `backend` (every group, every
  // shard), and of them the 5xx ones.
  void backend_answers(uint32_t backend, uint64_t& answers, uint64_t& server_errors) const noexcept;
  // Any thread: `backend`'s requests in flight now and the failures
  // attributed to it, every shard.
  void backend_load(uint32_t backend, uint64_t& inflight, uint64_t& failures) const noexcept;
  // Any thread: key row `key`'s answered requests, prompt and completion
  // tokens, requests that waited in a fair queue and the ms they waited,
  // every shard (a reload that gives a key new limits makes a new row under
  // the same id: sum the rows of one id).
  static constexpr size_t key_usage_width = shard_metrics::key_usage_width;
  void key_usage(uint32_t key, uint64_t out[key_usage_width]) const noexcept;
  // Any thread: requests queued now for `group`, every shard.
  uint64_t queue_depth(uint32_t group) const noexcept;

  // Any thread (the status sampler): adds group row `group` (<=
  // group_capacity()), summed over the shards and backends, to `out`
  // (totals_width counters, totals_* layout).
  void add_group_totals(size_t group, uint64_t* out) const noexcept;
  // Any thread: requests in flight, summed over the shards.
  uint64_t inflight() const noexcept;
  // Any thread: answered requests by client dialect (dialect_names' order),
  // summed over the shards and groups.
  void dialect_requests(uint64_t out[dialect_count]) const noexcept;
  // Any thread: shard `s`'s loop counters as the reactor last set them:
  // iterations, completions, polls caught, polls missed, poll ns.
  void shard_loop(size_t s, uint64_t out[5]) const noexcept;

  // Any thread, typically the admin server per scrape: appends every family
  // with HELP and TYPE lines. Counters of (group, backend, code) and
  // (key, reason) are written only where non-zero; the rest always.
  void render(std::string& out) const;

 private:
  names _names;
  size_t _group_rows = 0, _backend_rows = 0, _key_rows = 0;  // capacity, without the `none` row
  std::vector<shard_metrics> _shards;
  // One allocation per shard, 64-byte aligned and padded to whole cache
  // lines, so no line is written by two cores.
  struct block_free {
    void operator()(counter* p) const noexcept;
  };
  std::vector<std::unique_ptr<counter, block_free>> _blocks;
  std::unique_ptr<counter[]> _backend_up;  // [backends], 0 or 1
};

}  // namespace sluice::metrics
