#pragma once
// shard: which CPUs the shards run on, and pinning/naming of shard threads.
// Cold path: called at start-up before the shards run.
//
// The cpu-list syntax ("0-3,8") is parsed by config::parse_cpu_list, the one
// parser for both --cpus and the kernel's sysfs cpulist files.
#include <string_view>
#include <vector>

#include "sluice/core/result.hpp"

namespace sluice::shard {

// The CPUs in this process's affinity mask (sched_getaffinity), ascending.
// Empty only if the kernel call fails, which it does not for the calling
// process.
std::vector<int> affinity_cpus();

// The CPUs of NUMA node `node`, from /sys/devices/system/node/node<N>/cpulist.
// Returns: errc::not_found when the node does not exist (or the kernel has
// no NUMA support), errc::internal when the file cannot be parsed.
result<std::vector<int>> numa_node_cpus(int node);

// Pins the calling thread to one CPU (pthread_setaffinity_np).
// Returns: false when the CPU is out of range or not allowed to the process.
bool pin_current_thread(int cpu) noexcept;

// Names the calling thread for top/perf/gdb; truncated to the kernel's 15
// characters.
void name_current_thread(std::string_view name) noexcept;

}  // namespace sluice::shard
