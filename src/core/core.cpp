#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "sluice/core/assert.hpp"
#include "sluice/core/clock.hpp"
#include "sluice/core/log.hpp"
#include "sluice/core/result.hpp"

namespace sluice {

namespace detail {
void verify_failed(const char* expr, const char* file, int line) noexcept {
  std::fprintf(stderr, "sluice: assertion failed: %s (%s:%d)\n", expr, file, line);
  std::abort();
}
}  // namespace detail

std::string_view to_string(errc e) noexcept {
  switch (e) {
    case errc::ok: return "ok";
    case errc::need_more: return "need_more";
    case errc::bad_request: return "bad_request";
    case errc::header_too_large: return "header_too_large";
    case errc::uri_too_long: return "uri_too_long";
    case errc::body_too_large: return "body_too_large";
    case errc::timeout: return "timeout";
    case errc::not_found: return "not_found";
    case errc::method_not_allowed: return "method_not_allowed";
    case errc::version_not_supported: return "version_not_supported";
    case errc::unauthorized: return "unauthorized";
    case errc::upstream_connect: return "upstream_connect";
    case errc::upstream_protocol: return "upstream_protocol";
    case errc::upstream_closed: return "upstream_closed";
    case errc::upstream_timeout: return "upstream_timeout";
    case errc::no_backend: return "no_backend";
    case errc::overloaded: return "overloaded";
    case errc::internal: return "internal";
  }
  return "unknown";
}

namespace log {
namespace {
std::atomic<int> g_level{static_cast<int>(level::info)};
constexpr std::string_view k_names[] = {"debug", "info", "warn", "error"};
}  // namespace

void set_level(level l) noexcept { g_level.store(static_cast<int>(l), std::memory_order_relaxed); }
bool enabled(level l) noexcept { return static_cast<int>(l) >= g_level.load(std::memory_order_relaxed); }

void write_line(level l, std::string_view msg) noexcept {
  char buf[1200];
  uint64_t ms = realtime_ms();
  auto r = fmt::format_to_n(buf, sizeof buf - 1, "{}.{:03} sluice {}: {}", ms / 1000, ms % 1000,
                            k_names[static_cast<int>(l)], msg);
  size_t n = r.size < sizeof buf - 1 ? r.size : sizeof buf - 1;
  buf[n++] = '\n';
  ssize_t w = ::write(STDERR_FILENO, buf, n);
  (void)w;
}
}  // namespace log

}  // namespace sluice
