#pragma once
// Test support for tests/unit/tls: a PKI made at test time with OpenSSL's C
// API (root CA -> intermediate -> leaf for "localhost", P-256, in a temporary
// folder) and an in-process OpenSSL client on a BIO pair of its own, plus
// the pumps that move bytes between it and a tls::session.
#include <doctest/doctest.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/tls/tls.hpp"

namespace tls_test {

namespace tls = sluice::tls;
using tls::status;

// ---- test PKI -------------------------------------------------------------

inline X509* make_cert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, bool ca) {
  static long serial = 1;
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 86400);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* e = X509V3_EXT_nconf_nid(nullptr, &v3, nid, value);
    REQUIRE(e != nullptr);
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  };
  add(NID_subject_key_identifier, "hash");
  if (ca) {
    add(NID_basic_constraints, "critical,CA:TRUE");
    add(NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add(NID_basic_constraints, "CA:FALSE");
    add(NID_key_usage, "critical,digitalSignature");
    add(NID_ext_key_usage, "serverAuth");
    add(NID_subject_alt_name, "DNS:localhost");
  }
  if (issuer != nullptr) add(NID_authority_key_identifier, "keyid");
  REQUIRE(X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) > 0);
  return x;
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void append_pem(const std::string& path, X509* x) {
  FILE* f = std::fopen(path.c_str(), "a");
  REQUIRE(f != nullptr);
  PEM_write_X509(f, x);
  std::fclose(f);
}

inline void write_key(const std::string& path, EVP_PKEY* key, const char* pass = nullptr) {
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  if (pass != nullptr)
    PEM_write_PrivateKey(f, key, EVP_aes_256_cbc(), reinterpret_cast<const unsigned char*>(pass),
                         static_cast<int>(std::strlen(pass)), nullptr, nullptr);
  else
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
}

// The folder and its files live for the whole test run.
struct pki {
  std::string dir, chain, leaf_only, key, other_key, encrypted_key, root;
  std::string chain2;  // another leaf for the same key: what a renewed certificate looks like

  pki() {
    char tmpl[] = "/tmp/sluice-tls-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    chain = dir + "/chain.pem";
    leaf_only = dir + "/leaf.pem";
    key = dir + "/key.pem";
    other_key = dir + "/other-key.pem";
    encrypted_key = dir + "/encrypted-key.pem";
    root = dir + "/root.pem";
    chain2 = dir + "/chain2.pem";
    EVP_PKEY* root_key = EVP_EC_gen("P-256");
    EVP_PKEY* mid_key = EVP_EC_gen("P-256");
    EVP_PKEY* leaf_key = EVP_EC_gen("P-256");
    EVP_PKEY* stray_key = EVP_EC_gen("P-256");
    X509* root_cert = make_cert(root_key, "sluice test root", nullptr, nullptr, true);
    X509* mid_cert = make_cert(mid_key, "sluice test intermediate", root_cert, root_key, true);
    X509* leaf_cert = make_cert(leaf_key, "localhost", mid_cert, mid_key, false);
    X509* renewed_cert = make_cert(leaf_key, "localhost", mid_cert, mid_key, false);
    append_pem(chain2, renewed_cert);
    append_pem(chain2, mid_cert);
    append_pem(chain, leaf_cert);
    append_pem(chain, mid_cert);
    append_pem(leaf_only, leaf_cert);
    append_pem(root, root_cert);
    write_key(key, leaf_key);
    write_key(other_key, stray_key);
    write_key(encrypted_key, leaf_key, "pass phrase");
    for (X509* x : {root_cert, mid_cert, leaf_cert, renewed_cert}) X509_free(x);
    for (EVP_PKEY* k : {root_key, mid_key, leaf_key, stray_key}) EVP_PKEY_free(k);
  }
  ~pki() { std::filesystem::remove_all(dir); }

  tls::context_options options() const {
    tls::context_options o;
    o.cert_path = chain;
    o.key_path = key;
    return o;
  }
};

inline const pki& test_pki() {
  static pki p;
  return p;
}

// The base64 body lines of a PEM file: none of them may show up in an error.
inline std::vector<std::string> pem_body_lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '-' && line.find(':') == std::string::npos) out.push_back(line);
  return out;
}

inline std::string drain_errors() {
  std::string out;
  char line[256];
  while (unsigned long e = ERR_get_error()) {
    ERR_error_string_n(e, line, sizeof line);
    out += line;
    out += "\n";
  }
  return out;
}

// ---- an in-process client -------------------------------------------------

struct client_options {
  int max_version = 0;  // 0 = any
  std::vector<std::string> alpn;
  SSL_SESSION* resume = nullptr;
};

struct client {
  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  BIO* net = nullptr;
  std::string errors;  // OpenSSL's queue after the last failing call

  explicit client(const client_options& o = {}) {
    ctx = SSL_CTX_new(TLS_client_method());
    REQUIRE(SSL_CTX_load_verify_file(ctx, test_pki().root.c_str()) == 1);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (o.max_version != 0) SSL_CTX_set_max_proto_version(ctx, o.max_version);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    ssl = SSL_new(ctx);
    BIO* internal = nullptr;
    REQUIRE(BIO_new_bio_pair(&internal, 4u << 20, &net, 4u << 20) == 1);
    SSL_set_bio(ssl, internal, internal);
    SSL_set_connect_state(ssl);
    SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, const_cast<char*>("localhost"));
    SSL_set1_host(ssl, "localhost");
    if (!o.alpn.empty()) {
      std::string wire;
      for (const auto& p : o.alpn) wire += static_cast<char>(p.size()) + p;
      REQUIRE(SSL_set_alpn_protos(ssl, reinterpret_cast<const unsigned char*>(wire.data()),
                                  static_cast<unsigned>(wire.size())) == 0);
    }
    if (o.resume != nullptr) {
      // A copy: OpenSSL marks a client's session not resumable when its SSL
      // is freed without a shutdown, as these test clients are.
      SSL_SESSION* copy = SSL_SESSION_dup(o.resume);
      SSL_set_session(ssl, copy);
      SSL_SESSION_free(copy);
    }
  }
  ~client() {
    SSL_free(ssl);
    BIO_free(net);
    SSL_CTX_free(ctx);
  }
  client(const client&) = delete;

  // Returns: 1 done, 0 wants I/O, -1 failed (errors holds why).
  int step_handshake() {
    ERR_clear_error();
    int rc = SSL_do_handshake(ssl);
    if (rc == 1) return 1;
    int e = SSL_get_error(ssl, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
    errors = drain_errors();
    return -1;
  }

  // Reads all plaintext there is. Returns: false when SSL_read failed (not
  // merely wanting input); `zero_return` says whether that was close_notify.
  bool read_all(std::string& out, bool* zero_return = nullptr) {
    char buf[16384];
    for (;;) {
      ERR_clear_error();
      size_t n = 0;
      int rc = SSL_read_ex(ssl, buf, sizeof buf, &n);
      if (rc == 1) {
        out.append(buf, n);
        continue;
      }
      int e = SSL_get_error(ssl, rc);
      if (e == SSL_ERROR_WANT_READ) return true;
      if (zero_return != nullptr) *zero_return = e == SSL_ERROR_ZERO_RETURN;
      errors = drain_errors();
      return false;
    }
  }

  // Bytes the client has sent that the session has not taken yet.
  size_t output_pending() { return BIO_ctrl_pending(net); }
};

// Moves ciphertext both ways, as far as each side takes it. Returns: bytes moved.
inline size_t transfer(client& c, tls::session& s) {
  size_t moved = 0;
  while (s.has_output()) {
    auto v = s.pending_output();
    int n = BIO_write(c.net, v.data(), static_cast<int>(v.size()));
    REQUIRE(n == static_cast<int>(v.size()));
    s.consume_output(v.size());
    moved += v.size();
  }
  for (;;) {
    char* p = nullptr;
    int n = BIO_nread0(c.net, &p);
    size_t take = std::min(n > 0 ? static_cast<size_t>(n) : 0, s.input_space());
    if (take == 0) break;
    REQUIRE(s.feed({p, take}) == status::ok);
    BIO_nread(c.net, &p, static_cast<int>(take));
    moved += take;
  }
  return moved;
}

struct handshake_outcome {
  status server = status::want_read;
  int client = 0;
  bool saw_want_write = false;
};

inline handshake_outcome run_handshake(client& c, tls::session& s) {
  handshake_outcome out;
  for (int round = 0; round < 100; ++round) {
    if (out.client == 0) out.client = c.step_handshake();
    size_t moved = transfer(c, s);
    if (out.server != status::ok && out.server != status::error) {
      out.server = s.handshake();
      if (out.server == status::want_write) out.saw_want_write = true;
    }
    moved += transfer(c, s);
    if (out.client != 0 && (out.server == status::ok || out.server == status::error) && moved == 0) break;
    if (out.client == -1 && moved == 0) break;
  }
  return out;
}

// A full handshake on a fresh context; SUBCASE-free helper for the data tests.
inline void connected(client& c, tls::session& s) {
  auto r = run_handshake(c, s);
  REQUIRE(r.server == status::ok);
  REQUIRE(r.client == 1);
}

// The session a client got (TLS 1.3 tickets arrive after the handshake:
// read once to take them).
inline SSL_SESSION* take_ticket(client& c, tls::session& s) {
  std::string ignored;
  transfer(c, s);
  c.read_all(ignored);
  SSL_SESSION* sess = SSL_get0_session(c.ssl);
  REQUIRE(sess != nullptr);
  sess = SSL_SESSION_dup(sess);  // see client(): kept resumable after the client goes
  REQUIRE(SSL_SESSION_is_resumable(sess) == 1);
  return sess;
}

inline std::string pattern(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>('a' + (i * 7 + i / 251) % 26);
  return out;
}

// Server writes `data`, the client reads it, round after round.
inline std::string server_to_client(client& c, tls::session& s, const std::string& data, bool* saw_want_write) {
  std::string got;
  size_t done = 0;
  for (int round = 0; round < 100000 && got.size() < data.size(); ++round) {
    if (done < data.size()) {
      auto r = s.write({data.data() + done, data.size() - done});
      REQUIRE(r.st != status::error);
      if (r.st == status::want_write && saw_want_write != nullptr) *saw_want_write = true;
      done += r.bytes;
    }
    transfer(c, s);
    REQUIRE(c.read_all(got));
  }
  return got;
}

// Client writes `data`, the session reads it.
inline std::string client_to_server(client& c, tls::session& s, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    size_t n = 0;
    REQUIRE(SSL_write_ex(c.ssl, data.data() + sent, data.size() - sent, &n) == 1);
    sent += n;
  }
  std::string got;
  char buf[16384];
  for (int round = 0; round < 100000 && got.size() < data.size(); ++round) {
    transfer(c, s);
    for (;;) {
      auto r = s.read(buf);
      if (r.st != status::ok) {
        REQUIRE(r.st == status::want_read);
        break;
      }
      got.append(buf, r.bytes);
    }
  }
  return got;
}

}  // namespace tls_test
