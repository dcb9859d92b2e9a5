#pragma once
// cluster: one quota across several sluice processes, through Redis
// (README "Running several instances"). This header is the module's map; it includes the parts.
//
//   redis_client.hpp  the connection: hiredis's async API on our reactor,
//                     timeouts, reconnect with backoff, the three scripts
//   scripts.hpp       the lease protocol in Lua (lease / give_back / charge)
//   lease.hpp         pure policy: lease sizing, surplus, the fallback share,
//                     what is owed after an outage (key_lease)
//
// The invariant. Per key, with limit L tokens per minute (rate r = L / 60 s)
// and N instances: the tokens admitted by all instances over any interval
// of length T are at most
//     L + r * T + N * M          M = one maximal lease (max_fraction * L)
// L + r*T is the global bucket's own bound (it starts full and refills at r
// on Redis's clock); N*M are the leases the instances took before the
// interval and spend inside it ("one outstanding lease per instance"): M
// is what one instance holds at most, its lease (max_fraction * L) plus
// what its shards took from the lender and have not used (the top-ups of
// lender.hpp: half a lease target in all), 1.5 * max_fraction * L. A
// request that costs more than M gets one lease sized for it
// (key_lease::need), so M is then the largest such cost.
// While Redis is away an instance admits what is left of its lease, then at
// most fallback_per_minute (accrued; lease + allowance capped at M); with
// the default share (L / expected_instances) and N <= expected_instances
// (or configured shares summing to at most 1) the instances
// together stay within r while apart, and what they admitted out of the
// share is charged to the bucket when Redis returns, so the bound above
// holds across the outage. The charge floors the level at -L: an outage so
// long that its usage exceeds two minutes of refill is partly forgiven —
// the bucket also wasted at least that much refill at its cap meanwhile.
// Instance clocks never enter the bucket's arithmetic (Redis TIME does);
// they time only the demand estimate and the fallback allowance, so a clock
// running fast by d admits d more of its share while apart (and that is
// charged too). Not covered: Redis losing its data (a restart without
// persistence) starts every bucket full again, one extra L at most per loss.
//
// "A crashed instance's capacity comes back after the TTL", exactly: a
// lease's tokens leave the bucket when granted, so a crash does not return
// them — they count as spent, and the bucket's refill makes the limit
// available to the others again within a minute, TTL or not. The TTL bounds
// how long the dead instance's lease record stays in the `outstanding`
// total (what the admin page shows as held by instances); a record past its
// TTL is dropped by the next script that sees the key. A crash costs the
// others at most M tokens: M / r of refill (6 s with the default bounds).
//
// Integration (the control thread owns the client; shards never talk to
// Redis):
//   - main() (or control::gateway) creates one redis_client on the control
//     thread's reactor when [cluster] redis is set, calls start(), and calls
//     on_iteration(now_ms) from the loop's on_iteration hook, as health is.
//   - The control thread is one more peer in the shards' lending mesh
//     (quota::shard_slices): per key it keeps a key_lease; what the lease
//     holds is the control peer's slice, lent to shards as they ask; shards
//     lend nothing to it beyond returns. A shard's borrow from it is
//     key_lease::take() (which also measures the demand); settlement
//     refunds and returned slices are key_lease::refund(). It calls
//     key_lease::begin() each turn per active key and sends the request
//     through the client (lease with [cluster] lease_ttl_ms, give_back,
//     charge); on_reply() with the result (ok = the call succeeded, tokens
//     = bucket_reply::tokens).
//   - connected() false (or a failed call): on_apart() on every key_lease;
//     connected() true again: on_rejoin(). Metrics:
//     sluice_cluster_connected = connected(), sluice_cluster_redis_errors_total
//     = stats().errors.
//   - The instance id must be unique per process and stable for its life
//     (e.g. hostname:pid:start time); the key id is the [[key]] id.
#include "sluice/cluster/lease.hpp"
#include "sluice/cluster/redis_client.hpp"
#include "sluice/cluster/scripts.hpp"
#include "sluice/config/config.hpp"

namespace sluice::cluster {

// [cluster] -> the client's options (host, port, password, prefix, timeout;
// the backoff and connect timeout keep their defaults).
redis_options redis_options_from(const config::cluster_config& c);

// [cluster] + one key's tokens_per_minute -> its key_lease parameters
// (window, fallback share; the bounds keep their defaults).
key_lease::params lease_params_from(const config::cluster_config& c, double limit_per_minute);

// This process's name in Redis (lease records, budget counters): host name,
// pid and start time in ms ("edge1:4242:1764633600123"). Unique per process
// and stable for its life; computed once (the first call), then the same.
const std::string& instance_id();

}  // namespace sluice::cluster
