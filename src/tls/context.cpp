// tls::context: the server SSL_CTX of one TLS listener snapshot, and its
// session-ticket keys. Cold path, except the two callbacks (ALPN selection
// and ticket sealing), which run inside handshakes on the shards.
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "openssl_error.hpp"
#include "sluice/tls/tls.hpp"

namespace sluice::tls {

namespace {

// Mozilla's "intermediate" TLS 1.2 list without the DHE suites: forward
// secret, AEAD only. TLS 1.3's three suites are all AEAD. The client's order
// is honoured (no SSL_OP_CIPHER_SERVER_PREFERENCE): every entry is strong,
// and a phone without AES instructions then gets ChaCha20.
constexpr const char* k_tls12_ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
constexpr const char* k_tls13_suites =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
constexpr const char* k_groups = "X25519:P-256:P-384";

// ALPN lists in wire form (length-prefixed), in the server's order of
// preference.
constexpr unsigned char k_alpn_h2_h1[] = {2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
constexpr unsigned char k_alpn_h1[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

constexpr size_t k_buffer_bytes_min = 1024;

}  // namespace

// The ticket keys of one SSL_CTX, owned by it (SSL_CTX ex_data, freed with
// the SSL_CTX). Written by rotate_ticket_keys() on the control thread, read
// by the ticket callback on the shards: hence the mutex.
struct ticket_keyring {
  struct key {
    unsigned char name[16];
    unsigned char aes[32];   // AES-256-CBC
    unsigned char hmac[32];  // HMAC-SHA256
  };

  std::mutex mu;
  key current{};
  key previous{};
  bool has_previous = false;
  EVP_CIPHER* aes = nullptr;  // fetched once: an implicit fetch per ticket takes a global lock

  ~ticket_keyring() {
    OPENSSL_cleanse(&current, sizeof current);
    OPENSSL_cleanse(&previous, sizeof previous);
    EVP_CIPHER_free(aes);
  }
};

namespace {

void free_keyring(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<ticket_keyring*>(ptr);
}

int keyring_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, free_keyring);
  return index;
}

bool fresh_key(ticket_keyring::key& k) {
  return RAND_bytes(k.name, sizeof k.name) == 1 && RAND_priv_bytes(k.aes, sizeof k.aes) == 1 &&
         RAND_priv_bytes(k.hmac, sizeof k.hmac) == 1;
}

// SSL_CTX_set_tlsext_ticket_key_evp_cb (OpenSSL 3.0). Returns: 1 = sealed /
// opened with the current key; 2 = opened with the previous key (OpenSSL
// then issues a new ticket); 0 = unknown key name (a full handshake);
// -1 = failure (the handshake fails).
int on_ticket_key(SSL* ssl, unsigned char key_name[16], unsigned char* iv, EVP_CIPHER_CTX* cipher,
                  EVP_MAC_CTX* mac, int seal) {
  auto* ring = static_cast<ticket_keyring*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), keyring_index()));
  if (ring == nullptr) return -1;
  ticket_keyring::key k;
  int rc = 1;
  {
    std::lock_guard lock(ring->mu);
    if (seal) {
      k = ring->current;
    } else if (std::memcmp(key_name, ring->current.name, sizeof k.name) == 0) {
      k = ring->current;
    } else if (ring->has_previous && std::memcmp(key_name, ring->previous.name, sizeof k.name) == 0) {
      k = ring->previous;
      rc = 2;
    } else {
      return 0;
    }
  }
  bool ok;
  if (seal) {
    std::memcpy(key_name, k.name, sizeof k.name);
    ok = RAND_bytes(iv, EVP_CIPHER_get_iv_length(ring->aes)) == 1 &&
         EVP_EncryptInit_ex(cipher, ring->aes, nullptr, k.aes, iv) == 1;
  } else {
    ok = EVP_DecryptInit_ex(cipher, ring->aes, nullptr, k.aes, iv) == 1;
  }
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, k.hmac, sizeof k.hmac),
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end(),
  };
  ok = ok && EVP_MAC_CTX_set_params(mac, params) == 1;
  OPENSSL_cleanse(&k, sizeof k);
  return ok ? rc : -1;
}

// Server's preference: the first of ours the client also offered. A client
// that offers ALPN without h2 or http/1.1 gets a fatal no_application_protocol
// alert (RFC 7301 §3.2); one that offers no ALPN never gets here.
int on_alpn_select(SSL*, const unsigned char** out, unsigned char* out_len, const unsigned char* in,
                   unsigned int in_len, void* arg) {
  const bool h2 = arg != nullptr;
  const unsigned char* ours = h2 ? k_alpn_h2_h1 : k_alpn_h1;
  const unsigned ours_len = h2 ? sizeof k_alpn_h2_h1 : sizeof k_alpn_h1;
  unsigned char* chosen = nullptr;
  // SSL_select_next_proto walks the server list in order. Its result is
  // OPENSSL_NPN_NEGOTIATED only when one matched.
  if (SSL_select_next_proto(&chosen, out_len, ours, ours_len, in, in_len) != OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

// Installed so that OpenSSL never prompts on the terminal for a pass phrase
// (it would block start-up). Returns: 0 bytes (no pass phrase); records that
// one was asked for.
int on_pass_phrase(char*, int, int, void* asked) {
  *static_cast<bool*>(asked) = true;
  return 0;
}

// A clearer first line than OpenSSL's "system library" for the usual
// mistakes (missing file, wrong permissions).
void check_readable(const char* what, const std::string& path) {
  if (path.empty()) throw context_error(std::string(what) + " is not set");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw context_error(std::string(what) + " " + path + ": " + std::strerror(errno));
  ::close(fd);
}

struct ctx_holder {
  SSL_CTX* ctx = nullptr;
  ~ctx_holder() { SSL_CTX_free(ctx); }
};

}  // namespace

std::optional<version> parse_version(std::string_view text) noexcept {
  if (text == "1.2") return version::tls1_2;
  if (text == "1.3") return version::tls1_3;
  return std::nullopt;
}

std::shared_ptr<context> context::load(const context_options& options, const context* previous) {
  if (options.input_buffer_bytes < k_buffer_bytes_min || options.output_buffer_bytes < k_buffer_bytes_min)
    throw context_error("tls buffer caps must be at least 1024 bytes");
  check_readable("tls_cert", options.cert_path);
  check_readable("tls_key", options.key_path);

  ERR_clear_error();
  ctx_holder h;
  h.ctx = SSL_CTX_new(TLS_server_method());
  if (h.ctx == nullptr) throw context_error("SSL_CTX_new: " + detail::drain_openssl_errors());
  SSL_CTX* ctx = h.ctx;

  const int min = options.min_version == version::tls1_3 ? TLS1_3_VERSION : TLS1_2_VERSION;
  uint64_t ssl_options = SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION;
  if (options.ktls) ssl_options |= SSL_OP_ENABLE_KTLS;
  SSL_CTX_set_options(ctx, ssl_options);
  SSL_CTX_clear_options(ctx, SSL_OP_NO_TICKET);
  // Partial writes: SSL_write returns after each record, so write() can
  // stop when the output ring fills. Moving buffer: a retried record may
  // come from another address (the caller's rest of the data).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_set_min_proto_version(ctx, min) != 1 ||
      SSL_CTX_set_cipher_list(ctx, k_tls12_ciphers) != 1 ||
      SSL_CTX_set_ciphersuites(ctx, k_tls13_suites) != 1 ||
      SSL_CTX_set1_groups_list(ctx, k_groups) != 1)
    throw context_error("tls protocol settings: " + detail::drain_openssl_errors());
  // Stateless tickets only: no per-process session cache to grow or share.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  static constexpr unsigned char k_sid_context[] = {'s', 'l', 'u', 'i', 'c', 'e'};
  SSL_CTX_set_session_id_context(ctx, k_sid_context, sizeof k_sid_context);
  SSL_CTX_set_max_early_data(ctx, 0);

  bool pass_phrase_asked = false;
  SSL_CTX_set_default_passwd_cb(ctx, on_pass_phrase);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, &pass_phrase_asked);
  if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_path.c_str()) != 1)
    throw context_error("tls_cert " + options.cert_path +
                        ": cannot load a PEM certificate chain: " + detail::drain_openssl_errors());
  if (SSL_CTX_use_PrivateKey_file(ctx, options.key_path.c_str(), SSL_FILETYPE_PEM) != 1) {
    std::string reason = detail::drain_openssl_errors();
    // "key values mismatch" comes from here too: the key is checked against
    // the certificate already loaded.
    if (pass_phrase_asked)
      throw context_error("tls_key " + options.key_path + ": the key is encrypted; give an unencrypted key (" +
                          reason + ")");
    throw context_error("tls_key " + options.key_path + ": cannot load the private key for tls_cert " +
                        options.cert_path + ": " + reason);
  }
  if (SSL_CTX_check_private_key(ctx) != 1)
    throw context_error("tls_key " + options.key_path + " does not match tls_cert " + options.cert_path + ": " +
                        detail::drain_openssl_errors());
  SSL_CTX_set_default_passwd_cb(ctx, nullptr);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, nullptr);

  // h2 on: arg is any non-null pointer (read as a flag in on_alpn_select).
  SSL_CTX_set_alpn_select_cb(ctx, on_alpn_select,
                             options.h2 ? const_cast<unsigned char*>(k_alpn_h2_h1) : nullptr);

  auto* ring = new ticket_keyring;
  if (SSL_CTX_set_ex_data(ctx, keyring_index(), ring) != 1) {
    delete ring;
    throw context_error("tls ticket keys: " + detail::drain_openssl_errors());
  }
  ring->aes = EVP_CIPHER_fetch(nullptr, "AES-256-CBC", nullptr);
  if (ring->aes == nullptr) throw context_error("tls ticket keys: " + detail::drain_openssl_errors());
  if (previous != nullptr) {
    std::lock_guard lock(previous->_keys->mu);
    ring->current = previous->_keys->current;
    ring->previous = previous->_keys->previous;
    ring->has_previous = previous->_keys->has_previous;
  } else if (!fresh_key(ring->current)) {
    throw context_error("tls ticket keys: RAND_bytes: " + detail::drain_openssl_errors());
  }
  if (SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, on_ticket_key) != 1)
    throw context_error("tls ticket keys: " + detail::drain_openssl_errors());

  std::shared_ptr<context> c(new context);
  c->_options = options;
  c->_ctx = ctx;
  c->_keys = ring;
  h.ctx = nullptr;
  return c;
}

context::~context() { SSL_CTX_free(_ctx); }

void context::rotate_ticket_keys() {
  ticket_keyring::key next;
  // RAND_bytes failing means the process has no entropy source: nothing
  // sensible can continue.
  if (!fresh_key(next)) throw context_error("tls ticket keys: RAND_bytes: " + detail::drain_openssl_errors());
  std::lock_guard lock(_keys->mu);
  _keys->previous = _keys->current;
  _keys->has_previous = true;
  _keys->current = next;
  OPENSSL_cleanse(&next, sizeof next);
}

}  // namespace sluice::tls
