#pragma once
// shard: which CPUs the shards run on, and pinning/naming of shard threads.
// Cold path: called at start-up before the shards run.
//
// The cpu-list syntax ("0-3,8") is parsed by config::parse_cpu_list, the one
// parser for both --cpus and the kernel's sysfs cpulist files.
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/result.hpp"

namespace sluice::shard {

// The CPUs in this process's affinity mask (sched_getaffinity), ascending.
// Empty only if the kernel call fails, which it does not for the calling
// process.
std::vector<int> affinity_cpus();

// The CPUs of NUMA node `node`, from <sys_root>/devices/system/node/node<N>/cpulist.
// `sys_root` is a parameter so that tests read sample layouts
// (tests/data/sys/*); the gateway reads the kernel's "/sys".
// Returns: errc::not_found when the node does not exist (or the kernel has
// no NUMA support), errc::internal when the file cannot be parsed; an empty
// list for a node without CPUs (memory only, or its CPUs offline).
result<std::vector<int>> numa_node_cpus(int node, std::string_view sys_root = "/sys");

// The CPUs of `node_cpus` that are also in `allowed` (both ascending): a
// node's CPUs restricted by --cpus / server.cpus or the affinity mask.
std::vector<int> cpus_within(const std::vector<int>& node_cpus, const std::vector<int>& allowed);

// The kernel's cpulist form of an ascending list ("0-7,16-23"), for logs
// and error messages; "" for none.
std::string format_cpu_list(const std::vector<int>& cpus);

// What prefer_numa_node did, for the start-up log.
enum class numa_policy { preferred, no_numa, single_node, failed };

// Makes the calling thread (and every thread it creates from now on: the
// policy is inherited) allocate memory on `node` first (libnuma's
// numa_set_preferred, MPOL_PREFERRED): the shards' pools, buffers and
// mimalloc's pages then come from the node whose CPUs run them. Preferred
// rather than bound: when the node is full an allocation falls back to
// another node instead of failing a request. Without NUMA support, or on a
// machine with one node, nothing changes.
numa_policy prefer_numa_node(int node) noexcept;

// Pins the calling thread to one CPU (pthread_setaffinity_np).
// Returns: false when the CPU is out of range or not allowed to the process.
bool pin_current_thread(int cpu) noexcept;

// Lets the calling thread run on any CPU of `cpus` (pthread_setaffinity_np):
// a shard that is not pinned ([server] pin_shards = false) stays within the
// shards' CPUs and the scheduler moves it among them.
// Returns: false when none of them exists or is allowed to the process (a
// cgroup's cpuset narrows the mask to those it allows, silently).
bool allow_current_thread(const std::vector<int>& cpus) noexcept;

// Names the calling thread for top/perf/gdb; truncated to the kernel's 15
// characters.
void name_current_thread(std::string_view name) noexcept;

}  // namespace sluice::shard
