// The semantic router's model: normalisation, training, and copying the
// numbers out of fastText (see semantic.hpp, semantic_train.hpp). Cold path,
// except semantic_normalize() and utf8_prefix(), which run per request.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "sluice/config/config.hpp"
#include "sluice/config/semantic_train.hpp"
#include "values.hpp"

namespace sluice::config {

std::string_view utf8_prefix(std::string_view s, size_t max_bytes) noexcept {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  // Step back over continuation bytes to the lead byte of the cut sequence,
  // then drop that sequence (it does not fit whole).
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

namespace {

// Byte classes of semantic_normalize's ASCII path; a letter's class is its
// lower-case form, so a run of letters and digits is one table load a byte.
enum : uint8_t { k_space = 0, k_punct = 1, k_utf8 = 2 };  // else: the byte to write
constexpr std::array<uint8_t, 256> make_byte_classes() {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    if (c >= 0x80) {
      t[c] = k_utf8;
    } else if (c <= ' ' || c == 0x7F) {
      t[c] = k_space;
    } else if (c >= 'A' && c <= 'Z') {
      t[c] = static_cast<uint8_t>(c - 'A' + 'a');
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      t[c] = static_cast<uint8_t>(c);
    } else {
      t[c] = k_punct;
    }
  }
  return t;
}
constexpr std::array<uint8_t, 256> k_byte_class = make_byte_classes();

}  // namespace

size_t semantic_normalize(std::string_view in, char* out, size_t cap) noexcept {
  size_t n = 0;
  bool space = true;  // the last byte written was a space (or nothing yet)
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  while (i < in.size()) {
    const unsigned char c = p[i];
    const uint8_t k = k_byte_class[c];
    if (k > k_utf8) {
      // A run of letters and digits, lower-cased.
      if (n + 1 > cap) break;
      out[n++] = static_cast<char>(k);
      ++i;
      for (uint8_t k2; i < in.size() && n < cap && (k2 = k_byte_class[p[i]]) > k_utf8; ++i) out[n++] = static_cast<char>(k2);
      space = false;
      continue;
    }
    if (k == k_utf8) {
      // A whole UTF-8 sequence (lead byte + continuations), or nothing.
      size_t len = 1;
      while (i + len < in.size() && (p[i + len] & 0xC0) == 0x80 && len < 4) ++len;
      // CJK (U+2E80..U+9FFF: lead bytes E2 BA.. to E9, and FF punctuation
      // forms): a token per character. Chinese writes no spaces, so a
      // sentence would be one "word"; per character, the word bigrams are
      // character bigrams and every character is a vocabulary entry.
      const bool cjk = len == 3 && (c >= 0xE3 && c <= 0xE9);
      const bool fullwidth = len == 3 && c == 0xEF;  // U+FF00..: fullwidth punctuation and forms
      if (cjk || fullwidth) {
        const size_t need = (space ? 0 : 1) + len + 1;
        if (n + need > cap) break;
        if (!space) out[n++] = ' ';
        std::memcpy(out + n, in.data() + i, len);
        n += len;
        out[n++] = ' ';
        i += len;
        space = true;
        continue;
      }
      if (n + len > cap) break;
      std::memcpy(out + n, in.data() + i, len);
      n += len;
      i += len;
      space = false;
      continue;
    }
    ++i;
    if (k == k_space) {
      if (!space) {
        if (n + 1 > cap) break;
        out[n++] = ' ';
        space = true;
      }
      continue;
    }
    // Punctuation: a token of its own.
    const size_t need = (space ? 0 : 1) + 2;
    if (n + need > cap) break;
    if (!space) out[n++] = ' ';
    out[n++] = static_cast<char>(c);
    out[n++] = ' ';
    space = true;
  }
  while (n > 0 && out[n - 1] == ' ') --n;
  return n;
}

fasttext::Args semantic_training_args(const std::string& input_path) {
  fasttext::Args a;
  a.input = input_path;
  a.model = fasttext::model_name::sup;
  a.loss = fasttext::loss_name::softmax;
  a.dim = 16;
  a.epoch = 60;
  a.lr = 0.5;
  a.minCount = 1;
  a.minCountLabel = 0;
  a.wordNgrams = 2;
  a.minn = 3;
  a.maxn = 3;
  a.bucket = 20000;  // (words + bucket) x dim floats: ~1.5 MB per snapshot, mostly in cache
  a.thread = 1;
  a.seed = 20260101;
  a.verbose = 0;
  return a;
}

namespace {

// Removes the training file however training ends.
struct temp_file {
  std::string path;
  ~temp_file() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

}  // namespace

std::unique_ptr<fasttext::FastText> train_semantic_fasttext(const std::vector<std::string>& names,
                                                            const std::vector<std::vector<std::string>>& examples) {
  std::string text;
  std::vector<char> buf;
  size_t count = 0;
  for (size_t g = 0; g < examples.size(); ++g) {
    for (const std::string& e : examples[g]) {
      buf.resize(e.size() * 3 + 4);
      const size_t n = semantic_normalize(e, buf.data(), buf.size());
      if (n == 0) continue;
      text += "__label__";
      text += names[g];
      text += ' ';
      text.append(buf.data(), n);
      text += '\n';
      ++count;
    }
  }
  if (count == 0) throw config_error("router: semantic = \"classifier\" has no examples to train on");
  const char* dir = std::getenv("TMPDIR");
  std::string pattern = fmt::format("{}/sluice-router-XXXXXX", dir != nullptr && *dir != '\0' ? dir : "/tmp");
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) {
    throw config_error(fmt::format("router: cannot create the classifier's training file in {} ({}); set TMPDIR",
                                   pattern.substr(0, pattern.rfind('/')), std::strerror(errno)));
  }
  temp_file file{pattern};
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      throw config_error(fmt::format("router: writing the training file {} failed ({})", pattern, std::strerror(errno)));
    }
    off += static_cast<size_t>(w);
  }
  ::close(fd);
  auto ft = std::make_unique<fasttext::FastText>();
  try {
    ft->train(semantic_training_args(file.path));
  } catch (const std::exception& e) {
    throw config_error(fmt::format("router: training the classifier failed: {}", e.what()));
  }
  return ft;
}

std::shared_ptr<semantic_model> semantic_model_from(const fasttext::FastText& ft, const std::vector<std::string>& names,
                                                    const std::string& where) {
  if (ft.isQuant()) throw config_error(fmt::format("{}: a quantized fastText model; allowed: a full (.bin) model", where));
  const fasttext::Args args = ft.getArgs();
  if (args.model != fasttext::model_name::sup || args.loss != fasttext::loss_name::softmax) {
    throw config_error(fmt::format("{}: not a supervised fastText model with softmax loss; allowed: one trained "
                                   "with `fasttext supervised -loss softmax`", where));
  }
  auto m = std::make_shared<semantic_model>();
  auto dict = ft.getDictionary();
  auto in = ft.getInputMatrix();
  auto out = ft.getOutputMatrix();
  m->dim = args.dim;
  m->minn = args.minn;
  m->maxn = args.maxn;
  m->word_ngrams = args.wordNgrams;
  m->bucket = args.bucket;
  m->nwords = dict->nwords();
  m->nlabels = dict->nlabels();
  if (in->cols() != m->dim || in->rows() != int64_t{m->nwords} + m->bucket || out->rows() != m->nlabels ||
      out->cols() != m->dim) {
    throw config_error(fmt::format("{}: the model's matrices do not match its dictionary (pruned?)", where));
  }
  m->input.assign(in->data(), in->data() + in->rows() * in->cols());
  m->output.assign(out->data(), out->data() + out->rows() * out->cols());
  for (int32_t l = 0; l < m->nlabels; ++l) {
    const std::string label = dict->getLabel(l);
    const std::string_view name = std::string_view(label).substr(label.rfind("__label__", 0) == 0 ? 9 : 0);
    size_t g = 0;
    while (g < names.size() && names[g] != name) ++g;
    if (g == names.size()) {
      throw config_error(fmt::format("{}: the model's label \"{}\" is not the name of a [[group]]", where, label));
    }
    m->labels.emplace_back(name);
  }
  size_t slots = 16;
  while (slots < size_t{2} * static_cast<size_t>(m->nwords)) slots *= 2;
  m->slots.assign(slots, -1);
  m->word_offset.push_back(0);
  for (int32_t w = 0; w < m->nwords; ++w) {
    const std::string word = dict->getWord(w);
    const uint32_t h = fasttext_hash(word);
    m->word_hash.push_back(h);
    m->word_bytes += word;
    m->word_offset.push_back(static_cast<uint32_t>(m->word_bytes.size()));
    size_t s = h & (slots - 1);
    while (m->slots[s] != -1) s = (s + 1) & (slots - 1);
    m->slots[s] = w;
  }
  return m;
}

std::string relative_to(std::string_view source, const std::string& path) {
  if (path.empty() || path[0] == '/' || source.empty() || source.front() == '<') return path;
  const size_t slash = source.rfind('/');
  return slash == std::string_view::npos ? path : std::string(source.substr(0, slash + 1)) + path;
}

std::vector<std::string> read_examples_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw config_error(fmt::format("cannot read {} ({})", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode) || st.st_size > (16 << 20)) {
    throw config_error(fmt::format("{} is not a regular file of at most 16 MiB", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(fmt::format("cannot read {} ({})", path, std::strerror(errno)));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    out.push_back(line.substr(start));
  }
  if (in.bad()) throw config_error(fmt::format("read error in {} ({})", path, std::strerror(errno)));
  if (out.empty()) throw config_error(fmt::format("{} holds no examples (one prompt per line)", path));
  return out;
}

namespace {

// Each label's group's topic, and the vocabulary built (cold) when a group names one.
std::shared_ptr<semantic_model> with_topics(std::shared_ptr<semantic_model> m, const config& cfg) {
  m->label_topic.assign(m->labels.size(), semantic_topic::none);
  for (size_t l = 0; l < m->labels.size(); ++l) {
    for (const group_config& g : cfg.groups) {
      if (g.name == m->labels[l]) m->label_topic[l] = g.topic;
    }
    m->topics |= m->label_topic[l] != semantic_topic::none;
  }
  m->topic_weight = static_cast<float>(cfg.router.topic_weight);
  for (size_t h = 0; h < m->topic_odds.size(); ++h) m->topic_odds[h] = std::exp(cfg.router.topic_weight * static_cast<double>(h));
  if (m->topics) static_cast<void>(topic_vocabulary::builtin());
  return m;
}

}  // namespace

std::shared_ptr<const semantic_model> build_semantic_model(const config& cfg, const std::string& where) {
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> examples;
  size_t with_examples = 0;
  for (const group_config& g : cfg.groups) {
    names.push_back(g.name);
    examples.push_back(g.examples);
    if (!g.examples.empty()) ++with_examples;
  }
  if (!cfg.router.model_file.empty()) {
    fasttext::FastText ft;
    try {
      ft.loadModel(cfg.router.model_file);
    } catch (const std::exception& e) {
      throw config_error(fmt::format("{}: router.model_file \"{}\" is not a fastText model ({})", where,
                                     cfg.router.model_file, e.what()));
    }
    auto m = semantic_model_from(ft, names, fmt::format("{}: router.model_file \"{}\"", where, cfg.router.model_file));
    m->origin = cfg.router.model_file;
    return with_topics(std::move(m), cfg);
  }
  if (with_examples < 2) {
    throw config_error(fmt::format("{}: router.semantic = \"{}\" needs examples in at least two [[group]]s "
                                   "(examples = [...] or examples_file = \"FILE\"), or router.model_file; {} has them",
                                   where, cfg.router.semantic == semantic_mode::embeddings ? "embeddings" : "classifier",
                                   with_examples));
  }
  for (const std::string& n : names) {
    if (n.find_first_of(" \t") != std::string::npos) {
      throw config_error(fmt::format("{}: group name \"{}\" holds a space; the classifier's labels cannot", where, n));
    }
  }
  size_t total = 0;
  for (const auto& e : examples) total += e.size();
  if (cfg.router.classifier == classifier_method::examples) {
    // The labels are the groups with examples, in the groups' order (as
    // fastText's are).
    auto m = std::make_shared<semantic_model>();
    m->method = classifier_method::examples;
    std::vector<std::vector<std::string>> by_label;
    for (size_t g = 0; g < names.size(); ++g) {
      if (examples[g].empty()) continue;
      m->labels.push_back(names[g]);
      by_label.push_back(std::move(examples[g]));
    }
    m->examples = build_example_model(by_label);
    m->nlabels = static_cast<int32_t>(m->labels.size());
    if (m->examples.nexamples == 0) {
      throw config_error(fmt::format("{}: router.semantic = \"classifier\": no example holds a word", where));
    }
    m->origin = fmt::format("naive Bayes and nearest examples over {} examples of {} groups", total, with_examples);
    return with_topics(std::move(m), cfg);
  }
  auto ft = train_semantic_fasttext(names, examples);
  auto m = semantic_model_from(*ft, names, where);
  m->origin = fmt::format("trained on {} examples of {} groups", total, with_examples);
  return with_topics(std::move(m), cfg);
}

}  // namespace sluice::config
