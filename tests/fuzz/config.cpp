// Fuzz target: the TOML config loader (config::load) on arbitrary text. It
// must return a config or throw config_error; any other exception, or a
// crash, is a finding. A loaded config is loaded again from the same text
// and must come out the same where it can be compared cheaply.
//
// Backend names are resolved at load with getaddrinfo. The fuzz machines
// have no network, and a DNS query that times out would turn the target into
// a test of the resolver, so this executable answers numeric hosts only
// (names fail at once, as an unresolvable one does).
#include <dlfcn.h>
#include <netdb.h>

#include <exception>
#include <string>
#include <typeinfo>

#include "fuzz_common.hpp"
#include "sluice/config/config.hpp"

extern "C" int getaddrinfo(const char* node, const char* service, const addrinfo* hints,
                           addrinfo** res) {
  using fn = int (*)(const char*, const char*, const addrinfo*, addrinfo**);
  static const fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "getaddrinfo"));
  SLUICE_FUZZ_CHECK(real != nullptr);
  addrinfo numeric{};
  if (hints != nullptr) numeric = *hints;
  numeric.ai_flags |= AI_NUMERICHOST;
  return real(node, service, &numeric, res);
}

namespace {

void same(const sluice::config::config& a, const sluice::config::config& b) {
  SLUICE_FUZZ_CHECK(a.groups.size() == b.groups.size());
  SLUICE_FUZZ_CHECK(a.keys.size() == b.keys.size());
  SLUICE_FUZZ_CHECK(a.rules.size() == b.rules.size());
  SLUICE_FUZZ_CHECK(a.backends.size() == b.backends.size());
  SLUICE_FUZZ_CHECK(a.server.listen.text == b.server.listen.text);
  SLUICE_FUZZ_CHECK(a.server.cpus == b.server.cpus);
  for (size_t i = 0; i < a.groups.size(); ++i) {
    SLUICE_FUZZ_CHECK(a.groups[i].name == b.groups[i].name);
    SLUICE_FUZZ_CHECK(a.groups[i].backends == b.groups[i].backends);
  }
}

void check(const sluice::config::config& c) {
  SLUICE_FUZZ_CHECK(c.source == "fuzz.toml");
  for (const auto& g : c.groups) {
    SLUICE_FUZZ_CHECK(g.backends.size() <= sluice::config::k_group_backends_max);
    for (uint32_t b : g.backends) SLUICE_FUZZ_CHECK(b < c.backends.size());
    SLUICE_FUZZ_CHECK(g.weights.empty() || g.weights.size() == g.backends.size());
  }
  for (const auto& r : c.rules) SLUICE_FUZZ_CHECK(r.group_index < c.groups.size());
  SLUICE_FUZZ_CHECK(c.router.default_group_index == UINT32_MAX ||
             c.router.default_group_index < c.groups.size());
  for (int cpu : c.server.cpus) SLUICE_FUZZ_CHECK(cpu >= 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string text(reinterpret_cast<const char*>(bytes), size);
  const sluice::config::flags no_flags{};
  try {
    auto cfg = sluice::config::load(text, "fuzz.toml", no_flags);
    SLUICE_FUZZ_CHECK(cfg != nullptr);
    if (std::getenv("SLUICE_FUZZ_VERBOSE") != nullptr) {
      std::fprintf(stderr, "loaded: %zu groups, %zu backends\n", cfg->groups.size(),
                   cfg->backends.size());
    }
    check(*cfg);
    auto again = sluice::config::load(text, "fuzz.toml", no_flags);
    same(*cfg, *again);
  } catch (const sluice::config::config_error& e) {
    if (std::getenv("SLUICE_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "%s\n", e.what());
    SLUICE_FUZZ_CHECK(e.what() != nullptr && e.what()[0] != '\0');
  } catch (const std::exception& e) {
    std::fprintf(stderr, "config::load threw %s (not config_error): %s\n", typeid(e).name(),
                 e.what());
    std::abort();
  }
  return 0;
}
