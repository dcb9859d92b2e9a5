#pragma once
// exchange (private): what every part of a shard's server reads -- its config
// snapshot, ring, counters, routing table, timers and drain state. The parts
// are the client transport and codecs, the exchanges' policy (shard_server) and
// the backend adapters (openai_http); each holds this by reference.
#include <cstdint>
#include <memory>

#include "sluice/config/config.hpp"
#include "sluice/http/request.hpp"
#include "sluice/metrics/registry.hpp"
#include "sluice/route/table.hpp"
#include "sluice/shard/reactor.hpp"
#include "sluice/shard/timer_wheel.hpp"

namespace sluice::proxy {

// Shard-local; owned by the shard's server, outlives its parts.
struct shard_context {
  shard_context(uint32_t i, std::shared_ptr<const config::config> c, shard::reactor& ring, metrics::shard_metrics& m,
                uint32_t shard_count)
      : index(i),
        cfg(std::move(c)),
        r(ring),
        metrics(m),
        routes(std::make_unique<route::table>(*cfg, i, shard_count)),
        timers(ring.now_ms()) {}
  shard_context(const shard_context&) = delete;
  shard_context& operator=(const shard_context&) = delete;

  uint32_t index;
  std::shared_ptr<const config::config> cfg;  // replaced on reload (shard_server::reload)
  shard::reactor& r;
  metrics::shard_metrics& metrics;
  std::unique_ptr<route::table> routes;       // replaced whole on reload
  shard::timer_wheel timers;                  // every client connection's deadline
  bool draining = false;
  uint64_t drain_deadline_ms = 0;

  uint64_t now_ms() const noexcept { return r.now_ms(); }
};

}  // namespace sluice::proxy
