// CPU sets for shard placement and the NUMA memory policy. Cold path.
#include "sluice/shard/cpuset.hpp"

#include <numa.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "sluice/config/config.hpp"

namespace sluice::shard {

std::vector<int> affinity_cpus() {
  // A fixed cpu_set_t covers CPU_SETSIZE (1024) cpus; the kernel refuses a
  // mask smaller than its own nr_cpu_ids with EINVAL, so grow until it fits.
  std::vector<int> cpus;
  for (int count = CPU_SETSIZE; count <= (1 << 16); count *= 2) {
    cpu_set_t* set = CPU_ALLOC(count);
    if (set == nullptr) return cpus;
    const size_t bytes = CPU_ALLOC_SIZE(count);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) {
      for (int cpu = 0; cpu < count; ++cpu) {
        if (CPU_ISSET_S(cpu, bytes, set)) cpus.push_back(cpu);
      }
      CPU_FREE(set);
      return cpus;
    }
    const int error = errno;
    CPU_FREE(set);
    if (error != EINVAL) return cpus;
  }
  return cpus;
}

result<std::vector<int>> numa_node_cpus(int node, std::string_view sys_root) {
  if (node < 0) return errc::not_found;
  std::ifstream in(std::string(sys_root) + "/devices/system/node/node" + std::to_string(node) + "/cpulist");
  if (!in) return errc::not_found;
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return config::parse_cpu_list(text.str());
  } catch (const config::config_error&) {
    return errc::internal;
  }
}

std::vector<int> cpus_within(const std::vector<int>& node_cpus, const std::vector<int>& allowed) {
  std::vector<int> out;
  std::set_intersection(node_cpus.begin(), node_cpus.end(), allowed.begin(), allowed.end(), std::back_inserter(out));
  return out;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

numa_policy prefer_numa_node(int node) noexcept {
  // numa_available() must come first: every other libnuma call is
  // undefined without it (numa(3)).
  if (numa_available() < 0) return numa_policy::no_numa;
  if (numa_max_node() == 0) return numa_policy::single_node;
  if (node > numa_max_node()) return numa_policy::failed;
  numa_set_preferred(node);
  return numa_preferred() == node ? numa_policy::preferred : numa_policy::failed;
}

bool pin_current_thread(int cpu) noexcept {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

bool allow_current_thread(const std::vector<int>& cpus) noexcept {
  // Sized to the largest CPU named (affinity_cpus reads masks this wide).
  constexpr int k_cpus_max = 1 << 16;
  int top = -1;
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < k_cpus_max) top = std::max(top, cpu);
  }
  if (top < 0) return false;
  cpu_set_t* set = CPU_ALLOC(top + 1);
  if (set == nullptr) return false;
  const size_t bytes = CPU_ALLOC_SIZE(top + 1);
  CPU_ZERO_S(bytes, set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu <= top) CPU_SET_S(cpu, bytes, set);
  }
  const bool ok = pthread_setaffinity_np(pthread_self(), bytes, set) == 0;
  CPU_FREE(set);
  return ok;
}

void name_current_thread(std::string_view name) noexcept {
  // 16 bytes including the terminator; longer names make the call fail
  // with ERANGE, so truncate instead.
  char buf[16] = {};
  std::memcpy(buf, name.data(), std::min(name.size(), sizeof buf - 1));
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace sluice::shard
