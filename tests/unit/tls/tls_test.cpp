// tls::context and tls::session against an in-process OpenSSL client on a
// BIO pair of its own. The certificates (root CA -> intermediate -> leaf for
// "localhost", P-256) are made at test time with OpenSSL's C API into a
// temporary folder.
#include <doctest/doctest.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sluice/tls/tls.hpp"

namespace tls = sluice::tls;
using tls::status;

namespace {

// ---- test PKI -------------------------------------------------------------

X509* make_cert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, bool ca) {
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

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void append_pem(const std::string& path, X509* x) {
  FILE* f = std::fopen(path.c_str(), "a");
  REQUIRE(f != nullptr);
  PEM_write_X509(f, x);
  std::fclose(f);
}

void write_key(const std::string& path, EVP_PKEY* key, const char* pass = nullptr) {
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

const pki& test_pki() {
  static pki p;
  return p;
}

// The base64 body lines of a PEM file: none of them may show up in an error.
std::vector<std::string> pem_body_lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '-' && line.find(':') == std::string::npos) out.push_back(line);
  return out;
}

std::string drain_errors() {
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
size_t transfer(client& c, tls::session& s) {
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

handshake_outcome run_handshake(client& c, tls::session& s) {
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
void connected(client& c, tls::session& s) {
  auto r = run_handshake(c, s);
  REQUIRE(r.server == status::ok);
  REQUIRE(r.client == 1);
}

// The session a client got (TLS 1.3 tickets arrive after the handshake:
// read once to take them).
SSL_SESSION* take_ticket(client& c, tls::session& s) {
  std::string ignored;
  transfer(c, s);
  c.read_all(ignored);
  SSL_SESSION* sess = SSL_get0_session(c.ssl);
  REQUIRE(sess != nullptr);
  sess = SSL_SESSION_dup(sess);  // see client(): kept resumable after the client goes
  REQUIRE(SSL_SESSION_is_resumable(sess) == 1);
  return sess;
}

std::string pattern(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>('a' + (i * 7 + i / 251) % 26);
  return out;
}

// Server writes `data`, the client reads it, round after round.
std::string server_to_client(client& c, tls::session& s, const std::string& data, bool* saw_want_write) {
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
std::string client_to_server(client& c, tls::session& s, const std::string& data) {
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

}  // namespace

TEST_SUITE("tls::context") {
  TEST_CASE("a chain, its key and a min version load") {
    auto ctx = tls::context::load(test_pki().options());
    REQUIRE(ctx != nullptr);
    CHECK(ctx->native_handle() != nullptr);
    CHECK(tls::parse_version("1.2") == tls::version::tls1_2);
    CHECK(tls::parse_version("1.3") == tls::version::tls1_3);
    CHECK_FALSE(tls::parse_version("1.1").has_value());
    CHECK_FALSE(tls::parse_version("").has_value());
  }

  TEST_CASE("bad files give errors naming the file, never the key's bytes") {
    const pki& p = test_pki();
    tls::context_options o = p.options();
    std::vector<std::string> secrets = pem_body_lines(p.key);
    auto other = pem_body_lines(p.other_key);
    secrets.insert(secrets.end(), other.begin(), other.end());
    REQUIRE(!secrets.empty());
    std::string expect_path, expect_text;

    SUBCASE("missing key file") {
      o.key_path = p.dir + "/absent.pem";
      expect_path = o.key_path;
      expect_text = "No such file";
    }
    SUBCASE("a key file that is no key") {
      o.key_path = p.dir + "/not-a-key.pem";
      write_file(o.key_path, "-----BEGIN PRIVATE KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY\n-----END PRIVATE KEY-----\n");
      secrets.push_back("QUJDREVGR0hJSktMTU5PUFFSU1RVVldY");
      expect_path = o.key_path;
      expect_text = "cannot load the private key";
    }
    SUBCASE("the key of another certificate") {
      o.key_path = p.other_key;
      expect_path = p.other_key;
      expect_text = "mismatch";
    }
    SUBCASE("an encrypted key (no pass phrase prompt)") {
      o.key_path = p.encrypted_key;
      expect_path = p.encrypted_key;
      expect_text = "encrypted";
      auto enc = pem_body_lines(p.encrypted_key);
      secrets.insert(secrets.end(), enc.begin(), enc.end());
    }
    SUBCASE("a certificate file that is no certificate") {
      o.cert_path = p.key;
      expect_path = p.key;
      expect_text = "tls_cert";
    }
    SUBCASE("no key path") {
      o.key_path.clear();
      expect_text = "tls_key is not set";
    }

    std::string message;
    try {
      (void)tls::context::load(o);
    } catch (const tls::context_error& e) {
      message = e.what();
    }
    INFO(message);
    REQUIRE(!message.empty());
    CHECK(message.find(expect_path) != std::string::npos);
    CHECK(message.find(expect_text) != std::string::npos);
    for (const auto& line : secrets) CHECK(message.find(line) == std::string::npos);
  }

  TEST_CASE("buffer caps under 1 KiB are refused") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 100;
    CHECK_THROWS_AS((void)tls::context::load(o), tls::context_error);
  }
}

TEST_SUITE("tls::session") {
  TEST_CASE("handshakes with TLS 1.2 and 1.3 and sends the chain") {
    auto ctx = tls::context::load(test_pki().options());
    int v = 0;
    std::string name;
    SUBCASE("1.2") { v = TLS1_2_VERSION; name = "TLSv1.2"; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; name = "TLSv1.3"; }
    client c({.max_version = v});
    tls::session s(*ctx);
    CHECK_FALSE(s.handshake_done());
    auto r = run_handshake(c, s);
    INFO(c.errors, s.reason());
    REQUIRE(r.server == status::ok);
    REQUIRE(r.client == 1);
    CHECK(s.handshake_done());
    // The client trusts only the root: the intermediate came from the chain file.
    CHECK(SSL_get_verify_result(c.ssl) == X509_V_OK);
    CHECK(s.version_name() == name);
    CHECK(s.server_name() == "localhost");
    CHECK_FALSE(s.resumed());
    CHECK(s.handshake() == status::ok);
    std::string cipher(s.cipher_name());
    CHECK((cipher.find("GCM") != std::string::npos || cipher.find("CHACHA20") != std::string::npos));
  }

  TEST_CASE("the intermediates come from the cert file: a leaf alone does not verify") {
    tls::context_options o = test_pki().options();
    o.cert_path = test_pki().leaf_only;
    auto ctx = tls::context::load(o);
    client c;
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    CHECK(r.client == -1);
    CHECK(c.errors.find("certificate verify failed") != std::string::npos);
    CHECK(r.server == status::error);  // the client's alert
  }

  TEST_CASE("a reload: new connections get the new certificate, started ones finish on the old") {
    auto serial_seen = [](client& c) {
      X509* peer = SSL_get1_peer_certificate(c.ssl);
      REQUIRE(peer != nullptr);
      long serial = ASN1_INTEGER_get(X509_get0_serialNumber(peer));
      X509_free(peer);
      return serial;
    };
    auto old_ctx = tls::context::load(test_pki().options());
    client early;
    tls::session started(*old_ctx);
    REQUIRE(early.step_handshake() == 0);
    transfer(early, started);
    REQUIRE(started.handshake() == status::want_read);  // mid-handshake at the reload

    tls::context_options o = test_pki().options();
    o.cert_path = test_pki().chain2;
    auto new_ctx = tls::context::load(o, old_ctx.get());
    old_ctx.reset();  // the listener now holds only the new one

    connected(early, started);
    client late;
    tls::session fresh(*new_ctx);
    connected(late, fresh);
    CHECK(serial_seen(early) != serial_seen(late));
    CHECK(server_to_client(early, started, "old", nullptr) == "old");
    CHECK(server_to_client(late, fresh, "new", nullptr) == "new");
  }

  TEST_CASE("ALPN: h2 first, http/1.1, none, or a fatal alert for only unknown ones") {
    tls::context_options o = test_pki().options();
    std::vector<std::string> offer;
    bool h2_off = false;
    SUBCASE("h2 and http/1.1 -> h2") { offer = {"http/1.1", "h2"}; }
    SUBCASE("http/1.1 only") { offer = {"http/1.1"}; }
    SUBCASE("no ALPN -> http/1.1, not negotiated") {}
    SUBCASE("h2 off in the context -> http/1.1") { offer = {"h2", "http/1.1"}; h2_off = true; }
    SUBCASE("only unknown protocols -> no_application_protocol") { offer = {"spdy/3.1", "h3"}; }
    SUBCASE("h2 only, h2 off -> no_application_protocol") { offer = {"h2"}; h2_off = true; }
    o.h2 = !h2_off;
    auto ctx = tls::context::load(o);
    client c({.alpn = offer});
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    bool refuse = offer == std::vector<std::string>{"spdy/3.1", "h3"} || (h2_off && offer.size() == 1 && offer[0] == "h2");
    if (refuse) {
      CHECK(r.server == status::error);
      CHECK(s.reason().find("no application protocol") != std::string_view::npos);
      CHECK(r.client == -1);
      CHECK(c.errors.find("no application protocol") != std::string::npos);
      return;
    }
    REQUIRE(r.server == status::ok);
    REQUIRE(r.client == 1);
    const unsigned char* p = nullptr;
    unsigned len = 0;
    SSL_get0_alpn_selected(c.ssl, &p, &len);
    std::string client_saw(reinterpret_cast<const char*>(p), len);
    if (offer.empty()) {
      CHECK(s.alpn() == tls::application_protocol::http1_1);
      CHECK_FALSE(s.alpn_negotiated());
      CHECK(client_saw.empty());
    } else if (offer.size() == 2 && !h2_off) {
      CHECK(s.alpn() == tls::application_protocol::h2);
      CHECK(s.alpn_negotiated());
      CHECK(client_saw == "h2");
    } else {
      CHECK(s.alpn() == tls::application_protocol::http1_1);
      CHECK(s.alpn_negotiated());
      CHECK(client_saw == "http/1.1");
    }
  }

  TEST_CASE("large writes both ways cross records and the output cap") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 8192;
    o.input_buffer_bytes = 4096;
    auto ctx = tls::context::load(o);
    int v = 0;
    SUBCASE("1.2") { v = TLS1_2_VERSION; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; }
    client c({.max_version = v});
    tls::session s(*ctx);
    connected(c, s);
    const std::string down = pattern(1u << 20);
    bool saw_want_write = false;
    CHECK(server_to_client(c, s, down, &saw_want_write) == down);
    CHECK(saw_want_write);
    const std::string up = pattern((1u << 20) + 12345);
    CHECK(client_to_server(c, s, up) == up);
    // And once more the other way: the session keeps going after a full ring.
    CHECK(server_to_client(c, s, "done", nullptr) == "done");
  }

  TEST_CASE("a tiny output cap still completes the handshake, through want_write") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 1024;  // less than the server's first flight
    auto ctx = tls::context::load(o);
    client c({.max_version = TLS1_2_VERSION});
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    CHECK(r.server == status::ok);
    CHECK(r.client == 1);
    CHECK(r.saw_want_write);
  }

  TEST_CASE("pending output stays put while more is written behind it") {
    tls::context_options o = test_pki().options();
    o.output_buffer_bytes = 16384;
    auto ctx = tls::context::load(o);
    client c;
    tls::session s(*ctx);
    connected(c, s);
    transfer(c, s);  // TLS 1.3 tickets out of the way
    REQUIRE_FALSE(s.has_output());
    REQUIRE(s.write(std::string_view(pattern(3000))).st == status::ok);
    auto first = s.pending_output();
    REQUIRE(!first.empty());
    const std::string snapshot(first.data(), first.size());
    // As if a send SQE held `first`: the session writes on.
    for (int i = 0; i < 3; ++i) (void)s.write(std::string_view(pattern(3000)));
    CHECK(std::string(first.data(), first.size()) == snapshot);
    CHECK(s.pending_output().data() == first.data());
    CHECK(s.output_size() > first.size());
    // A partial send: the rest starts where it stopped.
    REQUIRE(BIO_write(c.net, first.data(), 100) == 100);
    s.consume_output(100);
    CHECK(s.pending_output().data() == first.data() + 100);
    std::string got;
    transfer(c, s);
    REQUIRE(c.read_all(got));
    CHECK(got.size() == 4 * 3000);
  }

  TEST_CASE("session tickets resume, across one key rotation but not two") {
    for (int v : {TLS1_2_VERSION, TLS1_3_VERSION}) {
      CAPTURE(v);
      auto ctx = tls::context::load(test_pki().options());
      SSL_SESSION* ticket = nullptr;
      {
        client c({.max_version = v});
        tls::session s(*ctx);
        connected(c, s);
        ticket = take_ticket(c, s);
      }
      auto resume = [&](const tls::context& use) {
        client c({.max_version = v, .resume = ticket});
        tls::session s(use);
        connected(c, s);
        CHECK(SSL_session_reused(c.ssl) == (s.resumed() ? 1 : 0));
        return s.resumed();
      };
      CHECK(resume(*ctx));
      ctx->rotate_ticket_keys();
      CHECK(resume(*ctx));  // sealed under what is now the previous key
      // A reload carries the keys over; a context of its own does not know them.
      auto reloaded = tls::context::load(test_pki().options(), ctx.get());
      CHECK(resume(*reloaded));
      CHECK_FALSE(resume(*tls::context::load(test_pki().options())));
      ctx->rotate_ticket_keys();
      CHECK_FALSE(resume(*ctx));  // a full handshake, and it still succeeds
      CHECK(resume(*reloaded));   // the reloaded one was not rotated
      SSL_SESSION_free(ticket);
    }
  }

  TEST_CASE("rotating ticket keys from another thread while handshakes run") {
    auto ctx = tls::context::load(test_pki().options());
    SSL_SESSION* ticket = nullptr;
    {
      client c;
      tls::session s(*ctx);
      connected(c, s);
      ticket = take_ticket(c, s);
    }
    std::atomic<bool> stop{false};
    std::thread control([&] {
      while (!stop.load()) ctx->rotate_ticket_keys();
    });
    int done = 0;
    for (int i = 0; i < 20; ++i) {
      client c({.resume = ticket});
      tls::session s(*ctx);
      auto r = run_handshake(c, s);
      done += r.server == status::ok && r.client == 1;
    }
    stop = true;
    control.join();
    CHECK(done == 20);  // resumed or not, each one completes
    SSL_SESSION_free(ticket);
  }

  TEST_CASE("a connection outlives its context (a reload mid-connection)") {
    auto ctx = tls::context::load(test_pki().options());
    client c;
    tls::session s(*ctx);
    ctx.reset();
    connected(c, s);
    SSL_SESSION_free(take_ticket(c, s));  // the ticket keys of the dropped context are still there
    CHECK(server_to_client(c, s, "still here", nullptr) == "still here");
  }

  TEST_CASE("a renegotiation attempt by a TLS 1.2 client is refused and fails the session") {
    auto ctx = tls::context::load(test_pki().options());
    client c({.max_version = TLS1_2_VERSION});
    tls::session s(*ctx);
    connected(c, s);
    REQUIRE(SSL_renegotiate(c.ssl) == 1);
    CHECK(c.step_handshake() == 0);  // its ClientHello is out
    transfer(c, s);
    char buf[256];
    auto r = s.read(buf);
    CHECK(r.st == status::error);
    CHECK(s.reason().find("renegotiation") != std::string_view::npos);
    // The no_renegotiation alert reaches the client, which gives up.
    CHECK(s.has_output());
    transfer(c, s);
    CHECK(c.step_handshake() == -1);
    CHECK(s.read(buf).st == status::error);
  }

  TEST_CASE("garbage after the handshake is an error") {
    auto ctx = tls::context::load(test_pki().options());
    std::string garbage;
    SUBCASE("plain text") { garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"; }
    SUBCASE("an application record with a bad tag") {
      garbage = std::string("\x17\x03\x03\x00\x20", 5) + std::string(32, '\x5a');
    }
    for (int v : {TLS1_2_VERSION, TLS1_3_VERSION}) {
    CAPTURE(v);
    client c({.max_version = v});
    tls::session s(*ctx);
    connected(c, s);
    transfer(c, s);
    REQUIRE(s.feed(garbage) == status::ok);
    char buf[256];
    auto r = s.read(buf);
    CHECK(r.st == status::error);
    CHECK(r.bytes == 0);
    CHECK(!s.reason().empty());
    CHECK(s.failed());
    CHECK(s.feed("more") == status::error);
    CHECK(s.write(std::string_view("x")).st == status::error);
    CHECK(s.shutdown() == status::closed);
    }
  }

  TEST_CASE("a truncated ClientHello leaves the session wanting input") {
    auto ctx = tls::context::load(test_pki().options());
    client c;
    tls::session s(*ctx);
    REQUIRE(c.step_handshake() == 0);
    char* p = nullptr;
    int n = BIO_nread0(c.net, &p);
    REQUIRE(n > 60);
    REQUIRE(s.feed({p, 60}) == status::ok);
    BIO_nread(c.net, &p, 60);
    for (int i = 0; i < 3; ++i) CHECK(s.handshake() == status::want_read);
    CHECK_FALSE(s.has_output());
    CHECK_FALSE(s.failed());
    // The rest arrives late: the handshake goes on (a deadline is the codec's).
    auto r = run_handshake(c, s);
    CHECK(r.server == status::ok);
    CHECK(r.client == 1);
  }

  TEST_CASE("tls_min_version 1.3 refuses a TLS 1.2-only client") {
    tls::context_options o = test_pki().options();
    o.min_version = tls::version::tls1_3;
    auto ctx = tls::context::load(o);
    client c({.max_version = TLS1_2_VERSION});
    tls::session s(*ctx);
    auto r = run_handshake(c, s);
    CHECK(r.server == status::error);
    CHECK(s.reason().find("unsupported protocol") != std::string_view::npos);
    CHECK(r.client == -1);
    CHECK(c.errors.find("protocol version") != std::string::npos);
  }

  TEST_CASE("the input cap is enforced") {
    tls::context_options o = test_pki().options();
    o.input_buffer_bytes = 1024;
    auto ctx = tls::context::load(o);
    tls::session s(*ctx);
    CHECK(s.input_space() == 1024);
    std::string bytes(1000, '\x16');
    CHECK(s.feed(bytes) == status::ok);
    CHECK(s.input_space() == 24);
    CHECK(s.feed(std::string_view("0123456789012345678901234")) == status::error);
    CHECK(s.reason().find("input cap") != std::string_view::npos);
    CHECK(s.handshake() == status::error);
  }

  TEST_CASE("shutdown sends close_notify; the client's close_notify reads as closed") {
    auto ctx = tls::context::load(test_pki().options());
    SUBCASE("server closes") {
      client c;
      tls::session s(*ctx);
      connected(c, s);
      transfer(c, s);
      CHECK(s.shutdown() == status::ok);
      CHECK(s.has_output());
      transfer(c, s);
      std::string got;
      bool zero_return = false;
      CHECK_FALSE(c.read_all(got, &zero_return));
      CHECK(zero_return);
    }
    SUBCASE("client closes") {
      client c;
      tls::session s(*ctx);
      connected(c, s);
      CHECK(SSL_shutdown(c.ssl) == 0);
      transfer(c, s);
      char buf[64];
      CHECK(s.read(buf).st == status::closed);
    }
    SUBCASE("before the handshake there is nothing to send") {
      tls::session s(*ctx);
      CHECK(s.shutdown() == status::closed);
      CHECK_FALSE(s.has_output());
    }
  }

  TEST_CASE("a moved session keeps working") {
    auto ctx = tls::context::load(test_pki().options());
    client c({.max_version = TLS1_2_VERSION});
    tls::session first(*ctx);
    connected(c, first);
    tls::session s(std::move(first));
    CHECK(first.handshake() == status::error);  // NOLINT(bugprone-use-after-move): what a moved-from one says
    CHECK_FALSE(first.has_output());
    CHECK(server_to_client(c, s, "moved", nullptr) == "moved");
    // The info callback follows the move: renegotiation is still caught.
    REQUIRE(SSL_renegotiate(c.ssl) == 1);
    (void)c.step_handshake();
    transfer(c, s);
    char buf[64];
    CHECK(s.read(buf).st == status::error);
    CHECK(s.reason().find("renegotiation") != std::string_view::npos);
  }
}

TEST_SUITE("tls::ktls") {
  TEST_CASE("ktls_fit: TLS 1.2 AEAD both ways, TLS 1.3 send only") {
    auto ctx = tls::context::load(test_pki().options());
    int v = 0;
    bool recv = false;
    SUBCASE("1.2") { v = TLS1_2_VERSION; recv = true; }
    SUBCASE("1.3") { v = TLS1_3_VERSION; recv = false; }
    client c({.max_version = v});
    tls::session s(*ctx);
    CHECK_FALSE(tls::ktls_fit(s).send);
    connected(c, s);
    auto fit = tls::ktls_fit(s);
    CHECK(fit.send);
    CHECK(fit.recv == recv);
  }

  TEST_CASE("ktls_available answers, with a reason when it is no") {
    std::string why;
    bool yes = tls::ktls_available(&why);
    MESSAGE("kTLS available: " << (yes ? "yes" : "no: " + why));
    CHECK((yes || !why.empty()));
  }
}

TEST_SUITE("tls::sniff") {
  TEST_CASE("a ClientHello on the plaintext port") {
    struct row {
      std::string bytes;
      tls::sniff expect;
    };
    const row rows[] = {
        {"", tls::sniff::need_more},
        {"\x16", tls::sniff::need_more},
        {"\x16\x03", tls::sniff::need_more},
        {std::string("\x16\x03\x01\x02\x00", 5), tls::sniff::yes},
        {std::string("\x16\x03\x00", 3), tls::sniff::yes},
        {std::string("\x16\x03\x04", 3), tls::sniff::yes},
        {std::string("\x16\x03\x05", 3), tls::sniff::no},
        {std::string("\x16\x02\x01", 3), tls::sniff::no},
        {std::string("\x17\x03\x03", 3), tls::sniff::no},
        {"GET / HTTP/1.1\r\n", tls::sniff::no},
        {"PRI * HTTP/2.0\r\n", tls::sniff::no},
    };
    for (const auto& r : rows) {
      INFO("bytes: ", r.bytes.size());
      CHECK(tls::looks_like_tls_client_hello(r.bytes) == r.expect);
    }
  }

  TEST_CASE("plain HTTP on the TLS port") {
    struct row {
      std::string bytes;
      tls::sniff expect;
    };
    const row rows[] = {
        {"", tls::sniff::need_more},
        {"G", tls::sniff::need_more},
        {"POS", tls::sniff::need_more},
        {"GET / HTTP/1.1\r\n", tls::sniff::yes},
        {"POST /v1/chat/completions HTTP/1.1", tls::sniff::yes},
        {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", tls::sniff::yes},
        {"OPTIONS * HTTP/1.1", tls::sniff::yes},
        {" GET", tls::sniff::no},
        {"get / HTTP/1.1", tls::sniff::no},
        {std::string("\x16\x03\x01", 3), tls::sniff::no},
        {"ABCDEFGHIJKLMNOPQ", tls::sniff::no},  // longer than any method
        {"ABCDEFGHIJKLMNOP", tls::sniff::need_more},
    };
    for (const auto& r : rows) {
      INFO("bytes: ", r.bytes);
      CHECK(tls::looks_like_plain_http(r.bytes) == r.expect);
    }
  }

  TEST_CASE("the canned answers are well-formed") {
    std::string_view http = tls::k_plain_http_on_tls_port_response;
    size_t head_end = http.find("\r\n\r\n");
    REQUIRE(head_end != std::string_view::npos);
    CHECK(http.substr(0, 25) == "HTTP/1.1 400 Bad Request\r");
    CHECK(http.find("content-length: " + std::to_string(http.size() - head_end - 4)) != std::string_view::npos);
    std::string_view alert = tls::k_tls_on_plain_port_alert;
    REQUIRE(alert.size() == 7);
    CHECK(alert[0] == '\x15');
    CHECK(alert[5] == '\x02');  // fatal
  }

  TEST_CASE("a plain request fed to a session fails it at once") {
    auto ctx = tls::context::load(test_pki().options());
    tls::session s(*ctx);
    REQUIRE(s.feed(std::string_view("GET / HTTP/1.1\r\nHost: x\r\n\r\n")) == status::ok);
    CHECK(s.handshake() == status::error);
    CHECK(!s.reason().empty());
  }
}
