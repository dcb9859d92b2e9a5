// control: the response store and its keeper (responses.hpp).
#include "sluice/control/responses.hpp"

#include <simdjson.h>

#include <memory>

#include "sluice/control/gateway.hpp"
#include "sluice/core/log.hpp"

namespace sluice::control {

uint64_t response_store::size_of(const proxy::store_record& r) noexcept {
  // The strings' bytes, and a bound on the map's and order's own (two
  // copies of the id, nodes, the entry).
  return r.id.size() * 2 + r.key_id.size() + r.items.size() + r.response.size() + 160;
}

bool response_store::put(proxy::store_record&& r, uint64_t now_ms) {
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

response_keeper::response_keeper(shard::reactor& r, gateway& g, const config::config& cfg)
    : _g(g),
      _store(cfg.responses.store_max_bytes, uint64_t{cfg.responses.store_ttl_s} * 1000) {
  _g.set_store_reactor(&r);
}

response_keeper::~response_keeper() { _g.set_store_reactor(nullptr); }

void response_keeper::reload(const config::config& cfg) noexcept {
  _store.set_limits(cfg.responses.store_max_bytes, uint64_t{cfg.responses.store_ttl_s} * 1000);
}

void response_keeper::on_op(void* ctx, uint32_t shard, const proxy::store_op& op) {
  auto* k = static_cast<response_keeper*>(ctx);
  std::unique_ptr<proxy::store_record> rec(op.record);
  if (!rec) return;
  if (op.what == proxy::store_op::kind::put) {
    // Puts at once, in each shard's order.
    try {
      if (!k->_store.put(std::move(*rec), k->_now_ms)) log::warn("responses: a response to store is not a response object");
    } catch (const std::bad_alloc&) {
      log::error("responses: out of memory in the response store; a response is not kept");
    }
    return;
  }
  try {
    k->_asks.push_back({shard, op.what, op.seq, rec.get(), k->_reads});
    rec.release();
  } catch (const std::bad_alloc&) {
    k->_g.answer_store(shard, op.seq, nullptr);
  }
}

void response_keeper::answer(const ask& a) {
  std::unique_ptr<proxy::store_record> rec(a.record);
  const auto found = [&] {
    if (a.what == proxy::store_op::kind::remove) return _store.remove(rec->id, rec->key_id);
    const proxy::store_record* r = _store.get(rec->id, rec->key_id, _now_ms);
    if (r != nullptr) *rec = *r;  // the copy travels; the store keeps its own
    return r != nullptr;
  };
  bool ok = found();
  if (!ok && a.read == _reads && _reads < k_reads_max) {
    // A put that happened before this ask (its client saw the response)
    // may sit in a queue the read that took the ask passed before the put
    // was pushed: the queues once more, then the answer.
    ++_reads;
    _g.take_store_ops(&on_op, this);
    ok = found();
  }
  _g.answer_store(a.shard, a.seq, ok ? rec.release() : nullptr);
}

void response_keeper::on_iteration(uint64_t now_ms) {
  _now_ms = now_ms;
  _reads = 1;
  _g.take_store_ops(&on_op, this);
  // Every put taken this turn is in; then the gets and removes (asks
  // taken by a second read are answered in this loop too).
  for (size_t i = 0; i < _asks.size(); ++i) {
    try {
      answer(_asks[i]);
    } catch (const std::bad_alloc&) {
      _g.answer_store(_asks[i].shard, _asks[i].seq, nullptr);
    }
  }
  _asks.clear();
  if (now_ms >= _next_expiry_ms) {
    _store.expire(now_ms);
    _next_expiry_ms = now_ms + 1000;
  }
}

}  // namespace sluice::control
