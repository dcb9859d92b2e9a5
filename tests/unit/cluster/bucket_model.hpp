#pragma once
// The lease scripts' arithmetic in C++ (scripts.cpp holds the Lua that
// runs): the simulation's Redis, and the reference redis_test compares the
// real scripts' answers with.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

namespace sluice::test {

// lease / give_back / charge as the scripts do them, on server time.
struct bucket_model {
  double limit;
  double level;
  uint64_t ts_ms;
  std::map<int, std::pair<double, uint64_t>> leases;  // instance -> {amount, expiry}

  bucket_model(double l, uint64_t now_ms) : limit(l), level(l), ts_ms(now_ms) {}

  void prologue(uint64_t now_ms) {
    if (now_ms > ts_ms) level = std::min(limit, level + static_cast<double>(now_ms - ts_ms) * limit / 60000.0);
    ts_ms = std::max(ts_ms, now_ms);
    std::erase_if(leases, [&](const auto& kv) { return kv.second.second <= now_ms; });
  }
  double lease(double want, int inst, uint64_t ttl_ms, uint64_t now_ms) {
    prologue(now_ms);
    const double granted = level > 0 ? std::floor(std::min(want, level)) : 0;
    if (granted > 0) {
      level -= granted;
      leases[inst] = {granted, now_ms + ttl_ms};
    }
    return granted;
  }
  double give_back(double amount, int inst, uint64_t now_ms) {
    prologue(now_ms);
    const double before = level;
    level = std::min(limit, level + amount);
    if (auto it = leases.find(inst); it != leases.end()) {
      it->second.first -= amount;
      if (it->second.first <= 0) leases.erase(it);
    }
    return level - before;
  }
  double charge(double amount, uint64_t now_ms) {
    prologue(now_ms);
    const double before = level;
    level = std::max(-limit, level - amount);
    return before - level;
  }
  double outstanding() const {
    double sum = 0;
    for (const auto& kv : leases) sum += kv.second.first;
    return sum;
  }
};

}  // namespace sluice::test
