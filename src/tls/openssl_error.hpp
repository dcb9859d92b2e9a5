#pragma once
// Private to src/tls: OpenSSL's error queue as text. Only the library and
// reason strings are taken (ERR_error_string_n), never the queue's "data"
// part, so nothing from a key file or the peer ends up in a message.
#include <openssl/err.h>

#include <cstddef>
#include <string>

namespace sluice::tls::detail {

// Returns: every queued reason joined by "; " (earliest first), and empties
// the queue; "unknown error" when it was empty. Cold path.
inline std::string drain_openssl_errors() {
  std::string out;
  char line[256];
  while (unsigned long e = ERR_get_error()) {
    ERR_error_string_n(e, line, sizeof line);
    if (!out.empty()) out += "; ";
    out += line;
  }
  if (out.empty()) out = "unknown error";
  return out;
}

}  // namespace sluice::tls::detail
