#include <doctest/doctest.h>

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <string>
#include <thread>

#include "sluice/shard/cpuset.hpp"

namespace shard = sluice::shard;

TEST_SUITE("shard::cpuset") {
  TEST_CASE("the affinity mask lists at least one cpu, ascending") {
    auto cpus = shard::affinity_cpus();
    REQUIRE_FALSE(cpus.empty());
    for (size_t i = 1; i < cpus.size(); ++i) CHECK(cpus[i - 1] < cpus[i]);
    CHECK(cpus.size() <= std::thread::hardware_concurrency());
  }

  TEST_CASE("a pinned thread runs on exactly its cpu") {
    // On a separate thread so that the test process keeps its mask.
    const int target = shard::affinity_cpus().back();
    bool pinned = false;
    std::vector<int> seen;
    std::thread t([&] {
      pinned = shard::pin_current_thread(target);
      cpu_set_t set;
      CPU_ZERO(&set);
      pthread_getaffinity_np(pthread_self(), sizeof set, &set);
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) seen.push_back(cpu);
      }
    });
    t.join();
    CHECK(pinned);
    CHECK(seen == std::vector<int>{target});
  }

  TEST_CASE("pinning to a cpu that does not exist fails") {
    const bool last_cpu_exists = shard::affinity_cpus().back() == CPU_SETSIZE - 1;
    std::thread t([&] {
      CHECK_FALSE(shard::pin_current_thread(-1));
      CHECK_FALSE(shard::pin_current_thread(CPU_SETSIZE));
      if (!last_cpu_exists) CHECK_FALSE(shard::pin_current_thread(CPU_SETSIZE - 1));
    });
    t.join();
  }

  TEST_CASE("thread names are set and truncated to 15 characters") {
    std::string short_name, long_name;
    std::thread t([&] {
      char buf[16] = {};
      shard::name_current_thread("shard-3");
      pthread_getname_np(pthread_self(), buf, sizeof buf);
      short_name = buf;
      shard::name_current_thread("sluice-shard-0123456789");
      pthread_getname_np(pthread_self(), buf, sizeof buf);
      long_name = buf;
    });
    t.join();
    CHECK(short_name == "shard-3");
    CHECK(long_name == "sluice-shard-01");
  }

  TEST_CASE("numa node cpus come from sysfs, and a missing node is not_found") {
    auto missing = shard::numa_node_cpus(1023);
    CHECK_FALSE(missing.ok());
    CHECK(missing.error() == sluice::errc::not_found);
    CHECK(shard::numa_node_cpus(-1).error() == sluice::errc::not_found);
    auto node0 = shard::numa_node_cpus(0);
    if (node0.ok()) {
      // Node 0 exists on every NUMA-enabled kernel; it holds some cpu of this machine.
      CHECK_FALSE(node0->empty());
    } else {
      CHECK(node0.error() == sluice::errc::not_found);  // kernel without CONFIG_NUMA
    }
  }
}
