// TOML -> validated config snapshot. Cold path (start-up, SIGHUP): this is
// the one place where exceptions are used; they stop at main() or at the
// reload handler, which keeps the running snapshot.
//
// Every message reads "FILE:LINE: what is wrong; allowed: ..." so that an
// operator can fix a file without reading the source. Unknown keys are
// errors: a typo ("listne") must not silently fall back to a default.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <initializer_list>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "sluice/config/config.hpp"
#include "reader.hpp"
#include "values.hpp"

namespace sluice::config {

namespace {

using detail::join;
using detail::names;
using detail::reader;
using detail::type_name;

const names k_root_keys = {"server", "upstream", "quota", "audit", "group", "key", "health", "router", "rule", "cluster",
                           "responses"};
const names k_responses_keys = {"store", "store_ttl_s", "store_max_bytes"};
const names k_cluster_keys = {"redis", "password_env", "key_prefix", "expected_instances", "timeout_ms",
                              "fallback_share", "lease_window_ms", "lease_ttl_ms"};
const names k_server_keys = {
    "listen", "admin", "admin_token_env", "cpus", "pin_shards", "reuseport_steering", "max_body_bytes", "max_head_bytes", "max_line_bytes",
    "max_header_count", "header_timeout_ms", "body_timeout_ms", "body_min_rate_bytes_per_s",
    "idle_timeout_ms", "drain_timeout_ms", "connections_max", "inflight_max", "memory_max_bytes", "splice",
    "upstream_buffers", "idle_poll_us", "batch_wait_us", "ping_interval_ms", "h2c", "listen_tls", "tls_cert", "tls_key", "tls_min_version", "tls_h2",
    "h2_max_concurrent_streams", "h2_stream_window_bytes", "h2_connection_window_bytes", "h2_hpack_table_bytes",
    "h2_resets_per_second_max", "h2_memory_max_bytes"};
const names k_upstream_keys = {"connect_timeout_ms", "first_byte_timeout_ms", "stream_idle_timeout_ms",
                                   "total_timeout_ms", "max_retries", "pool_idle_max", "pool_idle_timeout_ms", "connections_max",
                                   "sse_scan"};
const names k_quota_keys = {"input_weight", "output_weight", "default_max_tokens", "max_tokens_cap", "image_tokens",
                             "budget_state_file"};
const names k_audit_keys = {"path", "fsync_interval_ms"};
const names k_group_keys = {"name", "models", "backend_model", "balance", "backends", "default_max_tokens", "max_tokens_cap", "upstream",
                             "prefix_messages", "prefix_bytes", "bounded_load", "api_key_env", "health",
                             "inject_usage", "protocol", "triton_flavor", "chat_template", "chat_template_bos",
                             "custom_template", "daily_tokens", "monthly_tokens", "input_cost_per_mtok",
                             "output_cost_per_mtok", "examples", "examples_file", "topic", "native_dialects",
                             "admission", "max_inflight_per_backend", "queue_timeout_ms", "queue_max"};
const names k_custom_template_keys = {"begin", "system_prefix", "system_suffix", "user_prefix", "user_suffix",
                                      "assistant_prefix", "assistant_suffix", "generation_prefix"};
const names k_protocols = {"openai", "triton", "anthropic"};
const names k_triton_flavors = {"vllm", "trtllm"};
const names k_chat_templates = {"chatml", "llama3", "mistral", "custom"};
const names k_health_keys = {"interval_ms", "timeout_ms", "rise", "fall", "eject_after", "backoff_ms", "backoff_max_ms",
                              "max_ejection_percent", "panic_threshold_percent"};
const names k_router_keys = {"auto_model", "default_group", "semantic", "classifier", "min_confidence", "model_file",
                              "semantic_bytes", "include_system", "group_header", "embeddings_group",
                              "embeddings_timeout_ms", "embeddings_cache", "token_cache", "topic_weight"};
const names k_semantic_modes = {"off", "classifier", "embeddings"};
const names k_classifier_methods = {"examples", "fasttext"};
const names k_rule_keys = {"group", "contains_any", "regex", "min_prompt_bytes", "max_prompt_bytes", "has_tools", "has_images",
                           "priority"};
const names k_backend_keys = {"url", "weight"};
const names k_key_keys = {"id", "key", "key_sha256", "tokens_per_minute", "requests_per_minute", "max_concurrent", "groups",
                           "daily_tokens", "monthly_tokens", "daily_spend", "monthly_spend", "weight", "priority"};
const names k_balance_modes = {"session", "prefix", "least-loaded", "round-robin"};

using detail::k_timeout_max_ms;
// Budgets: shards count spend in nano-units in 64 bits (quota/budget.hpp),
// so a budget stays far below 1.8e10 units of the currency.
constexpr uint64_t k_budget_tokens_max = 1'000'000'000'000'000;
constexpr double k_spend_max = 1e9;
constexpr double k_cost_per_mtok_max = 1e6;

// Runs `f`; a config_error it throws gets "prefix: " in front. Lets the value
// parsers stay unaware of whether the value came from a file or a flag.
template <class F>
auto prefixed(const std::string& prefix, F&& f) {
  try {
    return f();
  } catch (const config_error& e) {
    throw config_error(fmt::format("{}: {}", prefix, e.what()));
  }
}


void read_upstream(const reader& r, const toml::table& t, std::string_view name, upstream_config& u) {
  r.check_keys(t, fmt::format("[{}]", name), k_upstream_keys);
  r.read_timeout(t, name, "connect_timeout_ms", u.connect_timeout_ms);
  r.read_timeout(t, name, "first_byte_timeout_ms", u.first_byte_timeout_ms);
  r.read_timeout(t, name, "stream_idle_timeout_ms", u.stream_idle_timeout_ms);
  r.read_timeout(t, name, "total_timeout_ms", u.total_timeout_ms, 0);
  r.read_uint(t, name, "max_retries", u.max_retries, 0, 10);
  r.read_uint(t, name, "pool_idle_max", u.pool_idle_max, 0, 65536);
  r.read_timeout(t, name, "pool_idle_timeout_ms", u.pool_idle_timeout_ms, 0);
  r.read_uint(t, name, "connections_max", u.connections_max, 1, 1u << 20);
  std::string scan = u.sse_scan == sse_scan_mode::full ? "full" : "boundaries";
  if (const toml::node* n = r.read_string(t, name, "sse_scan", scan)) {
    if (scan == "boundaries") {
      u.sse_scan = sse_scan_mode::boundaries;
    } else if (scan == "full") {
      u.sse_scan = sse_scan_mode::full;
    } else {
      r.fail(*n, fmt::format("{}.sse_scan = \"{}\": expected \"boundaries\" or \"full\"", name, scan));
    }
  }
}

void read_health(const reader& r, const toml::table& t, std::string_view name, health_config& h) {
  r.check_keys(t, fmt::format("[{}]", name), k_health_keys);
  r.read_timeout(t, name, "interval_ms", h.interval_ms, 0);
  r.read_timeout(t, name, "timeout_ms", h.timeout_ms);
  r.read_uint(t, name, "rise", h.rise, 1, 100);
  r.read_uint(t, name, "fall", h.fall, 1, 100);
  r.read_uint(t, name, "eject_after", h.eject_after, 0, 1000, " (0 = no passive ejection)");
  r.read_uint(t, name, "max_ejection_percent", h.max_ejection_percent, 0, 100);
  r.read_uint(t, name, "panic_threshold_percent", h.panic_threshold_percent, 0, 100, " (0 = never)");
  r.read_timeout(t, name, "backoff_ms", h.backoff_ms);
  r.read_timeout(t, name, "backoff_max_ms", h.backoff_max_ms);
  if (h.backoff_max_ms < h.backoff_ms) {
    const toml::node* n = t.get("backoff_max_ms");
    if (n == nullptr) n = t.get("backoff_ms");
    r.fail(*n, fmt::format("{}.backoff_max_ms ({}) is smaller than {}.backoff_ms ({}); the backoff doubles up to the maximum",
                           name, h.backoff_max_ms, name, h.backoff_ms));
  }
}

// A secret goes into request heads (a backend's x-api-key, Redis AUTH):
// a control character -- the trailing newline an EnvironmentFile line may
// keep -- would split the head. Returns: whether `v` has none.
bool secret_is_clean(std::string_view v) noexcept {
  for (const char c : v) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

// `key` names an environment variable holding a secret: its value is read
// now (and never logged); named but unset or empty is an error, and so is
// one with a control character in it.
void read_secret_env(const reader& r, const toml::table& t, std::string_view table_name, std::string_view key,
                     std::string& env_name, std::string& value_out) {
  const toml::node* n = r.read_string(t, table_name, key, env_name);
  if (n == nullptr) return;
  const char* value = env_name.empty() ? nullptr : std::getenv(env_name.c_str());
  if (!env_name.empty() && (value == nullptr || *value == '\0')) {
    r.fail(*n, fmt::format("{}.{}: the environment variable \"{}\" is unset or empty; set it, or remove {}", table_name,
                           key, env_name, key));
  }
  if (value != nullptr && !secret_is_clean(value)) {
    r.fail(*n, fmt::format("{}.{}: the environment variable \"{}\" holds a control character (a trailing newline?); "
                           "remove it", table_name, key, env_name));
  }
  value_out = value != nullptr ? value : "";
}

void read_responses(const reader& r, const toml::table& t, responses_config& c) {
  r.check_keys(t, "[responses]", k_responses_keys);
  std::string mode;
  if (const toml::node* n = r.read_string(t, "responses", "store", mode)) {
    if (mode == "local") {
      c.store = response_store_mode::local;
    } else if (mode == "redis") {
      c.store = response_store_mode::redis;
    } else if (mode == "off") {
      c.store = response_store_mode::off;
    } else {
      r.fail(*n, fmt::format("responses.store \"{}\" is not a store; allowed: off, local, redis", mode));
    }
  }
  r.read_uint(t, "responses", "store_ttl_s", c.store_ttl_s, 1, 30u * 86400u, " s");
  r.read_uint(t, "responses", "store_max_bytes", c.store_max_bytes, 1u << 16, uint64_t{1} << 40);
}

void read_cluster(const reader& r, const toml::table& t, cluster_config& c) {
  r.check_keys(t, "[cluster]", k_cluster_keys);
  if (const toml::node* n = r.read_string(t, "cluster", "redis", c.redis); n != nullptr && !c.redis.empty()) {
    c.url = prefixed(r.at(*n) + ": cluster.redis", [&] { return parse_redis_url(c.redis); });
  }
  read_secret_env(r, t, "cluster", "password_env", c.password_env, c.password);
  if (const toml::node* n = r.read_string(t, "cluster", "key_prefix", c.key_prefix)) {
    if (c.key_prefix.size() > 64 || c.key_prefix.find_first_of(" \t\r\n") != std::string::npos) {
      r.fail(*n, fmt::format("cluster.key_prefix = \"{}\": at most 64 characters, no spaces", c.key_prefix));
    }
  }
  r.read_uint(t, "cluster", "expected_instances", c.expected_instances, 1, 4096);
  r.read_uint(t, "cluster", "timeout_ms", c.timeout_ms, 1, 60000, " ms");
  r.read_uint(t, "cluster", "lease_window_ms", c.lease_window_ms, 100, 60000, " ms");
  r.read_uint(t, "cluster", "lease_ttl_ms", c.lease_ttl_ms, 100, 60000, " ms (the scripts' key expiry covers up to 60 s)");
  if (const toml::node* n = t.get("fallback_share")) {
    double v = -1;
    if (n->is_floating_point()) v = n->as_floating_point()->get();
    if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
    if (!n->is_number()) r.fail(*n, fmt::format("cluster.fallback_share must be a number (got {})", type_name(*n)));
    if (!(v >= 0 && v <= 1)) {
      r.fail(*n, fmt::format("cluster.fallback_share = {} is out of range; allowed: 0 (= 1 / expected_instances) or a "
                             "fraction of each key's limit up to 1.0",
                             v));
    }
    c.fallback_share = v;
  }
}

void read_server(const reader& r, const toml::table& t, server_config& s) {
  r.check_keys(t, "[server]", k_server_keys);
  std::string text;
  if (const auto* n = r.read_string(t, "server", "listen", text)) {
    s.listen = prefixed(r.at(*n) + ": server.listen", [&] { return parse_socket_address(text); });
  }
  if (const auto* n = r.read_string(t, "server", "admin", text)) {
    s.admin = prefixed(r.at(*n) + ": server.admin", [&] { return parse_socket_address(text); });
  }
  read_secret_env(r, t, "server", "admin_token_env", s.admin_token_env, s.admin_token);
  if (const auto* n = r.read_string(t, "server", "cpus", text)) {
    s.cpus = prefixed(r.at(*n) + ": server.cpus", [&] { return parse_cpu_list(text); });
  }
  r.read_uint(t, "server", "max_body_bytes", s.max_body_bytes, 1024, 1ull << 30, " (1 KiB-1 GiB)");
  r.read_uint(t, "server", "max_head_bytes", s.max_head_bytes, 1024, 1u << 20, " (1 KiB-1 MiB)");
  r.read_uint(t, "server", "max_line_bytes", s.max_line_bytes, 256, 1u << 20, " (256 B-1 MiB)");
  r.read_uint(t, "server", "max_header_count", s.max_header_count, 1, 10000);
  r.read_timeout(t, "server", "header_timeout_ms", s.header_timeout_ms);
  r.read_timeout(t, "server", "body_timeout_ms", s.body_timeout_ms);
  r.read_uint(t, "server", "body_min_rate_bytes_per_s", s.body_min_rate_bytes_per_s, 0, 1ull << 30, " (0 = no minimum)");
  r.read_timeout(t, "server", "idle_timeout_ms", s.idle_timeout_ms);
  r.read_timeout(t, "server", "drain_timeout_ms", s.drain_timeout_ms);
  r.read_uint(t, "server", "connections_max", s.connections_max, 1, 1u << 20);
  r.read_uint(t, "server", "inflight_max", s.inflight_max, 1, 1u << 20);
  r.read_uint(t, "server", "memory_max_bytes", s.memory_max_bytes, 0, 1ull << 40, " (0 = no cap, else up to 1 TiB)");
  r.read_bool(t, "server", "splice", s.splice);
  r.read_bool(t, "server", "reuseport_steering", s.reuseport_steering);
  r.read_bool(t, "server", "pin_shards", s.pin_shards);
  if (s.reuseport_steering && !s.pin_shards) {
    // Steering sends a connection to the shard of the CPU that received it:
    // a shard that moves among CPUs has none.
    r.fail(*t.get("reuseport_steering"), "server.reuseport_steering = true needs pinned shards (pin_shards = true)");
  }
  r.read_uint(t, "server", "upstream_buffers", s.upstream_buffers, 1, 4096, " (a power of two)");
  if ((s.upstream_buffers & (s.upstream_buffers - 1)) != 0) {
    r.fail(*t.get("upstream_buffers"),
           fmt::format("server.upstream_buffers = {} is not a power of two (1, 2, 4, ... 4096)", s.upstream_buffers));
  }
  r.read_uint(t, "server", "idle_poll_us", s.idle_poll_us, 0, 1000, " (0 = never poll)");
  r.read_uint(t, "server", "batch_wait_us", s.batch_wait_us, 0, 1000, " (0 = never batch)");
  r.read_uint(t, "server", "ping_interval_ms", s.ping_interval_ms, 0, 3600000, " (0 = never ping)");
  r.read_bool(t, "server", "h2c", s.h2c);
  r.read_bool(t, "server", "tls_h2", s.tls_h2);
  if (const auto* n = r.read_string(t, "server", "listen_tls", text); n != nullptr && !text.empty()) {
    s.listen_tls = prefixed(r.at(*n) + ": server.listen_tls", [&] { return parse_socket_address(text); });
  }
  const toml::node* cert = r.read_string(t, "server", "tls_cert", s.tls_cert);
  const toml::node* key = r.read_string(t, "server", "tls_key", s.tls_key);
  if (const auto* n = r.read_string(t, "server", "tls_min_version", s.tls_min_version)) {
    if (s.tls_min_version != "1.2" && s.tls_min_version != "1.3") {
      r.fail(*n, fmt::format("server.tls_min_version = \"{}\": expected \"1.2\" or \"1.3\"", s.tls_min_version));
    }
  }
  if (s.listen_tls.length != 0 && (s.tls_cert.empty() || s.tls_key.empty())) {
    const toml::node* n = t.get("listen_tls");
    r.fail(*n, "server.listen_tls needs server.tls_cert and server.tls_key (PEM files)");
  }
  if (s.listen_tls.length == 0 && (cert != nullptr || key != nullptr) && (!s.tls_cert.empty() || !s.tls_key.empty())) {
    r.fail(cert != nullptr ? *cert : *key, "server.tls_cert / tls_key are set but server.listen_tls is not: set the "
                                           "TLS listener's address, or remove them");
  }
  r.read_uint(t, "server", "h2_max_concurrent_streams", s.h2_max_concurrent_streams, 1, 10000);
  r.read_uint(t, "server", "h2_stream_window_bytes", s.h2_stream_window_bytes, 1024, (1u << 31) - 1,
              " (1 KiB-2 GiB)");
  r.read_uint(t, "server", "h2_connection_window_bytes", s.h2_connection_window_bytes, 65535, (1u << 31) - 1,
              " (64 KiB-2 GiB)");
  r.read_uint(t, "server", "h2_hpack_table_bytes", s.h2_hpack_table_bytes, 0, 1u << 20, " (0-1 MiB)");
  r.read_uint(t, "server", "h2_resets_per_second_max", s.h2_resets_per_second_max, 1, 1u << 20);
  r.read_uint(t, "server", "h2_memory_max_bytes", s.h2_memory_max_bytes, 256u << 10, 1u << 30, " (256 KiB-1 GiB)");
  if (s.max_line_bytes > s.max_head_bytes) {
    const toml::node* n = t.get("max_line_bytes");
    if (n == nullptr) n = t.get("max_head_bytes");
    r.fail(*n, fmt::format("server.max_line_bytes ({}) is larger than server.max_head_bytes ({}); a line is part of the head",
                           s.max_line_bytes, s.max_head_bytes));
  }
}

void read_quota(const reader& r, const toml::table& t, quota_config& q) {
  r.check_keys(t, "[quota]", k_quota_keys);
  r.read_uint(t, "quota", "input_weight", q.input_weight, 0, 1000);
  r.read_uint(t, "quota", "output_weight", q.output_weight, 0, 1000);
  r.read_uint(t, "quota", "default_max_tokens", q.default_max_tokens, 1, 10'000'000);
  r.read_uint(t, "quota", "max_tokens_cap", q.max_tokens_cap, 1, 1u << 20, " (1-1048576)");
  r.read_uint(t, "quota", "image_tokens", q.image_tokens, 0, 1u << 20);
  r.read_string(t, "quota", "budget_state_file", q.budget_state_file);
  if (q.input_weight == 0 && q.output_weight == 0) {
    r.fail(t, "quota.input_weight and quota.output_weight are both 0; at least one must count tokens");
  }
}

// A backend URL as written in a group, before dedup and resolution.
struct backend_ref {
  std::string url;
  uint32_t weight = 1;
  std::string origin;  // "FILE:LINE" or "--backend"
};

struct group_draft {
  group_config group;
  std::vector<backend_ref> backend_urls;
  std::string origin;  // the [[group]] header, for "no backends"
};

// examples_file: read by semantic.cpp's read_examples_file; its message
// gets this key's FILE:LINE.
void read_examples_file(const reader& r, const toml::node& n, group_config& g) {
  if (g.examples_file.empty()) r.fail(n, "group.examples_file must not be empty (leave it out for none)");
  try {
    for (std::string& e : sluice::config::read_examples_file(relative_to(r.source(), g.examples_file))) {
      g.examples.push_back(std::move(e));
    }
  } catch (const config_error& e) {
    r.fail(n, fmt::format("group.examples_file \"{}\": {}", g.examples_file, e.what()));
  }
}

group_draft read_group(const reader& r, const toml::table& t, const upstream_config& defaults,
                       const health_config& health_defaults) {
  r.check_keys(t, "[[group]]", k_group_keys);
  group_draft d;
  d.origin = r.at(t);
  group_config& g = d.group;
  if (r.read_string(t, "group", "name", g.name) == nullptr) {
    r.fail(t, "[[group]] needs a name, e.g. name = \"qwen2.5-7b\"");
  }
  if (!is_plain_name(g.name)) {
    r.fail(*t.get("name"), fmt::format("group.name \"{}\" is not allowed; allowed: 1-128 of A-Z a-z 0-9 _ - . : @ /", g.name));
  }
  for (const toml::node* n : r.read_strings(t, "group", "models")) g.models.push_back(n->as_string()->get());
  if (g.models.empty()) g.models.push_back(g.name);  // a group serves its own name by default
  for (const toml::node* n : r.read_strings(t, "group", "examples")) g.examples.push_back(n->as_string()->get());
  if (const toml::node* n = r.read_string(t, "group", "examples_file", g.examples_file)) {
    read_examples_file(r, *n, g);
  }
  std::string topic;
  if (const toml::node* n = r.read_string(t, "group", "topic", topic)) {
    const std::optional<semantic_topic> named = topic_from_name(topic);
    if (!named) r.fail(*n, fmt::format("group.topic \"{}\" is not a built-in topic; allowed: {}", topic, topic_names()));
    if (g.examples.empty()) {
      r.fail(*n, "group.topic adds to the classifier's evidence for a group it scores: it needs the group's "
                 "examples (examples = [...] or examples_file = \"FILE\")");
    }
    g.topic = *named;
  }
  r.read_string(t, "group", "backend_model", g.backend_model);
  if (const auto* n = r.read_string(t, "group", "balance", g.balance)) {
    if (std::find(k_balance_modes.begin(), k_balance_modes.end(), g.balance) == k_balance_modes.end()) {
      r.fail(*n, fmt::format("group.balance \"{}\" is not a mode; allowed: {}", g.balance, join(k_balance_modes)));
    }
  }
  // backends: "http://..." strings or { url = "http://...", weight = N } tables.
  if (const toml::node* list = t.get("backends")) {
    const auto* arr = list->as_array();
    if (arr == nullptr) {
      r.fail(*list, fmt::format("group.backends must be an array of \"http://HOST:PORT\" strings or "
                                "{{ url = \"http://HOST:PORT\", weight = N }} tables (got {})", type_name(*list)));
    }
    if (arr->empty()) r.fail(*list, "group.backends must not be empty");
    for (const toml::node& element : *arr) {
      if (element.is_string() && !element.as_string()->get().empty()) {
        d.backend_urls.push_back({std::string(element.as_string()->get()), 1, r.at(element)});
      } else if (const toml::table* bt = element.as_table()) {
        r.check_keys(*bt, "a group.backends entry", k_backend_keys);
        backend_ref ref;
        ref.origin = r.at(element);
        if (r.read_string(*bt, "group.backends", "url", ref.url) == nullptr || ref.url.empty()) {
          r.fail(element, "a group.backends table needs url = \"http://HOST:PORT\"");
        }
        r.read_uint(*bt, "group.backends", "weight", ref.weight, 1, 1000);
        d.backend_urls.push_back(std::move(ref));
      } else {
        r.fail(element, fmt::format("group.backends entries are \"http://HOST:PORT\" strings or "
                                    "{{ url = \"http://HOST:PORT\", weight = N }} tables (got {})", type_name(element)));
      }
    }
  }
  r.read_uint(t, "group", "default_max_tokens", g.default_max_tokens, 0, 10'000'000, " (0 = quota.default_max_tokens)");
  r.read_uint(t, "group", "max_tokens_cap", g.max_tokens_cap, 0, 1u << 20, " (0 = quota.max_tokens_cap)");
  g.upstream = defaults;
  if (const toml::table* u = r.table(t, "upstream", "group.upstream")) read_upstream(r, *u, "group.upstream", g.upstream);
  r.read_uint(t, "group", "prefix_messages", g.prefix_messages, 1, 8,
              " (1 = system prompt, 2 = system prompt + first user message, 3-8 = the first K messages)");
  r.read_uint(t, "group", "prefix_bytes", g.prefix_bytes, 1, 1u << 20, " (leading /v1/completions prompt bytes)");
  r.read_bool(t, "group", "inject_usage", g.inject_usage);
  std::string text;
  if (const toml::node* n = r.read_string(t, "group", "protocol", text)) {
    if (text == "openai") g.protocol = backend_protocol::openai;
    else if (text == "triton") g.protocol = backend_protocol::triton;
    else if (text == "anthropic") g.protocol = backend_protocol::anthropic;
    else r.fail(*n, fmt::format("group.protocol \"{}\" is not a protocol; allowed: {}", text, join(k_protocols)));
  }
  const bool text_prompt = g.protocol == backend_protocol::triton;
  detail::read_native_dialects(r, t, g);
  detail::read_group_admission(r, t, g);
  const auto triton_only = [&](std::string_view key) {
    if (const toml::node* n = t.get(key); n != nullptr && !text_prompt) {
      r.fail(*n, fmt::format("group.{} applies to protocol = \"triton\" only (this group's protocol is \"{}\")", key,
                             to_string(g.protocol)));
    }
  };
  for (std::string_view key : {"triton_flavor", "chat_template", "chat_template_bos", "custom_template"}) triton_only(key);
  if (const toml::node* n = r.read_string(t, "group", "triton_flavor", text)) {
    if (text == "vllm") g.flavor = triton_flavor::vllm;
    else if (text == "trtllm") g.flavor = triton_flavor::trtllm;
    else r.fail(*n, fmt::format("group.triton_flavor \"{}\" is not a flavour; allowed: {}", text, join(k_triton_flavors)));
  }
  chat_template_config& ct = g.chat_template;
  if (const toml::node* n = r.read_string(t, "group", "chat_template", ct.kind)) {
    if (std::find(k_chat_templates.begin(), k_chat_templates.end(), ct.kind) == k_chat_templates.end()) {
      r.fail(*n, fmt::format("group.chat_template \"{}\" is not a template; allowed: {}", ct.kind, join(k_chat_templates)));
    }
  }
  r.read_bool(t, "group", "chat_template_bos", ct.include_bos);
  const toml::table* custom = r.table(t, "custom_template", "group.custom_template");
  if (custom != nullptr) {
    r.check_keys(*custom, "[group.custom_template]", k_custom_template_keys);
    if (ct.kind != "custom") {
      r.fail(*custom, fmt::format("[group.custom_template] is read only with chat_template = \"custom\" (this group's is \"{}\")",
                                  ct.kind));
    }
    r.read_string(*custom, "group.custom_template", "begin", ct.begin);
    r.read_string(*custom, "group.custom_template", "system_prefix", ct.system_prefix);
    r.read_string(*custom, "group.custom_template", "system_suffix", ct.system_suffix);
    r.read_string(*custom, "group.custom_template", "user_prefix", ct.user_prefix);
    r.read_string(*custom, "group.custom_template", "user_suffix", ct.user_suffix);
    r.read_string(*custom, "group.custom_template", "assistant_prefix", ct.assistant_prefix);
    r.read_string(*custom, "group.custom_template", "assistant_suffix", ct.assistant_suffix);
    r.read_string(*custom, "group.custom_template", "generation_prefix", ct.generation_prefix);
  } else if (ct.kind == "custom") {
    r.fail(t, fmt::format("group \"{}\": chat_template = \"custom\" needs a [group.custom_template] table with the "
                          "per-role strings ({})", g.name, join(k_custom_template_keys)));
  }
  double c = g.bounded_load;
  if (const toml::node* n = r.read_number(t, "group", "bounded_load", c, 0, 100, " (0 = off; 1.25 is usual)")) {
    if (!(c == 0 || c > 1.0)) {
      r.fail(*n, fmt::format("group.bounded_load = {} is out of range; allowed: 0 (off) or more than 1.0 up to 100 (1.25 is usual)", c));
    }
    g.bounded_load = c;
  }
  // Read once at load: a reload re-reads it, so rotating the key is
  // "change the environment of the next reload", not a restart.
  read_secret_env(r, t, "group", "api_key_env", g.api_key_env, g.api_key);
  g.health = health_defaults;
  if (const toml::table* h = r.table(t, "health", "group.health")) read_health(r, *h, "group.health", g.health);
  r.read_uint(t, "group", "daily_tokens", g.daily_tokens, 0, k_budget_tokens_max, " (0 = none)");
  r.read_uint(t, "group", "monthly_tokens", g.monthly_tokens, 0, k_budget_tokens_max, " (0 = none)");
  r.read_number(t, "group", "input_cost_per_mtok", g.input_cost_per_mtok, 0, k_cost_per_mtok_max, " (currency per 1M tokens)");
  r.read_number(t, "group", "output_cost_per_mtok", g.output_cost_per_mtok, 0, k_cost_per_mtok_max, " (currency per 1M tokens)");
  return d;
}

key_config read_key(const reader& r, const toml::table& t) {
  r.check_keys(t, "[[key]]", k_key_keys);
  key_config k;
  if (r.read_string(t, "key", "id", k.id) == nullptr) r.fail(t, "[[key]] needs an id, e.g. id = \"alice\"");
  if (!is_plain_name(k.id)) {
    r.fail(*t.get("id"), fmt::format("key.id \"{}\" is not allowed; allowed: 1-128 of A-Z a-z 0-9 _ - . : @ /", k.id));
  }
  const toml::node* plain = t.get("key");
  const toml::node* digest = t.get("key_sha256");
  if ((plain == nullptr) == (digest == nullptr)) {
    r.fail(t, fmt::format("key \"{}\" needs exactly one of key = \"...\" (plaintext, for tests) or key_sha256 = \"<64 hex digits>\"", k.id));
  }
  std::string text;
  if (plain != nullptr) {
    r.read_string(t, "key", "key", text);
    if (text.empty()) r.fail(*plain, "key.key must not be empty");
    k.key_sha256 = sha256(text);
  } else {
    r.read_string(t, "key", "key_sha256", text);
    if (!parse_hex_digest(text, k.key_sha256)) {
      r.fail(*digest, fmt::format("key.key_sha256 must be 64 hex digits (got {} characters{}); compute it with: printf %s KEY | sha256sum",
                                  text.size(), text.size() == 64 ? ", not all hex" : ""));
    }
  }
  r.read_uint(t, "key", "tokens_per_minute", k.tokens_per_minute, 0, 1'000'000'000'000, " (0 = unlimited)");
  r.read_uint(t, "key", "requests_per_minute", k.requests_per_minute, 0, 1'000'000'000, " (0 = unlimited)");
  r.read_uint(t, "key", "max_concurrent", k.max_concurrent, 0, 1'000'000, " (0 = unlimited)");
  r.read_uint(t, "key", "daily_tokens", k.daily_tokens, 0, k_budget_tokens_max, " (0 = none)");
  r.read_uint(t, "key", "monthly_tokens", k.monthly_tokens, 0, k_budget_tokens_max, " (0 = none)");
  r.read_number(t, "key", "daily_spend", k.daily_spend, 0, k_spend_max, " (currency; 0 = none)");
  r.read_number(t, "key", "monthly_spend", k.monthly_spend, 0, k_spend_max, " (currency; 0 = none)");
  if (t.get("groups") != nullptr) {
    k.groups.clear();
    for (const toml::node* n : r.read_strings(t, "key", "groups")) k.groups.push_back(n->as_string()->get());
  }
  detail::read_key_admission(r, t, k);
  return k;
}

void read_router_semantic(const reader& r, const toml::table& t, router_config& router) {
  std::string mode;
  if (const toml::node* n = r.read_string(t, "router", "semantic", mode)) {
    if (std::find(k_semantic_modes.begin(), k_semantic_modes.end(), mode) == k_semantic_modes.end()) {
      r.fail(*n, fmt::format("router.semantic \"{}\" is not a mode; allowed: {}", mode, join(k_semantic_modes)));
    }
    router.semantic = mode == "classifier"   ? semantic_mode::classifier
                      : mode == "embeddings" ? semantic_mode::embeddings
                                             : semantic_mode::off;
  }
  r.read_number(t, "router", "min_confidence", router.min_confidence, 0, 1);
  r.read_number(t, "router", "topic_weight", router.topic_weight, 0, 10);
  std::string method;
  const toml::node* method_node = r.read_string(t, "router", "classifier", method);
  if (method_node != nullptr) {
    if (std::find(k_classifier_methods.begin(), k_classifier_methods.end(), method) == k_classifier_methods.end()) {
      r.fail(*method_node, fmt::format("router.classifier \"{}\" is not a method; allowed: {}", method,
                                       join(k_classifier_methods)));
    }
    router.classifier = method == "fasttext" ? classifier_method::fasttext : classifier_method::examples;
  }
  if (const toml::node* n = r.read_string(t, "router", "model_file", router.model_file)) {
    if (router.model_file.empty()) r.fail(*n, "router.model_file must not be empty (leave it out to train from examples)");
    router.model_file = relative_to(r.source(), router.model_file);
    if (method_node != nullptr && router.classifier != classifier_method::fasttext) {
      r.fail(*method_node, "router.model_file is a fastText model: it needs router.classifier = \"fasttext\" "
                           "(or leave classifier out)");
    }
    router.classifier = classifier_method::fasttext;
  }
  r.read_uint(t, "router", "semantic_bytes", router.semantic_bytes, 16, 65536);
  r.read_bool(t, "router", "include_system", router.include_system);
  r.read_bool(t, "router", "group_header", router.group_header);
  r.read_string(t, "router", "embeddings_group", router.embeddings_group);
  r.read_uint(t, "router", "embeddings_timeout_ms", router.embeddings_timeout_ms, 1, 60000);
  r.read_uint(t, "router", "token_cache", router.token_cache, 0, 1u << 20);
  if (const uint32_t c = router.token_cache; (c & (c - 1)) != 0) {
    r.fail(*t.get("token_cache"), fmt::format("router.token_cache = {} is not a power of two (or 0: no cache)", c));
  }
  r.read_uint(t, "router", "embeddings_cache", router.embeddings_cache, 0, 1u << 20);
  if (const uint32_t c = router.embeddings_cache; (c & (c - 1)) != 0) {
    r.fail(*t.get("embeddings_cache"), fmt::format("router.embeddings_cache = {} is not a power of two (or 0: no cache)", c));
  }
}

rule_config read_rule(const reader& r, const toml::table& t, const std::vector<group_draft>& drafts) {
  r.check_keys(t, "[[rule]]", k_rule_keys);
  rule_config rule;
  rule.origin = r.at(t);
  const toml::node* group = r.read_string(t, "rule", "group", rule.group);
  if (group == nullptr) r.fail(t, "[[rule]] needs group = \"NAME\", the group it picks");
  auto it = std::find_if(drafts.begin(), drafts.end(), [&](const group_draft& d) { return d.group.name == rule.group; });
  if (it == drafts.end()) r.fail(*group, fmt::format("rule.group \"{}\" is not the name of a [[group]]", rule.group));
  rule.group_index = static_cast<uint32_t>(it - drafts.begin());
  for (const toml::node* n : r.read_strings(t, "rule", "contains_any")) rule.contains_any.push_back(n->as_string()->get());
  if (const toml::node* n = r.read_string(t, "rule", "regex", rule.regex)) {
    if (rule.regex.empty()) r.fail(*n, "rule.regex must not be empty");
    // libstdc++'s regex parser reads back-reference numbers and {n,m}
    // counts into a long without an overflow check (undefined behaviour on a
    // long digit run). Back-references match nothing a routing rule needs,
    // and counts above six digits nothing sensible: refuse both up front.
    bool in_braces = false;
    size_t digits = 0;
    for (size_t i = 0; i < rule.regex.size(); ++i) {
      const char c = rule.regex[i];
      if (c == '\\' && i + 1 < rule.regex.size()) {
        if (rule.regex[i + 1] >= '1' && rule.regex[i + 1] <= '9') {
          r.fail(*n, fmt::format("rule.regex \"{}\" uses a back-reference; allowed: an ECMAScript regular "
                                 "expression without back-references", rule.regex));
        }
        ++i;  // skip the escaped character
        digits = 0;
        continue;
      }
      if (c == '{') in_braces = true;
      if (c == '}') in_braces = false;
      digits = (c >= '0' && c <= '9') ? digits + 1 : 0;
      if (in_braces && digits > 6) {
        r.fail(*n, fmt::format("rule.regex \"{}\" has a repetition count over 999999; allowed: counts up to 999999",
                               rule.regex));
      }
    }
    try {
      std::regex compiled(rule.regex, std::regex::ECMAScript | std::regex::icase | std::regex::nosubs);
      (void)compiled;
    } catch (const std::regex_error& e) {
      r.fail(*n, fmt::format("rule.regex \"{}\" does not compile ({}); allowed: an ECMAScript regular expression", rule.regex, e.what()));
    }
  }
  r.read_uint(t, "rule", "min_prompt_bytes", rule.min_prompt_bytes, 0, UINT64_MAX >> 1);
  r.read_uint(t, "rule", "max_prompt_bytes", rule.max_prompt_bytes, 0, UINT64_MAX >> 1);
  if (rule.min_prompt_bytes > rule.max_prompt_bytes) {
    r.fail(*t.get("min_prompt_bytes"), fmt::format("rule.min_prompt_bytes ({}) is larger than rule.max_prompt_bytes ({})",
                                                  rule.min_prompt_bytes, rule.max_prompt_bytes));
  }
  bool flag = false;
  if (t.get("has_tools") != nullptr) {
    r.read_bool(t, "rule", "has_tools", flag);
    rule.has_tools = flag;
  }
  if (t.get("has_images") != nullptr) {
    r.read_bool(t, "rule", "has_images", flag);
    rule.has_images = flag;
  }
  std::string priority;
  if (const toml::node* n = r.read_string(t, "rule", "priority", priority)) {
    if (priority != "before" && priority != "after") {
      r.fail(*n, fmt::format("rule.priority \"{}\" is not allowed; allowed: before (decides ahead of the semantic "
                             "classifier), after (the default: only when the classifier is not confident)", priority));
    }
    rule.before = priority == "before";
  }
  return rule;
}

}  // namespace

std::shared_ptr<const config> load(std::string_view toml_text, std::string_view source, const flags& f) {
  reader r(source);
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw config_error(fmt::format("{}: TOML syntax: {}", r.at(e.source()), e.description()));
  }

  auto cfg = std::make_shared<config>();
  cfg->source = std::string(source);
  cfg->server.listen = parse_socket_address("127.0.0.1:8080");
  cfg->server.admin = parse_socket_address("127.0.0.1:9090");

  r.check_keys(root, "the top level", k_root_keys);
  if (const toml::table* t = r.table(root, "server", "server")) read_server(r, *t, cfg->server);
  if (const toml::table* t = r.table(root, "upstream", "upstream")) read_upstream(r, *t, "upstream", cfg->upstream);
  if (const toml::table* t = r.table(root, "quota", "quota")) read_quota(r, *t, cfg->quota);
  if (const toml::table* t = r.table(root, "audit", "audit")) {
    r.check_keys(*t, "[audit]", k_audit_keys);
    r.read_string(*t, "audit", "path", cfg->audit.path);
    r.read_uint(*t, "audit", "fsync_interval_ms", cfg->audit.fsync_interval_ms, 0, k_timeout_max_ms,
                " ms (0 = after every batch)");
  }
  if (const toml::table* t = r.table(root, "health", "health")) read_health(r, *t, "health", cfg->health);
  if (const toml::table* t = r.table(root, "cluster", "cluster")) read_cluster(r, *t, cfg->cluster);
  if (const toml::table* t = r.table(root, "responses", "responses")) {
    read_responses(r, *t, cfg->responses);
    if (cfg->responses.store == response_store_mode::redis && !cfg->cluster.enabled()) {
      r.fail(*t->get("store"), "responses.store = \"redis\" keeps the responses in the cluster's Redis: set [cluster] redis");
    }
  }

  std::vector<group_draft> drafts;
  for (const toml::table* t : r.tables(root, "group")) {
    group_draft d = read_group(r, *t, cfg->upstream, cfg->health);
    for (const auto& other : drafts) {
      if (other.group.name == d.group.name) {
        r.fail(*t->get("name"), fmt::format("group name \"{}\" is already used by the group at {}; names must be unique",
                                            d.group.name, other.origin));
      }
    }
    drafts.push_back(std::move(d));
  }
  if (drafts.empty()) {
    throw config_error(fmt::format("{}:1: no [[group]]; at least one is required, e.g. [[group]] name = \"default\" models = [\"*\"] backends = [\"http://127.0.0.1:8000\"]", source));
  }

  std::string router_origin = fmt::format("{}:1", source);
  if (const toml::table* t = r.table(root, "router", "router")) {
    router_origin = r.at(*t);
    r.check_keys(*t, "[router]", k_router_keys);
    if (const toml::node* n = r.read_string(*t, "router", "auto_model", cfg->router.auto_model)) {
      if (cfg->router.auto_model.empty()) r.fail(*n, "router.auto_model must not be empty (the default is \"auto\")");
    }
    if (const toml::node* n = r.read_string(*t, "router", "default_group", cfg->router.default_group)) {
      auto it = std::find_if(drafts.begin(), drafts.end(),
                             [&](const group_draft& d) { return d.group.name == cfg->router.default_group; });
      if (it == drafts.end()) {
        r.fail(*n, fmt::format("router.default_group \"{}\" is not the name of a [[group]]", cfg->router.default_group));
      }
      cfg->router.default_group_index = static_cast<uint32_t>(it - drafts.begin());
    }
    read_router_semantic(r, *t, cfg->router);
  }
  for (const toml::table* t : r.tables(root, "rule")) cfg->rules.push_back(read_rule(r, *t, drafts));

  std::vector<std::string> key_origins;
  for (const toml::table* t : r.tables(root, "key")) {
    key_config k = read_key(r, *t);
    for (size_t i = 0; i < cfg->keys.size(); ++i) {
      if (cfg->keys[i].id == k.id) {
        r.fail(*t->get("id"), fmt::format("key id \"{}\" is already used by the key at {}; ids must be unique", k.id, key_origins[i]));
      }
      if (cfg->keys[i].key_sha256 == k.key_sha256) {
        r.fail(*t, fmt::format("key \"{}\" has the same secret as key \"{}\" at {}; each key needs its own secret",
                               k.id, cfg->keys[i].id, key_origins[i]));
      }
    }
    for (const auto& pattern : k.groups) {
      bool any = std::any_of(drafts.begin(), drafts.end(), [&](const group_draft& d) { return glob_match(pattern, d.group.name); });
      if (!any) {
        r.fail(*t->get("groups"), fmt::format("key \"{}\": groups entry \"{}\" matches no [[group]] name", k.id, pattern));
      }
    }
    // A spend budget needs a price: one of the key's groups must have a cost.
    if (k.daily_spend > 0 || k.monthly_spend > 0) {
      const bool priced = std::any_of(drafts.begin(), drafts.end(), [&](const group_draft& d) {
        const bool allowed = std::any_of(k.groups.begin(), k.groups.end(),
                                         [&](const std::string& p) { return glob_match(p, d.group.name); });
        return allowed && (d.group.input_cost_per_mtok > 0 || d.group.output_cost_per_mtok > 0);
      });
      if (!priced) {
        r.fail(*t->get(k.daily_spend > 0 ? "daily_spend" : "monthly_spend"),
               fmt::format("key \"{}\": a spend budget needs a price, but none of its groups has input_cost_per_mtok or "
                           "output_cost_per_mtok; set them on the [[group]] (currency per 1M tokens)",
                           k.id));
      }
    }
    key_origins.push_back(r.at(*t));
    cfg->keys.push_back(std::move(k));
  }
  if (cfg->keys.empty()) {
    throw config_error(fmt::format("{}:1: no [[key]]; at least one is required, e.g. [[key]] id = \"alice\" key_sha256 = \"<64 hex digits>\"", source));
  }

  // Flags override the file.
  if (f.listen) cfg->server.listen = prefixed("--listen", [&] { return parse_socket_address(*f.listen); });
  if (f.admin) cfg->server.admin = prefixed("--admin", [&] { return parse_socket_address(*f.admin); });
  if (f.cpus) cfg->server.cpus = prefixed("--cpus", [&] { return parse_cpu_list(*f.cpus); });
  if (!f.backends.empty()) {
    for (auto& d : drafts) {
      d.backend_urls.clear();
      for (const auto& url : f.backends) d.backend_urls.push_back({url, 1, "--backend"});
    }
  }

  // Backends: every group's URLs, deduplicated across groups into
  // config::backends so that a backend shared by two groups has one pool and
  // one health state.
  for (auto& d : drafts) {
    if (d.backend_urls.empty()) {
      throw config_error(fmt::format("{}: group \"{}\" has no backends; add backends = [\"http://HOST:PORT\"] (or pass --backend URL)",
                                     d.origin, d.group.name));
    }
    for (const auto& ref : d.backend_urls) {
      parsed_url u = prefixed(ref.origin, [&] { return parse_backend_url(ref.url); });
      auto it = std::find_if(cfg->backends.begin(), cfg->backends.end(),
                             [&](const backend_config& b) { return b.url == u.normalized; });
      auto index = static_cast<uint32_t>(it - cfg->backends.begin());
      if (it == cfg->backends.end()) {
        backend_config b;
        b.url = u.normalized;
        b.host_header = u.host_header;
        b.transport = u.transport;
        b.address = prefixed(ref.origin, [&] { return resolve(u); });
        cfg->backends.push_back(std::move(b));
      }
      auto& indices = d.group.backends;
      if (std::find(indices.begin(), indices.end(), index) != indices.end()) {
        throw config_error(fmt::format("{}: group \"{}\" lists backend \"{}\" twice", ref.origin, d.group.name, ref.url));
      }
      const backend_config& b = cfg->backends[index];
      const bool grpc_backend = b.transport == backend_transport::grpc;
      if (grpc_backend != (d.group.protocol == backend_protocol::triton)) {
        throw config_error(fmt::format(
            "{}: group \"{}\" (protocol = \"{}\") lists backend \"{}\"; {}", ref.origin, d.group.name,
            to_string(d.group.protocol), ref.url,
            grpc_backend ? "grpc:// backends are for protocol = \"triton\""
                         : "protocol = \"triton\" backends are grpc://HOST:PORT (KServe v2 gRPC, Triton's port 8001)"));
      }
      indices.push_back(index);
      d.group.weights.push_back(ref.weight);
    }
    if (d.group.backends.size() > k_group_backends_max) {
      throw config_error(fmt::format("{}: group \"{}\" has {} backends; allowed: at most {}", d.origin, d.group.name,
                                     d.group.backends.size(), k_group_backends_max));
    }
    // A topic adds to the classifier's evidence: with no classifier it
    // would be read by nothing, so it is refused rather than ignored.
    if (d.group.topic != semantic_topic::none && cfg->router.semantic == semantic_mode::off) {
      throw config_error(fmt::format("{}: group \"{}\" names topic = \"{}\", which needs [router] semantic = "
                                     "\"classifier\" (or \"embeddings\", whose fallback classifier reads it)",
                                     d.origin, d.group.name, topic_name(d.group.topic)));
    }
    cfg->groups.push_back(std::move(d.group));
  }
  if (cfg->router.semantic != semantic_mode::off) cfg->router.model = build_semantic_model(*cfg, router_origin);
  if (cfg->router.semantic == semantic_mode::embeddings) resolve_embeddings_group(*cfg, router_origin);
  return cfg;
}

std::string_view to_string(backend_protocol p) noexcept {
  switch (p) {
    case backend_protocol::openai: return "openai";
    case backend_protocol::triton: return "triton";
    case backend_protocol::anthropic: return "anthropic";
  }
  return "openai";
}

std::shared_ptr<const config> load_from_flags(const flags& f) {
  if (!f.config_path) return load(embedded_default_toml(), "<embedded default>", f);
  std::ifstream in(*f.config_path, std::ios::binary);
  if (!in) {
    throw config_error(fmt::format("{}: cannot read the config file: {}", *f.config_path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw config_error(fmt::format("{}: read error: {}", *f.config_path, std::strerror(errno)));
  return load(text.str(), *f.config_path, f);
}

}  // namespace sluice::config
