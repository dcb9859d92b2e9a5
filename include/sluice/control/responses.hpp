#pragma once
// control: the response store ([responses] store = "local"): the responses
// sluice rendered for Responses clients on translated groups, by id, so
// that previous_response_id continues a conversation and GET / DELETE
// /v1/responses/{id} find it (README "Responses state").
//
// Control-thread-local: shards reach it only through store operations on
// their shard_link (proxy::store_op), which response_keeper answers each
// loop turn; a shard parks the exchange meanwhile and never waits.
// Bounded: entries live store_ttl_s after their response, and beyond
// store_max_bytes the oldest go first.
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/cluster/redis_client.hpp"
#include "sluice/config/config.hpp"
#include "sluice/proxy/shard.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::control {

class gateway;

class response_store {
 public:
  response_store(uint64_t max_bytes, uint64_t ttl_ms) noexcept : _max_bytes(max_bytes), _ttl_ms(ttl_ms) {}

  // Keeps `r` (replacing an entry of its id), its items completed with the
  // output items of its response object. Returns: false when the response
  // is not a response object (nothing kept).
  bool put(proxy::store_record&& r, uint64_t now_ms);
  // r.items completed by the output items of r.response (what put() keeps).
  // Returns: false when the response is not a response object.
  static bool complete(proxy::store_record& r);
  // The entry of `id` made by `key_id`, or null (none, expired, or another
  // key's).
  const proxy::store_record* get(std::string_view id, std::string_view key_id, uint64_t now_ms) const noexcept;
  // Returns: whether an entry of `id` made by `key_id` was there (it is not now).
  bool remove(std::string_view id, std::string_view key_id);
  // Drops what expired by now.
  void expire(uint64_t now_ms);
  void set_limits(uint64_t max_bytes, uint64_t ttl_ms) noexcept;

  size_t size() const noexcept { return _map.size(); }
  uint64_t bytes() const noexcept { return _bytes; }

 private:
  struct entry {
    proxy::store_record r;
    uint64_t expires_ms = 0;
    uint64_t stamp = 0;  // which put made it (the order's entries of older puts are stale)
  };
  static uint64_t size_of(const proxy::store_record& r) noexcept;
  void drop(std::unordered_map<std::string, entry>::iterator it);
  void trim(uint64_t now_ms);

  uint64_t _max_bytes;
  uint64_t _ttl_ms;
  uint64_t _bytes = 0;
  uint64_t _stamp = 0;
  std::unordered_map<std::string, entry> _map;
  std::deque<std::pair<uint64_t, std::string>> _order;  // (stamp, id), oldest first
};

// The backends that made the responses of groups that speak Responses
// natively (their backends hold the conversation, so previous_response_id
// is routed back to the one that made it): (key id, response id) -> the
// backend's URL. Bounded like the store: entries live store_ttl_s, and
// beyond `max_entries` the oldest go first.
class route_book {
 public:
  route_book(size_t max_entries, uint64_t ttl_ms) noexcept : _max_entries(max_entries), _ttl_ms(ttl_ms) {}
  void put(std::string_view key_id, std::string_view id, std::string_view backend, uint64_t now_ms);
  // The backend of `id` made for `key_id`, or null (none, expired, another key's).
  const std::string* get(std::string_view key_id, std::string_view id, uint64_t now_ms) const;
  void expire(uint64_t now_ms);
  void set_limits(size_t max_entries, uint64_t ttl_ms) noexcept;
  size_t size() const noexcept { return _map.size(); }
  // The entries a store of `store_max_bytes` allows (a route is small).
  static size_t entries_for(uint64_t store_max_bytes) noexcept {
    return static_cast<size_t>(store_max_bytes / 256 > 1024 ? store_max_bytes / 256 : 1024);
  }

 private:
  struct entry {
    std::string backend;
    uint64_t expires_ms = 0;
    uint64_t stamp = 0;
  };
  static std::string name_of(std::string_view key_id, std::string_view id);
  void trim(uint64_t now_ms);
  size_t _max_entries;
  uint64_t _ttl_ms;
  uint64_t _stamp = 0;
  std::unordered_map<std::string, entry> _map;
  std::deque<std::pair<uint64_t, std::string>> _order;  // (stamp, name), oldest first
};

// Control thread: the store and its service. Each loop turn, every shard's
// store operations are applied and get / remove answered: from the local
// store, or (store = "redis") from the cluster's Redis, where an entry is
// one string key ("<key_prefix>resp:<len>:<key id>:<response id>", the
// owner in its name) holding the items, a newline and the response object,
// with the store's TTL; Redis's own memory policy bounds the bytes. Routes
// of native groups' responses live in the route book, or (store =
// "redis") as "<key_prefix>route:<len>:<key id>:<response id>" keys
// holding the backend's URL, so that every instance routes them alike.
class response_keeper {
 public:
  response_keeper(shard::reactor& r, gateway& g, const config::config& cfg);
  ~response_keeper();
  response_keeper(const response_keeper&) = delete;
  response_keeper& operator=(const response_keeper&) = delete;
  void on_iteration(uint64_t now_ms);
  void reload(const config::config& cfg) noexcept;
  const response_store& store() const noexcept { return _store; }
  const route_book& routes() const noexcept { return _routes; }

 private:
  // A get or remove, answered once the turn's puts are in.
  struct ask {
    uint32_t shard = 0;
    proxy::store_op::kind what = proxy::store_op::kind::get;
    uint64_t seq = 0;
    proxy::store_record* record = nullptr;  // owned until answered
  };
  static constexpr uint32_t k_reads_max = 8;  // reads of the queues a turn
  static void on_op(void* ctx, uint32_t shard, const proxy::store_op& op);
  void answer(const ask& a);
  void answer_guarded(const ask& a) noexcept;  // answer(); out of memory: "unavailable"
  // store = "redis": a put sent, an ask sent (answered from its reply).
  void put_remote(proxy::store_record& r);
  void ask_remote(const ask& a);
  std::string remote_key(std::string_view kind, std::string_view key_id, std::string_view id) const;
  gateway& _g;
  response_store _store;
  route_book _routes;
  std::unique_ptr<cluster::redis_client> _redis;  // store = "redis"
  uint64_t _ttl_ms = 0;
  std::vector<ask> _asks;
  uint64_t _now_ms = 0;
  uint64_t _next_expiry_ms = 0;
};

}  // namespace sluice::control
