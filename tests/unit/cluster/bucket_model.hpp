#pragma once
// The lease scripts' arithmetic in C++ (scripts.cpp holds the Lua that
// runs): the simulation's Redis, and the reference redis_test compares the
// real scripts' answers with.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

  // The same operations in the same order as the Lua, so that the doubles
  // agree to the last bit.
  void prologue(uint64_t now_ms) {
    const double rate = limit / 60000;
    if (now_ms > ts_ms) level = level + static_cast<double>(now_ms - ts_ms) * rate;
    if (level > limit) level = limit;
    ts_ms = std::max(ts_ms, now_ms);
    std::erase_if(leases, [&](const auto& kv) { return kv.second.second <= now_ms; });
  }
  // The script answers with the level it computed and keeps it as Lua's
  // tostring writes it: 14 digits.
  double answered_level = 0;
  void store() {
    answered_level = level;
    char text[32];
    std::snprintf(text, sizeof text, "%.14g", level);
    level = std::strtod(text, nullptr);
  }
  double lease(double want, int inst, uint64_t ttl_ms, uint64_t now_ms) {
    prologue(now_ms);
    const double granted = level > 0 ? std::floor(std::min(want, level)) : 0;
    if (granted > 0) {
      level -= granted;
      leases[inst] = {granted, now_ms + ttl_ms};
    }
    store();
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
    const double tokens = level - before;
    store();
    return tokens;
  }
  double charge(double amount, uint64_t now_ms) {
    prologue(now_ms);
    const double before = level;
    level = std::max(-limit, level - amount);
    const double tokens = before - level;
    store();
    return tokens;
  }
  double outstanding() const {
    double sum = 0;
    for (const auto& kv : leases) sum += kv.second.first;
    return sum;
  }
};

}  // namespace sluice::test
