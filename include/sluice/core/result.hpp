#pragma once
// Operating errors are values: result<T> holds a T or an errc, in the spirit
// of simdjson_result. No exceptions on the data plane.
#include <cstdint>
#include <string_view>
#include <utility>

#include "sluice/core/assert.hpp"

namespace sluice {

enum class errc : uint16_t {
  ok = 0,
  need_more,          // parser: incomplete input, call again with more bytes
  // downstream (client) side
  bad_request,        // 400: malformed framing or body
  header_too_large,   // 431
  uri_too_long,       // 414
  body_too_large,     // 413
  timeout,            // 408 on the downstream side, 504 upstream
  not_found,          // 404
  method_not_allowed, // 405
  version_not_supported,  // 505
  unauthorized,       // 401
  // upstream (backend) side
  upstream_connect,   // connect refused / reset: safe to retry elsewhere
  upstream_protocol,  // malformed backend reply: 502
  upstream_closed,    // backend closed mid-response
  upstream_timeout,   // 504
  no_backend,         // 503
  // internal
  overloaded,         // 503 + retry-after: a per-shard cap or pool ran out
  internal,
};

std::string_view to_string(errc e) noexcept;

template <class T>
class [[nodiscard]] result {
 public:
  result(T value) noexcept(noexcept(T(std::move(value))))  // NOLINT: implicit by design
      : _value(std::move(value)), _error(errc::ok) {}
  result(errc e) noexcept : _value(), _error(e) { SLUICE_ASSERT(e != errc::ok); }  // NOLINT

  bool ok() const noexcept { return _error == errc::ok; }
  explicit operator bool() const noexcept { return ok(); }
  errc error() const noexcept { return _error; }

  T& value() & noexcept { SLUICE_ASSERT(ok()); return _value; }
  const T& value() const& noexcept { SLUICE_ASSERT(ok()); return _value; }
  T&& value() && noexcept { SLUICE_ASSERT(ok()); return std::move(_value); }
  T* operator->() noexcept { return &value(); }
  const T* operator->() const noexcept { return &value(); }
  T& operator*() & noexcept { return value(); }

 private:
  T _value;
  errc _error;
};

}  // namespace sluice
