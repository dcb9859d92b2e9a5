#pragma once
// The `protocol` label of a backend's metric series (docs/architecture.md §6a), for
// the registry's names (gateway.cpp) and the health checker's own series
// (health.cpp). Cold path: the control thread, at start, at reloads and
// per scrape.
#include <cstdint>
#include <string_view>

#include "sluice/config/config.hpp"

namespace sluice::control {

// Returns: the protocol of the first non-removed group that lists backend
// `b`. Validation makes a grpc:// backend triton-only, but an http://
// backend may be listed by an openai group and an anthropic group alike;
// it is then labelled with the first such group's protocol (one backend,
// one series). A backend no live group lists (removed at a reload) reads
// its transport's default here; gateway::reload keeps the label it had, so
// its series do not change name.
inline std::string_view backend_protocol_label(const config::config& c, uint32_t b) noexcept {
  for (const config::group_config& grp : c.groups) {
    if (grp.removed) continue;
    for (uint32_t gb : grp.backends) {
      if (gb == b) return config::to_string(grp.protocol);
    }
  }
  return config::to_string(c.backends[b].transport == config::backend_transport::grpc ? config::backend_protocol::triton
                                                                                       : config::backend_protocol::openai);
}

}  // namespace sluice::control
