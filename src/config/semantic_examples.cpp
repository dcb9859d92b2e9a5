// config: the example scorer's model (see semantic_examples.hpp). Cold
// path, but semantic_shape() runs per request.
#include "sluice/config/semantic_examples.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <unordered_map>

#include "sluice/config/semantic.hpp"
#include "sluice/core/assert.hpp"

namespace sluice::config {

namespace {

// Byte classes of semantic_shape, one table load a byte.
enum : uint16_t {
  c_digit = 1,     // the shape bits themselves (a byte alone sets them)
  c_operator = 2,  // = + - * / ^ % < >
  c_quote = 8,     // " '
  c_lower = 0x100,
  c_upper = 0x200,
  c_word = 0x400,   // a letter, a digit, '_', or any byte of a UTF-8 sequence
  c_code = 0x800,   // ( ) { } [ ] _ .  (code punctuation against a word character)
  c_semi = 0x1000,  // ';' (code punctuation before a word character)
  c_cjk = 0x2000,   // a lead byte of U+3000..U+9FFF
  c_e2 = 0x4000,    // the lead byte of the curly quotes (E2 80 98/99/9C/9D)
};
constexpr std::array<uint16_t, 256> make_shape_classes() {
  std::array<uint16_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    uint16_t k = 0;
    if (c >= '0' && c <= '9') k |= c_digit | c_word;
    if (c >= 'a' && c <= 'z') k |= c_lower | c_word;
    if (c >= 'A' && c <= 'Z') k |= c_upper | c_word;
    if (c == '_') k |= c_word | c_code;
    if (c >= 0x80) k |= c_word;
    if (c >= 0xE3 && c <= 0xE9) k |= c_cjk;
    if (c == 0xE2) k |= c_e2;
    for (char o : std::string_view("=+-*/^%<>")) k |= c == o ? c_operator : 0;
    for (char o : std::string_view("(){}[].")) k |= c == o ? c_code : 0;
    if (c == ';') k |= c_semi;
    if (c == '"' || c == '\'') k |= c_quote;
    t[static_cast<size_t>(c)] = k;
  }
  return t;
}
constexpr std::array<uint16_t, 256> k_shape_class = make_shape_classes();

}  // namespace

uint8_t semantic_shape(std::string_view raw) noexcept {
  enum : uint8_t { k_code = 4, k_quote = 8, k_mixed = 16, k_ident = 32 };
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  const size_t n = raw.size();
  uint32_t bits = 0, any = 0;
  bool code = false, latin_word = false, ident = false, curly = false;
  uint32_t prev = 0;  // the class of the byte before (0: none)
  for (size_t i = 0; i < n; ++i) {
    const uint32_t c = k_shape_class[p[i]];
    bits |= c;
    any |= c;
    code |= ((prev & (c_code | c_semi)) != 0 && (c & c_word) != 0) || ((prev & c_word) != 0 && (c & c_code) != 0);
    latin_word |= (prev & (c_lower | c_upper)) != 0 && (c & (c_lower | c_upper)) != 0;
    ident |= (prev & c_lower) != 0 && (c & c_upper) != 0;
    if ((c & (c_e2 | c_code)) != 0) [[unlikely]] {
      // U+2018/19/1C/1D; a lower-case letter, '_', a lower-case letter.
      curly |= (c & c_e2) != 0 && i + 2 < n && p[i + 1] == 0x80 &&
               (p[i + 2] == 0x98 || p[i + 2] == 0x99 || p[i + 2] == 0x9C || p[i + 2] == 0x9D);
      ident |= p[i] == '_' && (prev & c_lower) != 0 && i + 1 < n && (k_shape_class[p[i + 1]] & c_lower) != 0;
    }
    prev = c;
  }
  uint8_t out = static_cast<uint8_t>(bits & (c_digit | c_operator | c_quote));
  if (code) out |= k_code;
  if (curly) out |= k_quote;
  if ((any & c_cjk) != 0 && latin_word) out |= k_mixed;
  if (ident) out |= k_ident;
  return out;
}

example_model build_example_model(const std::vector<std::vector<std::string>>& examples) {
  example_model m;
  m.nlabels = static_cast<uint32_t>(examples.size());
  std::unordered_map<uint64_t, uint32_t> ids;
  // Per example: its features' counts.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> counts;
  std::vector<char> buf;
  for (uint32_t l = 0; l < m.nlabels; ++l) {
    for (const std::string& e : examples[l]) {
      buf.resize(e.size() * 3 + 4);
      const size_t n = semantic_normalize(e, buf.data(), buf.size());
      std::unordered_map<uint32_t, uint32_t> c;
      for_each_feature(std::string_view(buf.data(), n), semantic_shape(e), [&](uint64_t h, feature_kind k) {
        const auto [it, added] = ids.try_emplace(h, static_cast<uint32_t>(m.kind.size()));
        if (added) m.kind.push_back(k);
        ++c[it->second];
      });
      if (c.empty()) continue;
      counts.emplace_back(c.begin(), c.end());
      std::sort(counts.back().begin(), counts.back().end());  // a fixed order: the same model every load
      m.example_label.push_back(l);
    }
  }
  m.nfeatures = static_cast<uint32_t>(m.kind.size());
  m.nexamples = static_cast<uint32_t>(counts.size());
  size_t slots = 16;
  while (slots < size_t{2} * m.nfeatures) slots *= 2;
  m.slot_hash.assign(slots, 0);
  m.slot_feature.assign(slots, 0);
  for (const auto& [h, f] : ids) {
    size_t s = h & (slots - 1);
    while (m.slot_hash[s] != 0) s = (s + 1) & (slots - 1);
    m.slot_hash[s] = h;
    m.slot_feature[s] = f;
  }
  // Document frequencies, and Bayes' counts (an example counts a feature once).
  std::vector<uint32_t> df(m.nfeatures, 0);
  std::vector<uint32_t> in_label(size_t{m.nfeatures} * m.nlabels, 0);
  std::vector<uint64_t> label_total(m.nlabels, 0);
  uint32_t bayes_vocabulary = 0;
  std::vector<bool> bayes_seen(m.nfeatures, false);
  for (uint32_t e = 0; e < m.nexamples; ++e) {
    const uint32_t l = m.example_label[e];
    for (const auto& [f, c] : counts[e]) {
      ++df[f];
      if (!bayes_reads(m.kind[f])) continue;
      ++in_label[size_t{f} * m.nlabels + l];
      ++label_total[l];
      if (!bayes_seen[f]) bayes_seen[f] = true, ++bayes_vocabulary;
    }
  }
  m.idf.resize(m.nfeatures);
  m.likelihood.assign(size_t{m.nfeatures} * m.nlabels, 0.0f);
  for (uint32_t f = 0; f < m.nfeatures; ++f) {
    m.idf[f] = static_cast<float>(std::log((m.nexamples + 1.0) / (df[f] + 1.0)));
    if (!bayes_reads(m.kind[f])) continue;
    for (uint32_t l = 0; l < m.nlabels; ++l) {
      const double num = in_label[size_t{f} * m.nlabels + l] + example_model::k_alpha;
      const double den = static_cast<double>(label_total[l]) + example_model::k_alpha * bayes_vocabulary;
      m.likelihood[size_t{f} * m.nlabels + l] = static_cast<float>(std::log(num / den));
    }
  }
  // Each example's unit TF-IDF vector, as postings by feature.
  m.posting_offset.assign(m.nfeatures + 1, 0);
  std::vector<std::vector<float>> weights(m.nexamples);
  for (uint32_t e = 0; e < m.nexamples; ++e) {
    double norm = 0;
    for (const auto& [f, c] : counts[e]) {
      const double w = (1.0 + std::log(static_cast<double>(c))) * static_cast<double>(m.idf[f]);
      weights[e].push_back(static_cast<float>(w));
      norm += w * w;
    }
    norm = std::sqrt(norm);
    for (float& w : weights[e]) w = norm > 0 ? static_cast<float>(static_cast<double>(w) / norm) : 0.0f;
    for (size_t j = 0; j < counts[e].size(); ++j) {
      if (weights[e][j] != 0.0f) ++m.posting_offset[counts[e][j].first + 1];
    }
  }
  for (uint32_t f = 0; f < m.nfeatures; ++f) m.posting_offset[f + 1] += m.posting_offset[f];
  m.posting_example.resize(m.posting_offset[m.nfeatures]);
  m.posting_weight.resize(m.posting_offset[m.nfeatures]);
  std::vector<uint32_t> fill(m.posting_offset.begin(), m.posting_offset.end() - 1);
  for (uint32_t e = 0; e < m.nexamples; ++e) {
    for (size_t j = 0; j < counts[e].size(); ++j) {
      if (weights[e][j] == 0.0f) continue;
      const uint32_t f = counts[e][j].first;
      m.posting_example[fill[f]] = e;
      m.posting_weight[fill[f]++] = weights[e][j];
    }
  }
  return m;
}

}  // namespace sluice::config
