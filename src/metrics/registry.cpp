#include "sluice/metrics/registry.hpp"
#include "sluice/metrics/exposition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <unordered_map>
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

namespace {

constexpr size_t line_counters = 64 / sizeof(counter);
constexpr std::align_val_t line_align{64};


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

std::string_view name_or_none(const std::vector<std::string>& names, size_t i) {
  return i < names.size() ? std::string_view(names[i]) : std::string_view();
}

}  // namespace

void registry::block_free::operator()(counter* p) const noexcept { ::operator delete[](p, line_align); }

registry::registry(size_t shard_count, names n, room extra)
    : _names(std::move(n)),
      _group_rows(_names.groups.size() + extra.groups),
      _backend_rows(_names.backends.size() + extra.backends),
      _key_rows(_names.keys.size() + extra.keys) {
  SLUICE_VERIFY(shard_count > 0);
  const size_t g = _group_rows + 1, b = _backend_rows + 1, k = _key_rows + 1;
  const size_t requests = g * b * status_code_count;
  const size_t tokens = g * token_kind_count;
  const size_t rejected = k * reject_reason_count;
  const size_t hist = g * shard_metrics::histogram_width;
  const size_t decisions = g * router_how_count;
  const size_t dialects = g * dialect_count;
  const size_t key_usage = k * shard_metrics::key_usage_width;
  const size_t backend_load = b * 2;
  size_t total = requests + tokens + rejected + decisions + dialects + key_usage + backend_load + 3 * hist + g + 1 +
                 shard_metrics::loop_width + stat_count;
  total = (total + line_counters - 1) / line_counters * line_counters;  // whole cache lines

  _shards.resize(shard_count);
  _blocks.reserve(shard_count);
  for (size_t s = 0; s < shard_count; ++s) {
    auto* mem = static_cast<counter*>(::operator new[](total * sizeof(counter), line_align));
    for (size_t i = 0; i < total; ++i) new (mem + i) counter();
    _blocks.emplace_back(mem);
    shard_metrics& m = _shards[s];
    m._groups = _group_rows;
    m._backends = _backend_rows;
    m._keys = _key_rows;
    counter* p = mem;
    m._requests = p;
    p += requests;
    m._tokens = p;
    p += tokens;
    m._rejected = p;
    p += rejected;
    m._decisions = p;
    p += decisions;
    m._dialects = p;
    p += dialects;
    m._key_usage = p;
    p += key_usage;
    m._backend_load = p;
    p += backend_load;
    m._ttft = p;
    p += hist;
    m._duration = p;
    p += hist;
    m._queue_wait = p;
    p += hist;
    m._queue_depth = p;
    p += g;
    m._inflight = p;
    p += 1;
    m._loop = p;
    p += shard_metrics::loop_width;
    m._stats = p;
  }
  _backend_up.reset(new counter[_backend_rows + 1]);
}

bool registry::rename(names n) {
  if (n.groups.size() < _names.groups.size() || n.backends.size() < _names.backends.size() ||
      n.keys.size() < _names.keys.size() || n.groups.size() > _group_rows || n.backends.size() > _backend_rows ||
      n.keys.size() > _key_rows) {
    return false;
  }
  _names = std::move(n);
  return true;
}

registry::~registry() = default;

void registry::backend_answers(uint32_t backend, uint64_t& answers, uint64_t& server_errors) const noexcept {
  answers = server_errors = 0;
  if (backend >= _backend_rows) return;
  const size_t b = _backend_rows + 1;
  for (const shard_metrics& m : _shards) {
    for (size_t g = 0; g <= _group_rows; ++g) {
      const counter* row = m._requests + (g * b + backend) * status_code_count;
      for (size_t c = 0; c < status_code_count; ++c) {
        const uint64_t v = row[c].get();
        answers += v;
        if (c + 1 < status_code_count && status_codes[c] >= 500) server_errors += v;
      }
    }
  }
}

void registry::backend_load(uint32_t backend, uint64_t& inflight, uint64_t& failures) const noexcept {
  inflight = failures = 0;
  if (backend >= _backend_rows) return;
  // Each shard counts its own starts and ends, so its gauge is >= 0; the
  // sum is read without a snapshot: take it as signed, clamp a skew.
  int64_t open = 0;
  for (const shard_metrics& m : _shards) {
    open += static_cast<int64_t>(m._backend_load[backend * 2].get());
    failures += m._backend_load[backend * 2 + 1].get();
  }
  inflight = open < 0 ? 0 : static_cast<uint64_t>(open);
}

uint64_t registry::queue_depth(uint32_t group) const noexcept {
  if (group > _group_rows) return 0;
  uint64_t v = 0;
  for (const shard_metrics& m : _shards) v += m._queue_depth[group].get();
  return v;
}

void registry::key_usage(uint32_t key, uint64_t out[key_usage_width]) const noexcept {
  for (size_t i = 0; i < shard_metrics::key_usage_width; ++i) out[i] = 0;  // every output, whatever it held
  if (key > _key_rows) return;
  for (const shard_metrics& m : _shards) {
    for (size_t i = 0; i < shard_metrics::key_usage_width; ++i) {
      out[i] += m._key_usage[key * shard_metrics::key_usage_width + i].get();
    }
  }
}

void registry::dialect_requests(uint64_t out[dialect_count]) const noexcept {
  for (size_t d = 0; d < dialect_count; ++d) out[d] = 0;
  for (const shard_metrics& m : _shards) {
    for (size_t g = 0; g <= _group_rows; ++g) {
      for (size_t d = 0; d < dialect_count; ++d) out[d] += m._dialects[g * dialect_count + d].get();
    }
  }
}

void registry::add_group_totals(size_t group, uint64_t* out) const noexcept {
  if (group > _group_rows) return;
  const size_t b = _backend_rows + 1;
  constexpr size_t w = shard_metrics::histogram_width;
  // Rows past the named backends stay 0 until a reload names them: only
  // the named ones and the `none` row are read.
  const size_t named = std::min(_names.backends.size(), _backend_rows);
  auto add_answers = [&](const shard_metrics& m, size_t backend) {
    const counter* row = m._requests + (group * b + backend) * status_code_count;
    for (size_t c = 0; c < status_code_count; ++c) out[totals_codes + c] += row[c].get();
  };
  for (const shard_metrics& m : _shards) {
    for (size_t bi = 0; bi < named; ++bi) add_answers(m, bi);
    add_answers(m, _backend_rows);
    for (size_t k = 0; k < token_kind_count; ++k) out[totals_tokens + k] += m._tokens[group * token_kind_count + k].get();
    for (size_t i = 0; i < latency_bucket_count; ++i) {
      out[totals_ttft + i] += m._ttft[group * w + i].get();
      out[totals_duration + i] += m._duration[group * w + i].get();
    }
  }
}

uint64_t registry::inflight() const noexcept {
  // Each shard's own count never goes below zero; the sum is read without
  // a snapshot, so take it as signed and clamp a momentary skew.
  int64_t t = 0;
  for (const shard_metrics& m : _shards) t += static_cast<int64_t>(m._inflight->get());
  return t < 0 ? 0 : static_cast<uint64_t>(t);
}

void registry::shard_loop(size_t s, uint64_t out[5]) const noexcept {
  for (size_t i = 0; i < 5; ++i) out[i] = s < _shards.size() ? _shards[s]._loop[i].get() : 0;
}

void registry::set_backend_up(uint32_t backend, bool up) noexcept {
  SLUICE_ASSERT(backend < _backend_rows);
  if (backend < _backend_rows) _backend_up[backend].set(up ? 1 : 0);
}

namespace {

// The rendered stats, in exposition order; rows of one family are adjacent.
struct stat_row {
  stat s;
  const char* family;
  family_type type;
  const char* label;  // "" or `name="value"`
  const char* help;
};

constexpr stat_row k_stat_rows[] = {
    {stat::connections_accepted, "sluice_connections_accepted_total", family_type::counter, "", "Downstream connections accepted."},
    {stat::connections_open, "sluice_connections_open", family_type::gauge, "", "Downstream connections open."},
    {stat::requests_total, "sluice_requests_received_total", family_type::counter, "", "Requests received (all endpoints)."},
    {stat::responses_2xx, "sluice_responses_total", family_type::counter, "class=\"2xx\"", "Responses by status class."},
    {stat::responses_4xx, "sluice_responses_total", family_type::counter, "class=\"4xx\"", ""},
    {stat::responses_5xx, "sluice_responses_total", family_type::counter, "class=\"5xx\"", ""},
    {stat::local_errors, "sluice_local_errors_total", family_type::counter, "",
     "Answers sluice made itself (errors before any backend)."},
    {stat::upstream_requests, "sluice_upstream_requests_total", family_type::counter, "", "Requests sent to backends (attempts)."},
    {stat::upstream_connect_errors, "sluice_upstream_connect_errors_total", family_type::counter, "", "Backend connect failures."},
    {stat::upstream_retries, "sluice_upstream_retries_total", family_type::counter, "",
     "Retries on another attempt before any byte reached the client."},
    {stat::upstream_timeouts, "sluice_upstream_timeouts_total", family_type::counter, "", "Backend connect/first-byte/idle timeouts."},
    {stat::upstream_reset_after_send, "sluice_upstream_reset_after_send_total", family_type::counter, "",
     "Backend connections that failed after the whole request was written (502; never retried: the backend may have "
     "started it)."},
    {stat::upstream_truncated, "sluice_upstream_truncated_total", family_type::counter, "",
     "Responses cut because the backend failed mid-response."},
    {stat::downstream_aborts, "sluice_downstream_aborts_total", family_type::counter, "",
     "Exchanges cancelled because the client went away."},
    {stat::client_stalls, "sluice_client_stalls_total", family_type::counter, "",
     "Responses cut because the client took no bytes for the stream idle timeout."},
    {stat::upstream_own_buffers, "sluice_upstream_buffer_fallbacks_total", family_type::counter, "",
     "Backend receives that found every pooled receive buffer lent and used a buffer of their own."},
    {stat::usage_chunks_cut, "sluice_usage_chunks_cut_total", family_type::counter, "",
     "Usage chunks sluice asked for and removed from client streams."},
    {stat::usage_cut_failed, "sluice_usage_cut_failed_total", family_type::counter, "",
     "Usage chunks sluice asked for that it could not remove from a client stream (should stay 0)."},
    {stat::sse_chunks_skipped, "sluice_sse_chunks_skipped_total", family_type::counter, "",
     "Event-stream chunks of one plain content event each, counted at their boundaries without scanning their bytes "
     "(upstream.sse_scan = \"boundaries\")."},
    {stat::upstream_bad_replies, "sluice_upstream_bad_replies_total", family_type::counter, "",
     "Backend replies or stream events of a translated protocol (Anthropic, gRPC) that sluice could not read."},
    {stat::shed_connections, "sluice_shed_connections_total", family_type::counter, "",
     "Connections refused over server.connections_max."},
    {stat::shed_requests, "sluice_shed_requests_total", family_type::counter, "reason=\"inflight\"",
     "Requests refused with 503 + retry-after, by cap: server.inflight_max, upstream.connections_max, "
     "server.memory_max_bytes."},
    {stat::shed_upstream_pool, "sluice_shed_requests_total", family_type::counter, "reason=\"upstream_pool\"", ""},
    {stat::shed_memory, "sluice_shed_requests_total", family_type::counter, "reason=\"memory\"", ""},
    {stat::audit_written, "sluice_audit_lines_total", family_type::counter, "result=\"written\"",
     "Audit lines by fate: written (on disk), dropped (buffers full at their bound, or no file), lost (a failed "
     "write)."},
    {stat::audit_dropped, "sluice_audit_lines_total", family_type::counter, "result=\"dropped\"", ""},
    {stat::audit_lost, "sluice_audit_lines_total", family_type::counter, "result=\"lost\"", ""},
    {stat::audit_write_errors, "sluice_audit_write_errors_total", family_type::counter, "",
     "Audit writes that failed (each is retried after a backoff; the lines are kept)."},
    {stat::audit_fsyncs, "sluice_audit_fsyncs_total", family_type::counter, "result=\"ok\"",
     "Audit fdatasyncs ([audit] fsync_interval_ms), by result."},
    {stat::audit_fsync_errors, "sluice_audit_fsyncs_total", family_type::counter, "result=\"failed\"", ""},
    {stat::memory_bytes, "sluice_connection_memory_bytes", family_type::gauge, "",
     "Connection objects and buffers held by the shards."},
    {stat::h2_connections, "sluice_h2_connections_total", family_type::counter, "",
     "Client connections that spoke HTTP/2 (h2c with prior knowledge, or ALPN h2)."},
    {stat::h2_streams, "sluice_h2_streams_total", family_type::counter, "", "HTTP/2 request streams opened."},
    {stat::h2_refused_streams, "sluice_h2_refused_streams_total", family_type::counter, "",
     "HTTP/2 streams refused over SETTINGS_MAX_CONCURRENT_STREAMS (server.h2_max_concurrent_streams)."},
    {stat::h2_client_resets, "sluice_h2_client_resets_total", family_type::counter, "", "RST_STREAM frames from clients."},
    {stat::h2_rapid_resets, "sluice_h2_defence_goaways_total", family_type::counter, "reason=\"rapid_reset\"",
     "HTTP/2 connections ended with GOAWAY by a defence: rapid or provoked resets, CONTINUATION floods, SETTINGS / "
     "PING floods, HPACK bombs, the per-connection memory cap, other protocol errors."},
    {stat::h2_continuation_floods, "sluice_h2_defence_goaways_total", family_type::counter, "reason=\"continuation_flood\"", ""},
    {stat::h2_control_floods, "sluice_h2_defence_goaways_total", family_type::counter, "reason=\"control_flood\"", ""},
    {stat::h2_hpack_bombs, "sluice_h2_defence_goaways_total", family_type::counter, "reason=\"hpack_bomb\"", ""},
    {stat::h2_memory_refusals, "sluice_h2_defence_goaways_total", family_type::counter, "reason=\"memory\"", ""},
    {stat::h2_protocol_errors, "sluice_h2_defence_goaways_total", family_type::counter, "reason=\"protocol_error\"", ""},
    {stat::h2_header_lists_too_large, "sluice_h2_header_lists_too_large_total", family_type::counter, "",
     "HTTP/2 requests answered 431: the header list passed server.max_head_bytes."},
    {stat::tls_handshakes, "sluice_tls_handshakes_total", family_type::counter, "result=\"ok\"", "TLS handshakes, by result."},
    {stat::tls_handshake_errors, "sluice_tls_handshakes_total", family_type::counter, "result=\"failed\"", ""},
    {stat::tls_ktls_connections, "sluice_tls_ktls_connections_total", family_type::counter, "path=\"ktls\"",
     "TLS connections by how their records are encrypted: ktls (the kernel) or copy (OpenSSL, in user space)."},
    {stat::tls_copy_connections, "sluice_tls_ktls_connections_total", family_type::counter, "path=\"copy\"", ""},
    {stat::edge_protocol_mismatches, "sluice_edge_protocol_mismatches_total", family_type::counter, "",
     "Connections that spoke the wrong protocol for their port (plaintext HTTP on the TLS port, a ClientHello on "
     "the plaintext one): answered or closed at once."},
    {stat::router_embeddings_ok, "sluice_router_embeddings_calls_total", family_type::counter, "result=\"ok\"",
     "The embeddings router's /v1/embeddings calls, by result: ok, failed (connect, status, reply, no backend up), "
     "timeout ([router] embeddings_timeout_ms), busy (every call slot of the shard in use: not made). Each one "
     "not ok left the decision to the classifier."},
    {stat::router_embeddings_failed, "sluice_router_embeddings_calls_total", family_type::counter, "result=\"failed\"", ""},
    {stat::router_embeddings_timeouts, "sluice_router_embeddings_calls_total", family_type::counter, "result=\"timeout\"", ""},
    {stat::router_embeddings_busy, "sluice_router_embeddings_calls_total", family_type::counter, "result=\"busy\"", ""},
    {stat::router_embeddings_cache_hits, "sluice_router_embeddings_cache_total", family_type::counter, "result=\"hit\"",
     "Auto-model decisions in embeddings mode by the shard's cache: hit (decided from an earlier call's answer) or "
     "miss (a call was needed)."},
    {stat::router_embeddings_cache_misses, "sluice_router_embeddings_cache_total", family_type::counter, "result=\"miss\"", ""},
    {stat::responses_stored, "sluice_responses_stored_total", family_type::counter, "result=\"kept\"",
     "[responses] store: rendered Responses replies sent to the store to keep (kept), or not sent because the "
     "shard's queue to it was full (dropped)."},
    {stat::responses_store_dropped, "sluice_responses_stored_total", family_type::counter, "result=\"dropped\"", ""},
};

}  // namespace

uint64_t registry::sum(stat s) const noexcept {
  uint64_t t = 0;
  for (const shard_metrics& m : _shards) t += m.at(s).get();
  return t;
}

void registry::render(std::string& out) const {
  auto it = std::back_inserter(out);
  std::string_view family;
  for (const stat_row& r : k_stat_rows) {
    if (r.family != family) {
      family = r.family;
      put_family_head(out, r.family, r.type, r.help);
    }
    if (*r.label != '\0') {
      fmt::format_to(it, "{}{{{}}} {}\n", r.family, r.label, sum(r.s));
    } else {
      fmt::format_to(it, "{} {}\n", r.family, sum(r.s));
    }
  }
  // Rows in use: the named ones, then the `none` row (index = capacity).
  auto rows = [](size_t named, size_t capacity) {
    std::vector<size_t> r(named);
    for (size_t i = 0; i < named; ++i) r[i] = i;
    r.push_back(capacity);
    return r;
  };
  const std::vector<size_t> group_rows = rows(_names.groups.size(), _group_rows);
  const std::vector<size_t> backend_rows = rows(_names.backends.size(), _backend_rows);
  const size_t b = _backend_rows + 1;
  auto sum = [&](counter* shard_metrics::*field, size_t index) {
    uint64_t t = 0;
    for (const shard_metrics& m : _shards) t += (m.*field)[index].get();
    return t;
  };

  put_family_head(out, "sluice_requests_total", family_type::counter,
             "Requests answered, by model group, backend (and its protocol) and status code.");
  for (size_t gi : group_rows) {
    for (size_t bi : backend_rows) {
      for (size_t ci = 0; ci < status_code_count; ++ci) {
        const uint64_t v = sum(&shard_metrics::_requests, (gi * b + bi) * status_code_count + ci);
        if (v == 0) continue;
        out += "sluice_requests_total{group=\"";
        put_label_value(out, name_or_none(_names.groups, gi));
        out += "\",backend=\"";
        put_label_value(out, name_or_none(_names.backends, bi));
        out += "\",protocol=\"";
        put_label_value(out, name_or_none(_names.backend_protocols, bi));
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

  put_family_head(out, "sluice_tokens_total", family_type::counter, "Tokens by model group and kind, from the backends' usage.");
  static constexpr std::string_view kinds[token_kind_count] = {"prompt", "completion"};
  for (size_t gi : group_rows) {
    const uint64_t v0 = sum(&shard_metrics::_tokens, gi * token_kind_count);
    const uint64_t v1 = sum(&shard_metrics::_tokens, gi * token_kind_count + 1);
    if (gi == _group_rows && v0 == 0 && v1 == 0) continue;  // the no-group slot only when used
    for (size_t ki = 0; ki < token_kind_count; ++ki) {
      out += "sluice_tokens_total{group=\"";
      put_label_value(out, name_or_none(_names.groups, gi));
      fmt::format_to(it, "\",kind=\"{}\"}} {}\n", kinds[ki], ki == 0 ? v0 : v1);
    }
  }

  put_family_head(out, "sluice_router_decisions_total", family_type::counter,
             "Auto-model requests by the group the router picked and how (rule, classifier, default, sticky).");
  for (size_t gi : group_rows) {
    for (size_t hi = 0; hi < router_how_count; ++hi) {
      const uint64_t v = sum(&shard_metrics::_decisions, gi * router_how_count + hi);
      if (v == 0) continue;
      out += "sluice_router_decisions_total{group=\"";
      put_label_value(out, name_or_none(_names.groups, gi));
      fmt::format_to(it, "\",how=\"{}\"}} {}\n", router_how_names[hi], v);
    }
  }

  put_family_head(out, "sluice_dialect_requests_total", family_type::counter,
             "Answered requests by group and the client's dialect (chat, completions, embeddings, responses, messages).");
  for (size_t gi : group_rows) {
    for (size_t di = 0; di < dialect_count; ++di) {
      const uint64_t v = sum(&shard_metrics::_dialects, gi * dialect_count + di);
      if (v == 0) continue;
      out += "sluice_dialect_requests_total{group=\"";
      put_label_value(out, name_or_none(_names.groups, gi));
      fmt::format_to(it, "\",dialect=\"{}\"}} {}\n", dialect_names[di], v);
    }
  }

  // A key given new limits by a reload is a new row under the same id:
  // its rows are summed, so each key id is one series. key_rows: the first
  // row of each id, then the `none` row; same[first]: every row of the id.
  std::vector<size_t> key_rows;
  std::vector<std::vector<size_t>> same(_names.keys.size() + 1);
  {
    std::unordered_map<std::string_view, size_t> first_row;
    for (size_t ki = 0; ki < _names.keys.size(); ++ki) {
      auto [pos, fresh] = first_row.emplace(_names.keys[ki], ki);
      if (fresh) key_rows.push_back(ki);
      same[pos->second].push_back(ki);
    }
    key_rows.push_back(_key_rows);
    same.back().push_back(_key_rows);
  }
  auto key_sum = [&](size_t ki, counter* shard_metrics::*field, size_t width, size_t col) {
    uint64_t v = 0;
    for (size_t row : same[ki == _key_rows ? same.size() - 1 : ki]) v += sum(field, row * width + col);
    return v;
  };

  put_family_head(out, "sluice_quota_rejected_total", family_type::counter, "Requests rejected by quota, by key id and reason.");
  static constexpr std::string_view reasons[reject_reason_count] = {"tokens", "requests", "concurrency", "too_large"};
  for (size_t ki : key_rows) {
    for (size_t ri = 0; ri < reject_reason_count; ++ri) {
      const uint64_t v = key_sum(ki, &shard_metrics::_rejected, reject_reason_count, ri);
      if (v == 0) continue;
      out += "sluice_quota_rejected_total{key=\"";
      put_label_value(out, name_or_none(_names.keys, ki));
      fmt::format_to(it, "\",reason=\"{}\"}} {}\n", reasons[ri], v);
    }
  }

  // Per key only where used: a gateway with many keys and little traffic
  // writes few lines. key="" is every request without a valid key.
  constexpr size_t kw = shard_metrics::key_usage_width;
  put_family_head(out, "sluice_key_requests_total", family_type::counter, "Requests answered, by key id (never the key).");
  for (size_t ki : key_rows) {
    const uint64_t v = key_sum(ki, &shard_metrics::_key_usage, kw, 0);
    if (v == 0) continue;
    out += "sluice_key_requests_total{key=\"";
    put_label_value(out, name_or_none(_names.keys, ki));
    fmt::format_to(it, "\"}} {}\n", v);
  }
  put_family_head(out, "sluice_key_tokens_total", family_type::counter, "Tokens billed, by key id and kind, from the backends' usage.");
  for (size_t ki : key_rows) {
    const uint64_t v0 = key_sum(ki, &shard_metrics::_key_usage, kw, 1);
    const uint64_t v1 = key_sum(ki, &shard_metrics::_key_usage, kw, 2);
    if ((v0 | v1) == 0) continue;
    for (size_t t = 0; t < token_kind_count; ++t) {
      out += "sluice_key_tokens_total{key=\"";
      put_label_value(out, name_or_none(_names.keys, ki));
      fmt::format_to(it, "\",kind=\"{}\"}} {}\n", kinds[t], t == 0 ? v0 : v1);
    }
  }

  // Fair admission, per key only where used: requests that waited for a
  // slot, and how long (ms stored, seconds written).
  auto per_key = [&](std::string_view name, std::string_view help, size_t col, bool ms) {
    put_family_head(out, name, family_type::counter, help);
    for (size_t ki : key_rows) {
      const uint64_t v = key_sum(ki, &shard_metrics::_key_usage, kw, col);
      if (v == 0) continue;
      fmt::format_to(it, "{}{{key=\"", name);
      put_label_value(out, name_or_none(_names.keys, ki));
      if (ms) {
        fmt::format_to(it, "\"}} {:.3f}\n", static_cast<double>(v) / 1e3);
      } else {
        fmt::format_to(it, "\"}} {}\n", v);
      }
    }
  };
  per_key("sluice_key_queued_total", "Requests that waited in a fair-admission queue, by key id.", 3, false);
  per_key("sluice_key_queued_seconds_total", "Time requests waited in fair-admission queues, by key id.", 4, true);

  put_family_head(out, "sluice_admission_queue_depth", family_type::gauge,
             "Requests waiting at the gateway for a slot of a group with admission = \"fair\".");
  for (size_t gi : group_rows) {
    if (gi == _group_rows) continue;
    out += "sluice_admission_queue_depth{group=\"";
    put_label_value(out, name_or_none(_names.groups, gi));
    fmt::format_to(it, "\"}} {}\n", queue_depth(static_cast<uint32_t>(gi)));
  }

  put_family_head(out, "sluice_inflight_requests", family_type::gauge, "Requests in flight.");
  fmt::format_to(it, "sluice_inflight_requests {}\n", inflight());

  put_family_head(out, "sluice_backend_up", family_type::gauge, "1 when the backend passes health checks, else 0.");
  for (size_t bi = 0; bi < _names.backends.size(); ++bi) {
    out += "sluice_backend_up{backend=\"";
    put_label_value(out, _names.backends[bi]);
    out += "\",protocol=\"";
    put_label_value(out, name_or_none(_names.backend_protocols, bi));
    fmt::format_to(it, "\"}} {}\n", _backend_up[bi].get());
  }
  auto per_backend = [&](std::string_view name, size_t col) {
    for (size_t bi = 0; bi < _names.backends.size(); ++bi) {
      uint64_t v[2];
      backend_load(static_cast<uint32_t>(bi), v[0], v[1]);
      fmt::format_to(it, "{}{{backend=\"", name);
      put_label_value(out, _names.backends[bi]);
      out += "\",protocol=\"";
      put_label_value(out, name_or_none(_names.backend_protocols, bi));
      fmt::format_to(it, "\"}} {}\n", v[col]);
    }
  };
  put_family_head(out, "sluice_backend_inflight", family_type::gauge, "Requests sluice has open to the backend now, every shard.");
  per_backend("sluice_backend_inflight", 0);
  put_family_head(out, "sluice_backend_failures_total", family_type::counter,
             "Failures sluice attributed to the backend: connect errors, resets, timeouts, replies it could not read.");
  per_backend("sluice_backend_failures_total", 1);

  auto histogram = [&](std::string_view name, std::string_view help, counter* shard_metrics::*field) {
    put_family_head(out, name, family_type::histogram, help);
    constexpr size_t w = shard_metrics::histogram_width;
    for (size_t gi : group_rows) {
      uint64_t row[w] = {};
      for (size_t i = 0; i < w; ++i) row[i] = sum(field, gi * w + i);
      uint64_t count = 0;
      for (size_t i = 0; i < latency_bucket_count; ++i) count += row[i];
      if (gi == _group_rows && count == 0) continue;
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
  histogram("sluice_admission_wait_seconds", "Time a request waited at the gateway for a slot (admission = \"fair\").",
            &shard_metrics::_queue_wait);

  put_family_head(out, "sluice_loop_iterations_total", family_type::counter, "Reactor loop iterations per shard.");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_iterations_total{{shard=\"{}\"}} {}\n", s, _shards[s]._loop[0].get());
  }
  put_family_head(out, "sluice_loop_cqes_total", family_type::counter, "Completions handled per shard.");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_cqes_total{{shard=\"{}\"}} {}\n", s, _shards[s]._loop[1].get());
  }
  put_family_head(out, "sluice_loop_polls_total", family_type::counter,
             "Polls for a completion before sleeping (server.idle_poll_us), by whether one came in time.");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_polls_total{{shard=\"{}\",result=\"caught\"}} {}\n", s, _shards[s]._loop[2].get());
    fmt::format_to(it, "sluice_loop_polls_total{{shard=\"{}\",result=\"missed\"}} {}\n", s, _shards[s]._loop[3].get());
  }
  put_family_head(out, "sluice_loop_poll_seconds_total", family_type::counter, "Time spent polling for completions instead of sleeping.");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_poll_seconds_total{{shard=\"{}\"}} {:.6f}\n", s,
                   static_cast<double>(_shards[s]._loop[4].get()) / 1e9);
  }
  put_family_head(out, "sluice_loop_batched_waits_total", family_type::counter,
             "Waits that asked for a batch of completions while many requests were open (server.batch_wait_us).");
  for (size_t s = 0; s < _shards.size(); ++s) {
    fmt::format_to(it, "sluice_loop_batched_waits_total{{shard=\"{}\"}} {}\n", s, _shards[s]._loop[5].get());
  }
}

}  // namespace sluice::metrics
