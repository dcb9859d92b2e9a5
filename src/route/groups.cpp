// Model groups, semantic rules and key access (see groups.hpp).
#include "sluice/route/groups.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <utility>

namespace sluice::route {

namespace {

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// ASCII case-insensitive search for an already lower-cased needle.
bool contains_folded(std::string_view haystack, std::string_view needle) noexcept {
  if (needle.empty()) return true;
  if (needle.size() > haystack.size()) return false;
  const char first = needle[0];
  for (size_t i = 0; i + needle.size() <= haystack.size(); ++i) {
    if (lower(haystack[i]) != first) continue;
    size_t j = 1;
    while (j < needle.size() && lower(haystack[i + j]) == needle[j]) ++j;
    if (j == needle.size()) return true;
  }
  return false;
}

// One class "[...]" starting at pattern[p] == '['. Returns: the index after
// ']' and sets `hit`; npos when the class is not closed (then '[' is literal).
size_t match_class(std::string_view pattern, size_t p, char c, bool& hit) noexcept {
  size_t i = p + 1;
  bool negate = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negate = true;
    ++i;
  }
  bool found = false;
  bool first = true;
  while (i < pattern.size() && (pattern[i] != ']' || first)) {
    first = false;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      if (pattern[i] <= c && c <= pattern[i + 2]) found = true;
      i += 3;
    } else {
      if (pattern[i] == c) found = true;
      ++i;
    }
  }
  if (i >= pattern.size()) return std::string_view::npos;
  hit = found != negate;
  return i + 1;
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) noexcept {
  // Iterative with one backtrack point: the last '*' (linear-ish, no recursion).
  size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size()) {
      const char pc = pattern[p];
      if (pc == '*') {
        star = p++;
        resume = t;
        continue;
      }
      if (pc == '?') {
        ++p;
        ++t;
        continue;
      }
      if (pc == '[') {
        bool hit = false;
        const size_t after = match_class(pattern, p, text[t], hit);
        if (after != std::string_view::npos) {
          if (hit) {
            p = after;
            ++t;
            continue;
          }
        } else if (text[t] == '[') {
          ++p;
          ++t;
          continue;
        }
      } else if (pc == text[t]) {
        ++p;
        ++t;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    p = star + 1;
    t = ++resume;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

group_table::group_table(const config::config& cfg)
    : _group_count(static_cast<uint32_t>(cfg.groups.size())),
      _auto_model(cfg.router.auto_model),
      _default_group(cfg.router.default_group_index == UINT32_MAX ? k_none : cfg.router.default_group_index) {
  for (uint32_t g = 0; g < _group_count; ++g) {
    if (cfg.groups[g].removed) continue;  // a reload's placeholder: matches nothing
    for (const std::string& m : cfg.groups[g].models) {
      if (m.find_first_of("*?[") != std::string::npos) {
        _patterns.push_back({m, g});
      } else {
        _exact.push_back({XXH3_64bits(m.data(), m.size()), m, g});
      }
    }
  }
  // Stable: for a name listed by two groups the first group stays first.
  std::stable_sort(_exact.begin(), _exact.end(), [](const exact_name& a, const exact_name& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.name < b.name;
  });
  for (const config::rule_config& rc : cfg.rules) {
    rule r{rc.group_index, {}, std::nullopt, rc.min_prompt_bytes, rc.max_prompt_bytes, rc.has_tools, rc.has_images,
           rc.before};
    for (const std::string& k : rc.contains_any) {
      std::string folded = k;
      std::transform(folded.begin(), folded.end(), folded.begin(), lower);
      r.keywords.push_back(std::move(folded));
    }
    if (!rc.regex.empty()) {
      r.regex.emplace(rc.regex, std::regex::ECMAScript | std::regex::icase | std::regex::nosubs |
                                    std::regex::optimize);
    }
    _rules.push_back(std::move(r));
  }
  _semantic_bytes = cfg.router.semantic_bytes;
  if (cfg.router.semantic == config::semantic_mode::embeddings && cfg.router.centroids != nullptr) {
    _centroids = cfg.router.centroids;
    _embed_cache = decision_cache(cfg.router.embeddings_cache);
  }
  if (cfg.router.semantic != config::semantic_mode::off && cfg.router.model != nullptr) {
    _classifier = std::make_unique<semantic_classifier>(cfg.router.model, cfg.router.semantic_bytes,
                                                        cfg.router.token_cache);
    _min_confidence = cfg.router.min_confidence;
    _include_system = cfg.router.include_system;
    for (const std::string& name : cfg.router.model->labels) {
      uint32_t g = 0;
      while (g < _group_count && (cfg.groups[g].removed || cfg.groups[g].name != name)) ++g;
      _label_group.push_back(g < _group_count ? g : k_none);
    }
  }
  _words = (_group_count + 63) / 64;
  if (_words == 0) _words = 1;
  _key_bits.assign(cfg.keys.size() * _words, 0);
  for (size_t k = 0; k < cfg.keys.size(); ++k) {
    for (uint32_t g = 0; g < _group_count; ++g) {
      for (const std::string& glob : cfg.keys[k].groups) {
        if (glob_match(glob, cfg.groups[g].name)) {
          _key_bits[k * _words + g / 64] |= uint64_t{1} << (g % 64);
          break;
        }
      }
    }
  }
}

uint32_t group_table::find(std::string_view model) const noexcept {
  const uint64_t h = XXH3_64bits(model.data(), model.size());
  auto it = std::lower_bound(_exact.begin(), _exact.end(), h,
                             [](const exact_name& e, uint64_t v) { return e.hash < v; });
  for (; it != _exact.end() && it->hash == h; ++it) {
    if (it->name == model) return it->group;
  }
  for (const pattern& p : _patterns) {
    if (glob_match(p.glob, model)) return p.group;
  }
  return k_none;
}

bool group_table::rule_matches(uint32_t index, const openai::request_fields& f) const noexcept {
  return rule_matches(index, f, f.last_user_message);
}

bool group_table::rule_matches(uint32_t index, const openai::request_fields& f, std::string_view text) const noexcept {
  const rule& r = _rules[index];
  if (f.input_bytes < r.min_prompt_bytes || f.input_bytes > r.max_prompt_bytes) return false;
  if (r.has_tools && *r.has_tools != f.has_tools) return false;
  if (r.has_images && *r.has_images != f.has_images) return false;
  if (!r.keywords.empty()) {
    bool any = std::any_of(r.keywords.begin(), r.keywords.end(),
                           [&](const std::string& k) { return contains_folded(text, k); });
    if (!any) return false;
  }
  if (r.regex) {
    const std::string_view bounded = text.substr(0, std::min(text.size(), k_rule_regex_bytes));
    try {
      if (!std::regex_search(bounded.begin(), bounded.end(), *r.regex)) return false;
    } catch (...) {  // error_complexity / error_stack / bad_alloc: the rule does not hold
      return false;
    }
  }
  return true;
}

uint32_t group_table::choose(const openai::request_fields& f, uint32_t key_index) const noexcept {
  for (uint32_t i = 0; i < _rules.size(); ++i) {
    if (key_allows(key_index, _rules[i].group) && rule_matches(i, f)) return _rules[i].group;
  }
  if (_default_group != k_none && key_allows(key_index, _default_group)) return _default_group;
  return k_none;
}

decision group_table::decide(const openai::request_fields& f, uint32_t key_index, bool sticky,
                             bool embeddings) noexcept {
  // A later turn of a session (its first user message is not its last):
  // decided from the first one, which every turn carries.
  // Only with the classifier on: rule-only routing keeps reading the last
  // message, as it always did.
  const bool semantic = _classifier != nullptr;
  sticky = sticky && semantic;
  const bool later_turn = sticky && f.first_user_message.data() != f.last_user_message.data();
  const std::string_view text = sticky ? f.first_user_message : f.last_user_message;
  const decision_how by_text = later_turn ? decision_how::sticky : decision_how::rule;
  decision d;
  if (semantic) {
    for (uint32_t i = 0; i < _rules.size(); ++i) {
      if (_rules[i].before && key_allows(key_index, _rules[i].group) && rule_matches(i, f, text)) {
        return {_rules[i].group, by_text, -1, -1};
      }
    }
    const config::embedding_centroids* c = embeddings ? centroids() : nullptr;
    if (c != nullptr) {
      embed_input& in = _embed_in;
      in.system = _include_system ? config::utf8_prefix(f.system_prompt, _semantic_bytes) : std::string_view{};
      in.user = config::utf8_prefix(text, _semantic_bytes);
      in.hash = XXH3_64bits_withSeed(in.user.data(), in.user.size(), XXH3_64bits(in.system.data(), in.system.size()));
      in.later_turn = later_turn;
      const decision_cache::entry* hit = _embed_cache.find(in.hash);
      if (hit == nullptr) {
        d.pending = true;
        return d;
      }
      const uint32_t g = hit->row < c->groups.size() ? c->groups[hit->row] : k_none;
      if (g != k_none && key_allows(key_index, g)) {
        d.group = g;
        d.how = later_turn ? decision_how::sticky : decision_how::embeddings;
        d.confidence = hit->cosine > 0 ? hit->cosine : 0;
        d.cached = true;
        return d;
      }
    }
    d.label = _classifier->classify(_include_system ? f.system_prompt : std::string_view{}, text);
    if (d.label >= 0) {
      const auto p = _classifier->probabilities();
      d.confidence = p[static_cast<size_t>(d.label)];
      // A pick its topic backs (a term of its group's topic in the prompt)
      // stands at any probability; one on the examples alone needs
      // min_confidence (code's more: config::unbacked_confidence), and
      // else yields to the most probable pick a topic backs that the key
      // may reach, if any. A group without a topic: min_confidence, else
      // the rules (a has_images rule after the classifier, say).
      bool stands = _classifier->label_topic(d.label) != config::semantic_topic::none ||
                    static_cast<double>(d.confidence) >= _min_confidence;
      if (unbacked_under_floor(d.label, d.confidence)) {
        const int32_t backed = backed_pick(key_index);
        stands = backed >= 0;
        if (stands) {
          d.label = backed;
          d.confidence = p[static_cast<size_t>(backed)];
        }
      }
      const uint32_t g = label_group(d.label);
      if (stands && g != k_none && key_allows(key_index, g)) {
        d.group = g;
        d.how = later_turn ? decision_how::sticky : decision_how::classifier;
        return d;
      }
    }
  }
  for (uint32_t i = 0; i < _rules.size(); ++i) {
    if (semantic && _rules[i].before) continue;  // ran above
    if (key_allows(key_index, _rules[i].group) && rule_matches(i, f, text)) {
      d.group = _rules[i].group;
      d.how = by_text;
      return d;
    }
  }
  if (_default_group != k_none && key_allows(key_index, _default_group)) {
    d.group = _default_group;
    d.how = decision_how::default_group;
    return d;
  }
  d.group = k_none;
  d.how = decision_how::default_group;
  return d;
}

decision group_table::embedding_decision(const config::embedding_centroids& c, std::span<const float> vec,
                                         const embed_input& in, uint32_t key_index) noexcept {
  float cosine = 0;
  const int32_t row = config::nearest_centroid(c, vec, cosine);
  decision d;
  if (row < 0) return d;
  if (centroids() == &c) _embed_cache.put(in.hash, static_cast<uint32_t>(row), cosine);
  const uint32_t g = c.groups[static_cast<size_t>(row)];
  if (g >= _group_count || !key_allows(key_index, g)) return d;
  d.group = g;
  d.how = in.later_turn ? decision_how::sticky : decision_how::embeddings;
  d.confidence = cosine > 0 ? cosine : 0;  // the audit's confidence is in [0, 1]
  return d;
}

decision group_table::resolve_decision(const openai::request_fields& f, uint32_t key_index, bool sticky,
                                       bool embeddings) noexcept {
  if (is_auto(f.model)) return decide(f, key_index, sticky, embeddings);
  decision d;
  d.group = find(f.model);
  if (d.group != k_none && !key_allows(key_index, d.group)) d.group = k_none;
  return d;
}

bool group_table::unbacked_under_floor(int32_t label, float p) const noexcept {
  const semantic_classifier& c = *_classifier;
  const config::semantic_topic t = c.label_topic(label);
  if (t == config::semantic_topic::none || c.label_topic_hits(label) > 0) return false;
  return !(static_cast<double>(p) >= unbacked_floor(label));
}

double group_table::unbacked_floor(int32_t label) const noexcept {
  return std::max(_min_confidence, config::unbacked_confidence(_classifier->label_topic(label)));
}

int32_t group_table::backed_pick(uint32_t key_index) const noexcept {
  const semantic_classifier& c = *_classifier;
  const auto p = c.probabilities();
  int32_t best = -1;
  for (size_t l = 0; l < p.size(); ++l) {
    const auto label = static_cast<int32_t>(l);
    const uint32_t g = label_group(label);
    if (c.label_topic_hits(label) == 0 || g == k_none || !key_allows(key_index, g)) continue;
    if (best < 0 || p[l] > p[static_cast<size_t>(best)]) best = label;
  }
  return best;
}

std::string explain_route(const config::config& cfg, std::string_view prompt, bool one_line) {
  group_table t(cfg);
  openai::request_fields f;
  f.model = cfg.router.auto_model;
  f.last_user_message = prompt;
  f.first_user_message = prompt;
  f.input_bytes = prompt.size();
  f.message_count = 1;
  const decision d = t.decide(f, k_none, false);
  char num[32];
  auto put_p = [&](std::string& o, float p) {
    std::snprintf(num, sizeof num, "%.3f", static_cast<double>(p));
    o += num;
  };
  if (one_line) {
    std::string o = d.group == k_none ? std::string("-") : cfg.groups[d.group].name;
    o += '\t';
    o += to_string(d.how);
    o += '\t';
    if (d.confidence < 0) {
      o += '-';
    } else {
      put_p(o, d.confidence);
    }
    o += '\n';
    return o;
  }
  std::string out = "group: ";
  out += d.group == k_none ? std::string_view("(none: 404 model_not_found)") : std::string_view(cfg.groups[d.group].name);
  out += "\nhow: ";
  out += to_string(d.how);
  out += "\nconfidence: ";
  if (d.confidence < 0) {
    out += "-";
  } else {
    put_p(out, d.confidence);
  }
  out += '\n';
  if (cfg.router.semantic == config::semantic_mode::embeddings) {
    out += "note: semantic = \"embeddings\": the running gateway asks group \"";
    out += cfg.router.embeddings_group;
    out += "\" for the prompt's vector and picks the nearest centroid; shown here is its fallback, the classifier\n";
  }
  if (semantic_classifier* c = t.classifier()) {
    if (d.label < 0) c->classify({}, prompt);  // a before-rule decided: show the classifier anyway
    std::vector<std::pair<float, std::string_view>> ranked;
    const auto p = c->probabilities();
    for (size_t l = 0; l < p.size(); ++l) ranked.emplace_back(p[l], c->model().labels[l]);
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    out += "classifier (";
    out += c->model().origin;
    out += ", min_confidence ";
    put_p(out, static_cast<float>(cfg.router.min_confidence));
    out += "):";
    for (const auto& [prob, name] : ranked) {
      out += ' ';
      out += name;
      out += ' ';
      put_p(out, prob);
    }
    out += '\n';
    if (const config::semantic_model& m = c->model(); m.topics) {
      // What the groups' topics added (included in the probabilities above).
      char w[32];
      std::snprintf(w, sizeof w, "%.2f", static_cast<double>(m.topic_weight));
      out += "topics (topic_weight ";
      out += w;
      out += " a hit, at most ";
      out += std::to_string(config::k_topic_hits_max);
      out += " counted):";
      for (size_t l = 0; l < m.labels.size(); ++l) {
        if (m.label_topic[l] == config::semantic_topic::none) continue;
        out += ' ';
        out += m.labels[l];
        out += ' ';
        out += std::to_string(c->topic_hits()[static_cast<size_t>(m.label_topic[l]) - 1]);
      }
      out += '\n';
      // Why a pick on the examples alone did not stand (decide()): only
      // where the classifier decided, or left it to the rules and default.
      size_t top = 0;
      for (size_t l = 1; l < p.size(); ++l) top = p[l] > p[top] ? l : top;
      const auto tl = static_cast<int32_t>(top);
      const bool judged = d.label >= 0 && (d.how == decision_how::classifier || d.how == decision_how::default_group);
      if (judged && t.unbacked_under_floor(tl, p[top])) {
        out += "note: ";
        out += m.labels[top];
        out += ' ';
        put_p(out, p[top]);
        out += " has no term of its topic and is under ";
        put_p(out, static_cast<float>(t.unbacked_floor(tl)));
        const int32_t backed = t.backed_pick(k_none);
        if (backed >= 0) {
          out += ": the most probable group a topic backs takes it (";
          out += m.labels[static_cast<size_t>(backed)];
          out += ")\n";
        } else {
          out += ", and no group's topic matched: the rules, then default_group\n";
        }
      }
    }
  }
  return out;
}

std::string_view to_string(decision_how h) noexcept {
  switch (h) {
    case decision_how::rule: return "rule";
    case decision_how::classifier: return "classifier";
    case decision_how::default_group: return "default";
    case decision_how::sticky: return "sticky";
    case decision_how::embeddings: return "embeddings";
    case decision_how::name: return "name";
  }
  return "name";
}

uint32_t group_table::resolve(const openai::request_fields& f, uint32_t key_index) const noexcept {
  if (is_auto(f.model)) return choose(f, key_index);
  const uint32_t g = find(f.model);
  if (g == k_none || !key_allows(key_index, g)) return k_none;
  return g;
}

}  // namespace sluice::route
