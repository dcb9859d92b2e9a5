#pragma once
// control: the embeddings router's centroids ([router] semantic =
// "embeddings"), computed on the control thread. For each config snapshot
// the groups' examples (each cut at [router] semantic_bytes, as the shards
// cut a prompt) go to the [router] embeddings_group's backends as
// /v1/embeddings calls of up to k_batch inputs, one call at a time; the
// vectors are summed per group as unit vectors and the sums made unit; the
// result is published into the snapshot's config::centroid_slot, where the
// shards find it. Until then, and for good when the group never answers,
// the shards' classifier decides.
//
// A call that fails is tried again on the group's next backend after a
// backoff (1 s, doubling to 30 s), so a gateway started before its
// embedding model is up routes by embeddings once the model answers. A
// reload whose examples and embeddings group are unchanged
// (config::embeddings_fingerprint) keeps the centroids it has at once.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/config/semantic.hpp"
#include "sluice/net/http_call.hpp"
#include "sluice/route/embeddings.hpp"
#include "sluice/shard/reactor.hpp"

namespace sluice::control {

class embeddings_loader {
 public:
  static constexpr size_t k_batch = 32;
  static constexpr uint64_t k_call_timeout_ms = 10000;
  static constexpr uint64_t k_backoff_first_ms = 1000;
  static constexpr uint64_t k_backoff_max_ms = 30000;

  embeddings_loader(shard::reactor& r, std::shared_ptr<const config::config> cfg);
  embeddings_loader(const embeddings_loader&) = delete;
  embeddings_loader& operator=(const embeddings_loader&) = delete;

  void reload(std::shared_ptr<const config::config> next);
  void on_iteration(uint64_t now_ms) noexcept;
  // Shutdown: stops; returns whether the loop may end (no call in the kernel).
  bool stop() noexcept;

  // What /status and tests may read.
  bool ready() const noexcept { return _published != nullptr && _job_cfg == nullptr; }
  uint64_t failures() const noexcept { return _failures; }

 private:
  struct input {
    uint32_t group;
    std::string_view text;   // into the snapshot's examples
  };
  void begin(uint64_t now_ms);
  void send_batch(uint64_t now_ms) noexcept;
  static void on_done(void* ctx, net::http_call& call, net::http_call::outcome o);
  void done(net::http_call::outcome o) noexcept;
  void fail(uint64_t now_ms, const std::string& why) noexcept;
  void publish() noexcept;

  shard::reactor& _r;
  std::shared_ptr<const config::config> _cfg;       // the running snapshot
  std::shared_ptr<const config::config> _job_cfg;   // the snapshot being computed for (null: none)
  std::shared_ptr<const config::embedding_centroids> _published;  // the last computed
  std::vector<input> _inputs;
  size_t _next = 0;                  // the first input of the batch in flight / to send
  size_t _batch = 0;                 // its size
  std::vector<float> _sums;          // groups x dim
  std::vector<uint32_t> _counts;     // per group
  uint32_t _dim = 0;
  uint32_t _backend_turn = 0;        // which of the group's backends the next call goes to
  uint64_t _next_try_ms = 0;         // 0: send now (when no call is in flight)
  uint64_t _backoff_ms = k_backoff_first_ms;
  uint64_t _started_ms = 0;
  uint64_t _failures = 0;
  bool _logged_failure = false;
  bool _stopping = false;
  net::http_call _call{route::k_embeddings_reply_max};
  route::embeddings_reader _reader;
  std::vector<float> _vecs;
  std::string _why;
};

}  // namespace sluice::control
