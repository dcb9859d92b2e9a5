// Responses state on the shard ([responses] store): previous_response_id on
// a translated group, GET and DELETE /v1/responses/{id}, and keeping what
// was rendered. The store itself is the control thread's
// (control::response_store); a shard posts an operation on its link,
// parks the exchange in a list until the answer comes back as a control
// message, and never waits. A put is fire and forget.
#include <fmt/format.h>

#include <memory>
#include <new>

#include "client_codec.hpp"
#include "shard_server.hpp"
#include "sluice/core/log.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::proxy {

namespace {

// The store's owner of a request: its key's id ("" without one).
std::string_view key_id_of(const config::config& cfg, const exchange& x) noexcept {
  return x.key_index >= 0 ? std::string_view(cfg.keys[static_cast<size_t>(x.key_index)].id) : std::string_view();
}

// `pattern` with its one {} the response id (its first 128 bytes, JSON-
// escaped), written into x.scratch. Returns: the text.
std::string_view with_id(exchange& x, fmt::format_string<std::string_view> pattern, std::string_view id) noexcept {
  char quoted[160];
  const size_t ql = openai::json_escape(quoted, sizeof quoted, id.substr(0, id.size() < 128 ? id.size() : 128));
  const auto out = fmt::format_to_n(x.scratch, sizeof x.scratch, pattern, std::string_view(quoted, ql));
  return std::string_view(x.scratch, out.size < sizeof x.scratch ? out.size : sizeof x.scratch);
}

// The global index of `url` among group `g`'s backends, or UINT32_MAX.
uint32_t backend_of(const config::config& cfg, uint32_t g, std::string_view url) noexcept {
  if (g >= cfg.groups.size()) return UINT32_MAX;
  for (const uint32_t b : cfg.groups[g].backends) {
    if (cfg.backends[b].url == url && !cfg.backends[b].removed) return b;
  }
  return UINT32_MAX;
}

}  // namespace

bool shard_server::ask_store(exchange& x, store_op::kind k) noexcept {
  store_op op;
  op.what = k;
  op.seq = ++_store_seq;
  op.record = new (std::nothrow) store_record;
  bool ok = op.record != nullptr;
  if (ok) {
    try {
      op.record->id = x.mem->store_id;
      op.record->key_id = key_id_of(*_cfg, x);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || _mesh.to_store == nullptr || !_mesh.to_store->try_push(op)) {
    delete op.record;
    if (k == store_op::kind::route_get) return false;  // routed as if unknown
    x.codec->answer_error(x, 503, "The response store is busy. Please try again.", "server_error", {}, "overloaded",
                          false, "retry-after: 1\r\n");
    return false;
  }
  if (_mesh.store_reactor != nullptr) {
    if (shard::reactor* r = _mesh.store_reactor->load(std::memory_order_acquire)) r->wake();
  }
  x.req.store_seq = op.seq;
  x.req.route_asked = k == store_op::kind::route_get;
  x.waiting = exchange::waiting_in::store;
  x.wait_hook = {};
  x.wait_hook.next = _store_waiters;
  if (_store_waiters != nullptr) _store_waiters->wait_hook.prev = &x;
  _store_waiters = &x;
  // Parked at its codec too: a client that leaves now unparks it (out of
  // the list) before its connection, which holds it, goes.
  x.codec->wait_for_quota(x);
  return true;
}

void shard_server::on_store_answer(uint64_t seq, store_record* record, bool unavailable) noexcept {
  std::unique_ptr<store_record> r(record);
  exchange* x = _store_waiters;
  while (x != nullptr && x->req.store_seq != seq) x = x->wait_hook.next;
  if (x == nullptr) return;  // its client went
  unpark(*x);
  x->codec->wait_for_backend(*x, deadline_kind::none, 0);  // as dispatch left it
  if (x->req.route_asked) {
    // The backend that made the response continued on a native group; not
    // known (or the store away): routed as any request, and the backend
    // says whether it holds the conversation.
    x->req.route_asked = false;
    if (r && !unavailable) x->req.pinned_backend = backend_of(*_cfg, x->group, r->backend);
    route_request(*x);
    return;
  }
  if (unavailable) {
    x->codec->answer_error(*x, 503, "The response store cannot be reached. Please try again.", "server_error", {},
                           "store_unavailable", false, "retry-after: 1\r\n");
    return;
  }
  if (x->req.store_call != canonical_request::store_verb::none) {
    answer_store_call(*x, r.get());
    return;
  }
  // previous_response_id: the conversation it continues, or a 400.
  if (!r) {
    x->codec->answer_error(*x, 400, with_id(*x, "Previous response with id '{}' not found.", x->mem->store_id),
                           "invalid_request_error", "previous_response_id", "previous_response_not_found", false);
    return;
  }
  x->mem->store_history.swap(r->items);
  x->req.history_fetched = true;
  route_request(*x);  // translated again, with the conversation before the input
}

void shard_server::answer_store_call(exchange& x, const store_record* r) noexcept {
  if (r == nullptr) {
    x.codec->answer_error(x, 404, with_id(x, "Response with id '{}' not found.", x.mem->store_id),
                          "invalid_request_error", {}, "not_found", false);
    return;
  }
  if (x.req.store_call == canonical_request::store_verb::get) {
    x.codec->answer(x, 200, r->response, false, {}, {});
    return;
  }
  // DELETE, as OpenAI answers it.
  x.codec->answer(x, 200, with_id(x, "{{\"id\":\"{}\",\"object\":\"response\",\"deleted\":true}}", r->id), false,
                  {}, {});
}

void shard_server::keep_response(exchange& x) noexcept {
  // A rendered Responses reply, whole: the stream's last object, or the
  // non-stream body.
  x.req.store_put = false;  // once
  auto rec = std::unique_ptr<store_record>(new (std::nothrow) store_record);
  if (!rec) return;
  try {
    bool ok = false;
    if (x.req.is_stream) {
      ok = x.mem->renderer && x.mem->renderer->write_response(rec->response);
    } else {
      ok = !x.mem->dialect_reply.empty();
      if (ok) rec->response = x.mem->dialect_reply;
    }
    if (!ok) return;
    rec->id.assign("resp_").append(x.request_id, x.request_id_len);
    rec->key_id = key_id_of(*_cfg, x);
    rec->items.swap(x.mem->store_items);
  } catch (...) {
    return;  // out of memory: not kept
  }
  store_op op;
  op.what = store_op::kind::put;
  op.record = rec.get();
  if (_mesh.to_store == nullptr || !_mesh.to_store->try_push(op)) {
    _metrics.at(metrics::stat::responses_store_dropped).add();
    return;
  }
  rec.release();  // the control thread's now
  _metrics.at(metrics::stat::responses_stored).add();
  if (_mesh.store_reactor != nullptr) {
    if (shard::reactor* r = _mesh.store_reactor->load(std::memory_order_acquire)) r->wake();
  }
}

void shard_server::keep_route(exchange& x, uint32_t backend, std::string_view response_id) noexcept {
  x.req.keep_route = false;  // once
  if (response_id.empty() || response_id.size() > 256 || backend >= _cfg->backends.size()) return;
  auto rec = std::unique_ptr<store_record>(new (std::nothrow) store_record);
  if (!rec) return;
  try {
    rec->id = response_id;
    rec->key_id = key_id_of(*_cfg, x);
    rec->backend = _cfg->backends[backend].url;
  } catch (...) {
    return;  // out of memory: not kept (a continuation is routed as any request)
  }
  store_op op;
  op.what = store_op::kind::route_put;
  op.record = rec.get();
  if (_mesh.to_store == nullptr || !_mesh.to_store->try_push(op)) return;
  rec.release();  // the control thread's now
  if (_mesh.store_reactor != nullptr) {
    if (shard::reactor* r = _mesh.store_reactor->load(std::memory_order_acquire)) r->wake();
  }
}

}  // namespace sluice::proxy
