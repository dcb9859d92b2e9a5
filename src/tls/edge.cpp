// The edge helpers of tls.hpp: first-bytes sniffing for the two ports, and
// the kTLS checks.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sluice/tls/tls.hpp"

namespace sluice::tls {

const std::string_view k_plain_http_on_tls_port_response =
    "HTTP/1.1 400 Bad Request\r\n"
    "content-type: application/json\r\n"
    "content-length: 163\r\n"
    "connection: close\r\n"
    "\r\n"
    "{\"error\":{\"message\":\"The plain HTTP request was sent to an HTTPS port: use https://.\","
    "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"plain_http_on_tls_port\"}}";

// TLS 1.0 record version (what ClientHellos carry), alert, length 2,
// level fatal (2), handshake_failure (40).
static constexpr char k_alert_bytes[] = {0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28};
const std::string_view k_tls_on_plain_port_alert(k_alert_bytes, sizeof k_alert_bytes);

sniff looks_like_tls_client_hello(std::span<const char> bytes) noexcept {
  // Record header: type 22 (handshake), version major 3, minor 0 (SSL 3.0,
  // still sent by some stacks in the record layer) to 4.
  if (bytes.empty()) return sniff::need_more;
  if (static_cast<unsigned char>(bytes[0]) != 0x16) return sniff::no;
  if (bytes.size() < 2) return sniff::need_more;
  if (static_cast<unsigned char>(bytes[1]) != 0x03) return sniff::no;
  if (bytes.size() < 3) return sniff::need_more;
  return static_cast<unsigned char>(bytes[2]) <= 0x04 ? sniff::yes : sniff::no;
}

sniff looks_like_plain_http(std::span<const char> bytes) noexcept {
  constexpr size_t k_method_max = 16;
  size_t i = 0;
  for (; i < bytes.size() && i <= k_method_max; ++i) {
    char c = bytes[i];
    if (c == ' ') return i > 0 ? sniff::yes : sniff::no;
    if (c < 'A' || c > 'Z') return sniff::no;
  }
  return i > k_method_max ? sniff::no : sniff::need_more;
}

namespace {

struct fd_closer {
  int fd = -1;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

void say(std::string* why, const char* what, int err) {
  if (why == nullptr) return;
  *why = what;
  if (err != 0) {
    *why += ": ";
    *why += std::strerror(err);
  }
}

}  // namespace

bool ktls_available(std::string* why) {
  if (::access("/proc/net/tls_stat", F_OK) == 0) return true;
  // Not loaded (yet). The kernel loads the module on the first TCP_ULP
  // "tls" where it may (CONFIG_TLS=m, module autoloading allowed); that
  // needs an established TCP connection, so make one on loopback.
  fd_closer listener{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (listener.fd < 0) return say(why, "socket", errno), false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listener.fd, 1) != 0 ||
      ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return say(why, "loopback listener", errno), false;
  fd_closer client{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (client.fd < 0 || ::connect(client.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return say(why, "loopback connect", errno), false;
  fd_closer server{::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC)};
  if (server.fd < 0) return say(why, "loopback accept", errno), false;
  if (::setsockopt(client.fd, IPPROTO_TCP, TCP_ULP, "tls", 3) != 0) {
    // ENOENT: no tls module (not built, or not loadable from here).
    return say(why, "setsockopt TCP_ULP \"tls\" (no kernel tls module? see /proc/net/tls_stat)", errno), false;
  }
  return true;
}

ktls_support ktls_fit(const session& s) noexcept {
  ktls_support out;
  SSL* ssl = s.native_handle();
  if (ssl == nullptr || !s.handshake_done()) return out;
  const SSL_CIPHER* c = SSL_get_current_cipher(ssl);
  if (c == nullptr) return out;
  int nid = SSL_CIPHER_get_cipher_nid(c);
  if (nid != NID_aes_128_gcm && nid != NID_aes_256_gcm && nid != NID_chacha20_poly1305) return out;
  int v = SSL_version(ssl);
  out.send = v == TLS1_2_VERSION || v == TLS1_3_VERSION;
  out.recv = v == TLS1_2_VERSION;
  return out;
}

}  // namespace sluice::tls
