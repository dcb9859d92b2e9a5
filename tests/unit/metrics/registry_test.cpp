#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>

#include <atomic>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "sluice/metrics/registry.hpp"

using namespace sluice::metrics;

namespace {

// A strict reader of Prometheus text exposition format 0.0.4, as far as
// sluice writes it: every sample line is `name{labels} value`; each family has
// one HELP and one TYPE line before its samples and its samples are
// contiguous; label values use only the \\ \" \n escapes; no sample appears
// twice; histogram buckets are cumulative, ordered by `le`, end with +Inf, and
// +Inf equals _count. Any violation fails the test with the offending line.
struct exposition {
  std::map<std::string, std::string> types;          // family → type
  std::map<std::string, double> samples;             // "name{a=\"x\",b=\"y\"}" → value
  std::vector<std::string> family_order;
};

bool valid_name(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Parses `{a="x",b="y"}` at s[pos]; returns label pairs (unescaped).
std::vector<std::pair<std::string, std::string>> parse_labels(const std::string& line, size_t& pos) {
  std::vector<std::pair<std::string, std::string>> out;
  REQUIRE_MESSAGE(line[pos] == '{', line);
  ++pos;
  while (true) {
    REQUIRE_MESSAGE(pos < line.size(), line);
    if (line[pos] == '}') {
      ++pos;
      return out;
    }
    if (!out.empty()) {
      REQUIRE_MESSAGE(line[pos] == ',', line);
      ++pos;
    }
    const size_t eq = line.find('=', pos);
    REQUIRE_MESSAGE(eq != std::string::npos, line);
    std::string name = line.substr(pos, eq - pos);
    REQUIRE_MESSAGE(valid_name(name), line);
    pos = eq + 1;
    REQUIRE_MESSAGE(line[pos] == '"', line);
    ++pos;
    std::string value;
    while (true) {
      REQUIRE_MESSAGE(pos < line.size(), line);
      const char c = line[pos++];
      if (c == '"') break;
      REQUIRE_MESSAGE(c != '\n', line);
      if (c == '\\') {
        REQUIRE_MESSAGE(pos < line.size(), line);
        const char e = line[pos++];
        REQUIRE_MESSAGE((e == '\\' || e == '"' || e == 'n'), line);
        value += e == 'n' ? '\n' : e;
      } else {
        value += c;
      }
    }
    for (const auto& [n, v] : out) REQUIRE_MESSAGE(n != name, line);
    out.emplace_back(std::move(name), std::move(value));
  }
}

double parse_value(const std::string& line, std::string_view v) {
  REQUIRE_MESSAGE(!v.empty(), line);
  if (v == "+Inf") return 1e308 * 10;
  std::string s(v);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  REQUIRE_MESSAGE(end == s.c_str() + s.size(), line);
  return d;
}

std::string family_of(const exposition& x, const std::string& sample_name) {
  if (x.types.count(sample_name) != 0) return sample_name;
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (sample_name.size() > suffix.size() && sample_name.ends_with(suffix)) {
      std::string base = sample_name.substr(0, sample_name.size() - suffix.size());
      auto it = x.types.find(base);
      if (it != x.types.end() && it->second == "histogram") return base;
    }
  }
  return {};
}

std::string key_of(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels) {
  std::string k = name + "{";
  for (size_t i = 0; i < labels.size(); ++i) k += (i ? "," : "") + labels[i].first + "=\"" + labels[i].second + "\"";
  return k + "}";
}

exposition parse_exposition(const std::string& text) {
  exposition x;
  REQUIRE(!text.empty());
  REQUIRE(text.back() == '\n');
  std::set<std::string> helped, closed;
  std::string current;  // family whose samples are being read
  // histogram series (name without le) → [(le, value)], plus counts
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;
  std::map<std::string, double> counts, sums;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    const std::string line = text.substr(start, nl - start);
    start = nl + 1;
    REQUIRE_MESSAGE(!line.empty(), "empty line");
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
      const bool help = line[2] == 'H';
      const size_t sp = line.find(' ', 7);
      REQUIRE_MESSAGE(sp != std::string::npos, line);
      const std::string name = line.substr(7, sp - 7);
      REQUIRE_MESSAGE(valid_name(name), line);
      REQUIRE_MESSAGE(closed.count(name) == 0, line);  // samples of it already ended
      if (help) {
        REQUIRE_MESSAGE(helped.insert(name).second, line);
      } else {
        const std::string type = line.substr(sp + 1);
        REQUIRE_MESSAGE((type == "counter" || type == "gauge" || type == "histogram"), line);
        REQUIRE_MESSAGE(x.types.emplace(name, type).second, line);
        x.family_order.push_back(name);
        if (!current.empty()) closed.insert(current);
        current = name;
      }
      continue;
    }
    REQUIRE_MESSAGE(line[0] != '#', line);
    size_t pos = 0;
    while (pos < line.size() && line[pos] != '{' && line[pos] != ' ') ++pos;
    const std::string name = line.substr(0, pos);
    REQUIRE_MESSAGE(valid_name(name), line);
    std::vector<std::pair<std::string, std::string>> labels;
    if (line[pos] == '{') labels = parse_labels(line, pos);
    REQUIRE_MESSAGE(line[pos] == ' ', line);
    const double value = parse_value(line, std::string_view(line).substr(pos + 1));
    const std::string family = family_of(x, name);
    REQUIRE_MESSAGE(!family.empty(), ("sample without TYPE: " + line));
    REQUIRE_MESSAGE(family == current, ("samples of a family not contiguous: " + line));
    REQUIRE_MESSAGE(helped.count(family) == 1, ("sample without HELP: " + line));
    REQUIRE_MESSAGE(x.samples.emplace(key_of(name, labels), value).second, ("duplicate sample: " + line));
    if (x.types[family] == "counter") {
      REQUIRE_MESSAGE(name.ends_with("_total"), line);
      REQUIRE_MESSAGE(value >= 0, line);
    }
    if (x.types[family] == "histogram") {
      std::vector<std::pair<std::string, std::string>> rest;
      std::string le;
      for (auto& l : labels) {
        if (l.first == "le") {
          le = l.second;
        } else {
          rest.push_back(l);
        }
      }
      const std::string series = key_of(family, rest);
      if (name.ends_with("_bucket")) {
        REQUIRE_MESSAGE(!le.empty(), line);
        buckets[series].emplace_back(parse_value(line, le), value);
      } else {
        REQUIRE_MESSAGE(le.empty(), line);
        (name.ends_with("_count") ? counts : sums)[series] = value;
      }
    }
  }
  for (const auto& [series, b] : buckets) {
    CAPTURE(series);
    REQUIRE(!b.empty());
    for (size_t i = 1; i < b.size(); ++i) {
      CHECK(b[i].first > b[i - 1].first);    // le ascending
      CHECK(b[i].second >= b[i - 1].second);  // cumulative
    }
    CHECK(b.back().first > 1e308);  // last is +Inf
    REQUIRE(counts.count(series) == 1);
    REQUIRE(sums.count(series) == 1);
    CHECK(counts[series] == b.back().second);
  }
  CHECK(counts.size() == buckets.size());
  return x;
}

double sample(const exposition& x, const std::string& key) {
  auto it = x.samples.find(key);
  REQUIRE_MESSAGE(it != x.samples.end(), key);
  return it->second;
}

// b0 speaks openai, b1 anthropic: every series naming a backend says so.
registry::names small_names() {
  return registry::names{{"g0", "g1"}, {"http://b0:8000", "http://b1:8000"}, {"alice", "bob"}, {"openai", "anthropic"}};
}

std::string render(const registry& r) {
  std::string out;
  r.render(out);
  return out;
}

}  // namespace

TEST_SUITE("metrics::registry") {
  TEST_CASE("a shard's stats are summed over the shards, by family and label") {
    registry r(3, small_names());
    r.shard(0).at(stat::upstream_retries).add(2);
    r.shard(2).at(stat::upstream_retries).add(5);
    r.shard(1).at(stat::shed_memory).add();
    r.shard(1).at(stat::connections_open).add(4);
    r.shard(1).at(stat::connections_open).sub(1);
    r.shard(0).at(stat::requests_inflight).add(9);  // internal: never rendered
    CHECK(r.sum(stat::upstream_retries) == 7);
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, "sluice_upstream_retries_total{}") == 7);
    CHECK(sample(x, R"(sluice_shed_requests_total{reason="memory"})") == 1);
    CHECK(sample(x, R"(sluice_shed_requests_total{reason="inflight"})") == 0);
    CHECK(sample(x, "sluice_connections_open{}") == 3);
    CHECK(x.types.at("sluice_connections_open") == "gauge");
    CHECK(render(r).find("inflight\"} 9") == std::string::npos);
  }

  TEST_CASE("a fresh registry renders every family as valid exposition text") {
    registry r(3, small_names());
    const exposition x = parse_exposition(render(r));
    const std::vector<std::string> expected = {
        "sluice_connections_accepted_total", "sluice_connections_open", "sluice_requests_received_total",
        "sluice_responses_total", "sluice_local_errors_total", "sluice_upstream_requests_total",
        "sluice_upstream_connect_errors_total", "sluice_upstream_retries_total", "sluice_upstream_timeouts_total",
        "sluice_upstream_reset_after_send_total", "sluice_upstream_truncated_total", "sluice_downstream_aborts_total",
        "sluice_client_stalls_total", "sluice_upstream_buffer_fallbacks_total", "sluice_usage_chunks_cut_total", "sluice_usage_cut_failed_total",
        "sluice_sse_chunks_skipped_total",
        "sluice_upstream_bad_replies_total",
        "sluice_shed_connections_total", "sluice_shed_requests_total", "sluice_audit_lines_total",
        "sluice_audit_write_errors_total", "sluice_audit_fsyncs_total",
        "sluice_connection_memory_bytes", "sluice_h2_connections_total", "sluice_h2_streams_total",
        "sluice_h2_refused_streams_total", "sluice_h2_client_resets_total", "sluice_h2_defence_goaways_total",
        "sluice_h2_header_lists_too_large_total", "sluice_tls_handshakes_total", "sluice_tls_ktls_connections_total",
        "sluice_edge_protocol_mismatches_total", "sluice_router_embeddings_calls_total",
        "sluice_router_embeddings_cache_total", "sluice_responses_stored_total",
        "sluice_requests_total",         "sluice_tokens_total",        "sluice_router_decisions_total",
        "sluice_dialect_requests_total", "sluice_quota_rejected_total",   "sluice_key_requests_total",  "sluice_key_tokens_total",
        "sluice_key_queued_total", "sluice_key_queued_seconds_total", "sluice_admission_queue_depth",
        "sluice_inflight_requests",      "sluice_backend_up",          "sluice_backend_inflight",
        "sluice_backend_failures_total", "sluice_ttft_seconds",
        "sluice_request_duration_seconds", "sluice_admission_wait_seconds", "sluice_loop_iterations_total", "sluice_loop_cqes_total",
        "sluice_loop_polls_total",       "sluice_loop_poll_seconds_total", "sluice_loop_batched_waits_total"};
    CHECK(x.family_order == expected);
    CHECK(x.types.at("sluice_router_decisions_total") == "counter");
    CHECK(x.types.at("sluice_dialect_requests_total") == "counter");
    CHECK(x.types.at("sluice_ttft_seconds") == "histogram");
    CHECK(x.types.at("sluice_inflight_requests") == "gauge");
    CHECK(sample(x, "sluice_tokens_total{group=\"g1\",kind=\"completion\"}") == 0);
    CHECK(sample(x, "sluice_backend_up{backend=\"http://b1:8000\",protocol=\"anthropic\"}") == 0);
    CHECK(sample(x, "sluice_ttft_seconds_count{group=\"g0\"}") == 0);
    CHECK(sample(x, R"(sluice_backend_inflight{backend="http://b0:8000",protocol="openai"})") == 0);
    CHECK(sample(x, R"(sluice_backend_failures_total{backend="http://b1:8000",protocol="anthropic"})") == 0);
    CHECK(x.samples.count(R"(sluice_key_requests_total{key="alice"})") == 0);  // only keys that were used
    CHECK(sample(x, "sluice_loop_cqes_total{shard=\"2\"}") == 0);
    CHECK(sample(x, R"(sluice_loop_polls_total{shard="2",result="missed"})") == 0);
    CHECK(sample(x, R"(sluice_loop_poll_seconds_total{shard="0"})") == 0);
    CHECK(sample(x, R"(sluice_loop_batched_waits_total{shard="1"})") == 0);
  }

  TEST_CASE("counters written on several shards are summed at scrape time") {
    registry r(3, small_names());
    for (size_t s = 0; s < 3; ++s) {
      shard_metrics& m = r.shard(s);
      for (size_t i = 0; i <= s; ++i) m.request_done(0, 1, 200);  // 1 + 2 + 3
      m.request_done(1, 0, 429);
      m.tokens(1, 10 * (s + 1), 100);
      m.quota_rejected(1, reject_reason::tokens);
      m.router_decision(1, 1);  // classifier
      m.dialect_done(1, 4);     // messages
      m.inflight_add();
      m.set_loop(1000 + s, 2000 + s, 30 + s, 40 + s, 1'500'000'000 * (s + 1), 70 + s);
    }
    r.shard(0).quota_rejected(0, reject_reason::too_large);
    r.shard(1).router_decision(0, 3);  // sticky
    r.shard(2).inflight_sub();
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_requests_total{group="g0",backend="http://b1:8000",protocol="anthropic",code="200"})") == 6);
    CHECK(sample(x, R"(sluice_requests_total{group="g1",backend="http://b0:8000",protocol="openai",code="429"})") == 3);
    CHECK(sample(x, R"(sluice_tokens_total{group="g1",kind="prompt"})") == 60);
    CHECK(sample(x, R"(sluice_tokens_total{group="g1",kind="completion"})") == 300);
    CHECK(sample(x, R"(sluice_tokens_total{group="g0",kind="prompt"})") == 0);
    CHECK(sample(x, R"(sluice_quota_rejected_total{key="bob",reason="tokens"})") == 3);
    CHECK(sample(x, R"(sluice_quota_rejected_total{key="alice",reason="too_large"})") == 1);
    CHECK(sample(x, R"(sluice_router_decisions_total{group="g1",how="classifier"})") == 3);
    CHECK(sample(x, R"(sluice_router_decisions_total{group="g0",how="sticky"})") == 1);
    CHECK(x.samples.count(R"(sluice_router_decisions_total{group="g0",how="rule"})") == 0);
    CHECK(sample(x, R"(sluice_dialect_requests_total{group="g1",dialect="messages"})") == 3);
    CHECK(x.samples.count(R"(sluice_dialect_requests_total{group="g1",dialect="chat"})") == 0);
    CHECK(sample(x, "sluice_inflight_requests{}") == 2);
    CHECK(sample(x, R"(sluice_loop_iterations_total{shard="1"})") == 1001);
    CHECK(sample(x, R"(sluice_loop_cqes_total{shard="2"})") == 2002);
    // Per shard, not summed: polls by result, and the time they took.
    CHECK(sample(x, R"(sluice_loop_polls_total{shard="1",result="caught"})") == 31);
    CHECK(sample(x, R"(sluice_loop_polls_total{shard="2",result="missed"})") == 42);
    CHECK(sample(x, R"(sluice_loop_poll_seconds_total{shard="1"})") == doctest::Approx(3.0));
    CHECK(sample(x, R"(sluice_loop_batched_waits_total{shard="2"})") == 72);
    // Zero series of the sparse families are left out.
    CHECK(x.samples.count(R"(sluice_requests_total{group="g0",backend="http://b0:8000",protocol="openai",code="200"})") == 0);
    CHECK(x.samples.count(R"(sluice_quota_rejected_total{key="alice",reason="tokens"})") == 0);
  }

  TEST_CASE("per key: requests and billed tokens; per backend: in flight now and failures; every shard summed") {
    registry r(2, small_names());
    r.shard(0).key_done(1, 10, 20);
    r.shard(1).key_done(1, 1, 2);
    r.shard(1).key_done(1, 0, 0);     // answered, nothing billed (a 4xx)
    r.shard(0).key_done(none, 0, 0);  // no key (401)
    for (size_t s = 0; s < 2; ++s) {
      r.shard(s).backend_started(0);
      r.shard(s).backend_started(0);
      r.shard(s).backend_started(1);
    }
    r.shard(1).backend_ended(0);
    r.shard(0).backend_failed(1);
    r.shard(1).backend_failed(1);
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_key_requests_total{key="bob"})") == 3);
    CHECK(sample(x, R"(sluice_key_requests_total{key=""})") == 1);
    CHECK(x.samples.count(R"(sluice_key_requests_total{key="alice"})") == 0);
    CHECK(sample(x, R"(sluice_key_tokens_total{key="bob",kind="prompt"})") == 11);
    CHECK(sample(x, R"(sluice_key_tokens_total{key="bob",kind="completion"})") == 22);
    CHECK(x.samples.count(R"(sluice_key_tokens_total{key="",kind="prompt"})") == 0);
    CHECK(sample(x, R"(sluice_backend_inflight{backend="http://b0:8000",protocol="openai"})") == 3);
    CHECK(sample(x, R"(sluice_backend_inflight{backend="http://b1:8000",protocol="anthropic"})") == 2);
    CHECK(sample(x, R"(sluice_backend_failures_total{backend="http://b1:8000",protocol="anthropic"})") == 2);
    CHECK(sample(x, R"(sluice_backend_failures_total{backend="http://b0:8000",protocol="openai"})") == 0);
    uint64_t inflight = 0, failures = 0, usage[registry::key_usage_width] = {};
    r.backend_load(1, inflight, failures);
    CHECK(inflight == 2);
    CHECK(failures == 2);
    r.key_usage(1, usage);
    CHECK(usage[0] == 3);
    CHECK(usage[1] == 11);
    CHECK(usage[2] == 22);
    r.key_usage(static_cast<uint32_t>(r.key_capacity()), usage);  // the `none` row
    CHECK(usage[0] == 1);
  }

  TEST_CASE("fair admission: queue depth per group, waits per group and per key, every shard summed") {
    registry r(2, small_names());
    r.shard(0).queue_depth_add(1);
    r.shard(1).queue_depth_add(1);
    r.shard(1).queue_depth_add(1);
    r.shard(1).queue_depth_sub(1);
    r.shard(0).observe_queue_wait_us(1, 40'000);
    r.shard(1).observe_queue_wait_us(1, 2'000'000);
    r.shard(0).key_queued(0, 40);
    r.shard(1).key_queued(0, 2000);
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_admission_queue_depth{group="g1"})") == 2);
    CHECK(sample(x, R"(sluice_admission_queue_depth{group="g0"})") == 0);
    CHECK(r.queue_depth(1) == 2);
    CHECK(sample(x, R"(sluice_admission_wait_seconds_count{group="g1"})") == 2);
    CHECK(sample(x, R"(sluice_admission_wait_seconds_bucket{group="g1",le="0.05"})") == 1);
    CHECK(sample(x, R"(sluice_admission_wait_seconds_sum{group="g1"})") == doctest::Approx(2.04));
    CHECK(sample(x, R"(sluice_key_queued_total{key="alice"})") == 2);
    CHECK(sample(x, R"(sluice_key_queued_seconds_total{key="alice"})") == doctest::Approx(2.04));
    CHECK(x.samples.count(R"(sluice_key_queued_total{key="bob"})") == 0);
    CHECK(x.types.at("sluice_admission_queue_depth") == "gauge");
    CHECK(x.types.at("sluice_admission_wait_seconds") == "histogram");
    uint64_t usage[registry::key_usage_width];
    std::fill(std::begin(usage), std::end(usage), ~uint64_t{0});  // what the caller's array held is replaced, not added to
    r.key_usage(0, usage);
    CHECK(usage[0] == 0);
    CHECK(usage[3] == 2);
    CHECK(usage[4] == 2040);
    std::fill(std::begin(usage), std::end(usage), uint64_t{7});
    r.key_usage(1, usage);  // a key that never queued
    CHECK(usage[3] == 0);
    CHECK(usage[4] == 0);
  }

  TEST_CASE("a group's totals sum its answers over shards and backends, its tokens and histograms") {
    // Room for reloads: rows past the named ones are read as nothing.
    registry r(2, small_names(), registry::room{2, 4, 0});
    for (size_t s = 0; s < 2; ++s) {
      shard_metrics& m = r.shard(s);
      m.request_done(1, 0, 200);
      m.request_done(1, 1, 503);
      m.request_done(1, none, 429);  // before a backend was picked
      m.request_done(0, 0, 200);     // another group
      m.tokens(1, 5, 7);
      m.observe_ttft_us(1, 3000);      // (2.5 ms, 5 ms]
      m.observe_duration_us(1, 200'000);  // (100 ms, 250 ms]
      m.request_done(none, none, 401);
      m.set_loop(10 + s, 20, 1, 2, 3);
    }
    std::vector<uint64_t> t(totals_width, 0);
    r.add_group_totals(1, t.data());
    CHECK(t[totals_codes + status_index(200)] == 2);
    CHECK(t[totals_codes + status_index(503)] == 2);
    CHECK(t[totals_codes + status_index(429)] == 2);
    CHECK(t[totals_codes + status_index(401)] == 0);
    CHECK(t[totals_tokens] == 10);
    CHECK(t[totals_tokens + 1] == 14);
    CHECK(t[totals_ttft + 2] == 2);
    CHECK(t[totals_duration + 7] == 2);
    // Added to what is there: the no-group row on top.
    r.add_group_totals(r.group_capacity(), t.data());
    CHECK(t[totals_codes + status_index(401)] == 2);
    uint64_t loop[5];
    r.shard_loop(1, loop);
    CHECK(loop[0] == 11);
    CHECK(loop[1] == 20);
  }

  TEST_CASE("status codes fall into the fixed set, the rest into other") {
    CHECK(status_index(200) == 0);
    CHECK(status_codes[status_index(499)] == 499);
    CHECK(status_codes[status_index(504)] == 504);
    CHECK(status_index(201) == status_code_count - 1);
    CHECK(status_index(0) == status_code_count - 1);
    registry r(1, small_names());
    r.shard(0).request_done(0, 0, 418);
    r.shard(0).request_done(0, 0, 599);
    r.shard(0).request_done(0, 0, 499);
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_requests_total{group="g0",backend="http://b0:8000",protocol="openai",code="other"})") == 2);
    CHECK(sample(x, R"(sluice_requests_total{group="g0",backend="http://b0:8000",protocol="openai",code="499"})") == 1);
  }

  TEST_CASE("requests without a group or backend get empty label values") {
    registry r(2, small_names());
    r.shard(1).request_done(none, none, 401);
    r.shard(0).request_done(0, none, 429);
    r.shard(0).observe_duration_us(none, 500);
    r.shard(0).tokens(none, 5, 0);
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_requests_total{group="",backend="",protocol="",code="401"})") == 1);
    CHECK(sample(x, R"(sluice_requests_total{group="g0",backend="",protocol="",code="429"})") == 1);
    CHECK(sample(x, R"(sluice_request_duration_seconds_count{group=""})") == 1);
    CHECK(sample(x, R"(sluice_tokens_total{group="",kind="prompt"})") == 5);
    // The no-group histogram is left out while empty.
    CHECK(x.samples.count(R"(sluice_ttft_seconds_count{group=""})") == 0);
  }

  TEST_CASE("label values are escaped per the exposition format") {
    const std::string odd = "we\"ird\\name\nline";
    registry r(1, registry::names{{odd}, {"http://b\"0"}, {"k\\ey"}});
    r.shard(0).request_done(0, 0, 200);
    r.shard(0).quota_rejected(0, reject_reason::concurrency);
    r.set_backend_up(0, true);
    const std::string text = render(r);
    CHECK(text.find("group=\"we\\\"ird\\\\name\\nline\"") != std::string::npos);
    const exposition x = parse_exposition(text);
    CHECK(sample(x, "sluice_requests_total{group=\"" + odd + "\",backend=\"http://b\"0\",protocol=\"\",code=\"200\"}") == 1);
    CHECK(sample(x, "sluice_quota_rejected_total{key=\"k\\ey\",reason=\"concurrency\"}") == 1);
    CHECK(sample(x, "sluice_backend_up{backend=\"http://b\"0\",protocol=\"\"}") == 1);
  }

  TEST_CASE("histogram buckets are upper-inclusive, cumulative and exact in their sum") {
    registry r(2, small_names());
    r.shard(0).observe_ttft_us(1, 1000);         // exactly 1 ms: in le="0.001"
    r.shard(1).observe_ttft_us(1, 1001);         // just above: le="0.0025"
    r.shard(1).observe_ttft_us(1, 0);
    r.shard(0).observe_ttft_us(1, 200'000'000);  // 200 s: only +Inf
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_ttft_seconds_bucket{group="g1",le="0.001"})") == 2);
    CHECK(sample(x, R"(sluice_ttft_seconds_bucket{group="g1",le="0.0025"})") == 3);
    CHECK(sample(x, R"(sluice_ttft_seconds_bucket{group="g1",le="120"})") == 3);
    CHECK(sample(x, R"(sluice_ttft_seconds_bucket{group="g1",le="+Inf"})") == 4);
    CHECK(sample(x, R"(sluice_ttft_seconds_count{group="g1"})") == 4);
    CHECK(render(r).find("sluice_ttft_seconds_sum{group=\"g1\"} 200.002001\n") != std::string::npos);
    CHECK(sample(x, R"(sluice_ttft_seconds_count{group="g0"})") == 0);
    CHECK(sample(x, R"(sluice_request_duration_seconds_count{group="g1"})") == 0);
  }

  TEST_CASE("backend health gauges follow the control thread's last setting") {
    registry r(1, small_names());
    r.set_backend_up(0, true);
    r.set_backend_up(1, true);
    r.set_backend_up(1, false);
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_backend_up{backend="http://b0:8000",protocol="openai"})") == 1);
    CHECK(sample(x, R"(sluice_backend_up{backend="http://b1:8000",protocol="anthropic"})") == 0);
  }

  TEST_CASE("shards writing concurrently with a scraper lose no increment") {
    constexpr size_t shards = 4;
    constexpr uint64_t per_shard = 200000;
    registry r(shards, small_names());
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (size_t s = 0; s < shards; ++s) {
      threads.emplace_back([&r, &go, s] {
        while (!go.load()) std::this_thread::yield();
        shard_metrics& m = r.shard(s);
        for (uint64_t i = 0; i < per_shard; ++i) {
          m.request_done(static_cast<uint32_t>(i % 2), 0, 200);
          m.observe_duration_us(0, i % 5000);
        }
      });
    }
    go.store(true);
    size_t scrapes = 0;
    for (; scrapes < 20; ++scrapes) parse_exposition(render(r));  // valid while written to
    for (auto& t : threads) t.join();
    const exposition x = parse_exposition(render(r));
    CHECK(sample(x, R"(sluice_requests_total{group="g0",backend="http://b0:8000",protocol="openai",code="200"})") == shards * per_shard / 2);
    CHECK(sample(x, R"(sluice_requests_total{group="g1",backend="http://b0:8000",protocol="openai",code="200"})") == shards * per_shard / 2);
    CHECK(sample(x, R"(sluice_request_duration_seconds_count{group="g0"})") == shards * per_shard);
  }
}

TEST_SUITE("metrics::registry reload") {
  TEST_CASE("rename appends labels within the room; counts written before stay on their rows") {
    registry r(2, registry::names{{"g"}, {"http://b0"}, {"alice"}}, registry::room{1, 1, 2});
    r.shard(0).request_done(0, 0, 200);
    CHECK_FALSE(r.rename(registry::names{{"g", "h", "i"}, {"http://b0"}, {"alice"}}));  // no room for 2 more groups
    CHECK_FALSE(r.rename(registry::names{{}, {"http://b0"}, {"alice"}}));               // never shrinks
    REQUIRE(r.rename(registry::names{{"g", "h"}, {"http://b0", "http://b1"}, {"alice", "bob", "alice"}, {"openai", "triton"}}));
    r.shard(1).request_done(1, 1, 200);
    r.shard(1).quota_rejected(0, reject_reason::requests);
    r.shard(0).quota_rejected(2, reject_reason::requests);  // alice again, re-limited: the same series
    r.shard(0).key_done(0, 1, 1);
    r.shard(1).key_done(2, 2, 2);
    r.set_backend_up(1, true);
    std::string out;
    r.render(out);
    CHECK(out.find("sluice_requests_total{group=\"g\",backend=\"http://b0\",protocol=\"openai\",code=\"200\"} 1\n") != std::string::npos);
    CHECK(out.find("sluice_requests_total{group=\"h\",backend=\"http://b1\",protocol=\"triton\",code=\"200\"} 1\n") != std::string::npos);
    CHECK(out.find("sluice_quota_rejected_total{key=\"alice\",reason=\"requests\"} 2\n") != std::string::npos);
    CHECK(out.find("sluice_key_requests_total{key=\"alice\"} 2\n") != std::string::npos);
    CHECK(out.find("sluice_key_tokens_total{key=\"alice\",kind=\"completion\"} 3\n") != std::string::npos);
    CHECK(out.find("sluice_backend_up{backend=\"http://b1\",protocol=\"triton\"} 1\n") != std::string::npos);
    // A request with no group still lands on the `none` row.
    r.shard(0).request_done(sluice::metrics::none, sluice::metrics::none, 401);
    out.clear();
    r.render(out);
    CHECK(out.find("sluice_requests_total{group=\"\",backend=\"\",protocol=\"\",code=\"401\"} 1\n") != std::string::npos);
  }
}
