// fastText's supervised inference without fastText (see semantic.hpp). Its
// operations follow fastText 0.9.2's (model.cc, loss.cc, densematrix.cc,
// dictionary.cc); the one difference is the hidden vector's sum, which
// adds each token's rows summed first (so a token cache can keep them):
// the same numbers to a few units in the last place.
#include "sluice/route/semantic.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <cstring>
#include <span>

#include "sluice/core/assert.hpp"

namespace sluice::route {

namespace {

constexpr std::string_view k_label_prefix = "__label__";

bool continuation(char c) noexcept { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// a % d for 32-bit a and d without a division (Lemire, Kaser and Kurz,
// "Faster Remainder by Direct Computation", 2019): every character n-gram
// takes one, and a division is most of an n-gram's cost.
__extension__ typedef unsigned __int128 u128;
uint64_t fastmod_magic(uint32_t d) noexcept { return UINT64_MAX / d + 1; }
uint32_t fastmod(uint32_t a, uint64_t magic, uint32_t d) noexcept {
  const uint64_t low = magic * a;
  return static_cast<uint32_t>((static_cast<u128>(low) * d) >> 64);
}

// A short compare inline: a call to memcmp costs more than the ~6 bytes
// of a typical token.
bool same_bytes(const char* a, const char* b, size_t n) noexcept {
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

uint32_t fnv_step(uint32_t h, char c) noexcept {
  h ^= static_cast<uint32_t>(static_cast<int8_t>(c));
  return h * 16777619u;
}

}  // namespace

semantic_classifier::semantic_classifier(std::shared_ptr<const config::semantic_model> model, uint32_t text_bytes_max,
                                         uint32_t token_cache)
    : _model(std::move(model)), _text_bytes_max(text_bytes_max) {
  SLUICE_VERIFY(_model != nullptr);
  SLUICE_VERIFY((token_cache & (token_cache - 1)) == 0);
  // System prompt + user message, each up to text_bytes_max, tripled by
  // punctuation at worst, plus the space between them.
  const size_t text = size_t{text_bytes_max} * 6 + 1;
  _text.resize(text);
  if (_model->method == config::classifier_method::examples) {
    const config::example_model& m = _model->examples;
    _output.resize(m.nlabels);
    _stamp.assign(m.nfeatures, 0);
    _count.resize(m.nfeatures);
    _seen.resize(m.nfeatures);
    _example_dot.resize(m.nexamples);
    _bayes.resize(m.nlabels);
    _best.resize(size_t{m.nlabels} * config::example_model::k_nearest);
    _cache_mask = token_cache == 0 ? 0 : token_cache - 1;
    _way_mask = token_cache >= 2 ? 1 : 0;
    _example_slots.resize(token_cache);
    return;
  }
  _word.resize(text + 2);
  _hashes.resize(text / 2 + 1);
  _hidden.resize(static_cast<size_t>(_model->dim));
  _output.resize(static_cast<size_t>(_model->nlabels));
  const size_t slots = token_cache;
  _cache_mask = slots == 0 ? 0 : slots - 1;
  _way_mask = slots >= 2 ? 1 : 0;
  _slots.resize(slots);
  _vectors.resize((slots + 1) * _hidden.size());  // + the scratch row of a token not cached
}

int32_t semantic_classifier::find_word(std::string_view token, uint32_t hash) const noexcept {
  const config::semantic_model& m = *_model;
  const size_t mask = m.slots.size() - 1;
  for (size_t s = hash & mask;; s = (s + 1) & mask) {
    const int32_t w = m.slots[s];
    if (w < 0) return -1;
    if (m.word_hash[static_cast<size_t>(w)] != hash) continue;
    const uint32_t begin = m.word_offset[static_cast<size_t>(w)];
    const uint32_t end = m.word_offset[static_cast<size_t>(w) + 1];
    if (end - begin == token.size() && std::memcmp(m.word_bytes.data() + begin, token.data(), token.size()) == 0) {
      return w;
    }
  }
}

// Rows are queued (and prefetched: they are random reads over megabytes)
// and summed a block at a time, in the order they came, so the sum is the
// one a row-by-row loop makes, bit for bit.
void semantic_classifier::add_row(int64_t row) noexcept {
  const size_t dim = _hidden.size();
  const float* r = _model->input.data() + static_cast<size_t>(row) * dim;
  __builtin_prefetch(r);
  _queued[_queued_n++] = r;
  if (_queued_n == k_row_block) flush_rows();
  ++_rows;
}

namespace {

// The sum of `n` rows onto `hidden`, the accumulators held in vector
// registers across the rows when the dimension is known here (GCC's vector
// extension: four floats per lane, the same additions in the same order).
typedef float v4f __attribute__((vector_size(16)));

template <size_t Dim>
void sum_rows_fixed(float* hidden, const float* const* rows, size_t n) noexcept {
  constexpr size_t lanes = Dim / 4;
  v4f acc[lanes];
#pragma GCC unroll 16
  for (size_t j = 0; j < lanes; ++j) std::memcpy(&acc[j], hidden + 4 * j, sizeof(v4f));
  for (size_t k = 0; k < n; ++k) {
    const float* r = rows[k];
#pragma GCC unroll 16
    for (size_t j = 0; j < lanes; ++j) {
      v4f x;
      std::memcpy(&x, r + 4 * j, sizeof x);
      acc[j] += x;
    }
  }
#pragma GCC unroll 16
  for (size_t j = 0; j < lanes; ++j) std::memcpy(hidden + 4 * j, &acc[j], sizeof(v4f));
}

void sum_rows(float* hidden, size_t dim, const float* const* rows, size_t n) noexcept {
  switch (dim) {
    case 16: return sum_rows_fixed<16>(hidden, rows, n);
    case 32: return sum_rows_fixed<32>(hidden, rows, n);
    case 64: return sum_rows_fixed<64>(hidden, rows, n);
    default: break;
  }
  for (size_t k = 0; k < n; ++k) {
    for (size_t j = 0; j < dim; ++j) hidden[j] += rows[k][j];
  }
}

}  // namespace

void semantic_classifier::flush_rows() noexcept {
  sum_rows(_target, _hidden.size(), _queued.data(), _queued_n);
  _queued_n = 0;
}

const float* semantic_classifier::token_vector(std::string_view token, uint32_t word_hash) noexcept {
  const size_t dim = _hidden.size();
  const bool cacheable = !_slots.empty() && token.size() <= k_cached_token_max;
  // Two ways a set: the most recent entry in way 0.
  // Fibonacci hashing: FNV's low bits alone fill the sets unevenly.
  const size_t set = (static_cast<size_t>((word_hash * 0x9E3779B1u) >> 8) & _cache_mask) & ~_way_mask;
  if (cacheable) {
    for (size_t w = 0; w <= _way_mask; ++w) {
      const token_slot& s = _slots[set + w];
      if (s.len == token.size() && same_bytes(s.bytes, token.data(), token.size())) {
        ++_token_hits;
        _rows += s.rows;
        return _vectors.data() + (set + w) * dim;
      }
    }
    ++_token_misses;
    if (_way_mask != 0 && _slots[set].len != 0) {
      _slots[set + 1] = _slots[set];
      std::memcpy(_vectors.data() + (set + 1) * dim, _vectors.data() + set * dim, dim * sizeof(float));
    }
  }
  // Not cacheable: summed in the scratch row after the cache's.
  const size_t i = cacheable ? set : _slots.size();
  float* v = _vectors.data() + i * dim;
  // Summed from zero, in fastText's order within the token: the word's
  // row, then its n-grams ("</s>", the end of a line, has none).
  std::fill(v, v + dim, 0.0f);
  _target = v;
  const uint64_t before = _rows;
  if (const int32_t wid = find_word(token, word_hash); wid >= 0) add_row(wid);
  if (token != "</s>") add_subwords(token);
  flush_rows();
  _target = _hidden.data();
  if (!cacheable) return v;
  token_slot& slot = _slots[set];
  const uint64_t rows = _rows - before;
  const bool keep = rows <= UINT8_MAX;  // a model_file with long n-grams: more rows
  slot.len = keep ? static_cast<uint8_t>(token.size()) : 0;
  if (keep) std::memcpy(slot.bytes, token.data(), token.size());
  slot.rows = static_cast<uint8_t>(keep ? rows : 0);
  return v;
}

// fastText's computeSubwords over "<token>": every run of minn..maxn UTF-8
// characters, except "<" and ">" alone, hashed into a bucket.
void semantic_classifier::add_subwords(std::string_view token) noexcept {
  const config::semantic_model& m = *_model;
  if (m.maxn <= 0 || m.bucket <= 0) return;
  char* w = _word.data();
  w[0] = '<';
  std::memcpy(w + 1, token.data(), token.size());
  w[token.size() + 1] = '>';
  const size_t len = token.size() + 2;
  const auto bucket = static_cast<uint32_t>(m.bucket);
  const uint64_t magic = fastmod_magic(bucket);
  for (size_t i = 0; i < len; ++i) {
    if (continuation(w[i])) continue;
    uint32_t h = 2166136261u;
    size_t j = i;
    for (int32_t n = 1; j < len && n <= m.maxn; ++n) {
      h = fnv_step(h, w[j++]);
      while (j < len && continuation(w[j])) h = fnv_step(h, w[j++]);
      if (n >= m.minn && !(n == 1 && (i == 0 || j == len))) add_row(int64_t{m.nwords} + fastmod(h, magic, bucket));
    }
  }
}

int32_t semantic_classifier::infer(std::string_view text, uint8_t shape) noexcept {
  if (_model->method == config::classifier_method::examples) return add_topics(text, infer_examples(text, shape));
  return add_topics(text, infer_fasttext(text));
}

int32_t semantic_classifier::add_topics(std::string_view text, int32_t best) noexcept {
  const config::semantic_model& m = *_model;
  if (!m.topics) return best;
  config::topic_vocabulary::builtin().count(text, _topic_hits);
  if (best < 0) return best;
  double z = 0;
  for (size_t l = 0; l < _output.size(); ++l) {
    const auto t = static_cast<size_t>(m.label_topic[l]);
    if (t != 0) {
      const uint32_t hits = std::min<uint32_t>(_topic_hits[t - 1], config::k_topic_hits_max);
      _output[l] = static_cast<float>(static_cast<double>(_output[l]) * m.topic_odds[hits]);
    }
    z += static_cast<double>(_output[l]);
  }
  best = 0;
  for (size_t l = 0; l < _output.size(); ++l) {
    _output[l] = static_cast<float>(static_cast<double>(_output[l]) / z);
    if (_output[l] > _output[static_cast<size_t>(best)]) best = static_cast<int32_t>(l);
  }
  return best;
}

namespace {

// 1 + log(c) for the counts a feature mostly has in a prompt.
const std::array<double, 16> k_tf = [] {
  std::array<double, 16> t{};
  for (size_t c = 1; c < t.size(); ++c) t[c] = 1.0 + std::log(static_cast<double>(c));
  return t;
}();

// probabilities[i] = softmax(scores)[i], in place.
template <class T>
void softmax(std::span<T> v, double scale) noexcept {
  double max = static_cast<double>(v[0]);
  for (T x : v) max = std::max(max, static_cast<double>(x));
  double z = 0;
  for (T& x : v) {
    x = static_cast<T>(std::exp((static_cast<double>(x) - max) * scale));
    z += static_cast<double>(x);
  }
  for (T& x : v) x = static_cast<T>(static_cast<double>(x) / z);
}

}  // namespace

int32_t semantic_classifier::infer_examples(std::string_view text, uint8_t shape) noexcept {
  using config::example_model;
  const example_model& m = _model->examples;
  if (++_generation == 0) {  // wrapped: no stamp may match a past call's
    std::fill(_stamp.begin(), _stamp.end(), 0);
    _generation = 1;
  }
  size_t distinct = 0;
  bool token = false;
  const auto add = [&](uint32_t f) {
    if (_stamp[f] != _generation) {
      _stamp[f] = _generation;
      _count[f] = 0;
      _seen[distinct++] = f;
    }
    ++_count[f];
  };
  // The features in for_each_feature's order.
  for (int b = 0; b < config::k_shape_bits; ++b) {
    if ((shape >> b) & 1) {
      if (const uint32_t f = m.find(config::shape_key(b)); f != UINT32_MAX) add(f);
    }
  }
  uint64_t prev = 0;
  config::for_each_token(text, [&](std::string_view tok, bool ascii) {
    token = true;
    const uint64_t w = config::word_key(tok);
    const bool cacheable = !_example_slots.empty() && tok.size() <= sizeof(example_slot::bytes);
    // Fibonacci hashing: FNV-1a's bits of a short token are poorly mixed.
    const size_t set = (static_cast<size_t>((w * 0x9E3779B97F4A7C15ull) >> 40) & _cache_mask) & ~_way_mask;
    bool hit = false;
    if (cacheable) {
      for (size_t way = 0; way <= _way_mask && !hit; ++way) {
        const example_slot& e = _example_slots[set + way];
        if (e.len != tok.size() || !same_bytes(e.bytes, tok.data(), tok.size())) continue;
        for (size_t j = 0; j < e.ids; ++j) add(e.id[j]);
        hit = true;
      }
    }
    if (hit) {
      ++_token_hits;
    } else {
      // Read from the vocabulary, and kept when it fits.
      example_slot fresh;
      bool fits = cacheable;
      const auto known = [&](uint32_t f) {
        if (f == UINT32_MAX) return;
        add(f);
        if (fits && fresh.ids == k_example_ids) fits = false;
        if (fits) fresh.id[fresh.ids++] = f;
      };
      known(m.find(w));
      config::for_each_chargram(tok, ascii, [&](uint64_t c) { known(m.find(c)); });
      if (cacheable) {
        ++_token_misses;
        if (fits) {
          fresh.len = static_cast<uint8_t>(tok.size());
          std::memcpy(fresh.bytes, tok.data(), tok.size());
          if (_way_mask != 0) _example_slots[set + 1] = _example_slots[set];
          _example_slots[set] = fresh;
        }
      }
    }
    if (prev != 0) {
      if (const uint32_t f = m.find(config::bigram_key(prev, w)); f != UINT32_MAX) add(f);
    }
    prev = w;
  });
  if (!token) return -1;
  const size_t labels = m.nlabels;
  std::fill(_bayes.begin(), _bayes.end(), 0.0);
  std::fill(_example_dot.begin(), _example_dot.end(), 0.0f);
  double norm = 0;
  for (size_t i = 0; i < distinct; ++i) {
    const uint32_t f = _seen[i];
    if (config::bayes_reads(m.kind[f])) {
      const float* lk = m.likelihood.data() + size_t{f} * labels;
      for (size_t l = 0; l < labels; ++l) _bayes[l] += static_cast<double>(lk[l]);
    }
    const uint32_t c = _count[f];
    const double w = (c < k_tf.size() ? k_tf[c] : 1.0 + std::log(static_cast<double>(c))) * static_cast<double>(m.idf[f]);
    if (w == 0) continue;
    norm += w * w;
    // Restrict: the dots are no posting, so the loop need not reload the
    // postings after each store.
    float* __restrict dot = _example_dot.data();
    const uint32_t* __restrict example = m.posting_example.data();
    const float* __restrict weight = m.posting_weight.data();
    const auto wf = static_cast<float>(w);
    for (uint32_t p = m.posting_offset[f], end = m.posting_offset[f + 1]; p < end; ++p) dot[example[p]] += wf * weight[p];
  }
  // Each label's best k cosines (0 where it has fewer examples).
  constexpr size_t k = example_model::k_nearest;
  std::fill(_best.begin(), _best.end(), 0.0f);
  for (uint32_t e = 0; e < m.nexamples; ++e) {
    float* best = _best.data() + size_t{m.example_label[e]} * k;
    float x = _example_dot[e];
    for (size_t j = 0; j < k; ++j) {
      if (x > best[j]) std::swap(x, best[j]);
    }
  }
  const double inv_norm = norm > 0 ? 1.0 / std::sqrt(norm) : 0.0;
  for (size_t l = 0; l < labels; ++l) {
    double sum = 0;
    for (size_t j = 0; j < k; ++j) sum += static_cast<double>(_best[l * k + j]);
    _output[l] = static_cast<float>(sum / k * inv_norm);
  }
  softmax(std::span<float>(_output), 1.0 / static_cast<double>(example_model::k_temperature));
  softmax(std::span<double>(_bayes), 1.0);
  int32_t best = 0;
  for (size_t l = 0; l < labels; ++l) {
    _output[l] = static_cast<float>((static_cast<double>(_output[l]) + _bayes[l]) / 2);
    if (_output[l] > _output[static_cast<size_t>(best)]) best = static_cast<int32_t>(l);
  }
  return best;
}

int32_t semantic_classifier::infer_fasttext(std::string_view text) noexcept {
  const config::semantic_model& m = *_model;
  std::fill(_hidden.begin(), _hidden.end(), 0.0f);
  std::fill(_output.begin(), _output.end(), 0.0f);
  _rows = 0;
  _queued_n = 0;
  _target = _hidden.data();
  const size_t dim = _hidden.size();
  size_t tokens = 0;
  size_t i = 0;
  while (i < text.size()) {
    // fastText's readWord: ' ', \n, \r, \t, \v, \f and \0 separate tokens.
    const auto sep = [](char c) {
      return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f' || c == '\0';
    };
    while (i < text.size() && sep(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !sep(text[i])) ++i;
    if (i == start) break;
    const std::string_view token = text.substr(start, i - start);
    if (token.size() + 2 > _word.size() || tokens == _hashes.size()) break;  // beyond the scratch: not read
    // A token spelled like a label is a label, never a word (getLine).
    if (token.substr(0, k_label_prefix.size()) == k_label_prefix) continue;
    const uint32_t h = config::fasttext_hash(token);
    const float* v = token_vector(token, h);
    sum_rows(_hidden.data(), dim, &v, 1);
    _hashes[tokens++] = h;
    // "</s>" (the end of a line, a word of every model) ends the line.
    if (token == "</s>") break;
  }
  // Word n-grams: fastText keeps the hashes as int32_t and widens them to
  // uint64_t with sign extension.
  const auto widen = [](uint32_t h) { return static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(h))); };
  for (size_t a = 0; a < tokens; ++a) {
    uint64_t h = widen(_hashes[a]);
    for (size_t b = a + 1; b < tokens && b < a + static_cast<size_t>(m.word_ngrams); ++b) {
      h = h * 116049371u + widen(_hashes[b]);
      add_row(int64_t{m.nwords} + static_cast<int64_t>(h % static_cast<uint64_t>(m.bucket)));
    }
  }
  flush_rows();
  if (_rows == 0) return -1;
  const auto scale = static_cast<float>(1.0 / static_cast<double>(_rows));
  for (float& x : _hidden) x *= scale;
  for (size_t l = 0; l < _output.size(); ++l) {
    const float* r = m.output.data() + l * dim;
    float d = 0.0f;
    for (size_t j = 0; j < dim; ++j) d += r[j] * _hidden[j];
    _output[l] = d;
  }
  float max = _output[0];
  for (float x : _output) max = std::max(x, max);
  float z = 0.0f;
  for (float& x : _output) {
    x = static_cast<float>(std::exp(static_cast<double>(x - max)));
    z += x;
  }
  int32_t best = 0;
  for (size_t l = 0; l < _output.size(); ++l) {
    _output[l] /= z;
    if (_output[l] > _output[static_cast<size_t>(best)]) best = static_cast<int32_t>(l);
  }
  return best;
}

int32_t semantic_classifier::classify(std::string_view system, std::string_view user) noexcept {
  size_t n = 0;
  if (!system.empty()) {
    n = config::semantic_normalize(config::utf8_prefix(system, _text_bytes_max), _text.data(), _text.size() / 2);
    if (n != 0) _text[n++] = ' ';
  }
  const std::string_view user_prefix = config::utf8_prefix(user, _text_bytes_max);
  n += config::semantic_normalize(user_prefix, _text.data() + n, _text.size() - n);
  const std::string_view text(_text.data(), n);
  if (_model->method != config::classifier_method::examples) return add_topics(text, infer_fasttext(text));
  uint8_t shape = config::semantic_shape(user_prefix);
  if (!system.empty()) shape |= config::semantic_shape(config::utf8_prefix(system, _text_bytes_max));
  return add_topics(text, infer_examples(text, shape));
}

}  // namespace sluice::route
