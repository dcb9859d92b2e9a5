#include <doctest/doctest.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sluice/shard/cpuset.hpp"

namespace shard = sluice::shard;

namespace {

// A sample sysfs tree under tests/data/sys (its README lists the layouts).
std::string sys_root(const char* layout) { return std::string(SLUICE_SYS_DATA) + "/" + layout; }

std::vector<int> range(int first, int last) {
  std::vector<int> out;
  for (int cpu = first; cpu <= last; ++cpu) out.push_back(cpu);
  return out;
}

std::vector<int> operator+(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

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

  TEST_CASE("a thread allowed a set of cpus may run on each of them and no other") {
    const std::vector<int> allowed = shard::affinity_cpus();
    REQUIRE(!allowed.empty());
    // The first two CPUs of this process's mask (or its one), and the set
    // of one: the thread's mask is exactly the set asked for.
    for (const std::vector<int>& want : {std::vector<int>(allowed.begin(), allowed.begin() + std::min<size_t>(allowed.size(), 2)),
                                         std::vector<int>{allowed.back()}}) {
      bool ok = false;
      std::vector<int> seen;
      std::thread t([&] {
        ok = shard::allow_current_thread(want);
        seen = shard::affinity_cpus();  // sched_getaffinity(0): this thread's mask
      });
      t.join();
      CHECK(ok);
      CHECK(seen == want);
    }
  }

  TEST_CASE("a set of no usable cpu is refused, and the thread keeps its mask") {
    std::vector<int> before, after;
    bool ok = true;
    std::thread t([&] {
      before = shard::affinity_cpus();
      ok = shard::allow_current_thread({-1, CPU_SETSIZE}) || shard::allow_current_thread({});
      after = shard::affinity_cpus();
    });
    t.join();
    CHECK_FALSE(ok);
    CHECK(after == before);
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

  TEST_CASE("a node's cpulist with ranges is read from the sysfs root given") {
    auto node0 = shard::numa_node_cpus(0, sys_root("two-nodes"));
    auto node1 = shard::numa_node_cpus(1, sys_root("two-nodes"));
    REQUIRE(node0.ok());
    REQUIRE(node1.ok());
    CHECK(node0.value() == range(0, 7) + range(16, 23));
    CHECK(node1.value() == range(8, 15) + range(24, 31));
    CHECK(shard::numa_node_cpus(2, sys_root("two-nodes")).error() == sluice::errc::not_found);
  }

  TEST_CASE("single cpus in a cpulist, a memory-only node and a gap in the node numbers") {
    CHECK(shard::numa_node_cpus(1, sys_root("interleaved")).value() == std::vector<int>{1, 3, 5, 7});
    auto memory_only = shard::numa_node_cpus(1, sys_root("memory-node"));
    REQUIRE(memory_only.ok());
    CHECK(memory_only.value().empty());
    CHECK(shard::numa_node_cpus(2, sys_root("memory-node")).error() == sluice::errc::not_found);
    CHECK(shard::numa_node_cpus(3, sys_root("memory-node")).value() == range(4, 7));
  }

  TEST_CASE("an unreadable cpulist is internal, not a node without cpus") {
    CHECK(shard::numa_node_cpus(0, sys_root("bad-list")).error() == sluice::errc::internal);
    CHECK(shard::numa_node_cpus(0, sys_root("no-such-layout")).error() == sluice::errc::not_found);
  }

  TEST_CASE("a node's cpus are restricted by --cpus or the affinity mask") {
    const std::vector<int> node1 = shard::numa_node_cpus(1, sys_root("two-nodes")).value();
    SUBCASE("the restriction covers part of the node") {
      CHECK(shard::cpus_within(node1, range(0, 11)) == range(8, 11));
      CHECK(shard::cpus_within(node1, std::vector<int>{9, 20, 24, 40}) == std::vector<int>{9, 24});
    }
    SUBCASE("the restriction covers the whole node") {
      CHECK(shard::cpus_within(node1, range(0, 63)) == node1);
    }
    SUBCASE("the restriction and the node are disjoint") {
      CHECK(shard::cpus_within(node1, range(0, 7)).empty());
      CHECK(shard::cpus_within(node1, {}).empty());
    }
  }

  TEST_CASE("cpu lists are formatted as the kernel writes them") {
    CHECK(shard::format_cpu_list({}) == "");
    CHECK(shard::format_cpu_list({3}) == "3");
    CHECK(shard::format_cpu_list(range(0, 7) + range(16, 23)) == "0-7,16-23");
    CHECK(shard::format_cpu_list({1, 3, 4, 5, 9}) == "1,3-5,9");
  }

  TEST_CASE("the node memory policy leaves a machine without several nodes as it is") {
    // Here the result depends on the machine; on one node (or no NUMA) the
    // call must not claim a preference, and a node it lacks is refused.
    std::thread t([] {
      const auto r = shard::prefer_numa_node(0);
      const auto second = shard::numa_node_cpus(1);
      if (!second.ok()) CHECK((r == shard::numa_policy::single_node || r == shard::numa_policy::no_numa));
      const auto far = shard::prefer_numa_node(1023);
      CHECK(far != shard::numa_policy::preferred);
    });
    t.join();
  }
}
