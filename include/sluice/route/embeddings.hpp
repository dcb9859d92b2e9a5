#pragma once
// route: the embeddings router's wire side -- the /v1/embeddings request a
// prompt (or a batch of examples) is sent as, and the reply read back into
// floats -- and the shard's cache of its decisions.
//
// The request is OpenAI's: {"model": M, "input": "TEXT"} (or a list of
// texts), over HTTP/1.1 with Connection: close, the group's backend key as
// a bearer token when it has one (never the client's). The reply: an HTTP
// head, a JSON body (Content-Length, chunked, or until close) holding
// data[i].embedding, every one of the same dimension.
//
// Shard-local objects (embeddings_reader, decision_cache); the control
// thread has its own reader.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

#include "sluice/http/response.hpp"

namespace sluice::route {

// The most bytes of one reply sluice reads (a batch of examples' vectors:
// 64 x 4096 floats written as text fit).
inline constexpr size_t k_embeddings_reply_max = 8u << 20;

// Writes the request for `inputs` (one: "input" is a string; more: a list)
// into `out` (cleared first). `host`: the Host header; `api_key`: "" = no
// Authorization header.
void write_embeddings_request(std::string& out, std::string_view host, std::string_view model,
                              std::string_view api_key, std::span<const std::string_view> inputs);

// Whether `so_far` holds a whole HTTP response (its head, and a body of its
// Content-Length or up to the terminal chunk); false when it is delimited by
// the close. A cheap check: the reader validates for real.
bool embeddings_reply_whole(std::string_view so_far) noexcept;

class embeddings_reader {
 public:
  // Reads a whole reply expecting `inputs` vectors. Returns: whether it is a
  // 200 with that many vectors of one dimension; then `out` holds them row
  // after row (inputs x dim) and `dim` their dimension; else `why` says what
  // was wrong (for a log line: no reply bytes in it).
  bool read(std::string_view reply, size_t inputs, std::vector<float>& out, uint32_t& dim, std::string& why);

 private:
  http::response_parser _http;
  std::string _body;               // de-chunked (capacity kept)
  simdjson::dom::parser _json;
};

// The shard's bounded memory of embeddings decisions, keyed by the hash of
// the text embedded: direct-mapped (a colliding prompt replaces the older
// one), sized by [router] embeddings_cache. No allocation after construction.
class decision_cache {
 public:
  struct entry {
    uint64_t hash = 0;
    uint32_t row = UINT32_MAX;     // the centroid's row; UINT32_MAX = empty
    float cosine = 0;
  };
  explicit decision_cache(uint32_t entries) : _slots(entries) {}
  const entry* find(uint64_t hash) const noexcept {
    if (_slots.empty()) return nullptr;
    const entry& e = _slots[hash & (_slots.size() - 1)];
    return e.row != UINT32_MAX && e.hash == hash ? &e : nullptr;
  }
  void put(uint64_t hash, uint32_t row, float cosine) noexcept {
    if (_slots.empty()) return;
    _slots[hash & (_slots.size() - 1)] = {hash, row, cosine};
  }
  size_t capacity() const noexcept { return _slots.size(); }

 private:
  std::vector<entry> _slots;       // a power of two in size (config checks it)
};

}  // namespace sluice::route
