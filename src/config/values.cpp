// Parsers for the small value types a config holds: socket addresses, CPU
// lists, key digests, Redis and backend URLs (and a backend's resolution).
// Cold path; errors are config_error with a message that the caller
// prefixes with "FILE:LINE: " or "--flag: ".
#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "values.hpp"

#include "sluice/core/text.hpp"

namespace sluice::config {

namespace {

// Parses a decimal port; "0" is allowed (the kernel picks an ephemeral port,
// which tests use to avoid collisions).
bool parse_port(std::string_view text, uint16_t& port) {
  if (text.empty() || text.size() > 5) return false;
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value > 65535) return false;
  port = static_cast<uint16_t>(value);
  return true;
}

}  // namespace

uint16_t socket_address::port() const {
  if (storage.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
  if (storage.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

socket_address parse_socket_address(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return config_error(fmt::format(
        "bad address \"{}\": {}; allowed: IPv4 \"127.0.0.1:8080\" or IPv6 \"[::1]:8080\" (port 0-65535)",
        text, why));
  };
  socket_address out;
  out.text = std::string(text);
  std::string host;
  std::string_view port_text;
  bool v6 = false;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) throw bad("missing ']'");
    if (close + 1 >= text.size() || text[close + 1] != ':') throw bad("missing \":port\" after ']'");
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
    v6 = true;
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) throw bad("missing \":port\"");
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) throw bad("an IPv6 address needs brackets");
  }
  uint16_t port = 0;
  if (!parse_port(port_text, port)) throw bad("the port is not a number in 0-65535");
  if (v6) {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&out.storage);
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons(port);
    if (inet_pton(AF_INET6, host.c_str(), &sa->sin6_addr) != 1) throw bad("not an IPv6 address");
    out.length = sizeof(sockaddr_in6);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in*>(&out.storage);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    // inet_pton (unlike inet_aton) accepts only the dotted-quad form, so
    // "127.1" or "0x7f.1" are refused instead of silently meaning something.
    if (inet_pton(AF_INET, host.c_str(), &sa->sin_addr) != 1) throw bad("not an IPv4 address");
    out.length = sizeof(sockaddr_in);
  }
  return out;
}

redis_url parse_redis_url(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return config_error(fmt::format("bad Redis URL \"{}\": {}; allowed: \"redis://host:port\" (e.g. "
                                    "\"redis://127.0.0.1:6379\", \"redis://[::1]:6379\")",
                                    text, why));
  };
  constexpr std::string_view scheme = "redis://";
  if (text.substr(0, 9) == "rediss://") throw bad("TLS to Redis (rediss://) is not supported");
  if (text.substr(0, scheme.size()) != scheme) {
    const size_t colon = text.find("://");
    if (colon == std::string_view::npos) throw bad("no scheme: it starts with redis://");
    throw bad(fmt::format("the scheme is \"{}\", not redis", text.substr(0, colon)));
  }
  std::string_view rest = text.substr(scheme.size());
  if (rest.find('@') != std::string_view::npos) {
    throw bad("credentials in the URL; put the password in an environment variable named by cluster.password_env");
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 < rest.size()) throw bad("a database number or path is not supported (sluice uses database 0)");
    rest = rest.substr(0, slash);
  }
  redis_url out;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) throw bad("missing ']' after an IPv6 address");
    out.host = std::string(rest.substr(1, close - 1));
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw bad("expected \":port\" after ']'");
      port_text = rest.substr(close + 2);
      if (port_text.empty()) throw bad("empty port");
    }
  } else {
    const size_t colon = rest.find(':');
    out.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) {
      if (rest.find(':', colon + 1) != std::string_view::npos) throw bad("an IPv6 address needs brackets");
      port_text = rest.substr(colon + 1);
      if (port_text.empty()) throw bad("empty port");
    }
  }
  if (out.host.empty()) throw bad("no host");
  if (!port_text.empty() && (!parse_port(port_text, out.port) || out.port == 0)) {
    throw bad("the port is not a number in 1-65535");
  }
  return out;
}

std::vector<int> parse_cpu_list(std::string_view text) {
  // Same syntax as the kernel's cpulist files (/sys/.../cpulist, taskset -c):
  // comma-separated numbers and inclusive ranges. Surrounding whitespace is
  // tolerated because sysfs files end with a newline.
  const auto bad = [&](std::string_view why) {
    return config_error(fmt::format(
        "bad cpu list \"{}\": {}; allowed: \"\" (the affinity mask) or numbers and ranges like \"0-3,8\" (cpus 0-{})",
        text, why, CPU_SETSIZE - 1));
  };
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  std::vector<int> cpus;
  if (text.empty()) return cpus;

  const auto parse_number = [&](std::string_view part) {
    int value = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || value < 0) {
      throw bad(fmt::format("\"{}\" is not a cpu number", part));
    }
    // cpu_set_t holds CPU_SETSIZE cpus; pinning beyond it would need
    // CPU_ALLOC everywhere for machines sluice does not target.
    if (value >= CPU_SETSIZE) throw bad(fmt::format("cpu {} is out of range", value));
    return value;
  };

  size_t pos = 0;
  while (true) {
    size_t comma = text.find(',', pos);
    std::string_view part = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    if (part.empty()) throw bad("empty element");
    size_t dash = part.find('-');
    if (dash == std::string_view::npos) {
      cpus.push_back(parse_number(part));
    } else {
      int first = parse_number(part.substr(0, dash));
      int last = parse_number(part.substr(dash + 1));
      if (last < first) throw bad(fmt::format("range \"{}\" runs backwards", part));
      for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  if (std::adjacent_find(cpus.begin(), cpus.end()) != cpus.end()) throw bad("a cpu is listed twice");
  return cpus;
}

std::array<uint8_t, 32> sha256(std::string_view key) {
  std::array<uint8_t, 32> digest{};
  unsigned int length = 0;
  // EVP_Digest is OpenSSL 3's one-shot interface (SHA256() is deprecated).
  if (EVP_Digest(key.data(), key.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1 ||
      length != digest.size()) {
    throw config_error("sha256: OpenSSL EVP_Digest failed");
  }
  return digest;
}

parsed_url parse_backend_url(std::string_view url) {
  const auto bad = [&](std::string_view why) {
    return config_error(fmt::format(
        "backend URL \"{}\": {}; allowed: http://HOST:PORT or grpc://HOST:PORT (optionally ending in /)", url, why));
  };
  constexpr std::string_view k_http = "http://";
  constexpr std::string_view k_grpc = "grpc://";
  if (url.starts_with("https://") || url.starts_with("grpcs://")) {
    throw config_error(fmt::format(
        "backend URL \"{}\": TLS to backends is not supported yet; use http:// or grpc:// (TLS to backends is planned)", url));
  }
  parsed_url out;
  std::string_view rest;
  if (url.starts_with(k_http)) {
    rest = url.substr(k_http.size());
  } else if (url.starts_with(k_grpc)) {
    out.transport = backend_transport::grpc;
    rest = url.substr(k_grpc.size());
  } else {
    throw bad("the scheme must be http:// or grpc://");
  }
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos || rest.find('?') != std::string_view::npos ||
      rest.find('#') != std::string_view::npos) {
    throw bad("a backend URL has no path; sluice forwards the client's path (/v1/...)");
  }
  if (rest.find('@') != std::string_view::npos) throw bad("credentials in the URL are not supported");
  std::string_view port;
  if (rest.starts_with('[')) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      throw bad("an IPv6 host is written [addr]:port");
    }
    out.host = std::string(rest.substr(1, close - 1));
    port = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) throw bad("the port is missing");
    out.host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
    bool host_ok = !out.host.empty() && std::all_of(out.host.begin(), out.host.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
    });
    if (!host_ok) throw bad(fmt::format("\"{}\" is not a host name or IPv4 address", out.host));
  }
  if (out.host.empty()) throw bad("the host is empty");
  unsigned port_value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), port_value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || port_value == 0 || port_value > 65535) {
    throw bad("the port must be a number in 1-65535");
  }
  out.port = std::to_string(port_value);
  std::string host_lower = out.host;
  std::transform(host_lower.begin(), host_lower.end(), host_lower.begin(),
                 [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; });
  out.host_header = rest.starts_with('[') ? fmt::format("[{}]:{}", host_lower, out.port)
                                          : fmt::format("{}:{}", host_lower, out.port);
  out.normalized = fmt::format("{}{}", out.transport == backend_transport::grpc ? k_grpc : k_http, out.host_header);
  return out;
}

socket_address resolve(const parsed_url& u) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw config_error(fmt::format("backend host \"{}\" does not resolve ({}); allowed: an IP address or a name this machine resolves",
                                   u.host, gai_strerror(rc)));
  }
  socket_address out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  freeaddrinfo(found);
  char ip[INET6_ADDRSTRLEN] = {};
  if (out.family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&out.storage)->sin6_addr, ip, sizeof ip);
    out.text = fmt::format("[{}]:{}", ip, out.port());
  } else {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&out.storage)->sin_addr, ip, sizeof ip);
    out.text = fmt::format("{}:{}", ip, out.port());
  }
  return out;
}

bool parse_hex_digest(std::string_view hex, std::array<uint8_t, 32>& out) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// Edit distance for "did you mean" hints; names are short, so O(n*m) is fine.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// '*' matches any run of characters, '?' one character; used for key groups.
bool glob_match(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// Ids and group names appear in metrics labels and audit records: keep them
// to characters that need no escaping anywhere.
bool is_plain_name(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.' || c == ':' || c == '@' || c == '/';
  });
}

}  // namespace sluice::config
