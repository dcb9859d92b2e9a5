#pragma once
// config: TOML file + flags -> one validated, immutable snapshot. Cold path
// only (start-up and SIGHUP); exceptions are allowed here and stop at main().
//
// Layout and defaults: docs/architecture.md §6 and README "Configuration". Every limit
// and timeout has a default so that `sluice` with no arguments runs.
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/semantic_examples.hpp"
#include "sluice/config/semantic_topics.hpp"

namespace sluice::config {

struct semantic_model;  // sluice/config/semantic.hpp
class centroid_slot;    // sluice/config/semantic.hpp

// A parse or validation failure; what() reads "FILE:LINE: what is wrong and
// what is allowed" (or "--flag: ..." for flags).
struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A resolved socket address plus the text it came from ("127.0.0.1:8080").
struct socket_address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string text;
  int family() const { return storage.ss_family; }
  uint16_t port() const;
};
socket_address parse_socket_address(std::string_view text);  // throws config_error

// "redis://host:port" (port 6379 when left out; IPv6 in brackets). The host
// may be a name: the cluster client resolves it once, at start.
struct redis_url {
  std::string host;
  uint16_t port = 6379;
};
redis_url parse_redis_url(std::string_view text);  // throws config_error

struct server_config {
  socket_address listen;                 // default 127.0.0.1:8080
  socket_address admin;                  // default 127.0.0.1:9090
  std::string admin_token_env;           // env var holding the admin bearer token; "" = none
  std::string admin_token;               // its value, read at load (never logged)
  std::vector<int> cpus;                 // empty = the process's affinity mask
  // Pinned shards: a new connection goes to the shard of the CPU that
  // received it (SO_REUSEPORT program; docs/operations.md). Off by default:
  // it pays only where the NIC's receive queues are spread over the shards'
  // CPUs, and it puts every connection of a client on this host (loopback)
  // on the shard of that client's CPU.
  bool reuseport_steering = false;
  // Each shard pinned to its own CPU of the list above (the default: cores
  // the gateway owns). false: the shards run on those CPUs as a set and the
  // scheduler moves them, for cores shared with other busy processes (a
  // pinned shard cannot leave a CPU its neighbours crowd; bench/RESULTS.md,
  // docs/operations.md). Steering needs pinned shards.
  bool pin_shards = true;
  uint64_t max_body_bytes = 8u << 20;
  uint32_t max_head_bytes = 32u << 10;   // 431 beyond
  uint32_t max_line_bytes = 8u << 10;    // 431 (414 for the request line)
  uint32_t max_header_count = 100;       // 431 beyond
  uint32_t header_timeout_ms = 10000;    // total, not per read: 408
  uint32_t body_timeout_ms = 10000;      // then a minimum rate of body_min_rate_bytes_per_s
  uint32_t body_min_rate_bytes_per_s = 1024;
  uint32_t idle_timeout_ms = 60000;      // keep-alive idle close
  uint32_t drain_timeout_ms = 30000;     // SIGTERM: finish in-flight up to this
  uint32_t connections_max = 16384;      // per shard; beyond: 503 + close
  uint32_t inflight_max = 4096;          // per shard requests in flight; beyond: 503
  uint64_t memory_max_bytes = 1ull << 30; // per shard connection memory; beyond: new requests get 503 (0 = no cap)
  bool splice = false;                   // accepted for old configs; no effect (bodies go by copy: README)
  uint32_t upstream_buffers = 64;        // per shard, 64 KiB each, lent to backend receives while bytes are held
  uint32_t idle_poll_us = 50;            // a shard with few requests open polls this long before sleeping (0 = never)
  uint32_t batch_wait_us = 0;            // a shard with many requests open waits up to this long for a batch (0 = never)
  uint32_t ping_interval_ms = 10000;     // a Messages stream sluice renders: a ping event after this long quiet (0 = never)
  // The client edge (TLS, HTTP/2): docs/architecture.md §6a.
  bool h2c = true;                       // the plaintext listener also takes HTTP/2 with prior knowledge
  socket_address listen_tls;             // a TLS listener (ALPN h2, http/1.1); unset (length 0) = none
  std::string tls_cert;                  // PEM: the leaf, then its chain; re-read on SIGHUP
  std::string tls_key;                   // PEM private key (never logged)
  std::string tls_min_version = "1.2";   // "1.2" | "1.3"
  bool tls_h2 = true;                    // offer h2 in the TLS listener's ALPN
  uint32_t h2_max_concurrent_streams = 100;
  uint32_t h2_stream_window_bytes = 64u << 10;      // SETTINGS_INITIAL_WINDOW_SIZE
  uint32_t h2_connection_window_bytes = 1u << 20;   // the connection's receive window
  uint32_t h2_hpack_table_bytes = 4096;             // SETTINGS_HEADER_TABLE_SIZE
  uint32_t h2_resets_per_second_max = 100;          // client + provoked resets in a second: GOAWAY beyond
  uint32_t h2_memory_max_bytes = 4u << 20;          // per connection: nghttp2's state, tables, queued frames
};

// How an event stream's chunks are read (upstream.sse_scan): "boundaries"
// (a whole chunk of one plain content event is counted inside the chunk
// walk, README "The SSE scan") or "full" (every chunk through the scan).
enum class sse_scan_mode : uint8_t { boundaries, full };

struct upstream_config {
  uint32_t connect_timeout_ms = 2000;
  uint32_t first_byte_timeout_ms = 120000;
  uint32_t stream_idle_timeout_ms = 30000;
  uint32_t total_timeout_ms = 0;          // 0 = none
  uint32_t max_retries = 1;               // only before any response byte reached the client
  uint32_t pool_idle_max = 256;           // idle keep-alive connections per backend per shard (an HTTP/2 client brings up to 100 streams per connection)
  // A pooled connection idle this long is closed rather than reused: under
  // the backend's own keep-alive timeout (vLLM's uvicorn: 5 s), so no
  // request is written into a connection the backend is closing (its FIN
  // still on the way), where a POST is lost, not sent twice. 0 = no limit.
  uint32_t pool_idle_timeout_ms = 4000;
  uint32_t connections_max = 1024;        // open connections per backend per shard; beyond: 503
  sse_scan_mode sse_scan = sse_scan_mode::boundaries;
};

struct quota_config {
  uint32_t input_weight = 1;
  uint32_t output_weight = 2;
  uint32_t default_max_tokens = 4096;
  uint32_t max_tokens_cap = 32768;       // a request's max_tokens above its group's cap: 400
  uint32_t image_tokens = 1024;          // admission estimate per image content part
  // Budgets' usage across restarts (README "Budgets"); "" = not kept.
  std::string budget_state_file = "sluice-budgets.json";
};

struct audit_config {
  std::string path = "sluice-audit.jsonl";  // "" = off
  // Written lines are fdatasync'ed at most this long after they were written
  // (a host crash loses at most this much); 0 = after every batch.
  uint32_t fsync_interval_ms = 1000;
};

// A group has at most this many backends: the router's per-group masks are
// one 64-bit word.
inline constexpr size_t k_group_backends_max = 64;

// What a backend speaks, by its URL's scheme: http:// is HTTP/1.1 (the
// OpenAI API, or Anthropic's Messages API, by its group's protocol);
// grpc:// is gRPC over HTTP/2 cleartext (KServe v2 / Triton).
enum class backend_transport : uint8_t { http1, grpc };

struct backend_config {
  std::string url;          // normalized: "http://127.0.0.1:8000", "grpc://10.0.0.7:8001"
  std::string host_header;  // "127.0.0.1:8000" (HTTP/2: :authority)
  backend_transport transport = backend_transport::http1;
  socket_address address;   // resolved at load
  bool removed = false;     // gone from the file at a reload; kept so indices stay valid (see reconcile)
};

// Health checking (route::backend_health): active GET /health probes from
// the control thread, passive ejection on request failures. [health] holds
// the defaults; a group may override them in [group.health].
struct health_config {
  uint32_t interval_ms = 2000;       // active probe period; 0 = no active probes
  uint32_t timeout_ms = 1000;        // a probe slower than this failed
  uint32_t rise = 2;                 // consecutive probe successes: down -> up
  uint32_t fall = 3;                 // consecutive probe failures: up -> down
  uint32_t eject_after = 5;          // consecutive connect failures, resets, timeouts, bad responses: ejected
  uint32_t max_ejection_percent = 50;     // never eject more of a group's backends than this (floor)
  uint32_t panic_threshold_percent = 50;  // fewer healthy than this: spread over all of the group's backends
  uint32_t backoff_ms = 1000;        // first ejection; doubles on each re-ejection
  uint32_t backoff_max_ms = 60000;   // the doubling stops here
};

// [router]: which model name means "pick a group by [[rule]]", and the group
// used when no rule matches ("" = none: such a request gets 404).
//
// semantic = "classifier": the auto model's group is also picked by what the
// prompt means (README "Semantic routing"): the example scorer (naive Bayes and
// the nearest examples) built at load from the groups' examples, or fastText
// (trained from them, or read from model_file).
enum class semantic_mode : uint8_t { off, classifier, embeddings };
struct router_config {
  std::string auto_model = "auto";
  std::string default_group;
  uint32_t default_group_index = UINT32_MAX;  // resolved at load; UINT32_MAX = none
  semantic_mode semantic = semantic_mode::off;
  // examples: naive Bayes + nearest examples over the groups' examples;
  // fasttext: fastText's supervised model (always with model_file).
  classifier_method classifier = classifier_method::examples;
  // The classifier's top probability below this: not its decision, unless
  // its group's topic matched a term (a code pick with none needs at least
  // 0.75 whatever this says: unbacked_confidence in semantic_topics.hpp).
  double min_confidence = 0.5;
  std::string model_file;                    // a fastText supervised model (.bin); "" = train from examples
  uint32_t semantic_bytes = 2048;            // leading bytes of the text the classifier reads (cut at UTF-8)
  bool include_system = false;               // the system prompt is read too (before the user message)
  uint32_t token_cache = 4096;               // tokens' summed vectors kept per shard (a power of two; 0 = none)
  bool group_header = false;                 // x-sluice-group response header on routed answers
  // Nats of log-odds per hit of a group's topic vocabulary ([[group]] topic).
  double topic_weight = 2.0;
  // semantic = "embeddings": the group whose backends serve /v1/embeddings
  // (its index resolved at load), each call's timeout, the per-shard cache.
  std::string embeddings_group;
  uint32_t embeddings_group_index = UINT32_MAX;
  uint32_t embeddings_timeout_ms = 250;
  uint32_t embeddings_cache = 4096;          // decisions kept per shard (a power of two; 0 = none)
  // The centroids of this snapshot, published by the control thread.
  std::shared_ptr<centroid_slot> centroids;
  // The trained model (semantic = "classifier", and "embeddings" as its
  // fallback); shared read-only by the shards through this snapshot. Null when off.
  std::shared_ptr<const semantic_model> model;
};

// [[rule]]: one ordered semantic-routing rule. Every condition that is set
// must hold; the first rule that matches picks its group.
struct rule_config {
  std::string group;                         // group name
  uint32_t group_index = 0;                  // resolved at load
  std::vector<std::string> contains_any;     // keywords, ASCII case-insensitive, on the last user message
  std::string regex;                         // ECMAScript, case-insensitive; "" = none (checked at load)
  uint64_t min_prompt_bytes = 0;             // on openai input_bytes
  uint64_t max_prompt_bytes = UINT64_MAX;
  std::optional<bool> has_tools;             // unset = either
  std::optional<bool> has_images;
  bool before = false;                       // priority = "before": decides ahead of the classifier
  std::string origin;                        // "FILE:LINE" of the [[rule]], for logs
};

// The protocol a group's backends speak (docs/architecture.md §6a): the client always
// sees the OpenAI API.
enum class backend_protocol : uint8_t {
  openai,     // OpenAI over HTTP/1.1: vLLM, SGLang, trtllm-serve, llama.cpp (passed through)
  triton,     // KServe v2 gRPC ModelStreamInfer: Triton's vLLM or TensorRT-LLM backend
  anthropic,  // Anthropic's Messages API over HTTP/1.1 (POST /v1/messages)
};
std::string_view to_string(backend_protocol p) noexcept;

// The client dialects a group's backends speak natively (docs/architecture.md §6b), as
// bits: a client speaking one is passed through, any other is translated.
namespace native {
inline constexpr uint8_t chat = 1, responses = 2, messages = 4;
}

// protocol = "triton": which model's inputs the request is written for.
enum class triton_flavor : uint8_t {
  vllm,    // Triton's vLLM backend: text_input, stream, sampling_parameters (JSON), return_* flags
  trtllm,  // TensorRT-LLM's ensemble: text_input, max_tokens, stream, temperature, top_p, stop_words
};

// A text-prompt backend's chat template (the names of openai::chat_template;
// config sits below openai, so it holds the names and strings only).
struct chat_template_config {
  std::string kind = "chatml";  // chatml | llama3 | mistral | custom
  bool include_bos = true;      // chat_template_bos: false where the backend's tokenizer adds its own
  // [group.custom_template]: kind = "custom" only.
  std::string begin, system_prefix, system_suffix, user_prefix, user_suffix, assistant_prefix, assistant_suffix,
      generation_prefix;
};

// How a group's requests reach its backends (docs/architecture.md §2c).
enum class admission_mode : uint8_t {
  fcfs,  // forwarded at once (the backend queues what it cannot run)
  fair,  // at most max_inflight_per_backend per backend; the rest wait at the
         // gateway and are released by virtual token counters
};

struct group_config {
  std::string name;
  backend_protocol protocol = backend_protocol::openai;
  // native_dialects: openai ["chat"], anthropic ["messages"], triton [] by default.
  uint8_t native_dialects = native::chat;
  triton_flavor flavor = triton_flavor::vllm;  // protocol = "triton"
  chat_template_config chat_template;          // protocol = "triton"
  std::vector<std::string> models;   // exact names and glob patterns ("*", "qwen-*")
  // Semantic router: prompts that belong to this group, from `examples` and
  // the lines of `examples_file` (relative to the config file).
  std::vector<std::string> examples;
  std::string examples_file;
  // The built-in topic vocabulary whose terms add evidence for this group
  // in the classifier (config/semantic_topics.hpp); none = examples alone.
  semantic_topic topic = semantic_topic::none;
  std::string backend_model;         // "" = forward the client's model unchanged
  std::string balance = "session";   // session | prefix | least-loaded | round-robin
  std::vector<uint32_t> backends;    // indices into config::backends
  uint32_t default_max_tokens = 0;   // 0 = quota.default_max_tokens
  uint32_t max_tokens_cap = 0;       // 0 = quota.max_tokens_cap
  upstream_config upstream;          // [upstream] with this group's overrides
  // Additions for routing (docs/architecture.md §3):
  std::vector<uint32_t> weights;     // parallel to `backends`; 1..1000, default 1
  uint32_t prefix_messages = 2;      // route-key messages: 1 = system prompt, 2 = + first user, 3..8 = first K
  uint32_t prefix_bytes = 4096;      // /v1/completions: leading prompt bytes in the route key
  double bounded_load = 1.25;        // c of "Consistent Hashing with Bounded Loads"; 0 = off
  std::string api_key_env;           // environment variable holding the backends' key; "" = none
  std::string api_key;               // its value, read at load (never logged)
  // Streams: ask the backend for usage (stream_options.include_usage) when
  // the client did not, to bill exact tokens; false for backends that
  // reject the field (then content events are counted instead).
  bool inject_usage = true;
  health_config health;              // [health] with this group's overrides
  // Budgets of the group, all keys together (UTC day / month; 0 = none),
  // and the cost of its tokens, for keys' spend budgets.
  uint64_t daily_tokens = 0;
  uint64_t monthly_tokens = 0;
  double input_cost_per_mtok = 0;    // currency per 1M prompt tokens
  double output_cost_per_mtok = 0;   // currency per 1M completion tokens
  // Fair admission (docs/architecture.md §2c, README "Fair admission").
  admission_mode admission = admission_mode::fcfs;
  uint32_t max_inflight_per_backend = 0;  // slots per backend; 0 = unlimited (fcfs only)
  uint32_t queue_timeout_ms = 30000;      // queued longer: 429 queue_timeout
  uint32_t queue_max = 10000;             // queued requests before 429 at once
  bool removed = false;              // gone from the file at a reload: matches no model (see reconcile)
};

struct key_config {
  std::string id;                          // appears in audit/metrics; never the key itself
  std::array<uint8_t, 32> key_sha256{};    // SHA-256 of the bearer key
  uint64_t tokens_per_minute = 0;          // 0 = unlimited
  uint64_t requests_per_minute = 0;        // 0 = unlimited
  uint32_t max_concurrent = 0;             // 0 = unlimited
  std::vector<std::string> groups{"*"};    // group names or globs
  // Budgets (README "Budgets"): prompt + completion tokens, and spend at
  // the groups' costs, per UTC calendar day / month; 0 = none.
  uint64_t daily_tokens = 0;
  uint64_t monthly_tokens = 0;
  double daily_spend = 0;
  double monthly_spend = 0;
  // Fair admission: the key's share of a saturated group (by weighted
  // tokens) and its level (higher goes first; 0..7).
  double weight = 1.0;
  uint32_t priority = 0;
  bool removed = false;                    // gone (or re-limited) at a reload: never authenticates
};

// [cluster]: several instances share each key's limits through Redis
// (include/sluice/cluster/cluster.hpp). redis = "": this process alone.
struct cluster_config {
  std::string redis;                 // as written; "" = off
  redis_url url;                     // parsed from `redis`
  std::string password_env;          // env var holding Redis's password (AUTH); "" = none
  std::string password;              // its value, read at load (never logged)
  std::string key_prefix = "sluice:";
  uint32_t expected_instances = 1;   // the fallback share's divisor
  uint32_t timeout_ms = 200;         // per Redis command; slower drops the connection
  double fallback_share = 0;         // of a key's limit, per instance, while Redis is away; 0 = 1 / expected_instances
  uint32_t lease_window_ms = 5000;   // a lease covers this much of the key's recent demand
  uint32_t lease_ttl_ms = 10000;     // a lease record's life in Redis (the outstanding total)
  bool enabled() const { return !redis.empty(); }
};

// [responses]: the response store that previous_response_id, GET and
// DELETE /v1/responses/{id} read on groups that translate Responses (README
// "Responses state"). Kept by the control thread; shards reach it by
// messages and never wait on it.
enum class response_store_mode : uint8_t { off, local, redis };
struct responses_config {
  response_store_mode store = response_store_mode::off;
  uint32_t store_ttl_s = 3600;                 // an entry lives this long after its response
  uint64_t store_max_bytes = 64ull << 20;      // the store's entries together; the oldest go first beyond
};

struct config {
  std::string source;  // file path, or "<embedded default>"
  server_config server;
  upstream_config upstream;
  quota_config quota;
  audit_config audit;
  std::vector<backend_config> backends;  // distinct backend URLs of all groups
  std::vector<group_config> groups;
  std::vector<key_config> keys;
  health_config health;                  // [health] defaults
  router_config router;                  // [router]
  std::vector<rule_config> rules;        // [[rule]], in file order
  cluster_config cluster;                // [cluster]
  responses_config responses;            // [responses]
};

// Command-line flags as parsed; empty optionals mean "not given".
struct flags {
  std::optional<std::string> config_path;
  std::optional<std::string> listen;
  std::optional<std::string> admin;
  std::vector<std::string> backends;   // --backend URL (repeatable): replaces every group's backends
  std::optional<std::string> cpus;     // "0-3,8"
  std::optional<int> numa_node;
  std::optional<std::string> log_level;
  std::optional<std::string> explain_route;  // --explain-route PROMPT
  bool check_config = false;
  bool version = false;
  bool help = false;
};

// Parses argv. Throws config_error naming the flag on bad input.
flags parse_flags(int argc, const char* const* argv);
std::string_view usage_text();

// The TOML text used when no --config is given (docs/architecture.md §6).
std::string_view embedded_default_toml();

// Loads TOML text (`source` names it in messages), validates, applies flags.
// Throws config_error("source:line: ...") on any problem.
std::shared_ptr<const config> load(std::string_view toml_text, std::string_view source, const flags& f);
// Reads f.config_path (or the embedded default) and calls load().
std::shared_ptr<const config> load_from_flags(const flags& f);

// Live reload (SIGHUP). Shards and in-flight requests hold positions in
// config::backends, groups and keys (pools, rings, quota slices, metrics
// rows), so a reloaded snapshot keeps them: backends by URL, groups by name
// and keys by id (with the same limits) stay where they were; ones the file
// no longer has stay as `removed` placeholders (an in-flight request may
// still finish on them; nothing new reaches them); new ones are appended. A
// key whose limits changed is a new key (fresh buckets) and its old entry a
// placeholder. [server] and [audit] keep their running values: sockets,
// shards and audit files are set up at start (`notes` says when the file
// changed them). Returns: the reconciled snapshot; `notes` gets one line
// per change, for the log. Throws config_error when the result would need
// more than `capacity` entries (the process sizes its tables at start).
struct reload_capacity {
  size_t backends = 0, groups = 0, keys = 0;
};
reload_capacity capacity_for(const config& at_start);
std::shared_ptr<const config> reconcile(const config& next, const config& running, const reload_capacity& capacity,
                                        std::vector<std::string>& notes);

// "0-3,8" -> {0,1,2,3,8}. Throws config_error on bad syntax.
std::vector<int> parse_cpu_list(std::string_view text);

// SHA-256 of `key` (OpenSSL).
std::array<uint8_t, 32> sha256(std::string_view key);

}  // namespace sluice::config
