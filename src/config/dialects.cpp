// The group's dialects (docs/architecture.md §6b): which client dialects its backends
// speak natively, so those pass through and the others are translated.
#include "reader.hpp"

namespace sluice::config::detail {

// After `protocol`: its default, or the dialects given (each one the
// protocol can speak: an Anthropic backend speaks messages only, Triton none).
void read_native_dialects(const reader& r, const toml::table& t, group_config& g) {
  const bool anthropic = g.protocol == backend_protocol::anthropic;
  g.native_dialects = g.protocol == backend_protocol::openai ? native::chat : anthropic ? native::messages : 0;
  if (!t.contains("native_dialects")) return;
  g.native_dialects = 0;
  for (const toml::node* n : r.read_strings(t, "group", "native_dialects")) {
    const std::string& d = n->as_string()->get();
    const uint8_t bit = d == "chat" ? native::chat : d == "responses" ? native::responses : d == "messages" ? native::messages : 0;
    if (bit == 0) r.fail(*n, fmt::format("group.native_dialects \"{}\" is not a dialect; allowed: chat, responses, messages", d));
    if (g.protocol == backend_protocol::triton || (anthropic && bit != native::messages)) {
      r.fail(*n, fmt::format("group.native_dialects: a protocol = \"{}\" backend does not speak \"{}\"", to_string(g.protocol), d));
    }
    g.native_dialects |= bit;
  }
}

}  // namespace sluice::config::detail
