// Fair admission (docs/architecture.md §2c, §6b): a group's admission mode, its slots
// per backend and its queue's bounds; a key's weight and priority.
#include "reader.hpp"

namespace sluice::config::detail {

void read_group_admission(const reader& r, const toml::table& t, group_config& g) {
  std::string mode;
  if (const toml::node* n = r.read_string(t, "group", "admission", mode)) {
    if (mode == "fcfs") g.admission = admission_mode::fcfs;
    else if (mode == "fair") g.admission = admission_mode::fair;
    else r.fail(*n, fmt::format("group.admission \"{}\" is not a mode; allowed: fcfs, fair", mode));
  }
  r.read_uint(t, "group", "max_inflight_per_backend", g.max_inflight_per_backend, 0, 100'000,
              " (slots per backend; 0 = unlimited)");
  r.read_uint(t, "group", "queue_timeout_ms", g.queue_timeout_ms, 1, 3'600'000, " (ms)");
  r.read_uint(t, "group", "queue_max", g.queue_max, 1, 1'000'000, " (queued requests)");
  if (g.admission == admission_mode::fair && g.max_inflight_per_backend == 0) {
    r.fail(t, fmt::format("group \"{}\": admission = \"fair\" needs max_inflight_per_backend, the requests one backend "
                          "runs at once (a vLLM's max_num_seqs, or less), e.g. max_inflight_per_backend = 64",
                          g.name));
  }
}

void read_key_admission(const reader& r, const toml::table& t, key_config& k) {
  double w = k.weight;
  if (const toml::node* n = r.read_number(t, "key", "weight", w, 0, 1000, " (a share; 1 is usual)")) {
    if (!(w > 0)) r.fail(*n, "key.weight must be more than 0 (a share of a saturated group; 1 is usual)");
    k.weight = w;
  }
  r.read_uint(t, "key", "priority", k.priority, 0, 7, " (higher goes first)");
}

}  // namespace sluice::config::detail
