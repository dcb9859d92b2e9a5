#include <doctest/doctest.h>

#include <arpa/inet.h>

#include <cstdlib>

#include <string>
#include <string_view>

#include "sluice/config/config.hpp"

namespace cfg = sluice::config;

namespace {

// A valid tail that error cases append after their own lines, so that the
// line numbers in the expected messages count from the case's first line.
constexpr std::string_view k_valid_tail = R"(
[[group]]
name = "g"
models = ["*"]
backends = ["http://127.0.0.1:8000"]

[[key]]
id = "k"
key = "secret"
)";

std::shared_ptr<const cfg::config> load(std::string_view text, const cfg::flags& f = {}) {
  return cfg::load(text, "test.toml", f);
}

// Returns the config_error message, or "" when the text loads.
std::string error_of(std::string_view text, const cfg::flags& f = {}) {
  try {
    load(text, f);
  } catch (const cfg::config_error& e) {
    return e.what();
  }
  return "";
}

std::string hex(const std::array<uint8_t, 32>& digest) {
  static constexpr char k_digits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest) {
    out += k_digits[b >> 4];
    out += k_digits[b & 15];
  }
  return out;
}

}  // namespace

TEST_SUITE("config::load") {
  TEST_CASE("the embedded default loads and matches the documented defaults") {
    auto c = cfg::load_from_flags({});
    CHECK(c->source == "<embedded default>");
    CHECK(c->server.listen.text == "127.0.0.1:8080");
    CHECK(c->server.listen.family() == AF_INET);
    CHECK(c->server.listen.port() == 8080);
    CHECK(c->server.admin.port() == 9090);
    CHECK(c->server.cpus.empty());
    CHECK_FALSE(c->server.reuseport_steering);
    CHECK(c->server.pin_shards);
    CHECK(c->server.max_body_bytes == 8u << 20);
    CHECK_FALSE(c->server.splice);  // the copy path wins the trickle workload (bench/RESULTS.md)
    CHECK(c->server.upstream_buffers == 64);
    CHECK(c->server.idle_poll_us == 50);
    CHECK(c->server.ping_interval_ms == 10000);
    CHECK(c->server.batch_wait_us == 0);  // off: it costs CPU on shared cores and trickles (bench/RESULTS.md)
    CHECK(c->upstream.first_byte_timeout_ms == 120000);
    CHECK(c->audit.path == "sluice-audit.jsonl");
    CHECK(c->audit.fsync_interval_ms == 1000);
    REQUIRE(c->groups.size() == 1);
    CHECK(c->groups[0].name == "default");
    CHECK(c->groups[0].models == std::vector<std::string>{"*"});
    CHECK(c->groups[0].balance == "session");
    REQUIRE(c->backends.size() == 1);
    CHECK(c->backends[0].url == "http://127.0.0.1:8000");
    CHECK(c->backends[0].host_header == "127.0.0.1:8000");
    CHECK(c->backends[0].address.port() == 8000);
    CHECK(c->groups[0].backends == std::vector<uint32_t>{0});
    REQUIRE(c->keys.size() == 1);
    CHECK(c->keys[0].id == "test");
    CHECK(c->keys[0].key_sha256 == cfg::sha256("test-key"));
    CHECK(c->keys[0].tokens_per_minute == 0);
    CHECK(c->keys[0].groups == std::vector<std::string>{"*"});
  }

  TEST_CASE("every documented field is read from the file") {
    auto c = load(R"(
[server]
listen = "0.0.0.0:0"
admin = "[::1]:9191"
cpus = "0-1,3"
max_body_bytes = 2048
max_head_bytes = 16384
max_line_bytes = 4096
max_header_count = 50
header_timeout_ms = 1000
body_timeout_ms = 2000
body_min_rate_bytes_per_s = 0
idle_timeout_ms = 3000
drain_timeout_ms = 4000
connections_max = 100
inflight_max = 10
memory_max_bytes = 0
splice = true
upstream_buffers = 8
idle_poll_us = 0
batch_wait_us = 200
reuseport_steering = true

[upstream]
connect_timeout_ms = 500
first_byte_timeout_ms = 600
stream_idle_timeout_ms = 700
total_timeout_ms = 800
max_retries = 3
pool_idle_max = 5
pool_idle_timeout_ms = 900
connections_max = 7
sse_scan = "full"

[quota]
input_weight = 2
output_weight = 3
default_max_tokens = 100

[audit]
path = ""
fsync_interval_ms = 0

[[group]]
name = "qwen"
models = ["qwen2.5-7b", "qwen2.5-7b-*"]
backend_model = "Qwen/Qwen2.5-7B-Instruct"
balance = "prefix"
backends = ["http://127.0.0.1:8001/", "http://LOCALHOST:8002"]
default_max_tokens = 50
[group.upstream]
max_retries = 0
first_byte_timeout_ms = 9000
sse_scan = "boundaries"

[[group]]
name = "other"
balance = "round-robin"
backends = ["http://127.0.0.1:8001"]

[[key]]
id = "alice"
key_sha256 = "62AF8704764FAF8EA82FC61CE9C4C3908B6CB97D463A634E9E587D7C885DB0EF"
tokens_per_minute = 100000
requests_per_minute = 600
max_concurrent = 64
groups = ["qw*"]
)");
    const auto& s = c->server;
    CHECK(s.listen.port() == 0);
    CHECK(s.admin.family() == AF_INET6);
    CHECK(s.admin.port() == 9191);
    CHECK(s.cpus == std::vector<int>{0, 1, 3});
    CHECK(s.max_body_bytes == 2048);
    CHECK(s.max_head_bytes == 16384);
    CHECK(s.max_line_bytes == 4096);
    CHECK(s.max_header_count == 50);
    CHECK(s.header_timeout_ms == 1000);
    CHECK(s.body_timeout_ms == 2000);
    CHECK(s.body_min_rate_bytes_per_s == 0);
    CHECK(s.idle_timeout_ms == 3000);
    CHECK(s.drain_timeout_ms == 4000);
    CHECK(s.connections_max == 100);
    CHECK(s.inflight_max == 10);
    CHECK(s.memory_max_bytes == 0);
    CHECK(s.splice);
    CHECK(s.upstream_buffers == 8);
    CHECK(s.idle_poll_us == 0);
    CHECK(s.batch_wait_us == 200);
    CHECK(s.reuseport_steering);
    CHECK(c->upstream.connect_timeout_ms == 500);
    CHECK(c->upstream.first_byte_timeout_ms == 600);
    CHECK(c->upstream.stream_idle_timeout_ms == 700);
    CHECK(c->upstream.total_timeout_ms == 800);
    CHECK(c->upstream.max_retries == 3);
    CHECK(c->upstream.pool_idle_max == 5);
    CHECK(c->upstream.pool_idle_timeout_ms == 900);
    CHECK(c->upstream.connections_max == 7);
    CHECK(c->upstream.sse_scan == cfg::sse_scan_mode::full);
    CHECK(c->quota.input_weight == 2);
    CHECK(c->quota.output_weight == 3);
    CHECK(c->quota.default_max_tokens == 100);
    CHECK(c->audit.path.empty());
    CHECK(c->audit.fsync_interval_ms == 0);

    REQUIRE(c->groups.size() == 2);
    const auto& q = c->groups[0];
    CHECK(q.models == std::vector<std::string>{"qwen2.5-7b", "qwen2.5-7b-*"});
    CHECK(q.backend_model == "Qwen/Qwen2.5-7B-Instruct");
    CHECK(q.balance == "prefix");
    CHECK(q.default_max_tokens == 50);
    // group overrides apply on top of [upstream], the rest is inherited
    CHECK(q.upstream.max_retries == 0);
    CHECK(q.upstream.first_byte_timeout_ms == 9000);
    CHECK(q.upstream.connect_timeout_ms == 500);
    CHECK(c->groups[1].upstream.max_retries == 3);
    CHECK(q.upstream.sse_scan == cfg::sse_scan_mode::boundaries);
    CHECK(c->groups[1].upstream.sse_scan == cfg::sse_scan_mode::full);  // inherited
    CHECK(c->groups[1].models == std::vector<std::string>{"other"});

    // The two groups share one backend (written with and without '/'): it
    // appears once in config::backends and both groups point at it.
    REQUIRE(c->backends.size() == 2);
    CHECK(c->backends[0].url == "http://127.0.0.1:8001");
    CHECK(c->backends[1].url == "http://localhost:8002");
    CHECK(c->backends[1].host_header == "localhost:8002");
    CHECK(q.backends == std::vector<uint32_t>{0, 1});
    CHECK(c->groups[1].backends == std::vector<uint32_t>{0});

    REQUIRE(c->keys.size() == 1);
    const auto& k = c->keys[0];
    CHECK(k.key_sha256 == cfg::sha256("test-key"));
    CHECK(k.tokens_per_minute == 100000);
    CHECK(k.requests_per_minute == 600);
    CHECK(k.max_concurrent == 64);
    CHECK(k.groups == std::vector<std::string>{"qw*"});
  }

  TEST_CASE("an IPv6 backend keeps its brackets in the Host header") {
    auto c = load(R"(
[[group]]
name = "g"
backends = ["http://[::1]:8000"]
[[key]]
id = "k"
key = "x"
)");
    REQUIRE(c->backends.size() == 1);
    CHECK(c->backends[0].host_header == "[::1]:8000");
    CHECK(c->backends[0].address.family() == AF_INET6);
    CHECK(c->backends[0].address.text == "[::1]:8000");
  }
}

TEST_SUITE("config::protocols") {
  TEST_CASE("triton and anthropic groups: protocol, flavour, template and the backends' transport") {
    auto c = load(R"(
[[group]]
name = "trt"
protocol = "triton"
triton_flavor = "trtllm"
chat_template = "custom"
chat_template_bos = false
backends = ["grpc://127.0.0.1:8001/"]
[group.custom_template]
begin = "<s>"
user_prefix = "[U] "
user_suffix = "\n"
generation_prefix = "[A] "

[[group]]
name = "claude"
protocol = "anthropic"
backends = ["http://127.0.0.1:8002"]

[[group]]
name = "tri-default"
protocol = "triton"
backends = ["grpc://127.0.0.1:8003"]
[[key]]
id = "k"
key = "x"
)");
    REQUIRE(c->groups.size() == 3);
    const auto& trt = c->groups[0];
    CHECK(trt.protocol == cfg::backend_protocol::triton);
    CHECK(trt.flavor == cfg::triton_flavor::trtllm);
    CHECK(trt.chat_template.kind == "custom");
    CHECK_FALSE(trt.chat_template.include_bos);
    CHECK(trt.chat_template.begin == "<s>");
    CHECK(trt.chat_template.user_prefix == "[U] ");
    CHECK(trt.chat_template.user_suffix == "\n");
    CHECK(trt.chat_template.generation_prefix == "[A] ");
    CHECK(trt.chat_template.system_prefix.empty());
    CHECK(c->groups[1].protocol == cfg::backend_protocol::anthropic);
    CHECK(c->groups[2].flavor == cfg::triton_flavor::vllm);
    CHECK(c->groups[2].chat_template.kind == "chatml");
    CHECK(c->groups[2].chat_template.include_bos);
    REQUIRE(c->backends.size() == 3);
    CHECK(c->backends[0].url == "grpc://127.0.0.1:8001");
    CHECK(c->backends[0].transport == cfg::backend_transport::grpc);
    CHECK(c->backends[0].host_header == "127.0.0.1:8001");
    CHECK(c->backends[1].transport == cfg::backend_transport::http1);
    CHECK(cfg::to_string(cfg::backend_protocol::anthropic) == "anthropic");
  }

  TEST_CASE("server.pin_shards: true by default, false read, and refused beside steering, which needs pinned shards") {
    const std::string tail = "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:1\"]\n[[key]]\nid = \"k\"\nkey = \"x\"\n";
    CHECK(load("[server]\ncpus = \"0\"\n" + tail)->server.pin_shards);
    CHECK_FALSE(load("[server]\npin_shards = false\n" + tail)->server.pin_shards);
    CHECK(load("[server]\npin_shards = true\nreuseport_steering = true\n" + tail)->server.reuseport_steering);
    CHECK(error_of("[server]\npin_shards = \"no\"\n" + tail).find("server.pin_shards must be true or false") != std::string::npos);
    const std::string e = error_of("[server]\npin_shards = false\nreuseport_steering = true\n" + tail);
    CHECK(e.find("test.toml:3") != std::string::npos);
    CHECK(e.find("server.reuseport_steering = true needs pinned shards (pin_shards = true)") != std::string::npos);
  }

  TEST_CASE("upstream.sse_scan takes \"boundaries\" (the default) or \"full\", and says so for anything else") {
    const std::string tail = "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:1\"]\n[[key]]\nid = \"k\"\nkey = \"x\"\n";
    const std::string e = error_of("[upstream]\nsse_scan = \"skip\"\n" + tail);
    CHECK(e.find("upstream.sse_scan = \"skip\": expected \"boundaries\" or \"full\"") != std::string::npos);
    CHECK(error_of("[upstream]\nsse_scan = 1\n" + tail).find("upstream.sse_scan must be a string") != std::string::npos);
    CHECK(cfg::upstream_config{}.sse_scan == cfg::sse_scan_mode::boundaries);
  }

  TEST_CASE("native_dialects: a default per protocol, what is given, and what a protocol cannot speak refused") {
    const auto group = [](std::string_view body) {
      return "[[group]]\nname = \"g\"\n" + std::string(body) + "\n[[key]]\nid = \"k\"\nkey = \"x\"\n";
    };
    CHECK(load(group("backends = [\"http://127.0.0.1:1\"]"))->groups[0].native_dialects == cfg::native::chat);
    CHECK(load(group("protocol = \"anthropic\"\nbackends = [\"http://127.0.0.1:1\"]"))->groups[0].native_dialects ==
          cfg::native::messages);
    CHECK(load(group("protocol = \"triton\"\nbackends = [\"grpc://127.0.0.1:1\"]"))->groups[0].native_dialects == 0);
    CHECK(load(group("native_dialects = [\"chat\", \"responses\", \"messages\"]\nbackends = [\"http://127.0.0.1:1\"]"))
              ->groups[0].native_dialects == (cfg::native::chat | cfg::native::responses | cfg::native::messages));
    CHECK(error_of(group("native_dialects = []\nbackends = [\"http://127.0.0.1:1\"]"))
              .find("group.native_dialects must not be empty") != std::string::npos);
    CHECK(error_of(group("native_dialects = [\"grpc\"]\nbackends = [\"http://127.0.0.1:1\"]"))
              .find("group.native_dialects \"grpc\" is not a dialect; allowed: chat, responses, messages") != std::string::npos);
    CHECK(error_of(group("protocol = \"anthropic\"\nnative_dialects = [\"chat\"]\nbackends = [\"http://127.0.0.1:1\"]"))
              .find("a protocol = \"anthropic\" backend does not speak \"chat\"") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nnative_dialects = [\"messages\"]\nbackends = [\"grpc://127.0.0.1:1\"]"))
              .find("does not speak") != std::string::npos);
  }

  TEST_CASE("fair admission: the group's mode, slots and queue bounds, the key's weight and priority, each checked") {
    const auto with = [](std::string_view group, std::string_view key = "") {
      return "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:1\"]\n" + std::string(group) +
             "\n[[key]]\nid = \"k\"\nkey = \"x\"\n" + std::string(key) + "\n";
    };
    const auto d = load(with(""));
    CHECK(d->groups[0].admission == cfg::admission_mode::fcfs);
    CHECK(d->groups[0].max_inflight_per_backend == 0);
    CHECK(d->groups[0].queue_timeout_ms == 30000);
    CHECK(d->groups[0].queue_max == 10000);
    CHECK(d->keys[0].weight == 1.0);
    CHECK(d->keys[0].priority == 0);
    const auto f = load(with("admission = \"fair\"\nmax_inflight_per_backend = 64\nqueue_timeout_ms = 2000\nqueue_max = 50",
                             "weight = 2.5\npriority = 3"));
    CHECK(f->groups[0].admission == cfg::admission_mode::fair);
    CHECK(f->groups[0].max_inflight_per_backend == 64);
    CHECK(f->groups[0].queue_timeout_ms == 2000);
    CHECK(f->groups[0].queue_max == 50);
    CHECK(f->keys[0].weight == 2.5);
    CHECK(f->keys[0].priority == 3);
    CHECK(error_of(with("admission = \"wfq\"")).find("group.admission \"wfq\" is not a mode; allowed: fcfs, fair") !=
          std::string::npos);
    CHECK(error_of(with("admission = \"fair\"")).find("admission = \"fair\" needs max_inflight_per_backend") !=
          std::string::npos);
    CHECK(error_of(with("queue_max = 0")).find("group.queue_max") != std::string::npos);
    CHECK(error_of(with("", "weight = 0")).find("key.weight must be more than 0") != std::string::npos);
    CHECK(error_of(with("", "priority = 8")).find("key.priority") != std::string::npos);
    CHECK(error_of(with("", "weights = 1")).find("weights") != std::string::npos);  // a misspelt key is named
  }

  TEST_CASE("a protocol that does not fit its backends or its keys is refused, saying why") {
    const auto group = [](std::string_view body) {
      return "[[group]]\nname = \"g\"\n" + std::string(body) + "\n[[key]]\nid = \"k\"\nkey = \"x\"\n";
    };
    CHECK(error_of(group("protocol = \"grpc\"\nbackends = [\"grpc://127.0.0.1:1\"]"))
              .find("allowed: openai, triton, anthropic") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nbackends = [\"http://127.0.0.1:1\"]"))
              .find("protocol = \"triton\" backends are grpc://HOST:PORT") != std::string::npos);
    CHECK(error_of(group("backends = [\"grpc://127.0.0.1:1\"]")).find("grpc:// backends are for protocol = \"triton\"") !=
          std::string::npos);
    CHECK(error_of(group("protocol = \"anthropic\"\nbackends = [\"grpc://127.0.0.1:1\"]"))
              .find("grpc:// backends are for") != std::string::npos);
    CHECK(error_of(group("chat_template = \"llama3\"\nbackends = [\"http://127.0.0.1:1\"]"))
              .find("group.chat_template applies to protocol = \"triton\" only") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\ntriton_flavor = \"onnx\"\nbackends = [\"grpc://127.0.0.1:1\"]"))
              .find("allowed: vllm, trtllm") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nchat_template = \"zephyr\"\nbackends = [\"grpc://127.0.0.1:1\"]"))
              .find("allowed: chatml, llama3, mistral, custom") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nchat_template = \"custom\"\nbackends = [\"grpc://127.0.0.1:1\"]"))
              .find("needs a [group.custom_template] table") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nbackends = [\"grpc://127.0.0.1:1\"]\n[group.custom_template]\nbegin = \"x\""))
              .find("only with chat_template = \"custom\"") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nchat_template = \"custom\"\nbackends = [\"grpc://127.0.0.1:1\"]\n"
                         "[group.custom_template]\nuser_prefx = \"x\""))
              .find("user_prefx") != std::string::npos);
    CHECK(error_of(group("protocol = \"triton\"\nbackends = [\"grpcs://127.0.0.1:1\"]")).find("TLS to backends") !=
          std::string::npos);
  }
}

TEST_SUITE("config::errors") {
  // Each case: the text before the valid tail, the line the message must
  // name, and a fragment of the message. A new rule is a new row.
  struct error_case {
    const char* what;
    const char* text;
    int line;
    const char* fragment;
  };
  const error_case k_cases[] = {
      {"TOML syntax", "[server]\nlisten = \n", 2, "TOML syntax"},
      {"unknown key with a hint", "[server]\n\nlisne = \"1.2.3.4:1\"\n", 3, "unknown key \"lisne\" in [server] (did you mean \"listen\"?)"},
      {"unknown table", "[serve]\n", 1, "unknown key \"serve\" in the top level"},
      {"wrong type", "[server]\nmax_body_bytes = \"8M\"\n", 2, "server.max_body_bytes must be an integer (got a string)"},
      {"body too small", "[server]\nmax_body_bytes = 10\n", 2, "allowed: 1024-1073741824"},
      {"body too large", "[server]\nmax_body_bytes = 2147483648\n", 2, "out of range"},
      {"zero timeout", "[server]\n\n\nidle_timeout_ms = 0\n", 4, "server.idle_timeout_ms = 0 is out of range"},
      {"negative number", "[upstream]\nmax_retries = -1\n", 2, "upstream.max_retries = -1"},
      {"no upstream connections", "[upstream]\nconnections_max = 0\n", 2, "upstream.connections_max = 0 is out of range"},
      {"memory cap too large", "[server]\nmemory_max_bytes = 2199023255552\n", 2, "0 = no cap, else up to 1 TiB"},
      {"boolean type", "[server]\nsplice = 1\n", 2, "server.splice must be true or false"},
      {"fsync interval too long", "[audit]\nfsync_interval_ms = 86400001\n", 2, "allowed: 0-86400000 ms (0 = after every batch)"},
      {"fsync interval negative", "[audit]\n\nfsync_interval_ms = -1\n", 3, "audit.fsync_interval_ms = -1 is out of range"},
      {"misspelt audit key", "[audit]\nfsync_intervl_ms = 5\n", 2, "unknown key \"fsync_intervl_ms\" in [audit] (did you mean \"fsync_interval_ms\"?)"},
      {"upstream buffers not a power of two", "[server]\nupstream_buffers = 48\n", 2, "is not a power of two"},
      {"no upstream buffers", "[server]\nupstream_buffers = 0\n", 2, "upstream_buffers = 0 is out of range"},
      {"poll window too long", "[server]\nidle_poll_us = 1001\n", 2, "server.idle_poll_us = 1001 is out of range"},
      {"batch wait too long", "[server]\nbatch_wait_us = 1001\n", 2, "server.batch_wait_us = 1001 is out of range"},
      {"ping interval too long", "[server]\nping_interval_ms = 3600001\n", 2, "server.ping_interval_ms = 3600001 is out of range"},
      {"line larger than head", "[server]\nmax_head_bytes = 2048\nmax_line_bytes = 4096\n", 3, "larger than server.max_head_bytes"},
      {"bad listen address", "[server]\nlisten = \"localhost:80\"\n", 2, "server.listen: bad address \"localhost:80\""},
      {"listen without port", "[server]\nlisten = \"127.0.0.1\"\n", 2, "missing \":port\""},
      {"IPv6 without brackets", "[server]\nadmin = \"::1:80\"\n", 2, "needs brackets"},
      {"port out of range", "[server]\nlisten = \"127.0.0.1:65536\"\n", 2, "0-65535"},
      {"bad cpu list", "[server]\ncpus = \"3-1\"\n", 2, "runs backwards"},
      {"both weights zero", "[quota]\ninput_weight = 0\noutput_weight = 0\n", 1, "both 0"},
      {"server not a table", "server = 1\n", 1, "server must be a table"},
      {"group without name", "[[group]]\nbackends = [\"http://127.0.0.1:1\"]\n", 1, "needs a name"},
      {"duplicate group", "[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:1\"]\n", 6, "group name \"g\" is already used by the group at test.toml:1"},
      {"bad balance", "[[group]]\nname = \"a\"\nbalance = \"random\"\nbackends = [\"http://127.0.0.1:1\"]\n", 3, "allowed: session, prefix, least-loaded, round-robin"},
      {"group without backends", "[[group]]\nname = \"a\"\n", 1, "group \"a\" has no backends"},
      {"empty backends", "[[group]]\nname = \"a\"\nbackends = []\n", 3, "must not be empty"},
      {"https backend", "[[group]]\nname = \"a\"\nbackends = [\"https://127.0.0.1:1\"]\n", 3, "TLS to backends is not supported yet"},
      {"backend without port", "[[group]]\nname = \"a\"\nbackends = [\n\"http://127.0.0.1\"]\n", 4, "the port is missing"},
      {"backend with a path", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1/v1\"]\n", 3, "has no path"},
      {"backend listed twice", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\", \"http://127.0.0.1:1/\"]\n", 3, "twice"},
      {"unresolvable host", "[[group]]\nname = \"a\"\nbackends = [\"http://no-such-host.invalid:8000\"]\n", 3, "does not resolve"},
      {"unknown key in group.upstream", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\n[group.upstream]\nretries = 1\n", 5, "in [group.upstream]"},
      {"key with both secrets", "[[key]]\nid = \"a\"\nkey = \"x\"\nkey_sha256 = \"00\"\n", 1, "exactly one of"},
      {"key with no secret", "[[key]]\nid = \"a\"\n", 1, "exactly one of"},
      {"bad hex", "[[key]]\nid = \"a\"\nkey_sha256 = \"zz\"\n", 3, "64 hex digits (got 2 characters)"},
      {"duplicate key id", "[[key]]\nid = \"k\"\nkey = \"other\"\n", 11, "key id \"k\" is already used by the key at test.toml:1"},
      {"duplicate key secret", "[[key]]\nid = \"a\"\nkey = \"secret\"\n", 10, "key \"k\" has the same secret as key \"a\" at test.toml:1"},
      {"key group that matches nothing", "[[key]]\nid = \"a\"\nkey = \"y\"\ngroups = [\"nope*\"]\n", 4, "matches no [[group]]"},
      {"bad key id", "[[key]]\nid = \"a b\"\nkey = \"y\"\n", 2, "key.id \"a b\" is not allowed"},
      // Budgets (README "Budgets").
      {"negative daily tokens", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\n[[key]]\nid = \"x\"\nkey = \"x\"\ndaily_tokens = -1\n",
       7, "key.daily_tokens = -1 is out of range; allowed: 0-1000000000000000 (0 = none)"},
      {"monthly tokens as a string", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\n[[key]]\nid = \"x\"\nkey = \"x\"\nmonthly_tokens = \"10\"\n",
       7, "key.monthly_tokens must be an integer"},
      {"spend as a string", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\ninput_cost_per_mtok = 1\n[[key]]\nid = \"x\"\nkey = \"x\"\ndaily_spend = \"5\"\n",
       8, "key.daily_spend must be a number"},
      {"negative spend", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\ninput_cost_per_mtok = 1\n[[key]]\nid = \"x\"\nkey = \"x\"\nmonthly_spend = -2.5\n",
       8, "key.monthly_spend = -2.5 is out of range"},
      {"spend without a price", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\n[[key]]\nid = \"x\"\nkey = \"x\"\ndaily_spend = 5\n",
       7, "key \"x\": a spend budget needs a price"},
      {"negative cost", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\noutput_cost_per_mtok = -1\n", 4,
       "group.output_cost_per_mtok = -1 is out of range"},
      {"group budget typo", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\ndaily_token = 5\n", 4,
       "did you mean \"daily_tokens\""},
      {"state file not a string", "[quota]\nbudget_state_file = 1\n", 2, "quota.budget_state_file must be a string"},
      {"wrong scheme", "[cluster]\nredis = \"http://127.0.0.1:6379\"\n", 2, "the scheme is \"http\", not redis"},
      {"no scheme", "[cluster]\nredis = \"127.0.0.1:6379\"\n", 2, "no scheme"},
      {"tls scheme", "[cluster]\nredis = \"rediss://127.0.0.1:6379\"\n", 2, "(rediss://) is not supported"},
      {"no host", "[cluster]\nredis = \"redis://:6379\"\n", 2, "no host"},
      {"port out of range", "[cluster]\nredis = \"redis://127.0.0.1:70000\"\n", 2, "1-65535"},
      {"port 0", "[cluster]\nredis = \"redis://127.0.0.1:0\"\n", 2, "1-65535"},
      {"port not a number", "[cluster]\nredis = \"redis://127.0.0.1:abc\"\n", 2, "1-65535"},
      {"empty port", "[cluster]\nredis = \"redis://127.0.0.1:\"\n", 2, "empty port"},
      {"bare IPv6", "[cluster]\nredis = \"redis://::1:6379\"\n", 2, "needs brackets"},
      {"password in the URL", "[cluster]\nredis = \"redis://:pw@127.0.0.1:6379\"\n", 2, "password_env"},
      {"database number", "[cluster]\nredis = \"redis://127.0.0.1:6379/2\"\n", 2, "database number"},
      {"unset password variable", "[cluster]\nredis = \"redis://127.0.0.1\"\npassword_env = \"SLUICE_TEST_SURELY_UNSET\"\n", 3,
       "cluster.password_env: the environment variable \"SLUICE_TEST_SURELY_UNSET\" is unset or empty"},
      {"no instances", "[cluster]\nredis = \"redis://127.0.0.1\"\nexpected_instances = 0\n", 3, "expected_instances = 0 is out of range"},
      {"zero timeout", "[cluster]\nredis = \"redis://127.0.0.1\"\ntimeout_ms = 0\n", 3, "timeout_ms = 0 is out of range"},
      {"share above 1", "[cluster]\nredis = \"redis://127.0.0.1\"\nfallback_share = 1.5\n", 3, "fallback_share = 1.5 is out of range"},
      {"share negative", "[cluster]\nredis = \"redis://127.0.0.1\"\nfallback_share = -0.1\n", 3, "out of range"},
      {"share a string", "[cluster]\nredis = \"redis://127.0.0.1\"\nfallback_share = \"half\"\n", 3, "must be a number"},
      {"ttl over a minute", "[cluster]\nredis = \"redis://127.0.0.1\"\nlease_ttl_ms = 90000\n", 3, "lease_ttl_ms = 90000 is out of range"},
      {"window too short", "[cluster]\nredis = \"redis://127.0.0.1\"\nlease_window_ms = 10\n", 3, "lease_window_ms = 10 is out of range"},
      {"prefix with a space", "[cluster]\nredis = \"redis://127.0.0.1\"\nkey_prefix = \"a b\"\n", 3, "no spaces"},
      {"unknown key", "[cluster]\nredis = \"redis://127.0.0.1\"\nexpected_instance = 2\n", 3, "did you mean \"expected_instances\""},
      {"not a table", "cluster = \"redis://127.0.0.1\"\n", 1, "cluster must be a table"},
  };

  TEST_CASE("each kind of error names the file, the right line and what is allowed") {
    ::unsetenv("SLUICE_TEST_SURELY_UNSET");
    ::setenv("SLUICE_TEST_KEY_WITH_LF", "sk-backend\n", 1);
    ::setenv("SLUICE_TEST_TOKEN_WITH_CR", "tok\rx-evil: 1", 1);
    for (const auto& c : k_cases) {
      std::string what = c.what;
      CAPTURE(what);
      std::string message = error_of(std::string(c.text) + std::string(k_valid_tail));
      CAPTURE(message);
      std::string prefix = "test.toml:" + std::to_string(c.line) + ": ";
      CHECK(message.starts_with(prefix));
      CHECK(message.find(c.fragment) != std::string::npos);
    }
  }

  TEST_CASE("[group] written as a single table is refused with the right syntax") {
    CHECK(error_of("[group]\nname = \"x\"\n[[key]]\nid = \"k\"\nkey = \"x\"\n")
              .starts_with("test.toml:1: group must be written as [[group]]"));
  }

  TEST_CASE("a file without groups or keys is refused") {
    CHECK(error_of("[[key]]\nid = \"k\"\nkey = \"x\"\n").find("no [[group]]") != std::string::npos);
    CHECK(error_of("[[group]]\nname = \"g\"\nbackends = [\"http://127.0.0.1:1\"]\n").find("no [[key]]") !=
          std::string::npos);
  }

  TEST_CASE("a missing config file is reported with its path") {
    cfg::flags f;
    f.config_path = "/nonexistent/sluice.toml";
    CHECK_THROWS_WITH_AS(cfg::load_from_flags(f),
                         doctest::Contains("/nonexistent/sluice.toml: cannot read"), cfg::config_error);
  }
}

TEST_SUITE("config::flags") {
  TEST_CASE("flags override the file") {
    cfg::flags f;
    f.listen = "127.0.0.1:0";
    f.admin = "[::1]:0";
    f.cpus = "1";
    f.backends = {"http://127.0.0.1:9001", "http://127.0.0.1:9002"};
    auto c = load(std::string("[server]\nlisten = \"127.0.0.1:1234\"\ncpus = \"0\"\n") + std::string(k_valid_tail) +
                      "[[group]]\nname = \"h\"\nbackends = [\"http://127.0.0.1:7000\"]\n",
                  f);
    CHECK(c->server.listen.port() == 0);
    CHECK(c->server.admin.family() == AF_INET6);
    CHECK(c->server.cpus == std::vector<int>{1});
    // --backend replaces the backends of every group
    REQUIRE(c->backends.size() == 2);
    CHECK(c->backends[0].url == "http://127.0.0.1:9001");
    CHECK(c->backends[1].url == "http://127.0.0.1:9002");
    REQUIRE(c->groups.size() == 2);
    CHECK(c->groups[0].backends == std::vector<uint32_t>{0, 1});
    CHECK(c->groups[1].backends == std::vector<uint32_t>{0, 1});
  }

  TEST_CASE("--backend fills groups that have none in the file") {
    cfg::flags f;
    f.backends = {"http://127.0.0.1:9001"};
    auto c = load("[[group]]\nname = \"g\"\n[[key]]\nid = \"k\"\nkey = \"x\"\n", f);
    CHECK(c->groups[0].backends == std::vector<uint32_t>{0});
  }

  TEST_CASE("a bad flag value is reported with the flag's name") {
    cfg::flags f;
    f.backends = {"https://127.0.0.1:1"};
    CHECK(error_of(std::string(k_valid_tail), f).starts_with("--backend: backend URL"));
    f = {};
    f.listen = "nowhere";
    CHECK(error_of(std::string(k_valid_tail), f).starts_with("--listen: bad address"));
    f = {};
    f.cpus = "x";
    CHECK(error_of(std::string(k_valid_tail), f).starts_with("--cpus: bad cpu list"));
  }

  TEST_CASE("parse_flags accepts --flag value and --flag=value") {
    const char* argv[] = {"sluice", "--listen", "127.0.0.1:1", "--admin=127.0.0.1:2", "--backend", "http://a:1",
                          "--backend=http://b:2", "--cpus=0-3,8", "--numa-node", "1", "--log-level=debug",
                          "--config", "x.toml", "--check-config"};
    auto f = cfg::parse_flags(static_cast<int>(std::size(argv)), argv);
    CHECK(f.listen == "127.0.0.1:1");
    CHECK(f.admin == "127.0.0.1:2");
    CHECK(f.backends == std::vector<std::string>{"http://a:1", "http://b:2"});
    CHECK(f.cpus == "0-3,8");
    CHECK(f.numa_node == 1);
    CHECK(f.log_level == "debug");
    CHECK(f.config_path == "x.toml");
    CHECK(f.check_config);
    CHECK_FALSE(f.version);
    CHECK_FALSE(f.help);
  }

  TEST_CASE("parse_flags reads --version, --help and -h") {
    const char* a[] = {"sluice", "--version"};
    CHECK(cfg::parse_flags(2, a).version);
    const char* b[] = {"sluice", "--help"};
    CHECK(cfg::parse_flags(2, b).help);
    const char* c[] = {"sluice", "-h"};
    CHECK(cfg::parse_flags(2, c).help);
    const char* d[] = {"sluice"};
    auto none = cfg::parse_flags(1, d);
    CHECK_FALSE(none.help);
    CHECK_FALSE(none.config_path.has_value());
    CHECK(none.backends.empty());
  }

  TEST_CASE("bad command lines are refused with the flag named") {
    struct row {
      std::vector<const char*> argv;
      const char* message;
    };
    const row rows[] = {
        {{"sluice", "--lisen", "x"}, "--lisen: unknown flag"},
        {{"sluice", "--listen"}, "--listen: missing value"},
        {{"sluice", "--listen", "--admin", "x"}, "--listen: missing value"},
        {{"sluice", "--backend="}, "--backend: empty value"},
        {{"sluice", "--version=1"}, "--version: takes no value"},
        {{"sluice", "--numa-node", "x"}, "--numa-node: \"x\" is not a node number"},
        {{"sluice", "--log-level", "loud"}, "--log-level: \"loud\" is not a level"},
        {{"sluice", "stray"}, "\"stray\": unexpected argument"},
        {{"sluice", "-x"}, "-x: unknown flag"},
    };
    for (const auto& r : rows) {
      std::string expected = r.message;
      CAPTURE(expected);
      CHECK_THROWS_WITH_AS(cfg::parse_flags(static_cast<int>(r.argv.size()), r.argv.data()),
                           doctest::Contains(r.message), cfg::config_error);
    }
  }

  TEST_CASE("the usage text lists every flag with its default") {
    std::string_view u = cfg::usage_text();
    for (const char* flag : {"--config", "--listen", "--admin", "--backend", "--cpus", "--numa-node", "--log-level",
                             "--check-config", "--version", "--help", "-h"}) {
      std::string name = flag;
      CAPTURE(name);
      CHECK(u.find(flag) != std::string_view::npos);
    }
    CHECK(u.find("127.0.0.1:8080") != std::string_view::npos);
    CHECK(u.find("127.0.0.1:9090") != std::string_view::npos);
    CHECK(u.find("http://127.0.0.1:8000") != std::string_view::npos);
  }
}

TEST_SUITE("config::values") {
  TEST_CASE("cpu lists parse numbers and inclusive ranges") {
    CHECK(cfg::parse_cpu_list("0-3,8") == std::vector<int>{0, 1, 2, 3, 8});
    CHECK(cfg::parse_cpu_list("5") == std::vector<int>{5});
    CHECK(cfg::parse_cpu_list("8,0-1") == std::vector<int>{0, 1, 8});
    CHECK(cfg::parse_cpu_list("2-2") == std::vector<int>{2});
    CHECK(cfg::parse_cpu_list("").empty());
    CHECK(cfg::parse_cpu_list("0-1\n") == std::vector<int>{0, 1});  // sysfs cpulist files end in a newline
  }

  TEST_CASE("bad cpu lists are refused") {
    for (const char* bad : {"a", "1,,2", ",1", "1,", "-1", "1-", "3-1", "1-2-3", "0x1", "1 2", "99999", "1,1", "0-2,1"}) {
      std::string input = bad;
      CAPTURE(input);
      CHECK_THROWS_AS(cfg::parse_cpu_list(bad), cfg::config_error);
    }
  }

  TEST_CASE("socket addresses accept IPv4 and bracketed IPv6 with any port") {
    auto v4 = cfg::parse_socket_address("10.1.2.3:0");
    CHECK(v4.family() == AF_INET);
    CHECK(v4.port() == 0);
    CHECK(v4.length == sizeof(sockaddr_in));
    CHECK(v4.text == "10.1.2.3:0");
    auto v6 = cfg::parse_socket_address("[::]:65535");
    CHECK(v6.family() == AF_INET6);
    CHECK(v6.port() == 65535);
    CHECK(v6.length == sizeof(sockaddr_in6));
    for (const char* bad : {"", ":80", "1.2.3.4", "1.2.3.4:", "1.2.3.4:x", "127.1:80", "[::1]80", "[::1", "[1.2.3.4]:80",
                            "1.2.3.4:-1"}) {
      std::string input = bad;
      CAPTURE(input);
      CHECK_THROWS_AS(cfg::parse_socket_address(bad), cfg::config_error);
    }
  }

  TEST_CASE("sha256 matches the digest sha256sum prints") {
    // printf test-key | sha256sum
    CHECK(hex(cfg::sha256("test-key")) == "62af8704764faf8ea82fc61ce9c4c3908b6cb97d463a634e9e587d7c885db0ef");
    // the empty string's well-known digest
    CHECK(hex(cfg::sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  }
}

TEST_SUITE("config::routing") {
  TEST_CASE("routing settings have documented defaults") {
    auto c = cfg::load_from_flags({});
    CHECK(c->router.auto_model == "auto");
    CHECK(c->router.default_group.empty());
    CHECK(c->router.default_group_index == UINT32_MAX);
    CHECK(c->rules.empty());
    CHECK(c->health.interval_ms == 2000);
    CHECK(c->health.rise == 2);
    CHECK(c->health.fall == 3);
    CHECK(c->health.eject_after == 5);
    CHECK(c->health.backoff_ms == 1000);
    CHECK(c->health.backoff_max_ms == 60000);
    const cfg::group_config& g = c->groups[0];
    CHECK(g.weights == std::vector<uint32_t>{1});
    CHECK(g.prefix_messages == 2);
    CHECK(g.prefix_bytes == 4096);
    CHECK(g.bounded_load == doctest::Approx(1.25));
    CHECK(g.api_key.empty());
    CHECK(g.health.fall == 3);
  }

  TEST_CASE("weighted backends, group overrides, the router and rules load") {
    ::setenv("SLUICE_TEST_UPSTREAM_KEY", "upstream-secret", 1);
    auto c = load(R"(
[health]
interval_ms = 500
fall = 2

[router]
auto_model = "router"
default_group = "b"

[[group]]
name = "a"
backends = ["http://127.0.0.1:8001", { url = "http://127.0.0.1:8002", weight = 3 }]
prefix_messages = 4
prefix_bytes = 100
bounded_load = 0
api_key_env = "SLUICE_TEST_UPSTREAM_KEY"
[group.health]
rise = 5

[[group]]
name = "b"
backends = ["http://127.0.0.1:8002"]
bounded_load = 2

[[rule]]
group = "a"
contains_any = ["code", "bug"]
regex = "^fix"
min_prompt_bytes = 10
max_prompt_bytes = 2000
has_tools = false
has_images = true

[[key]]
id = "k"
key = "k"
)");
    REQUIRE(c->groups.size() == 2);
    const cfg::group_config& a = c->groups[0];
    CHECK(a.backends == std::vector<uint32_t>{0, 1});
    CHECK(a.weights == std::vector<uint32_t>{1, 3});
    CHECK(a.prefix_messages == 4);
    CHECK(a.prefix_bytes == 100);
    CHECK(a.bounded_load == 0);
    CHECK(a.api_key == "upstream-secret");
    CHECK(a.health.rise == 5);
    CHECK(a.health.fall == 2);          // from [health]
    CHECK(a.health.interval_ms == 500);
    CHECK(c->groups[1].bounded_load == doctest::Approx(2.0));
    CHECK(c->groups[1].health.rise == 2);
    CHECK(c->router.auto_model == "router");
    CHECK(c->router.default_group_index == 1);
    REQUIRE(c->rules.size() == 1);
    const cfg::rule_config& r = c->rules[0];
    CHECK(r.group_index == 0);
    CHECK(r.contains_any == std::vector<std::string>{"code", "bug"});
    CHECK(r.regex == "^fix");
    CHECK(r.min_prompt_bytes == 10);
    CHECK(r.max_prompt_bytes == 2000);
    CHECK(r.has_tools == false);
    CHECK(r.has_images == true);
    CHECK(r.origin == "test.toml:25");
  }

  struct error_case {
    const char* what;
    const char* text;
    int line;
    const char* fragment;
  };
  const error_case k_cases[] = {
      {"rule for an unknown group", "[[rule]]\ngroup = \"nope\"\n", 2, "rule.group \"nope\" is not the name of a [[group]]"},
      {"rule without group", "[[rule]]\ncontains_any = [\"x\"]\n", 1, "[[rule]] needs group"},
      {"bad regex", "[[rule]]\ngroup = \"g\"\nregex = \"(unclosed\"\n", 3, "does not compile"},
      {"regex back-reference (libstdc++ overflows on long ones)",
       "[[rule]]\ngroup = \"g\"\nregex = \"\\\\44444444444444444444\"\n", 3, "uses a back-reference"},
      {"regex repetition count too large (the same overflow)",
       "[[rule]]\ngroup = \"g\"\nregex = \"c{19999999999999999999,5}\"\n", 3, "repetition count over 999999"},
      {"unknown rule key", "[[rule]]\ngroup = \"g\"\nhas_tool = true\n", 3, "did you mean \"has_tools\""},
      {"rule bounds reversed", "[[rule]]\ngroup = \"g\"\nmin_prompt_bytes = 10\nmax_prompt_bytes = 5\n", 3, "larger than rule.max_prompt_bytes"},
      {"unknown default group", "[router]\ndefault_group = \"nope\"\n", 2, "router.default_group \"nope\""},
      {"bad backend weight", "[[group]]\nname = \"a\"\nbackends = [{ url = \"http://127.0.0.1:1\", weight = 0 }]\n", 3, "weight = 0 is out of range"},
      {"backend table without url", "[[group]]\nname = \"a\"\nbackends = [{ weight = 2 }]\n", 3, "needs url"},
      {"backend of a wrong type", "[[group]]\nname = \"a\"\nbackends = [1]\n", 3, "strings or"},
      {"bounded load of 1", "[[group]]\nname = \"a\"\nbounded_load = 1.0\nbackends = [\"http://127.0.0.1:1\"]\n", 3, "0 (off) or more than 1.0"},
      {"prefix_messages out of range", "[[group]]\nname = \"a\"\nprefix_messages = 9\nbackends = [\"http://127.0.0.1:1\"]\n", 3, "allowed: 1-8"},
      {"unset api key variable", "[[group]]\nname = \"a\"\napi_key_env = \"SLUICE_TEST_SURELY_UNSET\"\nbackends = [\"http://127.0.0.1:1\"]\n", 3, "\"SLUICE_TEST_SURELY_UNSET\" is unset"},
      {"api key with a newline", "[[group]]\nname = \"a\"\napi_key_env = \"SLUICE_TEST_KEY_WITH_LF\"\nbackends = [\"http://127.0.0.1:1\"]\n", 3, "holds a control character"},
      {"admin token with a CR", "[server]\nadmin_token_env = \"SLUICE_TEST_TOKEN_WITH_CR\"\n", 2, "holds a control character"},
      {"health backoff bounds", "[health]\nbackoff_ms = 5000\nbackoff_max_ms = 1000\n", 3, "smaller than health.backoff_ms"},
      {"health rise 0", "[health]\nrise = 0\n", 2, "health.rise = 0 is out of range"},
      {"group health unknown key", "[[group]]\nname = \"a\"\nbackends = [\"http://127.0.0.1:1\"]\n[group.health]\nfalls = 1\n", 5, "did you mean \"fall\""},
  };

  TEST_CASE("each routing error names the file, the right line and what is allowed") {
    ::unsetenv("SLUICE_TEST_SURELY_UNSET");
    ::setenv("SLUICE_TEST_KEY_WITH_LF", "sk-backend\n", 1);
    ::setenv("SLUICE_TEST_TOKEN_WITH_CR", "tok\rx-evil: 1", 1);
    for (const auto& c : k_cases) {
      std::string what = c.what;
      CAPTURE(what);
      std::string message = error_of(std::string(c.text) + std::string(k_valid_tail));
      CAPTURE(message);
      CHECK(message.starts_with("test.toml:" + std::to_string(c.line) + ": "));
      CHECK(message.find(c.fragment) != std::string::npos);
    }
  }

  TEST_CASE("a group with more than 64 backends is refused") {
    std::string text = "[[group]]\nname = \"a\"\nbackends = [";
    for (int i = 1; i <= 65; ++i) text += (i > 1 ? ", " : "") + std::string("\"http://127.0.0.1:") + std::to_string(i) + "\"";
    text += "]\n[[key]]\nid = \"k\"\nkey = \"k\"\n";
    CHECK(error_of(text).find("has 65 backends; allowed: at most 64") != std::string::npos);
  }
}

TEST_SUITE("config::budgets") {
  TEST_CASE("budgets and costs are read into the keys, the groups and [quota]") {
    auto c = load(R"(
[quota]
budget_state_file = "/var/lib/sluice/budgets.json"

[[group]]
name = "g"
models = ["*"]
backends = ["http://127.0.0.1:8000"]
daily_tokens = 5000000
monthly_tokens = 90000000
input_cost_per_mtok = 0.15
output_cost_per_mtok = 2

[[key]]
id = "alice"
key = "secret"
daily_tokens = 1000000
monthly_tokens = 20000000
daily_spend = 12.5
monthly_spend = 100
)");
    CHECK(c->quota.budget_state_file == "/var/lib/sluice/budgets.json");
    const cfg::group_config& g = c->groups[0];
    CHECK(g.daily_tokens == 5000000);
    CHECK(g.monthly_tokens == 90000000);
    CHECK(g.input_cost_per_mtok == doctest::Approx(0.15));
    CHECK(g.output_cost_per_mtok == doctest::Approx(2.0));
    const cfg::key_config& k = c->keys[0];
    CHECK(k.daily_tokens == 1000000);
    CHECK(k.monthly_tokens == 20000000);
    CHECK(k.daily_spend == doctest::Approx(12.5));
    CHECK(k.monthly_spend == doctest::Approx(100.0));
    auto d = load(k_valid_tail);
    CHECK(d->quota.budget_state_file == "sluice-budgets.json");
    CHECK(d->keys[0].daily_tokens == 0);
  }
}

TEST_SUITE("config::cluster") {
  TEST_CASE("no [cluster]: this process alone, with the documented defaults") {
    auto c = load(k_valid_tail);
    CHECK_FALSE(c->cluster.enabled());
    CHECK(c->cluster.key_prefix == "sluice:");
    CHECK(c->cluster.expected_instances == 1);
    CHECK(c->cluster.timeout_ms == 200);
    CHECK(c->cluster.fallback_share == 0);
    CHECK(c->cluster.lease_window_ms == 5000);
    CHECK(c->cluster.lease_ttl_ms == 10000);
  }

  TEST_CASE("a full [cluster] table loads, the password read from its variable") {
    ::setenv("SLUICE_TEST_REDIS_PASSWORD", "hunter2", 1);
    auto c = load(std::string(R"([cluster]
redis = "redis://10.0.0.7:6380"
password_env = "SLUICE_TEST_REDIS_PASSWORD"
key_prefix = "edge:"
expected_instances = 3
timeout_ms = 150
fallback_share = 0.25
lease_window_ms = 3000
lease_ttl_ms = 20000
)") + std::string(k_valid_tail));
    CHECK(c->cluster.enabled());
    CHECK(c->cluster.url.host == "10.0.0.7");
    CHECK(c->cluster.url.port == 6380);
    CHECK(c->cluster.password == "hunter2");
    CHECK(c->cluster.key_prefix == "edge:");
    CHECK(c->cluster.expected_instances == 3);
    CHECK(c->cluster.timeout_ms == 150);
    CHECK(c->cluster.fallback_share == doctest::Approx(0.25));
    CHECK(c->cluster.lease_window_ms == 3000);
    CHECK(c->cluster.lease_ttl_ms == 20000);
    ::unsetenv("SLUICE_TEST_REDIS_PASSWORD");
  }

  TEST_CASE("DESIGN's block with redis = \"\" loads and stays off") {
    auto c = load(std::string("[cluster]\nredis = \"\"\npassword_env = \"\"\nkey_prefix = \"sluice:\"\nexpected_instances = 1\n") +
                  std::string(k_valid_tail));
    CHECK_FALSE(c->cluster.enabled());
  }

  TEST_CASE("Redis URLs: host and port, the default port, IPv6, a name") {
    struct sample {
      std::string_view text;
      std::string_view host;
      uint16_t port;
    };
    const sample good[] = {
        {"redis://127.0.0.1:6379", "127.0.0.1", 6379},
        {"redis://127.0.0.1", "127.0.0.1", 6379},
        {"redis://redis.internal:7000/", "redis.internal", 7000},
        {"redis://[::1]:6390", "::1", 6390},
        {"redis://[::1]", "::1", 6379},
    };
    for (const sample& s : good) {
      CAPTURE(s.text);
      const cfg::redis_url u = cfg::parse_redis_url(s.text);
      CHECK(u.host == s.host);
      CHECK(u.port == s.port);
    }
  }
}
