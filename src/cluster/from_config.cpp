// [cluster] settings -> the module's parameters (cluster.hpp).
#include "sluice/cluster/cluster.hpp"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "sluice/core/clock.hpp"

namespace sluice::cluster {

redis_options redis_options_from(const config::cluster_config& c) {
  redis_options o;
  o.host = c.url.host;
  o.port = c.url.port;
  o.password = c.password;
  o.key_prefix = c.key_prefix;
  o.timeout_ms = c.timeout_ms;
  return o;
}

key_lease::params lease_params_from(const config::cluster_config& c, double limit_per_minute) {
  key_lease::params p;
  p.limit_per_minute = limit_per_minute;
  p.window_s = c.lease_window_ms / 1000.0;
  p.fallback_per_minute = fallback_tokens_per_minute(limit_per_minute, c.fallback_share, c.expected_instances);
  return p;
}

const std::string& instance_id() {
  static const std::string id = [] {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "host");
    return fmt::format("{}:{}:{}", host, ::getpid(), realtime_ms());
  }();
  return id;
}

}  // namespace sluice::cluster
