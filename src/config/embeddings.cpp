// The embeddings router's config side: the [router] embeddings_group check
// and the centroids' arithmetic (semantic.hpp). The arithmetic runs per
// request on a cache miss (nearest_centroid) and on the control thread when
// the examples' vectors arrive (add_unit, normalize).
#include <cmath>

#include <fmt/format.h>
#include <xxhash.h>

#include "sluice/config/config.hpp"
#include "sluice/config/semantic.hpp"
#include "values.hpp"

namespace sluice::config {

namespace {

// The squared length of `v`; NaN or infinity when a value is not finite.
double norm2(std::span<const float> v) noexcept {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return s;
}

}  // namespace

int32_t nearest_centroid(const embedding_centroids& c, std::span<const float> v, float& cosine) noexcept {
  cosine = 0;
  if (c.dim == 0 || v.size() != c.dim) return -1;
  const double n2 = norm2(v);
  if (!(n2 > 0) || !std::isfinite(n2)) return -1;
  const size_t rows = c.rows.size() / c.dim;
  int32_t best = -1;
  double best_dot = -2;
  for (size_t r = 0; r < rows; ++r) {
    const float* row = c.rows.data() + r * c.dim;
    double dot = 0;
    for (uint32_t i = 0; i < c.dim; ++i) dot += static_cast<double>(row[i]) * static_cast<double>(v[i]);
    if (dot > best_dot) {  // ties: the earlier row (file order)
      best_dot = dot;
      best = static_cast<int32_t>(r);
    }
  }
  cosine = static_cast<float>(best_dot / std::sqrt(n2));
  return best;
}

bool add_unit(std::span<float> sum, std::span<const float> v) noexcept {
  if (sum.size() != v.size()) return false;
  const double n2 = norm2(v);
  if (!(n2 > 0) || !std::isfinite(n2)) return false;
  const double inv = 1.0 / std::sqrt(n2);
  for (size_t i = 0; i < v.size(); ++i) sum[i] += static_cast<float>(static_cast<double>(v[i]) * inv);
  return true;
}

void normalize(std::span<float> v) noexcept {
  const double n2 = norm2(v);
  if (!(n2 > 0) || !std::isfinite(n2)) return;
  const double inv = 1.0 / std::sqrt(n2);
  for (float& x : v) x = static_cast<float>(static_cast<double>(x) * inv);
}

uint64_t embeddings_fingerprint(const config& cfg) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto put = [&](std::string_view s) {
    const uint64_t n = s.size();
    XXH3_64bits_update(st, &n, sizeof n);
    XXH3_64bits_update(st, s.data(), s.size());
  };
  const uint32_t eg = cfg.router.embeddings_group_index;
  if (eg < cfg.groups.size()) {
    const group_config& g = cfg.groups[eg];
    put(embeddings_model(g));
    for (uint32_t b : g.backends) put(cfg.backends[b].url);
  }
  for (uint32_t i = 0; i < cfg.groups.size(); ++i) {
    const group_config& g = cfg.groups[i];
    if (g.removed || i == eg) continue;
    XXH3_64bits_update(st, &i, sizeof i);
    for (const std::string& e : g.examples) put(e);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string_view embeddings_model(const group_config& g) noexcept {
  if (!g.backend_model.empty()) return g.backend_model;
  for (const std::string& m : g.models) {
    if (m.find_first_of("*?[") == std::string::npos) return m;
  }
  return g.name;
}

void resolve_embeddings_group(config& cfg, const std::string& where) {
  router_config& r = cfg.router;
  if (r.embeddings_group.empty()) {
    throw config_error(fmt::format("{}: router.semantic = \"embeddings\" needs router.embeddings_group = \"NAME\", "
                                   "the [[group]] whose backends serve /v1/embeddings",
                                   where));
  }
  uint32_t index = UINT32_MAX;
  for (uint32_t i = 0; i < cfg.groups.size(); ++i) {
    if (!cfg.groups[i].removed && cfg.groups[i].name == r.embeddings_group) index = i;
  }
  if (index == UINT32_MAX) {
    throw config_error(
        fmt::format("{}: router.embeddings_group \"{}\" is not the name of a [[group]]", where, r.embeddings_group));
  }
  const group_config& eg = cfg.groups[index];
  if (eg.protocol != backend_protocol::openai) {
    throw config_error(fmt::format("{}: router.embeddings_group \"{}\" has protocol = \"{}\"; the embeddings router "
                                   "calls /v1/embeddings over the OpenAI API (protocol = \"openai\")",
                                   where, eg.name, to_string(eg.protocol)));
  }
  size_t with_examples = 0;
  for (uint32_t i = 0; i < cfg.groups.size(); ++i) {
    if (i != index && !cfg.groups[i].removed && !cfg.groups[i].examples.empty()) ++with_examples;
  }
  if (with_examples < 2) {
    throw config_error(fmt::format("{}: router.semantic = \"embeddings\" needs examples in at least two [[group]]s "
                                   "besides the embeddings group (their centroids are what a prompt is compared "
                                   "with); {} has them",
                                   where, with_examples));
  }
  r.embeddings_group_index = index;
  r.centroids = std::make_shared<centroid_slot>();
}

}  // namespace sluice::config
