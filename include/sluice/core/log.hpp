#pragma once
// Logging for the cold path (start-up, config, shard lifecycle, anomalies).
// One line per call, written with a single write(2) to stderr so lines from
// several shards never interleave. Never log secrets: API keys, bodies.
#include <fmt/format.h>

#include <string_view>

namespace sluice::log {

enum class level : int { debug = 0, info = 1, warn = 2, error = 3 };

void set_level(level l) noexcept;
bool enabled(level l) noexcept;
void write_line(level l, std::string_view msg) noexcept;

template <class... Args>
void emit(level l, fmt::format_string<Args...> f, Args&&... args) noexcept {
  if (!enabled(l)) return;
  char buf[1024];
  auto r = fmt::format_to_n(buf, sizeof buf, f, std::forward<Args>(args)...);
  size_t n = r.size < sizeof buf ? r.size : sizeof buf;
  write_line(l, std::string_view(buf, n));
}

template <class... Args> void debug(fmt::format_string<Args...> f, Args&&... a) noexcept { emit(level::debug, f, std::forward<Args>(a)...); }
template <class... Args> void info(fmt::format_string<Args...> f, Args&&... a) noexcept { emit(level::info, f, std::forward<Args>(a)...); }
template <class... Args> void warn(fmt::format_string<Args...> f, Args&&... a) noexcept { emit(level::warn, f, std::forward<Args>(a)...); }
template <class... Args> void error(fmt::format_string<Args...> f, Args&&... a) noexcept { emit(level::error, f, std::forward<Args>(a)...); }

}  // namespace sluice::log
