// Command-line flags and the embedded default configuration. Cold path.
#include <charconv>

#include <fmt/format.h>

#include "sluice/config/config.hpp"

namespace sluice::config {

namespace {

constexpr std::string_view k_usage =
    "usage: sluice [flags]\n"
    "\n"
    "An OpenAI-compatible gateway in front of vLLM. With no flags it runs on the\n"
    "embedded default: one group \"default\" for any model, backend\n"
    "http://127.0.0.1:8000, API key \"test-key\" (README \"Configuration\").\n"
    "\n"
    "flags (each takes --flag VALUE or --flag=VALUE; flags override the file):\n"
    "  --config FILE      TOML configuration file      (default: the embedded default)\n"
    "  --listen ADDR      client listener, IPv4 \"1.2.3.4:8080\" or \"[::1]:8080\"\n"
    "                                                  (default: 127.0.0.1:8080)\n"
    "  --admin ADDR       admin listener: /metrics, /healthz\n"
    "                                                  (default: 127.0.0.1:9090)\n"
    "  --backend URL      http://host:port backend; repeatable; replaces the backends\n"
    "                     of every group               (default: http://127.0.0.1:8000)\n"
    "  --cpus LIST        cpus to run shards on, e.g. \"0-3,8\"\n"
    "                                                  (default: the affinity mask)\n"
    "  --numa-node N      run shards on the cpus of NUMA node N, within the cpus above\n"
    "                                                  (default: no restriction)\n"
    "  --log-level LEVEL  debug | info | warn | error  (default: info)\n"
    "  --check-config     validate the configuration, print the result, exit 0 or 1\n"
    "  --explain-route PROMPT\n"
    "                     print the group the auto model would pick for a user message\n"
    "                     PROMPT, how (rule, classifier, default) and the classifier's\n"
    "                     confidence, then exit (\"-\": one prompt per line from stdin,\n"
    "                     one \"GROUP<tab>HOW<tab>CONFIDENCE\" line each)\n"
    "  --version          print the version and exit\n"
    "  -h, --help         print this text and exit\n";

// The default is TOML text rather than a hand-filled struct so that it goes
// through exactly the same parser and validation as a user's file.
constexpr std::string_view k_default_toml = R"(# sluice embedded default configuration
[server]
listen = "127.0.0.1:8080"
admin = "127.0.0.1:9090"

[audit]
path = "sluice-audit.jsonl"

[[group]]
name = "default"
models = ["*"]
backends = ["http://127.0.0.1:8000"]

[[key]]
id = "test"
key = "test-key"
)";

enum class flag_kind { value, boolean };

struct flag_spec {
  std::string_view name;
  flag_kind kind;
};

constexpr flag_spec k_flags[] = {
    {"--config", flag_kind::value},     {"--listen", flag_kind::value},
    {"--admin", flag_kind::value},      {"--backend", flag_kind::value},
    {"--cpus", flag_kind::value},       {"--numa-node", flag_kind::value},
    {"--log-level", flag_kind::value},  {"--explain-route", flag_kind::value},  {"--check-config", flag_kind::boolean},
    {"--version", flag_kind::boolean},  {"--help", flag_kind::boolean},
    {"-h", flag_kind::boolean},
};

}  // namespace

std::string_view usage_text() { return k_usage; }

std::string_view embedded_default_toml() { return k_default_toml; }

flags parse_flags(int argc, const char* const* argv) {
  flags out;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view name = arg;
    std::optional<std::string_view> inline_value;
    if (arg.starts_with("--")) {
      size_t eq = arg.find('=');
      if (eq != std::string_view::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    }
    const flag_spec* spec = nullptr;
    for (const auto& candidate : k_flags) {
      if (candidate.name == name) spec = &candidate;
    }
    if (spec == nullptr) {
      if (arg.starts_with("-")) {
        throw config_error(fmt::format("{}: unknown flag; see --help for the flags sluice takes", name));
      }
      throw config_error(fmt::format("\"{}\": unexpected argument; flags start with -- (see --help)", arg));
    }

    if (spec->kind == flag_kind::boolean) {
      if (inline_value) throw config_error(fmt::format("{}: takes no value", name));
      if (name == "--check-config") out.check_config = true;
      if (name == "--version") out.version = true;
      if (name == "--help" || name == "-h") out.help = true;
      continue;
    }

    std::string value;
    if (inline_value) {
      value = std::string(*inline_value);
    } else {
      // "--listen --admin x" is a missing value, not a listen address of "--admin".
      if (i + 1 >= argc || std::string_view(argv[i + 1]).starts_with("--")) {
        throw config_error(fmt::format("{}: missing value", name));
      }
      value = argv[++i];
    }
    if (name == "--explain-route") {  // an empty prompt is a prompt (it gets the default)
      out.explain_route = value;
      continue;
    }
    if (value.empty()) throw config_error(fmt::format("{}: empty value", name));

    if (name == "--config") {
      out.config_path = value;
    } else if (name == "--listen") {
      out.listen = value;
    } else if (name == "--admin") {
      out.admin = value;
    } else if (name == "--backend") {
      out.backends.push_back(value);
    } else if (name == "--cpus") {
      out.cpus = value;
    } else if (name == "--numa-node") {
      int node = -1;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), node);
      if (ec != std::errc() || end != value.data() + value.size() || node < 0 || node > 1023) {
        throw config_error(fmt::format("--numa-node: \"{}\" is not a node number; allowed: 0-1023", value));
      }
      out.numa_node = node;
    } else if (name == "--log-level") {
      if (value != "debug" && value != "info" && value != "warn" && value != "error") {
        throw config_error(fmt::format("--log-level: \"{}\" is not a level; allowed: debug, info, warn, error", value));
      }
      out.log_level = value;
    }
  }
  return out;
}

}  // namespace sluice::config
