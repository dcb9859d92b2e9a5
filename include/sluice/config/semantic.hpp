#pragma once
// config: the semantic router's trained classifier as plain numbers, and the
// text normalisation that training and classification share.
//
// Built on the cold path (config load, SIGHUP) from the groups' `examples`
// with fastText's supervised mode, or read from `[router] model_file`; one
// per config snapshot, shared read-only by every shard through the
// snapshot's shared_ptr. route::semantic_classifier runs inference over it
// without fastText (whose predict allocates per call).
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/semantic_examples.hpp"
#include "sluice/config/semantic_topics.hpp"

namespace sluice::config {

// An allocator of cache-line-aligned storage: a 64-byte row (dim 16) then
// spans one line, not two.
template <class T>
struct cache_line_allocator {
  using value_type = T;
  cache_line_allocator() noexcept = default;
  template <class U>
  cache_line_allocator(const cache_line_allocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, std::align_val_t{64}); }
  friend bool operator==(const cache_line_allocator&, const cache_line_allocator&) noexcept { return true; }
};

// The classifier's model. By fastText: copied out of it: input rows are
// words (0..nwords) then hashed subword / word-n-gram buckets
// (nwords..nwords+bucket); output rows are labels. By examples: `examples`
// (the fastText fields empty).
struct semantic_model {
  classifier_method method = classifier_method::fasttext;
  example_model examples;
  int32_t dim = 0;
  int32_t minn = 0, maxn = 0;       // character n-gram lengths (UTF-8 characters)
  int32_t word_ngrams = 1;
  int32_t bucket = 0;
  int32_t nwords = 0;
  int32_t nlabels = 0;
  std::vector<float, cache_line_allocator<float>> input;  // (nwords + bucket) x dim, row-major
  std::vector<float> output;        // nlabels x dim
  std::vector<std::string> labels;  // label -> the name of its group (reloads move groups' indices; names stay)
  // The vocabulary: open addressing on fastText's word hash; slots hold word
  // ids (-1 = empty); words' bytes are word_bytes[word_offset[i], word_offset[i+1]).
  std::vector<int32_t> slots;       // size: a power of two, at least twice nwords
  std::vector<uint32_t> word_hash;  // by word id
  std::vector<uint32_t> word_offset;
  std::string word_bytes;
  // The built-in topic of each label's group ([[group]] topic; none for
  // most), and the weight of a hit ([router] topic_weight). `topics`: some
  // label has one (else the classifier matches no vocabulary).
  std::vector<semantic_topic> label_topic;
  float topic_weight = 0;
  bool topics = false;
  std::array<double, k_topic_hits_max + 1> topic_odds{};  // e^(topic_weight x hits), by hits
  // Where it came from, for logs and --explain-route: "trained on N examples"
  // or the model file's path.
  std::string origin;
};

// The embeddings router's centroids ([router] semantic = "embeddings"):
// per group with examples, the mean of its examples' unit vectors, made unit
// length. Computed on the control thread from the embeddings group's
// answers (control::embeddings_loader), shared read-only by the shards.
struct embedding_centroids {
  uint32_t dim = 0;
  std::vector<float> rows;      // groups.size() x dim, unit length
  std::vector<uint32_t> groups; // row -> group index (indices stay valid across reloads: see reconcile)
  uint64_t fingerprint = 0;     // embeddings_fingerprint() of the config they were made for
  size_t examples = 0;
};

// The centroid nearest `v` by cosine. Returns: its row, or -1 when `v` has
// another dimension, is zero or holds a non-finite value; `cosine` its
// similarity. No allocation.
int32_t nearest_centroid(const embedding_centroids& c, std::span<const float> v, float& cosine) noexcept;

// Adds `v`, made unit length, to `sum` (same size). Returns: false when `v`
// is zero or not finite (it is then left out).
bool add_unit(std::span<float> sum, std::span<const float> v) noexcept;
// Scales `v` to unit length (a zero vector stays zero).
void normalize(std::span<float> v) noexcept;

// What the centroids depend on: the embeddings group's model and backends'
// URLs, and every group's index and examples. Equal at a reload: the
// running centroids are kept.
struct config;
struct group_config;
uint64_t embeddings_fingerprint(const config& cfg);
// The model name the embeddings calls send: the group's backend_model, else
// its first exact model name, else its name.
std::string_view embeddings_model(const group_config& g) noexcept;

// Where the shards find the centroids of their snapshot: published once by
// the control thread (release), read per request by the shards (acquire).
// Owned by the config snapshot, so it lives as long as any reader.
class centroid_slot {
 public:
  // Once per slot (later calls are ignored).
  void publish(std::shared_ptr<const embedding_centroids> c) noexcept {
    if (_ready.load(std::memory_order_relaxed)) return;
    _table = std::move(c);
    _ready.store(true, std::memory_order_release);
  }
  // Returns: the centroids, or null while they are being computed.
  const embedding_centroids* get() const noexcept {
    return _ready.load(std::memory_order_acquire) ? _table.get() : nullptr;
  }
  std::shared_ptr<const embedding_centroids> shared() const noexcept {
    return _ready.load(std::memory_order_acquire) ? _table : nullptr;
  }

 private:
  std::shared_ptr<const embedding_centroids> _table;
  std::atomic<bool> _ready{false};
};

// fastText's string hash: FNV-1a over the bytes, each byte taken as a
// *signed* char and sign-extended (dictionary.cc does this; UTF-8 bytes
// >= 0x80 hash differently than an unsigned FNV-1a would).
constexpr uint32_t fasttext_hash(std::string_view s) noexcept {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<uint32_t>(static_cast<int8_t>(c));
    h *= 16777619u;
  }
  return h;
}

// The one text form the classifier sees, for training and for requests:
// ASCII letters lower-cased; ASCII punctuation split off as tokens of its
// own ("f(x)" -> "f ( x )", so code's symbols are words); every ASCII
// whitespace and control byte becomes one space; other bytes (UTF-8) kept.
// Reads at most in.size() bytes, writes at most `cap` (a token is never cut
// in the middle of a UTF-8 sequence). Returns: bytes written. Allocates nothing.
size_t semantic_normalize(std::string_view in, char* out, size_t cap) noexcept;

// The longest prefix of `s` of at most `max_bytes` that does not end inside
// a UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t max_bytes) noexcept;

}  // namespace sluice::config
