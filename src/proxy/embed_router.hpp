#pragma once
// proxy (private): the embeddings router's calls on a shard. An auto-model
// request whose decision is pending (route::decision::pending) parks here
// while its prompt goes to the [router] embeddings_group's backend as a
// /v1/embeddings call; the reply's vector against the centroids decides,
// and the exchange goes on (shard_server::route_request) as if it had been
// decided at once. A call that fails, times out ([router]
// embeddings_timeout_ms) or cannot start (every slot busy, no backend up)
// hands the decision to the classifier and the rules -- never an error to
// the client.
//
// A parked exchange is in the codec's quota_wait state (the same teardown
// path: the client going away unparks it, see shard_server::unpark); its
// slot then forgets it, and the call still ends into the cache.
//
// Lifetimes: a slot's http_call owns its buffers while the kernel does
// (see net/http_call.hpp); a slot is taken again only when idle.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "shard_context.hpp"
#include "sluice/net/http_call.hpp"
#include "sluice/route/embeddings.hpp"
#include "sluice/route/groups.hpp"

namespace sluice::proxy {

struct exchange;
class shard_server;

class embed_router {
 public:
  // The most calls in flight per shard; more pending decisions fall back.
  static constexpr size_t k_slots = 16;
  // The most bytes of one call's reply (one vector written as text).
  static constexpr size_t k_reply_max = 256u << 10;

  embed_router(shard_context& ctx, shard_server& srv) : _ctx(ctx), _srv(srv) {}
  embed_router(const embed_router&) = delete;
  embed_router& operator=(const embed_router&) = delete;

  // Starts the call for `x`'s pending decision (`in`, from the shard's
  // group table). Returns: whether `x` now waits for it (then the caller
  // parks it); false: decide without the embeddings.
  bool start(exchange& x, const route::embed_input& in) noexcept;
  // `x` leaves (its client went): the call goes on without it.
  void detach(exchange& x) noexcept;
  // Once per loop turn: calls past their deadline end.
  void on_iteration(uint64_t now_ms) noexcept;
  size_t in_flight() const noexcept { return _running; }
  // Whether no call has an operation in the kernel (the shard may end).
  bool idle() const noexcept;
  // Drain cut: every call ends now (its waiter falls back).
  void cancel_all() noexcept;
  ~embed_router();

 private:
  struct slot {
    embed_router* owner = nullptr;
    std::unique_ptr<net::http_call> call;
    exchange* waiter = nullptr;
    route::embed_input in;                                  // hash and later_turn only (the views are not kept)
    std::shared_ptr<const config::embedding_centroids> centroids;  // what the call decides against
  };
  static void on_done(void* ctx, net::http_call& call, net::http_call::outcome o);
  void finish(slot& s, net::http_call::outcome o) noexcept;
  // A failing embeddings group logs once per interval, not per request.
  bool warn_now() noexcept;
  static constexpr uint64_t k_warn_interval_ms = 10000;

  shard_context& _ctx;
  shard_server& _srv;
  std::array<slot, k_slots> _slots;
  size_t _running = 0;
  route::embeddings_reader _reader;
  std::vector<float> _vec;
  std::string _why;
  uint64_t _last_warn_ms = 0;
};

}  // namespace sluice::proxy
