// control: the response store and its keeper (responses.hpp).
#include "sluice/control/responses.hpp"

#include <simdjson.h>

#include <memory>
#include <new>
#include <stdexcept>

#include <fmt/format.h>

#include "sluice/control/gateway.hpp"
#include "sluice/core/log.hpp"

namespace sluice::control {

uint64_t response_store::size_of(const proxy::store_record& r) noexcept {
  // The strings' bytes, and a bound on the map's and order's own (two
  // copies of the id, nodes, the entry).
  return r.id.size() * 2 + r.key_id.size() + r.items.size() + r.response.size() + 160;
}

bool response_store::complete(proxy::store_record& r) {
  // The response's output items end the conversation it continues.
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(r.response).get(root) != simdjson::SUCCESS || !root.is_object()) return false;
  simdjson::dom::array output;
  if (root["output"].get_array().get(output) != simdjson::SUCCESS) return false;
  for (simdjson::dom::element item : output) {
    if (!r.items.empty()) r.items += ',';
    r.items += simdjson::minify(item);
  }
  return true;
}

bool response_store::put(proxy::store_record&& r, uint64_t now_ms) {
  if (!complete(r)) return false;
  if (auto it = _map.find(r.id); it != _map.end()) drop(it);
  const uint64_t size = size_of(r);
  if (size > _max_bytes) return true;  // larger than the whole store: not kept (a continuation gets a 400)
  const uint64_t stamp = ++_stamp;
  _order.emplace_back(stamp, r.id);
  std::string id = r.id;
  _map.emplace(std::move(id), entry{std::move(r), now_ms + _ttl_ms, stamp});
  _bytes += size;
  trim(now_ms);
  return true;
}

const proxy::store_record* response_store::get(std::string_view id, std::string_view key_id,
                                               uint64_t now_ms) const noexcept {
  const auto it = _map.find(std::string(id));
  if (it == _map.end() || it->second.expires_ms <= now_ms || it->second.r.key_id != key_id) return nullptr;
  return &it->second.r;
}

bool response_store::remove(std::string_view id, std::string_view key_id) {
  const auto it = _map.find(std::string(id));
  if (it == _map.end() || it->second.r.key_id != key_id) return false;
  drop(it);
  return true;
}

void response_store::drop(std::unordered_map<std::string, entry>::iterator it) {
  _bytes -= size_of(it->second.r);
  _map.erase(it);  // its order entry goes stale: skipped when it comes up
}

void response_store::trim(uint64_t now_ms) {
  // Oldest first: expired ones, then any while over the byte bound. Every
  // entry has the same lifetime, so the order is also the expiry order.
  while (!_order.empty()) {
    const auto& [stamp, id] = _order.front();
    const auto it = _map.find(id);
    if (it == _map.end() || it->second.stamp != stamp) {
      _order.pop_front();  // removed, or replaced by a later put
      continue;
    }
    if (it->second.expires_ms > now_ms && _bytes <= _max_bytes) break;
    drop(it);
    _order.pop_front();
  }
}

void response_store::expire(uint64_t now_ms) { trim(now_ms); }

void response_store::set_limits(uint64_t max_bytes, uint64_t ttl_ms) noexcept {
  _max_bytes = max_bytes;
  _ttl_ms = ttl_ms;  // entries already kept keep their expiry
}

std::string route_book::name_of(std::string_view key_id, std::string_view id) {
  // The key's id with its length first: no pair of ids makes another's name.
  return fmt::format("{}:{}:{}", key_id.size(), key_id, id);
}

void route_book::put(std::string_view key_id, std::string_view id, std::string_view backend, uint64_t now_ms) {
  std::string name = name_of(key_id, id);
  const uint64_t stamp = ++_stamp;
  _order.emplace_back(stamp, name);
  _map.insert_or_assign(std::move(name), entry{std::string(backend), now_ms + _ttl_ms, stamp});
  trim(now_ms);
}

const std::string* route_book::get(std::string_view key_id, std::string_view id, uint64_t now_ms) const {
  const auto it = _map.find(name_of(key_id, id));
  if (it == _map.end() || it->second.expires_ms <= now_ms) return nullptr;
  return &it->second.backend;
}

void route_book::trim(uint64_t now_ms) {
  // Oldest first (every entry has the same lifetime): expired ones, then
  // any beyond the bound.
  while (!_order.empty()) {
    const auto& [stamp, name] = _order.front();
    const auto it = _map.find(name);
    if (it == _map.end() || it->second.stamp != stamp) {
      _order.pop_front();  // replaced by a later put
      continue;
    }
    if (it->second.expires_ms > now_ms && _map.size() <= _max_entries) break;
    _map.erase(it);
    _order.pop_front();
  }
}

void route_book::expire(uint64_t now_ms) { trim(now_ms); }

void route_book::set_limits(size_t max_entries, uint64_t ttl_ms) noexcept {
  _max_entries = max_entries;
  _ttl_ms = ttl_ms;
}

response_keeper::response_keeper(shard::reactor& r, gateway& g, const config::config& cfg)
    : _g(g),
      _store(cfg.responses.store_max_bytes, uint64_t{cfg.responses.store_ttl_s} * 1000),
      _routes(route_book::entries_for(cfg.responses.store_max_bytes), uint64_t{cfg.responses.store_ttl_s} * 1000),
      _ttl_ms(uint64_t{cfg.responses.store_ttl_s} * 1000) {
  _g.set_store_reactor(&r);
  if (cfg.responses.store != config::response_store_mode::redis) return;
  cluster::redis_options o;
  o.host = cfg.cluster.url.host;
  o.port = cfg.cluster.url.port;
  o.password = cfg.cluster.password;
  o.key_prefix = cfg.cluster.key_prefix;
  o.timeout_ms = cfg.cluster.timeout_ms;
  o.fallback_note = "the response store answers 503 meanwhile";
  auto c = cluster::redis_client::create(r, std::move(o));
  if (!c) throw std::runtime_error(fmt::format("[responses] store = \"redis\": {} does not resolve", cfg.cluster.redis));
  _redis = std::move(c.value());
  _redis->start();
  log::info("responses: the response store is Redis {} (entries live {} s)", cfg.cluster.redis, cfg.responses.store_ttl_s);
}

std::string response_keeper::remote_key(std::string_view kind, std::string_view key_id, std::string_view id) const {
  // The owner's id in the name, its length first, so that no pair of ids
  // makes another key's name.
  return fmt::format("{}{}:{}:{}:{}", _redis->options().key_prefix, kind, key_id.size(), key_id, id);
}

void response_keeper::put_remote(proxy::store_record& r) {
  if (!response_store::complete(r)) {
    log::warn("responses: a response to store is not a response object");
    return;
  }
  std::string value;
  value.reserve(r.items.size() + 1 + r.response.size());
  value.append(r.items).append("\n").append(r.response);
  const bool sent = _redis->command({"SET", remote_key("resp", r.key_id, r.id), std::move(value), "PX", std::to_string(_ttl_ms)},
                                    [](result<cluster::command_reply>) {});
  if (!sent) log::warn("responses: Redis is away; a response is not kept");
}

void response_keeper::ask_remote(const ask& a) {
  std::shared_ptr<proxy::store_record> rec(a.record);
  const uint32_t shard = a.shard;
  const uint64_t seq = a.seq;
  gateway* g = &_g;
  const bool route = a.what == proxy::store_op::kind::route_get;
  const bool get = a.what == proxy::store_op::kind::get || route;
  std::vector<std::string> argv{get ? "GET" : "DEL", remote_key(route ? "route" : "resp", rec->key_id, rec->id)};
  const bool sent = _redis->command(std::move(argv), [g, shard, seq, rec, get, route](result<cluster::command_reply> reply) {
    if (!reply) {
      g->answer_store(shard, seq, nullptr, true);
      return;
    }
    const cluster::command_reply& v = reply.value();
    if (route) {
      proxy::store_record* out = v.nil ? nullptr : new (std::nothrow) proxy::store_record(*rec);
      if (out != nullptr) out->backend = v.text;
      g->answer_store(shard, seq, out, !v.nil && out == nullptr);
      return;
    }
    if (!get) {
      g->answer_store(shard, seq, v.integer > 0 ? new proxy::store_record(*rec) : nullptr);
      return;
    }
    const size_t nl = v.text.find('\n');
    if (v.nil || nl == std::string::npos) {
      g->answer_store(shard, seq, nullptr);
      return;
    }
    auto* out = new (std::nothrow) proxy::store_record(*rec);
    if (out == nullptr) {
      g->answer_store(shard, seq, nullptr, true);
      return;
    }
    out->items.assign(v.text, 0, nl);
    out->response.assign(v.text, nl + 1);
    g->answer_store(shard, seq, out);
  });
  if (!sent) _g.answer_store(shard, seq, nullptr, true);
}

response_keeper::~response_keeper() { _g.set_store_reactor(nullptr); }

void response_keeper::reload(const config::config& cfg) noexcept {
  _store.set_limits(cfg.responses.store_max_bytes, uint64_t{cfg.responses.store_ttl_s} * 1000);
  _routes.set_limits(route_book::entries_for(cfg.responses.store_max_bytes), uint64_t{cfg.responses.store_ttl_s} * 1000);
  _ttl_ms = uint64_t{cfg.responses.store_ttl_s} * 1000;
  if ((cfg.responses.store == config::response_store_mode::redis) != (_redis != nullptr)) {
    log::warn("SIGHUP: [responses] store changed between local and redis; the running instance keeps its store "
              "until it restarts");
  }
}

void response_keeper::on_op(void* ctx, uint32_t shard, const proxy::store_op& op) {
  auto* k = static_cast<response_keeper*>(ctx);
  std::unique_ptr<proxy::store_record> rec(op.record);
  if (!rec) return;
  if (op.what == proxy::store_op::kind::put) {
    // Puts at once, in each shard's order (to Redis: sent before any ask
    // of this turn, on the same connection, so answered after them).
    try {
      if (k->_redis) {
        k->put_remote(*rec);
      } else if (!k->_store.put(std::move(*rec), k->_now_ms)) {
        log::warn("responses: a response to store is not a response object");
      }
    } catch (const std::bad_alloc&) {
      log::error("responses: out of memory in the response store; a response is not kept");
    }
    return;
  }
  if (op.what == proxy::store_op::kind::route_put) {
    try {
      if (k->_redis) {
        const bool sent = k->_redis->command(
            {"SET", k->remote_key("route", rec->key_id, rec->id), std::move(rec->backend), "PX", std::to_string(k->_ttl_ms)},
            [](result<cluster::command_reply>) {});
        if (!sent) log::warn("responses: Redis is away; a native response's backend is not kept");
      } else {
        k->_routes.put(rec->key_id, rec->id, rec->backend, k->_now_ms);
      }
    } catch (const std::bad_alloc&) {
      log::error("responses: out of memory; a native response's backend is not kept");
    }
    return;
  }
  try {
    k->_asks.push_back({shard, op.what, op.seq, rec.get()});
    rec.release();
  } catch (const std::bad_alloc&) {
    k->_g.answer_store(shard, op.seq, nullptr);
  }
}

void response_keeper::answer_guarded(const ask& a) noexcept {
  try {
    answer(a);
  } catch (const std::bad_alloc&) {
    _g.answer_store(a.shard, a.seq, nullptr, true);
  }
}

void response_keeper::answer(const ask& a) {
  if (_redis) {
    ask_remote(a);
    return;
  }
  std::unique_ptr<proxy::store_record> rec(a.record);
  const auto found = [&] {
    if (a.what == proxy::store_op::kind::route_get) {
      const std::string* b = _routes.get(rec->key_id, rec->id, _now_ms);
      if (b != nullptr) rec->backend = *b;
      return b != nullptr;
    }
    if (a.what == proxy::store_op::kind::remove) return _store.remove(rec->id, rec->key_id);
    const proxy::store_record* r = _store.get(rec->id, rec->key_id, _now_ms);
    if (r != nullptr) *rec = *r;  // the copy travels; the store keeps its own
    return r != nullptr;
  };
  const bool ok = found();
  _g.answer_store(a.shard, a.seq, ok ? rec.release() : nullptr);
}

void response_keeper::on_iteration(uint64_t now_ms) {
  _now_ms = now_ms;
  if (_redis) _redis->on_iteration(now_ms);
  // An ask is answered only after a read of every queue that began after
  // it was taken: a put that happened before the ask (its client saw that
  // response, then asked) was pushed before the ask, so that later read
  // has it, whichever shard's queue it sits in. Puts are applied (or sent
  // to Redis, on the one connection the asks follow) as they are read.
  size_t answered = 0;
  uint32_t reads = 0;
  do {
    const size_t taken = _asks.size();
    _g.take_store_ops(&on_op, this);
    ++reads;
    for (; answered < taken; ++answered) answer_guarded(_asks[answered]);
  } while (answered < _asks.size() && reads < k_reads_max);
  for (; answered < _asks.size(); ++answered) answer_guarded(_asks[answered]);
  _asks.clear();
  if (now_ms >= _next_expiry_ms) {
    _store.expire(now_ms);
    _routes.expire(now_ms);
    _next_expiry_ms = now_ms + 1000;
  }
}

}  // namespace sluice::control
