#pragma once
// control: [cluster] mode on the control thread (README "Running several
// instances"). Owns the Redis connection and the lender (cluster/lender.hpp):
// each loop turn it drives the client, moves the shards' quota messages to
// the lender and its grants back (waking the shards it wrote to), and sends
// the lease calls the lender asks for. Also renders sluice_cluster_* and the
// "global" part of GET /keys/{id}.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/cluster/cluster.hpp"
#include "sluice/cluster/lender.hpp"
#include "sluice/config/config.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::control {

class gateway;

// Control-thread-local. One per process when [cluster] redis is set, made
// after the gateway (whose mesh has the lender's queues) and the control
// reactor, destroyed before either (the client's callbacks end with it).
class cluster_keeper {
 public:
  // Resolves the Redis host and starts connecting. Throws
  // std::runtime_error when the host does not resolve.
  cluster_keeper(shard::reactor& r, gateway& g, const config::config& cfg);
  ~cluster_keeper();
  cluster_keeper(const cluster_keeper&) = delete;
  cluster_keeper& operator=(const cluster_keeper&) = delete;

  void on_iteration(uint64_t now_ms);
  // SIGHUP: keys added by the reload get their lease state.
  void reload(const config::config& next);

  // sluice_cluster_*; appended to `out`.
  void render_metrics(std::string& out) const;
  // The "global" object of GET /keys/{id} for the key at config position
  // `key`: appended to `out`.
  void describe_key(uint32_t key, std::string& out) const;

 private:
  struct calls;  // lease_calls over the redis client
  void move_messages(uint64_t now_ms);

  shard::reactor& _r;
  gateway& _g;
  std::vector<std::string> _ids;       // key ids by config position
  std::vector<uint64_t> _limits;       // tokens per minute by config position
  uint32_t _ttl_ms;
  std::unique_ptr<cluster::lender> _lender;
  std::unique_ptr<calls> _calls;
  std::unique_ptr<cluster::redis_client> _client;  // last member: destroyed first (its callbacks reach _lender)
};

}  // namespace sluice::control
