// CPU sets for shard placement. Cold path.
#include "sluice/shard/cpuset.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
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

result<std::vector<int>> numa_node_cpus(int node) {
  if (node < 0) return errc::not_found;
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  if (!in) return errc::not_found;
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return config::parse_cpu_list(text.str());
  } catch (const config::config_error&) {
    return errc::internal;
  }
}

bool pin_current_thread(int cpu) noexcept {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

void name_current_thread(std::string_view name) noexcept {
  // 16 bytes including the terminator; longer names make the call fail
  // with ERANGE, so truncate instead.
  char buf[16] = {};
  std::memcpy(buf, name.data(), std::min(name.size(), sizeof buf - 1));
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace sluice::shard
