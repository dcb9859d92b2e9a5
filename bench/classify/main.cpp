// bench-classify: what one semantic_classifier::classify costs, with the
// groups' built-in topics ([[group]] topic) and without -- the classifier
// built from a router config (default: tests/data/router-heldout's), timed
// in a loop on three inputs:
//   - a 202-byte English prompt with a 28-byte system prompt;
//   - the 160 held-out prompts (mostly short), in turn;
//   - a 2,000-byte code paste (the most semantic_bytes reads by default).
//
//   build/bench-classify [--config FILE] [--prompts TSV] [--rounds N]
//
// Prints µs per classify for each input, topics off then on (the config's
// `topic` lines dropped for "off"), best of three repetitions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/config/config.hpp"
#include "sluice/route/semantic.hpp"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench-classify: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The config's text without its lines that start with `topic` (and `topic_weight`).
std::string without_topics(const std::string& toml) {
  std::string out;
  std::istringstream in(toml);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("topic", 0) == 0) continue;
    out += line + "\n";
  }
  return out;
}

std::string code_paste(size_t bytes) {
  const std::string lines[] = {
      "#include <vector>\n", "template <class T> struct ring { std::vector<T> items; size_t head = 0; };\n",
      "int sum(const std::vector<int>& v) { int s = 0; for (int x : v) s += x; return s; }\n",
      "  if (fd < 0) { perror(\"open\"); return -1; }  // why does this segfault?\n",
      "auto it = std::find_if(v.begin(), v.end(), [&](const auto& e) { return e.id == key; });\n",
      "static_assert(sizeof(header) == 16, \"packed\");\n"};
  std::string s;
  for (size_t i = 0; s.size() < bytes; ++i) s += lines[i % std::size(lines)];
  s.resize(bytes);
  return s;
}

double time_us(sluice::route::semantic_classifier& c, const std::vector<std::pair<std::string, std::string>>& inputs,
               size_t rounds) {
  double best = 1e300;
  int64_t sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < rounds; ++r) {
      for (const auto& [system, user] : inputs) sink += c.classify(system, user);
    }
    const std::chrono::duration<double, std::micro> d = std::chrono::steady_clock::now() - t0;
    best = std::min(best, d.count() / static_cast<double>(rounds * inputs.size()));
  }
  if (sink == -1) std::puts("");  // keeps the calls
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config = "tests/data/router-heldout/router.toml";
  std::string prompts = "tests/data/router-heldout/heldout.tsv";
  size_t rounds = 20000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config = argv[++i];
    } else if (std::strcmp(argv[i], "--prompts") == 0 && i + 1 < argc) {
      prompts = argv[++i];
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--config FILE] [--prompts TSV] [--rounds N]\n", argv[0]);
      return 2;
    }
  }
  const std::string toml = read_file(config);
  std::vector<std::pair<std::string, std::string>> heldout;
  std::istringstream in(read_file(prompts));
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    if (line.empty() || line[0] == '#' || tab == std::string::npos) continue;
    heldout.emplace_back("", line.substr(tab + 1));
  }
  const std::vector<std::pair<std::string, std::string>> english = {
      {"You are a helpful assistant.",
       "I have a list of customer orders with dates and totals, and I would like to know how to find the average "
       "order value per month and which month had the biggest jump compared to the one before it, thanks!"}};
  const std::vector<std::pair<std::string, std::string>> paste = {{"", code_paste(2000)}};
  std::printf("%-34s %12s %12s\n", "input (us per classify)", "topics off", "topics on");
  sluice::config::flags f;
  const auto off = sluice::config::load(without_topics(toml), config, f);
  const auto on = sluice::config::load(toml, config, f);
  sluice::route::semantic_classifier c_off(off->router.model, off->router.semantic_bytes);
  sluice::route::semantic_classifier c_on(on->router.model, on->router.semantic_bytes);
  if (!on->router.model->topics) std::fprintf(stderr, "bench-classify: no group of %s names a topic\n", config.c_str());
  const struct {
    const char* name;
    const std::vector<std::pair<std::string, std::string>>* inputs;
    size_t rounds;
  } rows[] = {{"202-byte prompt + system prompt", &english, rounds * 10},
              {"held-out prompts (160, in turn)", &heldout, std::max<size_t>(rounds / 10, 1)},
              {"2,000-byte code paste", &paste, rounds}};
  for (const auto& r : rows) {
    if (r.inputs->empty()) continue;
    const double a = time_us(c_off, *r.inputs, r.rounds);
    const double b = time_us(c_on, *r.inputs, r.rounds);
    std::printf("%-34s %12.2f %12.2f\n", r.name, a, b);
  }
  return 0;
}
